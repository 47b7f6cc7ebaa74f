//! `compare RUN --baseline B`: the run's dumped tensors against the baseline's, per (step, layer,
//! module, role): cosine, MSE, relative L2, SQNR dB, max abs diff, accumulated in f64; tensors
//! whose cosine is below the threshold (or not finite) are flagged.
//!
//! Two runs with the same seed, data and dump flags write the same tensors in the same order, so
//! the two tables are walked side by side without a join: rows are aligned on (step, layer,
//! module, role, offset), steps only one run dumped are skipped, and any other mismatch is an
//! incompatibility named by its tensor. Each run's parts are decoded on their own thread
//! ([`crate::tensors`]); memory stays a few batches whatever the dump's size.

use crate::analysis::compat;
use crate::analysis::metrics::{Accum, Metrics};
use crate::analysis::provenance::lacking;
use crate::error::AnalyzeError;
use crate::load::{Run, distinct_i64};
use crate::tensors::TensorCursor;
use fp8scope_schemas::layout::Table;
use fp8scope_schemas::manifest::lacks;
use fp8scope_schemas::tables::col;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// The comparison of one tensor of the run with the baseline's at one step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TensorComparison {
    pub step: i64,
    pub layer: i64,
    pub module: String,
    pub role: String,
    /// `layers.1.fc1.gradient`.
    pub tensor: String,
    #[serde(flatten)]
    pub metrics: Metrics,
    /// cosine < threshold, or not finite.
    pub flagged: bool,
}

/// Everything `compare` found.
#[derive(Clone, Debug, Serialize)]
pub struct CompareReport {
    pub run: String,
    pub baseline: String,
    pub threshold: f64,
    /// Dump steps both runs hold.
    pub common_steps: Vec<i64>,
    /// How many tensors are flagged.
    pub flagged: usize,
    pub warnings: Vec<String>,
    /// Why nothing was compared, when a run lacks dumped tensors (None when compared).
    pub unavailable: Option<String>,
    /// Sorted by step, then execution order.
    pub tensors: Vec<TensorComparison>,
}

impl CompareReport {
    pub fn flagged(&self) -> impl Iterator<Item = &TensorComparison> {
        self.tensors.iter().filter(|t| t.flagged)
    }
}

/// Checks that the runs can be compared, then streams and compares their tensors.
pub fn compare_runs(run: &Run, base: &Run, threshold: f64) -> Result<CompareReport, AnalyzeError> {
    if !(threshold > -1.0 && threshold <= 1.0) {
        return Err(AnalyzeError::usage(format!("--threshold must be a cosine in (-1, 1], got {threshold}")));
    }
    for r in [run, base] {
        if !r.has(Table::Tensors)? {
            let how = if r.manifest.source.is_external() { "" } else { " (record it with --dump-every N)" };
            return Ok(CompareReport {
                run: run.name.clone(),
                baseline: base.name.clone(),
                threshold,
                common_steps: Vec::new(),
                flagged: 0,
                warnings: Vec::new(),
                unavailable: Some(lacking(r, lacks::DUMPS, &format!("there is nothing to compare tensor by tensor{how}"))),
                tensors: Vec::new(),
            });
        }
    }
    compat::check_model(run, base)?;
    compat::check_dump_selection(run, base)?;
    let steps_a = distinct_i64(run, Table::Tensors, col::STEP)?;
    let steps_b = distinct_i64(base, Table::Tensors, col::STEP)?;
    let common = compat::common_steps("dump", run, &steps_a, base, &steps_b)?;
    let sums = align_and_accumulate(run, base, &common)?;
    let naming = &run.naming;
    let mut tensors: Vec<TensorComparison> = sums
        .into_iter()
        .map(|((step, layer, module, role), acc)| {
            let metrics = acc.finish();
            let flagged = !(metrics.cosine >= threshold);
            TensorComparison { step, layer, tensor: naming.tensor(layer, &module, &role), module, role, metrics, flagged }
        })
        .collect();
    tensors.sort_by(|a, b| {
        (a.step, naming.rank(a.layer, &a.module, &a.role), &a.module, &a.role).cmp(&(b.step, naming.rank(b.layer, &b.module, &b.role), &b.module, &b.role))
    });
    Ok(CompareReport {
        run: run.name.clone(),
        baseline: base.name.clone(),
        threshold,
        common_steps: common.into_iter().collect(),
        flagged: tensors.iter().filter(|t| t.flagged).count(),
        warnings: compat::warnings(run, base),
        unavailable: None,
        tensors,
    })
}

type TensorId = (i64, i64, String, String);

/// Walks both tensors tables in step with each other and accumulates the metrics per tensor.
fn align_and_accumulate(run: &Run, base: &Run, common: &BTreeSet<i64>) -> Result<BTreeMap<TensorId, Accum>, AnalyzeError> {
    let mut a = TensorCursor::open(run, Some(common.clone()))?;
    let mut b = TensorCursor::open(base, Some(common.clone()))?;
    let mut sums: BTreeMap<TensorId, Accum> = BTreeMap::new();
    let mut current: Option<(TensorId, Accum)> = None;
    while let (Some(sa), Some(sb)) = (a.peek_step()?, b.peek_step()?) {
        // Steps that only one run dumped (or that are not common) are skipped row by row.
        if sa < sb || !common.contains(&sa) {
            a.advance();
            continue;
        }
        if sb < sa || !common.contains(&sb) {
            b.advance();
            continue;
        }
        let (Some(ka), Some(kb)) = (a.peek()?, b.peek()?) else { break };
        if ka != kb {
            return Err(AnalyzeError::incompatible(format!(
                "the dumped tensors differ at step {}: run '{}' has {}, baseline '{}' has {} (different dump selections or tensor order)",
                ka.step,
                run.name,
                ka.describe(),
                base.name,
                kb.describe()
            )));
        }
        let (va, vb) = (a.values(), b.values());
        if va.len() != vb.len() {
            return Err(AnalyzeError::incompatible(format!(
                "{} at step {} holds {} values in run '{}' but {} in baseline '{}' (different dump sizes)",
                ka.describe(),
                ka.step,
                va.len(),
                run.name,
                vb.len(),
                base.name
            )));
        }
        let id: TensorId = (ka.step, ka.layer as i64, ka.module, ka.role);
        // Rows of one tensor are usually consecutive: keep its sums at hand.
        match &mut current {
            Some((cur, acc)) if *cur == id => acc.add(va, vb),
            _ => {
                if let Some((cur, acc)) = current.take() {
                    merge(&mut sums, cur, acc);
                }
                let mut acc = Accum::default();
                acc.add(va, vb);
                current = Some((id, acc));
            }
        }
        a.advance();
        b.advance();
    }
    if let Some((cur, acc)) = current.take() {
        merge(&mut sums, cur, acc);
    }
    Ok(sums)
}

fn merge(sums: &mut BTreeMap<TensorId, Accum>, id: TensorId, acc: Accum) {
    let e = sums.entry(id).or_default();
    e.n += acc.n;
    e.dot += acc.dot;
    e.aa += acc.aa;
    e.bb += acc.bb;
    e.dd += acc.dd;
    e.max_abs = e.max_abs.max(acc.max_abs);
    e.nonfinite += acc.nonfinite;
}
