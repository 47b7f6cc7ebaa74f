//! Rotary position embeddings (RoPE) on the q and k heads of a fused qkv, in Hugging Face's
//! `rotate_half` convention (Llama).
//!
//! Layout: qkv (B, T, W) with W = (NH + 2·KVH)·HD, each token's row `[q (NH·HD) | k (KVH·HD) |
//! v (KVH·HD)]`. Within every q and k head, element i is paired with element i + HD/2 and the
//! pair is rotated by the angle t·θ_i of the token's position t (0-based, within its sequence),
//! with θ_i = theta^(−2i/HD), i < HD/2:
//!   out[i]        = x[i]·cos − x[i + HD/2]·sin
//!   out[i + HD/2] = x[i + HD/2]·cos + x[i]·sin
//! The v heads are copied unchanged.
//!
//! - `rope_table(t, hd, theta)`: the (T, HD) table the rotations read; row t is
//!   `[cos(t·θ_0) .. cos(t·θ_{HD/2−1}) | sin(t·θ_0) .. sin(t·θ_{HD/2−1})]`. Angles, cosines and sines
//!   are computed in f64 and rounded once to f32, so the table is the correctly rounded one (up
//!   to f64's last bit); Hugging Face computes t·θ_i in f32, which is off by up to ~t·2⁻²⁴ rad.
//!   The CUDA backend uploads this same table, so both backends rotate with identical factors.
//! - `rope_fwd`: out (B, T, W) `=` from qkv and the table.
//! - `rope_bwd`: dqkv (B, T, W) `=` from dout: the inverse rotation (the transpose of each 2×2
//!   rotation) on q and k, v copied:
//!   dx[i]        = dy[i]·cos + dy[i + HD/2]·sin
//!   dx[i + HD/2] = dy[i + HD/2]·cos − dy[i]·sin
//!
//! Each output is two f32 products and one f32 sum or difference, evaluated in that order with no
//! fused multiply-add (the CUDA kernels use `__fmul_rn`/`__fadd_rn` to match bit for bit).
//!
//! BF16: nothing is rounded here. The input q and k are the qkv GEMM's BF16-rounded outputs; their
//! rotation is kept in f32 and attention consumes it as it consumes qkv (the CUDA attention rounds
//! its q, k, v operands to BF16, the CPU one keeps f32 — see attention.rs).
//!
//! Parallel over (b, t) rows; element-wise, so bit-identical for any thread count.

use rayon::prelude::*;

use super::{check_len, rows_per_task};

/// The (T, HD) table of cosines and sines (see the module doc).
pub fn rope_table(t: usize, hd: usize, theta: f32) -> Vec<f32> {
    assert!(hd > 0 && hd.is_multiple_of(2), "rope: head size HD = {hd} must be even and positive");
    let half = hd / 2;
    let inv_freq: Vec<f64> = (0..half).map(|i| f64::from(theta).powf(-((2 * i) as f64) / hd as f64)).collect();
    let mut tab = vec![0.0f32; t * hd];
    tab.par_chunks_mut(hd).enumerate().for_each(|(pos, row)| {
        let (cos, sin) = row.split_at_mut(half);
        for ((c, s), &f) in cos.iter_mut().zip(sin.iter_mut()).zip(&inv_freq) {
            let (sa, ca) = (pos as f64 * f).sin_cos();
            *c = ca as f32;
            *s = sa as f32;
        }
    });
    tab
}

/// Checks the dimensions shared by forward and backward; returns the row width W.
#[track_caller]
fn check_dims(layer: &str, tab: &[f32], t: usize, nh: usize, kvh: usize, hd: usize) -> usize {
    assert!(hd > 0 && hd.is_multiple_of(2), "{layer}: head size HD = {hd} must be even and positive");
    assert!(nh > 0 && kvh > 0, "{layer}: NH = {nh} and KVH = {kvh} must be positive");
    check_len(layer, "table", tab.len(), t * hd);
    (nh + 2 * kvh) * hd
}

/// Applies `rot` to every (i, i + HD/2) pair of the q and k heads of each (b, t) row of `src`
/// into `dst`, and copies the v heads.
fn rotate_rows(dst: &mut [f32], src: &[f32], tab: &[f32], t: usize, nh: usize, kvh: usize, hd: usize, rot: impl Fn(f32, f32, f32, f32) -> (f32, f32) + Sync) {
    let w = (nh + 2 * kvh) * hd;
    let half = hd / 2;
    let rotated = (nh + kvh) * hd;
    dst.par_chunks_mut(w).zip(src.par_chunks(w)).enumerate().with_min_len(rows_per_task(w)).for_each(|(row, (o, x))| {
        let (cos, sin) = tab[(row % t) * hd..][..hd].split_at(half);
        for (oh, xh) in o[..rotated].chunks_mut(hd).zip(x[..rotated].chunks(hd)) {
            let (o1, o2) = oh.split_at_mut(half);
            let (x1, x2) = xh.split_at(half);
            for i in 0..half {
                (o1[i], o2[i]) = rot(x1[i], x2[i], cos[i], sin[i]);
            }
        }
        o[rotated..].copy_from_slice(&x[rotated..]);
    });
}

