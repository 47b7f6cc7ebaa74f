//! Softmax cross-entropy over the vocabulary, forward and backward fused (as in llm.c).
//!
//! - `crossentropy_fwd_bwd`: losses (N) `=` the per-token loss −log softmax(logits)[target];
//!   dlogits (N, V) `=` (softmax(logits) − onehot(target)) · dloss, where `dloss` is the
//!   gradient of the final scalar with respect to each token's loss (1/N for the mean over N
//!   tokens). Nothing is saved: the logits are consumed here. A target of [`IGNORE_TARGET`]
//!   marks an unsupervised position (padding, a prompt token): its loss and its dlogits row are 0,
//!   and the caller averages over the supervised positions only.
//! - `mean_loss`: the mean of `losses`, summed in f64 in index order.
//!
//! Numerically stable: the row maximum is subtracted before `exp`, and the sum of the
//! exponentials is accumulated in f64, so the loss is exact to f32 rounding for any V.
//! Non-finite logits give a non-finite loss (NaN), which the training loop reports.
//! Parallel over rows; each row is reduced serially.
//!
//! Panics if a target is neither below V nor [`IGNORE_TARGET`]; the data loader validates targets first.

use rayon::prelude::*;

use super::{check_len, rows_of, rows_per_task};

/// The target of a position that is not supervised (PyTorch's `ignore_index`): no loss, no gradient.
pub const IGNORE_TARGET: u32 = u32::MAX;

/// losses (N) = −log softmax(logits (N, V))[targets]; dlogits (N, V) = (softmax − onehot)·dloss;
/// both 0 on rows whose target is [`IGNORE_TARGET`].
pub fn crossentropy_fwd_bwd(losses: &mut [f32], dlogits: &mut [f32], logits: &[f32], targets: &[u32], v: usize, dloss: f32) {
    const L: &str = "crossentropy_fwd_bwd";
    let n = rows_of(L, "logits", logits.len(), v);
    check_len(L, "losses", losses.len(), n);
    check_len(L, "dlogits", dlogits.len(), n * v);
    check_len(L, "targets", targets.len(), n);
    losses.par_iter_mut().zip(dlogits.par_chunks_mut(v)).zip(logits.par_chunks(v).zip(targets.par_iter())).enumerate().with_min_len(rows_per_task(v)).for_each(
        |(i, ((loss, dl), (row, &tgt)))| {
            if tgt == IGNORE_TARGET {
                *loss = 0.0;
                dl.fill(0.0);
                return;
            }
            let tgt = tgt as usize;
            assert!(tgt < v, "{L}: target {tgt} at position {i} is not below V = {v}");
            // NaN never compares greater, so a NaN logit leaves `max` finite and then turns
            // its exp, the sum and the loss into NaN — as it should.
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
            let mut sum = 0.0f64;
            for (d, &x) in dl.iter_mut().zip(row) {
                let e = (x - max).exp();
                *d = e;
                sum += f64::from(e);
            }
            *loss = (sum.ln() - f64::from(row[tgt] - max)) as f32;
            let inv = (1.0 / sum) as f32;
            for (j, d) in dl.iter_mut().enumerate() {
                let p = *d * inv;
                let indicator = if j == tgt { 1.0 } else { 0.0 };
                *d = (p - indicator) * dloss;
            }
        },
    );
}

