//! The three GEMMs of a linear layer, in f32 with f32 accumulation, over `matrixmultiply::sgemm`.
//! Weights are stored (out_features, in_features) as in PyTorch and llm.c; transposes are
//! expressed through sgemm's row and column strides, never by copying.
//!
//! - `matmul_fwd` (fprop): out (N, M) `=` inp (N, K) · weight (M, K)ᵀ (+ bias (M)).
//!   Saved for backward: the caller keeps `inp` (for wgrad) and `weight` (for dgrad).
//! - `matmul_dgrad`: dinp (N, K) `=` dout (N, M) · weight (M, K).
//! - `matmul_wgrad`: dweight (M, K) `+=` dout (N, M)ᵀ · inp (N, K); dbias (M) `+=` Σ_rows dout.
//!
//! Determinism: sgemm (feature `threading`, `MATMUL_NUM_THREADS`, at most 4 threads) splits
//! the work over tiles of the output only; each output element accumulates the inner dimension
//! serially with one SIMD kernel, in chunks of 256 folded into C in order. So the result does
//! not depend on the thread count or the tiling (tested below), but it is tied to the SIMD
//! kernel the CPU selects (AVX2+FMA, AVX, …). The bias add is per row and the bias gradient is
//! parallel over columns, each summed over rows in order.

use rayon::prelude::*;

use super::{check_len, rows_per_task};

/// Columns per task in the bias-gradient reduction.
const COLUMN_BLOCK: usize = 16;

/// Converts a dimension to an sgemm stride. Dimensions are bounded by slice lengths, which
/// never exceed `isize::MAX`.
fn stride(x: usize) -> isize {
    isize::try_from(x).expect("matmul: a dimension larger than isize::MAX cannot back a slice")
}

/// out (N, M) = inp (N, K) · weight (M, K)ᵀ (+ bias (M)).
pub fn matmul_fwd(out: &mut [f32], inp: &[f32], weight: &[f32], bias: Option<&[f32]>, n: usize, k: usize, m: usize) {
    const L: &str = "matmul_fwd";
    check_len(L, "out", out.len(), n * m);
    check_len(L, "inp", inp.len(), n * k);
    check_len(L, "weight", weight.len(), m * k);
    if let Some(bias) = bias {
        check_len(L, "bias", bias.len(), m);
    }
    // SAFETY: the lengths checked above make every (row, col) that sgemm touches in bounds:
    // A = inp is n×k with strides (k, 1); B = weightᵀ is k×m with strides (1, k), i.e. element
    // (kk, j) = weight[j·k + kk]; C = out is n×m with strides (m, 1) and does not alias the
    // inputs (it is a distinct `&mut`). With beta = 0, sgemm does not read C.
    unsafe {
        matrixmultiply::sgemm(n, k, m, 1.0, inp.as_ptr(), stride(k), 1, weight.as_ptr(), 1, stride(k), 0.0, out.as_mut_ptr(), stride(m), 1);
    }
    if let Some(bias) = bias
        && m > 0
    {
        out.par_chunks_mut(m).with_min_len(rows_per_task(m)).for_each(|row| {
            for (o, &b) in row.iter_mut().zip(bias) {
                *o += b;
            }
        });
    }
}

/// dinp (N, K) = dout (N, M) · weight (M, K).
pub fn matmul_dgrad(dinp: &mut [f32], dout: &[f32], weight: &[f32], n: usize, k: usize, m: usize) {
    const L: &str = "matmul_dgrad";
    check_len(L, "dinp", dinp.len(), n * k);
    check_len(L, "dout", dout.len(), n * m);
    check_len(L, "weight", weight.len(), m * k);
    // SAFETY: A = dout is n×m with strides (m, 1); B = weight is m×k with strides (k, 1);
    // C = dinp is n×k with strides (k, 1), a distinct `&mut`; all in bounds by the checks
    // above. With beta = 0, sgemm does not read C.
    unsafe {
        matrixmultiply::sgemm(n, m, k, 1.0, dout.as_ptr(), stride(m), 1, weight.as_ptr(), stride(k), 1, 0.0, dinp.as_mut_ptr(), stride(k), 1);
    }
}

