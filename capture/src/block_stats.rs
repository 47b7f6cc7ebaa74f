//! Per-block statistics of a block-scaled cast (MXFP8, NVFP4, DeepSeek's `block`): how its block
//! scales spread, and how many of them leave the scale format's range. Transformer Engine's users
//! ask for these (TransformerEngine #2801, #3044); recorded per operand and step in `stats`
//! (`block_scale_*`, schemas/README.md).
//!
//! A block's scale here is its **decode scale**, what a stored element is multiplied by to give the
//! value it stands for: 2^(code − 127) for MXFP8's E8M0, s_b / S_enc for NVFP4 (the E4M3 block scale
//! under the FP32 tensor scale), 1 / scale for `block`'s FP32 tile scales. A block **saturates** when
//! the scale it needs is above the scale format's largest (its largest elements then clip), and
//! **flushes** when a block with a non-zero amax gets a scale of zero, or below the format's
//! smallest (its elements then vanish or lose their bits).

/// The block-scale statistics of one cast.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BlockStats {
    /// Blocks in the operand.
    pub blocks: u64,
    /// log2 of the decode scales of the blocks with a positive finite scale: mean, standard
    /// deviation (population), least and largest.
    pub log2_mean: f64,
    pub log2_std: f64,
    pub log2_min: f64,
    pub log2_max: f64,
    /// Blocks whose needed scale is above the scale format's range.
    pub saturated: u64,
    /// Blocks with a non-zero amax whose scale is zero or below the format's range.
    pub flushed: u64,
    /// Blocks by ⌊log2 decode scale⌋, from ⌊log2_min⌋ up: `hist[i]` counts the scales in
    /// [2^(⌊log2_min⌋ + i), 2^(⌊log2_min⌋ + i + 1)).
    pub hist: Vec<u64>,
}

/// One block: its decode scale, whether it saturates, whether it flushes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Block {
    /// In f64: the quotient of two f32 (NVFP4, `block`) without a second rounding.
    pub decode_scale: f64,
    pub saturated: bool,
    pub flushed: bool,
}

/// The statistics of `blocks` (f64 sums in block order).
pub fn block_stats(blocks: impl IntoIterator<Item = Block>) -> BlockStats {
    let mut s = BlockStats::default();
    let mut logs = Vec::new();
    for b in blocks {
        s.blocks += 1;
        s.saturated += b.saturated as u64;
        s.flushed += b.flushed as u64;
        if b.decode_scale > 0.0 && b.decode_scale.is_finite() {
            logs.push(b.decode_scale.log2());
        }
    }
    if logs.is_empty() {
        return s;
    }
    let n = logs.len() as f64;
    s.log2_mean = logs.iter().sum::<f64>() / n;
    s.log2_std = (logs.iter().map(|l| (l - s.log2_mean).powi(2)).sum::<f64>() / n).sqrt();
    s.log2_min = logs.iter().copied().fold(f64::INFINITY, f64::min);
    s.log2_max = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lo = s.log2_min.floor();
    s.hist = vec![0; (s.log2_max.floor() - lo) as usize + 1];
    for l in logs {
        s.hist[(l.floor() - lo) as usize] += 1;
    }
    s
}

/// MXFP8's blocks: E8M0 `codes` for blocks of amax `amaxes` and elements of largest finite `max`.
/// The scale a block needs is amax / max; E8M0 spans 2^-127 to 2^127.
pub fn mxfp8_blocks<'a>(codes: &'a [u8], amaxes: &'a [f32], max: f32) -> impl Iterator<Item = Block> + 'a {
    codes.iter().zip(amaxes).map(move |(&code, &a)| {
        let need = f64::from(a) / f64::from(max);
        Block {
            decode_scale: f64::from(crate::micro::e8m0::decode(code)),
            saturated: a.is_finite() && need > 2f64.powi(127),
            flushed: a > 0.0 && a.is_finite() && need < 2f64.powi(-127),
        }
    })
}

/// NVFP4's blocks: E4M3 block scale codes `sb` for blocks of amax `amaxes` (after the transform)
/// under the tensor's encode scale `s_enc`. The E4M3 scale a block needs is amax · S_enc / 6.
pub fn nvfp4_blocks<'a>(sb: &'a [u8], amaxes: &'a [f32], s_enc: f32) -> impl Iterator<Item = Block> + 'a {
    use crate::fp8::{Fp8Format, decode};
    sb.iter().zip(amaxes).map(move |(&code, &a)| {
        let stored = decode(Fp8Format::E4M3, code);
        Block {
            decode_scale: f64::from(stored) / f64::from(s_enc),
            saturated: f64::from(a) * f64::from(s_enc) / 6.0 > f64::from(Fp8Format::E4M3.max()),
            flushed: a > 0.0 && a.is_finite() && stored == 0.0,
        }
    })
}

