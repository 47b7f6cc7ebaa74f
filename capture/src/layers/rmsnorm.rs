//! RMSNorm over the channel dimension, as in Llama (no mean subtraction, no bias; eps given).
//!
//! - `rmsnorm_fwd`: out (N, C) `=`, rstd (N) `=`; inp (N, C), weight (C). out = inp·rstd·weight
//!   with rstd = 1/√(mean(inp²) + eps). Saved for backward: `rstd` (and the caller keeps `inp`).
//! - `rmsnorm_bwd`: dinp (N, C) `+=`, dweight (C) `+=`; from dout (N, C), inp, weight, rstd.
//!   `dinp` accumulates because an RMSNorm's input is the residual stream, whose gradient also
//!   arrives through the skip connection (as for LayerNorm).
//!
//! BF16: nothing is rounded here, as for LayerNorm — the sums, rstd and outputs are f32; the
//! output's only consumer is a linear layer, whose GEMM casts it (to BF16 or FP8).
//!
//! Parallel over rows for `out` and `dinp` (row-local sums); `dweight` is reduced over rows in a
//! second pass that is parallel over blocks of channels, each channel summed over the rows in
//! order — the same order as a serial loop, so the result does not depend on threads.

use rayon::prelude::*;

use super::{check_len, rows_of, rows_per_task};

/// Channels per task in the `dweight` reduction.
const CHANNEL_BLOCK: usize = 16;

/// out = inp·rstd·weight per row of inp (N, C), rstd = 1/√(mean(inp²) + eps); also writes rstd (N).
pub fn rmsnorm_fwd(out: &mut [f32], rstd: &mut [f32], inp: &[f32], weight: &[f32], c: usize, eps: f32) {
    const L: &str = "rmsnorm_fwd";
    let n = rows_of(L, "inp", inp.len(), c);
    check_len(L, "out", out.len(), n * c);
    check_len(L, "rstd", rstd.len(), n);
    check_len(L, "weight", weight.len(), c);
    let inv_c = 1.0 / c as f32;
    out.par_chunks_mut(c).zip(inp.par_chunks(c)).zip(rstd.par_iter_mut()).with_min_len(rows_per_task(c)).for_each(|((o, x), s)| {
        let ms = x.iter().map(|&v| v * v).sum::<f32>() * inv_c;
        let rs = 1.0 / (ms + eps).sqrt();
        for ((o, &x), &w) in o.iter_mut().zip(x).zip(weight) {
            *o = x * rs * w;
        }
        *s = rs;
    });
}