/// Mean of the per-token losses, summed in f64 in index order (NaN for an empty slice).
pub fn mean_loss(losses: &[f32]) -> f64 {
    losses.iter().map(|&l| f64::from(l)).sum::<f64>() / losses.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::testutil::*;

    const N: usize = 10;
    const V: usize = 11;

    #[test]
    fn forward_and_gradient_match_f64_reference() {
        let mut r = rng(50);
        let mut logits = rand_vec(&mut r, N * V, -4.0, 4.0);
        // A row with a large offset: the max subtraction must keep exp finite.
        for x in &mut logits[..V] {
            *x += 200.0;
        }
        let targets = rand_tokens(&mut r, N, V);
        let dloss = 1.0 / N as f32;
        let mut losses = vec![f32::NAN; N];
        let mut dlogits = vec![f32::NAN; N * V];
        crossentropy_fwd_bwd(&mut losses, &mut dlogits, &logits, &targets, V, dloss);

        let x64 = to_f64(&logits);
        // Loss: exp of f32 differences, an f64 sum, one f32 rounding: a few ulps of an O(1)
        // value. In the shifted row x − max is still exact (Sterbenz: both within a factor 2).
        check_close("crossentropy losses", &losses, &crossentropy_ref(&x64, &targets, V), 1e-5);
        let want_mean = crossentropy_ref(&x64, &targets, V).iter().sum::<f64>() / N as f64;
        let got_mean = mean_loss(&losses);
        assert!((got_mean - want_mean).abs() < 1e-6 * want_mean, "mean loss {got_mean} vs {want_mean}");

        let fd = fd_grad(&x64, |x| crossentropy_ref(x, &targets, V).iter().sum::<f64>() * f64::from(dloss));
        // softmax − onehot, each element a product of a few O(1) f32 values: ~1e-7 relative;
        // the floor covers the tiny probabilities. 1e-4 leaves a margin.
        check_close("crossentropy dlogits vs FD", &dlogits, &fd, 1e-4);
        // Each row of the gradient sums to zero (softmax sums to one).
        for (i, row) in dlogits.chunks(V).enumerate() {
            let s: f64 = row.iter().map(|&x| f64::from(x)).sum();
            assert!(s.abs() < 1e-7, "dlogits row {i} sums to {s}");
        }
    }

    #[test]
    fn nan_logit_gives_nan_loss() {
        let mut logits = vec![0.0f32; 2 * V];
        logits[V + 3] = f32::NAN;
        let (mut losses, mut dl) = (vec![0.0; 2], vec![0.0; 2 * V]);
        crossentropy_fwd_bwd(&mut losses, &mut dl, &logits, &[1, 1], V, 0.5);
        assert!((losses[0] - (V as f32).ln()).abs() < 1e-6, "uniform row loss {}", losses[0]);
        assert!(losses[1].is_nan(), "NaN logit gave loss {}", losses[1]);
        assert!(mean_loss(&losses).is_nan());
    }

    #[test]
    fn ignored_targets_give_zero_loss_and_zero_gradient_and_leave_other_rows_alone() {
        let mut r = rng(51);
        let logits = rand_vec(&mut r, N * V, -4.0, 4.0);
        let targets = rand_tokens(&mut r, N, V);
        let mut masked = targets.clone();
        for i in (0..N).step_by(3) {
            masked[i] = IGNORE_TARGET;
        }
        let (mut l0, mut d0) = (vec![f32::NAN; N], vec![f32::NAN; N * V]);
        let (mut l1, mut d1) = (vec![f32::NAN; N], vec![f32::NAN; N * V]);
        crossentropy_fwd_bwd(&mut l0, &mut d0, &logits, &targets, V, 0.25);
        crossentropy_fwd_bwd(&mut l1, &mut d1, &logits, &masked, V, 0.25);
        for i in 0..N {
            let (row0, row1) = (&d0[i * V..][..V], &d1[i * V..][..V]);
            if masked[i] == IGNORE_TARGET {
                assert_eq!(l1[i], 0.0);
                assert!(row1.iter().all(|&x| x == 0.0), "row {i} of an ignored target has a gradient");
            } else {
                assert_eq!((l1[i], row1), (l0[i], row0), "row {i} is unchanged");
            }
        }
    }

    #[test]
    #[should_panic(expected = "not below V")]
    fn rejects_out_of_vocabulary_target() {
        let (mut losses, mut dl) = (vec![0.0; 1], vec![0.0; V]);
        crossentropy_fwd_bwd(&mut losses, &mut dl, &[0.0; V], &[V as u32], V, 1.0);
    }
}
