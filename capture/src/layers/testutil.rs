//! Test helpers shared by the layer tests: seeded random tensors, f64 reference forwards
//! (names end in `_ref`), central finite differences in f64, a closeness check that prints
//! the worst elements when it fails, bit-identity checks and fixed-size rayon pools.
//!
//! Why the gradient checks are trustworthy: the reference forwards run entirely in f64 on the
//! f32 test values, so a central difference with step `FD_STEP` = 1e-5 has truncation error
//! ~h²·|f'''| ≈ 1e-10 and rounding error ~2⁻⁵²·|f|/h ≈ 1e-10 — four orders of magnitude below
//! the f32 error of the gradients under test. What a check measures is the f32 layer.

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;

/// Step of the central finite differences (inputs are O(1)).
pub const FD_STEP: f64 = 1e-5;

/// Elements whose reference is smaller than this fraction of the tensor's largest are judged
/// against that fraction instead of their own size: an f32 sum of terms that cancel carries an
/// absolute error set by the terms, not by the (small) result.
pub const REL_FLOOR: f64 = 1e-2;

pub fn rng(seed: u64) -> Pcg64 {
    Pcg64::seed_from_u64(seed)
}

/// `n` values uniform in `[lo, hi)`.
pub fn rand_vec(rng: &mut Pcg64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

pub fn rand_tokens(rng: &mut Pcg64, n: usize, v: usize) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(0..v as u32)).collect()
}

pub fn to_f64(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| f64::from(v)).collect()
}

/// Gradient of `f` at `x` by central differences, one coordinate at a time.
pub fn fd_grad(x: &[f64], f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let mut xp = x.to_vec();
    (0..x.len())
        .map(|i| {
            let x0 = xp[i];
            xp[i] = x0 + FD_STEP;
            let fp = f(&xp);
            xp[i] = x0 - FD_STEP;
            let fm = f(&xp);
            xp[i] = x0;
            (fp - fm) / (2.0 * FD_STEP)
        })
        .collect()
}

/// Σ w·y, the scalar whose gradient w.r.t. y is w (the "dout" of a gradient check).
pub fn dot_ref(w: &[f64], y: &[f64]) -> f64 {
    assert_eq!(w.len(), y.len());
    w.iter().zip(y).map(|(a, b)| a * b).sum()
}

/// Compares `got` with `want` element-wise by |got − want| / max(|want|, REL_FLOOR·max|want|),
/// prints the worst error, and on a failure prints the eight worst elements before panicking.
/// Returns the worst error so callers can report it.
#[track_caller]
pub fn check_close(name: &str, got: &[f32], want: &[f64], tol: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "{name}: lengths differ");
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let floor = (REL_FLOOR * scale).max(f64::MIN_POSITIVE);
    let errs: Vec<f64> = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| {
            let e = (f64::from(g) - w).abs() / w.abs().max(floor);
            if e.is_nan() { f64::INFINITY } else { e }
        })
        .collect();
    let mut order: Vec<usize> = (0..errs.len()).collect();
    order.sort_by(|&a, &b| errs[b].total_cmp(&errs[a]));
    let worst = order.first().map_or(0.0, |&i| errs[i]);
    eprintln!("{name}: worst rel err {worst:.3e} (tol {tol:.0e}, {} elems, max|ref| {scale:.3e})", got.len());
    if worst > tol {
        eprintln!("{name}: worst elements (index, got, want, abs err, rel err):");
        for &i in order.iter().take(8) {
            eprintln!("  [{i:>5}] {:>+14.7e} {:>+14.7e} {:>10.3e} {:>10.3e}", got[i], want[i], (f64::from(got[i]) - want[i]).abs(), errs[i]);
        }
        panic!("{name}: worst rel err {worst:.3e} exceeds {tol:.0e}");
    }
    worst
}

/// Panics (naming the first differing element) unless `a` and `b` are bit-identical.
#[track_caller]
pub fn assert_bits_eq(name: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{name}: lengths differ");
    if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
        panic!("{name}: not bit-identical at [{i}]: {:e} vs {:e}", a[i], b[i]);
    }
}

/// Runs `f` inside a rayon pool of `threads` threads.
pub fn in_pool<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("building a rayon pool for a test").install(f)
}

// ---- f64 reference forwards -------------------------------------------------------------

/// LayerNorm of each row of `inp` (N, C), eps 1e-5, biased variance.
pub fn layernorm_fwd_ref(inp: &[f64], weight: &[f64], bias: &[f64], c: usize) -> Vec<f64> {
    let mut out = vec![0.0; inp.len()];
    for (o, x) in out.chunks_mut(c).zip(inp.chunks(c)) {
        let mean = x.iter().sum::<f64>() / c as f64;
        let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / c as f64;
        let rstd = 1.0 / (var + 1e-5).sqrt();
        for j in 0..c {
            o[j] = (x[j] - mean) * rstd * weight[j] + bias[j];
        }
    }
    out
}

/// RMSNorm of each row of `inp` (N, C): x / √(mean(x²) + eps) · weight.
pub fn rmsnorm_fwd_ref(inp: &[f64], weight: &[f64], c: usize, eps: f64) -> Vec<f64> {
    let mut out = vec![0.0; inp.len()];
    for (o, x) in out.chunks_mut(c).zip(inp.chunks(c)) {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / c as f64;
        let rstd = 1.0 / (ms + eps).sqrt();
        for j in 0..c {
            o[j] = x[j] * rstd * weight[j];
        }
    }
    out
}

