//! Which GEMM does the harm: the ranking beneath `locate`, `report` and `triage`.
//!
//! Each GEMM (`layers.1.fc2.dgrad`) gets, at each dump step, the **error** it adds:
//! - with shadow records (the run was recorded with `--shadow`): its own error directly,
//!   1 − cosine of the FP8 result against a BF16 GEMM on the same inputs;
//! - otherwise, from `compare` against the baseline: error(result) − max(error(operands)), where
//!   error = 1 − cosine (2 when non-finite) and the operands are the dumped ones among the GEMM's
//!   inputs (fprop: activation, weight → output; dgrad: gradient, weight → dgrad; wgrad: gradient,
//!   activation → wgrad).
//!
//! A local error says how wrong a GEMM's result is, not how much that matters to training: a
//! gradient GEMM far upstream may be 100% wrong on values that move nothing. With shadow records,
//! GEMMs are ranked by **harm**, the error measured in loss units:
//!
//! harm = ‖δ‖ · ‖dual‖, δ = FP8 result − BF16 result on the same inputs (‖δ‖² = mse · numel),
//!
//! where the dual of a result is the tensor it pairs with in the loss's first-order expansion:
//! for fprop (Y = X·Wᵀ) the loss gradient dY, so harm bounds |⟨δY, dY⟩|, the change of the loss
//! the error makes; for dgrad (dX) the activation X, so harm bounds |⟨X, δdX⟩|, the error in the
//! loss's predicted response to X; for wgrad (dW) the weight W, likewise for the update of W. Each
//! is in loss units, so GEMMs of every kind and layer compare. The duals' norms come from the stats
//! table (‖t‖² = numel · (std² + mean²) of the operand cast at that step).
//!
//! **Warm-up**: under delayed scaling, until a GEMM's operands' amax histories hold a real value
//! (`amax_used` > 0 for every operand), their scales are the initial 1 and small values underflow
//! in every run: those steps are labelled `warmup` and never score, cross or give evidence.
//!
//! The GEMM whose operand went non-finite first (the `anomalies` definition) has infinite harm.
//!
//! **Runs from elsewhere** (PyTorch, Transformer Engine logs) that have neither shadow records nor
//! dumped tensors to compare are ranked from their statistics alone (method `stats`): a GEMM's
//! error at a step is the share of its operands' values its casts lost, underflow_frac +
//! saturated_frac of the worst operand (and rank); it crosses when that share exceeds
//! 1 − threshold. The report says why, and carries the caveat of rounded statistics.
//!
//! GEMMs are ranked by their largest harm after warm-up (the **score**; by the largest added error
//! without shadow records or stats), ties first in execution order (forward in layer order, backward
//! in reverse). A GEMM *crosses* the threshold at the first step after warm-up where it adds more
//! than 1 − threshold error; the verdict is the GEMM that crossed first (earliest step, then
//! execution order). Evidence: the underflow and saturation fractions (with amax and scale) of its
//! operands in the stats table at that step (or the latest recorded before it), and where the run
//! has them (schema version 2 on), the channel that holds each operand's amax and the share of
//! Σx² its top 1% of channels hold — an outlier channel shows as a share far above 1%.

use crate::analysis::anomalies::{find_nonfinite, loss_curve};
use crate::analysis::compare::compare_runs;
use crate::analysis::metrics::error_of_cosine;
use crate::analysis::overflow_risk::{headroom_ratios, overflow_diverges};
use crate::analysis::provenance::{lacking, rounding_caveat};
use crate::error::AnalyzeError;
use crate::load::{Run, f64s, i64s, strs};
use fp8scope_schemas::config::RecipeKind;
use fp8scope_schemas::layout::Table;
use fp8scope_schemas::names::{Gemm, Role, SiteNaming};
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
    /// ‖δ‖ · ‖dual‖ (shadow records and stats only).
    pub harm: Option<f64>,
    /// ⟨δ, dual⟩, the signed first-order effect the bound `harm` holds (shadow records of the CPU
    /// backend: `shadow.dual_inner`; None elsewhere). See `crate::analysis::predict`.
    pub signed: Option<f64>,
    /// A step of delayed scaling's warm-up (scales not yet from a real amax): never scored.
    pub warmup: bool,
}

