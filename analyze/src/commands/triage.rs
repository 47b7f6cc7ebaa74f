//! `triage --out DIR [capture flags]`: the whole debugging method, automated.
//!
//! 1. Record the BF16 baseline and the FP8 run (with tensor dumps and shadow GEMMs, so that
//!    `locate` has direct per-GEMM evidence) in parallel.
//! 2. [`find_anomalies`] of the FP8 run against the baseline: nothing found → healthy, stop.
//! 3. Send each GEMM kind back to BF16 (`--bf16-gemms fprop|dgrad|wgrad`), try current scaling,
//!    and (for delayed scaling) a 16-step amax history, which tells a lagging scale from a fault in
//!    the cast itself: up to five runs in parallel. A run *cures* when `find_anomalies` finds
//!    nothing in it.
//! 4. Bisect the sites of the curing kind(s) (all kinds when none cures alone) with
//!    `--bf16-sites layers.i.m:gemm,…`: candidates ordered by the first non-finite GEMM, then (for
//!    a spike) the GEMMs whose casts saturated at the spike's first step, then
//!    [`locate`]'s ranking of the FP8 run; the top-ranked single sites first (one per job), then a
//!    prefix search that finds culprits one at a time (the smallest prefix of the ordered
//!    candidates that cures ends in a culprit), until the culprits found cure the run on their own.
//! 5. The verdict: the anomaly, the culprits (a minimal set whose return to BF16 cures the run),
//!    whether current scaling cures it, and every run with its flags and outcome.
//!
//! Every run stays under `--out/<name>/`, its log under `--out/logs/`, its anomaly report under
//! `--out/reports/<name>.anomalies.json` (and `fp8.locate.json`), the verdict in
//! `--out/verdict.json` and `--out/verdict.txt`. Exit status: 0 healthy, 1 anomaly, 2 bad input.

use crate::capture_driver::{require_usable, CaptureFlags, Driver, RunResult, RunSpec};
use crate::cli::{DEFAULT_COSINE_THRESHOLD, DEFAULT_DRIFT_STEPS, DEFAULT_DRIFT_THRESHOLD};
use crate::commands::anomalies::{find_anomalies, AnomalyParams, AnomalyReport};
use crate::commands::locate::{evidence, locate, saturated_at, LocateReport, OperandEvidence};
use crate::commands::Outcome;
use crate::error::AnalyzeError;
use crate::load::{LoadOptions, Run};
use crate::output::{self, num, pct};
use clap::Args;
use fp8scope_schemas::names::{Gemm, Module};
use fp8scope_schemas::config::AmaxAlgo;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

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
    /// Dump tensors and record shadow GEMMs in the FP8 run every N steps (0: no dumps; candidates
    /// are then tried in execution order).
    #[arg(long, default_value_t = 25)]
    pub dump_every: u32,
    /// Most runs the site bisection may record.
    #[arg(long, default_value_t = 40)]
    pub max_runs: usize,
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
    fn name(&self) -> String {
        format!("layers.{}.{}.{}", self.layer, self.module, self.gemm)
    }
}

/// How one run ended and what the analyzer found in it.
#[derive(Clone, Debug, Serialize)]
pub struct RunOutcome {
    /// What the run is for: baseline, fp8, kind, current, bisect, all-gemms.
    pub purpose: String,
    /// completed, diverged, crashed, failed, or reused (a `--baseline-run`).
    pub status: String,
    pub steps_completed: u32,
    /// Mean loss of the last 20 steps.
    pub final_loss: Option<f64>,
    /// (final_loss − baseline's) / baseline's.
    pub gap: Option<f64>,
    /// spike, drift or nan; None when healthy or not analysed.
    pub anomaly: Option<String>,
    /// Whether the run shows no anomaly against the baseline (None for the baseline).
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

/// A GEMM whose casts saturated at least this fraction at a spike's first step is bisected first.
const SPIKE_LEAD_SATURATION: f64 = 0.01;

/// Steps of amax history of the triage run that tells a lagging delayed scale from other faults.
pub const SHORT_HISTORY: u32 = 16;

/// The verdict (`--json`).
#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    pub healthy: bool,
    pub anomaly: Option<String>,
    pub culprits: Vec<Culprit>,
    pub current_scaling_cures: bool,
    pub runs: Vec<RunEntry>,
}

