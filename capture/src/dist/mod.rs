//! Data parallelism on the CPU (`--dp N`): N ranks as threads of this process, each with its own
//! model replica and its shard of every global batch, their gradients and amaxes reduced through
//! [`crate::collective::ThreadGroup`]; and the faults planted in it (`--inject kind=amax-local`,
//! `scale-corrupt`, `rank-dies`).
//!
//! - `faults.rs`: the distributed faults, parsed from `--inject` and applied per rank;
//! - `driver.rs`: the job: the manifest's layout, one thread per rank, how the job ended.

pub mod driver;
pub mod faults;

pub use faults::DistFault;
use fp8scope_schemas::ranks::{GroupKind, Parallel, ProcessGroup};
use std::collections::BTreeMap;

/// `--amax-reduce`: the group over which delayed scaling's amaxes are reduced before they enter the
/// histories, as Transformer Engine's `amax_reduction_group`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AmaxReduce {
    /// Each rank keeps its own tensor's amax.
    None,
    /// The tensor-parallel group (no tensor parallelism yet: each rank's own).
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
    /// Whether, with data parallelism only, a rank's amaxes are reduced over the other ranks.
    pub fn reduces_over_dp(self) -> bool {
        matches!(self, AmaxReduce::Dp | AmaxReduce::World)
    }
}

/// How a job is split, validated from the flags.
#[derive(Clone, Debug)]
pub struct DistPlan {
    /// Data-parallel ranks (1: the one-rank path).
    pub dp: u32,
    pub amax_reduce: AmaxReduce,
    pub faults: Vec<DistFault>,
}

impl Default for DistPlan {
    fn default() -> Self {
        DistPlan { dp: 1, amax_reduce: AmaxReduce::Dp, faults: Vec::new() }
    }
}

impl DistPlan {
    /// The manifest's `parallel`: one dp group of every rank (and a world group when amaxes are
    /// reduced over `world`), and per quantized role the groups its amaxes are reduced over.
    pub fn parallel(&self) -> Parallel {
        let all: Vec<u32> = (0..self.dp).collect();
        let mut groups = vec![ProcessGroup { name: "dp".into(), kind: GroupKind::Dp, members: vec![all.clone()] }];
        let names: Vec<String> = match self.amax_reduce {
            AmaxReduce::None | AmaxReduce::Tp => Vec::new(),
            AmaxReduce::Dp => vec!["dp".into()],
            AmaxReduce::World => {
                groups.push(ProcessGroup { name: "world".into(), kind: GroupKind::World, members: vec![all] });
                vec!["world".into()]
            }
        };
        let amax_groups: BTreeMap<String, Vec<String>> = ["activation", "weight", "gradient"].iter().map(|r| (r.to_string(), names.clone())).collect();
        Parallel {
            launcher: "fp8-capture".into(),
            backend: Some("threads".into()),
            mesh: None,
            groups,
            wrappers: vec!["DDP".into()],
            amax_groups: Some(amax_groups),
        }
    }
}
