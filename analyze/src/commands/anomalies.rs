//! `anomalies RUN [--baseline B…]`: its arguments and its rendering; the detectors are
//! [`crate::analysis::anomalies`]. The first `--baseline` is the reference; any further ones are
//! replicas (runs that should be equivalent to it) whose spread is the noise band every gap is
//! judged against.

use crate::analysis::anomalies::{AnomalyParams, AnomalyReport, find_anomalies, noise_band};
use crate::analysis::params::*;
use crate::commands::Outcome;
use crate::error::AnalyzeError;
use crate::load::{LoadOptions, Run};
use crate::output::{self, num, pct};
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct AnomaliesArgs {
    /// The run directory.
    pub run: PathBuf,
    /// A baseline run (usually BF16, same seed): drift from it, and spikes against it instead of in
    /// the run's own curve. Give it again for replicas (e.g. BF16 runs recorded with
    /// `fp8-capture --init-jitter N`): the first is the reference, the spread of the others to it
    /// is the noise band, and a gap counts only past --noise-margin times that band.
    #[arg(long, value_name = "DIR")]
    pub baseline: Vec<PathBuf>,
    /// A spike is a loss more than this many robust standard deviations above the rolling median.
    #[arg(long, default_value_t = DEFAULT_SPIKE_K)]
    pub spike_k: f64,
    /// Trailing window (recorded steps) of the rolling median and MAD, and of the noise band.
    #[arg(long, default_value_t = DEFAULT_SPIKE_WINDOW)]
    pub spike_window: usize,
    /// With a baseline, a spike is a jump of the relative gap (run − baseline) / baseline by more
    /// than --spike-k robust σ of its rolling window and by at least this much (0.05 = 5 points).
    #[arg(long, default_value_t = DEFAULT_SPIKE_MIN_GAP)]
    pub spike_min_gap: f64,
    /// Drift: the smoothed relative gap |run − baseline| / baseline must exceed this.
    #[arg(long, default_value_t = DEFAULT_DRIFT_THRESHOLD)]
    pub drift_threshold: f64,
    /// Drift: weight of the newest step in the exponential moving average of the gap (0 < α ≤ 1).
    #[arg(long, default_value_t = DEFAULT_DRIFT_ALPHA)]
    pub drift_alpha: f64,
    /// Drift: consecutive steps the smoothed gap must stay past the threshold.
    #[arg(long, default_value_t = DEFAULT_DRIFT_STEPS)]
    pub drift_steps: usize,
    /// With replicas: a gap counts only when it exceeds this many times the noise band (≥ 1).
    #[arg(long, default_value_t = DEFAULT_NOISE_MARGIN)]
    pub noise_margin: f64,
}

impl AnomaliesArgs {
    fn params(&self) -> Result<AnomalyParams, AnalyzeError> {
        AnomalyParams {
            spike_k: self.spike_k,
            spike_window: self.spike_window,
            spike_min_gap: self.spike_min_gap,
            drift_threshold: self.drift_threshold,
            drift_alpha: self.drift_alpha,
            drift_steps: self.drift_steps,
            noise_margin: self.noise_margin,
        }
        .validated()
    }
}