/// A step's harm where it is finite, else 0. A shadow GEMM whose operands the NaN had already
/// reached (the flight recorder writes the step a run goes non-finite) has no finite error to
/// weigh: the unbounded harm is the first non-finite GEMM's (`nonfinite_at`), not of every GEMM
/// downstream of it.
fn finite_harm(e: &StepError) -> f64 {
    e.harm.filter(|h| h.is_finite()).unwrap_or(0.0)
}

/// The steps a GEMM is scored on: those after delayed scaling's warm-up, or every step if the run
/// never left it.
pub fn scored_steps(errors: &[StepError]) -> Vec<&StepError> {
    if errors.iter().all(|e| e.warmup) { errors.iter().collect() } else { errors.iter().filter(|e| !e.warmup).collect() }
}

/// FP8 statistics of one operand at the evidence step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OperandEvidence {
    pub role: String,
    pub step: i64,
    /// The process rank of a multi-rank run from elsewhere (None otherwise).
    pub rank: Option<i64>,
    pub format: Option<String>,
    pub underflow_frac: Option<f64>,
    pub saturated_frac: Option<f64>,
    pub amax: Option<f64>,
    pub amax_used: Option<f64>,
    pub scale: Option<f64>,
    /// The channel holding the amax (None in runs recorded before the column existed, or that
    /// took no channel statistics up to this step).
    pub amax_channel: Option<i64>,
    /// Share of Σx² held by the top 1% of channels (at least one).
    pub top_channel_sq_frac: Option<f64>,
    /// The step the two channel fields come from: `step`, or the latest earlier step with channel
    /// statistics when this one has none (`--channel-stats-every` above 1).
    pub channel_step: Option<i64>,
    /// The operand's amax at `channel_step`.
    pub channel_amax: Option<f64>,
}

impl OperandEvidence {
    /// "activation amax 412 in channel 1733, top 1% of channels hold 87% of Σx²" ("… in channel
    /// 1733 at step 110, …" when they come from an earlier step than the evidence), or None when
    /// the run has no channel statistics for this operand.
    pub fn channel_phrase(&self) -> Option<String> {
        let ch = self.amax_channel?;
        let mut s = format!("{} amax {} in channel {ch}", self.role, self.channel_amax.map(crate::output::num).unwrap_or_else(|| "-".into()));
        if let Some(at) = self.channel_step.filter(|&at| at != self.step) {
            s += &format!(" at step {at}");
        }
        if let Some(f) = self.top_channel_sq_frac {
            s += &format!(", top 1% of channels hold {} of Σx²", crate::output::pct(f));
        }
        Some(s)
    }
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
    /// What the ranking sorts on: the largest harm after warm-up (`ranked_by` = harm), or the
    /// largest added error after warm-up.
    pub score: f64,
    /// The step of the score.
    pub peak_step: i64,
    /// The largest added error (1 − cosine) after warm-up, and its step.
    pub peak_error: f64,
    pub peak_error_step: i64,
    /// First step after warm-up whose added error exceeded 1 − threshold.
    pub first_crossed: Option<i64>,
    /// The last step of delayed scaling's warm-up for this GEMM (None: no warm-up).
    pub warmup_until: Option<i64>,
    /// Σ harm over the scored steps (after warm-up): the bound on the GEMM's accumulated first-order
    /// effect, in loss units per recorded step (None without harm).
    pub harm_total: Option<f64>,
    /// Σ ⟨δ, dual⟩ over the scored steps (None unless every scored step has it).
    pub signed_total: Option<f64>,
    /// The step this GEMM's operand went non-finite first of all tensors (its score is then ∞).
    pub nonfinite_at: Option<i64>,
    /// In a run that went non-finite with casts that turn an overflow into NaN (delayed scaling,
    /// `--overflow nan`): how close its operands came to overflowing up to that step, the largest
    /// amax / (amax_used · 2^margin) ([`crate::analysis::overflow_risk`]). None elsewhere.
    pub headroom_ratio: Option<f64>,
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
    /// `shadow`, `tensors`, or `stats` (a run from elsewhere with neither).
    pub method: &'static str,
    /// `harm` (shadow records and stats), `added error`, or `cast loss` (method `stats`).
    pub ranked_by: &'static str,
    /// Why the method was chosen when the run lacks what the others need.
    pub note: Option<String>,
    /// The caveat of the statistics, when their source rounded them.
    pub stats_caveat: Option<String>,
    pub threshold: f64,
    /// The GEMM that crossed the threshold first, if any did.
    pub first: Option<String>,
    pub ranked: Vec<LocatedGemm>,
    pub warnings: Vec<String>,
}

