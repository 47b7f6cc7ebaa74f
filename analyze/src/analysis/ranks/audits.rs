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
//! Every flagged cast counts; per (audit, tensor) the finding names the first step, the ranks
//! flagged at that step and the elements that differ there, with the totals.

use super::finding::{Finding, check};
use super::keys::{FxMap, Keys};
use fp8scope_schemas::names::SiteNaming;
use fp8scope_schemas::tables::col as c;

/// The audit columns of one cast.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cols {
    pub audit_checked: Option<i64>,
    pub audit_mismatched: Option<i64>,
    pub master_checked: Option<i64>,
    pub master_mismatched: Option<i64>,
    pub master_changed: Option<bool>,
    pub forward_changed: Option<bool>,
}

/// The columns the audits read.
pub const COLUMNS: [&str; 6] = [c::AUDIT_CHECKED, c::AUDIT_MISMATCHED, c::MASTER_CHECKED, c::MASTER_MISMATCHED, c::MASTER_CHANGED, c::FORWARD_CHANGED];

/// The audits, in the order their findings are built.
pub const CHECKS: [&str; 3] = [check::CAST_MISMATCH, check::FORWARD_WEIGHT_MISMATCH, check::STALE_FORWARD_WEIGHT];

/// Whether audit `a` flags the cast, with the elements that differ and were compared.
fn flags(a: usize, x: &Cols) -> Option<(i64, i64)> {
    match a {
        0 => x.audit_mismatched.filter(|m| *m > 0).map(|m| (m, x.audit_checked.unwrap_or(0))),
        1 => x.master_mismatched.filter(|m| *m > 0).map(|m| (m, x.master_checked.unwrap_or(0))),
        _ => (x.master_changed == Some(true) && x.forward_changed == Some(false)).then_some((1, 0)),
    }
}

/// One (audit, tensor) so far.
#[derive(Clone, Debug, Default)]
struct Flagged {
    first: i64,
    last: i64,
    casts: i64,
    mismatched: i64,
    ranks: Vec<u32>,
    first_mismatched: i64,
    first_checked: i64,
}

/// What the audits have found and counted so far.
#[derive(Default, Debug)]
pub struct Audits {
    found: [FxMap<u32, Flagged>; 3],
    /// Casts with the cast audit, with the forward-weight audit.
    pub cast_audits: i64,
    pub weight_audits: i64,
}

impl Audits {
    /// Counts one cast (rows come in any step order).
    pub fn add(&mut self, kid: u32, rank: u32, step: i64, x: &Cols) {
        self.cast_audits += i64::from(x.audit_checked.is_some());
        self.weight_audits += i64::from(x.master_checked.is_some() || x.master_changed.is_some());
        for a in 0..3 {
            let Some((m, checked)) = flags(a, x) else { continue };
            let f = self.found[a].entry(kid).or_insert_with(|| Flagged { first: step, last: step, ..Default::default() });
            if step < f.first {
                f.first = step;
                f.ranks.clear();
                f.first_mismatched = 0;
                f.first_checked = 0;
            }
            if step == f.first {
                f.ranks.push(rank);
                f.first_mismatched += m;
                f.first_checked += checked;
            }
            f.last = f.last.max(step);
            f.casts += 1;
            f.mismatched += m;
        }
    }

    /// The findings, one per (audit, tensor).
    pub fn findings(&self, keys: &Keys, naming: &SiteNaming) -> Vec<Finding> {
        let mut out = Vec::new();
        for (a, found) in self.found.iter().enumerate() {
            let mut kids: Vec<&u32> = found.keys().collect();
            kids.sort();
            for kid in kids {
                let f = &found[kid];
                let Some(key) = keys.get(*kid) else { continue };
                let mut ranks = f.ranks.clone();
                ranks.sort_unstable();
                ranks.dedup();
                let site = naming.site(key.layer, &key.module);
                let span = if f.last > f.first { format!("steps {}–{}", f.first, f.last) } else { format!("step {}", f.first) };
                let mut fd = Finding::new(CHECKS[a]);
                fd.step = Some(f.first);
                fd.module = Some(site.clone());
                fd.role = Some(key.role.clone());
                fd.gemm = Some(key.gemm.clone());
                fd.ranks = ranks.clone();
                let (m, n) = (f.first_mismatched, f.first_checked);
                if a < 2 {
                    fd.value = serde_json::Value::from(m);
                    fd.expected = serde_json::Value::from(0);
                    let what = if a == 0 {
                        "bytes of the module's cast differ from the reference cast at its scale"
                    } else {
                        "elements of the forward's FP8 weight differ from the master weight quantized at the module's scale"
                    };
                    fd.magnitude = format!("{m} of {n} elements differ");
                    fd.message = format!(
                        "{site}.{}: {m} of {n} {what} at step {} on rank(s) {:?}; {} audited cast(s) flagged, {} element(s) in all, {span}",
                        key.role, f.first, ranks, f.casts, f.mismatched
                    );
                } else {
                    fd.value = serde_json::Value::from(false);
                    fd.expected = serde_json::Value::from(true);
                    fd.magnitude = format!("forward weight unchanged on {} rank-step(s)", f.casts);
                    fd.message = format!(
                        "{site}.{}: the master weight changed but the forward's FP8 weight did not at step {} on rank(s) {:?}: the forward used a stale weight; {} rank-step(s), {span}",
                        key.role, f.first, ranks, f.casts
                    );
                }
                out.push(fd);
            }
        }
        out
    }
}
