//! How a run ended, rank by rank: each rank's liveness file (`ranks/rank=NNNNN.json`) judged by
//! `schemas::ranks::judge`, or, for a run without them (one process, `fp8-capture`), the manifest's
//! own status, host, pid and heartbeat. A record that still says `running` while its process is gone
//! or silent reads "stopped without closing", with the rank and the step it stopped at.

use crate::error::AnalyzeError;
use crate::load::Run;
use fp8scope_schemas::manifest::RunStatus;
use fp8scope_schemas::ranks::{judge, Liveness, RankLiveness};
use serde::Serialize;

/// One rank's end.
#[derive(Clone, Debug, Serialize)]
pub struct RankState {
    pub rank: u32,
    pub host: Option<String>,
    pub pid: Option<u32>,
    /// As the rank wrote it: running, completed, diverged, crashed.
    pub status: String,
    pub steps_completed: u32,
    pub heartbeat_at: Option<String>,
    /// It said `running`, and its process is gone or silent.
    pub stopped: bool,
    /// Why it is judged stopped.
    pub reason: Option<String>,
    pub error: Option<String>,
}

/// The whole job's end.
#[derive(Clone, Debug, Serialize)]
pub struct JobLiveness {
    pub world_size: u32,
    /// Every rank known (from liveness files; rank 0 from the manifest when there are none).
    pub ranks: Vec<RankState>,
    /// The status in words: the manifest's, or `stopped without closing` / `crashed on rank N`.
    pub status: String,
    /// Ranks the manifest's world size counts that left no liveness file.
    pub missing: Vec<u32>,
    /// The ranks wrote liveness files; false: `ranks` holds the manifest's own record alone (a
    /// one-process run, or a run imported from logs), which speaks for the whole job.
    pub per_rank: bool,
}

impl JobLiveness {
    /// The ranks that stopped without closing.
    pub fn stopped(&self) -> Vec<&RankState> {
        self.ranks.iter().filter(|r| r.stopped).collect()
    }
    /// The ranks that say they crashed.
    pub fn crashed(&self) -> Vec<&RankState> {
        self.ranks.iter().filter(|r| r.status == RunStatus::Crashed.as_str()).collect()
    }
}

fn state_of(l: &RankLiveness) -> RankState {
    let judged = judge(l.status, Some(&l.host), Some(l.pid), Some(&l.heartbeat_at), l.heartbeat_every_s);
    let (stopped, reason) = match judged {
        Liveness::Stopped { reason } => (true, Some(reason)),
        _ => (false, None),
    };
    RankState {
        rank: l.rank,
        host: Some(l.host.clone()),
        pid: Some(l.pid),
        status: l.status.as_str().to_string(),
        steps_completed: l.steps_completed,
        heartbeat_at: Some(l.heartbeat_at.clone()),
        stopped,
        reason,
        error: l.error.clone(),
    }
}

/// Every rank's end, and the job's status in words.
pub fn job_liveness(run: &Run) -> Result<JobLiveness, AnalyzeError> {
    let m = &run.manifest;
    let files = RankLiveness::read_all(&run.dir)?;
    let ranks: Vec<RankState> = if files.is_empty() {
        let judged = judge(m.status, m.host.as_deref(), m.pid, m.heartbeat_at.as_deref(), None);
        let (stopped, reason) = match judged {
            Liveness::Stopped { reason } => (true, Some(reason)),
            _ => (false, None),
        };
        vec![RankState {
            rank: 0,
            host: m.host.clone(),
            pid: m.pid,
            status: m.status.as_str().to_string(),
            steps_completed: m.steps_completed,
            heartbeat_at: m.heartbeat_at.clone(),
            stopped,
            reason,
            error: m.error.clone(),
        }]
    } else {
        files.iter().map(state_of).collect()
    };
    let world_size = m.world_size().max(ranks.iter().map(|r| r.rank + 1).max().unwrap_or(1));
    let missing: Vec<u32> = if files.is_empty() {
        Vec::new()
    } else {
        (0..world_size).filter(|r| ranks.iter().all(|s| s.rank != *r)).collect()
    };
    let per_rank = !files.is_empty();
    let stopped: Vec<&RankState> = ranks.iter().filter(|r| r.stopped).collect();
    let crashed: Vec<&RankState> = ranks.iter().filter(|r| r.status == RunStatus::Crashed.as_str()).collect();
    let status = if !per_rank {
        match stopped.first() {
            Some(r) => format!("stopped without closing ({})", r.reason.as_deref().unwrap_or("")),
            None => m.status.as_str().to_string(),
        }
    } else if let Some(first) = stopped.iter().min_by_key(|r| (r.steps_completed, r.rank)) {
        let who = if world_size > 1 { format!("rank {} first, ", first.rank) } else { String::new() };
        format!("stopped without closing ({who}after step {}; {})", first.steps_completed, first.reason.as_deref().unwrap_or(""))
    } else if let Some(first) = crashed.iter().min_by_key(|r| (r.steps_completed, r.rank)) {
        if world_size > 1 {
            format!("crashed on rank {} after step {}", first.rank, first.steps_completed)
        } else {
            RunStatus::Crashed.as_str().to_string()
        }
    } else if m.finished() && ranks.iter().any(|r| r.status == RunStatus::Running.as_str()) {
        // Rank 0 closed the manifest; another rank has not closed its parts yet.
        format!("{} on rank 0, ranks still running: {}", m.status.as_str(), ranks.iter().filter(|r| r.status == "running").map(|r| r.rank.to_string()).collect::<Vec<_>>().join(", "))
    } else {
        m.status.as_str().to_string()
    };
    Ok(JobLiveness { world_size, ranks, status, missing, per_rank })
}
