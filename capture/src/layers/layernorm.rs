//! LayerNorm over the channel dimension, as in llm.c (biased variance, eps = `LN_EPS`).
//!
//! - `layernorm_fwd`: out (N, C) `=`, mean (N) `=`, rstd (N) `=`; inp (N, C), weight (C),
//!   bias (C). Saved for backward: `mean` and `rstd` (and the caller keeps `inp`).
//! - `layernorm_bwd`: dinp (N, C) `+=`, dweight (C) `+=`, dbias (C) `+=`; from dout (N, C), inp,
//!   weight, mean, rstd. `dinp` accumulates because a LayerNorm's input is the residual
//!   stream, whose gradient also arrives through the skip connection.
//!
//! Parallel over rows for `out` and `dinp` (row-local sums); `dweight`/`dbias` are reduced over
//! rows in a second pass that is parallel over blocks of channels, each channel summed over the
//! rows in order — the same order as a serial loop, so the result does not depend on threads.

use rayon::prelude::*;

use super::{check_len, rows_of, rows_per_task};

/// The epsilon added to the variance.
pub const LN_EPS: f32 = 1e-5;

/// Channels per task in the `dweight`/`dbias` reduction.
const CHANNEL_BLOCK: usize = 16;

/// out = (inp − mean)·rstd·weight + bias per row of inp (N, C); also writes mean (N), rstd (N).
pub fn layernorm_fwd(out: &mut [f32], mean: &mut [f32], rstd: &mut [f32], inp: &[f32], weight: &[f32], bias: &[f32], c: usize) {
    const L: &str = "layernorm_fwd";
    let n = rows_of(L, "inp", inp.len(), c);
    check_len(L, "out", out.len(), n * c);
    check_len(L, "mean", mean.len(), n);
    check_len(L, "rstd", rstd.len(), n);
    check_len(L, "weight", weight.len(), c);
    check_len(L, "bias", bias.len(), c);
    let inv_c = 1.0 / c as f32;
    out.par_chunks_mut(c).zip(inp.par_chunks(c)).zip(mean.par_iter_mut().zip(rstd.par_iter_mut())).with_min_len(rows_per_task(c)).for_each(
        |((o, x), (m, s))| {
            let mu = x.iter().sum::<f32>() * inv_c;
            let var = x.iter().map(|&v| (v - mu) * (v - mu)).sum::<f32>() * inv_c;
            let rs = 1.0 / (var + LN_EPS).sqrt();
            for (((o, &x), &w), &b) in o.iter_mut().zip(x).zip(weight).zip(bias) {
                *o = (x - mu) * rs * w + b;
            }
            *m = mu;
            *s = rs;
        },
    );
}