/// The anomaly class of a report: nan before spike before drift.
pub fn classify(r: &AnomalyReport) -> Option<&'static str> {
    if r.nonfinite.found() {
        Some("nan")
    } else if r.spiked() {
        Some("spike")
    } else if r.drift.is_some() {
        Some("drift")
    } else {
        None
    }
}

/// The state of one triage: the driver, the baseline, every run so far.
struct Triage<'a> {
    driver: Driver,
    base: Run,
    base_loss: Option<f64>,
    runs: Vec<RunEntry>,
    reports: BTreeMap<String, AnomalyReport>,
    out: &'a Path,
    /// The FP8 run's delayed scaling takes the most recent amax (history ignored).
    fp8_most_recent: bool,
    /// For a spike: each culprit's operands at the spike's first step.
    spike_evidence: BTreeMap<String, (i64, Vec<OperandEvidence>)>,
}

impl Triage<'_> {
    fn save(&self, name: &str, what: &str, value: &impl Serialize) {
        let dir = self.out.join("reports");
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(dir.join(format!("{name}.{what}.json")), output::json_text(value));
    }

    /// Runs `specs` in parallel, analyses each against the baseline, records them; returns
    /// whether each cured.
    fn batch(&mut self, label: &str, purpose: &str, specs: &[RunSpec]) -> Result<Vec<bool>, AnalyzeError> {
        let results = self.driver.run_all(label, specs);
        let mut cured = Vec::new();
        for r in results {
            if r.bad_flags() {
                return Err(AnalyzeError::Usage(r.error.clone().unwrap_or_default()));
            }
            let (ok, anomaly, error) = if r.usable() {
                let run = Run::open(&r.dir, LoadOptions::default())?;
                let rep = find_anomalies(&run, Some(&self.base), AnomalyParams::defaults())?;
                self.save(&r.name, "anomalies", &rep);
                let a = classify(&rep);
                self.reports.insert(r.name.clone(), rep);
                (a.is_none(), a.map(str::to_string), None)
            } else {
                (false, None, r.error.clone())
            };
            cured.push(ok);
            self.push(&r, purpose, anomaly, Some(ok), error);
        }
        Ok(cured)
    }

    fn push(&mut self, r: &RunResult, purpose: &str, anomaly: Option<String>, cured: Option<bool>, error: Option<String>) {
        let gap = match (r.final_loss, self.base_loss) {
            (Some(l), Some(b)) if b != 0.0 => Some((l - b) / b.abs()),
            _ => None,
        };
        self.runs.push(RunEntry {
            name: r.name.clone(),
            dir: r.dir.clone(),
            flags: r.flags.clone(),
            outcome: RunOutcome {
                purpose: purpose.into(),
                status: r.status.clone(),
                steps_completed: r.steps_completed,
                final_loss: r.final_loss,
                gap,
                anomaly,
                cured,
                error,
            },
        });
    }

    fn entry(&self, name: &str) -> Option<&RunEntry> {
        self.runs.iter().find(|e| e.name == name)
    }
}

