//! The group each amax was actually reduced over (`amax_group`).
//!
//! For every cast (step, tensor, rank) with both amaxes, each candidate set's max of the ranks'
//! `amax_local` is compared with the `amax_used` the rank's scale came from (relative tolerance
//! [`AMAX_REL_TOL`](super::rules::AMAX_REL_TOL)). The candidates are the rank alone (`local`), then
//! every partition of [`Mesh`] (each declared group, their combinations, `world`), smallest first;
//! the first that reproduces `amax_used` is the cast's inferred set (`none` when none does).
//!
//! The configured set is [`Mesh::expected`] of the role (the manifest's `amax_groups`, or the
//! default of `Parallel::amax_groups_of`). A cast whose configured set does not reproduce its
//! `amax_used` is a mismatch; a finding per tensor names its first step, the mismatching ranks at
//! that step, and, as `value`, the smallest candidate that reproduces `amax_used` on *every*
//! mismatching cast of the tensor (the set the job reduced over), `none` when no candidate does.
//!
//! A set's max is known only where every rank of the set has the cast at that step (a rank that
//! stopped or left no parts makes its sets unknown from then on); a cast whose configured set's max
//! is unknown is not checked, and a candidate whose max is unknown reproduces nothing.

use super::finding::{Finding, check};
use super::keys::Keys;
use super::mesh::Mesh;
use super::rules::amax_matches;
use super::store::{self, Store};
use fp8scope_schemas::names::SiteNaming;
use std::collections::BTreeMap;

/// One tensor's mismatches so far.
#[derive(Clone, Debug, Default)]
pub struct Tensor {
    /// Casts whose configured set's max was known.
    pub checked: i64,
    pub mismatches: i64,
    pub first: Option<i64>,
    pub last: i64,
    /// Mismatching casts that `local`, and each partition, does not reproduce.
    pub fail_local: i64,
    pub fail: Vec<i64>,
    /// Mismatching casts by inferred set (index 0 `local`, 1 + p partition p, last `none`).
    pub labels: Vec<i64>,
    /// The ranks that mismatch at the first step, and one (amax_used, configured max) there.
    pub ranks: Vec<u32>,
    pub example: Option<(f64, f64)>,
}

/// What the amax check has found so far, by tensor id.
#[derive(Default, Debug)]
pub struct Amax {
    pub tensors: BTreeMap<u32, Tensor>,
}

impl Amax {
    pub fn checked(&self) -> i64 {
        self.tensors.values().map(|t| t.checked).sum()
    }
}

/// Max and count of `amax_local` per component of partition `p` at one (tensor, step).
fn fill(b: &store::Block, base: usize, n: usize, comp: &[u32], m: &mut [f32], cnt: &mut [u32]) {
    m.iter_mut().for_each(|x| *x = f32::NEG_INFINITY);
    cnt.iter_mut().for_each(|x| *x = 0);
    for (r, &c) in comp.iter().enumerate().take(n) {
        if b.flags(base + r) & store::LOCAL != 0 {
            let c = c as usize;
            m[c] = m[c].max(b.local[base + r]);
            cnt[c] += 1;
        }
    }
}

