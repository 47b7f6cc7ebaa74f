//! Scaled dot-product attention with grouped-query heads, causal or full, as in llm.c.
//!
//! Layout: qkv (B, T, W) holds each token's row as `[q (C) | k (KVH·hs) | v (KVH·hs)]`,
//! W = C + 2·KVH·hs, hs = C / NH; query head h uses channels `h·hs .. (h+1)·hs` of q and kv head
//! h / (NH/KVH) of k and v (grouped-query attention; KVH = NH is multi-head attention, with the
//! row `[q | k | v]` each C wide, KVH = 1 multi-query). Scores are scaled by 1/√hs. With `causal`,
//! query t sees keys 0..=t; otherwise all T keys.
//!
//! - `attention_fwd`: out (B, T, C) `=`, att (B, NH, T, T) `=` — the softmax probabilities,
//!   saved for backward (masked entries are exactly 0).
//! - `attention_bwd`: dqkv (B, T, W) `=` (every element written), from dout (B, T, C), qkv and
//!   att. `datt` (B, NH, T, T) is scratch: on return it holds the gradient with respect to the
//!   unscaled scores q·k (0 where masked). The dk and dv of a kv head sum over its NH/KVH query
//!   heads in head order, and within a head over the queries in order.
//!
//! BF16: nothing is rounded here; the inputs are f32 (qkv is the BF16-rounded output of its GEMM,
//! possibly rotated by RoPE in f32). The CPU backend rounds `out` and `dqkv` to BF16 after these
//! functions, as the CUDA backend's attention writes them; the CUDA backend's batched products
//! also take BF16 operands, the CPU's f32 ones (the difference is in the GPU tolerance table).
//!
//! Each pass is parallel over rows it owns and every output element is summed by one task in
//! index order: forward over (b, h, query) rows of `att`, then (b, t) rows of `out`; backward
//! over (b, h, query) rows of `datt`, then (b, t) rows of `dqkv`, where the k and v parts of a
//! row gather the column of `datt`/`att` belonging to that key. Bit-identical for any thread
//! count; with KVH = NH the operations and their order are exactly those of multi-head attention.

use rayon::prelude::*;

use super::{check_len, rows_per_task};

/// Checks the dimensions shared by forward and backward; returns hs.
#[track_caller]
fn head_size(layer: &str, c: usize, nh: usize, kvh: usize) -> usize {
    assert!(nh > 0 && c.is_multiple_of(nh), "{layer}: C = {c} is not a positive multiple of NH = {nh}");
    assert!(kvh > 0 && nh.is_multiple_of(kvh), "{layer}: NH = {nh} is not a positive multiple of KVH = {kvh}");
    c / nh
}

/// out (B, T, C) and att (B, NH, T, T) from qkv (B, T, C + 2·KVH·hs).
pub fn attention_fwd(out: &mut [f32], att: &mut [f32], qkv: &[f32], b: usize, t: usize, c: usize, nh: usize, kvh: usize, causal: bool) {
    const L: &str = "attention_fwd";
    let hs = head_size(L, c, nh, kvh);
    let (w, kvc, rep) = (c + 2 * kvh * hs, kvh * hs, nh / kvh);
    check_len(L, "out", out.len(), b * t * c);
    check_len(L, "att", att.len(), b * nh * t * t);
    check_len(L, "qkv", qkv.len(), b * t * w);
    if b * t == 0 {
        return;
    }
    let scale = 1.0 / (hs as f32).sqrt();

    // Pass 1, per (b, h, tq) row of att: softmax over the visible keys of scale·q·k.
    att.par_chunks_mut(t).enumerate().with_min_len(rows_per_task(t * hs)).for_each(|(row, p)| {
        let (bh, tq) = (row / t, row % t);
        let (bb, h) = (bh / nh, bh % nh);
        let base = bb * t * w;
        let q = &qkv[base + tq * w + h * hs..][..hs];
        let koff = c + (h / rep) * hs;
        let tend = if causal { tq + 1 } else { t };
        let mut max = f32::NEG_INFINITY;
        for (t2, p) in p[..tend].iter_mut().enumerate() {
            let k = &qkv[base + t2 * w + koff..][..hs];
            let s = q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale;
            max = max.max(s);
            *p = s;
        }
        let mut sum = 0.0f32;
        for p in &mut p[..tend] {
            *p = (*p - max).exp();
            sum += *p;
        }
        let inv = 1.0 / sum;
        for p in &mut p[..tend] {
            *p *= inv;
        }
        p[tend..].fill(0.0);
    });

    // Pass 2, per (b, tq) row of out: each head's slice = Σ over visible keys of att · v.
    let att = &*att;
    out.par_chunks_mut(c).enumerate().with_min_len(rows_per_task(t * c)).for_each(|(row, o)| {
        let (bb, tq) = (row / t, row % t);
        let tend = if causal { tq + 1 } else { t };
        o.fill(0.0);
        for h in 0..nh {
            let p = &att[((bb * nh + h) * t + tq) * t..][..tend];
            let o = &mut o[h * hs..(h + 1) * hs];
            let voff = c + kvc + (h / rep) * hs;
            for (t2, &a) in p.iter().enumerate() {
                let v = &qkv[(bb * t + t2) * w + voff..][..hs];
                for (o, &v) in o.iter_mut().zip(v) {
                    *o += a * v;
                }
            }
        }
    });
}