/// Checks that a reused baseline is a BF16 run of the same preset, seed, steps, scenario and scenario step.
fn check_baseline(base: &Run, c: &CaptureFlags) -> Result<(), AnalyzeError> {
    let cfg = &base.manifest.config;
    let mut diffs = Vec::new();
    if cfg.recipe.kind.as_str() != "bf16" {
        diffs.push(format!("its recipe is {}, not bf16", cfg.recipe.kind.as_str()));
    }
    if cfg.preset != c.preset {
        diffs.push(format!("preset {} vs {}", cfg.preset, c.preset));
    }
    if cfg.train.seed != c.seed {
        diffs.push(format!("seed {} vs {}", cfg.train.seed, c.seed));
    }
    if let Some(s) = c.steps
        && cfg.train.steps != s
    {
        diffs.push(format!("steps {} vs {s}", cfg.train.steps));
    }
    if cfg.scenario != c.scenario {
        diffs.push(format!("scenario {:?} vs {:?}", cfg.scenario, c.scenario));
    }
    if cfg.scenario_step != c.scenario_step {
        diffs.push(format!("scenario step {:?} vs {:?}", cfg.scenario_step, c.scenario_step));
    }
    if !base.manifest.finished() || base.manifest.status.as_str() != "completed" {
        diffs.push(format!("it is {}", base.manifest.status.as_str()));
    }
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(AnalyzeError::Usage(format!("--baseline-run {}: {}", base.dir.display(), diffs.join("; "))))
    }
}

/// Orders the candidate GEMMs: the first non-finite one, then by locate's score, then in
/// execution order (the order `all` is given in).
fn order_candidates(all: &[Culprit], loc: Option<&LocateReport>, leads: &[String]) -> Vec<Culprit> {
    let mut rank: BTreeMap<String, usize> = BTreeMap::new();
    if let Some(l) = loc {
        for (i, g) in l.ranked.iter().enumerate() {
            rank.insert(g.gemm_name.clone(), leads.len() + i);
        }
    }
    for (i, name) in leads.iter().enumerate().rev() {
        rank.insert(name.clone(), i);
    }
    let mut v: Vec<(usize, usize, Culprit)> = all.iter().enumerate().map(|(i, c)| (rank.get(&c.name()).copied().unwrap_or(usize::MAX), i, c.clone())).collect();
    v.sort();
    v.into_iter().map(|x| x.2).collect()
}

