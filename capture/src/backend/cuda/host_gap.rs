//! The host's time between steps, measured without the profiler: from a step's last
//! synchronisation (`take_reports`, after the optimizer) to the next step's first launch
//! (`begin_step_work`). The device has nothing queued in between, so this is time it idles while
//! the host builds the step's reports, observes the scales and plans the next step. Printed with
//! `FP8SCOPE_VERBOSE=1` when the backend is dropped. (`FP8SCOPE_PROFILE=1` measures the GPU's idle
//! time between steps from its events, but its own event collection runs in that gap.)

use std::time::Instant;

/// Gaps left out at the start of a run: the first steps' one-off work (GEMM tuning, buffers
/// grown, graphs captured) falls inside the steps, but their reports may take longer to build.
const WARMUP_GAPS: usize = 2;

#[derive(Default)]
pub(super) struct HostGap {
    since: Option<Instant>,
    ms: Vec<f64>,
    /// Say the summary on stderr when dropped (`FP8SCOPE_VERBOSE`).
    verbose: bool,
}

impl HostGap {
    pub fn new(verbose: bool) -> HostGap {
        HostGap { since: None, ms: Vec::new(), verbose }
    }

    /// The step's last synchronisation has returned.
    pub fn synced(&mut self) {
        self.since = Some(Instant::now());
    }

    /// The next step's first launch is about to be issued.
    pub fn launching(&mut self) {
        if let Some(t) = self.since.take() {
            self.ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
}

/// The median, lowest and highest gap in ms, and how many, after the first [`WARMUP_GAPS`]
/// (None when no gap is left).
fn summarize(ms: &[f64]) -> Option<(f64, f64, f64, usize)> {
    let mut v: Vec<f64> = ms.iter().skip(WARMUP_GAPS).copied().collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
    Some((median, v[0], v[n - 1], n))
}

impl Drop for HostGap {
    fn drop(&mut self) {
        if !self.verbose {
            return;
        }
        if let Some((median, lo, hi, n)) = summarize(&self.ms) {
            eprintln!(
                "host between steps (the step's last synchronisation to the next step's first launch; the GPU idle): median {median:.3} ms, {lo:.3} to {hi:.3} over {n} steps"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{HostGap, summarize};

    #[test]
    fn the_summary_leaves_out_the_first_gaps_and_takes_the_median() {
        assert_eq!(summarize(&[]), None);
        assert_eq!(summarize(&[50.0, 40.0]), None);
        assert_eq!(summarize(&[50.0, 40.0, 3.0, 1.0, 2.0]), Some((2.0, 1.0, 3.0, 3)));
        assert_eq!(summarize(&[50.0, 40.0, 4.0, 1.0, 2.0, 3.0]), Some((2.5, 1.0, 4.0, 4)));
    }

    #[test]
    fn a_gap_runs_from_a_synchronisation_to_the_next_launch_only() {
        let mut g = HostGap::default();
        g.launching(); // the first step: no synchronisation before it
        assert!(g.ms.is_empty());
        g.synced();
        std::thread::sleep(std::time::Duration::from_millis(5));
        g.launching();
        g.launching(); // a second launch without a synchronisation between adds nothing
        assert_eq!(g.ms.len(), 1);
        assert!(g.ms[0] >= 5.0 && g.ms[0] < 1000.0, "{}", g.ms[0]);
    }
}
