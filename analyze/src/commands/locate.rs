//! `locate RUN [--baseline B]`: its arguments and its rendering; the ranking (by harm, after
//! delayed scaling's warm-up) is [`crate::analysis::locate`].

use crate::analysis::locate::{LocateReport, OperandEvidence, locate};
use crate::analysis::params::DEFAULT_COSINE_THRESHOLD;
use crate::commands::Outcome;
use crate::error::AnalyzeError;
use crate::load::{LoadOptions, Run};
use crate::output::{self, num, pct};
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct LocateArgs {
    /// The run directory (usually the FP8 run).
    pub run: PathBuf,
    /// The reference run; needed unless the run recorded shadow GEMMs (`--shadow`).
    #[arg(long)]
    pub baseline: Option<PathBuf>,
    /// Cosine threshold: a GEMM crosses it when the error it adds exceeds 1 − threshold.
    #[arg(long, default_value_t = DEFAULT_COSINE_THRESHOLD)]
    pub threshold: f64,
    /// How many GEMMs to print (the JSON always holds every one).
    #[arg(long, default_value_t = 10)]
    pub top: usize,
}

/// The command.
pub fn run(args: &LocateArgs, opts: LoadOptions, json: bool) -> Result<Outcome, AnalyzeError> {
    let run = Run::open(&args.run, opts)?;
    let base = args.baseline.as_deref().map(|b| Run::open(b, opts)).transpose()?;
    let report = locate(&run, base.as_ref(), args.threshold)?;
    for w in &report.warnings {
        eprintln!("fp8-analyze: warning: {w}");
    }
    let stdout = if json { output::json_text(&report) } else { render(&report, args.top) };
    Ok(Outcome::clean(stdout))
}

fn render(r: &LocateReport, top: usize) -> String {
    let how = match r.method {
        "shadow" => "its shadow GEMM records (error = 1 − cosine against BF16 on the same inputs)".to_string(),
        "stats" => "its statistics (error = underflow + saturated share of the worst operand's cast)".to_string(),
        _ => format!(
            "tensors compared with baseline '{}' (added = error(result) − max error(operands), error = 1 − cosine)",
            r.baseline.as_deref().unwrap_or("?")
        ),
    };
    let mut s = format!("locate: run '{}', from {how}; ranked by {}", r.run, r.ranked_by);
    if r.ranked_by == "harm" {
        s += " (‖FP8 − BF16 result‖ · ‖its dual‖: dY for fprop, X for dgrad, W for wgrad — the error in loss units)";
    }
    let warm: Vec<i64> = r.ranked.iter().filter_map(|g| g.warmup_until).collect();
    if let Some(w) = warm.iter().max() {
        s += &format!("; delayed scaling's warm-up (scales not yet from a real amax, until step {w}) is left out");
    }
    s += "\n";
    if let Some(n) = &r.note {
        s += &format!("{n}\n");
    }
    if let Some(c) = &r.stats_caveat {
        s += &format!("every figure below rests on {c}\n");
    }
    s += "\n";
    let rows: Vec<Vec<String>> = r
        .ranked
        .iter()
        .take(top)
        .enumerate()
        .map(|(i, g)| {
            let ev = |f: fn(&OperandEvidence) -> Option<f64>| {
                g.evidence
                    .iter()
                    .map(|e| {
                        let at = e.rank.map(|k| format!(" (rank {k})")).unwrap_or_default();
                        format!("{}{at} {}", e.role, f(e).map(pct).unwrap_or_else(|| "-".into()))
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            vec![
                (i + 1).to_string(),
                g.gemm_name.clone(),
                num(g.score),
                g.peak_step.to_string(),
                num(g.peak_error),
                output::opt(g.first_crossed),
                ev(|e| e.underflow_frac),
                ev(|e| e.saturated_frac),
            ]
        })
        .collect();
    if rows.is_empty() {
        s += if r.method == "stats" {
            "no GEMM could be scored (the stats hold no underflow or saturation)\n"
        } else {
            "no GEMM could be scored (no result tensors dumped)\n"
        };
        return s;
    }
    let (score, peak) = match r.ranked_by {
        "harm" => ("harm", "1 − cos (peak)"),
        "cast loss" => ("cast loss", "cast loss (peak)"),
        _ => ("added error", "1 − cos (peak)"),
    };
    s += &output::table(&["#", "gemm", score, "peak step", peak, "first crossed", "underflow", "saturated"], &rows);
    s.push('\n');
    match &r.first {
        Some(name) => {
            if let Some(g) = r.ranked.iter().find(|g| &g.gemm_name == name) {
                s += &format!(
                    "\nfirst to cross (adds > {} = 1 − {}): {} at step {}\n",
                    num(1.0 - r.threshold),
                    r.threshold,
                    g.gemm_name,
                    output::opt(g.first_crossed)
                );
            }
        }
        None => s += &format!("\nno GEMM adds more than {} (1 − {})\n", num(1.0 - r.threshold), r.threshold),
    }
    s += &channel_lines(r);
    s
}

/// Where the amax of the verdict's operands sits (the first to cross, else the top-ranked GEMM):
/// "channels of layers.1.fc1.fprop's operands at step 120: activation amax 412 in channel 33, top
/// 1% of channels hold 87.00% of Σx²; …". Empty when the run has no channel statistics (recorded
/// before schema version 2).
fn channel_lines(r: &LocateReport) -> String {
    let g = r.first.as_ref().and_then(|n| r.ranked.iter().find(|g| &g.gemm_name == n)).or(r.ranked.first());
    let Some(g) = g else { return String::new() };
    let phrases: Vec<String> = g.evidence.iter().filter_map(OperandEvidence::channel_phrase).collect();
    match g.evidence.first() {
        Some(e) if !phrases.is_empty() => format!("channels of {}'s operands at step {}: {}\n", g.gemm_name, e.step, phrases.join("; ")),
        _ => String::new(),
    }
}