/// Runs the triage.
pub fn triage(a: &TriageArgs) -> Result<Verdict, AnalyzeError> {
    if !matches!(a.recipe.as_str(), "delayed" | "current" | "block") {
        return Err(AnalyzeError::Usage(format!("--recipe {}: triage needs an FP8 recipe (delayed, current or block)", a.recipe)));
    }
    let c = &a.capture;
    let out = a.out.as_path();
    let driver = c.driver(out)?;
    let jobs = driver.jobs;
    let common = c.common();
    let fp8_flags = |extra: &[String]| -> Vec<String> {
        let mut f = common.clone();
        f.extend(["--recipe".into(), a.recipe.clone()]);
        f.extend(c.injections());
        f.extend(extra.iter().cloned());
        f
    };

    // 1. Baseline and FP8 run.
    let mut first = Vec::new();
    let dump = if a.dump_every > 0 { vec!["--dump-every".to_string(), a.dump_every.to_string(), "--shadow".into()] } else { Vec::new() };
    if a.baseline_run.is_none() {
        // The baseline dumps the same tensors, so that the FP8 run can be compared with it
        // tensor by tensor (compare, the report's cosine heatmap).
        let mut f = common.clone();
        f.extend(["--recipe".into(), "bf16".into()]);
        f.extend(dump.iter().take(2).cloned());
        first.push(RunSpec { name: "baseline".into(), flags: f });
    }
    first.push(RunSpec { name: "fp8".into(), flags: fp8_flags(&dump) });
    let results = driver.run_all("record", &first);
    for r in &results {
        if r.bad_flags() {
            return Err(AnalyzeError::Usage(r.error.clone().unwrap_or_default()));
        }
    }
    let (base_dir, base_result) = match &a.baseline_run {
        Some(d) => (d.clone(), None),
        None => (results[0].dir.clone(), Some(results[0].clone())),
    };
    if let Some(r) = &base_result {
        require_usable(r, out)?;
    }
    let base = Run::open(&base_dir, LoadOptions::default())?;
    if a.baseline_run.is_some() {
        check_baseline(&base, c)?;
    }
    let fp8_result = results.last().cloned().ok_or_else(|| AnalyzeError::usage("no FP8 run"))?;
    require_usable(&fp8_result, out)?;
    let base_loss = base.manifest.final_loss;
    let mut t = Triage { driver, base, base_loss, runs: Vec::new(), reports: BTreeMap::new(), out, fp8_most_recent: false, spike_evidence: BTreeMap::new() };
    match base_result {
        Some(r) => t.push(&r, "baseline", None, None, None),
        None => {
            let m = &t.base.manifest;
            t.runs.push(RunEntry {
                name: m.name.clone(),
                dir: base_dir.clone(),
                flags: m.command.iter().skip(2).cloned().collect(),
                outcome: RunOutcome {
                    purpose: "baseline".into(),
                    status: "reused".into(),
                    steps_completed: m.steps_completed,
                    final_loss: m.final_loss,
                    gap: Some(0.0),
                    anomaly: None,
                    cured: None,
                    error: None,
                },
            });
        }
    }

    // 2. Anomalies of the FP8 run.
    let fp8_run = Run::open(&fp8_result.dir, LoadOptions::default())?;
    t.fp8_most_recent = fp8_run.manifest.config.recipe.amax_algo == AmaxAlgo::MostRecent;
    let rep = find_anomalies(&fp8_run, Some(&t.base), AnomalyParams::defaults())?;
    t.save("fp8", "anomalies", &rep);
    let anomaly = classify(&rep).map(str::to_string);
    t.reports.insert("fp8".into(), rep.clone());
    t.push(&fp8_result, "fp8", anomaly.clone(), Some(anomaly.is_none()), None);
    let Some(anomaly) = anomaly else {
        return Ok(Verdict { healthy: true, anomaly: None, culprits: Vec::new(), current_scaling_cures: false, runs: t.runs });
    };

    // 3. Each GEMM kind back to BF16, and current scaling, in one batch.
    let mut specs: Vec<RunSpec> = Gemm::ALL
        .iter()
        .map(|g| RunSpec { name: format!("bf16-{}", g.as_str()), flags: fp8_flags(&["--bf16-gemms".into(), g.as_str().into()]) })
        .collect();
    let try_current = a.recipe != "current";
    if try_current {
        let mut f = common.clone();
        f.extend(["--recipe".into(), "current".into()]);
        f.extend(c.injections());
        specs.push(RunSpec { name: "current".into(), flags: f });
    }
    // Delayed scaling lags: the same run with the max of a short amax history tells a stale
    // history (the outlier's amax remembered for many steps, or one quiet step's amax taken as the
    // forecast of the next) from a fault in the cast itself.
    let try_short_history = a.recipe == "delayed" && !common.iter().any(|f| f.starts_with("--amax-history") || f.starts_with("--amax-algo"));
    if try_short_history {
        let f = ["--amax-algo".into(), "max".into(), "--amax-history".into(), SHORT_HISTORY.to_string()];
        specs.push(RunSpec { name: "short-history".into(), flags: fp8_flags(&f) });
    }
    let cured = t.batch("kinds", "kind", &specs)?;
    let current_scaling_cures = try_current && cured.get(3).copied().unwrap_or(false);
    for e in t.runs.iter_mut().filter(|e| e.name == "current" || e.name == "short-history") {
        e.outcome.purpose = e.name.clone();
    }
    let curing: Vec<Gemm> = Gemm::ALL.iter().zip(&cured).filter(|(_, c)| **c).map(|(g, _)| *g).collect();

    // 4. Bisect the sites of the curing kinds (all kinds when none cures alone).
    let n_layers = fp8_run.manifest.config.model.layers;
    let kinds: Vec<Gemm> = if curing.is_empty() { Gemm::ALL.to_vec() } else { curing.clone() };
    let mut all = Vec::new();
    for g in &kinds {
        for l in 0..n_layers {
            for m in Module::ALL {
                all.push(Culprit { layer: l, module: m.as_str().into(), gemm: g.as_str().into() });
            }
        }
    }
    let loc = if a.dump_every > 0 { locate(&fp8_run, None, DEFAULT_COSINE_THRESHOLD).ok() } else { None };
    if let Some(l) = &loc {
        t.save("fp8", "locate", l);
    }
    // Leads, most suspect first: the first non-finite GEMM; for a spike, the GEMMs whose casts
    // saturated at its first step, most saturated first.
    let mut leads: Vec<String> = rep.nonfinite.first_tensor.as_ref().and_then(|x| Some(format!("layers.{}.{}.{}", x.layer, x.module, x.gemm.clone()?))).into_iter().collect();
    let spike_start = rep.counted_gap_spikes().first().map(|s| s.start).filter(|_| anomaly == "spike");
    if let Some(step) = spike_start {
        leads.extend(saturated_at(&fp8_run, step)?.into_iter().filter(|(_, f)| *f >= SPIKE_LEAD_SATURATION).map(|(n, _)| n));
    }
    let pool = order_candidates(&all, loc.as_ref(), &leads);
    let mut notes = Vec::new();
    let mut full_cures = !curing.is_empty();
    if curing.is_empty() {
        let spec = RunSpec { name: "bf16-all-gemms".into(), flags: fp8_flags(&["--bf16-gemms".into(), "fprop,dgrad,wgrad".into()]) };
        full_cures = t.batch("all-gemms", "all-gemms", &[spec])?[0];
        if !full_cures {
            notes.push("the anomaly persists with every FP8 GEMM in BF16: it does not come from the FP8 GEMMs".to_string());
        }
    }
    let culprits = if full_cures { bisect(&mut t, &fp8_flags(&[]), &pool, jobs, a.max_runs, &mut notes)? } else { Vec::new() };
    let complete = full_cures && !notes.iter().any(|n| n.contains("--max-runs") || n.contains("ran out"));

    if let Some(step) = spike_start {
        for c in &culprits {
            t.spike_evidence.insert(c.name(), (step, evidence(&fp8_run, &(c.layer as i64, c.module.clone(), c.gemm.clone()), step)?));
        }
    }
    let verdict = Verdict { healthy: false, anomaly: Some(anomaly), culprits, current_scaling_cures, runs: t.runs.clone() };
    let text = render(&verdict, &t, &rep, loc.as_ref(), &kinds, &curing, &notes, complete);
    let _ = std::fs::write(out.join("verdict.txt"), &text);
    Ok(verdict)
}

