//! Data and tensor parallelism on the CPU (`--dp N`, `--tp T`): N·T ranks as threads of this
//! process on a dp × tp mesh ([`crate::collective::RankGroups`]). A tensor-parallel group of T
//! ranks shares one model, each rank holding its shard of every layer (the Megatron layout:
//! [`crate::model::tp`]); a data-parallel group holds replicas of one shard, each on its rows of
//! every global batch. Gradients are summed over dp, the row-parallel outputs and the
//! column-parallel input gradients over tp, amaxes over the groups each tensor needs; and the
//! faults planted in it (`--inject kind=amax-local`, `amax-dp-only`, `scale-corrupt`,
//! `stale-weight`, `rank-dies`).
//!
//! - `faults.rs`: the distributed faults, parsed from `--inject` and applied per rank;
//! - `driver.rs`: the job: the manifest's layout, one thread per rank, how the job ended;
//! - `weights.rs`: the weights' digests and change flags in the casts table, the stale weight.

pub mod driver;
pub mod faults;
pub mod weights;

pub use faults::DistFault;
use fp8scope_schemas::names::{Role, Site};
use fp8scope_schemas::ranks::{DeviceMesh, GroupKind, Parallel, ProcessGroup};
use std::collections::BTreeMap;

/// `--amax-reduce`: the group over which delayed scaling's amaxes are reduced before they enter the
/// histories, as Transformer Engine's `amax_reduction_group`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AmaxReduce {
    /// Each rank keeps its own tensor's amax.
    None,
    /// The tensor-parallel group (without tensor parallelism: each rank's own).
    Tp,
    /// The data-parallel group: the amax of the global batch's tensor, as one rank sees it.
    Dp,
    /// Every rank.
    World,
}

impl AmaxReduce {
    pub fn as_str(self) -> &'static str {
        match self {
            AmaxReduce::None => "none",
            AmaxReduce::Tp => "tp",
            AmaxReduce::Dp => "dp",
            AmaxReduce::World => "world",
        }
    }
    /// Whether the group spans the data-parallel ranks.
    pub fn reduces_over_dp(self) -> bool {
        matches!(self, AmaxReduce::Dp | AmaxReduce::World)
    }
    /// Whether the group spans the tensor-parallel ranks.
    pub fn reduces_over_tp(self) -> bool {
        matches!(self, AmaxReduce::Tp | AmaxReduce::World)
    }
}

/// How a job is split, validated from the flags.
#[derive(Clone, Debug)]
pub struct DistPlan {
    /// Data-parallel ranks (1: the one-rank path).
    pub dp: u32,
    /// Tensor-parallel ranks (1: none).
    pub tp: u32,
    pub amax_reduce: AmaxReduce,
    pub faults: Vec<DistFault>,
}

impl Default for DistPlan {
    fn default() -> Self {
        DistPlan { dp: 1, tp: 1, amax_reduce: AmaxReduce::Dp, faults: Vec::new() }
    }
}

impl DistPlan {
    /// Ranks in the job.
    pub fn world(&self) -> u32 {
        self.dp * self.tp
    }

    /// The default of `--amax-reduce`: `world` under tensor parallelism (Megatron-LM's amax
    /// reduction group spans the data- and tensor-parallel ranks), else `dp`.
    pub fn default_amax_reduce(tp: u32) -> AmaxReduce {
        if tp > 1 { AmaxReduce::World } else { AmaxReduce::Dp }
    }

    /// Whether this rank reduces the amax of `role` at `site` over its (tensor-parallel,
    /// data-parallel) group at `step`. The configured group (`--amax-reduce`, Transformer Engine's
    /// amax_reduction_group) decides, and a replicated input of a tensor-parallel GEMM is always
    /// reduced over tp, as Transformer Engine requires; the planted faults take groups away.
    pub fn amax_reduction(&self, site: Site, role: Role, step: u32) -> (bool, bool) {
        let mut tp = self.amax_reduce.reduces_over_tp() || crate::model::tp::replicated(site.module, role);
        let mut dp = self.amax_reduce.reduces_over_dp();
        for f in &self.faults {
            match *f {
                DistFault::AmaxLocal { site: s, step: from } if s == site && step >= from => (tp, dp) = (false, false),
                DistFault::AmaxDpOnly { site: s, step: from } if s == site && step >= from && !crate::model::tp::replicated(site.module, role) => tp = false,
                _ => {}
            }
        }
        (tp && self.tp > 1, dp && self.dp > 1)
    }

