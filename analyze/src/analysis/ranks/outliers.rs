//! One rank's statistics out of line with the other ranks (`rank_outlier`), and the first rank to go
//! non-finite (`first_nonfinite`), from fp8scope's own per-rank `stats`.
//!
//! **Outliers.** Per rank and tensor (layer, module, gemm, role), the mean over the recorded steps of
//! `underflow_frac`, of `saturated_frac` and of `nan_count + inf_count`. Per tensor and metric, a rank
//! is out of line when its mean exceeds [`OUTLIER_FACTOR`] × the median of the other ranks' means +
//! the metric's margin ([`UNDERFLOW_MARGIN`], [`SATURATION_MARGIN`], [`NONFINITE_MARGIN`]); it takes
//! two ranks. A finding per (metric, tensor) names the ranks, the largest mean against the median
//! of the others, and the first step at which one of them was above the bound (read back from
//! those ranks' parts only).
//!
//! **First non-finite.** The earliest step at which any rank's stats hold nan_count + inf_count > 0;
//! every rank with one at that step is named (ties list all), with the first such tensor in
//! execution order.

use super::finding::{Finding, check, num};
use super::keys::{FxMap, Keys};
use super::rules::{BATCH_ROWS, NONFINITE_MARGIN, OUTLIER_FACTOR, SATURATION_MARGIN, UNDERFLOW_MARGIN};
use super::scan::{self, RankParts};
use crate::error::AnalyzeError;
use crate::output;
use fp8scope_schemas::layout::Table;
use fp8scope_schemas::names::{Gemm, SiteNaming};
use fp8scope_schemas::tables::col as c;
use polars::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A statistic compared across ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Metric {
    Underflow,
    Saturation,
    Nonfinite,
}

impl Metric {
    pub const ALL: [Metric; 3] = [Metric::Underflow, Metric::Saturation, Metric::Nonfinite];
    fn margin(self) -> f64 {
        match self {
            Metric::Underflow => UNDERFLOW_MARGIN,
            Metric::Saturation => SATURATION_MARGIN,
            Metric::Nonfinite => NONFINITE_MARGIN,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Metric::Underflow => "underflow",
            Metric::Saturation => "saturation",
            Metric::Nonfinite => "non-finite values",
        }
    }
    fn show(self, x: f64) -> String {
        match self {
            Metric::Nonfinite => format!("{} per step", output::num(x)),
            _ => output::pct(x),
        }
    }
}

/// What the stats checks found and counted.
#[derive(Default, Debug)]
pub struct StatsResult {
    pub findings: Vec<Finding>,
    pub rows: u64,
    pub ranks: usize,
    /// (rank, tensor) series compared.
    pub series: usize,
    pub steps: BTreeSet<i64>,
}

/// The median of `sorted` without its element at `skip`.
fn median_without(sorted: &[f64], skip: usize) -> Option<f64> {
    let m = sorted.len().checked_sub(1).filter(|m| *m > 0)?;
    let at = |j: usize| if j < skip { sorted[j] } else { sorted[j + 1] };
    Some(if m % 2 == 1 { at(m / 2) } else { 0.5 * (at(m / 2 - 1) + at(m / 2)) })
}

/// Batches of ranks near `target` rows each, as (rank, its parts).
fn row_batches<'a>(parts: &[&'a RankParts], target: u64) -> Vec<Vec<(u32, Vec<&'a Path>)>> {
    let mut out: Vec<Vec<(u32, Vec<&Path>)>> = Vec::new();
    let mut rows = 0;
    for p in parts {
        if out.is_empty() || (rows + p.rows > target && rows > 0) {
            out.push(Vec::new());
            rows = 0;
        }
        rows += p.rows;
        if let Some(b) = out.last_mut() {
            b.push((p.rank, p.parts.iter().map(|x| x.path.as_path()).collect()));
        }
    }
    out
}

/// One batch's rows: rank, step, tensor id and the three metrics.
struct Rows {
    rank: Vec<Option<i64>>,
    step: Vec<Option<i64>>,
    kid: Vec<u32>,
    metrics: [Vec<Option<f64>>; 3],
}

const COLUMNS: [&str; 10] = [c::STEP, c::RANK, c::LAYER, c::MODULE, c::GEMM, c::ROLE, c::UNDERFLOW_FRAC, c::SATURATED_FRAC, c::NAN_COUNT, c::INF_COUNT];