impl LocateReport {
    /// The 1-based rank of `gemm_name`, if ranked.
    pub fn rank_of(&self, gemm_name: &str) -> Option<usize> {
        self.ranked.iter().position(|g| g.gemm_name == gemm_name).map(|i| i + 1)
    }
}

pub type GemmId = (i64, String, String); // layer, module, gemm

fn rank_of(naming: &SiteNaming, (layer, module, gemm): &GemmId) -> u64 {
    let role = Gemm::parse(gemm).map(|g| g.result().as_str()).unwrap_or("");
    naming.rank(*layer, module, role)
}

/// The role whose tensor pairs with a GEMM's result in the loss's first-order expansion: fprop's
/// Y with dY (gradient), dgrad's dX with X (activation), wgrad's dW with W (weight).
pub fn dual_role(g: Gemm) -> Role {
    match g {
        Gemm::Fprop => Role::Gradient,
        Gemm::Dgrad => Role::Activation,
        Gemm::Wgrad => Role::Weight,
    }
}

/// Per GEMM, per step errors from the shadow table, with ‖δ‖ (None when mse or numel is missing).
fn shadow_errors(run: &Run) -> Result<BTreeMap<GemmId, Vec<(StepError, Option<f64>)>>, AnalyzeError> {
    let lf = run.scan(Table::Shadow, &[col::STEP, col::LAYER, col::MODULE, col::GEMM, col::COSINE, col::MSE, col::NUMEL, col::DUAL_INNER])?;
    let df = run.collect(Table::Shadow, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "shadow", e);
    let (st, la, mo, ge, co) = (
        i64s(&df, col::STEP).map_err(e)?,
        i64s(&df, col::LAYER).map_err(e)?,
        strs(&df, col::MODULE).map_err(e)?,
        strs(&df, col::GEMM).map_err(e)?,
        f64s(&df, col::COSINE).map_err(e)?,
    );
    let (ms, nu, inner) = (f64s(&df, col::MSE).map_err(e)?, i64s(&df, col::NUMEL).map_err(e)?, f64s(&df, col::DUAL_INNER).map_err(e)?);
    let mut out: BTreeMap<GemmId, Vec<(StepError, Option<f64>)>> = BTreeMap::new();
    for i in 0..df.height() {
        let (Some(step), Some(layer), Some(module), Some(gemm)) = (st[i], la[i], mo[i].clone(), ge[i].clone()) else { continue };
        let err = error_of_cosine(co[i].unwrap_or(f64::NAN));
        let delta = match (ms[i], nu[i]) {
            (Some(m), Some(n)) if m.is_finite() => Some((m.max(0.0) * n as f64).sqrt()),
            (Some(_), Some(_)) => Some(f64::INFINITY),
            _ => None,
        };
        out.entry((layer, module, gemm))
            .or_default()
            .push((StepError { step, output_error: err, input_error: 0.0, added: err, harm: None, signed: inner[i], warmup: false }, delta));
    }
    Ok(out)
}

/// ‖t‖ of every quantized operand at the given steps: (step, layer, module, role) → norm, from
/// numel · (std² + mean²) of the stats table.
fn operand_norms(run: &Run, steps: &[i64]) -> Result<BTreeMap<(i64, i64, String, String), f64>, AnalyzeError> {
    if steps.is_empty() {
        return Ok(BTreeMap::new());
    }
    let wanted = Series::new("s".into(), steps.to_vec());
    let lf = run
        .scan(Table::Stats, &[col::STEP, col::LAYER, col::MODULE, col::ROLE, col::NUMEL, col::MEAN, col::STD])?
        .filter(col(col::STEP).is_in(lit(wanted).implode(false), false))
        .group_by([col(col::STEP), col(col::LAYER), col(col::MODULE), col(col::ROLE)])
        .agg([col(col::NUMEL).first(), col(col::MEAN).first(), col(col::STD).first()]);
    let df = run.collect(Table::Stats, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "stats", e);
    let (st, la, mo, ro) =
        (i64s(&df, col::STEP).map_err(e)?, i64s(&df, col::LAYER).map_err(e)?, strs(&df, col::MODULE).map_err(e)?, strs(&df, col::ROLE).map_err(e)?);
    let (nu, me, sd) = (i64s(&df, col::NUMEL).map_err(e)?, f64s(&df, col::MEAN).map_err(e)?, f64s(&df, col::STD).map_err(e)?);
    let mut out = BTreeMap::new();
    for i in 0..df.height() {
        if let (Some(s), Some(l), Some(m), Some(r), Some(n), Some(mean), Some(std)) = (st[i], la[i], mo[i].clone(), ro[i].clone(), nu[i], me[i], sd[i]) {
            out.insert((s, l, m, r), (n as f64 * (std * std + mean * mean)).sqrt());
        }
    }
    Ok(out)
}

