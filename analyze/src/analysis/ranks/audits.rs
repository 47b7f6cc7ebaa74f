//! The integrity audits of the casts table, per rank (`cast_mismatch`, `forward_weight_mismatch`,
//! `stale_forward_weight`).
//!
//! - `cast_mismatch`: `audit_mismatched > 0`: bytes of the module's own cast differ from
//!   fp8scope's reference cast of the same values at the module's scale;
//! - `forward_weight_mismatch`: `master_mismatched > 0`: the weight the forward used is not this
//!   rank's master weight quantized at the module's scale (a gather that went wrong);
//! - `stale_forward_weight`: `master_changed` and not `forward_changed`: the optimizer moved the
//!   master weight and the forward still used the old FP8 weight.
//!
//! Per batch, the casts each audit flags are summarised per tensor (first and last step, casts,
//! elements that differ) and the flagged casts at the tensor's first step are kept; the batches'
//! results merge into one finding per (audit, tensor) naming the ranks at the first step.

use super::finding::{check, Finding};
use super::keys::{Keys, KID};
use crate::load::i64s;
use fp8scope_schemas::names::SiteNaming;
use fp8scope_schemas::tables::col as c;
use polars::prelude::*;

/// One audit: its check name, the rows it flags, and its counts.
pub struct Audit {
    pub check: &'static str,
    /// Elements that differ, per flagged cast (null for the stale-weight audit).
    pub mismatched: Option<&'static str>,
    /// Elements compared.
    pub checked: &'static str,
}

pub const AUDITS: [Audit; 3] = [
    Audit { check: check::CAST_MISMATCH, mismatched: Some(c::AUDIT_MISMATCHED), checked: c::AUDIT_CHECKED },
    Audit { check: check::FORWARD_WEIGHT_MISMATCH, mismatched: Some(c::MASTER_MISMATCHED), checked: c::MASTER_CHECKED },
    Audit { check: check::STALE_FORWARD_WEIGHT, mismatched: None, checked: c::MASTER_CHECKED },
];

/// The columns the audits read.
pub const COLUMNS: [&str; 6] = [c::AUDIT_CHECKED, c::AUDIT_MISMATCHED, c::MASTER_CHECKED, c::MASTER_MISMATCHED, c::MASTER_CHANGED, c::FORWARD_CHANGED];

impl Audit {
    /// The casts this audit flags.
    pub fn flags(&self) -> Expr {
        match self.mismatched {
            Some(m) => col(m).gt(lit(0i64)).fill_null(lit(false)),
            None => col(c::MASTER_CHANGED).eq(lit(true)).and(col(c::FORWARD_CHANGED).eq(lit(false))).fill_null(lit(false)),
        }
    }
    fn mismatched_expr(&self) -> Expr {
        match self.mismatched {
            Some(m) => col(m).cast(DataType::Int64),
            None => lit(1i64),
        }
    }

    /// The flagged casts of a batch: rank, step, kid, mismatched, checked.
    pub fn flagged(&self, batch: LazyFrame) -> LazyFrame {
        batch.filter(self.flags()).select([
            col(c::RANK),
            col(c::STEP),
            col(KID),
            self.mismatched_expr().alias("mismatched"),
            col(self.checked).cast(DataType::Int64).alias("checked"),
        ])
    }
}

/// Per tensor of flagged casts: first and last step, casts, elements that differ.
pub fn summary(flagged: LazyFrame) -> LazyFrame {
    flagged.group_by([col(KID)]).agg([
        col(c::STEP).min().alias("first"),
        col(c::STEP).max().alias("last"),
        len().cast(DataType::Int64).alias("casts"),
        col("mismatched").sum().alias("mismatched"),
    ])
}

/// Summaries of several batches merged.
pub fn merge_summaries(lf: LazyFrame) -> LazyFrame {
    lf.group_by([col(KID)]).agg([col("first").min(), col("last").max(), col("casts").sum(), col("mismatched").sum()])
}

