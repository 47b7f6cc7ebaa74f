//! `summary RUN`: what was run (model, recipe, routing, data, device), how it ended, the loss at
//! checkpoints (first, 25/50/75 %, last recorded step, and the lowest), and the worst tensors by
//! FP8 underflow and saturation (mean over the recorded steps and ranks, from the stats table),
//! where the run came from and what it lacks.

use crate::analysis::anomalies::loss_curve;
use crate::analysis::liveness::{JobLiveness, job_liveness};
use crate::analysis::provenance::{Provenance, provenance};
use crate::error::AnalyzeError;
use crate::load::{Run, f64s, i64s, strs};
use fp8scope_schemas::layout::Table;
use fp8scope_schemas::manifest::Manifest;
use fp8scope_schemas::names::Gemm;
use fp8scope_schemas::tables::col;
use polars::prelude::*;
use serde::Serialize;

/// The loss at one checkpoint.
#[derive(Clone, Debug, Serialize)]
pub struct Checkpoint {
    /// `first`, `25%`, `50%`, `75%`, `last`, `min`.
    pub at: &'static str,
    pub step: i64,
    pub loss: f64,
}

/// One quantized operand's FP8 health over the recorded steps.
#[derive(Clone, Debug, Serialize)]
pub struct TensorHealth {
    /// `layers.1.fc1.gradient`
    pub tensor: String,
    pub gemm: String,
    pub layer: i64,
    pub module: String,
    pub role: String,
    pub mean_underflow_frac: f64,
    pub max_underflow_frac: f64,
    pub mean_saturated_frac: f64,
    pub max_saturated_frac: f64,
    pub steps: i64,
}

/// Everything `summary` reports.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub run: String,
    pub dir: String,
    pub status: String,
    pub error: Option<String>,
    pub steps_completed: u32,
    pub steps_recorded: usize,
    pub final_loss: Option<f64>,
    pub checkpoints: Vec<Checkpoint>,
    pub worst_underflow: Vec<TensorHealth>,
    pub worst_saturation: Vec<TensorHealth>,
    /// Counts of the capture's events by kind.
    pub events: Vec<EventCount>,
    pub skipped_parts: Vec<String>,
    /// Where the run came from, what it lacks, and the caveat of rounded statistics.
    pub provenance: Provenance,
    /// How each rank ended (one rank for a one-process run): a `running` record whose process is
    /// gone reads "stopped without closing".
    pub liveness: JobLiveness,
    /// The rank whose tables this summary read, for a run of several ranks.
    pub rank_view: Option<u32>,
    /// The whole manifest (configuration, device, libraries, row counts).
    pub manifest: Manifest,
}

#[derive(Clone, Debug, Serialize)]
pub struct EventCount {
    pub kind: String,
    pub count: i64,
}

/// Loss at the first, 25/50/75 %, last recorded steps and at the lowest finite loss.
pub fn checkpoints(steps: &[i64], loss: &[f64]) -> Vec<Checkpoint> {
    let n = steps.len();
    if n == 0 {
        return Vec::new();
    }
    let mut out: Vec<Checkpoint> = [("first", 0.0), ("25%", 0.25), ("50%", 0.5), ("75%", 0.75), ("last", 1.0)]
        .into_iter()
        .map(|(at, f)| {
            let i = ((n - 1) as f64 * f).round() as usize;
            Checkpoint { at, step: steps[i], loss: loss[i] }
        })
        .collect();
    if let Some((i, _)) = loss.iter().enumerate().filter(|(_, l)| l.is_finite()).min_by(|a, b| a.1.total_cmp(b.1)) {
        out.push(Checkpoint { at: "min", step: steps[i], loss: loss[i] });
    }
    out
}

