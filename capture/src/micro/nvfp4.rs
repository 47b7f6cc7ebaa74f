//! NVFP4 (Transformer Engine's `NVFP4BlockScaling`): E2M1 elements in blocks of 16 along the
//! reduction dimension (16×16 for weights), two levels of scale, the optional random Hadamard
//! transform and stochastic rounding. Following `common/cast/nvfp4/core_nvfp4.cuh`,
//! `quantize_transpose_nvfp4.cuh`, `dequantize_nvfp4.cuh` and `pytorch/custom_recipes/reference_nvfp4.py`:
//!
//! 1. (wgrad operands) x ← RHT(x) along the reduction dimension ([`super::rht`]);
//! 2. tensor: amax = max |x| (after the transform); S_enc = min(448·6 / amax, f32::MAX), 1 when amax
//!    is 0 or S_enc is 0 (`compute_global_encode_scaling_factor_FP4`); S_dec = 1 / S_enc;
//! 3. block: s_b = e4m3(min(block_amax · (S_enc · (1/6)), f32::MAX)), a saturating round-to-nearest
//!    cast (`compute_decoding_scaling_factor`); the elements' multiplier is
//!    min(1 / (s_b · S_dec), f32::MAX);
//! 4. element: e2m1(x · multiplier), round to nearest even or stochastically, saturating to ±6;
//! 5. value: e2m1 · (s_b · amax · (1 / (6·448))) (`dequantize_fp4_kernel`'s `final_scale`).
//!
//! Stochastic rounding draws a 32-bit number per element from [`e2m1::random_bits`] (seed, index
//! in the operand's row-major layout), not from Transformer Engine's Philox stream: the rule is the
//! same (unbiased rounding to a neighbour), the random numbers are not.

use super::{block_amax, block_grid, block_of, e2m1, rht};
use crate::fp8::{self, CastStats, Fp8Format};

/// How to cast one operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nvfp4Opts {
    /// Block rows × cols in the operand's row-major layout (1×16, 16×1 or 16×16).
    pub block: (usize, usize),
    /// Apply the random Hadamard transform along the rows (the wgrad operands' reduction dimension).
    pub rht: bool,
    /// Round stochastically with this seed (None: to nearest even).
    pub stochastic_seed: Option<u64>,
}

/// One operand cast to NVFP4.
pub struct Nvfp4Cast {
    /// E2M1 codes (low 4 bits), row-major as the input.
    pub codes: Vec<u8>,
    /// E4M3 codes of the block decode scales s_b, row-major over the blocks.
    pub block_scales: Vec<u8>,
    /// The tensor's amax after the transform and its encode scale S_enc.
    pub tensor_amax: f32,
    pub s_enc: f32,
    /// The values the GEMM multiplies: the dequantized codes, in the transformed basis when `rht`.
    pub dequantized: Vec<f32>,
    /// The operand as cast: the input, or its transform under `rht`.
    pub cast_input: Vec<f32>,
    /// Counts over the input (`amax` is the input's, before the transform); `saturated`: elements with
    /// |x · multiplier| > 6; `underflow`: finite non-zero elements whose code is ±0.
    pub stats: CastStats,
}

/// Transformer Engine's `compute_global_encode_scaling_factor_FP4`.
pub fn global_encode_scale(amax: f32) -> f32 {
    let s = (448.0f32 * 6.0) / amax;
    let s = s.min(f32::MAX);
    if amax == 0.0 || s == 0.0 { 1.0 } else { s }
}

