//! `triage --out DIR [capture flags]`: the whole debugging method, automated, with every verdict
//! judged against the run-to-run spread.
//!
//! 1. Record the BF16 baseline, `--noise-runs` BF16 replicas (`--init-jitter k`: runs that should
//!    be equivalent to it; their spread is the noise band) and the FP8 run (with tensor dumps and
//!    shadow GEMMs, so that `locate` ranks GEMMs by harm), in parallel.
//! 2. Anomalies of the FP8 run against the baseline, judged against the band: nothing → healthy;
//!    something the band explains (a gap within its spread, a time shift) → **inconclusive**, and
//!    no culprit is named. Either way, stop.
//! 3. Send each GEMM kind back to BF16, try current scaling, (delayed scaling) a 16-step amax
//!    history, and the top-ranked GEMM alone back to BF16: leads (first non-finite GEMM; for a
//!    spike, the casts that saturated at its first step), then `locate`'s ranking by harm, then
//!    execution order. A run *cures* when it shows nothing significant against the band.
//! 4. Unless the top-ranked GEMM cured alone, bisect the sites of the curing kind(s)
//!    ([`crate::analysis::bisect`]) in the same order, the top of it first.
//! 5. **Confirm** the culprits on a second seed (seed + 1): its baseline, its FP8 run, and its FP8
//!    run with the culprits in BF16. The verdict names culprits only when the anomaly reproduces
//!    there and the culprits cure it; otherwise it says they were not confirmed.
//!
//! Every run stays under `--out/<name>/`, its log under `--out/logs/`, its anomaly report under
//! `--out/reports/<name>.anomalies.json` (and `fp8.locate.json`), the verdict in
//! `--out/verdict.json` and `--out/verdict.txt`. Exit status: 0 healthy or inconclusive, 1 anomaly,
//! 2 bad input.

mod method;
mod predicted;
mod render;

use crate::analysis::noise::NoiseBand;
use crate::capture_driver::CaptureFlags;
use crate::commands::Outcome;
use crate::error::AnalyzeError;
use crate::output;
use clap::Args;
use serde::Serialize;
use std::path::PathBuf;

pub use method::{SHORT_HISTORY, triage};

/// Replicas recorded for the noise band unless `--noise-runs` says otherwise.
pub const DEFAULT_NOISE_RUNS: usize = 2;

#[derive(Debug, Args)]
pub struct TriageArgs {
    /// Directory of the runs and the verdict (must be new or empty).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Scaling recipe of the FP8 run: delayed, current or block.
    #[arg(long, default_value = "delayed")]
    pub recipe: String,
    #[command(flatten)]
    pub capture: CaptureFlags,
    /// Reuse this BF16 run as the baseline instead of recording one (same preset, seed, steps and
    /// scenario).
    #[arg(long, value_name = "DIR")]
    pub baseline_run: Option<PathBuf>,
    /// BF16 replicas of the baseline recorded for the noise band (`fp8-capture --init-jitter k`,
    /// k = 1…N): the spread of runs that should be equivalent, which every gap and cure is judged
    /// against. 0: no band (gaps are judged against the drift threshold alone).
    #[arg(long, default_value_t = DEFAULT_NOISE_RUNS, value_name = "N")]
    pub noise_runs: usize,
    /// Reuse this run as a replica instead of recording one (repeatable; replaces --noise-runs).
    #[arg(long, value_name = "DIR")]
    pub noise_run: Vec<PathBuf>,
    /// Do not confirm the culprits on a second seed (the verdict then says it rests on one seed).
    #[arg(long)]
    pub no_confirm: bool,
    /// Dump tensors and record shadow GEMMs in the FP8 run every N steps (0: no dumps; candidates
    /// are then tried in execution order).
    #[arg(long, default_value_t = 25)]
    pub dump_every: u32,
    /// Most runs the site bisection may record.
    #[arg(long, default_value_t = 40)]
    pub max_runs: usize,
    /// Predict the culprits from the FP8 run's own shadow GEMMs (`fp8-analyze predict`) and test
    /// them with two runs: the suspects in BF16 must cure the run, and the suspects alone in FP8
    /// must bring the anomaly back. Only when either fails does the full method run (each kind back
    /// to BF16, bisection, second seed). Needs --dump-every > 0.
    #[arg(long)]
    pub predict: bool,
}