/// Finds a minimal set of candidates whose return to BF16 cures the run. `pool` is ordered, most
/// suspect first; routing all of it to BF16 is known to cure.
fn bisect(t: &mut Triage, fp8: &[String], pool: &[Culprit], jobs: usize, max_runs: usize, notes: &mut Vec<String>) -> Result<Vec<Culprit>, AnalyzeError> {
    let mut memo: BTreeMap<Vec<usize>, bool> = BTreeMap::new();
    let mut n_runs = 0usize;
    // Tests sets of pool indices in parallel; returns whether each cures.
    let test = |t: &mut Triage, sets: Vec<Vec<usize>>, memo: &mut BTreeMap<Vec<usize>, bool>, n_runs: &mut usize| -> Result<Vec<bool>, AnalyzeError> {
        let mut todo: Vec<Vec<usize>> = Vec::new();
        for s in &sets {
            let mut k = s.clone();
            k.sort_unstable();
            if !memo.contains_key(&k) && !todo.contains(&k) {
                todo.push(k);
            }
        }
        let specs: Vec<RunSpec> = todo
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let sites: Vec<String> = s.iter().map(|&j| pool[j].site_flag()).collect();
                let mut f = fp8.to_vec();
                f.extend(["--bf16-sites".into(), sites.join(",")]);
                RunSpec { name: format!("bisect-{:02}", *n_runs + i + 1), flags: f }
            })
            .collect();
        *n_runs += specs.len();
        let cured = t.batch("bisect", "bisect", &specs)?;
        for (k, c) in todo.into_iter().zip(cured) {
            memo.insert(k, c);
        }
        Ok(sets
            .into_iter()
            .map(|mut s| {
                s.sort_unstable();
                memo[&s]
            })
            .collect())
    };

    // Single sites, the top-ranked first, one per job.
    let singles: Vec<Vec<usize>> = (0..pool.len().min(jobs.max(1))).map(|i| vec![i]).collect();
    let res = test(t, singles.clone(), &mut memo, &mut n_runs)?;
    if let Some(i) = res.iter().position(|&c| c) {
        return Ok(vec![pool[singles[i][0]].clone()]);
    }

    // Prefix search: the smallest prefix of the remaining pool that cures (with the culprits found
    // so far) ends in a culprit.
    let mut needed: Vec<usize> = Vec::new();
    let mut rest: Vec<usize> = (0..pool.len()).collect();
    loop {
        if !needed.is_empty() {
            if test(t, vec![needed.clone()], &mut memo, &mut n_runs)?[0] {
                break;
            }
        }
        if rest.is_empty() {
            notes.push("the bisection ran out of candidates before the run was cured (the faults interact)".into());
            break;
        }
        let (mut lo, mut hi) = (0usize, rest.len()); // prefix lo fails (lo = 0: nothing more), hi cures
        while hi - lo > 1 {
            if n_runs >= max_runs {
                notes.push(format!("the bisection stopped at --max-runs {max_runs}; the culprits listed are only part of a curing set"));
                let mut found: Vec<Culprit> = needed.iter().map(|&i| pool[i].clone()).collect();
                found.sort();
                return Ok(found);
            }
            let p = jobs.max(1).min(hi - lo - 1);
            let mut ks: Vec<usize> = (1..=p).map(|j| lo + (hi - lo) * j / (p + 1)).filter(|&k| k > lo && k < hi).collect();
            ks.dedup();
            let sets: Vec<Vec<usize>> = ks.iter().map(|&k| needed.iter().copied().chain(rest[..k].iter().copied()).collect()).collect();
            let res = test(t, sets, &mut memo, &mut n_runs)?;
            let new_hi = ks.iter().zip(&res).filter(|(_, c)| **c).map(|(k, _)| *k).min().unwrap_or(hi);
            let new_lo = ks.iter().zip(&res).filter(|(k, c)| !**c && **k < new_hi).map(|(k, _)| *k).max().unwrap_or(lo);
            hi = new_hi;
            lo = new_lo;
        }
        needed.push(rest[hi - 1]);
        rest.truncate(hi - 1);
    }
    let mut found: Vec<Culprit> = needed.iter().map(|&i| pool[i].clone()).collect();
    found.sort();
    Ok(found)
}

