//! The group each amax was actually reduced over (`amax_group`).
//!
//! For every cast (step, tensor, rank) with both amaxes, each candidate set's max of the ranks'
//! `amax_local` is compared with the `amax_used` the rank's scale came from (relative tolerance
//! [`AMAX_REL_TOL`](super::rules::AMAX_REL_TOL)). The candidates are the rank alone (`local`), every
//! partition of [`Mesh`] (each declared group, their combinations, `world`), smallest first; the
//! first that reproduces `amax_used` is the row's inferred set (`none` when none does).
//!
//! The configured set is [`Mesh::expected`] of the role (the manifest's `amax_groups`, or the
//! default of `Parallel::amax_groups_of`). A cast whose configured set does not reproduce its
//! `amax_used` is a mismatch; a finding per tensor names its first step, the mismatching ranks at
//! that step, and, as `value`, the smallest candidate that reproduces `amax_used` on *every*
//! mismatching row of the tensor (the set the job reduced over), `none` when no candidate does.
//!
//! A set's max is known only where every rank of the set has the cast at that step (a rank that
//! stopped or left no parts makes its sets unknown from then on); a cast whose configured set's max
//! is unknown is not checked, and a candidate whose max is unknown reproduces nothing. A component's
//! max comes from a window over the batch when the component lies whole in it, and from the maxima
//! merged across batches otherwise.

use super::finding::{check, Finding};
use super::keys::{kid_in, Keys, KID};
use super::mesh::{Mesh, Partition};
use super::rules::AMAX_REL_TOL;
use crate::load::{f64s, i64s, strs};
use fp8scope_schemas::names::SiteNaming;
use fp8scope_schemas::tables::col as c;
use polars::prelude::*;
use std::collections::BTreeMap;

/// `|m − u| ≤ tol · max(|m|, |u|)` (false where either is null).
fn matches(m: Expr, u: Expr) -> Expr {
    let (am, au) = (m.clone().abs(), u.clone().abs());
    let bigger = when(am.clone().gt(au.clone())).then(am).otherwise(au);
    (m - u).abs().lt_eq(lit(AMAX_REL_TOL) * bigger).fill_null(lit(false))
}

fn m_col(p: usize) -> String {
    format!("m{p}")
}
fn g_col(p: usize) -> String {
    format!("g{p}")
}
fn gn_col(p: usize) -> String {
    format!("gn{p}")
}
fn ok_col(p: usize) -> String {
    format!("ok{p}")
}

/// Pass 1: the max of `amax_local` per (component, step, tensor) over the rows of the components of
/// partition `p` listed in `cross` (those that span batches), to be merged with [`merge_max`].
pub fn partial_max(batch: LazyFrame, p: usize, cross: &[u32]) -> LazyFrame {
    let pc = Partition::column(p);
    batch
        .filter(col(pc.as_str()).is_in(lit(Series::new("c".into(), cross.to_vec())).implode(false), false))
        .group_by([col(pc.as_str()), col(c::STEP), col(KID)])
        .agg([col(c::AMAX_LOCAL).max().alias(g_col(p)), col(c::AMAX_LOCAL).count().cast(DataType::Int64).alias(gn_col(p))])
}

/// Partial maxima of several batches merged.
pub fn merge_max(lf: LazyFrame, p: usize) -> LazyFrame {
    let pc = Partition::column(p);
    lf.group_by([col(pc.as_str()), col(c::STEP), col(KID)]).agg([col(g_col(p)).max(), col(gn_col(p)).sum()])
}

/// What pass 2 needs of the mesh, fixed for the run.
pub struct Plan {
    /// Per partition, the maxima of its components that span batches (None: every component lies
    /// whole in a batch).
    pub globals: Vec<Option<DataFrame>>,
    /// The roles' configured partitions (None: the rank's own tensor) and labels.
    pub expected: Vec<(String, Option<usize>, String)>,
}

