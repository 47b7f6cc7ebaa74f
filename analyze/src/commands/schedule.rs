//! `schedule --out DIR [capture flags]`: from which step, and which GEMM kind, sent back to BF16
//! recovers the FP8 run's loss gap at the least BF16 compute (the NVFP4 pretraining paper's App. D
//! question, answered by real runs).
//!
//! Records the BF16 baseline, `--noise-runs` BF16 replicas (the band), the FP8 run, then one run
//! per kind × switch step (`fp8-capture --bf16-gemms K --from-step S`, S the fractions
//! `--from` of the run's steps). Each schedule's **recovery** is 1 − gap / FP8 gap (final-loss gaps
//! to the baseline) and its **BF16 share** the part of the GEMM FLOPs it runs in BF16 (one kind of
//! three, for the steps after S: (1/3)·(steps − S)/steps). The answer is the schedule of the least
//! BF16 share whose gap is within the noise band, or, when none is, that recovers at least
//! `--target` of the gap. Exit status: 0 with an answer, 1 without one, 2 bad input.
//!
//! The FP8 run writes a checkpoint before every switch step (`--checkpoint-at`), and each schedule
//! that switches at step S > 1 resumes from it (`--resume fp8 --at-step S-1`): it trains only the
//! steps from S, whose steps before S would be the FP8 run's bit for bit. A schedule whose
//! checkpoint is missing (the FP8 run diverged before it), or that would train fewer than the 20
//! steps of a final loss, trains from the first step with `--from-step S` instead.

use crate::analysis::dynamics::relative_gap;
use crate::capture_driver::{CaptureFlags, RunSpec, require_usable};
use crate::commands::Outcome;
use crate::error::AnalyzeError;
use crate::output::{self, pct};
use clap::Args;
use fp8scope_schemas::names::Gemm;
use serde::Serialize;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ScheduleArgs {
    /// Directory of the runs and the answer (must be new or empty).
    #[arg(long)]
    pub out: PathBuf,
    /// Scaling recipe of the FP8 runs: delayed, current or block.
    #[arg(long, default_value = "delayed")]
    pub recipe: String,
    /// GEMM kinds to switch, one at a time.
    #[arg(long, value_delimiter = ',', default_value = "fprop,dgrad,wgrad")]
    pub kinds: Vec<String>,
    /// Switch steps as fractions of the run (0: from the first step).
    #[arg(long, value_delimiter = ',', default_value = "0,0.5,0.8")]
    pub from: Vec<f64>,
    /// Share of the FP8 gap a schedule must recover when none ends within the noise band.
    #[arg(long, default_value_t = 0.9)]
    pub target: f64,
    /// Train every schedule from the first step (`--from-step S`) instead of resuming it from the
    /// FP8 run's checkpoint before step S: the same answer, bit for bit, at more steps.
    #[arg(long)]
    pub from_scratch: bool,
    /// BF16 replicas for the noise band (`--init-jitter k`).
    #[arg(long, default_value_t = 1)]
    pub noise_runs: usize,
    #[command(flatten)]
    pub capture: CaptureFlags,
}

/// One schedule's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct ScheduleRow {
    pub name: String,
    pub kind: String,
    pub from_step: u32,
    pub bf16_share: f64,
    pub final_loss: Option<f64>,
    pub gap: Option<f64>,
    pub recovery: Option<f64>,
    /// |gap| within the noise band's largest replica gap.
    pub within_band: bool,
}

/// The answer (`--json`).
#[derive(Clone, Debug, Serialize)]
pub struct ScheduleReport {
    pub fp8_gap: Option<f64>,
    /// The largest |gap| of a BF16 replica to the baseline (None without replicas).
    pub band: Option<f64>,
    pub rows: Vec<ScheduleRow>,
    /// The schedule of the least BF16 share that ends within the band, else that recovers
    /// `--target`; None when no schedule does.
    pub answer: Option<ScheduleRow>,
    pub runs: usize,
    /// Schedules that resumed from the FP8 run's checkpoint instead of training from step 1.
    pub resumed: usize,
    /// Steps trained over every run (a resumed schedule counts only its steps after the switch).
    pub steps_trained: u64,
}