/// Under delayed scaling, per GEMM, the last step of its warm-up: the last step before the first
/// one at which every operand's scale came from a real amax (`amax_used` > 0). Empty for other
/// recipes (their scales come from the tensor itself).
pub fn warmup_until(run: &Run) -> Result<BTreeMap<GemmId, i64>, AnalyzeError> {
    if run.manifest.config.recipe.kind != RecipeKind::Delayed || !run.has(Table::Stats)? {
        return Ok(BTreeMap::new());
    }
    let lf = run
        .scan(Table::Stats, &[col::STEP, col::LAYER, col::MODULE, col::GEMM, col::AMAX_USED])?
        .group_by([col(col::LAYER), col(col::MODULE), col(col::GEMM), col(col::STEP)])
        .agg([col(col::AMAX_USED).min().alias("least")])
        .group_by([col(col::LAYER), col(col::MODULE), col(col::GEMM)])
        .agg([col(col::STEP).filter(col("least").gt(lit(0.0))).min().alias("ready"), col(col::STEP).min().alias("first")]);
    let df = run.collect(Table::Stats, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "stats", e);
    let (la, mo, ge) = (i64s(&df, col::LAYER).map_err(e)?, strs(&df, col::MODULE).map_err(e)?, strs(&df, col::GEMM).map_err(e)?);
    let (ready, first) = (i64s(&df, "ready").map_err(e)?, i64s(&df, "first").map_err(e)?);
    let mut out = BTreeMap::new();
    for i in 0..df.height() {
        let (Some(l), Some(m), Some(g), Some(r), Some(f)) = (la[i], mo[i].clone(), ge[i].clone(), ready[i], first[i]) else { continue };
        if r > f {
            out.insert((l, m, g), r - 1);
        }
    }
    Ok(out)
}

/// Per GEMM, per step added errors from comparing the dumped tensors with the baseline's.
fn tensor_errors(
    run: &Run,
    base: &Run,
    threshold: f64,
) -> Result<(BTreeMap<GemmId, Vec<StepError>>, BTreeMap<GemmId, Vec<String>>, Vec<String>), AnalyzeError> {
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
            out.entry(id).or_default().push(StepError {
                step,
                output_error,
                input_error,
                added: output_error - input_error,
                harm: None,
                signed: None,
                warmup: false,
            });
        }
    }
    Ok((out, inputs, report.warnings))
}

/// Per GEMM, per step, the share of its operands' values the casts lost (underflow + saturation of
/// the worst operand and rank), from the stats table: the ranking of runs that have nothing else.
fn stats_errors(run: &Run) -> Result<BTreeMap<GemmId, Vec<StepError>>, AnalyzeError> {
    let (u, s) = (col(col::UNDERFLOW_FRAC), col(col::SATURATED_FRAC));
    let lf = run
        .scan(Table::Stats, &[col::STEP, col::LAYER, col::MODULE, col::GEMM, col::ROLE, col::UNDERFLOW_FRAC, col::SATURATED_FRAC])?
        .filter(u.clone().is_not_null().or(s.clone().is_not_null()))
        .filter(col(col::ROLE).is_in(lit(Series::new("q".into(), Role::QUANTIZED.map(|r| r.as_str()).to_vec())).implode(false), false))
        .group_by([col(col::LAYER), col(col::MODULE), col(col::GEMM), col(col::STEP)])
        .agg([(u.fill_null(lit(0.0)) + s.fill_null(lit(0.0))).max().alias("lost")]);
    let df = run.collect(Table::Stats, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "stats", e);
    let (st, la, mo, ge, lo) = (
        i64s(&df, col::STEP).map_err(e)?,
        i64s(&df, col::LAYER).map_err(e)?,
        strs(&df, col::MODULE).map_err(e)?,
        strs(&df, col::GEMM).map_err(e)?,
        f64s(&df, "lost").map_err(e)?,
    );
    let mut out: BTreeMap<GemmId, Vec<StepError>> = BTreeMap::new();
    for i in 0..df.height() {
        let (Some(step), Some(layer), Some(module), Some(gemm), Some(lost)) = (st[i], la[i], mo[i].clone(), ge[i].clone(), lo[i]) else { continue };
        out.entry((layer, module, gemm)).or_default().push(StepError {
            step,
            output_error: lost,
            input_error: 0.0,
            added: lost,
            harm: None,
            signed: None,
            warmup: false,
        });
    }
    Ok(out)
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
    let (la, mo, ge, sa) =
        (i64s(&df, col::LAYER).map_err(e)?, strs(&df, col::MODULE).map_err(e)?, strs(&df, col::GEMM).map_err(e)?, f64s(&df, col::SATURATED_FRAC).map_err(e)?);
    let mut out: Vec<(String, f64)> = (0..df.height()).filter_map(|i| Some((run.naming.gemm(la[i]?, mo[i].as_deref()?, ge[i].as_deref()?), sa[i]?))).collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Ok(out)
}

