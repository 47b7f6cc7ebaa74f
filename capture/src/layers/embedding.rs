//! Token embedding: `out[n, :] = wte[tokens[n], :]`. No positional embedding.
//!
//! - `embedding_fwd`: out (N, C) `=`, tokens (N), wte (V, C). Nothing is saved for backward
//!   beyond the tokens themselves.
//! - `embedding_bwd`: dwte (V, C) `+=` dout (N, C) scattered by token. Parallel over blocks of
//!   vocabulary rows: each task owns a contiguous range of `dwte` and adds the tokens that fall
//!   in it in token order, so every row of `dwte` is summed in the same order as a serial loop,
//!   whatever the thread count.
//!
//! Panics if a token is not below V (V = wte.len() / C); the data loader validates tokens first.

use rayon::prelude::*;

use super::{check_len, rows_of, rows_per_task};

/// Number of vocabulary blocks `embedding_bwd` splits `dwte` into.
const VOCAB_BLOCKS: usize = 64;

/// out (N, C) = wte[tokens] with tokens (N) and wte (V, C).
pub fn embedding_fwd(out: &mut [f32], tokens: &[u32], wte: &[f32], c: usize) {
    let v = rows_of("embedding_fwd", "wte", wte.len(), c);
    check_len("embedding_fwd", "out", out.len(), tokens.len() * c);
    out.par_chunks_mut(c).zip(tokens.par_iter()).enumerate().with_min_len(rows_per_task(c)).for_each(|(n, (row, &tok))| {
        let tok = tok as usize;
        assert!(tok < v, "embedding_fwd: token {tok} at position {n} is not below V = {v}");
        row.copy_from_slice(&wte[tok * c..(tok + 1) * c]);
    });
}

/// dwte (V, C) += dout (N, C) scattered by tokens (N).
pub fn embedding_bwd(dwte: &mut [f32], dout: &[f32], tokens: &[u32], c: usize) {
    let v = rows_of("embedding_bwd", "dwte", dwte.len(), c);
    check_len("embedding_bwd", "dout", dout.len(), tokens.len() * c);
    if let Some((n, &tok)) = tokens.iter().enumerate().find(|&(_, &t)| t as usize >= v) {
        panic!("embedding_bwd: token {tok} at position {n} is not below V = {v}");
    }
    if v == 0 {
        return;
    }
    let rows_per_block = v.div_ceil(VOCAB_BLOCKS);
    dwte.par_chunks_mut(rows_per_block * c).enumerate().for_each(|(blk, dw)| {
        let lo = blk * rows_per_block;
        let hi = lo + dw.len() / c;
        for (n, &tok) in tokens.iter().enumerate() {
            let tok = tok as usize;
            if (lo..hi).contains(&tok) {
                let row = &mut dw[(tok - lo) * c..(tok - lo + 1) * c];
                for (d, &g) in row.iter_mut().zip(&dout[n * c..(n + 1) * c]) {
                    *d += g;
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::testutil::*;

    const C: usize = 8;
    const V: usize = 11;
    const N: usize = 10;

    #[test]
    fn forward_gathers_rows() {
        let mut r = rng(1);
        let wte = rand_vec(&mut r, V * C, -1.0, 1.0);
        let tokens = rand_tokens(&mut r, N, V);
        let mut out = vec![f32::NAN; N * C];
        embedding_fwd(&mut out, &tokens, &wte, C);
        for (n, &tok) in tokens.iter().enumerate() {
            assert_bits_eq("embedding_fwd row", &out[n * C..(n + 1) * C], &wte[tok as usize * C..(tok as usize + 1) * C]);
        }
    }

    #[test]
    fn backward_matches_finite_differences() {
        let mut r = rng(2);
        let wte = rand_vec(&mut r, V * C, -1.0, 1.0);
        // Repeated tokens exercise the accumulation.
        let mut tokens = rand_tokens(&mut r, N, V);
        tokens[3] = tokens[7];
        let dout = rand_vec(&mut r, N * C, -1.0, 1.0);
        let dout64 = to_f64(&dout);
        let want = fd_grad(&to_f64(&wte), |w| {
            let out: Vec<f64> = tokens.iter().flat_map(|&t| w[t as usize * C..(t as usize + 1) * C].to_vec()).collect();
            dot_ref(&dout64, &out)
        });
        // `+=`: start from random values and compare the increment.
        let init = rand_vec(&mut r, V * C, -1.0, 1.0);
        let mut dwte = init.clone();
        embedding_bwd(&mut dwte, &dout, &tokens, C);
        let want: Vec<f64> = want.iter().zip(&init).map(|(g, &i)| g + f64::from(i)).collect();
        // At most N additions of O(1) values in f32 onto the initial value: a few ulps.
        check_close("embedding_bwd dwte", &dwte, &want, 1e-5);
    }

    #[test]
    #[should_panic(expected = "not below V")]
    fn forward_rejects_out_of_vocabulary_token() {
        let wte = vec![0.0; V * C];
        let mut out = vec![0.0; 2 * C];
        embedding_fwd(&mut out, &[0, V as u32], &wte, C);
    }

    #[test]
    fn backward_is_deterministic_across_thread_counts() {
        let (v, c, n) = (512, 64, 2048);
        let mut r = rng(3);
        let tokens = rand_tokens(&mut r, n, v);
        let dout = rand_vec(&mut r, n * c, -1.0, 1.0);
        let init = rand_vec(&mut r, v * c, -1.0, 1.0);
        let run = || {
            let mut dwte = init.clone();
            embedding_bwd(&mut dwte, &dout, &tokens, c);
            dwte
        };
        let a = run();
        assert_bits_eq("embedding_bwd run twice", &a, &run());
        assert_bits_eq("embedding_bwd 1 thread", &a, &in_pool(1, run));
        assert_bits_eq("embedding_bwd 3 threads", &a, &in_pool(3, run));
        // And identical to the plain serial loop.
        let mut serial = init.clone();
        for (i, &tok) in tokens.iter().enumerate() {
            for j in 0..c {
                serial[tok as usize * c + j] += dout[i * c + j];
            }
        }
        assert_bits_eq("embedding_bwd vs serial", &a, &serial);
    }
}