/// Per quantized operand (layer, module, gemm, role): underflow and saturation over the steps.
pub fn tensor_health(run: &Run) -> Result<Vec<TensorHealth>, AnalyzeError> {
    let keys = [col::LAYER, col::MODULE, col::GEMM, col::ROLE];
    let lf = run.scan(Table::Stats, &[col::LAYER, col::MODULE, col::GEMM, col::ROLE, col::UNDERFLOW_FRAC, col::SATURATED_FRAC])?.group_by(keys.map(col)).agg([
        col(col::UNDERFLOW_FRAC).mean().alias("mean_underflow"),
        col(col::UNDERFLOW_FRAC).max().alias("max_underflow"),
        col(col::SATURATED_FRAC).mean().alias("mean_saturated"),
        col(col::SATURATED_FRAC).max().alias("max_saturated"),
        len().alias("steps"),
    ]);
    let df = run.collect(Table::Stats, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "stats", e);
    let (la, mo, ge, ro) =
        (i64s(&df, col::LAYER).map_err(e)?, strs(&df, col::MODULE).map_err(e)?, strs(&df, col::GEMM).map_err(e)?, strs(&df, col::ROLE).map_err(e)?);
    let (mu, xu, ms, xs, n) = (
        f64s(&df, "mean_underflow").map_err(e)?,
        f64s(&df, "max_underflow").map_err(e)?,
        f64s(&df, "mean_saturated").map_err(e)?,
        f64s(&df, "max_saturated").map_err(e)?,
        i64s(&df, "steps").map_err(e)?,
    );
    let mut out = Vec::with_capacity(df.height());
    for i in 0..df.height() {
        let (layer, module, gemm, role) =
            (la[i].unwrap_or(-1), mo[i].clone().unwrap_or_default(), ge[i].clone().unwrap_or_default(), ro[i].clone().unwrap_or_default());
        out.push(TensorHealth {
            tensor: run.naming.tensor(layer, &module, &role),
            gemm,
            layer,
            module,
            role,
            mean_underflow_frac: mu[i].unwrap_or(0.0),
            max_underflow_frac: xu[i].unwrap_or(0.0),
            mean_saturated_frac: ms[i].unwrap_or(0.0),
            max_saturated_frac: xs[i].unwrap_or(0.0),
            steps: n[i].unwrap_or(0),
        });
    }
    // Execution order before ranking, so that equal values list in the order they ran.
    let key = |t: &TensorHealth| (run.naming.rank(t.layer, &t.module, &t.role), Gemm::parse(&t.gemm).map(|g| g as usize), t.module.clone(), t.role.clone());
    out.sort_by_key(key);
    Ok(out)
}

/// Counts of the capture's events by kind.
fn event_counts(run: &Run) -> Result<Vec<EventCount>, AnalyzeError> {
    let lf = run.scan(Table::Events, &[col::KIND])?.group_by([col(col::KIND)]).agg([len().alias("n")]).sort([col::KIND], Default::default());
    let df = run.collect(Table::Events, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "events", e);
    let (k, n) = (strs(&df, col::KIND).map_err(e)?, i64s(&df, "n").map_err(e)?);
    Ok(k.into_iter().zip(n).map(|(k, n)| EventCount { kind: k.unwrap_or_default(), count: n.unwrap_or(0) }).collect())
}

/// Builds the summary.
pub fn summarize(run: &Run, top: usize) -> Result<Summary, AnalyzeError> {
    let (steps, loss) = loss_curve(run)?;
    let health = tensor_health(run)?;
    let pick = |key: fn(&TensorHealth) -> f64| {
        let mut v: Vec<TensorHealth> = health.iter().filter(|t| key(t) > 0.0).cloned().collect();
        v.sort_by(|a, b| key(b).total_cmp(&key(a)));
        v.truncate(top);
        v
    };
    let m = &run.manifest;
    Ok(Summary {
        run: run.name.clone(),
        dir: run.dir.display().to_string(),
        status: m.status.as_str().to_string(),
        error: m.error.clone(),
        steps_completed: m.steps_completed,
        steps_recorded: steps.len(),
        final_loss: m.final_loss,
        checkpoints: checkpoints(&steps, &loss),
        worst_underflow: pick(|t| t.mean_underflow_frac),
        worst_saturation: pick(|t| t.mean_saturated_frac),
        events: event_counts(run)?,
        skipped_parts: run.skipped(),
        provenance: provenance(run)?,
        liveness: job_liveness(run)?,
        rank_view: run.rank_view,
        manifest: m.clone(),
    })
}