/// The stats of a GEMM's operands at `step`, or at the latest recorded step before it (one row
/// per operand, and per rank in a multi-rank run from elsewhere). An operand whose row has no
/// channel statistics (a run that takes them every N statistics steps, `--channel-stats-every`)
/// takes them from its own latest earlier row that has some, with that step and its amax
/// ([`OperandEvidence::channel_step`]); operands of a run from elsewhere may have them on
/// different steps.
pub fn evidence(run: &Run, id: &GemmId, step: i64) -> Result<Vec<OperandEvidence>, AnalyzeError> {
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "stats", e);
    let df = run.collect(Table::Stats, operand_rows(run, id, step, false)?)?;
    let (st, ro, fo) = (i64s(&df, col::STEP).map_err(e)?, strs(&df, col::ROLE).map_err(e)?, strs(&df, col::FORMAT).map_err(e)?);
    let rk = i64s(&df, col::RANK).map_err(e)?;
    let (un, sa, am, au, sc) = (
        f64s(&df, col::UNDERFLOW_FRAC).map_err(e)?,
        f64s(&df, col::SATURATED_FRAC).map_err(e)?,
        f64s(&df, col::AMAX).map_err(e)?,
        f64s(&df, col::AMAX_USED).map_err(e)?,
        f64s(&df, col::SCALE).map_err(e)?,
    );
    let (ch, tf) = (i64s(&df, col::AMAX_CHANNEL).map_err(e)?, f64s(&df, col::TOP_CHANNEL_SQ_FRAC).map_err(e)?);
    let mut rows: Vec<OperandEvidence> = (0..df.height())
        .map(|i| OperandEvidence {
            role: ro[i].clone().unwrap_or_default(),
            step: st[i].unwrap_or(step),
            rank: rk[i],
            format: fo[i].clone(),
            underflow_frac: un[i],
            saturated_frac: sa[i],
            amax: am[i],
            amax_used: au[i],
            scale: sc[i],
            amax_channel: ch[i],
            top_channel_sq_frac: tf[i],
            channel_step: ch[i].and(st[i]),
            channel_amax: ch[i].and(am[i]),
        })
        .collect();
    if rows.iter().any(|r| r.amax_channel.is_none()) {
        let df = run.collect(Table::Stats, operand_rows(run, id, step, true)?)?;
        let (st, ro, rk, am) =
            (i64s(&df, col::STEP).map_err(e)?, strs(&df, col::ROLE).map_err(e)?, i64s(&df, col::RANK).map_err(e)?, f64s(&df, col::AMAX).map_err(e)?);
        let (ch, tf) = (i64s(&df, col::AMAX_CHANNEL).map_err(e)?, f64s(&df, col::TOP_CHANNEL_SQ_FRAC).map_err(e)?);
        for r in rows.iter_mut().filter(|r| r.amax_channel.is_none()) {
            // Rows come latest first: the first of the operand's is its latest with channels.
            if let Some(i) = (0..df.height()).find(|&i| ro[i].as_deref() == Some(r.role.as_str()) && rk[i] == r.rank) {
                (r.amax_channel, r.top_channel_sq_frac, r.channel_step, r.channel_amax) = (ch[i], tf[i], st[i], am[i]);
            }
        }
    }
    Ok(rows)
}