/// Pass 2 over one batch: every cast with both amaxes, its candidates' maxima, whether the
/// configured set reproduces `amax_used`, the inferred set. The frame holds one row per cast:
/// rank, step, kid, amax_used, m_exp, mismatch, ok_local, ok{p}…, inferred.
pub fn judge(batch: LazyFrame, mesh: &Mesh, plan: &Plan, keys: &Keys) -> PolarsResult<LazyFrame> {
    let mut lf = batch.filter(col(c::AMAX_LOCAL).is_not_null().and(col(c::AMAX_USED).is_not_null()));
    for (p, _) in mesh.partitions.iter().enumerate() {
        let pc = Partition::column(p);
        let by = [col(pc.as_str()), col(c::STEP), col(KID)];
        let window = col(c::AMAX_LOCAL).max().over(by.clone())?;
        let count = col(c::AMAX_LOCAL).count().cast(DataType::Int64).over(by.clone())?;
        let (m, n) = match &plan.globals[p] {
            Some(g) => {
                lf = lf.join(g.clone().lazy(), by.clone(), by.clone(), JoinArgs::new(JoinType::Left));
                let spans = col(g_col(p)).is_not_null();
                (when(spans.clone()).then(col(g_col(p))).otherwise(window), when(spans).then(col(gn_col(p))).otherwise(count))
            }
            None => (window, count),
        };
        // A set's max is known only when every rank of it has the cast at that step.
        let size = col(Partition::size_column(p));
        lf = lf.with_column(when(n.eq(size)).then(m).otherwise(lit(Null {}).cast(DataType::Float32)).alias(m_col(p)));
    }
    let u = || col(c::AMAX_USED).cast(DataType::Float64);
    let local = || col(c::AMAX_LOCAL).cast(DataType::Float64);
    let mut flags = vec![matches(local(), u()).alias("ok_local")];
    for p in 0..mesh.partitions.len() {
        flags.push(matches(col(m_col(p)).cast(DataType::Float64), u()).alias(ok_col(p)));
    }
    lf = lf.with_columns(flags);
    // The inferred set: the first candidate that reproduces amax_used.
    let mut inferred = lit("none");
    for (p, part) in mesh.partitions.iter().enumerate().rev() {
        inferred = when(col(ok_col(p))).then(lit(part.label.clone())).otherwise(inferred);
    }
    let inferred = when(col("ok_local")).then(lit("local")).otherwise(inferred);
    // The configured set's max, by role.
    let mut m_exp = lit(Null {}).cast(DataType::Float64);
    for (role, exp, _) in plan.expected.iter().rev() {
        let value = match exp {
            Some(p) => col(m_col(*p)).cast(DataType::Float64),
            None => local(),
        };
        m_exp = when(kid_in(&keys.of_role(role))).then(value).otherwise(m_exp);
    }
    let mut keep = vec![col(c::RANK), col(c::STEP), col(KID), u().alias(c::AMAX_USED), col("m_exp"), col("mismatch"), col("ok_local")];
    keep.extend((0..mesh.partitions.len()).map(|p| col(ok_col(p))));
    keep.push(col("inferred"));
    Ok(lf
        .with_column(m_exp.alias("m_exp"))
        .with_columns([
            col("m_exp").is_not_null().and(matches(col("m_exp"), u()).not()).alias("mismatch"),
            inferred.alias("inferred"),
        ])
        .select(keep))
}

/// Per tensor of a judged batch: casts checked, mismatches, their first and last step, and for
/// each candidate how many mismatching casts it does not reproduce.
pub fn summary(judged: LazyFrame, mesh: &Mesh) -> LazyFrame {
    let mm = || col("mismatch");
    let mut aggs = vec![
        col("m_exp").is_not_null().sum().cast(DataType::Int64).alias("checked"),
        mm().sum().cast(DataType::Int64).alias("n"),
        col(c::STEP).filter(mm()).min().alias("first"),
        col(c::STEP).filter(mm()).max().alias("last"),
        mm().and(col("ok_local").not()).sum().cast(DataType::Int64).alias("fail_local"),
    ];
    for p in 0..mesh.partitions.len() {
        aggs.push(mm().and(col(ok_col(p)).not()).sum().cast(DataType::Int64).alias(format!("fail{p}")));
    }
    judged.group_by([col(KID)]).agg(aggs)
}

/// Summaries of several batches merged.
pub fn merge_summaries(lf: LazyFrame, mesh: &Mesh) -> LazyFrame {
    let mut aggs = vec![col("checked").sum(), col("n").sum(), col("first").min(), col("last").max(), col("fail_local").sum()];
    aggs.extend((0..mesh.partitions.len()).map(|p| col(format!("fail{p}")).sum()));
    lf.group_by([col(KID)]).agg(aggs)
}

/// Per tensor and inferred set: mismatching casts.
pub fn labels(judged: LazyFrame) -> LazyFrame {
    judged.filter(col("mismatch")).group_by([col(KID), col("inferred")]).agg([len().cast(DataType::Int64).alias("n")])
}

