//! AdamW with PyTorch's semantics (`torch.optim.AdamW`, non-fused, `amsgrad=False`), all state
//! in f32: FP32 master weights, first moment `m`, second moment `v`.
//!
//! For step t (1-based), per element:
//! ```text
//! p ← p · (1 − lr·wd)                      decoupled weight decay, on the old p
//! m ← β1·m + (1 − β1)·g
//! v ← β2·v + (1 − β2)·g²
//! p ← p − (lr / (1 − β1ᵗ)) · m / (√v / √(1 − β2ᵗ) + ε)
//! ```
//! `params`, `m`, `v` are updated in place (`=`); `grads` is read only. Callers pass
//! `weight_decay = 0` for tensors that should not decay (biases, LayerNorm). Element-wise,
//! parallel over fixed-size chunks. The bias corrections are computed once in f64.

use rayon::prelude::*;

use super::check_len;

/// Elements per rayon task.
const CHUNK: usize = 8192;

/// One AdamW step over a flat parameter tensor; `t` is the 1-based step number.
pub fn adamw_update(params: &mut [f32], grads: &[f32], m: &mut [f32], v: &mut [f32], lr: f32, beta1: f32, beta2: f32, eps: f32, weight_decay: f32, t: u32) {
    const L: &str = "adamw_update";
    check_len(L, "grads", grads.len(), params.len());
    check_len(L, "m", m.len(), params.len());
    check_len(L, "v", v.len(), params.len());
    assert!(t >= 1, "{L}: the step number is 1-based, got 0");
    let t = f64::from(t);
    let bias_correction1 = 1.0 - f64::from(beta1).powf(t);
    let bias_correction2 = 1.0 - f64::from(beta2).powf(t);
    let step_size = (f64::from(lr) / bias_correction1) as f32;
    let bc2_sqrt = bias_correction2.sqrt() as f32;
    let decay = 1.0 - lr * weight_decay;
    params.par_chunks_mut(CHUNK).zip(grads.par_chunks(CHUNK)).zip(m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK))).for_each(|((p, g), (m, v))| {
        for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
            *p *= decay;
            *m = beta1 * *m + (1.0 - beta1) * g;
            *v = beta2 * *v + (1.0 - beta2) * g * g;
            let denom = v.sqrt() / bc2_sqrt + eps;
            *p -= step_size * (*m / denom);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const LR: f32 = 0.1;
    const B1: f32 = 0.9;
    const B2: f32 = 0.999;
    const EPS: f32 = 1e-8;
    const WD: f32 = 0.01;

    #[test]
    fn first_step_by_hand() {
        // Step 1: m̂ = g and v̂ = g², so the update is lr·g/(|g| + ε) ≈ lr·sign(g), applied
        // after the decay p·(1 − lr·wd) = p·0.999.
        //   p = 1, g = 0.5  → 0.999 − 0.1·0.5/0.50000001 = 0.899000002
        //   p = −2, g = −4  → −1.998 + 0.1·4/4.00000001  = −1.898
        //   p = 3, g = 0    → 2.997 (m = v = 0: no Adam step, only the decay)
        let mut p = vec![1.0, -2.0, 3.0];
        let (mut m, mut v) = (vec![0.0; 3], vec![0.0; 3]);
        adamw_update(&mut p, &[0.5, -4.0, 0.0], &mut m, &mut v, LR, B1, B2, EPS, WD, 1);
        let want = [0.899_000_002_f64, -1.898, 2.997];
        for (i, (&got, &want)) in p.iter().zip(&want).enumerate() {
            // f32 rounding of O(1) values: 2 ulps ≈ 2.4e-7 relative.
            assert!((f64::from(got) - want).abs() <= 2.4e-7 * want.abs(), "p[{i}] = {got}, want {want}");
        }
        // m = 0.1·g, but 1 − β1 rounds to 0.100000024 in f32.
        for (i, (&got, want)) in m.iter().zip([0.05f64, -0.4, 0.0]).enumerate() {
            assert!((f64::from(got) - want).abs() <= 3e-7 * want.abs(), "m[{i}] = {got}, want {want}");
        }
        // v = (1 − β2)·g², where 1 − β2 = 0.00099998713 because 0.999 is not exact in f32.
        let one_minus_b2 = 1.0 - f64::from(B2);
        for (i, g) in [0.5f64, -4.0, 0.0].into_iter().enumerate() {
            let want = one_minus_b2 * g * g;
            let got = f64::from(v[i]);
            assert!((got - want).abs() <= 3e-7 * want, "v[{i}] = {got}, want {want}");
        }
    }

    #[test]
    fn three_steps_match_hand_recurrence() {
        // The same recurrence written out in f64 for one scalar over three steps.
        let grads = [0.5f64, -0.25, 1.0];
        let (mut p64, mut m64, mut v64) = (1.0f64, 0.0f64, 0.0f64);
        let (b1, b2, lr, eps, wd) = (f64::from(B1), f64::from(B2), f64::from(LR), f64::from(EPS), f64::from(WD));
        let mut p = vec![1.0f32; 1];
        let (mut m, mut v) = (vec![0.0f32], vec![0.0f32]);
        for (step, &g) in grads.iter().enumerate() {
            let t = step as i32 + 1;
            p64 *= 1.0 - lr * wd;
            m64 = b1 * m64 + (1.0 - b1) * g;
            v64 = b2 * v64 + (1.0 - b2) * g * g;
            let mhat = m64 / (1.0 - b1.powi(t));
            let vhat = v64 / (1.0 - b2.powi(t));
            p64 -= lr * mhat / (vhat.sqrt() + eps);
            adamw_update(&mut p, &[g as f32], &mut m, &mut v, LR, B1, B2, EPS, WD, t as u32);
            // A dozen f32 operations per step on O(1) values, three steps: ≲ 1e-6 relative.
            let err = (f64::from(p[0]) - p64).abs() / p64.abs();
            assert!(err < 1e-6, "step {t}: p = {}, want {p64} (rel err {err:.2e})", p[0]);
        }
        // By hand (4 digits): p₁ = 0.899; step 2 decays to 0.8981, m̂ = 0.02/0.19 = 0.1053,
        // √v̂ = √(0.00031225/0.001999) = 0.3952, so p₂ = 0.8981 − 0.02663 = 0.8715; step 3
        // decays to 0.8706, m̂ = 0.118/0.271 = 0.4354, √v̂ = √(0.0013119/0.002997) = 0.6616,
        // so p₃ = 0.8706 − 0.06581 = 0.8048.
        assert!((p[0] - 0.8048).abs() < 2e-4, "final p = {}", p[0]);
    }

    #[test]
    fn chunks_are_independent_of_length() {
        // Many elements (several chunks) behave exactly like the same element alone.
        let n = 3 * CHUNK + 5;
        let grads: Vec<f32> = (0..n).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
        let mut p: Vec<f32> = (0..n).map(|i| ((i % 13) as f32 - 6.0) / 6.0).collect();
        let (mut m, mut v) = (vec![0.0; n], vec![0.0; n]);
        let p0 = p.clone();
        for t in 1..=2 {
            adamw_update(&mut p, &grads, &mut m, &mut v, LR, B1, B2, EPS, WD, t);
        }
        for i in [0, CHUNK - 1, CHUNK, 2 * CHUNK + 7, n - 1] {
            let (mut q, mut mm, mut vv) = ([p0[i]], [0.0], [0.0]);
            for t in 1..=2 {
                adamw_update(&mut q, &[grads[i]], &mut mm, &mut vv, LR, B1, B2, EPS, WD, t);
            }
            assert_eq!(p[i].to_bits(), q[0].to_bits(), "element {i}");
        }
    }
}
