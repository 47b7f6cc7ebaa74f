//! The two passes over the casts table that the agreement, amax-group and audit checks share.
//!
//! Pass 1 reads each batch of ranks once (only the columns the checks need, the tensor as one id,
//! each rank's component of every partition joined on) and computes: the agreement of the
//! components that lie whole in the batch (finished there) and the partial aggregates of those
//! that span batches; the partial maxima of `amax_local` of the spanning components; the audits.
//! Between the passes the partial results are merged. Pass 2 reads each batch again to infer the
//! reduction set of every cast (it needs the maxima of the spanning components) and to collect the
//! rows that name the ranks of each disagreement at its first step. A run read in one batch is read
//! once.

use super::agree::{self, Disagreement};
use super::amax;
use super::audits::{self, AUDITS};
use super::finding::Finding;
use super::keys::{Keys, KID};
use super::mesh::{Mesh, Partition};
use super::rules::BATCH_ROWS;
use super::scan::{self, RankParts};
use crate::error::AnalyzeError;
use crate::load::i64s;
use fp8scope_schemas::config::RecipeKind;
use fp8scope_schemas::layout::Table;
use fp8scope_schemas::names::SiteNaming;
use fp8scope_schemas::tables::col as c;
use polars::prelude::*;
use std::collections::BTreeSet;

/// What the casts checks found and counted.
#[derive(Default, Debug)]
pub struct CastsResult {
    pub findings: Vec<Finding>,
    pub rows: u64,
    pub ranks: usize,
    pub batches: usize,
    /// (instance, step, tensor) groups compared by the agreement checks.
    pub agreement_compared: i64,
    /// Casts whose reduction set was checked.
    pub amax_checked: i64,
    /// Casts with the cast audit, with the forward-weight audit.
    pub cast_audits: i64,
    pub weight_audits: i64,
    pub steps: BTreeSet<i64>,
    pub not_checked: Vec<String>,
}

const COLUMNS: [&str; 10] = [c::STEP, c::RANK, c::LAYER, c::MODULE, c::GEMM, c::ROLE, c::SCALE, c::AMAX_LOCAL, c::AMAX_USED, c::DIGEST];

fn concat_frames(frames: Vec<DataFrame>) -> PolarsResult<Option<LazyFrame>> {
    if frames.is_empty() {
        return Ok(None);
    }
    Ok(Some(concat(frames.into_iter().map(|f| f.lazy()).collect::<Vec<_>>(), UnionArgs { parallel: false, rechunk: false, ..Default::default() })?))
}

fn ids(v: &[u32]) -> Expr {
    lit(Series::new("ids".into(), v.to_vec())).implode(false)
}

