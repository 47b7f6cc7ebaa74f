//! Values that must agree across the ranks of a group (`scale_disagrees`, `digest_disagrees`).
//!
//! The rule of each group kind (schemas/README.md, `parallel.groups`):
//! - **dp** (replicas): a weight's `scale`, `amax_used` and `digest` are equal on every rank of the
//!   instance, bit for bit;
//! - **fsdp** (the weight is gathered for the forward): a weight's `scale` and `amax_used`;
//! - **tp** (one logical tensor over the group): every role's `scale` and `amax_used`, for the
//!   casts that every rank of the instance made at that step;
//! - any group a role's amax is configured to be reduced over (`amax_groups`: e.g. Transformer
//!   Engine's delayed scaling with `amax_reduction_group` over dp): that role's `scale` and
//!   `amax_used` too, since every member reduces the same amaxes (a rank that skips the reduction,
//!   as torchtitan #3109 and Megatron-LM PR #442 did, disagrees even where its amax is a history's).
//!
//! Per (instance, step, tensor) with at least two ranks' casts (every rank's, for tp), the values
//! are compared bit for bit (f32 bits; an all-NaN group agrees, NaN against a number does not).
//! Per (group, tensor, value) the first and last step that disagree and how many (instance, step)
//! pairs did are kept; at the first step the ranks are named: in each instance that disagrees
//! there, the ranks whose value is not the instance's majority (on a tie, the value the lowest rank
//! holds), with the largest relative gap to the majority.

use super::finding::{Finding, check, majority, num, rel_gap};
use super::keys::{FxMap, Keys};
use super::mesh::Mesh;
use super::store::{self, Store};
use fp8scope_schemas::names::SiteNaming;
use fp8scope_schemas::ranks::GroupKind;
use std::collections::BTreeMap;

/// The values a group kind must agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Value {
    Scale,
    AmaxUsed,
    Digest,
}

impl Value {
    fn flag(self) -> u8 {
        match self {
            Value::Scale => store::SCALE,
            Value::AmaxUsed => store::USED,
            Value::Digest => store::DIGEST,
        }
    }
    /// The value's bits and its number.
    fn get(self, b: &store::Block, i: usize) -> (u64, f64) {
        match self {
            Value::Scale => (b.scale[i] as u64, f32::from_bits(b.scale[i]) as f64),
            Value::AmaxUsed => (b.used[i].to_bits() as u64, b.used[i] as f64),
            Value::Digest => (b.digest[i] as u64, b.digest[i] as f64),
        }
    }
    fn values(kind: GroupKind) -> &'static [Value] {
        match kind {
            GroupKind::Dp => &[Value::Scale, Value::AmaxUsed, Value::Digest],
            _ => &[Value::Scale, Value::AmaxUsed],
        }
    }
}

/// One (group, tensor, value) that disagreed.
#[derive(Clone, Debug, Default)]
pub struct Disagreement {
    pub first: i64,
    pub last: i64,
    /// (instance, step) pairs that disagree.
    pub count: i64,
    /// Instances that disagree at the first step.
    pub instances: usize,
    /// The ranks off their instance's majority at the first step.
    pub ranks: Vec<u32>,
    /// The largest relative gap there: (gap, value bits, majority bits, value, majority, instance).
    pub worst: Option<(f64, u64, u64, f64, f64, Vec<u32>)>,
}

/// What the agreement check has found so far.
#[derive(Default, Debug)]
pub struct Agreement {
    /// (checked group, tensor, value) → its disagreement.
    pub found: BTreeMap<(usize, u32, Value), Disagreement>,
    /// (checked group, tensor) → (instance, step) pairs compared.
    pub compared: FxMap<(usize, u32), i64>,
}

