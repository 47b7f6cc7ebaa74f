//! Hopper's FP8 tensor-core accumulation, emulated on the CPU (`--cpu-accumulator hopper`).
//!
//! The model is MMA-Sim's (Xie et al., arXiv 2511.10909, `nv_fused_dot_add` for `wgmma` with FP8
//! operands and an FP32 accumulator), which its authors validated bit for bit on an H100:
//! - one instruction takes [`CHUNK`] = 32 products of K and the accumulator C;
//! - each product keeps its exact significand (up to 4: the two significands multiplied, not
//!   renormalised) under the sum of the operands' exponents (an FP8 subnormal counts at its
//!   format's smallest exponent);
//! - every term, C included, is aligned to the largest exponent among them and truncated toward
//!   zero to [`FRACTION_BITS`] = 13 bits below it; the truncated terms are summed exactly;
//! - the sum is normalised and truncated toward zero to 13 fraction bits (an "e8m13" FP32).
//!
//! What cuBLASLt makes of it (the two modes of `--accumulation`):
//! - **fast**: one accumulator runs over the whole of K;
//! - **split**: every [`PROMOTION_INTERVAL`] = 128 elements of K, the tensor cores' partial sum is
//!   added to an FP32 accumulator with an ordinary FP32 addition (rounded to nearest), and starts
//!   again from zero (CUTLASS's and DeepSeek-V3's promotion interval).
//!
//! The epilogue then multiplies by the two operands' dequantisation factors and adds the bias in
//! FP32, and rounds to BF16 (see `backend::cpu`). Everything past the instruction is a model of
//! cuBLASLt's kernels, not a published fact: `cuda_layers`' `accumulator` test measures how many
//! output bits it gets right on the GPU at hand.

use crate::fp8::{Fp8Format, decode_table};
use rayon::prelude::*;

/// The K of one FP8 `wgmma` instruction.
pub const CHUNK: usize = 32;
/// The fraction bits the tensor cores keep of each aligned term and of their sum.
pub const FRACTION_BITS: i32 = 13;
/// Elements of K between promotions to FP32 in split mode.
pub const PROMOTION_INTERVAL: usize = 128;

/// How the partial sums of K meet: see the module's documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Fast,
    Split,
}

/// A finite value as the tensor core sees it: `magnitude` × 2^`lsb` (the significand as an
/// integer, its implicit bit included for a normal value), its sign, and `exponent`, the exponent
/// it aligns by (its leading bit's for a normal value, the format's smallest for a subnormal).
#[derive(Clone, Copy, Debug, Default)]
struct Term {
    magnitude: u64,
    lsb: i32,
    exponent: i32,
    negative: bool,
}

/// The 256 codes of a format: as [`Term`]s (None for NaN and ±Inf), and decoded.
struct CodeTable {
    terms: Vec<Option<Term>>,
    values: &'static [f32; 256],
}

impl CodeTable {
    fn new(format: Fp8Format) -> CodeTable {
        let values = decode_table(format);
        let mantissa_bits = format.mantissa_bits() as i32;
        let min_exponent = 1 - format.bias();
        let terms = values.iter().map(|&v| v.is_finite().then(|| term(f64::from(v), mantissa_bits, min_exponent))).collect();
        CodeTable { terms, values }
    }
}

/// `x` (finite) as a [`Term`] of a format with `mantissa_bits` and smallest normal exponent
/// `min_exponent`.
fn term(x: f64, mantissa_bits: i32, min_exponent: i32) -> Term {
    if x == 0.0 {
        return Term::default();
    }
    let exponent = exponent_of(x).max(min_exponent);
    let lsb = exponent - mantissa_bits;
    Term { magnitude: (x.abs() * pow2(-lsb)) as u64, lsb, exponent, negative: x < 0.0 }
}

/// ⌊log2 |x|⌋ of a non-zero, finite, normal f64.
fn exponent_of(x: f64) -> i32 {
    ((x.to_bits() >> 52) & 0x7ff) as i32 - 1023
}

