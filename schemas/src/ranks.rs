//! Runs of several processes: how the job is split (the manifest's `parallel` and `ranks`), each
//! rank's liveness file (`ranks/rank=00003.json`, rewritten with every closed part: its heartbeat),
//! and the rule that tells a live rank from one that stopped without closing its run.
//!
//! Every rank writes its own parts under its partition (`stats/rank=00003/…`) and its own liveness
//! file; rank 0 alone writes `run.json`. A process killed with SIGKILL cannot say so: its liveness
//! file still says `running`. [`judge`] then looks at what is left: on the host that wrote it, a
//! process id that no longer runs; anywhere, a heartbeat older than the rank's flush cadence allows.

use crate::SchemaError;
use crate::layout::RunDir;
use crate::manifest::{RowCounts, RunStatus};
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

/// A device mesh: named dimensions of a shape, over ranks listed row-major.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceMesh {
    pub dim_names: Vec<String>,
    pub shape: Vec<u32>,
    /// The mesh's ranks, row-major over `shape`.
    pub ranks: Vec<u32>,
}

/// What a process group is for, which decides what must agree across it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupKind {
    /// Data-parallel replicas (DDP): every weight is replicated.
    Dp,
    /// Fully sharded data parallelism: weights are sharded, gathered for the forward.
    Fsdp,
    /// Tensor parallelism: one logical tensor over the group; its scale must be one.
    Tp,
    /// Every rank.
    World,
    /// Anything else (pipeline stages, experts): recorded, not checked.
    Other,
}

impl GroupKind {
    pub fn as_str(self) -> &'static str {
        match self {
            GroupKind::Dp => "dp",
            GroupKind::Fsdp => "fsdp",
            GroupKind::Tp => "tp",
            GroupKind::World => "world",
            GroupKind::Other => "other",
        }
    }
}

/// A family of process groups: one per instance (`members[i]`, ranks in group order).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessGroup {
    /// The name the job gives it (`dp`, `tp`, `dp_shard`, a mesh dimension's name).
    pub name: String,
    pub kind: GroupKind,
    /// Every instance of the group, each as its ranks.
    pub members: Vec<Vec<u32>>,
}

impl ProcessGroup {
    /// Ranks in one instance.
    pub fn size(&self) -> usize {
        self.members.first().map_or(0, Vec::len)
    }
    /// The instance that holds `rank`.
    pub fn instance_of(&self, rank: u32) -> Option<&[u32]> {
        self.members.iter().find(|m| m.contains(&rank)).map(Vec::as_slice)
    }
}

/// One process of the job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankInfo {
    pub rank: u32,
    #[serde(default)]
    pub local_rank: Option<u32>,
    pub host: String,
    pub pid: u32,
    /// The device it computed on (`cuda:1`, `cpu`).
    #[serde(default)]
    pub device: Option<String>,
}

/// A rank's liveness file, `ranks/rank=NNNNN.json`: rewritten (atomically) when the rank starts, with
/// each part it closes, and when it ends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankLiveness {
    pub rank: u32,
    pub host: String,
    pub pid: u32,
    pub status: RunStatus,
    pub started_at: String,
    /// When the rank last closed a part (or started).
    pub heartbeat_at: String,
    #[serde(default)]
    pub ended_at: Option<String>,
    /// Steps in the rank's closed parts.
    pub steps_completed: u32,
    /// Seconds between heartbeats the rank expects (its flush cadence, measured); null before the
    /// second heartbeat.
    #[serde(default)]
    pub heartbeat_every_s: Option<f64>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub rows: RowCounts,
}