fn read(run: &str, batch: &[(u32, Vec<&Path>)], keys: &mut Keys) -> Result<Rows, AnalyzeError> {
    let e = |e: PolarsError| AnalyzeError::scan(run, "stats", e);
    let df = scan::load(run, Table::Stats, batch, &COLUMNS, None)?;
    let kid = keys.encode(&df).map_err(e)?;
    let (nan, inf) = (scan::i64s(&df, c::NAN_COUNT).map_err(e)?, scan::i64s(&df, c::INF_COUNT).map_err(e)?);
    let nonfinite: Vec<Option<f64>> =
        nan.iter().zip(&inf).map(|(a, b)| if a.is_none() && b.is_none() { None } else { Some((a.unwrap_or(0) + b.unwrap_or(0)) as f64) }).collect();
    Ok(Rows {
        rank: scan::i64s(&df, c::RANK).map_err(e)?,
        step: scan::i64s(&df, c::STEP).map_err(e)?,
        kid,
        metrics: [scan::f64s(&df, c::UNDERFLOW_FRAC).map_err(e)?, scan::f64s(&df, c::SATURATED_FRAC).map_err(e)?, nonfinite],
    })
}

/// An outlier before its first step is known.
struct Outlier {
    metric: Metric,
    kid: u32,
    rank: u32,
    mean: f64,
    median: f64,
    bound: f64,
    steps: i64,
}

