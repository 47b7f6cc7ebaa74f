//! `compare RUN --baseline B`: its arguments and its rendering; the comparison is
//! [`crate::analysis::compare`].

use crate::analysis::compare::{CompareReport, TensorComparison, compare_runs};
use crate::analysis::params::DEFAULT_COSINE_THRESHOLD;
use crate::commands::Outcome;
use crate::error::AnalyzeError;
use crate::load::{LoadOptions, Run};
use crate::output::{self, cos, num};
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The run directory (usually the FP8 run).
    pub run: PathBuf,
    /// The reference run (usually BF16), same seed, data and dump flags.
    #[arg(long)]
    pub baseline: PathBuf,
    /// Flag tensors whose cosine similarity to the baseline is below this (or not finite).
    #[arg(long, default_value_t = DEFAULT_COSINE_THRESHOLD)]
    pub threshold: f64,
    /// Print only the flagged tensors (the JSON always holds every tensor).
    #[arg(long)]
    pub only_flagged: bool,
}

/// The command.
pub fn run(args: &CompareArgs, opts: LoadOptions, json: bool) -> Result<Outcome, AnalyzeError> {
    let run = Run::open(&args.run, opts)?;
    let base = Run::open(&args.baseline, opts)?;
    let report = compare_runs(&run, &base, args.threshold)?;
    for w in &report.warnings {
        eprintln!("fp8-analyze: warning: {w}");
    }
    let findings = report.flagged().next().is_some();
    let stdout = if json { output::json_text(&report) } else { render(&report, args.only_flagged) };
    Ok(Outcome { stdout, findings })
}

fn render(r: &CompareReport, only_flagged: bool) -> String {
    if let Some(u) = &r.unavailable {
        return format!("compare: run '{}' vs baseline '{}': nothing compared: {u}\n", r.run, r.baseline);
    }
    let mut s = format!(
        "compare: run '{}' vs baseline '{}': {} tensors at {} common dump step(s), {} flagged (cosine < {})\n\n",
        r.run,
        r.baseline,
        r.tensors.len(),
        r.common_steps.len(),
        r.flagged,
        r.threshold
    );
    let rows: Vec<Vec<String>> = r
        .tensors
        .iter()
        .filter(|t| !only_flagged || t.flagged)
        .map(|t| {
            let m = &t.metrics;
            vec![
                t.step.to_string(),
                t.tensor.clone(),
                m.numel.to_string(),
                cos(m.cosine),
                num(m.mse),
                num(m.rel_l2),
                num(m.sqnr_db),
                num(m.max_abs_diff),
                if m.nonfinite > 0 {
                    format!("{} non-finite", m.nonfinite)
                } else if t.flagged {
                    "FLAG".into()
                } else {
                    String::new()
                },
            ]
        })
        .collect();
    if !rows.is_empty() {
        s += &output::table(&["step", "tensor", "numel", "cosine", "mse", "rel_l2", "sqnr_db", "max_abs_diff", ""], &rows);
        s.push('\n');
    }
    if let Some(w) = r.tensors.iter().filter(|t| t.flagged).min_by(|a, b| {
        let key = |t: &TensorComparison| if t.metrics.cosine.is_finite() { t.metrics.cosine } else { f64::NEG_INFINITY };
        key(a).total_cmp(&key(b))
    }) {
        s += &format!("\nworst: {} at step {} (cosine {})\n", w.tensor, w.step, cos(w.metrics.cosine));
    }
    s
}