/// 2^e, exactly, for |e| within f64's normal range.
fn pow2(e: i32) -> f64 {
    f64::from_bits(((1023 + e) as u64) << 52)
}

/// `x` truncated toward zero to 13 fraction bits below its leading bit, as an FP32 (subnormal
/// below 2^-126, infinite past FP32's range).
fn to_e8m13(x: f64) -> f32 {
    if x == 0.0 {
        return 0.0;
    }
    let exponent = exponent_of(x).max(-126);
    if exponent > 127 {
        return if x > 0.0 { f32::INFINITY } else { f32::NEG_INFINITY };
    }
    let kept = (x * pow2(FRACTION_BITS - exponent)).trunc();
    (kept * pow2(exponent - FRACTION_BITS)) as f32
}

/// One instruction: C plus the products of `a` and `b` (codes), the sum truncated as the module
/// says. A NaN or infinite operand gives the plain sum (NaN or ±Inf), as on the hardware.
fn fused_dot_add(a: &[u8], b: &[u8], ta: &CodeTable, tb: &CodeTable, c: f32) -> f32 {
    let c_term = term(f64::from(c), 23, -126);
    let mut max_exponent = if c == 0.0 { i32::MIN } else { c_term.exponent };
    for (&x, &y) in a.iter().zip(b) {
        let (Some(p), Some(q)) = (ta.terms[x as usize], tb.terms[y as usize]) else {
            let plain: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(ta.values[x as usize]) * f64::from(tb.values[y as usize])).sum();
            return (plain + f64::from(c)) as f32;
        };
        if p.magnitude != 0 && q.magnitude != 0 {
            max_exponent = max_exponent.max(p.exponent + q.exponent);
        }
    }
    if max_exponent == i32::MIN {
        return 0.0;
    }
    // Each term on the grid of 2^(max_exponent - 13), truncated toward zero.
    let aligned = |magnitude: u64, lsb: i32, negative: bool| -> i64 {
        let shift = lsb + FRACTION_BITS - max_exponent;
        let m = if shift >= 0 {
            magnitude << shift
        } else if shift > -64 {
            magnitude >> -shift
        } else {
            0
        } as i64;
        if negative { -m } else { m }
    };
    let mut sum = aligned(c_term.magnitude, c_term.lsb, c_term.negative);
    for (&x, &y) in a.iter().zip(b) {
        let (p, q) = (ta.terms[x as usize].unwrap_or_default(), tb.terms[y as usize].unwrap_or_default());
        sum += aligned(p.magnitude * q.magnitude, p.lsb + q.lsb, p.negative != q.negative);
    }
    to_e8m13(sum as f64 * pow2(max_exponent - FRACTION_BITS))
}

/// The dot product of two K-long code rows, accumulated as `mode` says.
fn dot(a: &[u8], b: &[u8], ta: &CodeTable, tb: &CodeTable, mode: Mode) -> f32 {
    match mode {
        Mode::Fast => a.chunks(CHUNK).zip(b.chunks(CHUNK)).fold(0.0, |acc, (x, y)| fused_dot_add(x, y, ta, tb, acc)),
        Mode::Split => a.chunks(PROMOTION_INTERVAL).zip(b.chunks(PROMOTION_INTERVAL)).fold(0.0f32, |total, (x, y)| {
            let partial = x.chunks(CHUNK).zip(y.chunks(CHUNK)).fold(0.0, |acc, (p, q)| fused_dot_add(p, q, ta, tb, acc));
            total + partial
        }),
    }
}

/// An FP8 operand, K-major: `rows` rows of K codes each.
pub struct CodeRows<'a> {
    pub codes: &'a [u8],
    pub format: Fp8Format,
    pub k: usize,
}

