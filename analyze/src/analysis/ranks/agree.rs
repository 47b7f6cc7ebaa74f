//! Values that must agree across the ranks of a group (`scale_disagrees`, `digest_disagrees`).
//!
//! The rule of each group kind (schemas/README.md, `parallel.groups`):
//! - **dp** (replicas): a weight's `scale`, `amax_used` and `digest` are equal on every rank of the
//!   instance, bit for bit;
//! - **fsdp** (the weight is gathered for the forward): a weight's `scale` and `amax_used`;
//! - **tp** (one logical tensor over the group): every role's `scale` and `amax_used`, for the
//!   casts that every rank of the instance made at that step.
//!
//! Per (instance, step, tensor) the min, max, non-null and NaN counts of each value are taken (they
//! merge across batches when an instance spans several); the values disagree when min ≠ max, or
//! when some but not all are NaN. Per (group, tensor) the first and last step that disagree and the
//! count are kept; the ranks are named afterwards from the rows at the first step only: in each
//! instance that disagrees there, the ranks whose value is not the instance's majority (on a tie,
//! the value the lowest rank holds), and by how much (relative).

use super::finding::{check, majority, num, rel_gap, Finding};
use super::keys::{kid_in, Keys, KID};
use super::mesh::{Mesh, Partition};
use crate::load::{f64s, i64s};
use fp8scope_schemas::names::SiteNaming;
use fp8scope_schemas::ranks::GroupKind;
use fp8scope_schemas::tables::col as c;
use polars::prelude::*;
use std::collections::BTreeMap;

/// The values a group kind must agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Value {
    Scale,
    AmaxUsed,
    Digest,
}

impl Value {
    pub const ALL: [Value; 3] = [Value::Scale, Value::AmaxUsed, Value::Digest];
    pub fn column(self) -> &'static str {
        match self {
            Value::Scale => c::SCALE,
            Value::AmaxUsed => c::AMAX_USED,
            Value::Digest => c::DIGEST,
        }
    }
    fn prefix(self) -> &'static str {
        match self {
            Value::Scale => "s",
            Value::AmaxUsed => "a",
            Value::Digest => "d",
        }
    }
    /// Whether `kind` must agree on this value.
    pub fn checked_by(self, kind: GroupKind) -> bool {
        match self {
            Value::Digest => kind == GroupKind::Dp,
            _ => true,
        }
    }
}

/// The partial aggregate of one partition over rows of a batch: per (component, step, tensor).
pub fn partial(lf: LazyFrame, pcol: &str) -> LazyFrame {
    let mut aggs = vec![len().cast(DataType::Int64).alias("n")];
    for v in Value::ALL {
        let (x, p) = (v.column(), v.prefix());
        aggs.push(col(x).min().alias(format!("{p}_min")));
        aggs.push(col(x).max().alias(format!("{p}_max")));
        aggs.push(col(x).count().cast(DataType::Int64).alias(format!("{p}_n")));
        if v != Value::Digest {
            aggs.push(col(x).is_nan().sum().cast(DataType::Int64).alias(format!("{p}_nan")));
        }
    }
    lf.filter(col(pcol).is_not_null()).group_by([col(pcol), col(c::STEP), col(KID)]).agg(aggs)
}

/// Partial aggregates of several batches merged into one per (component, step, tensor).
pub fn merge(lf: LazyFrame, pcol: &str) -> LazyFrame {
    let mut aggs = vec![col("n").sum().alias("n")];
    for v in Value::ALL {
        let p = v.prefix();
        aggs.push(col(format!("{p}_min")).min());
        aggs.push(col(format!("{p}_max")).max());
        aggs.push(col(format!("{p}_n")).sum());
        if v != Value::Digest {
            aggs.push(col(format!("{p}_nan")).sum());
        }
    }
    lf.group_by([col(pcol), col(c::STEP), col(KID)]).agg(aggs)
}