/// The mismatching casts at each tensor's first mismatching step (of this batch).
pub fn first_rows(judged: LazyFrame) -> PolarsResult<LazyFrame> {
    Ok(judged
        .filter(col("mismatch"))
        .filter(col(c::STEP).eq(col(c::STEP).min().over([col(KID)])?))
        .select([col(c::RANK), col(c::STEP), col(KID), col(c::AMAX_USED), col("m_exp"), col("inferred")]))
}

/// The findings, from the merged summary, label counts and first rows of every batch.
pub fn findings(mesh: &Mesh, plan: &Plan, summary: &DataFrame, label_counts: &DataFrame, rows: &DataFrame, keys: &Keys, naming: &SiteNaming) -> PolarsResult<Vec<Finding>> {
    let (kid, n, first, last) = (i64s(summary, KID)?, i64s(summary, "n")?, i64s(summary, "first")?, i64s(summary, "last")?);
    let checked = i64s(summary, "checked")?;
    let fail_local = i64s(summary, "fail_local")?;
    let fails: Vec<Vec<Option<i64>>> = (0..mesh.partitions.len()).map(|p| i64s(summary, &format!("fail{p}"))).collect::<PolarsResult<_>>()?;
    let (lk, ll, ln) = (i64s(label_counts, KID)?, strs(label_counts, "inferred")?, i64s(label_counts, "n")?);
    let (rr, rs, rk, ru, rm) = (i64s(rows, c::RANK)?, i64s(rows, c::STEP)?, i64s(rows, KID)?, f64s(rows, c::AMAX_USED)?, f64s(rows, "m_exp")?);
    let mut out = Vec::new();
    for i in 0..summary.height() {
        let (Some(k), Some(f)) = (kid[i], first[i]) else { continue };
        if n[i].unwrap_or(0) == 0 {
            continue;
        }
        let Some(key) = keys.get(k as u32) else { continue };
        let consistent = if fail_local[i] == Some(0) {
            "local".to_string()
        } else {
            (0..mesh.partitions.len()).find(|&p| fails[p][i] == Some(0)).map_or("none".to_string(), |p| mesh.partitions[p].label.clone())
        };
        let expected = plan.expected.iter().find(|e| e.0 == key.role).map_or("local".to_string(), |e| e.2.clone());
        let mut ranks: Vec<u32> = Vec::new();
        let mut example: Option<(f64, f64)> = None;
        for j in 0..rows.height() {
            if rk[j] == Some(k) && rs[j] == Some(f) {
                if let Some(r) = rr[j] {
                    ranks.push(r as u32);
                    if example.is_none() {
                        example = ru[j].zip(rm[j]);
                    }
                }
            }
        }
        ranks.sort_unstable();
        ranks.dedup();
        let mut per_row: BTreeMap<i64, String> = BTreeMap::new();
        for j in 0..label_counts.height() {
            if lk[j] == Some(k) {
                per_row.insert(-ln[j].unwrap_or(0), format!("{} ×{}", ll[j].clone().unwrap_or_default(), ln[j].unwrap_or(0)));
            }
        }
        let per_row: Vec<String> = per_row.into_values().collect();
        let site = naming.site(key.layer, &key.module);
        let mut fd = Finding::new(check::AMAX_GROUP);
        fd.step = Some(f);
        fd.module = Some(site.clone());
        fd.role = Some(key.role.clone());
        fd.gemm = Some(key.gemm.clone());
        fd.ranks = ranks.clone();
        fd.group = Some(expected.clone());
        fd.value = serde_json::Value::from(consistent.clone());
        fd.expected = serde_json::Value::from(expected.clone());
        let (used, exp_max) = example.unwrap_or((f64::NAN, f64::NAN));
        fd.magnitude = format!("reduced over {consistent}, not {expected} (amax_used {} vs {})", crate::output::num(used), crate::output::num(exp_max));
        let span = match last[i] {
            Some(l) if l > f => format!("steps {f}–{l}"),
            _ => format!("step {f}"),
        };
        fd.message = format!(
            "{site}.{} amax_used is not the max of the configured set '{expected}' on {} of {} casts ({span}); at step {f} rank(s) {:?} used {} where the max over '{expected}' is {}; the smallest set that reproduces every such amax_used is '{consistent}' (per cast: {})",
            key.role,
            n[i].unwrap_or(0),
            checked[i].unwrap_or(0),
            ranks,
            crate::output::num(used),
            crate::output::num(exp_max),
            per_row.join(", ")
        );
        out.push(fd);
    }
    Ok(out)
}