/// Runs both checks over `parts` (the stats table by rank).
pub fn check(run: &str, parts: &[RankParts], naming: &SiteNaming) -> Result<StatsResult, AnalyzeError> {
    let mut res = StatsResult { rows: parts.iter().map(|p| p.rows).sum(), ranks: parts.len(), ..Default::default() };
    let mut keys = Keys::default();
    // (rank, tensor) → per metric (sum, count).
    let mut sums: FxMap<(u32, u32), [(f64, i64); 3]> = FxMap::default();
    let mut first_nf: Option<i64> = None;
    let mut at_first: Vec<(u32, u32, i64)> = Vec::new();
    let all: Vec<&RankParts> = parts.iter().collect();
    let mut last_step = None;
    for batch in row_batches(&all, BATCH_ROWS) {
        let rows = read(run, &batch, &mut keys)?;
        for i in 0..rows.kid.len() {
            let (Some(r), Some(s)) = (rows.rank[i], rows.step[i]) else { continue };
            let r = r.max(0) as u32;
            if last_step != Some(s) {
                res.steps.insert(s);
                last_step = Some(s);
            }
            let acc = sums.entry((r, rows.kid[i])).or_insert([(0.0, 0); 3]);
            for (m, a) in acc.iter_mut().enumerate() {
                if let Some(x) = rows.metrics[m][i].filter(|x| x.is_finite()) {
                    a.0 += x;
                    a.1 += 1;
                }
            }
            if let Some(nf) = rows.metrics[2][i].filter(|x| *x > 0.0) {
                if first_nf.is_none_or(|f| s < f) {
                    first_nf = Some(s);
                    at_first.clear();
                }
                if first_nf == Some(s) {
                    at_first.push((r, rows.kid[i], nf as i64));
                }
            }
        }
    }
    res.series = sums.len();

    // Per tensor and metric: each rank's mean against the median of the others'.
    let mut series: BTreeMap<u32, Vec<(u32, [Option<(f64, i64)>; 3])>> = BTreeMap::new();
    for ((r, k), acc) in &sums {
        series.entry(*k).or_default().push((*r, acc.map(|(s, n)| (n > 0).then(|| (s / n as f64, n)))));
    }
    let mut outliers: Vec<Outlier> = Vec::new();
    for (kid, ranks) in &series {
        for (mi, metric) in Metric::ALL.iter().enumerate() {
            let mut xs: Vec<(f64, u32, i64)> = ranks.iter().filter_map(|(r, v)| v[mi].map(|(x, n)| (x, *r, n))).collect();
            if xs.len() < 2 {
                continue;
            }
            xs.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let sorted: Vec<f64> = xs.iter().map(|x| x.0).collect();
            // Only the top of the order can be out of line: walk down from the largest.
            for i in (0..xs.len()).rev() {
                let Some(med) = median_without(&sorted, i) else { break };
                let bound = OUTLIER_FACTOR * med + metric.margin();
                if xs[i].0 > bound {
                    outliers.push(Outlier { metric: *metric, kid: *kid, rank: xs[i].1, mean: xs[i].0, median: med, bound, steps: xs[i].2 });
                } else {
                    break;
                }
            }
        }
    }

    // The first step each outlier was above its bound, from its own rank's parts.
    let mut first_step: BTreeMap<(u32, u32, Metric), i64> = BTreeMap::new();
    if !outliers.is_empty() {
        let mut bounds: FxMap<(u32, u32), [Option<f64>; 3]> = FxMap::default();
        for o in &outliers {
            bounds.entry((o.rank, o.kid)).or_insert([None; 3])[Metric::ALL.iter().position(|m| *m == o.metric).unwrap_or(0)] = Some(o.bound);
        }
        let mine: Vec<&RankParts> = parts.iter().filter(|p| outliers.iter().any(|o| o.rank == p.rank)).collect();
        for batch in row_batches(&mine, BATCH_ROWS) {
            let rows = read(run, &batch, &mut keys)?;
            for i in 0..rows.kid.len() {
                let (Some(r), Some(s)) = (rows.rank[i], rows.step[i]) else { continue };
                let r = r.max(0) as u32;
                let Some(b) = bounds.get(&(r, rows.kid[i])) else { continue };
                for (mi, m) in Metric::ALL.iter().enumerate() {
                    if let (Some(bound), Some(x)) = (b[mi], rows.metrics[mi][i])
                        && x > bound
                    {
                        let f = first_step.entry((r, rows.kid[i], *m)).or_insert(s);
                        *f = (*f).min(s);
                    }
                }
            }
        }
    }
    let mut grouped: BTreeMap<(Metric, u32), Vec<&Outlier>> = BTreeMap::new();
    for o in &outliers {
        grouped.entry((o.metric, o.kid)).or_default().push(o);
    }
    for ((metric, kid), os) in grouped {
        let Some(key) = keys.get(kid) else { continue };
        let mut ranks: Vec<u32> = os.iter().map(|o| o.rank).collect();
        ranks.sort_unstable();
        let step = os.iter().filter_map(|o| first_step.get(&(o.rank, kid, metric)).copied()).min();
        let Some(worst) = os.iter().max_by(|a, b| a.mean.total_cmp(&b.mean)) else { continue };
        let site = naming.site(key.layer, &key.module);
        let mut f = Finding::new(check::RANK_OUTLIER);
        f.step = step;
        f.module = Some(site.clone());
        f.role = Some(key.role.clone());
        f.gemm = Some(key.gemm.clone());
        f.ranks = ranks.clone();
        f.value = num(worst.mean);
        f.expected = num(worst.median);
        let ratio = if worst.median > 0.0 { format!("{:.1}×", worst.mean / worst.median) } else { "from 0".into() };
        f.magnitude = format!("{} {} vs median {} ({ratio})", metric.name(), metric.show(worst.mean), metric.show(worst.median));
        f.message = format!(
            "{site}.{} ({}) {}: rank(s) {:?} average {} over {} recorded step(s), the other ranks' median is {} (bound {}× median + {} = {}){}",
            key.role,
            key.gemm,
            metric.name(),
            ranks,
            metric.show(worst.mean),
            worst.steps,
            metric.show(worst.median),
            OUTLIER_FACTOR,
            metric.show(metric.margin()),
            metric.show(worst.bound),
            step.map(|s| format!("; first above it at step {s}")).unwrap_or_default()
        );
        res.findings.push(f);
    }

    // The first non-finite step.
    if let Some(first) = first_nf {
        let ranks: BTreeSet<u32> = at_first.iter().map(|x| x.0).collect();
        let total: i64 = at_first.iter().map(|x| x.2).sum();
        let mut tensors: Vec<(u64, usize, u32, u32)> = at_first
            .iter()
            .filter_map(|&(rank, kid, _)| {
                let key = keys.get(kid)?;
                Some((naming.rank(key.layer, &key.module, &key.role), Gemm::parse(&key.gemm).map_or(usize::MAX, |g| g as usize), rank, kid))
            })
            .collect();
        tensors.sort();
        let n_tensors = tensors.iter().map(|t| t.3).collect::<BTreeSet<_>>().len();
        let mut f = Finding::new(check::FIRST_NONFINITE);
        f.step = Some(first);
        f.ranks = ranks.iter().copied().collect();
        f.value = serde_json::Value::from(total);
        f.expected = serde_json::Value::from(0);
        f.magnitude = format!("{total} NaN/Inf in {n_tensors} tensor(s)");
        f.message = format!("the first non-finite statistics are at step {first}, on rank(s) {:?}: {total} NaN/Inf value(s) in {n_tensors} tensor(s)", f.ranks);
        if let Some(key) = tensors.first().and_then(|t| keys.get(t.3).map(|k| (k, t.2))) {
            let (key, rank) = key;
            let site = naming.site(key.layer, &key.module);
            f.module = Some(site.clone());
            f.role = Some(key.role.clone());
            f.gemm = Some(key.gemm.clone());
            f.message += &format!(", the first in execution order {site}.{} ({}) on rank {rank}", key.role, key.gemm);
        }
        res.findings.push(f);
    }
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::median_without;

    #[test]
    fn the_median_of_the_others_leaves_one_out() {
        let v = [1.0, 2.0, 3.0, 10.0];
        assert_eq!(median_without(&v, 3), Some(2.0));
        assert_eq!(median_without(&v, 0), Some(3.0));
        assert_eq!(median_without(&[1.0, 5.0, 7.0], 2), Some(3.0));
        assert_eq!(median_without(&[4.0, 9.0], 1), Some(4.0));
        assert_eq!(median_without(&[4.0], 0), None);
    }
}
