//! `ranks RUN`: its argument and its rendering; the checks are [`crate::analysis::ranks`].
//!
//! Text: a one-line verdict, the findings by first step (one line each: step, check, tensor, ranks,
//! group, magnitude), what could not be checked, and a per-rank table (status, steps, median and
//! p90 step time, the checks that name the rank). JSON: [`RanksReport`] as one object.

use crate::analysis::ranks::finding::Finding;
use crate::analysis::ranks::rules::{TEXT_FINDINGS, TEXT_RANKS};
use crate::analysis::ranks::{RanksReport, check_ranks};
use crate::commands::Outcome;
use crate::error::AnalyzeError;
use crate::load::{LoadOptions, Run, compact_ranks};
use crate::output::{self, num};
use clap::Args;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct RanksArgs {
    /// The run directory (holds run.json), recorded by one or several ranks.
    pub run: PathBuf,
}

/// The command: exit status 1 when anything is found.
pub fn run(args: &RanksArgs, opts: LoadOptions, json: bool) -> Result<Outcome, AnalyzeError> {
    if let Some(r) = opts.rank {
        return Err(AnalyzeError::Usage(format!("--rank {r}: `ranks` compares every rank of the run; leave --rank out")));
    }
    let run = Run::open(&args.run, opts)?;
    let report = check_ranks(&run, opts.lenient)?;
    let stdout = if json { output::json_text(&report) } else { render(&report) };
    Ok(Outcome { stdout, findings: !report.findings.is_empty() })
}

/// `layers.0.fc1.weight (fprop)`: the operand, and the GEMM whose cast it is (a weight is cast for
/// fprop and for dgrad, each a row of its own).
fn tensor(f: &Finding) -> String {
    match (&f.module, &f.role) {
        (Some(m), Some(r)) => format!("{m}.{r}{}", f.gemm.as_deref().map(|g| format!(" ({g})")).unwrap_or_default()),
        (Some(m), None) => m.clone(),
        _ => "-".into(),
    }
}

/// The text output.
pub fn render(r: &RanksReport) -> String {
    let ranks_with_findings: BTreeSet<u32> = r.findings.iter().flat_map(|f| f.ranks.iter().copied()).collect();
    let groups = if r.groups.is_empty() {
        "no groups declared".to_string()
    } else {
        r.groups.iter().map(|g| format!("{} {}×{}", g.name, g.instances, g.size)).collect::<Vec<_>>().join(", ")
    };
    let mut o = if r.findings.is_empty() {
        format!("ranks of '{}': clean — {} rank(s) of world {} agree ({groups}; {} steps)\n", r.run, r.checked.ranks, r.world_size, r.steps)
    } else {
        let checks: BTreeSet<&str> = r.findings.iter().map(|f| f.check).collect();
        format!(
            "ranks of '{}': {} finding(s) naming {} rank(s) of world {} — {} ({groups}; {} steps)\n",
            r.run,
            r.findings.len(),
            ranks_with_findings.len(),
            r.world_size,
            checks.into_iter().collect::<Vec<_>>().join(", "),
            r.steps
        )
    };
    if !r.findings.is_empty() {
        let rows: Vec<Vec<String>> = r
            .findings
            .iter()
            .take(TEXT_FINDINGS)
            .map(|f| {
                vec![
                    f.step.map_or("-".into(), |s| s.to_string()),
                    f.check.to_string(),
                    tensor(f),
                    compact_ranks(&f.ranks),
                    f.group.clone().unwrap_or_else(|| "-".into()),
                    f.magnitude.clone(),
                ]
            })
            .collect();
        o += "\n";
        o += &output::table(&["step", "check", "tensor", "ranks", "group", "magnitude"], &rows);
        o += "\n";
        if r.findings.len() > TEXT_FINDINGS {
            o += &format!("… and {} more finding(s) (--json lists all)\n", r.findings.len() - TEXT_FINDINGS);
        }
    }
    if !r.checked.not_checked.is_empty() {
        o += "\nnot checked:\n";
        for n in &r.checked.not_checked {
            o += &format!("  - {n}\n");
        }
    }
    // Per rank: status, steps, step time, the checks that name it.
    let mut checks_of: BTreeMap<u32, BTreeSet<&str>> = BTreeMap::new();
    for f in &r.findings {
        for k in &f.ranks {
            checks_of.entry(*k).or_default().insert(f.check);
        }
    }
    let mut all: BTreeSet<u32> = r.liveness.iter().map(|l| l.rank).collect();
    all.extend(r.step_ms.iter().map(|s| s.rank));
    let usual = |k: u32| -> bool {
        !checks_of.contains_key(&k)
            && r.liveness.iter().find(|l| l.rank == k).is_none_or(|l| !l.stopped && matches!(l.status.as_str(), "completed" | "running"))
    };
    let listed: Vec<u32> = if all.len() <= TEXT_RANKS { all.iter().copied().collect() } else { all.iter().copied().filter(|&k| !usual(k)).collect() };
    let rows: Vec<Vec<String>> = listed
        .iter()
        .map(|&k| {
            let l = r.liveness.iter().find(|l| l.rank == k);
            let s = r.step_ms.iter().find(|s| s.rank == k);
            let status = match l {
                Some(l) if l.stopped => "stopped".to_string(),
                Some(l) => l.status.clone(),
                None => "-".into(),
            };
            vec![
                k.to_string(),
                status,
                l.and_then(|l| l.steps_completed).map_or_else(|| s.map_or("-".into(), |s| s.steps.to_string()), |n| n.to_string()),
                s.map_or("-".into(), |s| num(s.median_ms)),
                s.map_or("-".into(), |s| num(s.p90_ms)),
                checks_of.get(&k).map_or("-".into(), |c| c.iter().copied().collect::<Vec<_>>().join(", ")),
            ]
        })
        .collect();
    o += "\n";
    if !rows.is_empty() {
        o += &output::table(&["rank", "status", "steps", "median ms", "p90 ms", "findings"], &rows);
        o += "\n";
    }
    let rest = all.len() - listed.len();
    if rest > 0 {
        let medians: Vec<f64> = r.step_ms.iter().filter(|s| usual(s.rank)).map(|s| s.median_ms).collect();
        let (lo, hi) = medians.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
        let times = if medians.is_empty() { String::new() } else { format!(", median step {}–{} ms", num(lo), num(hi)) };
        o += &format!("{} other rank(s): no finding, completed or running{times}\n", rest);
    }
    o
}
