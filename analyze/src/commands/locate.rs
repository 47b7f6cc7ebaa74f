//! `locate RUN [--baseline B]`: which GEMM starts the trouble.
//!
//! Each GEMM (`layers.1.fc2.dgrad`) gets, at each dump step, the error it *adds*:
//! - with shadow records (the run was recorded with `--shadow`): its own error directly,
//!   1 − cosine of the FP8 result against a BF16 GEMM on the same inputs;
//! - otherwise, from `compare` against the baseline: error(result) − max(error(operands)), where
//!   error = 1 − cosine (2 when non-finite) and the operands are the dumped ones among the GEMM's
//!   inputs (fprop: activation, weight → output; dgrad: gradient, weight → dgrad; wgrad: gradient,
//!   activation → wgrad).
//!
//! GEMMs are ranked by the largest error they add at any step (ties: first in execution order —
//! forward in layer order, backward in reverse). A GEMM *crosses* the threshold at the first step
//! where it adds more than 1 − threshold; the verdict is the GEMM that crossed first (earliest
//! step, then execution order). Evidence: the underflow and saturation fractions (with amax and
//! scale) of its operands in the stats table at that step (or the latest recorded before it).

use crate::cli::LocateArgs;
use crate::commands::compare::compare_runs;
use crate::commands::Outcome;
use crate::detect::tensor_rank;
use crate::error::AnalyzeError;
use crate::load::{f64s, i64s, strs, LoadOptions, Run};
use crate::metrics::error_of_cosine;
use crate::output::{self, num, pct};
use fp8scope_schemas::layout::Table;
use fp8scope_schemas::names::{Gemm, Role};
use fp8scope_schemas::tables::col;
use polars::prelude::*;
use serde::Serialize;
use std::collections::BTreeMap;

/// One GEMM's error at one step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepError {
    pub step: i64,
    /// Error of the GEMM's result (1 − cosine).
    pub output_error: f64,
    /// Largest error among its dumped operands (0 with shadow records: same inputs).
    pub input_error: f64,
    /// output_error − input_error.
    pub added: f64,
}

/// FP8 statistics of one operand at the evidence step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OperandEvidence {
    pub role: String,
    pub step: i64,
    pub format: Option<String>,
    pub underflow_frac: Option<f64>,
    pub saturated_frac: Option<f64>,
    pub amax: Option<f64>,
    pub amax_used: Option<f64>,
    pub scale: Option<f64>,
}

/// One ranked GEMM.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LocatedGemm {
    /// `layers.1.fc2.dgrad`
    pub gemm_name: String,
    pub site: String,
    pub layer: i64,
    pub module: String,
    pub gemm: String,
    /// Position in execution order (smaller runs earlier).
    pub execution_rank: u64,
    /// The largest error added at any step.
    pub score: f64,
    /// The step of that largest error.
    pub peak_step: i64,
    /// First step whose added error exceeded 1 − threshold.
    pub first_crossed: Option<i64>,
    /// Operand roles whose error was subtracted (empty with shadow records).
    pub inputs: Vec<String>,
    pub errors: Vec<StepError>,
    /// The operands at the first crossing (else the peak).
    pub evidence: Vec<OperandEvidence>,
    /// The operands at the peak step, when it is not the evidence step: a fault that builds up
    /// (an amax history that keeps a scale stale) shows there, not at its first step.
    pub evidence_at_peak: Vec<OperandEvidence>,
}

/// Everything `locate` found.
#[derive(Clone, Debug, Serialize)]
pub struct LocateReport {
    pub run: String,
    pub baseline: Option<String>,
    /// `shadow` or `tensors`.
    pub method: &'static str,
    pub threshold: f64,
    /// The GEMM that crossed the threshold first, if any did.
    pub first: Option<String>,
    pub ranked: Vec<LocatedGemm>,
    pub warnings: Vec<String>,
}

pub type GemmId = (i64, String, String); // layer, module, gemm

fn rank_of(n_layers: u32, (layer, module, gemm): &GemmId) -> u64 {
    let role = Gemm::parse(gemm).map(|g| g.result().as_str()).unwrap_or("");
    tensor_rank(n_layers, *layer, module, role)
}

/// Per GEMM, per step errors from the shadow table.
fn shadow_errors(run: &Run) -> Result<BTreeMap<GemmId, Vec<StepError>>, AnalyzeError> {
    let lf = run.scan(Table::Shadow, &[col::STEP, col::LAYER, col::MODULE, col::GEMM, col::COSINE])?;
    let df = run.collect(Table::Shadow, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "shadow", e);
    let (st, la, mo, ge, co) = (i64s(&df, col::STEP).map_err(e)?, i64s(&df, col::LAYER).map_err(e)?, strs(&df, col::MODULE).map_err(e)?, strs(&df, col::GEMM).map_err(e)?, f64s(&df, col::COSINE).map_err(e)?);
    let mut out: BTreeMap<GemmId, Vec<StepError>> = BTreeMap::new();
    for i in 0..df.height() {
        let (Some(step), Some(layer), Some(module), Some(gemm)) = (st[i], la[i], mo[i].clone(), ge[i].clone()) else { continue };
        let err = error_of_cosine(co[i].unwrap_or(f64::NAN));
        out.entry((layer, module, gemm)).or_default().push(StepError { step, output_error: err, input_error: 0.0, added: err });
    }
    Ok(out)
}

