//! Step time per rank from the `steps` table, and the stragglers (`straggler`).
//!
//! Per rank, over its finite `step_ms`: the median (the mean of the two middle values when the
//! count is even) and the p90 (the nearest-rank value, ⌈0.9·n⌉-th smallest). A straggler is a rank
//! whose median exceeds [`STRAGGLER_FACTOR`] × the median of the ranks' medians (it takes two ranks);
//! its first step is the first at which its step time was above that bound.

use super::finding::{Finding, check, num};
use super::rules::STRAGGLER_FACTOR;
use super::scan::{self, RankParts};
use crate::analysis::detect::median;
use crate::error::AnalyzeError;
use crate::output;
use fp8scope_schemas::layout::Table;
use fp8scope_schemas::tables::col as c;
use polars::prelude::*;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// One rank's step time.
#[derive(Clone, Debug, Serialize)]
pub struct RankStepTime {
    pub rank: u32,
    pub median_ms: f64,
    pub p90_ms: f64,
    /// Steps with a finite step time.
    pub steps: usize,
}

/// What the step-time check found.
#[derive(Default, Debug)]
pub struct StepTimes {
    pub per_rank: Vec<RankStepTime>,
    pub findings: Vec<Finding>,
    pub rows: u64,
    pub steps: BTreeSet<i64>,
}

/// Reads every rank's steps and judges them.
pub fn check(run: &str, parts: &[RankParts]) -> Result<StepTimes, AnalyzeError> {
    let e = |e: PolarsError| AnalyzeError::scan(run, "steps", e);
    let all: Vec<(u32, Vec<&std::path::Path>)> = parts.iter().map(|p| (p.rank, p.parts.iter().map(|x| x.path.as_path()).collect())).collect();
    let df = scan::load(run, Table::Steps, &all, &[c::RANK, c::STEP, c::STEP_MS], None)?;
    let (r, s, ms) = (scan::i64s(&df, c::RANK).map_err(e)?, scan::i64s(&df, c::STEP).map_err(e)?, scan::f64s(&df, c::STEP_MS).map_err(e)?);
    let mut out = StepTimes { rows: df.height() as u64, ..Default::default() };
    let mut series: BTreeMap<u32, Vec<(i64, f64)>> = BTreeMap::new();
    for i in 0..df.height() {
        let (Some(rank), Some(step)) = (r[i], s[i]) else { continue };
        out.steps.insert(step);
        if let Some(x) = ms[i].filter(|x| x.is_finite()) {
            series.entry(rank as u32).or_default().push((step, x));
        }
    }
    for (rank, v) in &series {
        let mut sorted: Vec<f64> = v.iter().map(|x| x.1).collect();
        sorted.sort_by(f64::total_cmp);
        let p90 = sorted[((0.9 * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1];
        out.per_rank.push(RankStepTime { rank: *rank, median_ms: median(&sorted), p90_ms: p90, steps: sorted.len() });
    }
    if out.per_rank.len() >= 2 {
        let mut medians: Vec<f64> = out.per_rank.iter().map(|r| r.median_ms).collect();
        medians.sort_by(f64::total_cmp);
        let mid = median(&medians);
        let bound = STRAGGLER_FACTOR * mid;
        for rt in out.per_rank.iter().filter(|rt| rt.median_ms > bound) {
            let mut v = series[&rt.rank].clone();
            v.sort_by_key(|x| x.0);
            let first = v.iter().find(|x| x.1 > bound).map(|x| x.0);
            let mut f = Finding::new(check::STRAGGLER);
            f.step = first;
            f.ranks = vec![rt.rank];
            f.value = num(rt.median_ms);
            f.expected = num(mid);
            f.magnitude = format!("median {} ms vs {} ms ({:.2}×)", output::num(rt.median_ms), output::num(mid), rt.median_ms / mid);
            f.message = format!(
                "rank {} is a straggler: its median step time is {} ms (p90 {} ms) against {} ms, the median of the ranks' medians (bound {}× = {} ms){}",
                rt.rank,
                output::num(rt.median_ms),
                output::num(rt.p90_ms),
                output::num(mid),
                STRAGGLER_FACTOR,
                output::num(bound),
                first.map(|s| format!("; first above the bound at step {s}")).unwrap_or_default()
            );
            out.findings.push(f);
        }
    }
    Ok(out)
}