fn check(a: &ScheduleArgs) -> Result<Vec<Gemm>, AnalyzeError> {
    if !matches!(a.recipe.as_str(), "delayed" | "current" | "block") {
        return Err(AnalyzeError::Usage(format!("--recipe {}: schedule needs an FP8 recipe (delayed, current or block)", a.recipe)));
    }
    if let Some(f) = a.from.iter().find(|f| !(0.0..1.0).contains(*f)) {
        return Err(AnalyzeError::Usage(format!("--from {f}: each switch step is a fraction of the run in [0, 1)")));
    }
    if !(a.target > 0.0 && a.target <= 1.0) {
        return Err(AnalyzeError::Usage(format!("--target {}: a share of the gap in (0, 1]", a.target)));
    }
    a.kinds.iter().map(|k| Gemm::parse(k).ok_or_else(|| AnalyzeError::Usage(format!("--kinds {k}: one of fprop, dgrad, wgrad")))).collect()
}

/// Records the runs and answers.
pub fn schedule(a: &ScheduleArgs) -> Result<ScheduleReport, AnalyzeError> {
    let kinds = check(a)?;
    let c = &a.capture;
    let driver = c.driver(&a.out)?;
    let fp8_flags = |extra: &[String]| -> Vec<String> {
        let mut f = c.common();
        f.extend(["--recipe".into(), a.recipe.clone()]);
        f.extend(c.injections());
        f.extend(extra.iter().cloned());
        f
    };
    let bf16 = |extra: &[String]| -> Vec<String> {
        let mut f = c.common();
        f.extend(["--recipe".into(), "bf16".into()]);
        f.extend(extra.iter().cloned());
        f
    };
    // The switch steps, known before any run (the FP8 run checkpoints at them).
    let planned = c.planned_steps();
    let switch = |f: f64| (f * planned as f64).round() as u32;
    // A switch at step S (its first step in BF16) resumes from the checkpoint after step S − 1.
    let resumable: Vec<u32> = a.from.iter().map(|&f| switch(f)).filter(|&s| !a.from_scratch && s > 1 && planned.saturating_sub(s - 1) >= FINAL_STEPS).collect();
    let mut fp8_extra = Vec::new();
    if !resumable.is_empty() {
        fp8_extra.extend(["--checkpoint-at".to_string(), resumable.iter().map(|s| (s - 1).to_string()).collect::<Vec<_>>().join(",")]);
    }
    let mut first = vec![RunSpec { name: "baseline".into(), flags: bf16(&[]) }, RunSpec { name: "fp8".into(), flags: fp8_flags(&fp8_extra) }];
    for k in 1..=a.noise_runs {
        first.push(RunSpec { name: format!("replica-{k}"), flags: bf16(&["--init-jitter".into(), k.to_string()]) });
    }
    let results = driver.run_all("record", &first);
    if let Some(r) = results.iter().find(|r| r.bad_flags()) {
        return Err(AnalyzeError::Usage(r.error.clone().unwrap_or_default()));
    }
    require_usable(&results[0], &a.out)?;
    let base = results[0].final_loss;
    let fp8_gap = relative_gap(results[1].final_loss, base);
    let band = results[2..].iter().filter_map(|r| relative_gap(r.final_loss, base)).map(f64::abs).reduce(f64::max);
    let steps = results[0].steps_completed.max(1);
    let fp8_dir = driver.dir("fp8");
    let mut specs = Vec::new();
    let mut plan = Vec::new();
    // The checkpoint step each schedule resumed from (None: trained from step 1).
    let mut resumed_at = Vec::new();
    for k in &kinds {
        for &f in &a.from {
            let from_step = switch(f);
            let name = format!("bf16-{}-from-{from_step}", k.as_str());
            let mut extra = vec!["--bf16-gemms".to_string(), k.as_str().into()];
            let at = (resumable.contains(&from_step) && fp8_capture::checkpoint::path(&fp8_dir, from_step - 1).is_file()).then(|| from_step - 1);
            match at {
                Some(at) => extra.extend(["--resume".into(), fp8_dir.display().to_string(), "--at-step".into(), at.to_string()]),
                None if from_step > 0 => extra.extend(["--from-step".into(), from_step.to_string()]),
                None => {}
            }
            specs.push(RunSpec { name: name.clone(), flags: fp8_flags(&extra) });
            plan.push((name, k.as_str().to_string(), from_step));
            resumed_at.push(at);
        }
    }
    let routed = driver.run_all("schedule", &specs);
    let rows: Vec<ScheduleRow> = routed
        .iter()
        .zip(plan)
        .map(|(r, (name, kind, from_step))| {
            let gap = if r.usable() { relative_gap(r.final_loss, base) } else { None };
            let recovery = match (gap, fp8_gap) {
                (Some(g), Some(f)) if f.abs() > 0.0 => Some(1.0 - g.abs() / f.abs()),
                _ => None,
            };
            ScheduleRow {
                name,
                kind,
                from_step,
                bf16_share: (steps - from_step.min(steps)) as f64 / steps as f64 / 3.0,
                final_loss: r.final_loss,
                gap,
                recovery,
                within_band: matches!((gap, band), (Some(g), Some(b)) if g.abs() <= b),
            }
        })
        .collect();
    let cheapest = |ok: &dyn Fn(&ScheduleRow) -> bool| rows.iter().filter(|r| ok(r)).min_by(|x, y| x.bf16_share.total_cmp(&y.bf16_share)).cloned();
    let answer = cheapest(&|r| r.within_band).or_else(|| cheapest(&|r| r.recovery.is_some_and(|x| x >= a.target)));
    let trained: u64 = routed.iter().zip(&resumed_at).map(|(r, at)| u64::from(r.steps_completed.saturating_sub(at.unwrap_or(0)))).sum::<u64>()
        + results.iter().map(|r| u64::from(r.steps_completed)).sum::<u64>();
    let resumed = resumed_at.iter().flatten().count();
    Ok(ScheduleReport { fp8_gap, band, rows, answer, runs: results.len() + routed.len(), resumed, steps_trained: trained })
}

