//! Comparisons that respect training dynamics. Where the loss falls steeply, a vertical gap between
//! two curves at one step is mostly a shift in time: a run that starts its descent three steps
//! later sits several percent above the other for the rest of the descent, while it needs only
//! three more steps to reach any loss. The **horizontal gap** says that directly: how many more
//! steps the run needs to reach the loss the baseline ends with (negative: how many fewer).
//!
//! Both curves are smoothed with the drift detector's EMA and made monotone by a running minimum
//! (the best loss reached so far), so that batch noise does not move the answer; the step where a
//! curve first reaches a loss is interpolated linearly between recorded steps.
//!
//! On a plateau the horizontal gap is ill-defined (any vertical difference is many steps): it is
//! reported, but a verdict uses it only where the replicas' horizontal spread is a small share of
//! the run ([`MAX_SHIFT_FRAC`]), i.e. where the loss still falls measurably.

use serde::Serialize;

/// The horizontal gap decides "a time shift, not drift" only while the replicas' horizontal spread
/// is at most this share of the run; past it the loss is too flat for steps to mean anything.
pub const MAX_SHIFT_FRAC: f64 = 0.1;

/// Losses averaged at the end of a run for its final loss (as `fp8-capture` writes `final_loss`).
pub const FINAL_LOSS_STEPS: usize = 20;

/// The horizontal gap of a run to its baseline at their last common step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HorizontalGap {
    /// The last common step T.
    pub at_step: i64,
    /// Steps the run needs beyond the baseline to reach the same loss: T − (the step where the
    /// baseline first reached the run's loss at T); negative when the run is ahead: −(T − the
    /// step where the run first reached the baseline's loss at T). A run that ends above all the
    /// baseline reached after its first step is T − (first step) behind.
    pub steps: Option<f64>,
    /// `steps` / T: the share of the run the time shift amounts to.
    pub frac: Option<f64>,
}

/// The EMA (weight α of the newest value, first value as it is) followed by a running minimum.
fn best_so_far(loss: &[f64], alpha: f64) -> Vec<f64> {
    let mut e: Option<f64> = None;
    let mut best = f64::INFINITY;
    loss.iter()
        .map(|&l| {
            let next = e.map_or(l, |p| alpha * l + (1.0 - alpha) * p);
            e = Some(next);
            best = best.min(next);
            best
        })
        .collect()
}

/// The (fractional) step where the non-increasing `curve` first reaches `target` or below.
fn first_reach(steps: &[i64], curve: &[f64], target: f64) -> Option<f64> {
    let i = curve.iter().position(|&c| c <= target)?;
    if i == 0 {
        return Some(steps[0] as f64);
    }
    let (c0, c1) = (curve[i - 1], curve[i]);
    let (s0, s1) = (steps[i - 1] as f64, steps[i] as f64);
    let f = if c0 > c1 { (c0 - target) / (c0 - c1) } else { 1.0 };
    Some(s0 + f.clamp(0.0, 1.0) * (s1 - s0))
}

/// The horizontal gap of `run` to `base` over steps where both losses are finite (`steps`
/// ascending, the two curves aligned), smoothed with EMA weight `alpha`. None without a common
/// finite step.
pub fn horizontal_gap(steps: &[i64], run: &[f64], base: &[f64], alpha: f64) -> Option<HorizontalGap> {
    let keep: Vec<usize> = (0..steps.len()).filter(|&i| run[i].is_finite() && base[i].is_finite()).collect();
    let st: Vec<i64> = keep.iter().map(|&i| steps[i]).collect();
    let r = best_so_far(&keep.iter().map(|&i| run[i]).collect::<Vec<_>>(), alpha);
    let b = best_so_far(&keep.iter().map(|&i| base[i]).collect::<Vec<_>>(), alpha);
    let &at_step = st.last()?;
    let (r_end, b_end) = (*r.last()?, *b.last()?);
    let t = at_step as f64;
    let steps = if r_end >= b_end { first_reach(&st, &b, r_end).map(|s| t - s) } else { first_reach(&st, &r, b_end).map(|s| -(t - s)) };
    Some(HorizontalGap { at_step, steps, frac: steps.map(|h| if t > 0.0 { h / t } else { 0.0 }) })
}

