//! How each rank ended (`rank_stopped`, `rank_crashed`, `rank_missing`).
//!
//! Every rank's liveness file (`ranks/rank=NNNNN.json`, `RankLiveness::read_all`) is judged by
//! `schemas::ranks::judge`: a record that still says `running` while its process is gone (on this
//! host) or its heartbeat is older than its cadence allows is **stopped** without closing; a record
//! that says `crashed` is **crashed**, with its error. A rank below the manifest's world size that
//! left neither a liveness file nor a part in any table is **missing**. Rank 0 of a run without
//! liveness files (one process, runs before schema version 3) is judged from the manifest, which it
//! writes.

use super::finding::{Finding, check};
use crate::error::AnalyzeError;
use fp8scope_schemas::layout::{RunDir, Table};
use fp8scope_schemas::manifest::{Manifest, RunStatus};
use fp8scope_schemas::ranks::{Liveness, RankLiveness, judge};
use serde::Serialize;
use std::collections::BTreeSet;
use std::path::Path;

/// One rank's end, as `ranks --json` lists it.
#[derive(Clone, Debug, Serialize)]
pub struct RankLive {
    pub rank: u32,
    /// As the rank wrote it (`running`, `completed`, `diverged`, `crashed`), or `missing`.
    pub status: String,
    pub steps_completed: Option<u32>,
    pub heartbeat_at: Option<String>,
    /// It says `running`, and its process is gone or silent.
    pub stopped: bool,
    /// Why it is judged stopped, the error it crashed with, or why it counts as missing.
    pub reason: Option<String>,
}

/// What the liveness check found.
#[derive(Default, Debug)]
pub struct LivenessResult {
    pub ranks: Vec<RankLive>,
    pub findings: Vec<Finding>,
    pub files: usize,
}

/// The ranks that left a part in any table (a flat layout counts as rank 0).
pub fn ranks_with_parts(dir: &Path) -> Result<BTreeSet<u32>, AnalyzeError> {
    let run = RunDir::new(dir);
    let mut out = BTreeSet::new();
    for table in Table::ALL {
        out.extend(run.partitions(table)?.into_iter().filter(|(_, d)| std::fs::read_dir(d).map(|mut it| it.next().is_some()).unwrap_or(false)).map(|(r, _)| r));
        let flat = run.table_dir(table);
        let has_flat = std::fs::read_dir(&flat)
            .map(|it| it.flatten().any(|e| e.file_name().to_str().is_some_and(|n| n.starts_with("part-") && n.ends_with(".parquet"))))
            .unwrap_or(false);
        if has_flat {
            out.insert(0);
        }
    }
    Ok(out)
}

/// Judges every rank of the run at `dir`.
pub fn check(dir: &Path, m: &Manifest, world_size: u32) -> Result<LivenessResult, AnalyzeError> {
    let files = RankLiveness::read_all(dir)?;
    let with_parts = ranks_with_parts(dir)?;
    let mut out = LivenessResult { files: files.len(), ..Default::default() };
    let mut ranks: Vec<RankLive> = files
        .iter()
        .map(|l| {
            let j = judge(l.status, Some(&l.host), Some(l.pid), Some(&l.heartbeat_at), l.heartbeat_every_s);
            live(l.rank, l.status, Some(l.steps_completed), Some(l.heartbeat_at.clone()), j, l.error.clone())
        })
        .collect();
    if files.iter().all(|l| l.rank != 0) && (files.is_empty() || with_parts.contains(&0)) {
        let j = judge(m.status, m.host.as_deref(), m.pid, m.heartbeat_at.as_deref(), None);
        ranks.push(live(0, m.status, Some(m.steps_completed), m.heartbeat_at.clone(), j, m.error.clone()));
    }
    let known: BTreeSet<u32> = ranks.iter().map(|r| r.rank).collect();
    for r in 0..world_size {
        if !known.contains(&r) && !with_parts.contains(&r) {
            ranks.push(RankLive {
                rank: r,
                status: "missing".into(),
                steps_completed: None,
                heartbeat_at: None,
                stopped: false,
                reason: Some(format!("no liveness file and no parts, though world_size is {world_size}")),
            });
        }
    }
    ranks.sort_by_key(|r| r.rank);
    for r in &ranks {
        let f = if r.stopped {
            let mut f = Finding::new(check::RANK_STOPPED);
            f.message = format!(
                "rank {} stopped without closing its run after {} step(s): its record still says running, last heartbeat {} ({})",
                r.rank,
                r.steps_completed.unwrap_or(0),
                r.heartbeat_at.as_deref().unwrap_or("unknown"),
                r.reason.as_deref().unwrap_or("")
            );
            f.magnitude = format!("after {} step(s), last heartbeat {}", r.steps_completed.unwrap_or(0), r.heartbeat_at.as_deref().unwrap_or("unknown"));
            f.value = serde_json::Value::from("running");
            f.expected = serde_json::Value::from("completed");
            Some(f)
        } else if r.status == RunStatus::Crashed.as_str() {
            let mut f = Finding::new(check::RANK_CRASHED);
            f.message =
                format!("rank {} crashed after {} step(s): {}", r.rank, r.steps_completed.unwrap_or(0), r.reason.as_deref().unwrap_or("no error recorded"));
            f.magnitude = format!("after {} step(s): {}", r.steps_completed.unwrap_or(0), r.reason.as_deref().unwrap_or("no error recorded"));
            f.value = serde_json::Value::from("crashed");
            f.expected = serde_json::Value::from("completed");
            Some(f)
        } else if r.status == "missing" {
            let mut f = Finding::new(check::RANK_MISSING);
            f.message = format!("rank {} of {world_size} left no liveness file and no parts", r.rank);
            f.magnitude = "no liveness file, no parts".into();
            f.value = serde_json::Value::from("missing");
            f.expected = serde_json::Value::from(world_size);
            Some(f)
        } else {
            None
        };
        if let Some(mut f) = f {
            f.ranks = vec![r.rank];
            f.step = r.steps_completed.filter(|_| r.status != "missing").map(|s| s as i64);
            out.findings.push(f);
        }
    }
    out.ranks = ranks;
    Ok(out)
}

fn live(rank: u32, status: RunStatus, steps: Option<u32>, heartbeat_at: Option<String>, judged: Liveness, error: Option<String>) -> RankLive {
    let (stopped, reason) = match judged {
        Liveness::Stopped { reason } => (true, Some(reason)),
        _ => (false, error),
    };
    RankLive { rank, status: status.as_str().to_string(), steps_completed: steps, heartbeat_at, stopped, reason }
}
