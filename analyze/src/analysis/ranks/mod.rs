//! `fp8-analyze ranks RUN`: what must agree across the ranks of a multi-rank run, and what one rank
//! does differently.
//!
//! - [`agree`]: a group's scales, used amaxes and weight bytes that differ across its members;
//! - [`amax`]: the set each amax was actually reduced over, against the configured one;
//! - [`outliers`]: one rank's underflow, saturation or non-finite counts out of line, and the first
//!   rank to go non-finite;
//! - [`step_time`]: step time per rank and the stragglers;
//! - [`audits`]: the casts table's integrity audits (cast bytes, forward weight, stale weight);
//! - [`liveness`]: ranks stopped without closing, crashed or missing.
//!
//! Everything is read a batch of ranks at a time ([`scan`]) with the tensor as one id ([`keys`]);
//! [`casts`] drives the one pass over the casts table that three of the checks share, a window of
//! steps at a time laid out by tensor, step and rank ([`store`]) against the job's groups as
//! partitions of its ranks ([`mesh`]). The thresholds are in [`rules`], the output's shape in
//! [`finding`].

pub mod agree;
pub mod amax;
pub mod audits;
pub mod casts;
pub mod finding;
pub mod keys;
pub mod liveness;
pub mod mesh;
pub mod outliers;
pub mod rules;
pub mod scan;
pub mod step_time;
pub mod store;

use crate::error::AnalyzeError;
use crate::load::Run;
use finding::Finding;
use fp8scope_schemas::config::RecipeKind;
use fp8scope_schemas::layout::Table;
use fp8scope_schemas::manifest::RunSource;
use liveness::RankLive;
use mesh::Mesh;
use serde::Serialize;
use step_time::RankStepTime;

/// A declared process group.
#[derive(Clone, Debug, Serialize)]
pub struct GroupInfo {
    pub name: String,
    /// dp, fsdp, tp, world, other.
    pub kind: &'static str,
    /// Ranks in one instance.
    pub size: usize,
    /// Number of instances.
    pub instances: usize,
}

/// What was checked, counted, and what could not be.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Checked {
    /// Ranks with parts in casts, stats or steps.
    pub ranks: usize,
    pub casts_rows: u64,
    pub stats_rows: u64,
    pub steps_rows: u64,
    /// Windows of steps the casts were read in (every rank's rows of a window are compared at once).
    pub casts_windows: usize,
    /// (instance, step, tensor) groups whose values were compared.
    pub agreement_groups: i64,
    /// Casts whose reduction set was checked.
    pub amax_casts: i64,
    /// Casts that carry the cast audit, and the forward-weight audit.
    pub cast_audits: i64,
    pub weight_audits: i64,
    /// (rank, tensor) series of statistics compared across ranks.
    pub stats_series: usize,
    /// Ranks with step times.
    pub step_time_ranks: usize,
    pub liveness_files: usize,
    /// Parts skipped under --lenient.
    pub skipped_parts: Vec<String>,
    /// What could not be checked, and why.
    pub not_checked: Vec<String>,
}

/// Everything `ranks` reports.
#[derive(Clone, Debug, Serialize)]
pub struct RanksReport {
    pub run: String,
    pub world_size: u32,
    /// Distinct steps recorded (steps table; stats or casts when there is none).
    pub steps: usize,
    pub groups: Vec<GroupInfo>,
    pub findings: Vec<Finding>,
    pub step_ms: Vec<RankStepTime>,
    pub liveness: Vec<RankLive>,
    pub checked: Checked,
}

