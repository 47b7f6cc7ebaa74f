//! `regress --out DIR [capture flags]`: the blog's pytest as a command. Four modes are recorded in
//! parallel from the same flags — `bf16`, `fp8` (the `--recipe`, delayed by default), `fp8-no-dgrad`
//! (`--bf16-gemms dgrad`) and `fp8-current` (current scaling); `--inject` applies to the FP8 modes.
//! Each mode must stay within two bounds:
//!
//! - its final loss (mean of the last 20 steps, from the manifest) ≤ `--max-loss`, by default
//!   floor + 0.35·(ln V − floor) with the data's entropy floor and ln V from the bf16 run's manifest
//!   (ln V itself when the data has no known floor);
//! - its relative gap to bf16, (loss − bf16) / bf16, ≤ `--max-gap` (default 2%).
//!
//! A run that diverges or crashes fails. Exit status 1 when any mode fails, 2 on bad input.

use crate::analysis::dynamics::relative_gap;
use crate::capture_driver::{CaptureFlags, RunSpec, require_usable};
use crate::commands::Outcome;
use crate::error::AnalyzeError;
use crate::output::{self, num, pct};
use clap::Args;
use fp8scope_schemas::manifest::Manifest;
use serde::Serialize;
use std::path::PathBuf;

/// Fraction of the way from the entropy floor to ln V that the default loss bound allows.
pub const DEFAULT_LOSS_FRACTION: f64 = 0.35;
/// Default bound on the relative gap of a mode's final loss to bf16's.
pub const DEFAULT_MAX_GAP: f64 = 0.02;

#[derive(Debug, Args)]
pub struct RegressArgs {
    /// Directory of the four runs (must be new or empty).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Scaling recipe of the `fp8` and `fp8-no-dgrad` modes: delayed or block.
    #[arg(long, default_value = "delayed")]
    pub recipe: String,
    #[command(flatten)]
    pub capture: CaptureFlags,
    /// Bound on every mode's final loss [default: floor + 0.35·(ln V − floor)].
    #[arg(long)]
    pub max_loss: Option<f64>,
    /// Bound on every mode's relative final-loss gap to bf16.
    #[arg(long, default_value_t = DEFAULT_MAX_GAP)]
    pub max_gap: f64,
}

/// One mode's result.
#[derive(Clone, Debug, Serialize)]
pub struct ModeResult {
    pub mode: String,
    pub dir: PathBuf,
    pub flags: Vec<String>,
    pub status: String,
    pub final_loss: Option<f64>,
    pub gap: Option<f64>,
    pub loss_ok: bool,
    pub gap_ok: bool,
    pub passed: bool,
    pub error: Option<String>,
}

/// What `regress` found.
#[derive(Clone, Debug, Serialize)]
pub struct RegressReport {
    pub passed: bool,
    pub max_loss: f64,
    /// How the loss bound was set: `flag` or `floor + 0.35·(ln V − floor)`.
    pub max_loss_from: String,
    pub max_gap: f64,
    pub entropy_floor: Option<f64>,
    pub ln_vocab: f64,
    pub modes: Vec<ModeResult>,
}