/// The flagged casts at each tensor's first flagged step (of this batch).
pub fn first_rows(flagged: LazyFrame) -> PolarsResult<LazyFrame> {
    Ok(flagged.filter(col(c::STEP).eq(col(c::STEP).min().over([col(KID)])?)))
}

/// Rows audited in a batch: casts with the cast audit, casts with the forward-weight audit.
pub fn audited(batch: LazyFrame) -> LazyFrame {
    batch.select([
        col(c::AUDIT_CHECKED).is_not_null().sum().cast(DataType::Int64).alias("cast_audits"),
        col(c::MASTER_CHECKED).is_not_null().or(col(c::MASTER_CHANGED).is_not_null()).sum().cast(DataType::Int64).alias("weight_audits"),
    ])
}

/// The findings of one audit from its merged summary and the first rows of every batch.
pub fn findings(audit: &Audit, summary: &DataFrame, rows: &DataFrame, keys: &Keys, naming: &SiteNaming) -> PolarsResult<Vec<Finding>> {
    let (kid, first, last, casts, mism) = (i64s(summary, KID)?, i64s(summary, "first")?, i64s(summary, "last")?, i64s(summary, "casts")?, i64s(summary, "mismatched")?);
    let (rr, rs, rk, rm, rc) = (i64s(rows, c::RANK)?, i64s(rows, c::STEP)?, i64s(rows, KID)?, i64s(rows, "mismatched")?, i64s(rows, "checked")?);
    let mut out = Vec::new();
    for i in 0..summary.height() {
        let (Some(k), Some(f)) = (kid[i], first[i]) else { continue };
        let Some(key) = keys.get(k as u32) else { continue };
        let mut ranks = Vec::new();
        let (mut at_first, mut checked_first) = (0i64, 0i64);
        for j in 0..rows.height() {
            if rk[j] == Some(k) && rs[j] == Some(f) {
                if let Some(r) = rr[j] {
                    ranks.push(r as u32);
                }
                at_first += rm[j].unwrap_or(0);
                checked_first += rc[j].unwrap_or(0);
            }
        }
        ranks.sort_unstable();
        ranks.dedup();
        let site = naming.site(key.layer, &key.module);
        let span = match last[i] {
            Some(l) if l > f => format!("steps {f}–{l}"),
            _ => format!("step {f}"),
        };
        let n = casts[i].unwrap_or(0);
        let mut fd = Finding::new(audit.check);
        fd.step = Some(f);
        fd.module = Some(site.clone());
        fd.role = Some(key.role.clone());
        fd.gemm = Some(key.gemm.clone());
        fd.ranks = ranks.clone();
        match audit.mismatched {
            Some(_) => {
                fd.value = serde_json::Value::from(at_first);
                fd.expected = serde_json::Value::from(0);
                let what = if audit.check == check::CAST_MISMATCH {
                    "bytes of the module's cast differ from the reference cast at its scale"
                } else {
                    "elements of the forward's FP8 weight differ from the master weight quantized at the module's scale"
                };
                fd.magnitude = format!("{at_first} of {checked_first} elements differ");
                fd.message = format!(
                    "{site}.{}: {at_first} of {checked_first} {what} at step {f} on rank(s) {:?}; {n} audited cast(s) flagged, {} element(s) in all, {span}",
                    key.role,
                    ranks,
                    mism[i].unwrap_or(0)
                );
            }
            None => {
                fd.value = serde_json::Value::from(false);
                fd.expected = serde_json::Value::from(true);
                fd.magnitude = format!("forward weight unchanged on {n} step(s)");
                fd.message = format!(
                    "{site}.{}: the master weight changed but the forward's FP8 weight did not at step {f} on rank(s) {:?}: the forward used a stale weight; {n} rank-step(s), {span}",
                    key.role, ranks
                );
            }
        }
        out.push(fd);
    }
    Ok(out)
}
