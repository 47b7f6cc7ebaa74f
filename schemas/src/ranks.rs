//! Runs of several processes: how the job is split (the manifest's `parallel` and `ranks`), each
//! rank's liveness file (`ranks/rank=00003.json`, rewritten with every closed part: its heartbeat),
//! and the rule that tells a live rank from one that stopped without closing its run.
//!
//! Every rank writes its own parts under its partition (`stats/rank=00003/…`) and its own liveness
//! file; rank 0 alone writes `run.json`. A process killed with SIGKILL cannot say so: its liveness
//! file still says `running`. [`judge`] then looks at what is left: on the host that wrote it, a
//! process id that no longer runs; anywhere, a heartbeat older than the rank's flush cadence allows.

use crate::layout::RunDir;
use crate::manifest::{RowCounts, RunStatus};
use crate::SchemaError;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// How a job is split over its ranks.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Parallel {
    /// What started the processes: `torchrun`, `fp8-capture`, `single`, …
    pub launcher: String,
    /// The collective backend (`gloo`, `nccl`), when known.
    #[serde(default)]
    pub backend: Option<String>,
    /// The device mesh, when the job has one (FSDP2, DTensor tensor parallelism).
    #[serde(default)]
    pub mesh: Option<DeviceMesh>,
    /// The process groups that share scales or weights, each with every one of its instances.
    #[serde(default)]
    pub groups: Vec<ProcessGroup>,
    /// What wraps the model: `DDP`, `FSDP2`, `DTensor`, `Float8Linear`, …
    #[serde(default)]
    pub wrappers: Vec<String>,
    /// Per quantized role (`activation`, `weight`, `gradient`), the names of the groups whose
    /// ranks' local amaxes the configuration reduces before the cast (a rank's reduction set is the
    /// union of its instances of these groups; an empty list means its own tensor only). Absent:
    /// [`Parallel::default_amax_groups`].
    #[serde(default)]
    pub amax_groups: Option<std::collections::BTreeMap<String, Vec<String>>>,
}

impl Parallel {
    /// The groups whose local amaxes the configuration reduces for `role`: `amax_groups` when the
    /// writer said, else dynamic scaling over a mesh as torchao and Transformer Engine do it: a
    /// weight over its FSDP and tensor-parallel groups (one gathered, one logical tensor), an
    /// activation or gradient over its tensor-parallel groups.
    pub fn amax_groups_of(&self, role: &str) -> Vec<&ProcessGroup> {
        match self.amax_groups.as_ref().and_then(|m| m.get(role)) {
            Some(names) => self.groups.iter().filter(|g| names.contains(&g.name)).collect(),
            None => self.default_amax_groups(role),
        }
    }

    /// The default of [`Parallel::amax_groups_of`].
    pub fn default_amax_groups(&self, role: &str) -> Vec<&ProcessGroup> {
        let kinds: &[GroupKind] = if role == "weight" { &[GroupKind::Fsdp, GroupKind::Tp] } else { &[GroupKind::Tp] };
        self.groups.iter().filter(|g| kinds.contains(&g.kind)).collect()
    }

    /// The ranks whose local amaxes `rank`'s cast of `role` must be reduced over (itself included):
    /// the ranks reachable from `rank` through instances of the groups of
    /// [`Parallel::amax_groups_of`]. For one group, or groups that nest, that is the union of the
    /// rank's own instances; for groups that cross (FSDP and tensor parallelism over a 2-D mesh) it
    /// is the mesh slice they span together: one logical tensor sharded over both is reduced over
    /// all of it, and it is the only set on which every member of each group sees the same amax.
    pub fn amax_set(&self, role: &str, rank: u32) -> Vec<u32> {
        let groups = self.amax_groups_of(role);
        let mut set = std::collections::BTreeSet::from([rank]);
        let mut frontier = vec![rank];
        while let Some(r) = frontier.pop() {
            for g in &groups {
                for &x in g.instance_of(r).unwrap_or(&[]) {
                    if set.insert(x) {
                        frontier.push(x);
                    }
                }
            }
        }
        set.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_record_of_a_gone_process_on_this_host_is_stopped() {
        let now = crate::manifest::now_rfc3339();
        let here = host_name();
        assert_eq!(judge(RunStatus::Completed, None, None, None, None), Liveness::Ended(RunStatus::Completed));
        let me = std::process::id();
        assert_eq!(judge(RunStatus::Running, here.as_deref(), Some(me), Some(&now), Some(1.0)), Liveness::Alive);
        if here.is_some() && process_alive(me) == Some(true) {
            // pid 0 is never a user process: /proc/0 does not exist.
            let j = judge(RunStatus::Running, here.as_deref(), Some(0), Some(&now), Some(1.0));
            assert!(matches!(j, Liveness::Stopped { ref reason } if reason.contains("gone")), "{j:?}");
        }
        let old = (chrono::Utc::now() - chrono::Duration::seconds(3600)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let j = judge(RunStatus::Running, Some("another-host"), Some(1), Some(&old), Some(5.0));
        assert!(matches!(j, Liveness::Stopped { ref reason } if reason.contains("no heartbeat")), "{j:?}");
        assert_eq!(judge(RunStatus::Running, Some("another-host"), Some(1), Some(&now), Some(5.0)), Liveness::Alive);
    }

    #[test]
    fn groups_find_the_instance_of_a_rank() {
        let tp = ProcessGroup { name: "tp".into(), kind: GroupKind::Tp, members: vec![vec![0, 1], vec![2, 3]] };
        assert_eq!((tp.size(), tp.instance_of(3)), (2, Some(&[2u32, 3][..])));
        assert_eq!(tp.instance_of(4), None);
        let p: Parallel = serde_json::from_str(r#"{"launcher": "torchrun", "groups": [{"name": "dp", "kind": "dp", "members": [[0, 1]]}]}"#).unwrap();
        assert_eq!((p.groups[0].kind, p.mesh.is_none()), (GroupKind::Dp, true));
        assert_eq!(p.amax_set("activation", 1), [1], "data parallelism reduces no activation amax");
        let both = Parallel { groups: vec![tp, ProcessGroup { name: "dp_shard".into(), kind: GroupKind::Fsdp, members: vec![vec![0, 2], vec![1, 3]] }], ..Default::default() };
        assert_eq!(both.amax_set("weight", 0), [0, 1, 2, 3], "crossing groups span their slice of the mesh");
        assert_eq!(both.amax_set("gradient", 3), [2, 3]);
    }
}