/// The final loss is the mean of the last this many steps: a resumed schedule trains at least as many.
const FINAL_STEPS: u32 = 20;

/// The command.
pub fn run(a: &ScheduleArgs, json: bool) -> Result<Outcome, AnalyzeError> {
    let r = schedule(a)?;
    let _ = std::fs::write(a.out.join("schedule.json"), output::json_text(&r));
    let stdout = if json { output::json_text(&r) } else { render(&r, a.target) };
    Ok(Outcome { stdout, findings: r.answer.is_none() })
}

fn render(r: &ScheduleReport, target: f64) -> String {
    let g = |x: Option<f64>| x.map(|v| format!("{:+.2}%", 100.0 * v)).unwrap_or_else(|| "-".into());
    let mut s = format!("schedule: FP8 gap {} to the BF16 baseline; noise band {}\n\n", g(r.fp8_gap), r.band.map(pct).unwrap_or_else(|| "not measured".into()));
    let rows: Vec<Vec<String>> = r
        .rows
        .iter()
        .map(|x| {
            vec![
                x.kind.clone(),
                x.from_step.to_string(),
                pct(x.bf16_share),
                g(x.gap),
                x.recovery.map(pct).unwrap_or_else(|| "-".into()),
                if x.within_band { "yes".into() } else { "no".into() },
            ]
        })
        .collect();
    s += &output::table(&["kind in BF16", "from step", "BF16 share of GEMM FLOPs", "gap", "recovered", "within band"], &rows);
    s += "\n\n";
    s += &match &r.answer {
        Some(a) => format!(
            "answer: {} in BF16 from step {} ({} of the GEMM FLOPs in BF16) {} (gap {}, {} of the FP8 gap recovered).\n",
            a.kind,
            a.from_step,
            pct(a.bf16_share),
            if a.within_band { "ends within the noise band" } else { "recovers the target share" },
            g(a.gap),
            a.recovery.map(pct).unwrap_or_else(|| "-".into())
        ),
        None => format!("answer: no schedule tried ends within the noise band or recovers {} of the gap.\n", pct(target)),
    };
    s += &format!(
        "{} runs, {} steps trained ({} schedule(s) resumed from the FP8 run's checkpoints instead of training from step 1).\n",
        r.runs, r.steps_trained, r.resumed
    );
    s
}