fn describe_anomaly(r: &AnomalyReport) -> String {
    let mut parts = Vec::new();
    if let Some(s) = r.nonfinite.first_loss_step {
        parts.push(format!("the loss is non-finite from step {s}"));
    }
    if let Some(x) = &r.nonfinite.first_tensor {
        parts.push(format!("first non-finite tensor {} at step {}", x.tensor, x.step));
    }
    for s in r.counted_gap_spikes() {
        parts.push(format!(
            "a spike against the baseline from step {} peaking at {} (loss {} vs {}, gap {:+.1}%, z = {}), {}",
            s.start,
            s.peak,
            num(s.peak_loss),
            num(s.peak_base_loss),
            100.0 * s.peak_gap,
            num(s.peak_z),
            output::back_in_band(s.recovery)
        ));
    }
    if let Some(d) = &r.drift {
        parts.push(format!("drift from step {} (confirmed at {}), final smoothed gap {:+.2}%", d.first_step, d.confirmed_step, 100.0 * d.final_gap));
    }
    if parts.is_empty() { "no anomaly".into() } else { parts.join("; ") }
}

fn gap_text(e: &RunEntry) -> String {
    match (e.outcome.status.as_str(), e.outcome.gap) {
        ("diverged", _) => format!("diverged at step {}", e.outcome.steps_completed),
        (_, Some(g)) => format!("{:+.2}%", 100.0 * g),
        (s, None) => s.to_string(),
    }
}

