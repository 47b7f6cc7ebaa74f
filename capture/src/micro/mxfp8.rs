//! MXFP8 (OCP MX, Transformer Engine's `MXFP8BlockScaling`): FP8 elements (E4M3, or E5M2 for
//! gradients under the hybrid policy) in blocks of 32 along the GEMM's reduction dimension, each
//! block with an E8M0 power-of-two scale from its amax ([`e8m0::scale_code`]). An element is stored
//! as `fp8::encode(x · 2^(127 − code))` (saturating, Transformer Engine's `exp2f_rcp`) and stands for
//! `decode(q) · 2^(code − 127)` (`exp2f`).

use super::{block_amax, block_grid, block_of, e8m0};
use crate::fp8::{self, CastStats, Fp8Format};
use fp8scope_schemas::quant::E8m0Rounding;

/// One operand cast to MXFP8.
pub struct MxCast {
    /// FP8 codes, row-major as the input.
    pub codes: Vec<u8>,
    /// E8M0 codes, row-major over the blocks.
    pub scales: Vec<u8>,
    /// The values the codes stand for.
    pub dequantized: Vec<f32>,
    /// `saturated` counts elements with |x · 2^(127 − code)| > max (none under TE's rounding but for
    /// Inf inputs); `underflow` finite non-zero elements whose code is ±0.
    pub stats: CastStats,
}

/// Casts a `rows × cols` row-major operand in `tr × tc` blocks.
pub fn quantize(fmt: Fp8Format, rounding: E8m0Rounding, x: &[f32], rows: usize, cols: usize, tr: usize, tc: usize) -> MxCast {
    assert_eq!(x.len(), rows * cols, "mxfp8::quantize: {} values for a {rows}×{cols} operand", x.len());
    let (per_row, _) = block_grid(rows, cols, tr, tc);
    let scales: Vec<u8> = block_amax(x, rows, cols, tr, tc).into_iter().map(|a| e8m0::scale_code(rounding, fmt, a)).collect();
    let mut codes = vec![0u8; x.len()];
    let mut dequantized = vec![0f32; x.len()];
    let max = fmt.max();
    let mut s = CastStats::default();
    for r in 0..rows {
        for c in 0..cols {
            let i = r * cols + c;
            let code = scales[block_of(r, c, tr, tc, per_row)];
            let v = x[i];
            let y = v * e8m0::encode_multiplier(code);
            let q = fp8::encode(fmt, y);
            codes[i] = q;
            dequantized[i] = fp8::decode(fmt, q) * e8m0::decode(code);
            s.count_fp8(v, y, q, max);
        }
    }
    MxCast { codes, scales, dequantized, stats: s }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-checked blocks: TE's rounding never clips, OCP's clips the block's largest elements
    /// when amax's mantissa passes max's (1.75 for E4M3).
    #[test]
    fn hand_checked_blocks_under_both_roundings() {
        // One 1×32 block: 480 and small values. TE: 480/448 -> 2^1, elements /2: 240 (code 0x77) ...
        let mut x = vec![0.5f32; 32];
        x[3] = 480.0;
        x[7] = -0.001;
        let te = quantize(Fp8Format::E4M3, E8m0Rounding::Te, &x, 1, 32, 1, 32);
        assert_eq!(te.scales, vec![128]);
        assert_eq!(te.dequantized[3], 480.0);
        assert_eq!(te.dequantized[0], 0.5);
        assert_eq!(te.stats.saturated, 0);
        // 0.001 / 2 = 0.0005 < 2^-10 (half of E4M3's smallest subnormal 2^-9): flushes to -0.
        assert_eq!(te.codes[7], 0x80);
        assert_eq!(te.stats.underflow, 1);
        let ocp = quantize(Fp8Format::E4M3, E8m0Rounding::Ocp, &x, 1, 32, 1, 32);
        // floor(log2 480) = 8 -> 2^0: 480 clips to 448.
        assert_eq!(ocp.scales, vec![127]);
        assert_eq!(ocp.dequantized[3], 448.0);
        assert_eq!(ocp.stats.saturated, 1);
        assert_eq!(ocp.dequantized[7], -0.001953125, "0.001 rounds to 2^-9, a subnormal, with the finer scale");
    }

    /// Blocks of 32 rows (the transposed operand) get one scale per column segment.
    #[test]
    fn column_blocks_scale_each_column_on_its_own() {
        let (rows, cols) = (64, 3);
        let x: Vec<f32> = (0..rows * cols).map(|i| ((i % cols) as f32 + 1.0) * 2f32.powi((i / cols / 32) as i32 * 4)).collect();
        let m = quantize(Fp8Format::E4M3, E8m0Rounding::Te, &x, rows, cols, 32, 1);
        assert_eq!(m.scales.len(), 6);
        // Column 0, rows 0..32: amax 1 -> 2^-8 (119); rows 32..64: amax 16 -> 2^-4 (123).
        assert_eq!((m.scales[0], m.scales[3]), (119, 123));
        assert_eq!((m.scales[1], m.scales[2]), (120, 120)); // amax 2 and 3: ceil(log2(a/448)) = -7
        assert_eq!(m.dequantized, x, "these values are exact in E4M3");
    }
}
