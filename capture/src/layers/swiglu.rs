//! SwiGLU, the gated activation of Llama's MLP: out = silu(gate)·up, silu(g) = g·σ(g).
//!
//! Layout: each row of inp (N, 2F) is `[gate (F) | up (F)]` — the fused output of one linear
//! layer (C → 2F) whose first F output features are the gate projection and the last F the up
//! projection; out is (N, F).
//!
//! - `swiglu_fwd`: out (N, F) `=`. Saved for backward: the caller keeps `inp`.
//! - `swiglu_bwd`: dinp (N, 2F) `=` (every element written), from inp and dout (N, F):
//!   d(gate) = dout·up·silu'(gate), d(up) = dout·silu(gate), with
//!   silu'(g) = σ(g) + g·σ(g)·(1 − σ(g)). (The fused linear's output has one consumer, so
//!   overwriting saves a clear, as in `gelu_bwd`.)
//!
//! σ(g) = 1 / (1 + e^(−g)) with one `exp`; 1 − σ is taken as e^(−g)·σ where that avoids the
//! cancellation (as in gelu.rs). For g < −88.7, e^(−g) overflows to ∞ and silu(g) is 0 instead
//! of a value below 3e-37.
//!
//! BF16: nothing is rounded here, as for GELU — the output's only consumer is the down
//! projection, whose GEMM casts it (to BF16 or FP8). Element-wise, parallel over rows.

use rayon::prelude::*;

use super::{check_len, rows_of, rows_per_task};

/// σ(g), 1 − σ(g) (without cancellation on either side of σ = 0.5).
#[inline]
fn sigmoid(g: f32) -> (f32, f32) {
    let e = (-g).exp(); // ∞ for very negative g: then σ = 0, as it should be
    let sig = 1.0 / (1.0 + e);
    let one_minus = if e > 1.0 { 1.0 - sig } else { e * sig };
    (sig, one_minus)
}

/// out (N, F) = silu(gate)·up, from inp (N, 2F) = [gate | up].
pub fn swiglu_fwd(out: &mut [f32], inp: &[f32], f: usize) {
    const L: &str = "swiglu_fwd";
    let n = rows_of(L, "inp", inp.len(), 2 * f);
    check_len(L, "out", out.len(), n * f);
    out.par_chunks_mut(f).zip(inp.par_chunks(2 * f)).with_min_len(rows_per_task(f)).for_each(|(o, x)| {
        let (gate, up) = x.split_at(f);
        for ((o, &g), &u) in o.iter_mut().zip(gate).zip(up) {
            let (sig, _) = sigmoid(g);
            *o = (g * sig) * u;
        }
    });
}

/// dinp (N, 2F) `=` from inp (N, 2F) and dout (N, F).
pub fn swiglu_bwd(dinp: &mut [f32], inp: &[f32], dout: &[f32], f: usize) {
    const L: &str = "swiglu_bwd";
    let n = rows_of(L, "inp", inp.len(), 2 * f);
    check_len(L, "dinp", dinp.len(), n * 2 * f);
    check_len(L, "dout", dout.len(), n * f);
    dinp.par_chunks_mut(2 * f).zip(inp.par_chunks(2 * f)).zip(dout.par_chunks(f)).with_min_len(rows_per_task(f)).for_each(|((dx, x), dy)| {
        let (gate, up) = x.split_at(f);
        let (dgate, dup) = dx.split_at_mut(f);
        for ((((dg, du), &g), &u), &dy) in dgate.iter_mut().zip(dup.iter_mut()).zip(gate).zip(up).zip(dy) {
            let (sig, one_minus) = sigmoid(g);
            let dsilu = sig + g * sig * one_minus;
            *dg = (dy * u) * dsilu;
            *du = dy * (g * sig);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::testutil::*;

    const N: usize = 10; // B = 2, T = 5
    const F: usize = 24;

    #[test]
    fn forward_matches_f64_reference() {
        let mut r = rng(50);
        let x = rand_vec(&mut r, N * 2 * F, -8.0, 8.0);
        let mut out = vec![f32::NAN; N * F];
        swiglu_fwd(&mut out, &x, F);
        let want = swiglu_fwd_ref(&to_f64(&x), F);
        // One exp and three products per element, no cancellation: a few ulps.
        check_close("swiglu_fwd", &out, &want, 1e-6);
    }

    #[test]
    fn forward_is_relatively_accurate_in_the_negative_tail() {
        // silu(g) ≈ g·e^g for g ≪ 0: the σ form keeps its relative accuracy down to the
        // overflow of e^(−g) (g ≈ −88.7). What remains is exp of an argument that is exact, a
        // few ulps: 1e-6 relative, element by element (no floor).
        let gate: Vec<f32> = (0..170).map(|i| -0.5 * i as f32).collect();
        let x: Vec<f32> = gate.iter().copied().chain(std::iter::repeat_n(1.0, gate.len())).collect();
        let mut out = vec![f32::NAN; gate.len()];
        swiglu_fwd(&mut out, &x, gate.len());
        for (&g, &y) in gate.iter().zip(&out) {
            let g64 = f64::from(g);
            let want = g64 / (1.0 + (-g64).exp());
            let err = if want == 0.0 { f64::from(y).abs() } else { (f64::from(y) - want).abs() / want.abs() };
            assert!(err < 1e-6, "silu({g}) = {y:e}, want {want:e} (rel err {err:.2e})");
        }
    }

    #[test]
    fn backward_matches_finite_differences() {
        let mut r = rng(51);
        let mut x = rand_vec(&mut r, N * 2 * F, -8.0, 8.0);
        // Large |gate|, where e^(−g) overflows to ∞ (g = −100) or vanishes (g = 100).
        x[0] = 100.0;
        x[1] = -100.0;
        let dout = rand_vec(&mut r, N * F, -1.0, 1.0);
        let dy64 = to_f64(&dout);
        let want = fd_grad(&to_f64(&x), |x| dot_ref(&dy64, &swiglu_fwd_ref(x, F)));
        // `=`: garbage in the output must be overwritten.
        let mut dinp = vec![f32::NAN; x.len()];
        swiglu_bwd(&mut dinp, &x, &dout, F);
        // Element-wise closed forms in f32: a few ulps; the 1 % floor covers the zero of
        // silu' near g ≈ −1.28, where its two terms cancel.
        check_close("swiglu_bwd dinp", &dinp, &want, 1e-5);
    }

    #[test]
    fn is_deterministic_across_thread_counts() {
        let (n, f) = (1024, 96);
        let mut r = rng(52);
        let x = rand_vec(&mut r, n * 2 * f, -6.0, 6.0);
        let dout = rand_vec(&mut r, n * f, -1.0, 1.0);
        let run = || {
            let mut out = vec![0.0; n * f];
            swiglu_fwd(&mut out, &x, f);
            let mut dinp = vec![0.0; n * 2 * f];
            swiglu_bwd(&mut dinp, &x, &dout, f);
            [out, dinp]
        };
        let a = run();
        for (label, b) in [("run twice", run()), ("1 thread", in_pool(1, run)), ("3 threads", in_pool(3, run))] {
            for (name, (p, q)) in ["out", "dinp"].iter().zip(a.iter().zip(&b)) {
                assert_bits_eq(&format!("swiglu {name} {label}"), p, q);
            }
        }
    }
}