/// Compares the window's casts within every checked group.
pub fn check_window(st: &Store, mesh: &Mesh, members: &[Vec<Vec<u32>>], keys: &Keys, acc: &mut Agreement) {
    let order = st.order();
    let n = st.n;
    let mut vals: Vec<(u32, u64, f64)> = Vec::new();
    for (gi, g) in mesh.checked.iter().enumerate() {
        let comps = &members[g.partition];
        for (kid, block) in st.blocks.iter().enumerate() {
            let Some(b) = block else { continue };
            let Some(key) = keys.get(kid as u32) else { continue };
            let reduced_over = mesh.parallel.amax_groups_of(&key.role).iter().any(|d| d.name == g.name);
            if g.kind != GroupKind::Tp && key.role != "weight" && !reduced_over {
                continue;
            }
            let mut compared = 0i64;
            for &s in &order {
                let step = st.steps[s];
                for comp in comps {
                    let present = comp.iter().filter(|&&r| b.flags(s * n + r as usize) & store::ROW != 0).count();
                    if present < 2 || (g.kind == GroupKind::Tp && present < comp.len()) {
                        continue;
                    }
                    compared += 1;
                    for &v in Value::values(g.kind) {
                        // Only replicated weights hold the same bytes; a reduced amax does not make
                        // an activation's bytes equal.
                        if v == Value::Digest && key.role != "weight" {
                            continue;
                        }
                        vals.clear();
                        for &r in comp {
                            let i = s * n + r as usize;
                            if b.flags(i) & v.flag() != 0 {
                                let (bits, x) = v.get(b, i);
                                vals.push((r, bits, x));
                            }
                        }
                        if vals.len() < 2 || vals.iter().all(|x| x.1 == vals[0].1) {
                            continue;
                        }
                        let d = acc.found.entry((gi, kid as u32, v)).or_insert_with(|| Disagreement { first: step, ..Default::default() });
                        d.last = d.last.max(step);
                        d.count += 1;
                        if d.first != step {
                            continue;
                        }
                        // The first step: name the ranks off the majority.
                        let pairs: Vec<(u32, u64)> = vals.iter().map(|x| (x.0, x.1)).collect();
                        let Some((maj, off)) = majority(&pairs) else { continue };
                        let maj_x = vals.iter().find(|x| x.1 == maj).map_or(f64::NAN, |x| x.2);
                        d.instances += 1;
                        for x in vals.iter().filter(|x| x.1 != maj) {
                            let gap = if v == Value::Digest { 1.0 } else { rel_gap(x.2, maj_x) };
                            let gap = if gap.is_nan() { f64::INFINITY } else { gap };
                            if d.worst.as_ref().is_none_or(|w| gap > w.0) {
                                d.worst = Some((gap, x.1, maj, x.2, maj_x, comp.clone()));
                            }
                        }
                        d.ranks.extend(off);
                    }
                }
            }
            *acc.compared.entry((gi, kid as u32)).or_default() += compared;
        }
    }
}

/// The findings: per (group, tensor), one `scale_disagrees` (scale or amax_used, whichever
/// disagreed first; scale on a tie) and one `digest_disagrees`.
pub fn findings(mesh: &Mesh, acc: &Agreement, keys: &Keys, naming: &SiteNaming) -> Vec<Finding> {
    let mut by: BTreeMap<(usize, u32, bool), Vec<(Value, &Disagreement)>> = BTreeMap::new();
    for ((gi, kid, v), d) in &acc.found {
        by.entry((*gi, *kid, *v == Value::Digest)).or_default().push((*v, d));
    }
    let mut out = Vec::new();
    for ((gi, kid, is_digest), ds) in by {
        let (Some(key), Some(g)) = (keys.get(kid), mesh.checked.get(gi)) else { continue };
        let Some(&(v, d)) = ds.iter().min_by_key(|(v, d)| (d.first, *v)) else { continue };
        let other = ds.iter().find(|(o, _)| *o != v);
        let compared = acc.compared.get(&(gi, kid)).copied().unwrap_or(0);
        let site = naming.site(key.layer, &key.module);
        let mut ranks = d.ranks.clone();
        ranks.sort_unstable();
        ranks.dedup();
        let what = match v {
            Value::Scale => "scale",
            Value::AmaxUsed => "amax_used",
            Value::Digest => "FP8 bytes (digest)",
        };
        let mut f = Finding::new(if is_digest { check::DIGEST_DISAGREES } else { check::SCALE_DISAGREES });
        f.step = Some(d.first);
        f.module = Some(site.clone());
        f.role = Some(key.role.clone());
        f.gemm = Some(key.gemm.clone());
        f.ranks = ranks.clone();
        f.group = Some(g.name.clone());
        let span = if d.last > d.first { format!("steps {}–{}", d.first, d.last) } else { format!("step {}", d.first) };
        let also = other
            .map(|(o, od)| format!("; {} too, {} pair(s) from step {}", if *o == Value::Scale { "scale" } else { "amax_used" }, od.count, od.first))
            .unwrap_or_default();
        let tail = format!("{} of {} ({} instance, step) pairs disagree, {span}{also}", d.count, compared, g.name);
        let Some((gap, xb, mb, x, maj, inst)) = &d.worst else { continue };
        if is_digest {
            let (x, maj) = (*xb as i64, *mb as i64);
            f.value = serde_json::Value::from(x);
            f.expected = serde_json::Value::from(maj);
            f.magnitude = format!("digest {x} vs {maj}");
            f.message = format!(
                "{site}.{} {what} differ across {} {} replica instance(s) at step {}: rank(s) {:?} (instance {:?}) hold digest {x} where the majority holds {maj}; {tail}",
                key.role, d.instances, g.name, d.first, ranks, inst
            );
        } else {
            f.value = num(*x);
            f.expected = num(*maj);
            f.magnitude = format!("{what} {} vs {} (rel {:.2e})", crate::output::num(*x), crate::output::num(*maj), gap);
            f.message = format!(
                "{site}.{} {what} differs across {} {} instance(s) at step {}: rank(s) {:?} (instance {:?}) hold {} where the majority holds {} (relative gap {:.3e}); {tail}",
                key.role,
                d.instances,
                g.name,
                d.first,
                ranks,
                inst,
                crate::output::num(*x),
                crate::output::num(*maj),
                gap
            );
        }
        out.push(f);
    }
    out
}

/// (instance, step) pairs compared in all.
pub fn compared(acc: &Agreement) -> i64 {
    acc.compared.values().sum()
}