/// `block`'s tiles: FP32 encode scales (byte = cast(value · scale)) of tiles of amax `amaxes`. An
/// FP32 scale leaves its range only at the ends of FP32's: a decode scale that overflows
/// (saturates) or is zero or subnormal for a non-zero tile (flushes).
pub fn fp32_blocks<'a>(scales: &'a [f32], amaxes: &'a [f32]) -> impl Iterator<Item = Block> + 'a {
    scales.iter().zip(amaxes).map(|(&s, &a)| {
        // The range is judged in f32, where the scale lives; the value kept in f64.
        let in_f32 = 1.0 / s;
        Block {
            decode_scale: 1.0 / f64::from(s),
            saturated: a > 0.0 && in_f32.is_infinite(),
            flushed: a > 0.0 && a.is_finite() && in_f32.is_finite() && !in_f32.is_normal(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fp8::Fp8Format;
    use crate::micro::{block_amax, e8m0, mxfp8, nvfp4};
    use fp8scope_schemas::quant::E8m0Rounding;

    #[test]
    fn moments_extremes_and_histogram_of_hand_made_scales() {
        let b = |s: f64| Block { decode_scale: s, saturated: false, flushed: false };
        let st = block_stats([b(1.0), b(2.0), b(4.0), b(6.0), b(0.0), Block { decode_scale: 0.0, saturated: false, flushed: true }]);
        assert_eq!((st.blocks, st.flushed, st.saturated), (6, 1, 0));
        let logs = [0.0, 1.0, 2.0, 6f64.log2()];
        let mean = logs.iter().sum::<f64>() / 4.0;
        assert!((st.log2_mean - mean).abs() < 1e-15);
        let var = logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / 4.0;
        assert!((st.log2_std - var.sqrt()).abs() < 1e-15);
        assert_eq!((st.log2_min, st.log2_max), (0.0, 6f64.log2()));
        // Bins [1,2), [2,4), [4,8): 1, 1, 2.
        assert_eq!(st.hist, vec![1, 1, 2]);
        assert_eq!(block_stats([]), BlockStats::default());
    }

    /// MXFP8: each block's decode scale is 2^(code − 127); a block of amax 2^-140 needs a scale
    /// below E8M0's range and flushes.
    #[test]
    fn mxfp8_blocks_read_their_e8m0_codes() {
        let mut x = vec![1.0f32; 96];
        x[32..64].iter_mut().for_each(|v| *v = 2f32.powi(-140));
        x[64] = 448.0 * 8.0;
        let m = mxfp8::quantize(Fp8Format::E4M3, E8m0Rounding::Te, &x, 1, 96, 1, 32);
        let amax = block_amax(&x, 1, 96, 1, 32);
        let st = block_stats(mxfp8_blocks(&m.scales, &amax, Fp8Format::E4M3.max()));
        assert_eq!(st.blocks, 3);
        assert_eq!(st.flushed, 1, "the tiny block");
        assert_eq!(st.saturated, 0);
        let want: Vec<f64> = m.scales.iter().map(|&c| f64::from(e8m0::decode(c)).log2()).collect();
        assert_eq!(st.log2_max, want[2]);
        assert_eq!(want[2], 3.0, "amax 8·448 needs 2^3");
    }

    /// NVFP4: a block whose amax is under 2^-10 / 448 of the tensor's gets an E4M3 scale of 0: it flushes.
    #[test]
    fn nvfp4_blocks_flush_where_their_e4m3_scale_rounds_to_zero() {
        let mut x = vec![0.5f32; 48];
        x[0] = 6.0;
        x[16..32].iter_mut().for_each(|v| *v = 1e-9);
        let q = nvfp4::quantize(&x, 1, 48, nvfp4::Nvfp4Opts { block: (1, 16), rht: false, stochastic_seed: None });
        let amax = block_amax(&x, 1, 48, 1, 16);
        let st = block_stats(nvfp4_blocks(&q.block_scales, &amax, q.s_enc));
        assert_eq!((st.blocks, st.flushed, st.saturated), (3, 1, 0));
        // Block 0: s_b = 448 → decode 448 / 448 = 1; block 2: amax 0.5 → s_b = e4m3(0.5·448/6) = 36 (37.33 rounds to 36) → 36/448.
        assert_eq!(st.log2_max, 0.0);
        assert_eq!(st.log2_min, (36f64 / 448.0).log2());
    }
}
