//! NVFP4's random Hadamard transform (Transformer Engine, `NVFP4QuantizerRef._apply_rht` and
//! `get_wgrad_sign_vector`): each run of 16 consecutive elements along the reduction dimension is
//! multiplied by T = diag(s) · H16 / 4, with H16 the Sylvester Hadamard matrix and s TE's fixed
//! signs (`quant::RHT_SIGNS`). T is orthogonal, so the wgrad GEMM dYᵀ·X is unchanged when both of
//! its operands are transformed; the transform spreads an outlier over 16 elements before the cast.
//!
//! The f32 arithmetic order is fixed (so that the Python reference matches bit for bit): signs
//! first, then the in-place butterfly over strides 1, 2, 4, 8 ((a, b) → (a + b, a − b)), then the
//! exact multiply by 1/4.

use fp8scope_schemas::quant::{RHT_SIGNS, RHT_SIZE};

/// Transforms one run of 16 values in place.
pub fn transform16(v: &mut [f32; RHT_SIZE]) {
    for (x, s) in v.iter_mut().zip(RHT_SIGNS) {
        *x *= s;
    }
    butterfly(v);
    for x in v.iter_mut() {
        *x *= 0.25;
    }
}

/// The transform of a `rows × cols` row-major operand along its rows (the wgrad operands' reduction
/// dimension, the tokens): each column, in runs of 16 rows. A last run shorter than 16 (rows not a
/// multiple of 16) is left as it is, in both operands alike, so the GEMM is still unchanged.
pub fn transform_rows(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = x.to_vec();
    let mut v = [0f32; RHT_SIZE];
    for r0 in (0..rows / RHT_SIZE * RHT_SIZE).step_by(RHT_SIZE) {
        for c in 0..cols {
            for (i, slot) in v.iter_mut().enumerate() {
                *slot = x[(r0 + i) * cols + c];
            }
            transform16(&mut v);
            for (i, &y) in v.iter().enumerate() {
                out[(r0 + i) * cols + c] = y;
            }
        }
    }
    out
}

/// The inverse transform (Tᵀ = H16 · diag(s) / 4: butterfly, × 1/4, then signs) along the rows, runs
/// of 16 as in [`transform_rows`]: the values of a transformed operand in the original basis (e.g.
/// for the bias gradient's column sums of dY, which the transform does not preserve).
pub fn inverse_transform_rows(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = x.to_vec();
    let mut v = [0f32; RHT_SIZE];
    for r0 in (0..rows / RHT_SIZE * RHT_SIZE).step_by(RHT_SIZE) {
        for c in 0..cols {
            for (i, slot) in v.iter_mut().enumerate() {
                *slot = x[(r0 + i) * cols + c];
            }
            butterfly(&mut v);
            for (i, &y) in v.iter().enumerate() {
                out[(r0 + i) * cols + c] = y * 0.25 * RHT_SIGNS[i];
            }
        }
    }
    out
}

fn butterfly(v: &mut [f32; RHT_SIZE]) {
    let mut h = 1;
    while h < RHT_SIZE {
        for i in (0..RHT_SIZE).step_by(2 * h) {
            for j in i..i + h {
                let (a, b) = (v[j], v[j + h]);
                v[j] = a + b;
                v[j + h] = a - b;
            }
        }
        h *= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the dense product x · diag(s) H / 4 in f64, and T orthogonal: Tᵀ·T = I.
    #[test]
    #[allow(clippy::needless_range_loop)] // matrix indices read best as indices
    fn the_butterfly_is_the_signed_hadamard_product_and_it_is_orthogonal() {
        let h = |i: usize, j: usize| if (i & j).count_ones().is_multiple_of(2) { 1.0 } else { -1.0 };
        let x: [f32; 16] = std::array::from_fn(|i| (i as f32 * 0.37 - 2.0).sin() * 3.0);
        let mut y = x;
        transform16(&mut y);
        for j in 0..16 {
            let want: f64 = (0..16).map(|i| f64::from(x[i]) * f64::from(RHT_SIGNS[i]) * h(i, j) / 4.0).sum();
            assert!((f64::from(y[j]) - want).abs() < 1e-5, "{j}: {} vs {want}", y[j]);
        }
        for a in 0..16 {
            for b in 0..16 {
                let dot: f64 = (0..16).map(|k| f64::from(RHT_SIGNS[a]) * h(a, k) * f64::from(RHT_SIGNS[b]) * h(b, k) / 16.0).sum();
                assert_eq!(dot, if a == b { 1.0 } else { 0.0 });
            }
        }
        // A GEMM over the transformed rows equals the plain one: sum_r a[r] b[r].
        let (rows, cols) = (40, 3);
        let a: Vec<f32> = (0..rows * cols).map(|i| ((i * 7 % 13) as f32 - 6.0) / 4.0).collect();
        let b: Vec<f32> = (0..rows * cols).map(|i| ((i * 5 % 11) as f32 - 5.0) / 2.0).collect();
        let (ta, tb) = (transform_rows(&a, rows, cols), transform_rows(&b, rows, cols));
        for c in 0..cols {
            let plain: f64 = (0..rows).map(|r| f64::from(a[r * cols + c]) * f64::from(b[r * cols + c])).sum();
            let rotated: f64 = (0..rows).map(|r| f64::from(ta[r * cols + c]) * f64::from(tb[r * cols + c])).sum();
            assert!((plain - rotated).abs() < 1e-4, "{plain} vs {rotated}");
        }
        assert_eq!(&ta[32 * cols..], &a[32 * cols..], "the short last run is left alone");
        // The inverse brings the operand back (to f32 rounding; exactly for these dyadic values).
        assert_eq!(inverse_transform_rows(&ta, rows, cols), a);
    }
}
