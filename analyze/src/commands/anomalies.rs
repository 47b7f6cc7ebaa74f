//! `anomalies RUN [--baseline B]`: loss spikes, drift from the baseline, and the first non-finite
//! step and tensor. The definitions live in [`crate::detect`] and README.md; this file fetches the
//! columns they need (steps: step and loss; stats: the non-finite counts; events: non-finite
//! events) and renders the answer.

use crate::cli::{AnomaliesArgs, DEFAULT_DRIFT_ALPHA, DEFAULT_DRIFT_STEPS, DEFAULT_DRIFT_THRESHOLD, DEFAULT_SPIKE_K, DEFAULT_SPIKE_MIN_GAP, DEFAULT_SPIKE_WINDOW};
use crate::commands::Outcome;
use crate::compat;
use crate::detect::{self, Drift, DriftParams, GapSpike, NonFiniteTensor, Spike, SpikeParams};
use crate::error::AnalyzeError;
use crate::load::{f64s, i64s, strs, LoadOptions, Run};
use crate::output::{self, num, pct};
use fp8scope_schemas::layout::Table;
use fp8scope_schemas::tables::col;
use polars::prelude::*;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// Validated detector settings.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct AnomalyParams {
    pub spike_k: f64,
    pub spike_window: usize,
    pub spike_min_gap: f64,
    pub drift_threshold: f64,
    pub drift_alpha: f64,
    pub drift_steps: usize,
}

impl AnomalyParams {
    /// The documented defaults (`report` and `triage` use them).
    pub fn defaults() -> AnomalyParams {
        AnomalyParams {
            spike_k: DEFAULT_SPIKE_K,
            spike_window: DEFAULT_SPIKE_WINDOW,
            spike_min_gap: DEFAULT_SPIKE_MIN_GAP,
            drift_threshold: DEFAULT_DRIFT_THRESHOLD,
            drift_alpha: DEFAULT_DRIFT_ALPHA,
            drift_steps: DEFAULT_DRIFT_STEPS,
        }
    }

    pub fn from_args(a: &AnomaliesArgs) -> Result<AnomalyParams, AnalyzeError> {
        if !(a.spike_k > 0.0 && a.spike_k.is_finite()) {
            return Err(AnalyzeError::usage(format!("--spike-k must be a positive number, got {}", a.spike_k)));
        }
        if a.spike_window < 2 {
            return Err(AnalyzeError::usage(format!("--spike-window must be at least 2, got {}", a.spike_window)));
        }
        if !(a.spike_min_gap >= 0.0 && a.spike_min_gap.is_finite()) {
            return Err(AnalyzeError::usage(format!("--spike-min-gap must be a number ≥ 0, got {}", a.spike_min_gap)));
        }
        if !(a.drift_threshold > 0.0 && a.drift_threshold.is_finite()) {
            return Err(AnalyzeError::usage(format!("--drift-threshold must be positive, got {}", a.drift_threshold)));
        }
        if !(a.drift_alpha > 0.0 && a.drift_alpha <= 1.0) {
            return Err(AnalyzeError::usage(format!("--drift-alpha must be in (0, 1], got {}", a.drift_alpha)));
        }
        if a.drift_steps == 0 {
            return Err(AnalyzeError::usage("--drift-steps must be at least 1"));
        }
        Ok(AnomalyParams {
            spike_k: a.spike_k,
            spike_window: a.spike_window,
            spike_min_gap: a.spike_min_gap,
            drift_threshold: a.drift_threshold,
            drift_alpha: a.drift_alpha,
            drift_steps: a.drift_steps,
        })
    }
}

/// Where the run first went non-finite.
#[derive(Clone, Debug, Default, Serialize)]
pub struct NonFinite {
    /// First step whose loss is NaN or ±∞ (steps table or a `nonfinite_loss` event).
    pub first_loss_step: Option<i64>,
    /// The first tensor, in execution order, among those non-finite at the earliest step any was.
    pub first_tensor: Option<NonFiniteTensor>,
}