/// Casts a `rows × cols` row-major operand.
pub fn quantize(x: &[f32], rows: usize, cols: usize, opts: Nvfp4Opts) -> Nvfp4Cast {
    assert_eq!(x.len(), rows * cols, "nvfp4::quantize: {} values for a {rows}×{cols} operand", x.len());
    let input_amax = fp8::amax(x);
    let t = if opts.rht { rht::transform_rows(x, rows, cols) } else { x.to_vec() };
    let (tr, tc) = opts.block;
    let (per_row, _) = block_grid(rows, cols, tr, tc);
    let amaxes = block_amax(&t, rows, cols, tr, tc);
    let tensor_amax = amaxes.iter().copied().fold(0f32, |m, a| if a > m { a } else { m });
    let s_enc = global_encode_scale(tensor_amax);
    let s_dec = 1.0 / s_enc;
    let fp4_max_inv = 1.0f32 / 6.0;
    let block_scales: Vec<u8> = amaxes.iter().map(|&a| fp8::encode(Fp8Format::E4M3, (a * (s_enc * fp4_max_inv)).min(f32::MAX))).collect();
    let multipliers: Vec<f32> = block_scales.iter().map(|&sb| (1.0 / (fp8::decode(Fp8Format::E4M3, sb) * s_dec)).min(f32::MAX)).collect();
    let factor_inv = 1.0f32 / (6.0 * 448.0);
    let finals: Vec<f32> = block_scales.iter().map(|&sb| fp8::decode(Fp8Format::E4M3, sb) * tensor_amax * factor_inv).collect();
    let mut codes = vec![0u8; x.len()];
    let mut dequantized = vec![0f32; x.len()];
    let mut s = CastStats::default();
    for r in 0..rows {
        for c in 0..cols {
            let i = r * cols + c;
            let b = block_of(r, c, tr, tc, per_row);
            let y = t[i] * multipliers[b];
            let q = match opts.stochastic_seed {
                Some(seed) => e2m1::encode_sr(y, e2m1::random_bits(seed, i as u64)),
                None => e2m1::encode_rn(y),
            };
            codes[i] = q;
            dequantized[i] = if t[i].is_nan() { f32::NAN } else { e2m1::decode(q) * finals[b] };
            s.count_input(x[i]);
            s.underflow += u64::from(t[i] != 0.0 && t[i].is_finite() && q & 0x7 == 0);
            s.saturated += u64::from(y.abs() > e2m1::MAX);
        }
    }
    s.amax = input_amax;
    Nvfp4Cast { codes, block_scales, tensor_amax, s_enc, dequantized, cast_input: t, stats: s }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-checked block: amax 6 in a tensor of amax 6 gives S_enc = 448, s_b = e4m3(6·448/6) = 448,
    /// multiplier 1: the elements are cast as they are.
    #[test]
    fn hand_checked_two_level_scales() {
        let mut x = vec![0f32; 32];
        x[0] = 6.0;
        x[1] = 2.6; // -> 3
        x[2] = -0.3; // -> -0.5
        x[16] = 0.75; // second block: amax 0.75 -> s_b = e4m3(0.75 · 448 / 6) = e4m3(56) = 56
        let q = quantize(&x, 1, 32, Nvfp4Opts { block: (1, 16), rht: false, stochastic_seed: None });
        assert_eq!(q.s_enc, 448.0);
        assert_eq!(fp8::decode(Fp8Format::E4M3, q.block_scales[0]), 448.0);
        assert_eq!(fp8::decode(Fp8Format::E4M3, q.block_scales[1]), 56.0);
        assert_eq!(&q.dequantized[..3], &[6.0, 3.0, -0.5]);
        // Second block: multiplier 1 / (56 / 448) = 8: 0.75 · 8 = 6 -> value 6 · 56 · 6 / 2688 = 0.75.
        assert_eq!(q.dequantized[16], 0.75);
        assert_eq!(q.stats.saturated, 0);
        assert_eq!(global_encode_scale(0.0), 1.0);
        assert_eq!(global_encode_scale(f32::INFINITY), 1.0);
        assert_eq!(global_encode_scale(1e-45), f32::MAX);
    }

    /// A 16×16 block shares one scale over 16 rows; its transpose is the same quantization.
    #[test]
    fn two_dimensional_blocks_commute_with_the_transpose() {
        let (rows, cols) = (32, 48);
        let x: Vec<f32> = (0..rows * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) * 2f32.powi((i % 7) as i32 - 3)).collect();
        let xt: Vec<f32> = (0..rows * cols).map(|i| x[(i % rows) * cols + i / rows]).collect();
        let opts = Nvfp4Opts { block: (16, 16), rht: false, stochastic_seed: None };
        let a = quantize(&x, rows, cols, opts);
        let b = quantize(&xt, cols, rows, opts);
        for r in 0..rows {
            for c in 0..cols {
                assert_eq!(a.dequantized[r * cols + c], b.dequantized[c * rows + r]);
            }
        }
    }
}
