//! The detectors' and rankings' documented defaults, shared by the commands' flags, `report` and
//! `triage` (README.md states each with its reasoning).

/// Default number of robust standard deviations above the rolling median that makes a spike.
pub const DEFAULT_SPIKE_K: f64 = 6.0;
/// Default length (in recorded steps) of the trailing window of the spike detector.
pub const DEFAULT_SPIKE_WINDOW: usize = 50;
/// Default smallest jump of the relative gap to the baseline that makes a spike against it (5%).
pub const DEFAULT_SPIKE_MIN_GAP: f64 = 0.05;
/// Default relative loss gap to the baseline that counts as drift (1%).
pub const DEFAULT_DRIFT_THRESHOLD: f64 = 0.01;
/// Default weight of the newest step in the EMA of the relative gap.
pub const DEFAULT_DRIFT_ALPHA: f64 = 0.1;
/// Default number of consecutive steps the smoothed gap must stay past the threshold.
pub const DEFAULT_DRIFT_STEPS: usize = 10;
/// Default cosine similarity under which a tensor is flagged.
pub const DEFAULT_COSINE_THRESHOLD: f64 = 0.99;
/// Default margin: a gap counts only when it exceeds this many times the noise band (the largest
/// gap between runs that should be equivalent, over the same steps).
pub const DEFAULT_NOISE_MARGIN: f64 = 2.0;
