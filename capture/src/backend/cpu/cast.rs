//! CPU operand casts: an operand is rounded to BF16, cast to FP8 (per tensor or per tile), or cast to
//! MXFP8 or NVFP4 (`crate::micro`), and
//! dequantized back to f32 for the FP32-accumulating GEMM, with the statistics the recorder needs.
//! This is the exact emulation the GPU casts are checked against.

use crate::backend::operands::outlier_indices;
use crate::backend::{CastReport, OperandCast, OperandFault, ScaleSource, StatsLevel};
use crate::fp8::{self, Fp8Format};
use crate::micro::block_amax;
use crate::{block_stats, channel_stats, tensor_stats};
use half::bf16;
use rayon::prelude::*;

/// Rounds to BF16 (nearest even) and back.
#[inline]
pub fn to_bf16(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// Rounds a slice to BF16 in place, in parallel.
pub fn round_bf16_inplace(x: &mut [f32]) {
    x.par_chunks_mut(1 << 15).for_each(|c| c.iter_mut().for_each(|v| *v = to_bf16(*v)));
}

/// The result of casting one operand.
pub struct Cast {
    /// The values the GEMM multiplies: dequant(cast(x)) or bf16(x).
    pub dequantized: Vec<f32>,
    pub report: CastReport,
    /// A per-tensor FP8 cast's codes, format and the scale that dequantizes them (code / scale):
    /// what the Hopper accumulator emulation multiplies (`crate::accumulator`). None otherwise.
    pub codes: Option<TensorCodes>,
}

/// See [`Cast::codes`].
pub struct TensorCodes {
    pub format: Fp8Format,
    pub scale: f32,
    pub codes: Vec<u8>,
}

/// The report of a cast from its counts: `format`, the `scale` it cast with, the amax that scale
/// came from, and the counts of [`fp8::CastStats`]; the rest (moments, bytes, block scales) default.
fn counted(format: &'static str, scale: f32, amax_used: f32, numel: u64, st: &fp8::CastStats) -> CastReport {
    CastReport {
        format,
        scale,
        amax: st.amax,
        amax_used,
        numel,
        underflow: st.underflow,
        saturated: st.saturated,
        nan: st.nan,
        inf: st.inf,
        zeros: st.zeros,
        ..Default::default()
    }
}

/// Casts `x` (rows × cols, row-major) as `how` says, applying `fault`.
pub fn cast_operand(x: &[f32], rows: usize, cols: usize, how: OperandCast, fault: OperandFault, level: StatsLevel, keep: bool) -> Cast {
    debug_assert_eq!(x.len(), rows * cols);
    let faulted;
    let x = if fault.outlier_factor != 1.0 {
        let mut v = x.to_vec();
        for i in outlier_indices(v.len()) {
            v[i] *= fault.outlier_factor;
        }
        faulted = v;
        &faulted[..]
    } else {
        x
    };
    let numel = x.len() as u64;
    let mut codes = None;
    let (dequantized, mut report) = match how {
        OperandCast::Bf16 => {
            let mut d = x.to_vec();
            round_bf16_inplace(&mut d);
            let (mut underflow, mut saturated, mut nan, mut inf, mut zeros) = (0u64, 0u64, 0u64, 0u64, 0u64);
            let mut amax = 0f32;
            for (&v, &r) in x.iter().zip(&d) {
                if v.is_nan() {
                    nan += 1;
                } else if v.is_infinite() {
                    inf += 1;
                } else {
                    amax = amax.max(v.abs());
                    if v == 0.0 {
                        zeros += 1;
                    } else if r == 0.0 {
                        underflow += 1;
                    } else if r.is_infinite() {
                        saturated += 1;
                    }
                }
            }
            let report = CastReport { format: "bf16", scale: 1.0, amax, amax_used: amax, numel, underflow, saturated, nan, inf, zeros, ..Default::default() };
            (d, report)
        }
        OperandCast::Fp8Tensor { format, scale } => {
            let (base, amax_used) = match scale {
                ScaleSource::Given { scale, amax_used } => (scale, amax_used),
                ScaleSource::Current { margin } => {
                    // Only current scaling needs the amax before the cast; the cast measures it anyway.
                    let amax_now = fp8::amax(x);
                    (fp8::scale_for_amax(format, amax_now, margin), amax_now)
                }
            };
            // A planted mis-scale casts with the changed scale but dequantizes with the true one,
            // as a stale or corrupted scale would.
            let s = base * fault.scale_mult;
            let mut q = vec![0u8; x.len()];
            let mut st = fp8::quantize(format, x, s, &mut q);
            if fault.overflow_nan && st.saturated > 0 {
                overflow_to_nonfinite(format, x, s, &mut q, &mut st);
            }
            let mut d = vec![0f32; x.len()];
            fp8::dequantize(format, &q, base, &mut d);
            let report = CastReport { quantized: keep.then(|| q.clone()), ..counted(format.name(), s, amax_used, numel, &st) };
            codes = Some(TensorCodes { format, scale: base, codes: q });
            (d, report)
        }
        OperandCast::Fp8Block { format, tile_rows, tile_cols, margin } => {
            let tiles = rows.div_ceil(tile_rows) * cols.div_ceil(tile_cols);
            let mut q = vec![0u8; x.len()];
            let mut scales = vec![0f32; tiles];
            let st = fp8::quantize_block(format, x, rows, cols, tile_rows, tile_cols, margin, &mut q, &mut scales);
            let true_scales = scales.clone();
            if fault.scale_mult != 1.0 {
                // A planted mis-scale applies to every tile: cast with the changed scales, dequantize
                // with the true ones.
                scales.iter_mut().for_each(|s| *s *= fault.scale_mult);
                recast_tiles(format, x, cols, tile_rows, tile_cols, &scales, &mut q);
            }
            let d = dequantize_tiles(format, &q, rows, cols, tile_rows, tile_cols, &true_scales);
            let counts = count_block_cast(format, x, &q, cols, tile_rows, tile_cols, &scales);
            let blocks = (level >= StatsLevel::Cheap)
                .then(|| block_stats::block_stats(block_stats::fp32_blocks(&scales, &block_amax(x, rows, cols, tile_rows, tile_cols))));
            let report = CastReport {
                underflow: counts.0,
                saturated: counts.1,
                blocks,
                quantized: keep.then(|| q.clone()),
                block_scales: keep.then(|| (scales.clone(), tile_rows, tile_cols)),
                ..counted(format.name(), scales.iter().copied().fold(f32::INFINITY, f32::min), st.amax, numel, &st)
            };
            (d, report)
        }
        OperandCast::Mxfp8 { format, rounding, tile_rows, tile_cols } => {
            let m = crate::micro::mxfp8::quantize(format, rounding, x, rows, cols, tile_rows, tile_cols);
            let st = m.stats;
            let blocks = (level >= StatsLevel::Cheap)
                .then(|| block_stats::block_stats(block_stats::mxfp8_blocks(&m.scales, &block_amax(x, rows, cols, tile_rows, tile_cols), format.max())));
            let multipliers: Vec<f32> = m.scales.iter().map(|&c| crate::micro::e8m0::encode_multiplier(c)).collect();
            let scale = multipliers.iter().copied().fold(f32::INFINITY, f32::min);
            let report = CastReport {
                quantized: keep.then_some(m.codes),
                block_scales: keep.then_some((multipliers, tile_rows, tile_cols)),
                blocks,
                ..counted(format.name(), scale, st.amax, numel, &st)
            };
            (m.dequantized, report)
        }
        OperandCast::Nvfp4 { tile_rows, tile_cols, rht, stochastic_seed } => {
            let opts = crate::micro::nvfp4::Nvfp4Opts { block: (tile_rows, tile_cols), rht, stochastic_seed };
            let m = crate::micro::nvfp4::quantize(x, rows, cols, opts);
            let st = m.stats;
            let mut report = counted(fp8scope_schemas::quant::E2M1_SPEC.name, m.s_enc, m.tensor_amax, numel, &st);
            if level >= StatsLevel::Cheap {
                let amax = block_amax(&m.cast_input, rows, cols, tile_rows, tile_cols);
                report.blocks = Some(block_stats::block_stats(block_stats::nvfp4_blocks(&m.block_scales, &amax, m.s_enc)));
            }
            // The quantization error is the cast's: against the operand as cast (transformed under RHT).
            if level >= StatsLevel::Full {
                let mut r = report;
                r.quant_error = Some(tensor_stats::quant_error(&m.cast_input, &m.dequantized));
                (m.dequantized, r)
            } else {
                (m.dequantized, report)
            }
        }
    };
    if level >= StatsLevel::Cheap {
        report.moments = Some(tensor_stats::moments(x));
    }
    if level >= StatsLevel::Channels {
        report.channels = Some(channel_stats::channel_stats(x, rows, cols));
    }
    if level >= StatsLevel::Full && report.quant_error.is_none() {
        report.quant_error = Some(tensor_stats::quant_error(x, &dequantized));
    }
    Cast { dequantized, report, codes }
}

/// A non-saturating cast: every value whose scaled magnitude rounds past the format's largest
/// finite number becomes NaN (E4M3 has no Inf) or ±Inf (E5M2). Counted as NaN / Inf, not as
/// saturated.
fn overflow_to_nonfinite(format: Fp8Format, x: &[f32], scale: f32, q: &mut [u8], st: &mut fp8::CastStats) {
    // Halfway between max and the next value the format would have: RNE rounds above it.
    let (limit, code) = (format.overflow_threshold(), format.overflow_code());
    for (&v, c) in x.iter().zip(q.iter_mut()) {
        let y = v * scale;
        if y.is_finite() && y.abs() >= limit {
            *c = code | if y < 0.0 { 0x80 } else { 0 };
            st.saturated -= 1;
            if format.is_nan_code(code) { st.nan += 1 } else { st.inf += 1 }
        }
    }
}

/// (underflow, saturated) of a block cast: non-zero finite inputs whose code is ±0, and finite
/// inputs with |x·scale| > max for their tile's scale.
#[allow(clippy::too_many_arguments)]
fn count_block_cast(format: Fp8Format, x: &[f32], q: &[u8], cols: usize, tr: usize, tc: usize, scales: &[f32]) -> (u64, u64) {
    let max = format.max();
    let mut under = 0;
    let mut sat = 0;
    for (i, (&v, &c)) in x.iter().zip(q).enumerate() {
        if !v.is_finite() || v == 0.0 {
            continue;
        }
        if c & 0x7f == 0 {
            under += 1;
        }
        if (v * scales[tile_index(i / cols, i % cols, cols, tr, tc)]).abs() > max {
            sat += 1;
        }
    }
    (under, sat)
}

fn tile_index(r: usize, c: usize, cols: usize, tr: usize, tc: usize) -> usize {
    (r / tr) * cols.div_ceil(tc) + c / tc
}

fn recast_tiles(format: Fp8Format, x: &[f32], cols: usize, tr: usize, tc: usize, scales: &[f32], q: &mut [u8]) {
    q.par_chunks_mut(cols).enumerate().for_each(|(r, qrow)| {
        for c in 0..cols {
            qrow[c] = fp8::cast(format, x[r * cols + c], scales[tile_index(r, c, cols, tr, tc)]);
        }
    });
}

fn dequantize_tiles(format: Fp8Format, q: &[u8], rows: usize, cols: usize, tr: usize, tc: usize, scales: &[f32]) -> Vec<f32> {
    let mut d = vec![0f32; rows * cols];
    d.par_chunks_mut(cols).enumerate().for_each(|(r, drow)| {
        for c in 0..cols {
            drow[c] = fp8::decode(format, q[r * cols + c]) / scales[tile_index(r, c, cols, tr, tc)];
        }
    });
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::ScaleSource;

    #[test]
    fn a_non_saturating_cast_turns_overflow_into_nan_in_e4m3_and_inf_in_e5m2() {
        // scale 1: 448 and 463 round to max (463 < 464, the midpoint to 480), 464 and 1000 overflow.
        let x = [1.0f32, 448.0, 463.0, 464.0, -1000.0];
        let fault = OperandFault { overflow_nan: true, ..OperandFault::NONE };
        let how = |format| OperandCast::Fp8Tensor { format, scale: ScaleSource::Given { scale: 1.0, amax_used: 448.0 } };
        let c = cast_operand(&x, 1, 5, how(Fp8Format::E4M3), fault, StatsLevel::Amax, false);
        assert_eq!(c.report.nan, 2);
        assert_eq!(c.report.saturated, 1, "463 is still saturated to 448");
        assert!(c.dequantized[3].is_nan() && c.dequantized[4].is_nan());
        assert_eq!(c.dequantized[2], 448.0);
        let y = [1.0f32, 61440.0, -1e6];
        let c = cast_operand(&y, 1, 3, how(Fp8Format::E5M2), fault, StatsLevel::Amax, false);
        assert_eq!((c.report.inf, c.dequantized[1], c.dequantized[2]), (2, f32::INFINITY, f32::NEG_INFINITY));
        let sat = cast_operand(&x, 1, 5, how(Fp8Format::E4M3), OperandFault::NONE, StatsLevel::Amax, false);
        assert_eq!((sat.report.nan, sat.report.saturated), (0, 3));
    }

    #[test]
    fn channel_statistics_come_at_their_own_level_and_see_the_planted_outliers() {
        // 5 × 16: the planted outliers sit at elements 10, 30, 50, 70 — channels 10, 14, 2, 6.
        let (rows, cols) = (5, 16);
        let x: Vec<f32> = (0..rows * cols).map(|i| 1.0 + (i % 7) as f32 / 8.0).collect();
        let how = OperandCast::Fp8Tensor { format: Fp8Format::E4M3, scale: ScaleSource::Current { margin: 0 } };
        let fault = OperandFault { outlier_factor: 1000.0, ..OperandFault::NONE };
        let amax_only = cast_operand(&x, rows, cols, how, fault, StatsLevel::Amax, false).report;
        assert_eq!(amax_only.channels, None, "not measured at the amax level");
        let cheap = cast_operand(&x, rows, cols, how, fault, StatsLevel::Cheap, false).report;
        assert_eq!(cheap.channels, None, "not measured at the cheap level");
        let r = cast_operand(&x, rows, cols, how, fault, StatsLevel::Channels, false).report;
        assert_eq!(r.moments, cheap.moments, "the cheap level's moments, the same either way");
        let c = r.channels.expect("measured from the channels level on");
        // |x| of the outliers: 1000 × (1 + (i % 7) / 8) for i = 10, 30, 50, 70 → 1375, 1250, 1125, 1000.
        assert_eq!(c.amax_channel, Some(10), "element 10 holds the largest outlier");
        assert_eq!(r.amax, 1375.0);
        // Channel 10 holds 1375² + four ordinary values; the rest of Σx² is three more outliers and
        // 76 ordinary values: recompute in f64 from the faulted tensor.
        let mut faulted = x.clone();
        for i in [10, 30, 50, 70] {
            faulted[i] *= 1000.0;
        }
        let col = |c: usize| (0..rows).map(|r| (faulted[r * cols + c] as f64).powi(2)).sum::<f64>();
        let total: f64 = faulted.iter().map(|&v| (v as f64).powi(2)).sum();
        let want = col(10) / total;
        assert!((c.top_channel_sq_frac.unwrap() - want).abs() < 1e-15, "{:?} vs {want}", c.top_channel_sq_frac);
    }
}