/// The two-run test of the predicted culprits (`--predict`).
#[derive(Clone, Debug, Serialize)]
pub struct PredictedTest {
    /// The GEMMs tested.
    pub suspects: Vec<Culprit>,
    /// The share of the loss gap `predict` said they hold.
    pub predicted_recovery: f64,
    /// The share of the GEMM FLOPs they run in BF16.
    pub bf16_flops_share: f64,
    /// With them in BF16, nothing significant is left.
    pub cures: bool,
    /// How the anomaly came back with only them in FP8 (None: it did not).
    pub reproduced: Option<String>,
    /// Both: they are the culprits.
    pub held: bool,
    /// The share of the FP8 gap their BF16 run recovered (1 − |residual| / |gap|), when known.
    pub recovered: Option<f64>,
    /// When several suspects held, each alone in BF16 (one more run each, in one batch): whether it
    /// cures the run and the share of the gap it recovers. Empty when not tried.
    pub each_alone: Vec<SuspectAlone>,
    /// The culprits the test names: the one suspect that cures the run alone in BF16 when exactly
    /// one does (the others stay in FP8 without the anomaly, so they are not needed), else every
    /// suspect.
    pub named: Vec<Culprit>,
    /// The prediction was the recipe, not a GEMM: the run went non-finite with most of its GEMMs at
    /// their scale's limit (`predict`'s `recipe_wide`), so the one test run is the same run with
    /// current scaling (`cures`), and `suspects` is empty.
    pub recipe: Option<RecipeTest>,
}

/// The recipe test of a run whose scales failed at once (`PredictedTest::recipe`).
#[derive(Clone, Debug, Serialize)]
pub struct RecipeTest {
    /// GEMMs within 5% of their limit (or non-finite first) up to the non-finite step.
    pub at_risk: usize,
    /// GEMMs of the run.
    pub gemms: usize,
    /// The recipe tried ("current").
    pub tried: String,
}

/// One suspect of several, alone in BF16 (`PredictedTest::each_alone`).
#[derive(Clone, Debug, Serialize)]
pub struct SuspectAlone {
    pub culprit: Culprit,
    pub cures: bool,
    pub recovered: Option<f64>,
}

/// A GEMM named in the verdict.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Culprit {
    pub layer: u32,
    pub module: String,
    pub gemm: String,
}

impl Culprit {
    fn site_flag(&self) -> String {
        format!("layers.{}.{}:{}", self.layer, self.module, self.gemm)
    }
    pub fn name(&self) -> String {
        format!("layers.{}.{}.{}", self.layer, self.module, self.gemm)
    }
}

/// How one run ended and what the analyzer found in it.
#[derive(Clone, Debug, Serialize)]
pub struct RunOutcome {
    /// What the run is for: baseline, replica, fp8, kind, current, short-history, top-ranked,
    /// all-gemms, bisect, confirm-baseline, confirm-fp8, confirm-culprits.
    pub purpose: String,
    /// completed, diverged, crashed, failed, or reused (a `--baseline-run` / `--noise-run`).
    pub status: String,
    pub steps_completed: u32,
    /// Mean loss of the last 20 steps.
    pub final_loss: Option<f64>,
    /// (final_loss − baseline's) / baseline's.
    pub gap: Option<f64>,
    /// |gap| / the noise band's final gap (None without a band).
    pub gap_band_ratio: Option<f64>,
    /// How many more steps the run needs to reach the baseline's final loss (negative: fewer).
    pub horizontal_steps: Option<f64>,
    /// spike, drift or nan; None when healthy, inconclusive or not analysed.
    pub anomaly: Option<String>,
    /// What the band explains in this run (a gap within the spread), when nothing is significant.
    pub within_noise: Vec<String>,
    /// Whether the run shows no significant anomaly against the baseline (None for baselines).
    pub cured: Option<bool>,
    pub error: Option<String>,
}

/// One run of the triage.
#[derive(Clone, Debug, Serialize)]
pub struct RunEntry {
    pub name: String,
    pub dir: PathBuf,
    pub flags: Vec<String>,
    pub outcome: RunOutcome,
}