impl NonFinite {
    pub fn found(&self) -> bool {
        self.first_loss_step.is_some() || self.first_tensor.is_some()
    }
}

/// Everything `anomalies` found.
#[derive(Clone, Debug, Serialize)]
pub struct AnomalyReport {
    pub run: String,
    pub status: String,
    pub baseline: Option<String>,
    pub params: AnomalyParams,
    /// Steps recorded in the run's steps table.
    pub steps: usize,
    /// Spikes of the run's own loss curve.
    pub spikes: Vec<Spike>,
    /// Spikes against the baseline (empty without one).
    pub gap_spikes: Vec<GapSpike>,
    /// None without a baseline or without drift.
    pub drift: Option<Drift>,
    pub nonfinite: NonFinite,
    pub warnings: Vec<String>,
}

impl AnomalyReport {
    /// Whether the run spiked: against the baseline when there is one (a spike the baseline shares
    /// came from the data, not from FP8), else in its own curve. A jump of the gap that never comes
    /// back in band is a step change, not a spike, when the drift detector covers it.
    pub fn spiked(&self) -> bool {
        if self.baseline.is_some() { !self.counted_gap_spikes().is_empty() } else { !self.spikes.is_empty() }
    }

    /// The spikes against the baseline that count (see [`AnomalyReport::spiked`]).
    pub fn counted_gap_spikes(&self) -> Vec<&GapSpike> {
        self.gap_spikes.iter().filter(|s| s.recovery.is_some() || self.drift.is_none()).collect()
    }

    pub fn found(&self) -> bool {
        self.spiked() || self.drift.is_some() || self.nonfinite.found()
    }
}

/// The loss curve of a run, sorted by step: (steps, losses).
pub fn loss_curve(run: &Run) -> Result<(Vec<i64>, Vec<f64>), AnalyzeError> {
    let lf = run.scan(Table::Steps, &[col::STEP, col::LOSS])?;
    let df = run.collect(Table::Steps, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "steps", e);
    let steps = i64s(&df, col::STEP).map_err(e)?;
    let loss = f64s(&df, col::LOSS).map_err(e)?;
    let mut pts: Vec<(i64, f64)> =
        steps.into_iter().zip(loss).filter_map(|(s, l)| Some((s?, l.unwrap_or(f64::NAN)))).collect();
    pts.sort_by_key(|p| p.0);
    Ok(pts.into_iter().unzip())
}

/// Runs every detector.
pub fn find_anomalies(run: &Run, base: Option<&Run>, p: AnomalyParams) -> Result<AnomalyReport, AnalyzeError> {
    let (steps, loss) = loss_curve(run)?;
    if steps.is_empty() {
        return Err(AnalyzeError::Missing { run: run.name.clone(), message: "has no recorded steps".into() });
    }
    let spikes = detect::spikes(&steps, &loss, SpikeParams { k: p.spike_k, window: p.spike_window });
    let mut warnings = Vec::new();
    let mut gap_spikes = Vec::new();
    let drift = match base {
        None => None,
        Some(base) => {
            compat::check_model(run, base)?;
            warnings.extend(compat::warnings(run, base));
            let (bsteps, bloss) = loss_curve(base)?;
            let a: BTreeSet<i64> = steps.iter().copied().collect();
            let b: BTreeSet<i64> = bsteps.iter().copied().collect();
            let common = compat::common_steps("recorded", run, &a, base, &b)?;
            let run_at: BTreeMap<i64, f64> = steps.iter().copied().zip(loss.iter().copied()).collect();
            let base_at: BTreeMap<i64, f64> = bsteps.into_iter().zip(bloss).collect();
            let cs: Vec<i64> = common.into_iter().collect();
            let r: Vec<f64> = cs.iter().map(|s| run_at[s]).collect();
            let b: Vec<f64> = cs.iter().map(|s| base_at[s]).collect();
            gap_spikes = detect::gap_spikes(&cs, &r, &b, SpikeParams { k: p.spike_k, window: p.spike_window }, p.spike_min_gap);
            detect::drift_outside_spikes(&cs, &r, &b, &gap_spikes, DriftParams { threshold: p.drift_threshold, alpha: p.drift_alpha, steps: p.drift_steps })
        }
    };
    let nonfinite = find_nonfinite(run, &steps, &loss)?;
    Ok(AnomalyReport {
        run: run.name.clone(),
        status: run.manifest.status.as_str().to_string(),
        baseline: base.map(|b| b.name.clone()),
        params: p,
        steps: steps.len(),
        spikes,
        gap_spikes,
        drift,
        nonfinite,
        warnings,
    })
}