/// Backward of `rmsnorm_fwd`: dinp (N, C) `+=`, dweight (C) `+=`.
pub fn rmsnorm_bwd(dinp: &mut [f32], dweight: &mut [f32], dout: &[f32], inp: &[f32], weight: &[f32], rstd: &[f32], c: usize) {
    const L: &str = "rmsnorm_bwd";
    let n = rows_of(L, "inp", inp.len(), c);
    check_len(L, "dinp", dinp.len(), n * c);
    check_len(L, "dout", dout.len(), n * c);
    check_len(L, "dweight", dweight.len(), c);
    check_len(L, "weight", weight.len(), c);
    check_len(L, "rstd", rstd.len(), n);
    let inv_c = 1.0 / c as f32;

    // Pass 1, per row: dx = rstd·(w·dy − x̂·mean(w·dy·x̂)), x̂ = x·rstd.
    dinp.par_chunks_mut(c).zip(dout.par_chunks(c)).zip(inp.par_chunks(c)).zip(rstd.par_iter()).with_min_len(rows_per_task(c)).for_each(
        |(((dx, dy), x), &rs)| {
            let mut dnorm_norm_mean = 0.0f32;
            for ((&dy, &x), &w) in dy.iter().zip(x).zip(weight) {
                dnorm_norm_mean += (w * dy) * (x * rs);
            }
            dnorm_norm_mean *= inv_c;
            for (((dx, &dy), &x), &w) in dx.iter_mut().zip(dy).zip(x).zip(weight) {
                *dx += (w * dy - (x * rs) * dnorm_norm_mean) * rs;
            }
        },
    );

    // Pass 2, per block of channels, rows in order: dweight += Σ dy·x̂.
    dweight.par_chunks_mut(CHANNEL_BLOCK).enumerate().for_each(|(blk, dw)| {
        let j0 = blk * CHANNEL_BLOCK;
        let width = dw.len();
        for (i, &rs) in rstd.iter().enumerate() {
            let row = i * c + j0;
            let dy = &dout[row..row + width];
            let x = &inp[row..row + width];
            for ((dw, &dy), &x) in dw.iter_mut().zip(dy).zip(x) {
                *dw += dy * (x * rs);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::testutil::*;

    const N: usize = 10; // B = 2, T = 5
    const C: usize = 8;
    const EPS: f32 = 1e-5;

    struct Case {
        inp: Vec<f32>,
        weight: Vec<f32>,
    }

    fn case(seed: u64, n: usize, c: usize) -> Case {
        let mut r = rng(seed);
        // Rows of different sizes (×0.25 to ×4), so rstd varies from row to row.
        let mut inp = rand_vec(&mut r, n * c, -2.0, 2.0);
        for (i, x) in inp.iter_mut().enumerate() {
            *x *= 0.25 * (1 << ((i / c) % 5)) as f32;
        }
        Case { inp, weight: rand_vec(&mut r, c, 0.5, 1.5) }
    }

    fn forward(cs: &Case, c: usize, eps: f32) -> (Vec<f32>, Vec<f32>) {
        let n = cs.inp.len() / c;
        let (mut out, mut rstd) = (vec![f32::NAN; n * c], vec![f32::NAN; n]);
        rmsnorm_fwd(&mut out, &mut rstd, &cs.inp, &cs.weight, c, eps);
        (out, rstd)
    }

    #[test]
    fn forward_matches_f64_reference() {
        for (c, tol) in [(C, 1e-5), (1024, 1e-5)] {
            let cs = case(40, N, c);
            let (out, rstd) = forward(&cs, c, EPS);
            let (x64, w64) = (to_f64(&cs.inp), to_f64(&cs.weight));
            let want = rmsnorm_fwd_ref(&x64, &w64, c, f64::from(EPS));
            let want_rstd: Vec<f64> = x64.chunks(c).map(|x| 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / c as f64 + f64::from(EPS)).sqrt()).collect();
            // A sum of C positive squares in f32 (relative error ≲ C·2⁻²⁴ in the worst case, far
            // less in practice), one sqrt and two products: a few ulps of O(1) outputs for
            // C = 8; for C = 1024 the sequential sum's rounding stays well under 1e-5.
            check_close(&format!("rmsnorm_fwd out C={c}"), &out, &want, tol);
            check_close(&format!("rmsnorm_fwd rstd C={c}"), &rstd, &want_rstd, tol);
        }
    }

    #[test]
    fn eps_is_added_to_the_mean_square() {
        // An all-zero row normalises to zero with rstd = 1/√eps; a tiny row is damped by eps.
        let cs = Case { inp: vec![0.0; C].into_iter().chain(vec![1e-3; C]).collect(), weight: vec![1.0; C] };
        let (out, rstd) = forward(&cs, C, 1e-2);
        assert!(out[..C].iter().all(|&v| v == 0.0), "zero row: {out:?}");
        check_close("rmsnorm rstd with eps", &rstd, &[10.0, 1.0 / (1e-6f64 + 1e-2).sqrt()], 1e-6);
    }

    #[test]
    fn backward_matches_finite_differences() {
        let cs = case(41, N, C);
        let (_, rstd) = forward(&cs, C, EPS);
        let mut r = rng(42);
        let dout = rand_vec(&mut r, N * C, -1.0, 1.0);
        let (x64, w64, dy64, eps) = (to_f64(&cs.inp), to_f64(&cs.weight), to_f64(&dout), f64::from(EPS));
        let fd_inp = fd_grad(&x64, |x| dot_ref(&dy64, &rmsnorm_fwd_ref(x, &w64, C, eps)));
        let fd_w = fd_grad(&w64, |w| dot_ref(&dy64, &rmsnorm_fwd_ref(&x64, w, C, eps)));

        // Both accumulate: start from random values, compare the increments.
        let init_dx = rand_vec(&mut r, N * C, -1.0, 1.0);
        let init_dw = rand_vec(&mut r, C, -1.0, 1.0);
        let (mut dinp, mut dweight) = (init_dx.clone(), init_dw.clone());
        rmsnorm_bwd(&mut dinp, &mut dweight, &dout, &cs.inp, &cs.weight, &rstd, C);
        let minus = |got: &[f32], init: &[f32]| -> Vec<f32> { got.iter().zip(init).map(|(g, i)| g - i).collect() };
        // dinp is a difference of two O(1)·rstd terms: the cancellation leaves an absolute f32
        // error of ~1e-7 of the terms (rstd reaches 4 in the ×0.25 rows), ≲ 1e-5 relative after
        // the 1 % floor; 1e-4 keeps a margin. Subtracting the initial value adds ~1 ulp of O(1).
        check_close("rmsnorm_bwd dinp", &minus(&dinp, &init_dx), &fd_inp, 1e-4);
        check_close("rmsnorm_bwd dweight", &minus(&dweight, &init_dw), &fd_w, 1e-4);
    }

    #[test]
    fn is_deterministic_across_thread_counts() {
        let (n, c) = (2048, 64);
        let cs = case(43, n, c);
        let dout = rand_vec(&mut rng(44), n * c, -1.0, 1.0);
        let run = || {
            let (out, rstd) = forward(&cs, c, EPS);
            let (mut dinp, mut dw) = (vec![0.0; n * c], vec![0.0; c]);
            rmsnorm_bwd(&mut dinp, &mut dw, &dout, &cs.inp, &cs.weight, &rstd, c);
            [out, rstd, dinp, dw]
        };
        let a = run();
        for (label, b) in [("run twice", run()), ("1 thread", in_pool(1, run)), ("3 threads", in_pool(3, run))] {
            for (name, (x, y)) in ["out", "rstd", "dinp", "dweight"].iter().zip(a.iter().zip(&b)) {
                assert_bits_eq(&format!("rmsnorm {name} {label}"), x, y);
            }
        }
    }
}
