//! GELU, tanh approximation, as in llm.c: `0.5·x·(1 + tanh(a))` with
//! `a = √(2/π)·(x + 0.044715·x³)`.
//!
//! - `gelu_fwd`: out `=` gelu(inp), any shape. Saved for backward: the caller keeps `inp`.
//! - `gelu_bwd`: dinp `=` gelu'(inp)·dout. (llm.c accumulates; here the fc1 output has one
//!   consumer, so overwriting saves a clear.)
//!
//! Computed through the identity `0.5·(1 + tanh(a)) = σ(2a) = 1 / (1 + e^(−2a))`, which needs
//! one `exp` instead of `tanh` (and `cosh` in the backward, where `0.5·sech²(a) = 2σ(1−σ)`):
//! the same function, about three times cheaper, and without tanh's cancellation in `1 + tanh`
//! for large negative x. Element-wise, parallel over fixed-size chunks.

use rayon::prelude::*;

use super::check_len;

/// Elements per rayon task (element-wise work, a few transcendental calls each).
const CHUNK: usize = 4096;

const GELU_SCALE: f32 = 0.797_884_6; // √(2/π)
const GELU_CUBE: f32 = 0.044715;

/// σ(2a) and σ(2a)·(1 − σ(2a)) for the GELU argument `a` of `x`, and da/dx.
#[inline]
fn sigmoid_terms(x: f32) -> (f32, f32, f32) {
    let x2 = x * x;
    let a = GELU_SCALE * (x + GELU_CUBE * x2 * x);
    let e = (-2.0 * a).exp(); // ∞ for very negative x: then σ = 0, as it should be
    let sig = 1.0 / (1.0 + e);
    // 1 − σ without cancellation on either side of σ = 0.5.
    let one_minus = if e > 1.0 { 1.0 - sig } else { e * sig };
    let da_dx = GELU_SCALE * (1.0 + 3.0 * GELU_CUBE * x2);
    (sig, sig * one_minus, da_dx)
}

/// out = gelu(inp).
pub fn gelu_fwd(out: &mut [f32], inp: &[f32]) {
    check_len("gelu_fwd", "out", out.len(), inp.len());
    out.par_chunks_mut(CHUNK).zip(inp.par_chunks(CHUNK)).for_each(|(o, x)| {
        for (o, &x) in o.iter_mut().zip(x) {
            let a = GELU_SCALE * (x + GELU_CUBE * x * x * x);
            *o = x / (1.0 + (-2.0 * a).exp());
        }
    });
}

/// dinp = gelu'(inp) · dout, with gelu'(x) = σ(2a) + 2x·σ(2a)(1 − σ(2a))·da/dx.
pub fn gelu_bwd(dinp: &mut [f32], inp: &[f32], dout: &[f32]) {
    check_len("gelu_bwd", "dinp", dinp.len(), inp.len());
    check_len("gelu_bwd", "dout", dout.len(), inp.len());
    dinp.par_chunks_mut(CHUNK).zip(inp.par_chunks(CHUNK)).zip(dout.par_chunks(CHUNK)).for_each(|((dx, x), dy)| {
        for ((dx, &x), &dy) in dx.iter_mut().zip(x).zip(dy) {
            let (sig, sig_1msig, da_dx) = sigmoid_terms(x);
            *dx = (sig + 2.0 * x * sig_1msig * da_dx) * dy;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::testutil::*;

    const N: usize = 10 * 32; // N·F with B = 2, T = 5, F = 32

    #[test]
    fn forward_matches_f64_reference() {
        let x = rand_vec(&mut rng(30), N, -6.0, 6.0);
        let mut out = vec![f32::NAN; N];
        gelu_fwd(&mut out, &x);
        let want: Vec<f64> = x.iter().map(|&v| gelu_ref(f64::from(v))).collect();
        // A handful of f32 operations and one exp, no cancellation: a few ulps.
        check_close("gelu_fwd", &out, &want, 1e-5);
    }

    #[test]
    fn forward_is_relatively_accurate_in_the_negative_tail() {
        // For x ≪ 0, gelu(x) is tiny; the σ form keeps its relative accuracy (1 + tanh in f32
        // would round to 0 below x ≈ −4: a relative error of 1). What remains is the f32
        // rounding of the exp argument 2a (a few ulps, constants included), which exp turns
        // into a relative error of about |2a|·ulps: the bound is 1e-6·(1 + |2a|), ~16 ulps.
        let x: Vec<f32> = (0..200).map(|i| -0.05 * i as f32).collect();
        let mut out = vec![f32::NAN; x.len()];
        gelu_fwd(&mut out, &x);
        for (&x, &y) in x.iter().zip(&out) {
            let x64 = f64::from(x);
            let two_a = 2.0 * (2.0 / std::f64::consts::PI).sqrt() * (x64 + 0.044715 * x64.powi(3));
            let want = gelu_ref(x64);
            let err = if want == 0.0 { f64::from(y).abs() } else { (f64::from(y) - want).abs() / want.abs() };
            let tol = 1e-6 * (1.0 + two_a.abs());
            assert!(err < tol, "gelu({x}) = {y:e}, want {want:e} (rel err {err:.2e} > {tol:.1e})");
        }
    }

    #[test]
    fn backward_matches_finite_differences() {
        let mut r = rng(31);
        // Include large |x|, where e^(−2a) overflows to ∞ (x = −60) or vanishes (x = 60).
        let mut x = rand_vec(&mut r, N, -6.0, 6.0);
        x[0] = 60.0;
        x[1] = -60.0;
        let dout = rand_vec(&mut r, N, -1.0, 1.0);
        let want: Vec<f64> = x
            .iter()
            .zip(&dout)
            .map(|(&x, &dy)| {
                let x = f64::from(x);
                f64::from(dy) * (gelu_ref(x + FD_STEP) - gelu_ref(x - FD_STEP)) / (2.0 * FD_STEP)
            })
            .collect();
        let mut dinp = vec![f32::NAN; N];
        gelu_bwd(&mut dinp, &x, &dout);
        // Element-wise closed form in f32: a few ulps of O(1) values; the floor covers the
        // zero of gelu' near x ≈ −0.75, where the two terms cancel.
        check_close("gelu_bwd dinp", &dinp, &want, 1e-5);
    }
}