/// Records the four modes and checks their bounds.
pub fn regress(a: &RegressArgs) -> Result<RegressReport, AnalyzeError> {
    if !matches!(a.recipe.as_str(), "delayed" | "block") {
        return Err(AnalyzeError::Usage(format!("--recipe {}: regress's fp8 modes use delayed or block scaling", a.recipe)));
    }
    if !(a.max_gap >= 0.0 && a.max_gap.is_finite()) {
        return Err(AnalyzeError::Usage(format!("--max-gap must be a number ≥ 0, got {}", a.max_gap)));
    }
    if let Some(m) = a.max_loss
        && !m.is_finite()
    {
        return Err(AnalyzeError::Usage(format!("--max-loss must be a number, got {m}")));
    }
    let c = &a.capture;
    let driver = c.driver(&a.out)?;
    let common = c.common();
    let mode = |name: &str, recipe: &str, extra: &[&str], inject: bool| {
        let mut f = common.clone();
        f.extend(["--recipe".to_string(), recipe.to_string()]);
        if inject {
            f.extend(c.injections());
        }
        f.extend(extra.iter().map(|s| s.to_string()));
        RunSpec { name: name.into(), flags: f }
    };
    let specs = vec![
        mode("bf16", "bf16", &[], false),
        mode("fp8", &a.recipe, &[], true),
        mode("fp8-no-dgrad", &a.recipe, &["--bf16-gemms", "dgrad"], true),
        mode("fp8-current", "current", &[], true),
    ];
    let results = driver.run_all("regress", &specs);
    for r in &results {
        if r.bad_flags() {
            return Err(AnalyzeError::Usage(r.error.clone().unwrap_or_default()));
        }
    }
    require_usable(&results[0], &a.out)?;
    let m = Manifest::read(&results[0].dir)?;
    let (floor, ln_v) = (m.data.entropy_floor, m.data.ln_vocab);
    let (max_loss, from) = match (a.max_loss, floor) {
        (Some(x), _) => (x, "flag".to_string()),
        (None, Some(f)) => (f + DEFAULT_LOSS_FRACTION * (ln_v - f), format!("floor + {DEFAULT_LOSS_FRACTION}·(ln V − floor)")),
        (None, None) => (ln_v, "ln V (the data has no known floor)".to_string()),
    };
    let bf16 = results[0].final_loss;
    let modes: Vec<ModeResult> = results
        .iter()
        .map(|r| {
            let gap = relative_gap(r.final_loss, bf16);
            let ok_run = r.status == "completed";
            let loss_ok = ok_run && r.final_loss.is_some_and(|l| l <= max_loss);
            let gap_ok = ok_run && gap.is_some_and(|g| g <= a.max_gap);
            ModeResult {
                mode: r.name.clone(),
                dir: r.dir.clone(),
                flags: r.flags.clone(),
                status: r.status.clone(),
                final_loss: r.final_loss,
                gap,
                loss_ok,
                gap_ok,
                passed: loss_ok && gap_ok,
                error: r.error.clone(),
            }
        })
        .collect();
    Ok(RegressReport { passed: modes.iter().all(|m| m.passed), max_loss, max_loss_from: from, max_gap: a.max_gap, entropy_floor: floor, ln_vocab: ln_v, modes })
}

fn render(r: &RegressReport) -> String {
    let rows: Vec<Vec<String>> = r
        .modes
        .iter()
        .map(|m| {
            vec![
                m.mode.clone(),
                m.status.clone(),
                m.final_loss.map(num).unwrap_or("-".into()),
                format!("{} {}", if m.loss_ok { "≤" } else { ">" }, num(r.max_loss)),
                m.gap.map(|g| format!("{:+.2}%", 100.0 * g)).unwrap_or("-".into()),
                format!("{} {}", if m.gap_ok { "≤" } else { ">" }, pct(r.max_gap)),
                if m.passed { "pass".into() } else { "FAIL".into() },
            ]
        })
        .collect();
    let mut s = format!(
        "regress: loss bound {} ({}; floor {}, ln V {}), gap bound {} to bf16\n\n",
        num(r.max_loss),
        r.max_loss_from,
        r.entropy_floor.map(num).unwrap_or("-".into()),
        num(r.ln_vocab),
        pct(r.max_gap)
    );
    s += &output::table(&["mode", "status", "final loss", "loss bound", "gap", "gap bound", "result"], &rows);
    let failed: Vec<&str> = r.modes.iter().filter(|m| !m.passed).map(|m| m.mode.as_str()).collect();
    s += &if failed.is_empty() { "\n\nall modes pass\n".to_string() } else { format!("\n\nfailed: {}\n", failed.join(", ")) };
    s
}

/// The command. Findings (exit 1) when a mode passes its bound.
pub fn run(a: &RegressArgs, json: bool) -> Result<Outcome, AnalyzeError> {
    let r = regress(a)?;
    let _ = std::fs::write(a.out.join("regress.json"), output::json_text(&r));
    let stdout = if json { output::json_text(&r) } else { render(&r) };
    Ok(Outcome { stdout, findings: !r.passed })
}