/// The command.
pub fn run(args: &AnomaliesArgs, opts: LoadOptions, json: bool) -> Result<Outcome, AnalyzeError> {
    let p = args.params()?;
    let run = Run::open(&args.run, opts)?;
    let bases = args.baseline.iter().map(|b| Run::open(b, opts)).collect::<Result<Vec<Run>, _>>()?;
    let noise = match bases.split_first() {
        Some((b, reps)) if !reps.is_empty() => Some(noise_band(b, reps, p)?),
        _ => None,
    };
    let report = find_anomalies(&run, bases.first(), noise.as_ref(), p)?;
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
    for u in &r.unavailable {
        s += &format!("not looked for: {u}\n\n");
    }
    match &r.noise {
        Some(n) => {
            s += &format!(
                "noise band: {} replica(s) ({}); a gap counts past {} × their largest gap to the baseline (final gaps {}; horizontal {})\n\n",
                n.replicas.len(),
                n.replicas.iter().map(|x| x.name.as_str()).collect::<Vec<_>>().join(", "),
                n.margin,
                n.replicas.iter().map(|x| x.final_gap.map(|g| format!("{:+.2}%", 100.0 * g)).unwrap_or("-".into())).collect::<Vec<_>>().join(", "),
                n.replicas.iter().map(|x| x.horizontal_steps.map(|h| format!("{h:+.1} steps")).unwrap_or("-".into())).collect::<Vec<_>>().join(", "),
            )
        }
        None if r.baseline.is_some() => {
            s += "noise band: not measured (one baseline; give replicas as more --baseline runs to judge gaps against the run-to-run spread)\n\n"
        }
        None => {}
    }
    if let Some(e) = &r.end_gap {
        s += &format!("{}\n\n", output::end_gap_text(e));
    }
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
                    match (x.noise_band, x.within_noise) {
                        (None, _) => "-".into(),
                        (Some(b), w) => format!("{:.2}%{}", 100.0 * b, if w { " (within)" } else { "" }),
                    },
                ]
            })
            .collect();
        s += &counted_table(&["start", "peak", "recovery", "peak loss", "baseline loss", "peak gap", "median gap", "peak z", "noise band"], &rows);
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
    s += &format!(
        "drift (EMA α={} of the relative gap beyond {}{} for {} steps, persisting to the end): ",
        p.drift_alpha,
        pct(p.drift_threshold),
        if r.noise.is_some() { format!(" and {} × the noise band", p.noise_margin) } else { String::new() },
        p.drift_steps
    );
    match (&r.baseline, &r.drift) {
        _ if r.end_gap.is_none() && !r.unavailable.is_empty() => s += "not checked (no loss curve to compare)\n\n",
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
    if !r.within_noise.is_empty() {
        s += "inconclusive (explained by the noise band or closed before the end):\n";
        for w in &r.within_noise {
            s += &format!("  - {w}\n");
        }
        s.push('\n');
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
        if let (Some(c), Some(t)) = (&r.stats_caveat, &nf.first_tensor)
            && t.source == "stats"
        {
            s += &format!("  (from {c})\n");
        }
    }
    s += &mechanisms_text(r);
    s
}

/// The mechanisms in the statistics, the earliest first, and whether they came before the loss moved.
pub fn mechanisms_text(r: &AnomalyReport) -> String {
    if r.mechanisms.is_empty() {
        return "mechanisms in the statistics (saturation, underflow surges, quantization bias, gradient below quantization noise): none\n".into();
    }
    let first = r.mechanisms[0].step;
    let mut s = format!("mechanisms in the statistics ({} found), earliest first", r.mechanisms.len());
    s += &match r.first_anomaly_step() {
        Some(a) if first < a => format!(", from step {first}, {} step(s) before the loss moved (step {a}):\n", a - first),
        Some(a) => format!(", from step {first} (the loss moved at step {a}):\n"),
        None => format!(", from step {first}, with no loss anomaly yet:\n"),
    };
    // Each kind in the order it first appears, its first few each, so one kind's many operands do
    // not hide another kind.
    let mut kinds: Vec<&str> = Vec::new();
    for m in &r.mechanisms {
        if !kinds.contains(&m.kind) {
            kinds.push(m.kind);
        }
    }
    for kind in kinds {
        let of: Vec<_> = r.mechanisms.iter().filter(|m| m.kind == kind).collect();
        for m in of.iter().take(PER_KIND) {
            s += &format!("  {}\n", m.describe());
        }
        if of.len() > PER_KIND {
            s += &format!("  … and {} more {kind} (--json lists them all)\n", of.len() - PER_KIND);
        }
    }
    s
}

/// Mechanisms of one kind the text shows.
const PER_KIND: usize = 4;