/// Infers the reduction set of every cast of the window.
pub fn check_window(st: &Store, mesh: &Mesh, keys: &Keys, acc: &mut Amax) {
    let n = st.n;
    let np = mesh.partitions.len();
    let mut m: Vec<Vec<f32>> = mesh.partitions.iter().map(|p| vec![0.0; p.len()]).collect();
    let mut cnt: Vec<Vec<u32>> = mesh.partitions.iter().map(|p| vec![0; p.len()]).collect();
    let order = st.order();
    for (kid, block) in st.blocks.iter().enumerate() {
        let Some(b) = block else { continue };
        let Some(key) = keys.get(kid as u32) else { continue };
        let expected = mesh.expected(&key.role);
        let t = acc.tensors.entry(kid as u32).or_insert_with(|| Tensor { fail: vec![0; np], labels: vec![0; np + 2], ..Default::default() });
        for &s in &order {
            let step = st.steps[s];
            let base = s * n;
            if let Some(p) = expected {
                fill(b, base, n, &mesh.partitions[p].comp, &mut m[p], &mut cnt[p]);
            }
            let mut others_filled = false;
            for r in 0..n {
                let f = b.flags(base + r);
                if f & (store::LOCAL | store::USED) != (store::LOCAL | store::USED) {
                    continue;
                }
                let (local, used) = (b.local[base + r] as f64, b.used[base + r] as f64);
                let known = |p: usize, m: &[Vec<f32>], cnt: &[Vec<u32>]| -> Option<f64> {
                    let part = &mesh.partitions[p];
                    let c = part.comp[r] as usize;
                    (cnt[p][c] == part.sizes[c]).then(|| m[p][c] as f64)
                };
                let m_exp = match expected {
                    None => Some(local),
                    Some(p) => known(p, &m, &cnt),
                };
                let Some(m_exp) = m_exp else { continue };
                t.checked += 1;
                if amax_matches(m_exp, used) {
                    continue;
                }
                if !others_filled {
                    for p in 0..np {
                        if Some(p) != expected {
                            fill(b, base, n, &mesh.partitions[p].comp, &mut m[p], &mut cnt[p]);
                        }
                    }
                    others_filled = true;
                }
                t.mismatches += 1;
                t.last = t.last.max(step);
                let ok_local = amax_matches(local, used);
                t.fail_local += i64::from(!ok_local);
                let mut label = if ok_local { Some(0) } else { None };
                for p in 0..np {
                    let ok = known(p, &m, &cnt).is_some_and(|x| amax_matches(x, used));
                    t.fail[p] += i64::from(!ok);
                    if ok && label.is_none() {
                        label = Some(p + 1);
                    }
                }
                t.labels[label.unwrap_or(np + 1)] += 1;
                if t.first.is_none() {
                    t.first = Some(step);
                }
                if t.first == Some(step) {
                    t.ranks.push(r as u32);
                    if t.example.is_none() {
                        t.example = Some((used, m_exp));
                    }
                }
            }
        }
    }
}

/// The findings, one per tensor with a mismatch.
pub fn findings(mesh: &Mesh, acc: &Amax, keys: &Keys, naming: &SiteNaming) -> Vec<Finding> {
    let np = mesh.partitions.len();
    let label = |i: usize| -> String {
        match i {
            0 => "local".into(),
            i if i <= np => mesh.partitions[i - 1].label.clone(),
            _ => "none".into(),
        }
    };
    let mut out = Vec::new();
    for (kid, t) in &acc.tensors {
        let (Some(first), Some(key)) = (t.first, keys.get(*kid)) else { continue };
        let consistent = if t.fail_local == 0 {
            "local".to_string()
        } else {
            (0..np).find(|&p| t.fail[p] == 0).map_or("none".to_string(), |p| mesh.partitions[p].label.clone())
        };
        let expected = mesh.expected_label(&key.role);
        let mut ranks = t.ranks.clone();
        ranks.sort_unstable();
        ranks.dedup();
        let mut per_cast: Vec<(i64, String)> = t.labels.iter().enumerate().filter(|(_, n)| **n > 0).map(|(i, n)| (-*n, format!("{} ×{n}", label(i)))).collect();
        per_cast.sort();
        let site = naming.site(key.layer, &key.module);
        let (used, exp_max) = t.example.unwrap_or((f64::NAN, f64::NAN));
        let span = if t.last > first { format!("steps {first}–{}", t.last) } else { format!("step {first}") };
        let mut f = Finding::new(check::AMAX_GROUP);
        f.step = Some(first);
        f.module = Some(site.clone());
        f.role = Some(key.role.clone());
        f.gemm = Some(key.gemm.clone());
        f.ranks = ranks.clone();
        f.group = Some(expected.clone());
        f.value = serde_json::Value::from(consistent.clone());
        f.expected = serde_json::Value::from(expected.clone());
        f.magnitude = format!("reduced over {consistent}, not {expected} (amax_used {} vs {})", crate::output::num(used), crate::output::num(exp_max));
        f.message = format!(
            "{site}.{} amax_used is not the max of the configured set '{expected}' on {} of {} casts ({span}); at step {first} rank(s) {:?} used {} where the max over '{expected}' is {}; the smallest set that reproduces every such amax_used is '{consistent}' (per cast: {})",
            key.role,
            t.mismatches,
            t.checked,
            ranks,
            crate::output::num(used),
            crate::output::num(exp_max),
            per_cast.into_iter().map(|x| x.1).collect::<Vec<_>>().join(", ")
        );
        out.push(f);
    }
    out
}
