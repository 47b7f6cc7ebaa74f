//! What a rank's casts table says about each weight's forward cast: the digest of its FP8 bytes
//! (schemas/README.md: Σ byte·(i mod 65521 + 1) over the row-major bytes, mod 2⁶³, so replicas of a
//! weight compare), and whether the master weight and the forward's FP8 weight changed since the
//! previous step (a master that moved under a forward that did not is a stale forward weight). And
//! the fault that makes one: `kind=stale-weight` keeps a rank's weight of one site, and its scale,
//! as its forward had them at the step before the fault (Megatron-LM #5707).

use crate::backend::{Backend, GemmId, OperandCast, ScaleSource};
use crate::fp8;
use crate::model::{Layout, Model, StepPlan};
use fp8scope_schemas::names::{Gemm, Module, Site};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

/// The digest modulus of the schema's checksum.
const DIGEST_MOD: usize = 65521;

/// Σ byte·(i mod 65521 + 1), mod 2⁶³.
pub fn digest(bytes: &[u8]) -> i64 {
    let mut acc: u64 = 0;
    for (i, &b) in bytes.iter().enumerate() {
        acc = acc.wrapping_add(b as u64 * ((i % DIGEST_MOD) as u64 + 1));
    }
    (acc & (u64::MAX >> 1)) as i64
}

/// One weight's forward cast at one step, as the casts table records it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WeightCast {
    pub digest: i64,
    pub master_changed: Option<bool>,
    pub forward_changed: Option<bool>,
}

/// The weight of `site` as the fault keeps it: its values and its forward cast.
struct Kept<T> {
    buf: T,
    cast: OperandCast,
}

/// A rank's weights across steps: the previous step's hashes, and the weights a stale-weight fault
/// keeps.
pub struct WeightWatch<T> {
    /// site → (master hash, forward digest) of the previous step.
    prev: HashMap<Site, (u64, i64)>,
    /// (site, first stale step) of this rank's stale-weight faults.
    stale: Vec<(Site, u32)>,
    kept: HashMap<Site, Kept<T>>,
}

fn weight_cast(plan: &StepPlan, site: Site, gemm: Gemm) -> Option<OperandCast> {
    plan.casts.get(&GemmId { layer: site.layer, module: site.module, gemm }).map(|c| c.1)
}

impl<T> WeightWatch<T> {
    pub fn new(stale: Vec<(Site, u32)>) -> Self {
        WeightWatch { prev: HashMap::new(), stale, kept: HashMap::new() }
    }

    /// Before the step's GEMMs: keeps the weights a fault will hold from the next step on, and from
    /// a fault's step puts the kept weight (and its cast's scale, in `plan`) in place of the
    /// master; [`Self::restore`] puts the masters back after the step's GEMMs.
    pub fn before_step<B: Backend<Buf = T>>(&mut self, be: &mut B, model: &mut Model<B>, plan: &mut StepPlan, step: u32) {
        let lay = Layout::of(&model.dims);
        for &(site, from) in &self.stale {
            let w = lay.linear(site.layer as usize, site.module).0;
            if step + 1 == from {
                let n = be.len(&model.state.params[w]);
                let values = be.download(&model.state.params[w], 0, n, 1);
                let cast = weight_cast(plan, site, Gemm::Fprop).unwrap_or(OperandCast::Bf16);
                self.kept.insert(site, Kept { buf: be.upload(&values), cast });
            }
            if step >= from
                && let Some(k) = self.kept.get_mut(&site)
            {
                std::mem::swap(&mut model.state.params[w], &mut k.buf);
                for gemm in [Gemm::Fprop, Gemm::Dgrad] {
                    if let Some(c) = plan.casts.get_mut(&GemmId { layer: site.layer, module: site.module, gemm }) {
                        c.1 = k.cast;
                    }
                }
            }
        }
    }

    /// After the step's GEMMs: the masters back in place.
    pub fn restore<B: Backend<Buf = T>>(&mut self, model: &mut Model<B>, step: u32) {
        let lay = Layout::of(&model.dims);
        for &(site, from) in &self.stale {
            if step >= from
                && let Some(k) = self.kept.get_mut(&site)
            {
                std::mem::swap(&mut model.state.params[lay.linear(site.layer as usize, site.module).0], &mut k.buf);
            }
        }
    }

    /// Between [`Self::before_step`] and the step's GEMMs: every weight's forward cast whose scale
    /// the host gave (delayed scaling), its FP8 bytes' digest and what changed since the last step.
    pub fn observe<B: Backend<Buf = T>>(&mut self, be: &mut B, model: &Model<B>, plan: &StepPlan, step: u32) -> HashMap<Site, WeightCast> {
        let lay = Layout::of(&model.dims);
        let mut out = HashMap::new();
        for layer in 0..model.dims.l as u32 {
            for module in Module::ALL {
                let site = Site::new(layer, module);
                let Some(OperandCast::Fp8Tensor { format, scale: ScaleSource::Given { scale, .. } }) = weight_cast(plan, site, Gemm::Fprop) else { continue };
                let p = &model.state.params[lay.linear(layer as usize, module).0];
                let forward = be.download(p, 0, be.len(p), 1);
                let bytes: Vec<u8> = forward.iter().map(|&x| fp8::cast(format, x, scale)).collect();
                let d = digest(&bytes);
                let master_hash = match self.kept.get(&site) {
                    // The forward holds the kept weight: the master is in the keeper's place.
                    Some(k) if self.stale.iter().any(|&(s, from)| s == site && step >= from) => hash(&be.download(&k.buf, 0, be.len(&k.buf), 1)),
                    _ => hash(&forward),
                };
                let prev = self.prev.insert(site, (master_hash, d));
                out.insert(site, WeightCast { digest: d, master_changed: prev.map(|p| p.0 != master_hash), forward_changed: prev.map(|p| p.1 != d) });
            }
        }
        out
    }
}

/// A hash of the values' bits (only compared with itself).
fn hash(values: &[f32]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    for v in values {
        v.to_bits().hash(&mut h);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The schema's checksum, against the same sum in u128 (no wrap) taken mod 2⁶³.
    #[test]
    fn the_digest_is_the_schemas_checksum() {
        for n in [0usize, 1, 100, DIGEST_MOD - 1, DIGEST_MOD, DIGEST_MOD + 1, 2 * DIGEST_MOD + 17] {
            let bytes: Vec<u8> = (0..n).map(|i| (i * 37 % 256) as u8).collect();
            let want: u128 = bytes.iter().enumerate().map(|(i, &b)| b as u128 * ((i % DIGEST_MOD) as u128 + 1)).sum();
            assert_eq!(digest(&bytes) as u128, want % (1u128 << 63), "n = {n}");
        }
    }
}
