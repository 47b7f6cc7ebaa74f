//! How a run ended, as one status in words: each rank's end is judged once, by the `ranks` check's
//! liveness pass ([`crate::analysis::ranks::liveness`]: the liveness files judged by
//! `schemas::ranks::judge`, or the manifest's own record for a run without them); this turns those
//! ends into the job's status (`stopped without closing (rank 1 first, after step 40; …)`,
//! `crashed on rank 1 after step 12`) for `summary` and `report`.

use crate::analysis::ranks::liveness::{RankLive, check};
use crate::error::AnalyzeError;
use crate::load::Run;
use fp8scope_schemas::manifest::RunStatus;
use serde::Serialize;

/// The whole job's end.
#[derive(Clone, Debug, Serialize)]
pub struct JobLiveness {
    pub world_size: u32,
    /// Every rank known, by rank (`status` "missing" for a rank the world size counts that left
    /// nothing).
    pub ranks: Vec<RankLive>,
    /// The status in words: the manifest's, or `stopped without closing …` / `crashed on rank N …`.
    pub status: String,
    /// Ranks the world size counts that left no liveness file and no part.
    pub missing: Vec<u32>,
    /// The ranks wrote liveness files; false: the manifest's own record speaks for the whole job
    /// (a one-process run, or a run imported from logs).
    pub per_rank: bool,
}

impl JobLiveness {
    /// The ranks that stopped without closing.
    pub fn stopped(&self) -> Vec<&RankLive> {
        self.ranks.iter().filter(|r| r.stopped).collect()
    }
    /// The ranks that say they crashed.
    pub fn crashed(&self) -> Vec<&RankLive> {
        self.ranks.iter().filter(|r| r.status == RunStatus::Crashed.as_str()).collect()
    }
}

/// Every rank's end, and the job's status in words.
pub fn job_liveness(run: &Run) -> Result<JobLiveness, AnalyzeError> {
    let m = &run.manifest;
    let world_size = m.world_size();
    let result = check(&run.dir, m, world_size)?;
    let per_rank = result.files > 0;
    let ranks = result.ranks;
    let missing: Vec<u32> = ranks.iter().filter(|r| r.status == "missing").map(|r| r.rank).collect();
    let steps = |r: &RankLive| r.steps_completed.unwrap_or(0);
    let first = |v: Vec<&RankLive>| v.into_iter().min_by_key(|r| (steps(r), r.rank)).cloned();
    let stopped = first(ranks.iter().filter(|r| r.stopped).collect());
    let crashed = first(ranks.iter().filter(|r| r.status == RunStatus::Crashed.as_str()).collect());
    let status = match (stopped, crashed) {
        (Some(r), _) if per_rank && world_size > 1 => {
            format!("stopped without closing (rank {} first, after step {}; {})", r.rank, steps(&r), r.reason.as_deref().unwrap_or(""))
        }
        (Some(r), _) => format!("stopped without closing (after step {}; {})", steps(&r), r.reason.as_deref().unwrap_or("")),
        (None, Some(r)) if per_rank && world_size > 1 => format!("crashed on rank {} after step {}", r.rank, steps(&r)),
        _ if per_rank && m.finished() && ranks.iter().any(|r| r.status == RunStatus::Running.as_str()) => {
            // Rank 0 closed the manifest; another rank has not closed its parts yet.
            let running: Vec<String> = ranks.iter().filter(|r| r.status == RunStatus::Running.as_str()).map(|r| r.rank.to_string()).collect();
            format!("{} on rank 0, ranks still running: {}", m.status.as_str(), running.join(", "))
        }
        _ => m.status.as_str().to_string(),
    };
    Ok(JobLiveness { world_size, ranks, status, missing, per_rank })
}