#[allow(clippy::too_many_arguments)]
fn render(v: &Verdict, t: &Triage, fp8: &AnomalyReport, loc: Option<&LocateReport>, kinds: &[Gemm], curing: &[Gemm], notes: &[String], complete: bool) -> String {
    let mut s = String::new();
    let base = t.runs.iter().find(|e| e.outcome.purpose == "baseline");
    s += &format!(
        "triage: runs under {}\n\n1. baseline (bf16) final loss {}; FP8 run final loss {} ({}): {}\n",
        t.out.display(),
        base.and_then(|b| b.outcome.final_loss).map(num).unwrap_or("-".into()),
        t.entry("fp8").and_then(|e| e.outcome.final_loss).map(num).unwrap_or("-".into()),
        t.entry("fp8").map(gap_text).unwrap_or_default(),
        describe_anomaly(fp8)
    );
    let table_of = |purposes: &[&str], col: &str, what: &dyn Fn(&RunEntry) -> String| -> String {
        let rows: Vec<Vec<String>> = t
            .runs
            .iter()
            .filter(|e| purposes.contains(&e.outcome.purpose.as_str()))
            .map(|e| {
                vec![
                    e.name.clone(),
                    what(e),
                    e.outcome.status.clone(),
                    e.outcome.final_loss.map(num).unwrap_or("-".into()),
                    gap_text(e),
                    e.outcome.anomaly.clone().unwrap_or("none".into()),
                    if e.outcome.cured == Some(true) { "yes".into() } else { "no".into() },
                ]
            })
            .collect();
        output::table(&["run", col, "status", "final loss", "gap", "anomaly", "cures"], &rows)
    };
    let flag_after = |e: &RunEntry, flag: &str| e.flags.iter().rposition(|f| f == flag).and_then(|i| e.flags.get(i + 1)).cloned().unwrap_or("-".into());
    s += "\n2. each GEMM kind back to BF16:\n";
    s += &table_of(&["kind", "all-gemms"], "bf16 gemms", &|e| flag_after(e, "--bf16-gemms"));
    s += &format!(
        "\n   curing kinds: {}\n",
        if curing.is_empty() { "none alone; bisecting over every kind".to_string() } else { curing.iter().map(|g| g.as_str()).collect::<Vec<_>>().join(", ") }
    );
    s += &format!("\n3. bisection over the sites of {} ({} candidates, ordered by {}):\n", kinds.iter().map(|g| g.as_str()).collect::<Vec<_>>().join(", "), kinds.len() as u32 * t.base.manifest.config.model.layers * 4, format!(
        "{}, then {}",
        if fp8.spiked() { "the saturation of each GEMM's casts at the spike's first step" } else { "the first non-finite GEMM" },
        if loc.is_some() { "locate's shadow-GEMM ranking" } else { "execution order" }
    ));
    s += &table_of(&["bisect"], "bf16 sites", &|e| flag_after(e, "--bf16-sites"));
    s.push('\n');
    s += "\n4. current scaling: ";
    match t.entry("current") {
        Some(e) => s += &format!("{} ({}, {})\n", if v.current_scaling_cures { "cures the run" } else { "does not cure the run" }, gap_text(e), e.outcome.anomaly.clone().map(|a| format!("anomaly: {a}")).unwrap_or("no anomaly".into())),
        None => s += "not tried (the FP8 run already uses it)\n",
    }
    if let Some(e) = t.entry("short-history") {
        let cures = e.outcome.cured == Some(true);
        s += &format!(
            "   delayed scaling with the max of a {SHORT_HISTORY}-step amax history: {} ({}, {}){}\n",
            if cures { "cures the run" } else { "does not cure the run" },
            gap_text(e),
            e.outcome.anomaly.clone().map(|a| format!("anomaly: {a}")).unwrap_or("no anomaly".into()),
            match (cures, t.fp8_most_recent) {
                (false, _) => "",
                (true, false) => " — the scale lags: the history remembers an amax the tensors no longer have",
                (true, true) => " — the scale lags: the previous step's amax alone did not foresee this step's values",
            }
        );
    }
    for n in notes {
        s += &format!("\nnote: {n}\n");
    }
    s += &format!("\nverdict: {} ", v.anomaly.clone().unwrap_or_default());
    if v.culprits.is_empty() {
        s += "with no culprit set found.\n";
    } else if !complete {
        s += &format!(
            "with culprits in several GEMMs: the bisection found {} but these alone do not cure the run (see the notes); the fault is spread over the FP8 GEMMs, as a recipe problem is.\n",
            v.culprits.iter().map(Culprit::name).collect::<Vec<_>>().join(", ")
        );
    } else {
        s += &format!("caused by {}: returning {} to BF16 cures the run", v.culprits.iter().map(Culprit::name).collect::<Vec<_>>().join(", "), if v.culprits.len() == 1 { "it alone" } else { "these together" });
        let set = |sites: &str| sites.split(',').map(str::to_string).collect::<BTreeSet<String>>();
        let sites: BTreeSet<String> = v.culprits.iter().map(Culprit::site_flag).collect();
        if let Some(e) = t.runs.iter().rev().find(|e| e.outcome.cured == Some(true) && set(&flag_after(e, "--bf16-sites")) == sites) {
            s += &format!(" ({}: gap {})", e.name, gap_text(e));
        }
        s += ".\n";
        let operands = |ev: &[OperandEvidence]| {
            ev.iter()
                .map(|e| format!("{} underflow {} saturated {} (amax {}, amax used {})", e.role, e.underflow_frac.map(pct).unwrap_or("-".into()), e.saturated_frac.map(pct).unwrap_or("-".into()), e.amax.map(num).unwrap_or("-".into()), e.amax_used.map(num).unwrap_or("-".into())))
                .collect::<Vec<_>>()
                .join("; ")
        };
        for c in &v.culprits {
            let at_spike = t.spike_evidence.get(&c.name()).map(|(step, ev)| format!("at the spike's first step, {step}: {}", operands(ev)));
            let ranked = loc.and_then(|l| l.ranked.iter().enumerate().find(|(_, g)| g.gemm_name == c.name()).map(|(i, g)| (l, i, g)));
            let Some((l, i, g)) = ranked else {
                if let Some(a) = at_spike {
                    s += &format!("  {}: {a}\n", c.name());
                }
                continue;
            };
            if let Some(a) = at_spike {
                s += &format!("  {}: {a}\n", c.name());
            }
            s += &format!(
                "  {}: locate ranks it #{} of {} (shadow error 1 − cosine = {} at step {}, first crossed {}); operands at step {}: {}",
                c.name(),
                i + 1,
                l.ranked.len(),
                num(g.score),
                g.peak_step,
                output::opt(g.first_crossed),
                g.evidence.first().map(|e| e.step).unwrap_or(g.peak_step),
                operands(&g.evidence)
            );
            if !g.evidence_at_peak.is_empty() {
                s += &format!("; at the peak, step {}: {}", g.peak_step, operands(&g.evidence_at_peak));
            }
            s.push('\n');
        }
    }
    s += &format!("current scaling {}.\n", if v.current_scaling_cures { "cures it" } else { "does not cure it" });
    s
}

/// The command. Findings (exit 1) when the FP8 run shows an anomaly.
pub fn run(a: &TriageArgs, json: bool) -> Result<Outcome, AnalyzeError> {
    let v = triage(a)?;
    let _ = std::fs::write(a.out.join("verdict.json"), output::json_text(&v));
    let text = if v.healthy {
        let t = format!(
            "triage: healthy — the FP8 run shows no spike, drift (> {} for {} steps) or non-finite value against its BF16 baseline (final loss gap {}); runs under {}\n",
            pct(DEFAULT_DRIFT_THRESHOLD),
            DEFAULT_DRIFT_STEPS,
            v.runs.iter().find(|e| e.name == "fp8").map(gap_text).unwrap_or_default(),
            a.out.display()
        );
        let _ = std::fs::write(a.out.join("verdict.txt"), &t);
        t
    } else {
        std::fs::read_to_string(a.out.join("verdict.txt")).unwrap_or_default()
    };
    let stdout = if json { output::json_text(&v) } else { text };
    Ok(Outcome { stdout, findings: !v.healthy })
}