/// Runs every casts check over `parts` (the casts table by rank).
pub fn check(run: &str, parts: &[RankParts], mesh: &Mesh, naming: &SiteNaming, recipe: RecipeKind) -> Result<CastsResult, AnalyzeError> {
    let e = |e: PolarsError| AnalyzeError::scan(run, "casts", e);
    let mut res = CastsResult { rows: parts.iter().map(|p| p.rows).sum(), ranks: parts.len(), ..Default::default() };
    let present: Vec<(u32, u64)> = parts.iter().map(|p| (p.rank, p.rows)).collect();
    let batches = mesh.batches(&present, BATCH_ROWS);
    res.batches = batches.len();
    let parts_of = |b: &[u32]| -> Vec<&RankParts> { parts.iter().filter(|p| b.contains(&p.rank)).collect() };
    let whole: Vec<Vec<Option<usize>>> = (0..mesh.partitions.len()).map(|p| mesh.whole_in(p, &batches)).collect();
    let here_comps = |p: usize| -> Vec<bool> {
        let mut h = vec![false; mesh.partitions[p].len()];
        for r in &present {
            if let Some(&cmp) = mesh.partitions[p].comp.get(r.0 as usize) {
                h[cmp as usize] = true;
            }
        }
        h
    };
    // Per partition, the components with data that span batches.
    let cross: Vec<Vec<u32>> = (0..mesh.partitions.len())
        .map(|p| {
            let h = here_comps(p);
            whole[p].iter().enumerate().filter(|(i, w)| w.is_none() && h[*i]).map(|(i, _)| i as u32).collect()
        })
        .collect();
    let infer_reason = match recipe {
        RecipeKind::Delayed => Some("amax groups: the recipe is delayed scaling, whose amax_used comes from an amax history, not from this step's amaxes"),
        RecipeKind::Block => Some("amax groups: block scaling keeps one scale per block, with no per-tensor amax reduction"),
        RecipeKind::Bf16 => Some("amax groups: the recipe is bf16 (no FP8 casts to reduce)"),
        RecipeKind::Current => None,
    };
    let mapping = mesh.mapping().map_err(e)?;
    let mut keys = Keys::default();
    let load = |b: &[u32], keys: &mut Keys| -> Result<DataFrame, AnalyzeError> {
        let mut cols: Vec<&str> = COLUMNS.to_vec();
        cols.extend(audits::COLUMNS);
        let lf = scan::scan(run, Table::Casts, &parts_of(b), &cols)?;
        let df = scan::collect(run, Table::Casts, lf)?;
        let df = keys.encode(df).map_err(e)?;
        df.lazy().join(mapping.clone().lazy(), [col(c::RANK)], [col(c::RANK)], JoinArgs::new(JoinType::Left)).collect().map_err(e)
    };

    // ------------------------------------------------------------------ pass 1
    let mut summaries: Vec<Vec<DataFrame>> = vec![Vec::new(); mesh.checked.len()];
    let mut partials: Vec<Vec<DataFrame>> = vec![Vec::new(); mesh.checked.len()];
    let mut max_parts: Vec<Vec<DataFrame>> = vec![Vec::new(); mesh.partitions.len()];
    let mut audit_sums: Vec<Vec<DataFrame>> = vec![Vec::new(); AUDITS.len()];
    let mut audit_rows: Vec<Vec<DataFrame>> = vec![Vec::new(); AUDITS.len()];
    let mut both_amaxes = 0i64;
    let mut kept: Option<DataFrame> = None;
    for (b, ranks) in batches.iter().enumerate() {
        let bd = load(ranks, &mut keys)?;
        let steps = bd.column(c::STEP).map_err(e)?.unique().map_err(e)?;
        res.steps.extend(steps.cast(&DataType::Int64).map_err(e)?.i64().map_err(e)?.iter().flatten());
        for (gi, g) in mesh.checked.iter().enumerate() {
            let pc = Partition::column(g.partition);
            let here: Vec<u32> = whole[g.partition].iter().enumerate().filter(|(_, w)| **w == Some(b)).map(|(i, _)| i as u32).collect();
            if !here.is_empty() {
                let part = agree::partial(bd.clone().lazy().filter(col(pc.as_str()).is_in(ids(&here), false)), &pc);
                let s = agree::summarize(part, &pc, g.kind, &mesh.partitions[g.partition], &keys).map_err(e)?;
                summaries[gi].push(s.collect().map_err(e)?);
            }
            if !cross[g.partition].is_empty() {
                let part = agree::partial(bd.clone().lazy().filter(col(pc.as_str()).is_in(ids(&cross[g.partition]), false)), &pc);
                partials[gi].push(part.collect().map_err(e)?);
            }
        }
        if infer_reason.is_none() {
            for p in 0..mesh.partitions.len() {
                if !cross[p].is_empty() {
                    max_parts[p].push(amax::partial_max(bd.clone().lazy(), p, &cross[p]).collect().map_err(e)?);
                }
            }
        }
        let n_both = bd.clone().lazy().select([col(c::AMAX_LOCAL).is_not_null().and(col(c::AMAX_USED).is_not_null()).sum().cast(DataType::Int64).alias("n")]).collect().map_err(e)?;
        both_amaxes += i64s(&n_both, "n").map_err(e)?.into_iter().flatten().sum::<i64>();
        for (ai, a) in AUDITS.iter().enumerate() {
            let flagged = a.flagged(bd.clone().lazy()).collect().map_err(e)?;
            if flagged.height() > 0 {
                audit_sums[ai].push(audits::summary(flagged.clone().lazy()).collect().map_err(e)?);
                audit_rows[ai].push(audits::first_rows(flagged.lazy()).map_err(e)?.collect().map_err(e)?);
            }
        }
        let counted = audits::audited(bd.clone().lazy()).collect().map_err(e)?;
        res.cast_audits += i64s(&counted, "cast_audits").map_err(e)?.into_iter().flatten().sum::<i64>();
        res.weight_audits += i64s(&counted, "weight_audits").map_err(e)?.into_iter().flatten().sum::<i64>();
        if batches.len() == 1 {
            kept = Some(bd);
        }
    }

    // ------------------------------------------------------------------ merge
    let mut found: Vec<Disagreement> = Vec::new();
    for (gi, g) in mesh.checked.iter().enumerate() {
        let pc = Partition::column(g.partition);
        if let Some(lf) = concat_frames(std::mem::take(&mut partials[gi])).map_err(e)? {
            let merged = agree::merge(lf, &pc);
            let s = agree::summarize(merged, &pc, g.kind, &mesh.partitions[g.partition], &keys).map_err(e)?;
            summaries[gi].push(s.collect().map_err(e)?);
        }
        if let Some(lf) = concat_frames(std::mem::take(&mut summaries[gi])).map_err(e)? {
            let s = agree::merge_summaries(lf).collect().map_err(e)?;
            let (d, compared) = agree::disagreements(&s, gi).map_err(e)?;
            res.agreement_compared += compared;
            found.extend(d);
        }
    }
    let infer = match infer_reason {
        Some(r) => {
            res.not_checked.push(r.to_string());
            false
        }
        None if both_amaxes == 0 => {
            res.not_checked.push("amax groups: no cast has both amax_local and amax_used".into());
            false
        }
        None => true,
    };
    let mut plan = amax::Plan { globals: vec![None; mesh.partitions.len()], expected: Vec::new() };
    if infer {
        for p in 0..mesh.partitions.len() {
            if let Some(lf) = concat_frames(std::mem::take(&mut max_parts[p])).map_err(e)? {
                plan.globals[p] = Some(amax::merge_max(lf, p).collect().map_err(e)?);
            }
        }
        plan.expected = keys.roles().into_iter().map(|r| (r.clone(), mesh.expected(&r), mesh.expected_label(&r))).collect();
    }

    // ------------------------------------------------------------------ pass 2
    let mut name_rows: Vec<Vec<DataFrame>> = vec![Vec::new(); mesh.checked.len()];
    let targets: Vec<Option<DataFrame>> = (0..mesh.checked.len())
        .map(|gi| {
            let mine: Vec<&Disagreement> = found.iter().filter(|d| d.group == gi).collect();
            if mine.is_empty() { Ok(None) } else { agree::targets(&mine).map(Some) }
        })
        .collect::<PolarsResult<_>>()
        .map_err(e)?;
    let (mut amax_sums, mut amax_labels, mut amax_rows) = (Vec::new(), Vec::new(), Vec::new());
    if infer || targets.iter().any(Option::is_some) {
        for ranks in &batches {
            let bd = match kept.take() {
                Some(bd) => bd,
                None => load(ranks, &mut keys)?,
            };
            for (gi, g) in mesh.checked.iter().enumerate() {
                if let Some(t) = &targets[gi] {
                    let pc = Partition::column(g.partition);
                    name_rows[gi].push(agree::target_rows(bd.clone().lazy(), &pc, t).collect().map_err(e)?);
                }
            }
            if infer {
                let judged = amax::judge(bd.lazy(), mesh, &plan, &keys).map_err(e)?.collect().map_err(e)?;
                amax_sums.push(amax::summary(judged.clone().lazy(), mesh).collect().map_err(e)?);
                amax_labels.push(amax::labels(judged.clone().lazy()).collect().map_err(e)?);
                amax_rows.push(amax::first_rows(judged.lazy()).map_err(e)?.collect().map_err(e)?);
            }
        }
    }

    // ------------------------------------------------------------------ findings
    for (gi, _) in mesh.checked.iter().enumerate() {
        if let Some(lf) = concat_frames(std::mem::take(&mut name_rows[gi])).map_err(e)? {
            let rows = lf.collect().map_err(e)?;
            res.findings.extend(agree::findings(mesh, gi, &found, &rows, &keys, naming).map_err(e)?);
        }
    }
    if infer {
        if let (Some(s), Some(l), Some(r)) = (concat_frames(amax_sums).map_err(e)?, concat_frames(amax_labels).map_err(e)?, concat_frames(amax_rows).map_err(e)?) {
            let s = amax::merge_summaries(s, mesh).collect().map_err(e)?;
            res.amax_checked = i64s(&s, "checked").map_err(e)?.into_iter().flatten().sum();
            let l = l.group_by([col(KID), col("inferred")]).agg([col("n").sum()]).collect().map_err(e)?;
            let r = r.collect().map_err(e)?;
            res.findings.extend(amax::findings(mesh, &plan, &s, &l, &r, &keys, naming).map_err(e)?);
        }
    }
    for (ai, a) in AUDITS.iter().enumerate() {
        if let (Some(s), Some(r)) = (concat_frames(std::mem::take(&mut audit_sums[ai])).map_err(e)?, concat_frames(std::mem::take(&mut audit_rows[ai])).map_err(e)?) {
            let s = audits::merge_summaries(s).collect().map_err(e)?;
            let r = r.collect().map_err(e)?;
            res.findings.extend(audits::findings(a, &s, &r, &keys, naming).map_err(e)?);
        }
    }
    Ok(res)
}