/// SwiGLU of each row of `inp` (N, 2F) = [gate | up]: silu(gate)·up, silu(g) = g / (1 + e^(−g)).
pub fn swiglu_fwd_ref(inp: &[f64], f: usize) -> Vec<f64> {
    inp.chunks(2 * f).flat_map(|x| (0..f).map(move |j| x[j] / (1.0 + (-x[j]).exp()) * x[f + j])).collect()
}

/// Rotary embeddings on `qkv` (B, T, (NH + 2·KVH)·HD), computed directly: each (i, i + HD/2) pair
/// of a q or k head, read as the complex number x_i + i·x_{i+HD/2}, is multiplied by
/// e^(i·t·θ_i), θ_i = theta^(−2i/HD), with angles in f64; v is copied.
pub fn rope_fwd_ref(qkv: &[f64], b: usize, t: usize, nh: usize, kvh: usize, hd: usize, theta: f64) -> Vec<f64> {
    let w = (nh + 2 * kvh) * hd;
    let half = hd / 2;
    let mut out = qkv.to_vec();
    for row in 0..b * t {
        let pos = (row % t) as f64;
        for h in 0..nh + kvh {
            for i in 0..half {
                let ang = pos * theta.powf(-2.0 * i as f64 / hd as f64);
                let (re, im) = (qkv[row * w + h * hd + i], qkv[row * w + h * hd + half + i]);
                out[row * w + h * hd + i] = re * ang.cos() - im * ang.sin();
                out[row * w + h * hd + half + i] = re * ang.sin() + im * ang.cos();
            }
        }
    }
    out
}

/// Grouped-query attention over `qkv` (B, T, (NH + 2·KVH)·HS) rows `[q (C) | k (KVH·HS) |
/// v (KVH·HS)]`, by the definition: each kv head is repeated NH/KVH times into a multi-head qkv
/// (B, T, 3C) (query head h takes kv head h / (NH/KVH)), which `attention_fwd_ref` attends over.
/// Returns out (B, T, C).
pub fn attention_gqa_fwd_ref(qkv: &[f64], b: usize, t: usize, c: usize, nh: usize, kvh: usize, causal: bool) -> Vec<f64> {
    let hs = c / nh;
    let (w, rep) = (c + 2 * kvh * hs, nh / kvh);
    let mut mha = vec![0.0; b * t * 3 * c];
    for row in 0..b * t {
        let (src, dst) = (&qkv[row * w..(row + 1) * w], &mut mha[row * 3 * c..(row + 1) * 3 * c]);
        dst[..c].copy_from_slice(&src[..c]);
        for h in 0..nh {
            let g = h / rep;
            for part in 1..3 {
                let from = c + (part - 1) * kvh * hs + g * hs;
                dst[part * c + h * hs..][..hs].copy_from_slice(&src[from..from + hs]);
            }
        }
    }
    attention_fwd_ref(&mha, b, t, c, nh, causal)
}

/// Multi-head attention over `qkv` (B, T, 3C) = [q | k | v]; returns out (B, T, C).
pub fn attention_fwd_ref(qkv: &[f64], b: usize, t: usize, c: usize, nh: usize, causal: bool) -> Vec<f64> {
    let hs = c / nh;
    let scale = 1.0 / (hs as f64).sqrt();
    let at = |bb: usize, tt: usize, part: usize, h: usize, i: usize| qkv[(bb * t + tt) * 3 * c + part * c + h * hs + i];
    let mut out = vec![0.0; b * t * c];
    let mut p = vec![0.0; t];
    for bb in 0..b {
        for h in 0..nh {
            for tq in 0..t {
                let tend = if causal { tq + 1 } else { t };
                for (t2, pt) in p.iter_mut().enumerate().take(tend) {
                    *pt = (0..hs).map(|i| at(bb, tq, 0, h, i) * at(bb, t2, 1, h, i)).sum::<f64>() * scale;
                }
                let max = p[..tend].iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
                let sum: f64 = p[..tend]
                    .iter_mut()
                    .map(|v| {
                        *v = (*v - max).exp();
                        *v
                    })
                    .sum();
                for i in 0..hs {
                    out[(bb * t + tq) * c + h * hs + i] = (0..tend).map(|t2| p[t2] / sum * at(bb, t2, 2, h, i)).sum();
                }
            }
        }
    }
    out
}

/// GELU, tanh approximation `0.5·x·(1 + tanh(a))`, evaluated as `x·σ(2a)` — the same
/// function, but without the cancellation in `1 + tanh(a)` that costs even f64 its accuracy
/// for x below about −5.
pub fn gelu_ref(x: f64) -> f64 {
    let a = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    x / (1.0 + (-2.0 * a).exp())
}

/// out (N, M) = inp (N, K) · weight (M, K)ᵀ (+ bias (M)), naive triple loop.
pub fn matmul_fwd_ref(inp: &[f64], weight: &[f64], bias: Option<&[f64]>, n: usize, k: usize, m: usize) -> Vec<f64> {
    let mut out = vec![0.0; n * m];
    for i in 0..n {
        for j in 0..m {
            let mut s = bias.map_or(0.0, |b| b[j]);
            for kk in 0..k {
                s += inp[i * k + kk] * weight[j * k + kk];
            }
            out[i * m + j] = s;
        }
    }
    out
}

/// Per-token cross-entropy of softmax(logits (N, V)) against `targets` (N).
pub fn crossentropy_ref(logits: &[f64], targets: &[u32], v: usize) -> Vec<f64> {
    logits
        .chunks(v)
        .zip(targets)
        .map(|(row, &tgt)| {
            let max = row.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x));
            let lse = row.iter().map(|x| (x - max).exp()).sum::<f64>().ln() + max;
            lse - row[tgt as usize]
        })
        .collect()
}
