//! Faults of a job of several ranks, planted with `--inject` (ground truth for `fp8-analyze ranks`):
//!
//! - `kind=amax-local,site=layers.1.fc2,step=S`: from step S on, that site's amaxes are not reduced:
//!   each rank's history takes its own tensor's amax (every rank; torchtitan #3109);
//! - `kind=amax-dp-only,site=layers.1.fc2,step=S` (with --tp 2 or more): from step S on, that
//!   site's tensors that are sharded over the tensor-parallel group (its weight, and the activation
//!   or gradient that is not a replicated input) have their amaxes reduced over dp only, not over
//!   tp: each shard of one logical tensor gets its own scale (Megatron-LM PR #442);
//! - `kind=stale-weight,rank=R,site=layers.1.fc2,step=S` (S ≥ 2): from step S on, rank R's GEMMs of
//!   that site use the weight its forward used at step S − 1: the FP8 weight is not refreshed
//!   after the optimizer step (Megatron-LM #5707), while the master weight goes on moving;
//! - `kind=scale-corrupt,rank=R,site=layers.1.fc2,step=S[,role=weight][,magnitude=16]`: from step S
//!   on, rank R casts that site's `role` (default the weight, which every replica must scale alike)
//!   with its scale × magnitude;
//! - `kind=rank-dies,rank=R,step=S`: rank R's thread stops before step S without closing anything
//!   (its liveness file keeps saying `running`); the other ranks' collectives fail, and they end
//!   the run `crashed`, naming it.

use anyhow::{Context, bail};
use fp8scope_schemas::names::{Role, Site};

/// The kinds of `--inject` that belong here.
pub const KINDS: [&str; 5] = ["amax-local", "amax-dp-only", "scale-corrupt", "stale-weight", "rank-dies"];

/// One planted fault of a job of several ranks.
#[derive(Clone, Debug, PartialEq)]
pub enum DistFault {
    AmaxLocal { site: Site, step: u32 },
    AmaxDpOnly { site: Site, step: u32 },
    StaleWeight { rank: u32, site: Site, step: u32 },
    ScaleCorrupt { rank: u32, site: Site, role: Role, step: u32, factor: f32 },
    RankDies { rank: u32, step: u32 },
}

impl DistFault {
    /// Whether `spec` (an `--inject` value) names one of these kinds.
    pub fn is_dist_spec(spec: &str) -> bool {
        spec.split(',').filter_map(|kv| kv.split_once('=')).any(|(k, v)| k.trim() == "kind" && KINDS.contains(&v.trim()))
    }

    /// Parses one spec; `dp` × `tp` ranks, `n_layers` layers.
    pub fn parse(spec: &str, dp: u32, tp: u32, n_layers: u32) -> anyhow::Result<DistFault> {
        let world = dp * tp;
        let (mut kind, mut site, mut rank, mut step, mut role, mut magnitude) = (None, None, None, None, None, None);
        for kv in spec.split(',') {
            let (k, v) = kv.split_once('=').with_context(|| format!("--inject '{spec}': '{kv}' is not key=value"))?;
            let v = v.trim();
            let num = |what: &str| v.parse::<u32>().with_context(|| format!("--inject '{spec}': {what} '{v}' is not a whole number"));
            match k.trim() {
                "kind" => kind = Some(v.to_string()),
                "site" => site = Some(Site::parse(v).with_context(|| format!("--inject '{spec}': '{v}' is not a site like layers.1.fc2"))?),
                "rank" => rank = Some(num("rank")?),
                "step" => step = Some(num("step")?.max(1)),
                "role" => {
                    role = Some(
                        Role::parse(v)
                            .filter(|r| r.is_quantized())
                            .with_context(|| format!("--inject '{spec}': role must be activation, weight or gradient"))?,
                    )
                }
                "magnitude" | "factor" => {
                    magnitude = Some(
                        v.parse::<f32>()
                            .ok()
                            .filter(|m| m.is_finite() && *m > 0.0)
                            .with_context(|| format!("--inject '{spec}': magnitude '{v}' is not a positive number"))?,
                    )
                }
                other => bail!("--inject '{spec}': unknown key '{other}' (kind, site, rank, step, role, magnitude)"),
            }
        }
        let step = step.unwrap_or(1);
        let need_site = || -> anyhow::Result<Site> {
            let s = site.with_context(|| format!("--inject '{spec}': missing site=layers.N.MODULE"))?;
            if s.layer >= n_layers {
                bail!("--inject '{spec}': the model has layers 0-{}", n_layers - 1);
            }
            Ok(s)
        };
        let need_rank = || -> anyhow::Result<u32> {
            let r = rank.with_context(|| format!("--inject '{spec}': missing rank=R"))?;
            if r >= world {
                bail!("--inject '{spec}': rank {r} is not one of the {world} ranks (--dp {dp} × --tp {tp})");
            }
            Ok(r)
        };
        if world < 2 {
            bail!("--inject '{spec}': a fault of several ranks needs --dp or --tp 2 or more");
        }
        Ok(match kind.as_deref() {
            Some("amax-local") => DistFault::AmaxLocal { site: need_site()?, step },
            Some("amax-dp-only") => {
                if tp < 2 {
                    bail!("--inject '{spec}': amax-dp-only leaves a tensor-parallel shard's amax unreduced over tp; it needs --tp 2 or more");
                }
                DistFault::AmaxDpOnly { site: need_site()?, step }
            }
            Some("stale-weight") => {
                if step < 2 {
                    bail!("--inject '{spec}': stale-weight keeps the weight of the step before; it needs step=2 or later");
                }
                DistFault::StaleWeight { rank: need_rank()?, site: need_site()?, step }
            }
            Some("scale-corrupt") => {
                DistFault::ScaleCorrupt { rank: need_rank()?, site: need_site()?, role: role.unwrap_or(Role::Weight), step, factor: magnitude.unwrap_or(16.0) }
            }
            Some("rank-dies") => DistFault::RankDies { rank: need_rank()?, step },
            _ => bail!("--inject '{spec}': kind must be one of {}", KINDS.join(", ")),
        })
    }