/// out (B, T, W) `=` qkv with its q and k heads rotated by position; `tab` from [`rope_table`].
pub fn rope_fwd(out: &mut [f32], qkv: &[f32], tab: &[f32], b: usize, t: usize, nh: usize, kvh: usize, hd: usize) {
    const L: &str = "rope_fwd";
    let w = check_dims(L, tab, t, nh, kvh, hd);
    check_len(L, "qkv", qkv.len(), b * t * w);
    check_len(L, "out", out.len(), b * t * w);
    rotate_rows(out, qkv, tab, t, nh, kvh, hd, |x1, x2, c, s| (x1 * c - x2 * s, x2 * c + x1 * s));
}

/// dqkv (B, T, W) `=` from dout: the inverse rotation on q and k, v copied.
pub fn rope_bwd(dqkv: &mut [f32], dout: &[f32], tab: &[f32], b: usize, t: usize, nh: usize, kvh: usize, hd: usize) {
    const L: &str = "rope_bwd";
    let w = check_dims(L, tab, t, nh, kvh, hd);
    check_len(L, "dout", dout.len(), b * t * w);
    check_len(L, "dqkv", dqkv.len(), b * t * w);
    rotate_rows(dqkv, dout, tab, t, nh, kvh, hd, |y1, y2, c, s| (y1 * c + y2 * s, y2 * c - y1 * s));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::testutil::*;

    const B: usize = 2;
    const T: usize = 7;
    const NH: usize = 4;
    const KVH: usize = 2;
    const HD: usize = 8;
    const W: usize = (NH + 2 * KVH) * HD;
    const THETA: f32 = 10000.0;

    fn forward(qkv: &[f32], b: usize, t: usize, theta: f32) -> Vec<f32> {
        let mut out = vec![f32::NAN; qkv.len()];
        rope_fwd(&mut out, qkv, &rope_table(t, HD, theta), b, t, NH, KVH, HD);
        out
    }

    #[test]
    fn table_holds_the_correctly_rounded_cosines_and_sines() {
        let t = 2048;
        let tab = rope_table(t, HD, THETA);
        let mut worst = 0.0f64;
        for pos in [0, 1, 2, 100, 2047] {
            for i in 0..HD / 2 {
                // θ_i by repeated division, a route independent of powf.
                let theta_i = (0..2 * i).fold(1.0f64, |a, _| a / f64::from(THETA).powf(1.0 / HD as f64));
                let ang = pos as f64 * theta_i;
                for (got, want) in [(tab[pos * HD + i], ang.cos()), (tab[pos * HD + HD / 2 + i], ang.sin())] {
                    // f32 rounding (2⁻²⁴ relative) of an f64 value, plus the f64 angle's own error
                    // (~1e-16·t rad): at most ~6e-8 absolute for values of magnitude ≤ 1.
                    let err = (f64::from(got) - want).abs();
                    worst = worst.max(err);
                    assert!(err <= 6e-8, "table[{pos}][{i}]: {got:e} vs {want:e}");
                }
            }
        }
        eprintln!("rope_table: worst abs err {worst:.3e} vs f64");
        assert!(tab[..HD / 2].iter().all(|&c| c == 1.0) && tab[HD / 2..HD].iter().all(|&s| s == 0.0), "position 0 must not rotate");
    }

    #[test]
    fn forward_matches_direct_f64_rotation() {
        // Long sequence so the angles reach thousands of radians.
        for (t, theta) in [(T, THETA), (3000, 500000.0)] {
            let qkv = rand_vec(&mut rng(60), B * t * W, -2.0, 2.0);
            let out = forward(&qkv, B, t, theta);
            let want = rope_fwd_ref(&to_f64(&qkv), B, t, NH, KVH, HD, f64::from(theta));
            // Two rounded products, factors within 2⁻²⁵ of exact and a rounded sum: an absolute
            // error ≤ ~1.5 ulp of max|x| = 2, i.e. ≤ 3.6e-7, which the 1 % floor of max|out|
            // (≈ 2.8) turns into ≤ 1.3e-5 relative where outputs cancel to near zero.
            check_close(&format!("rope_fwd t={t} theta={theta}"), &out, &want, 2e-5);
        }
    }

    #[test]
    fn forward_leaves_position_zero_and_v_untouched() {
        let qkv = rand_vec(&mut rng(61), B * T * W, -2.0, 2.0);
        let out = forward(&qkv, B, T, THETA);
        for bb in 0..B {
            let row = bb * T * W;
            assert_bits_eq("rope at t = 0", &out[row..row + W], &qkv[row..row + W]);
            for tt in 0..T {
                let v = (bb * T + tt) * W + (NH + KVH) * HD;
                assert_bits_eq("rope v", &out[v..v + KVH * HD], &qkv[v..v + KVH * HD]);
            }
        }
    }

    #[test]
    fn scores_depend_only_on_the_relative_position() {
        // The point of RoPE: q at position m and k at position n score q·R(n − m)k. Put the same
        // q and k at positions (1, 4) and (3, 6) of one sequence: the rotated dot products agree.
        let (t, hd) = (8, HD);
        let mut qkv = vec![0.0f32; t * W];
        let mut r = rng(62);
        let (q, k) = (rand_vec(&mut r, hd, -1.0, 1.0), rand_vec(&mut r, hd, -1.0, 1.0));
        for (pos, part, x) in [(1, 0, &q), (3, 0, &q), (4, NH, &k), (6, NH, &k)] {
            qkv[pos * W + part * hd..][..hd].copy_from_slice(x);
        }
        let out = forward(&qkv, 1, t, THETA);
        let dot = |pq: usize, pk: usize| -> f64 { (0..hd).map(|i| f64::from(out[pq * W + i]) * f64::from(out[pk * W + NH * hd + i])).sum() };
        let (a, b) = (dot(1, 4), dot(3, 6));
        let unrotated: f64 = q.iter().zip(&k).map(|(x, y)| f64::from(x * y)).sum();
        assert!((a - b).abs() < 1e-6, "q·k at (1, 4) = {a}, at (3, 6) = {b}");
        assert!((a - unrotated).abs() > 1e-3, "a shift of 3 should change the score ({a} vs {unrotated})");
    }

    #[test]
    fn backward_matches_finite_differences_and_inverts_the_rotation() {
        let mut r = rng(63);
        let qkv = rand_vec(&mut r, B * T * W, -2.0, 2.0);
        let dout = rand_vec(&mut r, B * T * W, -1.0, 1.0);
        let dy64 = to_f64(&dout);
        let want = fd_grad(&to_f64(&qkv), |x| dot_ref(&dy64, &rope_fwd_ref(x, B, T, NH, KVH, HD, f64::from(THETA))));
        let tab = rope_table(T, HD, THETA);
        // `=`: garbage in the output must be overwritten.
        let mut dqkv = vec![f32::NAN; qkv.len()];
        rope_bwd(&mut dqkv, &dout, &tab, B, T, NH, KVH, HD);
        // Linear map: the central difference is exact up to f64 rounding; the f32 backward has
        // two products and a sum per element, bounded as in the forward test: ≤ 1.3e-5.
        check_close("rope_bwd dqkv", &dqkv, &want, 2e-5);
        // The rotation is orthogonal: backward(forward(x)) = x, with twice that error at most.
        let mut back = vec![f32::NAN; qkv.len()];
        rope_bwd(&mut back, &forward(&qkv, B, T, THETA), &tab, B, T, NH, KVH, HD);
        check_close("rope_bwd ∘ rope_fwd", &back, &to_f64(&qkv), 4e-5);
    }

    #[test]
    fn is_deterministic_across_thread_counts() {
        let (b, t) = (4, 256);
        let mut r = rng(64);
        let qkv = rand_vec(&mut r, b * t * W, -2.0, 2.0);
        let run = || {
            let tab = rope_table(t, HD, THETA);
            let mut out = vec![0.0; qkv.len()];
            rope_fwd(&mut out, &qkv, &tab, b, t, NH, KVH, HD);
            let mut d = vec![0.0; qkv.len()];
            rope_bwd(&mut d, &out, &tab, b, t, NH, KVH, HD);
            [tab, out, d]
        };
        let a = run();
        for (label, o) in [("run twice", run()), ("1 thread", in_pool(1, run)), ("3 threads", in_pool(3, run))] {
            for (name, (x, y)) in ["table", "out", "dqkv"].iter().zip(a.iter().zip(&o)) {
                assert_bits_eq(&format!("rope {name} {label}"), x, y);
            }
        }
    }
}
