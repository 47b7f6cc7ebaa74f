//! Residual connections and other element-wise sums.
//!
//! - `residual_fwd`: out `=` a + b (the residual stream after a sub-block). Nothing is saved.
//!   Its backward is the identity into both inputs: the caller passes the same gradient on,
//!   accumulating where a buffer already holds one (`add_inplace`).
//! - `add_inplace`: acc `+=` x (accumulating a gradient that arrives by two paths).
//!
//! Element-wise, parallel over fixed-size chunks.

use rayon::prelude::*;

use super::check_len;

/// Elements per rayon task (one add each: large chunks, or the scheduling dominates).
const CHUNK: usize = 16384;

/// out = a + b.
pub fn residual_fwd(out: &mut [f32], a: &[f32], b: &[f32]) {
    check_len("residual_fwd", "a", a.len(), out.len());
    check_len("residual_fwd", "b", b.len(), out.len());
    out.par_chunks_mut(CHUNK).zip(a.par_chunks(CHUNK).zip(b.par_chunks(CHUNK))).for_each(|(o, (a, b))| {
        for ((o, &a), &b) in o.iter_mut().zip(a).zip(b) {
            *o = a + b;
        }
    });
}

/// acc += x.
pub fn add_inplace(acc: &mut [f32], x: &[f32]) {
    check_len("add_inplace", "x", x.len(), acc.len());
    acc.par_chunks_mut(CHUNK).zip(x.par_chunks(CHUNK)).for_each(|(acc, x)| {
        for (acc, &x) in acc.iter_mut().zip(x) {
            *acc += x;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::testutil::*;

    #[test]
    fn sums_are_exact_elementwise() {
        let n = 2 * CHUNK + 3;
        let mut r = rng(60);
        let a = rand_vec(&mut r, n, -1.0, 1.0);
        let b = rand_vec(&mut r, n, -1.0, 1.0);
        let mut out = vec![f32::NAN; n];
        residual_fwd(&mut out, &a, &b);
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_bits_eq("residual_fwd", &out, &want);
        let mut acc = a.clone();
        add_inplace(&mut acc, &b);
        assert_bits_eq("add_inplace", &acc, &want);
    }
}
