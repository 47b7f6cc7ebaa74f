//! The job of `--dp N --tp T` in one process: N·T rank threads, each with its model (a replica of
//! its tp shard) on a backend of its own, their collectives through the groups of a dp × tp mesh
//! ([`RankGroups::mesh`]). On the CPU every rank's backend shares the process's thread pool; on the
//! GPU every rank has a CUDA backend of its own on GPU 0, each on its own stream, so that the
//! ranks' path through the GPU backend is tested on one GPU.
//!
//! Rank 0 writes the manifest when the job starts (world size, the dp and tp groups and the mesh,
//! the amax groups of `--amax-reduce`, every rank's host, pid and device) and with each flush; every rank writes its
//! own partitions and liveness file. Once every thread has returned, the manifest is written once
//! more with how the job ended: `completed` or `diverged` as every rank agrees, else `crashed`
//! naming the first rank that failed or stopped, and the rows of every rank's closed parts.

use super::DistPlan;
use crate::backend::Backend;
use crate::collective::RankGroups;
use crate::record::writer::{RankWriting, sum_rows};
use crate::train::{Outcome, RankRole, train_rank};
use anyhow::Context;
use fp8scope_schemas::config::RunConfig;
use fp8scope_schemas::layout::RunDir;
use fp8scope_schemas::manifest::{Manifest, RunStatus, now_rfc3339};
use fp8scope_schemas::ranks::{RankInfo, host_name};

/// How one rank ended.
enum RankEnd {
    Ran(Box<Outcome>),
    Failed(anyhow::Error),
}

/// Where the ranks of a job run: the name the manifest gives every rank's device, and how a rank
/// thread opens its backend.
pub struct RankDevice<'a, B> {
    /// The manifest's name of the device (`cpu`, `cuda:0`).
    pub name: &'a str,
    /// Opens rank `r`'s backend, on the rank's own thread.
    pub open: &'a (dyn Fn(u32) -> anyhow::Result<B> + Sync),
}

/// Trains `cfg` as `dist.dp` × `dist.tp` ranks into `run`, each rank's backend opened by
/// `device.open` on the rank's thread; returns the job's manifest.
pub fn train_ranks<B: Backend>(
    cfg: &RunConfig,
    dist: &DistPlan,
    device: RankDevice<'_, B>,
    run: RunDir,
    name: String,
    quiet: bool,
) -> anyhow::Result<Manifest> {
    let world = dist.world();
    let host = host_name().unwrap_or_else(|| "localhost".into());
    let pid = std::process::id();
    let ranks: Vec<RankInfo> =
        (0..world).map(|r| RankInfo { rank: r, local_rank: Some(r), host: host.clone(), pid, device: Some(device.name.to_string()) }).collect();
    let parallel = dist.parallel();
    let handles = RankGroups::mesh(dist.dp, dist.tp);
    let ends: Vec<RankEnd> = std::thread::scope(|scope| {
        let threads: Vec<_> = handles
            .into_iter()
            .map(|mut groups| {
                let (run, name, parallel, ranks, host) = (run.clone(), name.clone(), parallel.clone(), ranks.clone(), host.clone());
                let rank = groups.rank;
                let open = device.open;
                std::thread::Builder::new().name(format!("fp8scope-rank{rank}")).spawn_scoped(scope, move || {
                    let role = RankRole { writing: RankWriting { rank, host, pid }, parallel, ranks };
                    // Only rank 0 draws progress and prints.
                    let trained = open(rank)
                        .with_context(|| format!("rank {rank}: opening its backend"))
                        .and_then(|mut be| train_rank(&mut be, cfg, run, name, quiet || rank > 0, &mut groups, dist, Some(role)));
                    match trained {
                        Ok(o) => RankEnd::Ran(Box::new(o)),
                        Err(e) => {
                            groups.abort(&format!("{e:#}"));
                            RankEnd::Failed(e)
                        }
                    }
                })
            })
            .collect::<Result<_, _>>()
            .expect("spawning a rank thread");
        threads.into_iter().map(|t| t.join().unwrap_or_else(|_| RankEnd::Failed(anyhow::anyhow!("the rank's thread panicked")))).collect()
    });
    finish(&run, ends)
}

/// The job's manifest once every rank has returned.
fn finish(run: &RunDir, ends: Vec<RankEnd>) -> anyhow::Result<Manifest> {
    let mut m = match Manifest::read(run.root()) {
        Ok(m) => m,
        // Rank 0 never started (its backend did not open): the first rank's own error says why.
        Err(e) => {
            let failed = ends.into_iter().find_map(|end| match end {
                RankEnd::Failed(e) => Some(e),
                RankEnd::Ran(_) => None,
            });
            return Err(failed.unwrap_or_else(|| e.into()));
        }
    };
    let mut status = RunStatus::Completed;
    let mut error = None;
    let mut steps = u32::MAX;
    let mut final_loss = None;
    // The cause first: a rank planted to die, then a rank's own error (a backend's), then what the
    // others saw (a collective that failed, an interrupt).
    for (rank, end) in ends.iter().enumerate() {
        if let RankEnd::Ran(o) = end
            && let Some(step) = o.died_before
        {
            status = RunStatus::Crashed;
            error.get_or_insert(format!("rank {rank} stopped without closing before step {step}"));
        }
    }
    for (rank, end) in ends.iter().enumerate() {
        if let RankEnd::Failed(e) = end {
            status = RunStatus::Crashed;
            error.get_or_insert(format!("rank {rank}: {e:#}"));
        }
    }
    for (rank, end) in ends.iter().enumerate() {
        let RankEnd::Ran(o) = end else { continue };
        if o.died_before.is_some() {
            continue;
        }
        let r = &o.manifest;
        steps = steps.min(r.steps_completed);
        if rank == 0 {
            final_loss = r.final_loss;
        }
        match r.status {
            RunStatus::Crashed => {
                status = RunStatus::Crashed;
                error.get_or_insert(format!("rank {rank}: {}", r.error.clone().unwrap_or_default()));
            }
            RunStatus::Diverged if status == RunStatus::Completed => {
                status = RunStatus::Diverged;
                error = r.error.clone();
            }
            _ => {}
        }
    }
    m.status = status;
    m.error = error;
    m.steps_completed = if steps == u32::MAX { 0 } else { steps };
    m.final_loss = if status == RunStatus::Completed { final_loss } else { None };
    m.rows = sum_rows(run)?;
    m.ended_at = Some(now_rfc3339());
    m.heartbeat_at = Some(now_rfc3339());
    m.pid = None;
    m.write(run.root())?;
    // A rank's own error (not one planted) is the job's error.
    for end in ends {
        if let RankEnd::Failed(e) = end {
            return Err(e);
        }
    }
    Ok(m)
}
