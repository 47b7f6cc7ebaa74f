//! `report RUN... [--baseline B] --out DIR`: its flags and its text output; the report is built by
//! [`crate::report::build`]. PNG charts and an `index.html` that shows them with
//! the findings in words. Every number comes from the other commands' library functions
//! (`find_anomalies`, `compare_runs`, `locate`, `summarize`) or from the stats and tensors tables
//! read here; [`crate::report`] draws. What cannot be drawn (no baseline, no dumps, a BF16 run, no
//! shadow records) is said on the page and in `report.json`, instead of an empty chart.
//!
//! Files written to DIR: `index.html`, `report.json`, `loss.png`, and per run (file names start
//! with the run's name): `<run>-cosine.png`, `<run>-underflow.png`, `<run>-saturated.png`,
//! `<run>-sites.png`, `<run>-amax.png`, `<run>-histograms.png`.

use crate::analysis::params::DEFAULT_COSINE_THRESHOLD;
use crate::commands::Outcome;
use crate::error::AnalyzeError;
use crate::load::{LoadOptions, Run};
use crate::output;
use crate::report::build::{Report, build_report};
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// One or more run directories (usually FP8 runs); the baseline may be listed too.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// The reference run (usually BF16): loss gap and drift, cosine heatmaps, and `locate` for
    /// runs without shadow records.
    #[arg(long)]
    pub baseline: Option<PathBuf>,
    /// Output directory (created); index.html, report.json and the PNGs are written there.
    #[arg(long)]
    pub out: PathBuf,
    /// Cosine threshold of `compare` and `locate`.
    #[arg(long, default_value_t = DEFAULT_COSINE_THRESHOLD)]
    pub threshold: f64,
    /// How many of `locate`'s top GEMMs get amax/scale plots (at most 3).
    #[arg(long, default_value_t = 3)]
    pub top: usize,
}

/// One run's findings, in words and numbers.
/// The command.
pub fn run(args: &ReportArgs, opts: LoadOptions, json: bool) -> Result<Outcome, AnalyzeError> {
    let base = args.baseline.as_deref().map(|b| Run::open(b, opts)).transpose()?;
    // The baseline listed among the runs is shown once, as the baseline.
    let same = |p: &Path, b: &Path| match (p.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => p == b,
    };
    let paths: Vec<PathBuf> = args.runs.iter().filter(|p| !args.baseline.as_deref().is_some_and(|b| same(p, b))).cloned().collect();
    if paths.is_empty() {
        return Err(AnalyzeError::usage("give at least one run besides the baseline"));
    }
    let runs = Run::open_many(&paths, opts)?;
    let report = build_report(&runs, base.as_ref(), &args.out, args.threshold, args.top)?;
    for w in &report.warnings {
        eprintln!("fp8-analyze: warning: {w}");
    }
    let stdout = if json { output::json_text(&report) } else { render(&report) };
    Ok(Outcome::clean(stdout))
}

fn render(r: &Report) -> String {
    let mut s = format!("report: {} ({} chart(s), {:.1} s)\n", r.index, r.charts.len(), r.seconds);
    for f in &r.runs {
        s += &format!("\n{} ({}, {}, {} of {} steps)\n", f.run, f.recipe, f.status, f.steps_completed, f.steps_planned);
        for line in &f.findings {
            s += &format!("  - {line}\n");
        }
        for n in &f.not_drawn {
            s += &format!("  not drawn: {n}\n");
        }
    }
    for n in &r.not_drawn {
        s += &format!("\nnot drawn: {n}\n");
    }
    s += "\ncharts:\n";
    let rows: Vec<Vec<String>> = r.charts.iter().map(|c| vec![c.file.clone(), format!("{}×{}", c.width, c.height), c.title.clone()]).collect();
    s += &output::table(&["file", "size", "title"], &rows);
    s.push('\n');
    s
}
