//! The analysis beneath every command: what `anomalies`, `compare`, `locate`, `summary`, `report`
//! and `triage` compute, as typed values, with no argument parsing and no rendering.
//!
//! - [`detect`]: the spike, drift and non-finite detectors as pure functions over loss curves;
//! - [`noise`]: the noise band, the spread of runs that should be equivalent, that every gap and
//!   cure is judged against; [`dynamics`]: the horizontal gap (how many more steps a run needs to
//!   reach the baseline's loss);
//! - [`anomalies`]: the detectors applied to recorded runs; [`mechanisms`]: saturation and
//!   underflow surges in the statistics, whether or not the loss has moved, and the
//!   [`early_warnings`] of the quantization error (a biased cast, a gradient below the noise);
//! - [`compare`] and [`metrics`]: tensors against the baseline's; [`compat`]: whether two runs
//!   can be compared;
//! - [`locate`]: the GEMMs ranked by the harm their error does, with the evidence; [`predict`]:
//!   the share of the loss gap each BF16 routing would recover, from the same records, and
//!   [`overflow_risk`]: how close each GEMM's casts came to overflowing before a run diverged;
//! - [`bisect`]: the order of candidate GEMMs and the search for a minimal curing set;
//! - [`summary`]: what was run and the worst tensors; [`params`]: the documented defaults;
//! - [`provenance`]: where a run came from, what it lacks, and the caveat of rounded statistics.

pub mod anomalies;
pub mod bisect;
pub mod compare;
pub mod compat;
pub mod detect;
pub mod dynamics;
pub mod early_warnings;
pub mod liveness;
pub mod locate;
pub mod mechanisms;
pub mod metrics;
pub mod noise;
pub mod overflow_risk;
pub mod params;
pub mod predict;
pub mod provenance;
pub mod ranks;
pub mod summary;
pub mod whatif;