/// Backward of `layernorm_fwd`: dinp (N, C) `+=`, dweight (C) `+=`, dbias (C) `+=`.
pub fn layernorm_bwd(
    dinp: &mut [f32],
    dweight: &mut [f32],
    dbias: &mut [f32],
    dout: &[f32],
    inp: &[f32],
    weight: &[f32],
    mean: &[f32],
    rstd: &[f32],
    c: usize,
) {
    const L: &str = "layernorm_bwd";
    let n = rows_of(L, "inp", inp.len(), c);
    check_len(L, "dinp", dinp.len(), n * c);
    check_len(L, "dout", dout.len(), n * c);
    check_len(L, "dweight", dweight.len(), c);
    check_len(L, "dbias", dbias.len(), c);
    check_len(L, "weight", weight.len(), c);
    check_len(L, "mean", mean.len(), n);
    check_len(L, "rstd", rstd.len(), n);
    let inv_c = 1.0 / c as f32;

    // Pass 1, per row: dx = rstd·(w·dy − mean(w·dy) − x̂·mean(w·dy·x̂)).
    dinp.par_chunks_mut(c).zip(dout.par_chunks(c)).zip(inp.par_chunks(c)).zip(mean.par_iter().zip(rstd.par_iter())).with_min_len(rows_per_task(c)).for_each(
        |(((dx, dy), x), (&mu, &rs))| {
            let mut dnorm_mean = 0.0f32;
            let mut dnorm_norm_mean = 0.0f32;
            for ((&dy, &x), &w) in dy.iter().zip(x).zip(weight) {
                let dnorm = w * dy;
                dnorm_mean += dnorm;
                dnorm_norm_mean += dnorm * ((x - mu) * rs);
            }
            dnorm_mean *= inv_c;
            dnorm_norm_mean *= inv_c;
            for (((dx, &dy), &x), &w) in dx.iter_mut().zip(dy).zip(x).zip(weight) {
                let norm = (x - mu) * rs;
                *dx += (w * dy - dnorm_mean - norm * dnorm_norm_mean) * rs;
            }
        },
    );

    // Pass 2, per block of channels, rows in order: dweight += Σ dy·x̂, dbias += Σ dy.
    dweight.par_chunks_mut(CHANNEL_BLOCK).zip(dbias.par_chunks_mut(CHANNEL_BLOCK)).enumerate().for_each(|(blk, (dw, db))| {
        let j0 = blk * CHANNEL_BLOCK;
        let width = dw.len();
        for i in 0..n {
            let (mu, rs) = (mean[i], rstd[i]);
            let row = i * c + j0;
            let dy = &dout[row..row + width];
            let x = &inp[row..row + width];
            for (((dw, db), &dy), &x) in dw.iter_mut().zip(db.iter_mut()).zip(dy).zip(x) {
                *dw += dy * ((x - mu) * rs);
                *db += dy;
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

    struct Case {
        inp: Vec<f32>,
        weight: Vec<f32>,
        bias: Vec<f32>,
    }

    fn case(seed: u64, n: usize, c: usize) -> Case {
        let mut r = rng(seed);
        // Rows with an offset, so the mean subtraction matters.
        let mut inp = rand_vec(&mut r, n * c, -2.0, 2.0);
        for (i, x) in inp.iter_mut().enumerate() {
            *x += 0.5 * (i / c) as f32;
        }
        Case { inp, weight: rand_vec(&mut r, c, 0.5, 1.5), bias: rand_vec(&mut r, c, -0.5, 0.5) }
    }

    fn forward(cs: &Case, c: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let n = cs.inp.len() / c;
        let (mut out, mut mean, mut rstd) = (vec![f32::NAN; n * c], vec![f32::NAN; n], vec![f32::NAN; n]);
        layernorm_fwd(&mut out, &mut mean, &mut rstd, &cs.inp, &cs.weight, &cs.bias, c);
        (out, mean, rstd)
    }

    #[test]
    fn forward_matches_f64_reference() {
        let cs = case(10, N, C);
        let (out, _, _) = forward(&cs, C);
        let want = layernorm_fwd_ref(&to_f64(&cs.inp), &to_f64(&cs.weight), &to_f64(&cs.bias), C);
        // Sums of C = 8 terms in f32 and one sqrt: a few ulps of O(1) outputs.
        check_close("layernorm_fwd out", &out, &want, 1e-5);
    }

    #[test]
    fn backward_matches_finite_differences() {
        let cs = case(11, N, C);
        let (_, mean, rstd) = forward(&cs, C);
        let mut r = rng(12);
        let dout = rand_vec(&mut r, N * C, -1.0, 1.0);
        let (x64, w64, b64, dy64) = (to_f64(&cs.inp), to_f64(&cs.weight), to_f64(&cs.bias), to_f64(&dout));
        let fd_inp = fd_grad(&x64, |x| dot_ref(&dy64, &layernorm_fwd_ref(x, &w64, &b64, C)));
        let fd_w = fd_grad(&w64, |w| dot_ref(&dy64, &layernorm_fwd_ref(&x64, w, &b64, C)));
        let fd_b = fd_grad(&b64, |b| dot_ref(&dy64, &layernorm_fwd_ref(&x64, &w64, b, C)));

        // All three accumulate: start from random values, compare the increments.
        let init_dx = rand_vec(&mut r, N * C, -1.0, 1.0);
        let init_dw = rand_vec(&mut r, C, -1.0, 1.0);
        let init_db = rand_vec(&mut r, C, -1.0, 1.0);
        let (mut dinp, mut dweight, mut dbias) = (init_dx.clone(), init_dw.clone(), init_db.clone());
        layernorm_bwd(&mut dinp, &mut dweight, &mut dbias, &dout, &cs.inp, &cs.weight, &mean, &rstd, C);
        let minus = |got: &[f32], init: &[f32]| -> Vec<f32> { got.iter().zip(init).map(|(g, i)| g - i).collect() };

        // dinp is a difference of three O(1) terms times rstd ≈ 1: cancellation leaves an
        // absolute f32 error of ~1e-7·|terms|, which the 1 % floor turns into ≲ 1e-5 relative;
        // 1e-4 keeps a margin. The subtraction of the initial value adds ~1 ulp of O(1).
        check_close("layernorm_bwd dinp", &minus(&dinp, &init_dx), &fd_inp, 1e-4);
        check_close("layernorm_bwd dweight", &minus(&dweight, &init_dw), &fd_w, 1e-4);
        check_close("layernorm_bwd dbias", &minus(&dbias, &init_db), &fd_b, 1e-4);
    }

    #[test]
    fn is_deterministic_across_thread_counts() {
        let (n, c) = (2048, 64);
        let cs = case(13, n, c);
        let dout = rand_vec(&mut rng(14), n * c, -1.0, 1.0);
        let run = || {
            let (out, mean, rstd) = forward(&cs, c);
            let (mut dinp, mut dw, mut db) = (vec![0.0; n * c], vec![0.0; c], vec![0.0; c]);
            layernorm_bwd(&mut dinp, &mut dw, &mut db, &dout, &cs.inp, &cs.weight, &mean, &rstd, c);
            [out, mean, rstd, dinp, dw, db]
        };
        let a = run();
        for (label, b) in [("run twice", run()), ("1 thread", in_pool(1, run)), ("3 threads", in_pool(3, run))] {
            for (name, (x, y)) in ["out", "mean", "rstd", "dinp", "dweight", "dbias"].iter().zip(a.iter().zip(&b)) {
                assert_bits_eq(&format!("layernorm {name} {label}"), x, y);
            }
        }
    }
}