/// dqkv (B, T, C + 2·KVH·hs) `=` from dout (B, T, C); datt (B, NH, T, T) is scratch.
pub fn attention_bwd(
    dqkv: &mut [f32],
    datt: &mut [f32],
    dout: &[f32],
    qkv: &[f32],
    att: &[f32],
    b: usize,
    t: usize,
    c: usize,
    nh: usize,
    kvh: usize,
    causal: bool,
) {
    const L: &str = "attention_bwd";
    let hs = head_size(L, c, nh, kvh);
    let (w, kvc, rep) = (c + 2 * kvh * hs, kvh * hs, nh / kvh);
    check_len(L, "dqkv", dqkv.len(), b * t * w);
    check_len(L, "datt", datt.len(), b * nh * t * t);
    check_len(L, "dout", dout.len(), b * t * c);
    check_len(L, "qkv", qkv.len(), b * t * w);
    check_len(L, "att", att.len(), b * nh * t * t);
    if b * t == 0 {
        return;
    }
    let scale = 1.0 / (hs as f32).sqrt();

    // Pass 1, per (b, h, tq) row: d(att) = dout·v, then through the softmax and the scale:
    // d(q·k)[t2] = scale · att[t2] · (d(att)[t2] − Σ att·d(att)).
    datt.par_chunks_mut(t).enumerate().with_min_len(rows_per_task(t * hs)).for_each(|(row, ds)| {
        let (bh, tq) = (row / t, row % t);
        let (bb, h) = (bh / nh, bh % nh);
        let tend = if causal { tq + 1 } else { t };
        let p = &att[row * t..][..tend];
        let dy = &dout[(bb * t + tq) * c + h * hs..][..hs];
        let voff = c + kvc + (h / rep) * hs;
        let mut dot = 0.0f32;
        for (t2, (d, &a)) in ds[..tend].iter_mut().zip(p).enumerate() {
            let v = &qkv[(bb * t + t2) * w + voff..][..hs];
            *d = dy.iter().zip(v).map(|(a, b)| a * b).sum::<f32>();
            dot += a * *d;
        }
        for (d, &a) in ds[..tend].iter_mut().zip(p) {
            *d = scale * a * (*d - dot);
        }
        ds[tend..].fill(0.0);
    });

    // Pass 2, per (b, tr) row of dqkv, per query head h (kv head g = h / rep):
    //   dq[tr, h] = Σ_{keys t2 visible to tr}  ds[h, tr, t2] · k[t2, g]
    //   dk[tr, g] = Σ_{h of group g} Σ_{queries tq that see tr}  ds[h, tq, tr] · q[tq, h]
    //   dv[tr, g] = Σ_{h of group g} Σ_{queries tq that see tr} att[h, tq, tr] · dout[tq, h]
    // in that order (h ascending, then tq ascending).
    let ds = &*datt;
    dqkv.par_chunks_mut(w).enumerate().with_min_len(rows_per_task(3 * t * c)).for_each(|(row, dr)| {
        let (bb, tr) = (row / t, row % t);
        let keys = if causal { 0..tr + 1 } else { 0..t };
        let queries = if causal { tr..t } else { 0..t };
        dr.fill(0.0);
        let (dq, dkv) = dr.split_at_mut(c);
        let (dk, dv) = dkv.split_at_mut(kvc);
        for h in 0..nh {
            let hoff = h * hs;
            let goff = (h / rep) * hs;
            let bh = bb * nh + h;
            let dq = &mut dq[hoff..hoff + hs];
            let drow = &ds[(bh * t + tr) * t..][..t];
            for t2 in keys.clone() {
                let g = drow[t2];
                let k = &qkv[(bb * t + t2) * w + c + goff..][..hs];
                for (d, &k) in dq.iter_mut().zip(k) {
                    *d += g * k;
                }
            }
            let dk = &mut dk[goff..goff + hs];
            let dv = &mut dv[goff..goff + hs];
            for tq in queries.clone() {
                let g = ds[(bh * t + tq) * t + tr];
                let a = att[(bh * t + tq) * t + tr];
                let q = &qkv[(bb * t + tq) * w + hoff..][..hs];
                let dy = &dout[(bb * t + tq) * c + hoff..][..hs];
                for (((dk, dv), &q), &dy) in dk.iter_mut().zip(dv.iter_mut()).zip(q).zip(dy) {
                    *dk += g * q;
                    *dv += a * dy;
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::testutil::*;

    const B: usize = 2;
    const T: usize = 5;
    const C: usize = 8;
    const NH: usize = 2;

    fn forward(qkv: &[f32], b: usize, t: usize, c: usize, nh: usize, causal: bool) -> (Vec<f32>, Vec<f32>) {
        let mut out = vec![f32::NAN; b * t * c];
        let mut att = vec![f32::NAN; b * nh * t * t];
        attention_fwd(&mut out, &mut att, qkv, b, t, c, nh, nh, causal);
        (out, att)
    }

    #[test]
    fn forward_matches_f64_reference() {
        for causal in [true, false] {
            let qkv = rand_vec(&mut rng(20), B * T * 3 * C, -1.5, 1.5);
            let (out, att) = forward(&qkv, B, T, C, NH, causal);
            let want = attention_fwd_ref(&to_f64(&qkv), B, T, C, NH, causal);
            // Dot products of hs = 4 terms, a softmax over ≤ 5 keys, a weighted sum of ≤ 5
            // values, all O(1) in f32: a few ulps.
            check_close(&format!("attention_fwd out causal={causal}"), &out, &want, 1e-5);
            for (row, p) in att.chunks(T).enumerate() {
                let tq = row % T;
                let sum: f64 = p.iter().map(|&x| f64::from(x)).sum();
                assert!((sum - 1.0).abs() < 1e-6, "att row {row} sums to {sum}");
                if causal {
                    assert!(p[tq + 1..].iter().all(|&x| x == 0.0), "att row {row} attends to the future: {p:?}");
                } else {
                    assert!(p.iter().all(|&x| x > 0.0), "full att row {row} has a zero: {p:?}");
                }
            }
        }
    }

    #[test]
    fn causal_mask_blocks_the_future() {
        let qkv = rand_vec(&mut rng(21), B * T * 3 * C, -1.5, 1.5);
        let t0 = 3;
        // Change every q, k and v channel of token t0 in batch 0.
        let mut moved = qkv.clone();
        for x in &mut moved[t0 * 3 * C..(t0 + 1) * 3 * C] {
            *x += 0.75;
        }
        for causal in [true, false] {
            let (out, att) = forward(&qkv, B, T, C, NH, causal);
            let (out2, att2) = forward(&moved, B, T, C, NH, causal);
            let early_same = out[..t0 * C] == out2[..t0 * C];
            let late_same = out[t0 * C..T * C] == out2[t0 * C..T * C];
            assert!(!late_same, "causal={causal}: moving token {t0} did not change its own output");
            assert_eq!(out[T * C..], out2[T * C..], "causal={causal}: batch 1 changed");
            if causal {
                assert!(early_same, "causal: outputs before token {t0} changed");
                for h in 0..NH {
                    let rows = h * T * T..(h * T + t0) * T;
                    assert_eq!(att[rows.clone()], att2[rows], "causal: att rows before {t0} changed (head {h})");
                }
            } else {
                assert!(!early_same, "full attention: earlier outputs should see token {t0}");
            }
        }
    }

    #[test]
    fn backward_matches_finite_differences() {
        for (seed, causal) in [(22, true), (23, false)] {
            let mut r = rng(seed);
            let qkv = rand_vec(&mut r, B * T * 3 * C, -1.5, 1.5);
            let dout = rand_vec(&mut r, B * T * C, -1.0, 1.0);
            let (_, att) = forward(&qkv, B, T, C, NH, causal);
            let dy64 = to_f64(&dout);
            let want = fd_grad(&to_f64(&qkv), |x| dot_ref(&dy64, &attention_fwd_ref(x, B, T, C, NH, causal)));
            // `=`: garbage in the outputs must be overwritten.
            let mut dqkv = vec![f32::NAN; qkv.len()];
            let mut datt = vec![f32::NAN; att.len()];
            attention_bwd(&mut dqkv, &mut datt, &dout, &qkv, &att, B, T, C, NH, NH, causal);
            // Each gradient is a sum of ≤ T·hs = 20 O(1) products through a softmax whose
            // backward subtracts a weighted mean (cancellation): ~1e-6 relative to the terms,
            // ≲ 1e-5 after the 1 % floor. 1e-4 leaves a margin; a wrong term is O(1).
            check_close(&format!("attention_bwd dqkv causal={causal}"), &dqkv, &want, 1e-4);
        }
    }

    #[test]
    fn is_deterministic_across_thread_counts() {
        let (b, t, c, nh) = (4, 64, 64, 4);
        let mut r = rng(24);
        let qkv = rand_vec(&mut r, b * t * 3 * c, -1.5, 1.5);
        let dout = rand_vec(&mut r, b * t * c, -1.0, 1.0);
        let run = || {
            let (out, att) = forward(&qkv, b, t, c, nh, true);
            let mut dqkv = vec![0.0; qkv.len()];
            let mut datt = vec![0.0; att.len()];
            attention_bwd(&mut dqkv, &mut datt, &dout, &qkv, &att, b, t, c, nh, nh, true);
            [out, att, dqkv]
        };
        let a = run();
        for (label, other) in [("run twice", run()), ("1 thread", in_pool(1, run)), ("3 threads", in_pool(3, run))] {
            for (name, (x, y)) in ["out", "att", "dqkv"].iter().zip(a.iter().zip(&other)) {
                assert_bits_eq(&format!("attention {name} {label}"), x, y);
            }
        }
    }

    // ---- grouped-query heads (KVH < NH) -------------------------------------------------

    const NH4: usize = 4;

    fn forward_gqa(qkv: &[f32], b: usize, t: usize, c: usize, nh: usize, kvh: usize, causal: bool) -> (Vec<f32>, Vec<f32>) {
        let mut out = vec![f32::NAN; b * t * c];
        let mut att = vec![f32::NAN; b * nh * t * t];
        attention_fwd(&mut out, &mut att, qkv, b, t, c, nh, kvh, causal);
        (out, att)
    }

    /// The multi-head qkv (B, T, 3C) with each kv head of `qkv` repeated for its query heads.
    fn repeat_kv(qkv: &[f32], b: usize, t: usize, c: usize, nh: usize, kvh: usize) -> Vec<f32> {
        let hs = c / nh;
        let w = c + 2 * kvh * hs;
        let mut out = Vec::with_capacity(b * t * 3 * c);
        for row in qkv.chunks(w).take(b * t) {
            out.extend_from_slice(&row[..c]);
            for part in 0..2 {
                for h in 0..nh {
                    let g = h / (nh / kvh);
                    out.extend_from_slice(&row[c + part * kvh * hs + g * hs..][..hs]);
                }
            }
        }
        out
    }

    #[test]
    fn gqa_forward_matches_repeated_kv_f64_reference() {
        for kvh in [1, 2] {
            for causal in [true, false] {
                let w = C + 2 * kvh * C / NH4;
                let qkv = rand_vec(&mut rng(25 + kvh as u64), B * T * w, -1.5, 1.5);
                let (out, _) = forward_gqa(&qkv, B, T, C, NH4, kvh, causal);
                let want = attention_gqa_fwd_ref(&to_f64(&qkv), B, T, C, NH4, kvh, causal);
                // As multi-head attention (hs = 2, ≤ 5 keys): each output, a weighted mean of
                // values |v| ≤ 1.5, is off by a few ulps of 1.5 (≲ 1e-7), which the 1 % floor of
                // max|out| (≈ 0.8) turns into ≲ 1.2e-5 where heads average to near zero.
                check_close(&format!("attention_fwd gqa kvh={kvh} causal={causal}"), &out, &want, 2e-5);
            }
        }
    }

    #[test]
    fn gqa_forward_is_multi_head_attention_on_repeated_kv_bit_for_bit() {
        // Query head h reads kv head h / (NH/KVH) and nothing else changes: the f32 operations
        // are those of multi-head attention over the repeated k and v, in the same order.
        let (b, t, c, nh, kvh) = (2, 16, 32, 8, 2);
        let qkv = rand_vec(&mut rng(27), b * t * (c + 2 * kvh * c / nh), -1.5, 1.5);
        let (out, att) = forward_gqa(&qkv, b, t, c, nh, kvh, true);
        let (out_mha, att_mha) = forward_gqa(&repeat_kv(&qkv, b, t, c, nh, kvh), b, t, c, nh, nh, true);
        assert_bits_eq("gqa vs repeated-kv mha out", &out, &out_mha);
        assert_bits_eq("gqa vs repeated-kv mha att", &att, &att_mha);
    }

    #[test]
    fn gqa_backward_matches_finite_differences_of_the_repeated_kv_reference() {
        for (seed, kvh, causal) in [(28, 2, true), (29, 1, false), (30, 1, true)] {
            let mut r = rng(seed);
            let w = C + 2 * kvh * C / NH4;
            let qkv = rand_vec(&mut r, B * T * w, -1.5, 1.5);
            let dout = rand_vec(&mut r, B * T * C, -1.0, 1.0);
            let (_, att) = forward_gqa(&qkv, B, T, C, NH4, kvh, causal);
            let dy64 = to_f64(&dout);
            let want = fd_grad(&to_f64(&qkv), |x| dot_ref(&dy64, &attention_gqa_fwd_ref(x, B, T, C, NH4, kvh, causal)));
            let mut dqkv = vec![f32::NAN; qkv.len()];
            let mut datt = vec![f32::NAN; att.len()];
            attention_bwd(&mut dqkv, &mut datt, &dout, &qkv, &att, B, T, C, NH4, kvh, causal);
            // As for multi-head attention, with dk and dv now sums over NH/KVH ≤ 4 heads: a
            // few more O(1) terms in each, still ~1e-6 relative to them; 1e-4 keeps a margin.
            check_close(&format!("attention_bwd gqa kvh={kvh} causal={causal}"), &dqkv, &want, 1e-4);
        }
    }

    #[test]
    fn gqa_is_deterministic_across_thread_counts() {
        let (b, t, c, nh, kvh) = (2, 64, 64, 8, 2);
        let mut r = rng(31);
        let qkv = rand_vec(&mut r, b * t * (c + 2 * kvh * c / nh), -1.5, 1.5);
        let dout = rand_vec(&mut r, b * t * c, -1.0, 1.0);
        let run = || {
            let (out, att) = forward_gqa(&qkv, b, t, c, nh, kvh, true);
            let mut dqkv = vec![0.0; qkv.len()];
            let mut datt = vec![0.0; att.len()];
            attention_bwd(&mut dqkv, &mut datt, &dout, &qkv, &att, b, t, c, nh, kvh, true);
            [out, att, dqkv]
        };
        let a = run();
        for (label, other) in [("run twice", run()), ("1 thread", in_pool(1, run)), ("3 threads", in_pool(3, run))] {
            for (name, (x, y)) in ["out", "att", "dqkv"].iter().zip(a.iter().zip(&other)) {
                assert_bits_eq(&format!("attention gqa {name} {label}"), x, y);
            }
        }
    }
}