/// Per GEMM, per step added errors from comparing the dumped tensors with the baseline's.
fn tensor_errors(run: &Run, base: &Run, threshold: f64) -> Result<(BTreeMap<GemmId, Vec<StepError>>, BTreeMap<GemmId, Vec<String>>, Vec<String>), AnalyzeError> {
    let report = compare_runs(run, base, threshold)?;
    // error of each (step, layer, module, role)
    let mut err: BTreeMap<(i64, i64, String, String), f64> = BTreeMap::new();
    for t in &report.tensors {
        err.insert((t.step, t.layer, t.module.clone(), t.role.clone()), error_of_cosine(t.metrics.cosine));
    }
    let mut out: BTreeMap<GemmId, Vec<StepError>> = BTreeMap::new();
    let mut inputs: BTreeMap<GemmId, Vec<String>> = BTreeMap::new();
    let mut sites: Vec<(i64, i64, String)> = err.keys().map(|(s, l, m, _)| (*s, *l, m.clone())).collect();
    sites.dedup();
    for (step, layer, module) in sites {
        for g in Gemm::ALL {
            let get = |r: Role| err.get(&(step, layer, module.clone(), r.as_str().to_string())).copied();
            let Some(output_error) = get(g.result()) else { continue };
            let ops: Vec<(Role, f64)> = g.operands().into_iter().filter_map(|r| get(r).map(|e| (r, e))).collect();
            let input_error = ops.iter().map(|o| o.1).fold(0.0, f64::max);
            let id = (layer, module.clone(), g.as_str().to_string());
            inputs.entry(id.clone()).or_insert_with(|| ops.iter().map(|o| o.0.as_str().to_string()).collect());
            out.entry(id).or_default().push(StepError { step, output_error, input_error, added: output_error - input_error });
        }
    }
    Ok((out, inputs, report.warnings))
}

/// The GEMMs whose casts saturated at `step`, most saturated first: (`layers.0.qkv.fprop`, the
/// largest saturated fraction of its operands). A spike's first step names its suspects this way.
pub fn saturated_at(run: &Run, step: i64) -> Result<Vec<(String, f64)>, AnalyzeError> {
    let lf = run
        .scan(Table::Stats, &[col::STEP, col::LAYER, col::MODULE, col::GEMM, col::SATURATED_FRAC])?
        .filter(col(col::STEP).eq(lit(step)).and(col(col::SATURATED_FRAC).gt(lit(0.0))))
        .group_by([col(col::LAYER), col(col::MODULE), col(col::GEMM)])
        .agg([col(col::SATURATED_FRAC).max()]);
    let df = run.collect(Table::Stats, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "stats", e);
    let (la, mo, ge, sa) = (i64s(&df, col::LAYER).map_err(e)?, strs(&df, col::MODULE).map_err(e)?, strs(&df, col::GEMM).map_err(e)?, f64s(&df, col::SATURATED_FRAC).map_err(e)?);
    let mut out: Vec<(String, f64)> = (0..df.height())
        .filter_map(|i| Some((format!("layers.{}.{}.{}", la[i]?, mo[i].as_deref()?, ge[i].as_deref()?), sa[i]?)))
        .collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Ok(out)
}

/// The stats of a GEMM's operands at `step`, or at the latest recorded step before it.
pub fn evidence(run: &Run, (layer, module, gemm): &GemmId, step: i64) -> Result<Vec<OperandEvidence>, AnalyzeError> {
    let lf = run
        .scan(
            Table::Stats,
            &[col::STEP, col::LAYER, col::MODULE, col::GEMM, col::ROLE, col::FORMAT, col::UNDERFLOW_FRAC, col::SATURATED_FRAC, col::AMAX, col::AMAX_USED, col::SCALE],
        )?
        .filter(
            col(col::LAYER)
                .cast(DataType::Int64)
                .eq(lit(*layer))
                .and(col(col::MODULE).eq(lit(module.clone())))
                .and(col(col::GEMM).eq(lit(gemm.clone())))
                .and(col(col::STEP).lt_eq(lit(step))),
        )
        .filter(col(col::STEP).eq(col(col::STEP).max()))
        .sort([col::ROLE], Default::default());
    let df = run.collect(Table::Stats, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "stats", e);
    let (st, ro, fo) = (i64s(&df, col::STEP).map_err(e)?, strs(&df, col::ROLE).map_err(e)?, strs(&df, col::FORMAT).map_err(e)?);
    let (un, sa, am, au, sc) = (
        f64s(&df, col::UNDERFLOW_FRAC).map_err(e)?,
        f64s(&df, col::SATURATED_FRAC).map_err(e)?,
        f64s(&df, col::AMAX).map_err(e)?,
        f64s(&df, col::AMAX_USED).map_err(e)?,
        f64s(&df, col::SCALE).map_err(e)?,
    );
    Ok((0..df.height())
        .map(|i| OperandEvidence {
            role: ro[i].clone().unwrap_or_default(),
            step: st[i].unwrap_or(step),
            format: fo[i].clone(),
            underflow_frac: un[i],
            saturated_frac: sa[i],
            amax: am[i],
            amax_used: au[i],
            scale: sc[i],
        })
        .collect())
}