/// The stats rows of a GEMM's operands at the latest recorded step at or before `step`; with
/// `with_channels`, every row at or before `step` that has channel statistics, latest first, so
/// that each operand's first row is its own latest (operands may take them on different steps: a
/// run from elsewhere).
fn operand_rows(run: &Run, (layer, module, gemm): &GemmId, step: i64, with_channels: bool) -> Result<LazyFrame, AnalyzeError> {
    let operands: Vec<&str> = Gemm::parse(gemm).map(|g| g.operands().map(|r| r.as_str()).to_vec()).unwrap_or_default();
    let mut keep = col(col::LAYER)
        .cast(DataType::Int64)
        .eq(lit(*layer))
        .and(col(col::MODULE).eq(lit(module.clone())))
        .and(col(col::GEMM).eq(lit(gemm.clone())))
        .and(col(col::ROLE).is_in(lit(Series::new("ops".into(), operands)).implode(false), false))
        .and(col(col::STEP).lt_eq(lit(step)));
    if with_channels {
        keep = keep.and(col(col::AMAX_CHANNEL).is_not_null());
    }
    let rows = run
        .scan(
            Table::Stats,
            &[
                col::STEP,
                col::LAYER,
                col::MODULE,
                col::GEMM,
                col::ROLE,
                col::RANK,
                col::FORMAT,
                col::UNDERFLOW_FRAC,
                col::SATURATED_FRAC,
                col::AMAX,
                col::AMAX_USED,
                col::SCALE,
                col::AMAX_CHANNEL,
                col::TOP_CHANNEL_SQ_FRAC,
            ],
        )?
        .filter(keep);
    Ok(if with_channels {
        rows.sort([col::STEP], SortMultipleOptions::default().with_order_descending(true).with_maintain_order(true))
    } else {
        rows.filter(col(col::STEP).eq(col(col::STEP).max())).sort([col::ROLE, col::RANK], Default::default())
    })
}

