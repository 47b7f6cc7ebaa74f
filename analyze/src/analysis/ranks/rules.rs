//! The thresholds of `fp8-analyze ranks`, each with the reason for its value, in one place (the
//! command's section of analyze/README.md states the same rules in words).

/// Relative tolerance when the max of a set's local amaxes is compared with the amax a cast used.
/// A module that keeps no amax of its own reports `amax_used` as fp8_max / scale, computed in f32:
/// two roundings put it within a few 1e-7 of the amax the scale came from; 1e-6 leaves room for
/// that and still tells apart two ranks' amaxes, which differ in their leading digits.
pub const AMAX_REL_TOL: f64 = 1e-6;

/// Whether `used` is `max_of_set` up to [`AMAX_REL_TOL`] (both 0 counts as equal).
pub fn amax_matches(max_of_set: f64, used: f64) -> bool {
    (max_of_set - used).abs() <= AMAX_REL_TOL * max_of_set.abs().max(used.abs())
}

/// A rank's mean of a statistic over the recorded steps is out of line when it exceeds this many
/// times the median of the other ranks' means (plus the metric's margin below). Ranks of one job
/// see batches of the same distribution, so their means agree to a few percent; 4× is far outside
/// that, and the median of the others ignores the outlier itself and any few like it.
pub const OUTLIER_FACTOR: f64 = 4.0;
/// Absolute margin for `underflow_frac`: one percentage point of the values, so that a tensor
/// whose ranks underflow 0.01% against 0.001% (10× but harmless) is not reported.
pub const UNDERFLOW_MARGIN: f64 = 0.01;
/// Absolute margin for `saturated_frac`: 0.1% of the values clipped.
pub const SATURATION_MARGIN: f64 = 0.001;
/// Absolute margin for non-finite values (nan_count + inf_count, mean per recorded step): one per
/// step. A NaN that shows on one rank at one step is `first_nonfinite`'s to report; a rank that
/// keeps producing them is an outlier.
pub const NONFINITE_MARGIN: f64 = 1.0;

/// A straggler's median step time exceeds this many times the median of the ranks' medians.
/// Synchronous ranks wait for each other inside the step, so their medians agree closely; 25% more
/// is a rank that works longer than the rest, not jitter.
pub const STRAGGLER_FACTOR: f64 = 1.25;

/// Rows of one table read at once: the batches of ranks whose parts are scanned together hold about
/// this many rows (a rank is never split). At ~80 bytes a row once decoded this keeps a batch near
/// 250 MB, so that 1,024 ranks' casts and statistics are read in under 2 GB.
pub const BATCH_ROWS: u64 = 3_000_000;

/// Findings listed in the text output before "… and N more" (JSON lists all).
pub const TEXT_FINDINGS: usize = 60;
/// Ranks listed one per line in the text output's per-rank table; beyond it only the ranks with a
/// finding or an unusual status are listed, and the rest are summarised in one line.
pub const TEXT_RANKS: usize = 32;