/// The mean of the last [`FINAL_LOSS_STEPS`] finite losses (None when there is none).
pub fn final_loss(loss: &[f64]) -> Option<f64> {
    let tail: Vec<f64> = loss.iter().rev().filter(|l| l.is_finite()).take(FINAL_LOSS_STEPS).copied().collect();
    (!tail.is_empty()).then(|| tail.iter().sum::<f64>() / tail.len() as f64)
}

/// (run − base) / |base|, None when either is missing or the base is 0.
pub fn relative_gap(run: Option<f64>, base: Option<f64>) -> Option<f64> {
    match (run, base) {
        (Some(r), Some(b)) if b != 0.0 && r.is_finite() && b.is_finite() => Some((r - b) / b.abs()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A descent from 10 to 2 starting at step `start`, as a steep logistic.
    fn descent(start: f64, n: i64) -> (Vec<i64>, Vec<f64>) {
        let steps: Vec<i64> = (1..=n).collect();
        let loss = steps.iter().map(|&s| 2.0 + 8.0 / (1.0 + ((s as f64 - start) / 8.0).exp())).collect();
        (steps, loss)
    }

    #[test]
    fn a_pure_time_shift_is_a_large_vertical_but_a_small_horizontal_gap() {
        let (s, base) = descent(100.0, 130);
        let (_, run) = descent(104.0, 130);
        let vertical = run.last().unwrap() / base.last().unwrap() - 1.0;
        assert!(vertical > 0.04, "the shifted run sits far above at the end of the descent: {vertical}");
        let h = horizontal_gap(&s, &run, &base, 1.0).unwrap();
        let steps = h.steps.unwrap();
        assert!((steps - 4.0).abs() < 0.3, "four steps behind: {h:?}");
        assert!((h.frac.unwrap() - steps / 130.0).abs() < 1e-12);
        // The other way round it is four steps ahead.
        let h = horizontal_gap(&s, &base, &run, 1.0).unwrap();
        assert!((h.steps.unwrap() + 4.0).abs() < 0.3, "{h:?}");
    }

    #[test]
    fn identical_curves_have_no_horizontal_gap_and_noise_does_not_move_it() {
        let (s, base) = descent(280.0, 300);
        assert_eq!(horizontal_gap(&s, &base, &base, 0.1).unwrap().steps, Some(0.0));
        // ±1% alternating noise on a descent: the smoothed running minimum stays within a few steps.
        let noisy: Vec<f64> = base.iter().enumerate().map(|(i, l)| l * if i % 2 == 0 { 1.01 } else { 0.99 }).collect();
        let h = horizontal_gap(&s, &noisy, &base, 0.1).unwrap();
        assert!(h.steps.unwrap().abs() < 3.0, "{h:?}");
    }

    #[test]
    fn a_run_that_ends_where_the_baseline_began_is_the_whole_run_behind() {
        let s: Vec<i64> = (1..=10).collect();
        let (base, run) = (vec![5.0; 10], vec![6.0; 10]);
        // The baseline was already below 6 at step 1: the run is 9 of 10 steps behind.
        let h = horizontal_gap(&s, &run, &base, 1.0).unwrap();
        assert_eq!((h.steps, h.frac), (Some(9.0), Some(0.9)));
        assert_eq!(horizontal_gap(&[], &[], &[], 1.0), None);
    }

    #[test]
    fn final_loss_is_the_mean_of_the_last_finite_losses() {
        let l: Vec<f64> = (0..30).map(|i| i as f64).chain([f64::NAN]).collect();
        assert_eq!(final_loss(&l), Some((10..30).sum::<i32>() as f64 / 20.0));
        assert_eq!(final_loss(&[f64::NAN]), None);
        assert_eq!(relative_gap(Some(1.1), Some(1.0)).map(|g| (g * 1e9).round()), Some(1e8));
    }
}