/// The first non-finite loss step and the first non-finite tensor (stats and events).
pub fn find_nonfinite(run: &Run, steps: &[i64], loss: &[f64]) -> Result<NonFinite, AnalyzeError> {
    let mut first_loss_step = steps.iter().zip(loss).find(|(_, l)| !l.is_finite()).map(|(&s, _)| s);
    let mut candidates = Vec::new();

    // Stats: every operand with a NaN or Inf, at the earliest step any had one.
    let bad = (col(col::NAN_COUNT) + col(col::INF_COUNT)).gt(lit(0));
    let lf = run
        .scan(Table::Stats, &[col::STEP, col::LAYER, col::MODULE, col::GEMM, col::ROLE, col::NAN_COUNT, col::INF_COUNT])?
        .filter(bad)
        .filter(col(col::STEP).eq(col(col::STEP).min()));
    let df = run.collect(Table::Stats, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "stats", e);
    let (st, la, mo, ge, ro) = (i64s(&df, col::STEP).map_err(e)?, i64s(&df, col::LAYER).map_err(e)?, strs(&df, col::MODULE).map_err(e)?, strs(&df, col::GEMM).map_err(e)?, strs(&df, col::ROLE).map_err(e)?);
    let (nan, inf) = (i64s(&df, col::NAN_COUNT).map_err(e)?, i64s(&df, col::INF_COUNT).map_err(e)?);
    for i in 0..df.height() {
        if let (Some(step), Some(layer), Some(module), Some(role)) = (st[i], la[i], mo[i].clone(), ro[i].clone()) {
            candidates.push(NonFiniteTensor::new(step, layer, module, ge[i].clone(), role, "stats", (nan[i], inf[i])));
        }
    }

    // Events: what the capture itself saw.
    let lf = run.scan(Table::Events, &[col::STEP, col::KIND, col::LAYER, col::MODULE, col::GEMM, col::ROLE])?.filter(
        col(col::KIND).eq(lit("nonfinite_tensor")).or(col(col::KIND).eq(lit("nonfinite_loss"))),
    );
    let df = run.collect(Table::Events, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "events", e);
    let (st, ki, la, mo, ge, ro) = (
        i64s(&df, col::STEP).map_err(e)?,
        strs(&df, col::KIND).map_err(e)?,
        i64s(&df, col::LAYER).map_err(e)?,
        strs(&df, col::MODULE).map_err(e)?,
        strs(&df, col::GEMM).map_err(e)?,
        strs(&df, col::ROLE).map_err(e)?,
    );
    for i in 0..df.height() {
        let Some(step) = st[i] else { continue };
        if ki[i].as_deref() == Some("nonfinite_loss") {
            first_loss_step = Some(first_loss_step.map_or(step, |s| s.min(step)));
            continue;
        }
        if let (Some(layer), Some(module), Some(role)) = (la[i], mo[i].clone(), ro[i].clone()) {
            candidates.push(NonFiniteTensor::new(step, layer, module, ge[i].clone(), role, "events", (None, None)));
        }
    }
    Ok(NonFinite { first_loss_step, first_tensor: detect::first_nonfinite_tensor(run.n_layers(), &candidates) })
}

/// The command.
pub fn run(args: &AnomaliesArgs, opts: LoadOptions, json: bool) -> Result<Outcome, AnalyzeError> {
    let p = AnomalyParams::from_args(args)?;
    let run = Run::open(&args.run, opts)?;
    let base = args.baseline.as_deref().map(|b| Run::open(b, opts)).transpose()?;
    let report = find_anomalies(&run, base.as_ref(), p)?;
    for w in &report.warnings {
        eprintln!("fp8-analyze: warning: {w}");
    }
    let stdout = if json { output::json_text(&report) } else { render(&report) };
    Ok(Outcome { stdout, findings: report.found() })
}