/// Runs every check over the run.
pub fn check_ranks(run: &Run, lenient: bool) -> Result<RanksReport, AnalyzeError> {
    let m = &run.manifest;
    let mut checked = Checked::default();
    let mut skipped = Vec::new();
    let casts_parts = scan::table_parts(&run.dir, Table::Casts, lenient, true, &mut skipped)?;
    let stats_parts = scan::table_parts(&run.dir, Table::Stats, lenient, false, &mut skipped)?;
    let steps_parts = scan::table_parts(&run.dir, Table::Steps, lenient, false, &mut skipped)?;
    let mut present: Vec<u32> = casts_parts.iter().chain(&stats_parts).chain(&steps_parts).map(|p| p.rank).collect();
    present.sort_unstable();
    present.dedup();
    checked.ranks = present.len();
    let world_size = m.world_size();
    let mesh = Mesh::new(m.parallel.as_ref(), world_size, &present);
    let mut findings: Vec<Finding> = Vec::new();

    let mut steps = std::collections::BTreeSet::new();
    if casts_parts.is_empty() {
        checked.not_checked.push("scale and digest agreement, amax groups, integrity audits: the run has no casts table (the module's own FP8 casts, which the PyTorch recorder writes)".into());
    } else {
        if mesh.checked.is_empty() {
            checked.not_checked.push("agreement across groups: the manifest declares no dp, fsdp or tp group".into());
        }
        // The scaling behind the casts: fp8-capture's casts follow its recipe; a PyTorch run's casts
        // are the module's own (torchao's Float8Linear: dynamic scaling from this step's amax),
        // whatever recipe fp8scope's own statistics emulate beside them.
        let cast_scaling = if m.source == RunSource::Pytorch { RecipeKind::Current } else { m.config.recipe.kind };
        let r = casts::check(&run.name, &casts_parts, &mesh, &run.naming, cast_scaling)?;
        checked.casts_rows = r.rows;
        checked.casts_windows = r.windows;
        checked.agreement_groups = r.agreement_compared;
        checked.amax_casts = r.amax_checked;
        checked.cast_audits = r.cast_audits;
        checked.weight_audits = r.weight_audits;
        if r.cast_audits == 0 && r.weight_audits == 0 {
            checked.not_checked.push("integrity audits: no cast carries one (audit_checked, master_checked and master_changed are null)".into());
        }
        checked.not_checked.extend(r.not_checked);
        steps = r.steps;
        findings.extend(r.findings);
    }
    if stats_parts.is_empty() {
        checked.not_checked.push("rank outliers and the first non-finite rank: the run has no stats table".into());
    } else {
        if stats_parts.len() < 2 {
            checked.not_checked.push("rank outliers: the stats of one rank only (nothing to compare it with)".into());
        }
        let r = outliers::check(&run.name, &stats_parts, &run.naming)?;
        checked.stats_rows = r.rows;
        checked.stats_series = r.series;
        if !r.steps.is_empty() {
            steps = r.steps;
        }
        findings.extend(r.findings);
    }
    let mut step_ms = Vec::new();
    if steps_parts.is_empty() {
        checked.not_checked.push("step times and stragglers: the run has no steps table".into());
    } else {
        let r = step_time::check(&run.name, &steps_parts)?;
        if r.per_rank.len() < 2 {
            checked.not_checked.push("stragglers: the step times of one rank only".into());
        }
        checked.steps_rows = r.rows;
        checked.step_time_ranks = r.per_rank.len();
        if !r.steps.is_empty() {
            steps = r.steps;
        }
        step_ms = r.per_rank;
        findings.extend(r.findings);
    }
    let live = liveness::check(&run.dir, m, world_size)?;
    checked.liveness_files = live.files;
    findings.extend(live.findings);
    checked.skipped_parts = skipped;
    Finding::sort(&mut findings);

    let groups = m
        .parallel
        .as_ref()
        .map(|p| p.groups.iter().map(|g| GroupInfo { name: g.name.clone(), kind: g.kind.as_str(), size: g.size(), instances: g.members.len() }).collect())
        .unwrap_or_default();
    Ok(RanksReport { run: run.name.clone(), world_size, steps: steps.len(), groups, findings, step_ms, liveness: live.ranks, checked })
}