    /// The manifest's `parallel`: the dp groups (the ranks holding one shard, rank order = batch
    /// order), under tensor parallelism the tp groups and the dp × tp mesh, a world group when
    /// amaxes are reduced over `world`, and per quantized role the groups its amaxes are reduced
    /// over (`--amax-reduce`; a replicated input of a tensor-parallel GEMM is reduced over tp too).
    pub fn parallel(&self) -> Parallel {
        let (dp, tp) = (self.dp, self.tp);
        let all: Vec<u32> = (0..self.world()).collect();
        let dp_members: Vec<Vec<u32>> = (0..tp).map(|t| (0..dp).map(|d| d * tp + t).collect()).collect();
        let mut groups = vec![ProcessGroup { name: "dp".into(), kind: GroupKind::Dp, members: dp_members }];
        if tp > 1 {
            let tp_members = (0..dp).map(|d| (0..tp).map(|t| d * tp + t).collect()).collect();
            groups.push(ProcessGroup { name: "tp".into(), kind: GroupKind::Tp, members: tp_members });
        }
        let names: Vec<String> = match self.amax_reduce {
            AmaxReduce::None => Vec::new(),
            AmaxReduce::Tp if tp > 1 => vec!["tp".into()],
            AmaxReduce::Tp => Vec::new(),
            AmaxReduce::Dp => vec!["dp".into()],
            AmaxReduce::World => {
                groups.push(ProcessGroup { name: "world".into(), kind: GroupKind::World, members: vec![all.clone()] });
                vec!["world".into()]
            }
        };
        let amax_groups: BTreeMap<String, Vec<String>> = ["activation", "weight", "gradient"].iter().map(|r| (r.to_string(), names.clone())).collect();
        let mut wrappers = Vec::new();
        if dp > 1 {
            wrappers.push("DDP".into());
        }
        if tp > 1 {
            wrappers.extend(["ColumnParallelLinear".into(), "RowParallelLinear".into()]);
        }
        Parallel {
            launcher: "fp8-capture".into(),
            backend: Some("threads".into()),
            mesh: (tp > 1).then(|| DeviceMesh { dim_names: vec!["dp".into(), "tp".into()], shape: vec![dp, tp], ranks: all }),
            groups,
            wrappers,
            amax_groups: Some(amax_groups),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fp8scope_schemas::names::Module;

    /// A 2 × 2 mesh: tp groups of consecutive ranks, dp groups two apart, the mesh row-major.
    #[test]
    fn the_manifest_names_the_mesh_and_its_groups() {
        let plan = DistPlan { dp: 2, tp: 2, amax_reduce: AmaxReduce::World, faults: Vec::new() };
        let p = plan.parallel();
        let g = |name: &str| p.groups.iter().find(|g| g.name == name).expect(name).members.clone();
        assert_eq!(g("tp"), vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(g("dp"), vec![vec![0, 2], vec![1, 3]]);
        assert_eq!(g("world"), vec![vec![0, 1, 2, 3]]);
        let mesh = p.mesh.clone().expect("a mesh");
        assert_eq!((mesh.dim_names, mesh.shape), (vec!["dp".to_string(), "tp".to_string()], vec![2, 2]));
        assert_eq!(p.amax_set("activation", 1), vec![0, 1, 2, 3]);
        let one = DistPlan { dp: 2, ..Default::default() }.parallel();
        assert!(one.mesh.is_none() && one.groups.len() == 1 && one.wrappers == vec!["DDP".to_string()]);
    }

    /// The groups a tensor's amax is reduced over: replicated inputs always over tp, the faults
    /// taking tp (amax-dp-only, sharded tensors only) or both (amax-local) away from their step.
    #[test]
    fn each_tensor_is_reduced_over_the_groups_its_layout_needs() {
        let (qkv, proj) = (Site::new(0, Module::Qkv), Site::new(0, Module::Proj));
        let mut plan = DistPlan { dp: 2, tp: 2, amax_reduce: AmaxReduce::Dp, faults: Vec::new() };
        assert_eq!(plan.amax_reduction(qkv, Role::Activation, 1), (true, true), "replicated: tp as TE requires");
        assert_eq!(plan.amax_reduction(proj, Role::Activation, 1), (false, true), "sharded, dp only as configured");
        plan.amax_reduce = AmaxReduce::World;
        plan.faults = vec![DistFault::AmaxDpOnly { site: proj, step: 5 }, DistFault::AmaxLocal { site: qkv, step: 3 }];
        assert_eq!(plan.amax_reduction(proj, Role::Weight, 4), (true, true));
        assert_eq!(plan.amax_reduction(proj, Role::Weight, 5), (false, true));
        assert_eq!(plan.amax_reduction(proj, Role::Gradient, 5), (true, true), "proj's gradient is replicated");
        assert_eq!(plan.amax_reduction(qkv, Role::Weight, 3), (false, false));
        plan.tp = 1;
        assert_eq!(plan.amax_reduction(proj, Role::Weight, 1), (false, true), "no tp group to reduce over");
    }
}