/// D (a.rows × b.rows) = A · Bᵀ over the codes (no scale), each element accumulated as Hopper's
/// tensor cores do in `mode`.
pub fn gemm_tn(a: &CodeRows, b: &CodeRows, mode: Mode) -> Vec<f32> {
    assert_eq!(a.k, b.k, "accumulator::gemm_tn: the operands' K differ");
    let k = a.k;
    let (ta, tb) = (CodeTable::new(a.format), CodeTable::new(b.format));
    let cols = b.codes.len().checked_div(k).unwrap_or(0);
    let rows = a.codes.len().checked_div(k).unwrap_or(0);
    let mut out = vec![0f32; rows * cols];
    if k == 0 {
        return out;
    }
    out.par_chunks_mut(cols.max(1)).zip(a.codes.par_chunks(k)).for_each(|(row, x)| {
        for (o, y) in row.iter_mut().zip(b.codes.chunks(k)) {
            *o = dot(x, y, &ta, &tb, mode);
        }
    });
    out
}

/// `codes` (rows × cols, row-major) transposed.
pub fn transpose(codes: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    let mut t = vec![0u8; codes.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = codes[r * cols + c];
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fp8;
    use rand::{Rng, SeedableRng};

    fn code(format: Fp8Format, v: f32) -> u8 {
        let mut q = [0u8];
        fp8::quantize(format, &[v], 1.0, &mut q);
        assert_eq!(decode_table(format)[q[0] as usize], v, "{v} is not exact in {format:?}");
        q[0]
    }

    fn exact_dot(a: &[u8], b: &[u8], fa: Fp8Format, fb: Fp8Format) -> f64 {
        a.iter().zip(b).map(|(&x, &y)| f64::from(decode_table(fa)[x as usize]) * f64::from(decode_table(fb)[y as usize])).sum()
    }

    #[test]
    fn small_integer_sums_are_exact_in_both_modes() {
        let f = Fp8Format::E4M3;
        let vals = [1.0f32, 2.0, 3.0, -4.0, 6.0, 8.0, -1.5, 0.5];
        let a: Vec<u8> = (0..200).map(|i| code(f, vals[i % vals.len()])).collect();
        let b: Vec<u8> = (0..200).map(|i| code(f, vals[(i * 3 + 1) % vals.len()])).collect();
        let (t, want) = (CodeTable::new(f), exact_dot(&a, &b, f, f));
        for mode in [Mode::Fast, Mode::Split] {
            assert_eq!(f64::from(dot(&a, &b, &t, &t, mode)), want, "{mode:?}");
        }
    }

    #[test]
    fn terms_below_13_bits_of_the_largest_are_truncated_toward_zero() {
        let f = Fp8Format::E4M3;
        let t = CodeTable::new(f);
        let tiny = code(f, 2f32.powi(-7));
        // 1 + 2^-14: the product sits one bit below the 13 kept, and is lost (FP32 keeps it).
        assert_eq!(fused_dot_add(&[tiny], &[tiny], &t, &t, 1.0), 1.0);
        assert_ne!(1.0f32 + 2f32.powi(-14), 1.0);
        // 1 - 2^-14: truncated toward zero term by term, so still 1 (rounding the exact sum toward
        // zero would give 1 - 2^-13).
        let neg = code(f, -(2f32.powi(-7)));
        assert_eq!(fused_dot_add(&[neg], &[tiny], &t, &t, 1.0), 1.0);
        // 2^-13 is the last bit kept.
        let kept = code(f, 2f32.powi(-6));
        let half = code(f, 2f32.powi(-7));
        assert_eq!(fused_dot_add(&[kept], &[half], &t, &t, 1.0), 1.0 + 2f32.powi(-13));
        // The sum itself keeps 13 fraction bits under its own leading bit.
        let one = code(f, 1.0);
        let s = fused_dot_add(&[one, kept], &[one, half], &t, &t, 1.0 + 2f32.powi(-13));
        assert_eq!(s, 2.0 + 2f32.powi(-12), "2 + 2^-13 + 2^-13 = 2 + 2^-12, exactly on the kept grid");
        let s = fused_dot_add(&[one], &[one], &t, &t, 1.0 + 2f32.powi(-13));
        assert_eq!(s, 2.0, "2 + 2^-13 needs 14 fraction bits at 2^1, and the last is truncated");
    }

    #[test]
    fn a_nan_operand_makes_nan_and_zeros_make_zero() {
        let f = Fp8Format::E4M3;
        let t = CodeTable::new(f);
        let (one, nan, zero) = (code(f, 1.0), 0x7F, code(f, 0.0));
        assert!(fused_dot_add(&[one, nan], &[one, one], &t, &t, 0.0).is_nan());
        assert_eq!(fused_dot_add(&[zero, zero], &[one, one], &t, &t, 0.0), 0.0);
        assert_eq!(fused_dot_add(&[zero], &[one], &t, &t, 3.0), 3.0);
    }

    /// Against an f64 reference: each instruction loses less than 2^-13 of its largest term per
    /// term (34 terms), and its sum less than 2^-13 of itself, so the error stays within
    /// instructions × 36 × 2^-13 × (Σ|products|). Split mode, promoting every 128, beats fast mode
    /// when one large product is followed by many small ones.
    #[test]
    fn within_the_truncation_bound_of_an_f64_reference_and_split_beats_fast_on_long_tails() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for (fa, fb) in [(Fp8Format::E4M3, Fp8Format::E4M3), (Fp8Format::E5M2, Fp8Format::E4M3)] {
            let (ta, tb) = (CodeTable::new(fa), CodeTable::new(fb));
            for k in [1usize, 31, 32, 33, 300, 1024] {
                let a: Vec<u8> = (0..k).map(|_| rng.random_range(0u8..0x78) | (rng.random::<u8>() & 0x80)).collect();
                let b: Vec<u8> = (0..k).map(|_| rng.random_range(0u8..0x78)).collect();
                let exact = exact_dot(&a, &b, fa, fb);
                let mass: f64 = a.iter().zip(&b).map(|(&x, &y)| (f64::from(ta.values[x as usize]) * f64::from(tb.values[y as usize])).abs()).sum();
                let bound = k.div_ceil(CHUNK) as f64 * 36.0 * 2f64.powi(-FRACTION_BITS) * mass;
                for mode in [Mode::Fast, Mode::Split] {
                    let got = f64::from(dot(&a, &b, &ta, &tb, mode));
                    assert!((got - exact).abs() <= bound, "{fa:?}×{fb:?} k {k} {mode:?}: {got} vs {exact} (bound {bound})");
                }
            }
        }
        let f = Fp8Format::E4M3;
        let t = CodeTable::new(f);
        let (big, small, one) = (code(f, 256.0), code(f, 2f32.powi(-6)), code(f, 1.0));
        let mut a = vec![small; 4096];
        a[0] = big;
        let b = vec![one; 4096];
        let exact = exact_dot(&a, &b, f, f);
        let (fast, split) = (f64::from(dot(&a, &b, &t, &t, Mode::Fast)), f64::from(dot(&a, &b, &t, &t, Mode::Split)));
        assert_eq!(fast, 256.0, "every 2^-6 falls below 2^8's 13 bits and is lost");
        // Split loses only the first 128 elements' small products (256 carried over them).
        assert_eq!(split, 256.0 + 31.0 * 2.0);
        assert!((split - exact).abs() < (fast - exact).abs() / 20.0, "split {split} fast {fast} exact {exact}");
    }

    #[test]
    fn gemm_tn_is_the_dot_of_every_row_pair() {
        let f = Fp8Format::E4M3;
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let (rows, cols, k) = (5, 7, 70);
        let a: Vec<u8> = (0..rows * k).map(|_| rng.random_range(0u8..0x7E)).collect();
        let b: Vec<u8> = (0..cols * k).map(|_| rng.random_range(0u8..0xFE) & 0xF7).collect();
        let d = gemm_tn(&CodeRows { codes: &a, format: f, k }, &CodeRows { codes: &b, format: f, k }, Mode::Split);
        let t = CodeTable::new(f);
        for i in 0..rows {
            for j in 0..cols {
                assert_eq!(d[i * cols + j], dot(&a[i * k..][..k], &b[j * k..][..k], &t, &t, Mode::Split));
            }
        }
        let bt = transpose(&b, cols, k);
        assert_eq!(transpose(&bt, k, cols), b);
    }
}
