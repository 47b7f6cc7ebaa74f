//! The anomaly replay's trigger. Statistics every step are cheap because the costly ones (the
//! per-channel statistics, the quantization error) come only every N steps; but the step where a
//! run goes wrong must have them all. So each statistics step's loss and reports are checked, before
//! the optimizer runs, by the flight recorder's triggers (a non-finite value, a saturation burst of
//! at least 1%, a loss spike: [`crate::flight::anomaly`]); a step that fires is launched again with
//! every statistic (`train.rs`), on the same weights and batch, so training is unchanged.
//!
//! After a replay the trigger rests for [`QUIET_STEPS`] steps, so that a run whose operands stay
//! saturated does not pay a second launch every step; a non-finite loss fires even then.

use crate::backend::GemmReport;
use crate::flight::{LossWatch, anomaly};

/// Steps after a replay during which only a non-finite loss fires again.
pub const QUIET_STEPS: u32 = 10;

/// The losses seen and when the trigger may fire again.
#[derive(Default)]
pub struct ReplayWatch {
    losses: LossWatch,
    quiet_until: u32,
}

impl ReplayWatch {
    /// Why `step` is replayed (None: it is not). Call once per step with its loss and reports, and
    /// whether a replay would add statistics (a step planned with the full set already is never
    /// replayed, and does not start a rest).
    pub fn fires(&mut self, step: u32, loss: f64, reports: &[GemmReport], would_add: bool) -> Option<String> {
        let why = anomaly(&mut self.losses, loss, reports).filter(|_| would_add)?;
        if step < self.quiet_until && loss.is_finite() {
            return None;
        }
        self.quiet_until = step + 1 + QUIET_STEPS;
        Some(why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spike_fires_once_then_the_trigger_rests_except_for_a_non_finite_loss() {
        let mut w = ReplayWatch::default();
        let calm = |s: u32| 2.0 + 0.01 * ((s % 3) as f64);
        for s in 1..=20 {
            assert_eq!(w.fires(s, calm(s), &[], true), None, "step {s}");
        }
        assert!(w.fires(21, 5.0, &[], true).is_some_and(|why| why.contains("loss spike")));
        // Within the rest: a second spike is not replayed, a NaN is.
        assert_eq!(w.fires(25, 6.0, &[], true), None);
        assert!(w.fires(26, f64::NAN, &[], true).is_some_and(|why| why.contains("non-finite")));
        // After it: a spike fires again.
        for s in 27..=40 {
            w.fires(s, calm(s), &[], true);
        }
        assert!(w.fires(41, 7.0, &[], true).is_some());
        // A step with the full set already is not replayed and starts no rest.
        for s in 42..=60 {
            w.fires(s, calm(s), &[], true);
        }
        assert_eq!(w.fires(61, 8.0, &[], false), None);
        assert!(w.fires(62, 9.0, &[], true).is_some());
    }
}