/// Whole (component, step, tensor) aggregates judged, summarised per tensor: how many were
/// compared, and per value the first and last step that disagree and how many did.
pub fn summarize(whole: LazyFrame, pcol: &str, kind: GroupKind, part: &Partition, keys: &Keys) -> PolarsResult<LazyFrame> {
    let sizes = DataFrame::new(
        part.sizes.len(),
        vec![
            Column::new(pcol.into(), (0..part.sizes.len() as u32).collect::<Vec<_>>()),
            Column::new("size".into(), part.sizes.iter().map(|&s| s as i64).collect::<Vec<_>>()),
        ],
    )?;
    let roles = if kind == GroupKind::Tp { lit(true) } else { kid_in(&keys.of_role("weight")) };
    let present = if kind == GroupKind::Tp { col("n").eq(col("size")) } else { lit(true) };
    let eligible = roles.and(col("n").gt_eq(lit(2i64))).and(present);
    let mut flags = Vec::new();
    let mut aggs = vec![len().cast(DataType::Int64).alias("compared")];
    for v in Value::ALL {
        let p = v.prefix();
        let differ = col(format!("{p}_min")).neq(col(format!("{p}_max")));
        let nan = if v == Value::Digest {
            lit(false)
        } else {
            col(format!("{p}_nan")).gt(lit(0i64)).and(col(format!("{p}_nan")).lt(col(format!("{p}_n"))))
        };
        let bad = if v.checked_by(kind) { col(format!("{p}_n")).gt_eq(lit(2i64)).and(differ.fill_null(lit(false)).or(nan)) } else { lit(false) };
        flags.push(bad.alias(format!("{p}_bad")));
        let b = col(format!("{p}_bad"));
        aggs.push(col(c::STEP).filter(b.clone()).min().alias(format!("{p}_first")));
        aggs.push(col(c::STEP).filter(b.clone()).max().alias(format!("{p}_last")));
        aggs.push(b.sum().cast(DataType::Int64).alias(format!("{p}_count")));
    }
    Ok(whole
        .join(sizes.lazy(), [col(pcol)], [col(pcol)], JoinArgs::new(JoinType::Left))
        .filter(eligible)
        .with_columns(flags)
        .group_by([col(KID)])
        .agg(aggs))
}

/// Per-tensor summaries of several batches merged.
pub fn merge_summaries(lf: LazyFrame) -> LazyFrame {
    let mut aggs = vec![col("compared").sum()];
    for v in Value::ALL {
        let p = v.prefix();
        aggs.push(col(format!("{p}_first")).min());
        aggs.push(col(format!("{p}_last")).max());
        aggs.push(col(format!("{p}_count")).sum());
    }
    lf.group_by([col(KID)]).agg(aggs)
}

/// A (group, tensor, value) that disagreed, before its ranks are named.
#[derive(Clone, Debug)]
pub struct Disagreement {
    /// Index into `Mesh::checked`.
    pub group: usize,
    pub kid: u32,
    pub value: Value,
    pub first: i64,
    pub last: i64,
    pub count: i64,
    pub compared: i64,
}

/// The disagreements in a merged summary of group `group`, and how many were compared.
pub fn disagreements(summary: &DataFrame, group: usize) -> PolarsResult<(Vec<Disagreement>, i64)> {
    let kid = i64s(summary, KID)?;
    let compared = i64s(summary, "compared")?;
    let mut out = Vec::new();
    for v in Value::ALL {
        let p = v.prefix();
        let (first, last, count) = (i64s(summary, &format!("{p}_first"))?, i64s(summary, &format!("{p}_last"))?, i64s(summary, &format!("{p}_count"))?);
        for i in 0..summary.height() {
            if let (Some(f), Some(k)) = (first[i], kid[i]) {
                out.push(Disagreement {
                    group,
                    kid: k as u32,
                    value: v,
                    first: f,
                    last: last[i].unwrap_or(f),
                    count: count[i].unwrap_or(0),
                    compared: compared[i].unwrap_or(0),
                });
            }
        }
    }
    Ok((out, compared.iter().flatten().sum()))
}