    /// A one-line description, for the events table.
    pub fn describe(&self) -> String {
        match self {
            DistFault::AmaxLocal { site, step } => format!("planted: {site}'s amaxes not reduced from step {step} (each rank's own)"),
            DistFault::AmaxDpOnly { site, step } => {
                format!("planted: {site}'s tensor-parallel shards' amaxes reduced over dp only from step {step} (each shard its own scale)")
            }
            DistFault::StaleWeight { rank, site, step } => {
                format!("planted: rank {rank}'s {site} weight not refreshed after the optimizer step from step {step} (the weight of step {})", step - 1)
            }
            DistFault::ScaleCorrupt { rank, site, role, step, factor } => {
                format!("planted: rank {rank}'s {site}.{} scale × {factor} from step {step}", role.as_str())
            }
            DistFault::RankDies { rank, step } => format!("planted: rank {rank} stops before step {step} without closing"),
        }
    }

    /// The step it starts at.
    pub fn step(&self) -> u32 {
        match *self {
            DistFault::AmaxLocal { step, .. }
            | DistFault::AmaxDpOnly { step, .. }
            | DistFault::StaleWeight { step, .. }
            | DistFault::ScaleCorrupt { step, .. }
            | DistFault::RankDies { step, .. } => step,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fp8scope_schemas::names::Module;

    #[test]
    fn specs_parse_and_bad_ones_say_why_in_one_line() {
        assert!(DistFault::is_dist_spec("site=layers.0.qkv,kind=amax-local,step=3"));
        assert!(!DistFault::is_dist_spec("site=layers.0.qkv,gemm=fprop,kind=overflow,step=3"));
        assert_eq!(
            DistFault::parse("kind=amax-local,site=layers.1.fc2,step=5", 2, 1, 2).unwrap(),
            DistFault::AmaxLocal { site: Site::new(1, Module::Fc2), step: 5 }
        );
        assert_eq!(
            DistFault::parse("kind=scale-corrupt,rank=1,site=layers.0.qkv,step=3", 2, 1, 2).unwrap(),
            DistFault::ScaleCorrupt { rank: 1, site: Site::new(0, Module::Qkv), role: Role::Weight, step: 3, factor: 16.0 }
        );
        assert_eq!(DistFault::parse("kind=rank-dies,rank=3,step=7", 4, 1, 2).unwrap(), DistFault::RankDies { rank: 3, step: 7 });
        assert_eq!(DistFault::parse("kind=rank-dies,rank=3,step=7", 2, 2, 2).unwrap(), DistFault::RankDies { rank: 3, step: 7 });
        assert_eq!(
            DistFault::parse("kind=amax-dp-only,site=layers.1.proj,step=4", 1, 2, 2).unwrap(),
            DistFault::AmaxDpOnly { site: Site::new(1, Module::Proj), step: 4 }
        );
        assert_eq!(
            DistFault::parse("kind=stale-weight,rank=1,site=layers.0.fc1,step=6", 2, 1, 2).unwrap(),
            DistFault::StaleWeight { rank: 1, site: Site::new(0, Module::Fc1), step: 6 }
        );
        for (spec, dp, want) in [
            ("kind=rank-dies,rank=2,step=7", 2, "rank 2 is not one of the 2 ranks"),
            ("kind=rank-dies,step=7", 2, "missing rank=R"),
            ("kind=amax-local,step=7", 2, "missing site"),
            ("kind=amax-local,site=layers.5.fc2", 2, "layers 0-1"),
            ("kind=rank-dies,rank=0,step=7", 1, "needs --dp or --tp 2"),
            ("kind=scale-corrupt,rank=0,site=layers.0.qkv,role=output", 2, "role must be"),
            ("kind=amax-dp-only,site=layers.0.qkv,step=3", 2, "needs --tp 2"),
            ("kind=stale-weight,rank=0,site=layers.0.qkv,step=1", 2, "step=2 or later"),
        ] {
            let e = DistFault::parse(spec, dp, 1, 2).unwrap_err().to_string();
            assert!(e.contains(want) && !e.contains('\n'), "{spec}: {e}");
        }
    }
}