/// Ranks the GEMMs of `run` by the error each adds.
pub fn locate(run: &Run, base: Option<&Run>, threshold: f64) -> Result<LocateReport, AnalyzeError> {
    if !(threshold > -1.0 && threshold <= 1.0) {
        return Err(AnalyzeError::usage(format!("--threshold must be a cosine in (-1, 1], got {threshold}")));
    }
    let (method, errors, inputs, warnings) = if run.has(Table::Shadow)? {
        let w = base
            .map(|b| format!("run '{}' has shadow GEMM records: they measure each GEMM directly, baseline '{}' is not used", run.name, b.name))
            .into_iter()
            .collect();
        ("shadow", shadow_errors(run)?, BTreeMap::new(), w)
    } else {
        let Some(base) = base else {
            return Err(AnalyzeError::Missing {
                run: run.name.clone(),
                message: "has no shadow records; give --baseline B, or record the run with --shadow".into(),
            });
        };
        let (e, i, w) = tensor_errors(run, base, threshold)?;
        ("tensors", e, i, w)
    };
    let n_layers = run.n_layers();
    let limit = 1.0 - threshold;
    let mut ranked: Vec<LocatedGemm> = errors
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(id, mut v)| {
            v.sort_by_key(|e| e.step);
            let peak = v.iter().fold(&v[0], |best, e| if e.added > best.added { e } else { best });
            let (score, peak_step) = (peak.added, peak.step);
            let first_crossed = v.iter().find(|e| e.added > limit).map(|e| e.step);
            let (layer, module, gemm) = id.clone();
            LocatedGemm {
                gemm_name: format!("layers.{layer}.{module}.{gemm}"),
                site: format!("layers.{layer}.{module}"),
                execution_rank: rank_of(n_layers, &id),
                layer,
                module,
                gemm,
                score,
                peak_step,
                first_crossed,
                inputs: inputs.get(&id).cloned().unwrap_or_default(),
                errors: v,
                evidence: Vec::new(),
                evidence_at_peak: Vec::new(),
            }
        })
        .collect();
    ranked.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.execution_rank.cmp(&b.execution_rank)).then(a.gemm_name.cmp(&b.gemm_name)));
    for g in &mut ranked {
        let id = (g.layer, g.module.clone(), g.gemm.clone());
        let step = g.first_crossed.unwrap_or(g.peak_step);
        g.evidence = evidence(run, &id, step)?;
        if g.peak_step != step {
            g.evidence_at_peak = evidence(run, &id, g.peak_step)?;
        }
    }
    let first = ranked
        .iter()
        .filter_map(|g| g.first_crossed.map(|s| (s, g.execution_rank, &g.gemm_name)))
        .min()
        .map(|(_, _, n)| n.clone());
    Ok(LocateReport { run: run.name.clone(), baseline: base.map(|b| b.name.clone()), method, threshold, first, ranked, warnings })
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
        _ => format!("tensors compared with baseline '{}' (added = error(result) − max error(operands), error = 1 − cosine)", r.baseline.as_deref().unwrap_or("?")),
    };
    let mut s = format!("locate: run '{}', from {how}\n\n", r.run);
    let rows: Vec<Vec<String>> = r
        .ranked
        .iter()
        .take(top)
        .enumerate()
        .map(|(i, g)| {
            let ev = |f: fn(&OperandEvidence) -> Option<f64>| {
                g.evidence.iter().map(|e| format!("{} {}", e.role, f(e).map(pct).unwrap_or_else(|| "-".into()))).collect::<Vec<_>>().join(", ")
            };
            vec![
                (i + 1).to_string(),
                g.gemm_name.clone(),
                num(g.score),
                g.peak_step.to_string(),
                output::opt(g.first_crossed),
                ev(|e| e.underflow_frac),
                ev(|e| e.saturated_frac),
            ]
        })
        .collect();
    if rows.is_empty() {
        s += "no GEMM could be scored (no result tensors dumped)\n";
        return s;
    }
    s += &output::table(&["#", "gemm", "added error", "peak step", "first crossed", "underflow", "saturated"], &rows);
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
    s
}