/// Ranks the GEMMs of `run` by the harm (or error) each adds.
pub fn locate(run: &Run, base: Option<&Run>, threshold: f64) -> Result<LocateReport, AnalyzeError> {
    if !(threshold > -1.0 && threshold <= 1.0) {
        return Err(AnalyzeError::usage(format!("--threshold must be a cosine in (-1, 1], got {threshold}")));
    }
    let mut warnings = Vec::new();
    let mut note = None;
    let comparable = match base {
        Some(b) => run.has(Table::Tensors)? && b.has(Table::Tensors)?,
        None => false,
    };
    let (method, mut errors, inputs) = if run.has(Table::Shadow)? {
        if let Some(b) = base {
            warnings.push(format!("run '{}' has shadow GEMM records: they measure each GEMM directly, baseline '{}' is not used", run.name, b.name));
        }
        let shadow = shadow_errors(run)?;
        let mut steps: Vec<i64> = shadow.values().flatten().map(|(e, _)| e.step).collect();
        steps.sort_unstable();
        steps.dedup();
        let norms = if run.has(Table::Stats)? { operand_norms(run, &steps)? } else { BTreeMap::new() };
        let mut out: BTreeMap<GemmId, Vec<StepError>> = BTreeMap::new();
        for ((layer, module, gemm), v) in shadow {
            let dual = Gemm::parse(&gemm).map(dual_role);
            let list = v
                .into_iter()
                .map(|(mut e, delta)| {
                    let d = dual.and_then(|r| norms.get(&(e.step, layer, module.clone(), r.as_str().to_string())).copied());
                    e.harm = match (delta, d) {
                        (Some(x), Some(y)) if x.is_infinite() => Some(if y > 0.0 { f64::INFINITY } else { 0.0 }),
                        (Some(x), Some(y)) => Some(x * y),
                        _ => None,
                    };
                    e
                })
                .collect();
            out.insert((layer, module, gemm), list);
        }
        ("shadow", out, BTreeMap::new())
    } else if run.manifest.source.is_external() && !comparable {
        let what = if base.is_some() {
            "shadow GEMM records, and dumped tensors in both runs to compare"
        } else {
            "shadow GEMM records and a baseline with dumped tensors"
        };
        note = Some(lacking(run, what, "GEMMs are ranked by the share of their operands' values the FP8 casts lost (underflow + saturation, from the stats)"));
        if let Some(b) = base {
            warnings.push(format!("baseline '{}' is not used: the tensors of both runs are needed to compare them", b.name));
        }
        ("stats", stats_errors(run)?, BTreeMap::new())
    } else {
        let Some(base) = base else {
            return Err(AnalyzeError::Missing {
                run: run.name.clone(),
                message: "has no shadow records; give --baseline B, or record the run with --shadow".into(),
            });
        };
        let (e, i, w) = tensor_errors(run, base, threshold)?;
        warnings.extend(w);
        ("tensors", e, i)
    };
    let warm = warmup_until(run)?;
    for (id, v) in errors.iter_mut() {
        if let Some(&until) = warm.get(id) {
            for e in v.iter_mut() {
                e.warmup = e.step <= until;
            }
        }
    }
    let by_harm = errors.values().flatten().any(|e| e.harm.is_some());
    let naming = &run.naming;
    let limit = 1.0 - threshold;
    let mut ranked: Vec<LocatedGemm> = errors
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(id, mut v)| {
            v.sort_by_key(|e| e.step);
            // Scored steps: after warm-up (every step if the run never left it).
            let scored = scored_steps(&v);
            let best = |key: &dyn Fn(&StepError) -> f64| scored.iter().fold(scored[0], |b, e| if key(e) > key(b) { e } else { b });
            let by_error = best(&|e: &StepError| e.added);
            let (score, peak_step) = if by_harm {
                let h = best(&finite_harm);
                (finite_harm(h), h.step)
            } else {
                (by_error.added, by_error.step)
            };
            let first_crossed = scored.iter().find(|e| e.added > limit).map(|e| e.step);
            let harm_total = by_harm.then(|| scored.iter().map(|e| finite_harm(e)).sum::<f64>());
            let signed_total = scored.iter().map(|e| e.signed.map(|s| if s.is_finite() { s } else { 0.0 })).sum::<Option<f64>>();
            let (peak_error, peak_error_step) = (by_error.added, by_error.step);
            let (layer, module, gemm) = id.clone();
            LocatedGemm {
                gemm_name: naming.gemm(layer, &module, &gemm),
                site: naming.site(layer, &module),
                execution_rank: rank_of(naming, &id),
                warmup_until: warm.get(&id).copied(),
                harm_total,
                signed_total,
                nonfinite_at: None,
                headroom_ratio: None,
                layer,
                module,
                gemm,
                score,
                peak_step,
                peak_error,
                peak_error_step,
                first_crossed,
                inputs: inputs.get(&id).cloned().unwrap_or_default(),
                errors: v,
                evidence: Vec::new(),
                evidence_at_peak: Vec::new(),
            }
        })
        .collect();
    // A GEMM whose operand went non-finite first (in execution order, at the earliest step any
    // did) does unbounded harm: it ranks first, at that step, whether or not a dump step saw it.
    let (steps, loss) = loss_curve(run)?;
    if let Some(x) = find_nonfinite(run, &steps, &loss)?.first_tensor {
        if let Some(g) = ranked.iter_mut().find(|g| g.layer == x.layer && g.module == x.module && Some(&g.gemm) == x.gemm.as_ref()) {
            g.score = f64::INFINITY;
            g.peak_step = x.step;
            g.nonfinite_at = Some(x.step);
        }
        if overflow_diverges(run) {
            let ratios = headroom_ratios(run, x.step)?;
            for g in &mut ranked {
                g.headroom_ratio = ratios.get(&(g.layer, g.module.clone(), g.gemm.clone())).copied();
            }
        }
    }
    ranked.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.execution_rank.cmp(&b.execution_rank)).then(a.gemm_name.cmp(&b.gemm_name)));
    for g in &mut ranked {
        let id = (g.layer, g.module.clone(), g.gemm.clone());
        let step = g.first_crossed.unwrap_or(g.peak_step);
        g.evidence = evidence(run, &id, step)?;
        if g.peak_step != step {
            g.evidence_at_peak = evidence(run, &id, g.peak_step)?;
        }
    }
    let first = ranked.iter().filter_map(|g| g.first_crossed.map(|s| (s, g.execution_rank, &g.gemm_name))).min().map(|(_, _, n)| n.clone());
    let ranked_by = if by_harm {
        "harm"
    } else if method == "stats" {
        "cast loss"
    } else {
        "added error"
    };
    let stats_caveat = run.manifest.stats_decimals().map(rounding_caveat);
    Ok(LocateReport {
        run: run.name.clone(),
        baseline: base.map(|b| b.name.clone()),
        method,
        ranked_by,
        note,
        stats_caveat,
        threshold,
        first,
        ranked,
        warnings,
    })
}