/// dweight (M, K) += dout (N, M)ᵀ · inp (N, K); dbias (M) += column sums of dout.
pub fn matmul_wgrad(dweight: &mut [f32], dbias: Option<&mut [f32]>, dout: &[f32], inp: &[f32], n: usize, k: usize, m: usize) {
    const L: &str = "matmul_wgrad";
    check_len(L, "dweight", dweight.len(), m * k);
    check_len(L, "dout", dout.len(), n * m);
    check_len(L, "inp", inp.len(), n * k);
    // SAFETY: A = doutᵀ is m×n with strides (1, m), i.e. element (j, i) = dout[i·m + j];
    // B = inp is n×k with strides (k, 1); C = dweight is m×k with strides (k, 1), a distinct
    // `&mut`; all in bounds by the checks above. beta = 1 accumulates into C.
    unsafe {
        matrixmultiply::sgemm(m, n, k, 1.0, dout.as_ptr(), 1, stride(m), inp.as_ptr(), stride(k), 1, 1.0, dweight.as_mut_ptr(), stride(k), 1);
    }
    if let Some(dbias) = dbias {
        check_len(L, "dbias", dbias.len(), m);
        dbias.par_chunks_mut(COLUMN_BLOCK).enumerate().for_each(|(blk, db)| {
            let j0 = blk * COLUMN_BLOCK;
            for i in 0..n {
                for (d, &g) in db.iter_mut().zip(&dout[i * m + j0..]) {
                    *d += g;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::testutil::*;

    /// dinp (N, K) = dout (N, M) · weight (M, K), naive f64.
    fn dgrad_ref(dout: &[f64], weight: &[f64], n: usize, k: usize, m: usize) -> Vec<f64> {
        let mut d = vec![0.0; n * k];
        for i in 0..n {
            for kk in 0..k {
                d[i * k + kk] = (0..m).map(|j| dout[i * m + j] * weight[j * k + kk]).sum();
            }
        }
        d
    }

    /// dweight (M, K) = dout (N, M)ᵀ · inp (N, K), naive f64.
    fn wgrad_ref(dout: &[f64], inp: &[f64], n: usize, k: usize, m: usize) -> Vec<f64> {
        let mut d = vec![0.0; m * k];
        for j in 0..m {
            for kk in 0..k {
                d[j * k + kk] = (0..n).map(|i| dout[i * m + j] * inp[i * k + kk]).sum();
            }
        }
        d
    }

    #[test]
    fn gemms_match_naive_f64_on_odd_shapes() {
        // Non-square, none a multiple of 8 (the kernel tile), and one inner dimension above
        // the 256-wide k-chunk of sgemm so the chunked accumulation is exercised.
        for (n, k, m) in [(37, 19, 29), (13, 300, 7), (1, 5, 3), (65, 33, 17)] {
            let mut r = rng((n * 1000 + k * 10 + m) as u64);
            let inp = rand_vec(&mut r, n * k, -1.0, 1.0);
            let weight = rand_vec(&mut r, m * k, -1.0, 1.0);
            let bias = rand_vec(&mut r, m, -1.0, 1.0);
            let dout = rand_vec(&mut r, n * m, -1.0, 1.0);
            let (x64, w64, b64, dy64) = (to_f64(&inp), to_f64(&weight), to_f64(&bias), to_f64(&dout));
            let tag = format!("{n}x{k}x{m}");
            // Each element is an f32 accumulation of `len` O(1) products (len = K for fprop,
            // M for dgrad, N for wgrad), whose rounding error grows about as √len·2⁻²⁴ times
            // the partial sums; judged against the 1 % floor that is ~4e-6·√len at most
            // (worst seen: 1.6e-5 at len = 300). A wrong index or transpose gives O(1).
            let tol = |len: usize| 4e-6 * (len as f64).sqrt();
            let mut out = vec![f32::NAN; n * m];
            matmul_fwd(&mut out, &inp, &weight, Some(&bias), n, k, m);
            check_close(&format!("matmul_fwd {tag}"), &out, &matmul_fwd_ref(&x64, &w64, Some(&b64), n, k, m), tol(k));
            matmul_fwd(&mut out, &inp, &weight, None, n, k, m);
            check_close(&format!("matmul_fwd nobias {tag}"), &out, &matmul_fwd_ref(&x64, &w64, None, n, k, m), tol(k));

            let mut dinp = vec![f32::NAN; n * k];
            matmul_dgrad(&mut dinp, &dout, &weight, n, k, m);
            check_close(&format!("matmul_dgrad {tag}"), &dinp, &dgrad_ref(&dy64, &w64, n, k, m), tol(m));

            // `+=`: start from random values.
            let init_dw = rand_vec(&mut r, m * k, -1.0, 1.0);
            let init_db = rand_vec(&mut r, m, -1.0, 1.0);
            let (mut dweight, mut dbias) = (init_dw.clone(), init_db.clone());
            matmul_wgrad(&mut dweight, Some(&mut dbias), &dout, &inp, n, k, m);
            let want_dw: Vec<f64> = wgrad_ref(&dy64, &x64, n, k, m).iter().zip(&init_dw).map(|(g, &i)| g + f64::from(i)).collect();
            let want_db: Vec<f64> = (0..m).map(|j| f64::from(init_db[j]) + (0..n).map(|i| dy64[i * m + j]).sum::<f64>()).collect();
            check_close(&format!("matmul_wgrad dweight {tag}"), &dweight, &want_dw, tol(n));
            check_close(&format!("matmul_wgrad dbias {tag}"), &dbias, &want_db, tol(n));
        }
    }

    #[test]
    fn backward_matches_finite_differences() {
        let (n, k, m) = (10, 8, 11);
        let mut r = rng(40);
        let inp = rand_vec(&mut r, n * k, -1.0, 1.0);
        let weight = rand_vec(&mut r, m * k, -1.0, 1.0);
        let bias = rand_vec(&mut r, m, -1.0, 1.0);
        let dout = rand_vec(&mut r, n * m, -1.0, 1.0);
        let (x64, w64, b64, dy64) = (to_f64(&inp), to_f64(&weight), to_f64(&bias), to_f64(&dout));
        let loss = |x: &[f64], w: &[f64], b: &[f64]| dot_ref(&dy64, &matmul_fwd_ref(x, w, Some(b), n, k, m));
        let fd_x = fd_grad(&x64, |x| loss(x, &w64, &b64));
        let fd_w = fd_grad(&w64, |w| loss(&x64, w, &b64));
        let fd_b = fd_grad(&b64, |b| loss(&x64, &w64, b));
        let mut dinp = vec![f32::NAN; n * k];
        matmul_dgrad(&mut dinp, &dout, &weight, n, k, m);
        let (mut dweight, mut dbias) = (vec![0.0; m * k], vec![0.0; m]);
        matmul_wgrad(&mut dweight, Some(&mut dbias), &dout, &inp, n, k, m);
        // Sums of ≤ 11 O(1) products in f32: ~1e-7 relative to the terms, ≲ 1e-5 after the
        // 1 % floor.
        check_close("matmul dinp vs FD", &dinp, &fd_x, 1e-4);
        check_close("matmul dweight vs FD", &dweight, &fd_w, 1e-4);
        check_close("matmul dbias vs FD", &dbias, &fd_b, 1e-4);
    }

    #[test]
    fn gemms_are_deterministic_and_independent_of_tiling() {
        // Large enough for sgemm to split over threads where the machine has them
        // (m·k + k·n ≫ 2¹⁴), and sizes off the tile grid.
        let (n, k, m) = (300, 200, 260);
        let mut r = rng(41);
        let inp = rand_vec(&mut r, n * k, -1.0, 1.0);
        let weight = rand_vec(&mut r, m * k, -1.0, 1.0);
        let bias = rand_vec(&mut r, m, -1.0, 1.0);
        let dout = rand_vec(&mut r, n * m, -1.0, 1.0);
        let run = || {
            let mut out = vec![0.0; n * m];
            matmul_fwd(&mut out, &inp, &weight, Some(&bias), n, k, m);
            let mut dinp = vec![0.0; n * k];
            matmul_dgrad(&mut dinp, &dout, &weight, n, k, m);
            let (mut dw, mut db) = (vec![0.5; m * k], vec![0.5; m]);
            matmul_wgrad(&mut dw, Some(&mut db), &dout, &inp, n, k, m);
            [out, dinp, dw, db]
        };
        let a = run();
        for (label, b) in [("run twice", run()), ("1 thread", in_pool(1, run)), ("3 threads", in_pool(3, run))] {
            for (name, (x, y)) in ["out", "dinp", "dweight", "dbias"].iter().zip(a.iter().zip(&b)) {
                assert_bits_eq(&format!("matmul {name} {label}"), x, y);
            }
        }
        // A fingerprint of the bits, so runs under different MATMUL_NUM_THREADS can be compared
        // by eye (sgemm reads it once per process).
        let fingerprint = a.iter().flatten().fold(0xcbf2_9ce4_8422_2325_u64, |h, x| (h ^ u64::from(x.to_bits())).wrapping_mul(0x0000_0100_0000_01b3));
        eprintln!("matmul bits fingerprint: {fingerprint:016x}");
        // One row at a time (a single-tile, single-thread GEMM each) gives the same bits as the
        // whole (multi-tile, possibly multi-thread) GEMM: the split never changes the sums.
        let mut by_rows = vec![0.0; n * m];
        for i in 0..n {
            matmul_fwd(&mut by_rows[i * m..(i + 1) * m], &inp[i * k..(i + 1) * k], &weight, Some(&bias), 1, k, m);
        }
        assert_bits_eq("matmul_fwd whole vs by rows", &a[0], &by_rows);
        let mut dinp_rows = vec![0.0; n * k];
        for i in 0..n {
            matmul_dgrad(&mut dinp_rows[i * k..(i + 1) * k], &dout[i * m..(i + 1) * m], &weight, 1, k, m);
        }
        assert_bits_eq("matmul_dgrad whole vs by rows", &a[1], &dinp_rows);
    }

    #[test]
    fn beta_zero_overwrites_nan() {
        let (n, k, m) = (3, 4, 5);
        let mut out = vec![f32::NAN; n * m];
        matmul_fwd(&mut out, &vec![1.0; n * k], &vec![1.0; m * k], None, n, k, m);
        assert!(out.iter().all(|&x| x == 4.0), "{out:?}");
        let mut dinp = vec![f32::NAN; n * k];
        matmul_dgrad(&mut dinp, &vec![1.0; n * m], &vec![1.0; m * k], n, k, m);
        assert!(dinp.iter().all(|&x| x == 5.0), "{dinp:?}");
    }
}