/// The (tensor, step) pairs whose rows name the ranks of the disagreements of partition column
/// `pcol`, as a frame to join a batch with.
pub fn targets(found: &[&Disagreement]) -> PolarsResult<DataFrame> {
    let mut pairs: Vec<(u32, i64)> = found.iter().map(|d| (d.kid, d.first)).collect();
    pairs.sort_unstable();
    pairs.dedup();
    DataFrame::new(
        pairs.len(),
        vec![Column::new(KID.into(), pairs.iter().map(|p| p.0).collect::<Vec<_>>()), Column::new(c::STEP.into(), pairs.iter().map(|p| p.1).collect::<Vec<_>>())],
    )
}

/// The rows of a batch at the targets' (tensor, step), with the component of partition `pcol`.
pub fn target_rows(batch: LazyFrame, pcol: &str, targets: &DataFrame) -> LazyFrame {
    batch
        .filter(col(pcol).is_not_null())
        .join(targets.clone().lazy(), [col(KID), col(c::STEP)], [col(KID), col(c::STEP)], JoinArgs::new(JoinType::Inner))
        .select([col(c::RANK), col(pcol).alias("comp"), col(c::STEP), col(KID), col(c::SCALE), col(c::AMAX_USED), col(c::DIGEST)])
}

/// The findings of the disagreements of one checked group, their ranks named from `rows` (the
/// targets' rows of every batch). `scale` and `amax_used` of one tensor make one
/// `scale_disagrees` (the value that disagreed first; scale on a tie).
pub fn findings(mesh: &Mesh, group: usize, found: &[Disagreement], rows: &DataFrame, keys: &Keys, naming: &SiteNaming) -> PolarsResult<Vec<Finding>> {
    let checked = &mesh.checked[group];
    let (rank, comp, step, kid) = (i64s(rows, c::RANK)?, i64s(rows, "comp")?, i64s(rows, c::STEP)?, i64s(rows, KID)?);
    let scale = f64s(rows, c::SCALE)?;
    let amax = f64s(rows, c::AMAX_USED)?;
    let digest = i64s(rows, c::DIGEST)?;
    let mut by_tensor: BTreeMap<(u32, bool), Vec<&Disagreement>> = BTreeMap::new();
    for d in found.iter().filter(|d| d.group == group) {
        by_tensor.entry((d.kid, d.value == Value::Digest)).or_default().push(d);
    }
    let mut out = Vec::new();
    for ((k, is_digest), ds) in by_tensor {
        let Some(key) = keys.get(k) else { continue };
        // The value that disagreed first (scale before amax_used on the same step).
        let Some(d) = ds.iter().min_by_key(|d| (d.first, d.value)).copied() else { continue };
        let other = ds.iter().find(|o| o.value != d.value).copied();
        // Per component, the (rank, value) at the first step.
        let mut comps: BTreeMap<i64, Vec<(u32, f64, u64)>> = BTreeMap::new();
        for i in 0..rows.height() {
            if kid[i] != Some(k as i64) || step[i] != Some(d.first) {
                continue;
            }
            let (Some(r), Some(cmp)) = (rank[i], comp[i]) else { continue };
            let val = match d.value {
                Value::Scale => scale[i].map(|x| (x, (x as f32).to_bits() as u64)),
                Value::AmaxUsed => amax[i].map(|x| (x, (x as f32).to_bits() as u64)),
                Value::Digest => digest[i].map(|x| (x as f64, x as u64)),
            };
            if let Some((x, bits)) = val {
                comps.entry(cmp).or_default().push((r as u32, x, bits));
            }
        }
        let mut off_ranks: Vec<u32> = Vec::new();
        // (relative gap, value, majority, value bits, majority bits, instance)
        let mut worst: Option<(f64, f64, f64, u64, u64, Vec<u32>)> = None;
        let mut instances = 0usize;
        for vals in comps.values() {
            let pairs: Vec<(u32, u64)> = vals.iter().map(|v| (v.0, v.2)).collect();
            let Some((maj, off)) = majority(&pairs) else { continue };
            if off.is_empty() {
                continue;
            }
            instances += 1;
            let maj_x = vals.iter().find(|v| v.2 == maj).map_or(f64::NAN, |v| v.1);
            for v in vals.iter().filter(|v| v.2 != maj) {
                let gap = if d.value == Value::Digest { 1.0 } else { rel_gap(v.1, maj_x) };
                let gap_key = if gap.is_nan() { f64::INFINITY } else { gap };
                if worst.as_ref().is_none_or(|w| gap_key > w.0) {
                    let mut inst: Vec<u32> = vals.iter().map(|v| v.0).collect();
                    inst.sort_unstable();
                    worst = Some((gap_key, v.1, maj_x, v.2, maj, inst));
                }
            }
            off_ranks.extend(off);
        }
        off_ranks.sort_unstable();
        off_ranks.dedup();
        let site = naming.site(key.layer, &key.module);
        let what = match d.value {
            Value::Scale => "scale",
            Value::AmaxUsed => "amax_used",
            Value::Digest => "FP8 bytes (digest)",
        };
        let mut f = Finding::new(if is_digest { check::DIGEST_DISAGREES } else { check::SCALE_DISAGREES });
        f.step = Some(d.first);
        f.module = Some(site.clone());
        f.role = Some(key.role.clone());
        f.gemm = Some(key.gemm.clone());
        f.ranks = off_ranks.clone();
        f.group = Some(checked.name.clone());
        let span = if d.last > d.first { format!("steps {}–{}", d.first, d.last) } else { format!("step {}", d.first) };
        let tail = format!(
            "{} of {} ({} instance, step) pairs disagree, {span}",
            d.count,
            d.compared,
            checked.name
        );
        let also = other.map(|o| format!("; amax_used too, {} pairs from step {}", o.count, o.first)).filter(|_| d.value == Value::Scale).unwrap_or_default();
        let also = if d.value == Value::AmaxUsed { other.map(|o| format!("; scale too, {} pairs from step {}", o.count, o.first)).unwrap_or_default() } else { also };
        match &worst {
            Some((gap, x, maj, _, _, inst)) if d.value != Value::Digest => {
                f.value = num(*x);
                f.expected = num(*maj);
                f.magnitude = format!("{what} {} vs {} (rel {:.2e})", crate::output::num(*x), crate::output::num(*maj), gap);
                f.message = format!(
                    "{site}.{} {what} differs across {} {} instance(s) at step {}: rank(s) {:?} of instance {:?} hold {} where the majority holds {} (relative gap {:.3e}); {tail}{also}",
                    key.role,
                    instances,
                    checked.name,
                    d.first,
                    off_ranks,
                    inst,
                    crate::output::num(*x),
                    crate::output::num(*maj),
                    gap
                );
            }
            Some((_, _, _, xb, mb, inst)) => {
                let (x, maj) = (*xb as i64, *mb as i64);
                f.value = serde_json::Value::from(x);
                f.expected = serde_json::Value::from(maj);
                f.magnitude = format!("digest {x} vs {maj}");
                f.message = format!(
                    "{site}.{} {what} differ across {} {} replica instance(s) at step {}: rank(s) {:?} of instance {:?} hold digest {} where the majority holds {}; {tail}",
                    key.role, instances, checked.name, d.first, off_ranks, inst, x, maj
                );
            }
            None => {
                f.magnitude = format!("{what} differs");
                f.message = format!("{site}.{} {what} differs across {} instances at step {}; {tail}{also}", key.role, checked.name, d.first);
            }
        }
        out.push(f);
    }
    Ok(out)
}

/// The column of the components of partition `p`.
pub fn pcol(p: usize) -> String {
    Partition::column(p)
}