/// The noise band in the verdict.
#[derive(Clone, Debug, Serialize)]
pub struct NoiseSummary {
    /// The replicas' names.
    pub replicas: Vec<String>,
    /// Largest |final gap| of a replica to the baseline.
    pub final_gap: f64,
    /// Largest |horizontal gap| of a replica, in steps.
    pub horizontal_steps: Option<f64>,
    /// A gap counts past this many bands.
    pub margin: f64,
}

impl NoiseSummary {
    fn of(n: &NoiseBand) -> NoiseSummary {
        NoiseSummary {
            replicas: n.replicas.iter().map(|r| r.name.clone()).collect(),
            final_gap: n.final_gap,
            horizontal_steps: n.horizontal_steps,
            margin: n.margin,
        }
    }
}

/// The culprits tried on a second seed.
#[derive(Clone, Debug, Serialize)]
pub struct Confirmation {
    pub seed: u64,
    /// The culprits found on the first seed (sent back to BF16 on this one).
    pub culprits: Vec<Culprit>,
    /// How the anomaly reproduced on this seed: its class when the detectors find it again, or
    /// "<class> (a gap beyond the band)" when the FP8 run ends beyond the noise band on the same
    /// side as on the first seed; None when it did not reproduce.
    pub anomaly: Option<String>,
    /// The culprits in BF16 cure the anomaly on this seed by `method::second_seed_cure`'s rule:
    /// they recover ≥ 90% of this seed's gap, or leave no anomaly and recover ≥ 50%.
    pub cured: bool,
    /// Both: the verdict's culprits are confirmed.
    pub held: bool,
    /// The share of this seed's FP8 gap the culprits in BF16 recover (1 − |residual| / |gap|), when
    /// both gaps are known: how sure the confirmation is.
    pub recovered: Option<f64>,
}

/// The verdict (`--json`).
#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    pub healthy: bool,
    /// No culprit can be named: nothing significant but a gap the noise band explains, or (with
    /// `anomaly` set) an anomaly of the first seed that the second seed does not reproduce.
    pub inconclusive: bool,
    /// No loss anomaly, but an FP8 failure mechanism in the statistics (a saturating cast, an
    /// underflow surge: `analysis::mechanisms`): the run is not called healthy. Each in words.
    pub mechanisms: Vec<String>,
    pub anomaly: Option<String>,
    /// The culprits, only when the bisection found a curing set and (unless --no-confirm) the
    /// second seed confirmed it.
    pub culprits: Vec<Culprit>,
    pub current_scaling_cures: bool,
    /// Whether block scaling (1×128 / 128×128 tiles) cures the run; None when it was not tried
    /// (the FP8 run uses it, or the captures run on the GPU, which has no block scaling yet).
    pub block_scaling_cures: Option<bool>,
    /// Whether MXFP8 (E4M3 in 1×32 blocks with E8M0 scales) cures the run; None when it was not
    /// tried (the FP8 run uses it, faults are planted, which MXFP8 casts do not take, or the
    /// captures run on the GPU or on several ranks).
    pub mxfp8_cures: Option<bool>,
    /// The noise band the verdict was judged against (None with --noise-runs 0).
    pub noise: Option<NoiseSummary>,
    /// The second seed's test of the culprits (None when there were none, --no-confirm, or the
    /// predicted culprits held).
    pub confirmation: Option<Confirmation>,
    /// The two-run test of the predicted culprits (`--predict`; None otherwise).
    pub predicted: Option<PredictedTest>,
    pub runs: Vec<RunEntry>,
}

/// The command. Findings (exit 1) when the FP8 run shows a significant anomaly.
pub fn run(a: &TriageArgs, json: bool) -> Result<Outcome, AnalyzeError> {
    let (v, text) = triage(a)?;
    let _ = std::fs::write(a.out.join("verdict.json"), output::json_text(&v));
    let _ = std::fs::write(a.out.join("verdict.txt"), &text);
    let stdout = if json { output::json_text(&v) } else { text };
    Ok(Outcome { stdout, findings: v.anomaly.is_some() && !v.inconclusive })
}