impl RankLiveness {
    /// Reads `rank`'s liveness file of the run at `dir`; None when the rank left none.
    pub fn read(dir: &Path, rank: u32) -> Result<Option<RankLiveness>, SchemaError> {
        let path = RunDir::new(dir).rank_file(rank);
        if !path.is_file() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&path).map_err(|e| SchemaError::io(&path, e))?;
        serde_json::from_str(&text).map(Some).map_err(|e| SchemaError::BadManifest { path, message: e.to_string() })
    }

    /// Every liveness file of the run at `dir`, by rank.
    pub fn read_all(dir: &Path) -> Result<Vec<RankLiveness>, SchemaError> {
        let mut out = Vec::new();
        for rank in RunDir::new(dir).liveness_ranks()? {
            if let Some(l) = RankLiveness::read(dir, rank)? {
                out.push(l);
            }
        }
        Ok(out)
    }

    /// Writes the file atomically (temp file + rename).
    pub fn write(&self, dir: &Path) -> Result<(), SchemaError> {
        let run = RunDir::new(dir);
        let path = run.rank_file(self.rank);
        std::fs::create_dir_all(run.ranks_dir()).map_err(|e| SchemaError::io(run.ranks_dir(), e))?;
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(self).map_err(|e| SchemaError::Write { path: path.clone(), message: e.to_string() })?;
        std::fs::write(&tmp, text + "\n").map_err(|e| SchemaError::io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| SchemaError::io(&path, e))
    }
}

/// A heartbeat older than this many of the rank's own intervals between heartbeats (and than
/// [`STALE_FLOOR_S`]) means the process stopped.
pub const STALE_INTERVALS: f64 = 10.0;
/// The shortest silence taken as a stop when the process cannot be looked up (another host).
pub const STALE_FLOOR_S: f64 = 120.0;

/// What is known of a process that said `running`.
#[derive(Clone, Debug, PartialEq)]
pub enum Liveness {
    /// It ended and said how (`completed`, `diverged`, `crashed`).
    Ended(RunStatus),
    /// It may still be running.
    Alive,
    /// It stopped without closing its run; why we know.
    Stopped { reason: String },
}

/// Judges a record that says `status`, written by process `pid` on `host`, whose last heartbeat was
/// `heartbeat_at` (RFC 3339), expected every `every_s` seconds.
///
/// A `running` record is *stopped* when it was written on this host and its process is gone, or when
/// its heartbeat is older than max([`STALE_FLOOR_S`], [`STALE_INTERVALS`] × `every_s`).
pub fn judge(status: RunStatus, host: Option<&str>, pid: Option<u32>, heartbeat_at: Option<&str>, every_s: Option<f64>) -> Liveness {
    if status != RunStatus::Running {
        return Liveness::Ended(status);
    }
    let here = host_name();
    if let (Some(h), Some(p), Some(here)) = (host, pid, here.as_deref())
        && h == here
        && let Some(false) = process_alive(p)
    {
        return Liveness::Stopped { reason: format!("its process {p} on {h} is gone") };
    }
    if let Some(at) = heartbeat_at.and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()) {
        let age = (chrono::Utc::now() - at.with_timezone(&chrono::Utc)).num_milliseconds() as f64 / 1e3;
        let limit = STALE_FLOOR_S.max(STALE_INTERVALS * every_s.unwrap_or(0.0));
        if age > limit {
            return Liveness::Stopped { reason: format!("no heartbeat for {age:.0} s (more than {limit:.0} s)") };
        }
    }
    Liveness::Alive
}

/// This machine's host name (Linux: /proc/sys/kernel/hostname; else $HOSTNAME), when known.
pub fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|s| s.trim().to_string()).or_else(|| std::env::var("HOSTNAME").ok()).filter(|s| !s.is_empty())
}

/// Whether process `pid` runs on this machine: Some(true/false) where /proc tells, None elsewhere.
/// A zombie (killed, not yet reaped by its parent) counts as gone.
pub fn process_alive(pid: u32) -> Option<bool> {
    if !Path::new("/proc/self").exists() {
        return None;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state follows the command name in parentheses: "pid (comm) S …".
            let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
            Some(!matches!(state, Some("Z") | Some("X")))
        }
        Err(_) => Some(false),
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
        let both = Parallel {
            groups: vec![tp, ProcessGroup { name: "dp_shard".into(), kind: GroupKind::Fsdp, members: vec![vec![0, 2], vec![1, 3]] }],
            ..Default::default()
        };
        assert_eq!(both.amax_set("weight", 0), [0, 1, 2, 3], "crossing groups span their slice of the mesh");
        assert_eq!(both.amax_set("gradient", 3), [2, 3]);
    }
}