/// "none", or the count and a table of the rows; then a blank line.
fn counted_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    if rows.is_empty() { "none\n\n".into() } else { format!("{}\n{}\n\n", rows.len(), output::table(headers, rows)) }
}

fn render(r: &AnomalyReport) -> String {
    let p = &r.params;
    let mut s = format!("anomalies: run '{}' ({}, {} steps recorded)", r.run, r.status, r.steps);
    if let Some(b) = &r.baseline {
        s += &format!(" vs baseline '{b}'");
    }
    s += "\n\n";
    if r.baseline.is_some() {
        s += &format!(
            "spikes against the baseline (gap to it > rolling median + max({}·σ, {}) over {} steps): ",
            p.spike_k,
            pct(p.spike_min_gap),
            p.spike_window
        );
        let rows: Vec<Vec<String>> = r
            .gap_spikes
            .iter()
            .map(|x| {
                vec![
                    x.start.to_string(),
                    x.peak.to_string(),
                    output::opt(x.recovery),
                    num(x.peak_loss),
                    num(x.peak_base_loss),
                    format!("{:+.2}%", 100.0 * x.peak_gap),
                    format!("{:+.2}%", 100.0 * x.median_gap),
                    num(x.peak_z),
                ]
            })
            .collect();
        s += &counted_table(&["start", "peak", "recovery", "peak loss", "baseline loss", "peak gap", "median gap", "peak z"], &rows);
        if r.drift.is_some() && r.gap_spikes.iter().any(|x| x.recovery.is_none()) {
            s += "(a jump that never comes back in band is a step change: it counts as the drift below, not as a spike)\n\n";
        }
    }
    let own = if r.baseline.is_some() { "spikes of the run's own curve (shown; with a baseline only those against it count)" } else { "spikes" };
    s += &format!("{own} (loss > rolling median + {}·σ over {} steps): ", p.spike_k, p.spike_window);
    let rows: Vec<Vec<String>> = r
        .spikes
        .iter()
        .map(|x| {
            vec![
                x.start.to_string(),
                x.peak.to_string(),
                output::opt(x.recovery),
                num(x.start_loss),
                num(x.peak_loss),
                num(x.median),
                num(x.upper),
                num(x.peak_z),
            ]
        })
        .collect();
    s += &counted_table(&["start", "peak", "recovery", "start loss", "peak loss", "median", "band upper", "peak z"], &rows);
    s += &format!("drift (EMA α={} of the relative gap beyond {} for {} steps): ", p.drift_alpha, pct(p.drift_threshold), p.drift_steps);
    match (&r.baseline, &r.drift) {
        (None, _) => s += "not checked (no --baseline)\n\n",
        (Some(_), None) => s += "none\n\n",
        (Some(_), Some(d)) => {
            s += &format!(
                "from step {} (confirmed at {}), run {} baseline; final gap {:+.2}% at step {} (raw {:+.2}%)\n",
                d.first_step,
                d.confirmed_step,
                d.sign,
                100.0 * d.final_gap,
                d.final_step,
                100.0 * d.final_raw_gap
            );
            s.push('\n');
        }
    }
    s += "non-finite: ";
    let nf = &r.nonfinite;
    if !nf.found() {
        s += "none\n";
    } else {
        s += &format!("first non-finite loss at step {}", output::opt(nf.first_loss_step));
        if let Some(t) = &nf.first_tensor {
            s += &format!("; first tensor {} at step {}", t.tensor, t.step);
            if let Some(g) = &t.gemm {
                s += &format!(" ({g})");
            }
            match (t.nan_count, t.inf_count) {
                (Some(n), Some(i)) => s += &format!(" [{n} NaN, {i} Inf, from {}]", t.source),
                _ => s += &format!(" [from {}]", t.source),
            }
        }
        s.push('\n');
    }
    s
}
