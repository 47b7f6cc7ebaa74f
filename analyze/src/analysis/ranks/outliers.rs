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

use super::finding::{check, num, Finding};
use super::keys::{Keys, KID};
use super::rules::{BATCH_ROWS, NONFINITE_MARGIN, OUTLIER_FACTOR, SATURATION_MARGIN, UNDERFLOW_MARGIN};
use super::scan::{self, RankParts};
use crate::error::AnalyzeError;
use crate::load::{f64s, i64s};
use crate::output;
use fp8scope_schemas::layout::Table;
use fp8scope_schemas::names::{Gemm, SiteNaming};
use fp8scope_schemas::tables::col as c;
use polars::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

/// A statistic compared across ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Metric {
    Underflow,
    Saturation,
    Nonfinite,
}

impl Metric {
    pub const ALL: [Metric; 3] = [Metric::Underflow, Metric::Saturation, Metric::Nonfinite];
    fn column(self) -> &'static str {
        match self {
            Metric::Underflow => "mu",
            Metric::Saturation => "ms",
            Metric::Nonfinite => "mn",
        }
    }
    fn row_expr(self) -> Expr {
        match self {
            Metric::Underflow => col(c::UNDERFLOW_FRAC),
            Metric::Saturation => col(c::SATURATED_FRAC),
            Metric::Nonfinite => col(c::NAN_COUNT).fill_null(lit(0i64)) + col(c::INF_COUNT).fill_null(lit(0i64)),
        }
    }
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

/// Batches of ranks near `target` rows each.
pub fn row_batches(parts: &[RankParts], target: u64) -> Vec<Vec<&RankParts>> {
    let mut out: Vec<Vec<&RankParts>> = Vec::new();
    let mut rows = 0;
    for p in parts {
        if out.is_empty() || rows + p.rows > target {
            out.push(Vec::new());
            rows = 0;
        }
        rows += p.rows;
        out.last_mut().map(|b| b.push(p));
    }
    out
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
    let e = |e: PolarsError| AnalyzeError::scan(run, "stats", e);
    let mut res = StatsResult { rows: parts.iter().map(|p| p.rows).sum(), ranks: parts.len(), ..Default::default() };
    let cols = [c::STEP, c::RANK, c::LAYER, c::MODULE, c::GEMM, c::ROLE, c::UNDERFLOW_FRAC, c::SATURATED_FRAC, c::NAN_COUNT, c::INF_COUNT];
    let mut keys = Keys::default();
    let mut means: Vec<DataFrame> = Vec::new();
    let mut nonfinite: Vec<DataFrame> = Vec::new();
    for batch in row_batches(parts, BATCH_ROWS) {
        let df = scan::collect(run, Table::Stats, scan::scan(run, Table::Stats, &batch, &cols)?)?;
        let df = keys.encode(df).map_err(e)?;
        let steps = df.column(c::STEP).map_err(e)?.unique().map_err(e)?;
        res.steps.extend(steps.cast(&DataType::Int64).map_err(e)?.i64().map_err(e)?.iter().flatten());
        let aggs: Vec<Expr> = Metric::ALL.iter().map(|m| m.row_expr().cast(DataType::Float64).mean().alias(m.column())).chain([len().cast(DataType::Int64).alias("n")]).collect();
        means.push(df.clone().lazy().group_by([col(c::RANK), col(KID)]).agg(aggs).collect().map_err(e)?);
        let nf = Metric::Nonfinite.row_expr();
        let first = df
            .lazy()
            .filter(nf.clone().gt(lit(0i64)))
            .select([col(c::RANK), col(c::STEP), col(KID), nf.alias("count")])
            .filter(col(c::STEP).eq(col(c::STEP).min()))
            .collect()
            .map_err(e)?;
        if first.height() > 0 {
            nonfinite.push(first);
        }
    }

    // Per tensor and metric: each rank's mean against the median of the others'.
    let mut outliers: Vec<Outlier> = Vec::new();
    for df in &means {
        res.series += df.height();
    }
    let mut series: BTreeMap<u32, Vec<(u32, [Option<f64>; 3], i64)>> = BTreeMap::new();
    for df in &means {
        let (r, k, n) = (i64s(df, c::RANK).map_err(e)?, i64s(df, KID).map_err(e)?, i64s(df, "n").map_err(e)?);
        let vals: Vec<Vec<Option<f64>>> = Metric::ALL.iter().map(|m| f64s(df, m.column())).collect::<PolarsResult<_>>().map_err(e)?;
        for i in 0..df.height() {
            if let (Some(r), Some(k)) = (r[i], k[i]) {
                series.entry(k as u32).or_default().push((r as u32, [vals[0][i], vals[1][i], vals[2][i]], n[i].unwrap_or(0)));
            }
        }
    }
    for (kid, ranks) in &series {
        for (mi, metric) in Metric::ALL.iter().enumerate() {
            let mut xs: Vec<(f64, u32, i64)> = ranks.iter().filter_map(|(r, v, n)| v[mi].filter(|x| x.is_finite()).map(|x| (x, *r, *n))).collect();
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
        let flagged: BTreeSet<u32> = outliers.iter().map(|o| o.rank).collect();
        let mine: Vec<RankParts> = parts.iter().filter(|p| flagged.contains(&p.rank)).cloned().collect();
        let mut t_rank = Vec::new();
        let mut t_kid = Vec::new();
        let mut bounds: [Vec<Option<f64>>; 3] = Default::default();
        let mut seen: BTreeMap<(u32, u32), usize> = BTreeMap::new();
        for o in &outliers {
            let i = *seen.entry((o.rank, o.kid)).or_insert_with(|| {
                t_rank.push(o.rank as i32);
                t_kid.push(o.kid);
                for b in bounds.iter_mut() {
                    b.push(None);
                }
                t_rank.len() - 1
            });
            bounds[Metric::ALL.iter().position(|m| *m == o.metric).unwrap_or(0)][i] = Some(o.bound);
        }
        let n = t_rank.len();
        let [bu, bs, bn] = bounds;
        let targets = DataFrame::new(
            n,
            vec![
                Column::new(c::RANK.into(), t_rank),
                Column::new(KID.into(), t_kid),
                Column::new("bu".into(), bu),
                Column::new("bs".into(), bs),
                Column::new("bn".into(), bn),
            ],
        )
        .map_err(e)?;
        for batch in row_batches(&mine, BATCH_ROWS) {
            let df = scan::collect(run, Table::Stats, scan::scan(run, Table::Stats, &batch, &cols)?)?;
            let df = keys.encode(df).map_err(e)?;
            let firsts = df
                .lazy()
                .join(targets.clone().lazy(), [col(c::RANK), col(KID)], [col(c::RANK), col(KID)], JoinArgs::new(JoinType::Inner))
                .group_by([col(c::RANK), col(KID)])
                .agg([
                    col(c::STEP).filter(Metric::Underflow.row_expr().cast(DataType::Float64).gt(col("bu"))).min().alias("fu"),
                    col(c::STEP).filter(Metric::Saturation.row_expr().cast(DataType::Float64).gt(col("bs"))).min().alias("fs"),
                    col(c::STEP).filter(Metric::Nonfinite.row_expr().cast(DataType::Float64).gt(col("bn"))).min().alias("fn"),
                ])
                .collect()
                .map_err(e)?;
            let (r, k) = (i64s(&firsts, c::RANK).map_err(e)?, i64s(&firsts, KID).map_err(e)?);
            for (m, name) in Metric::ALL.iter().zip(["fu", "fs", "fn"]) {
                let f = i64s(&firsts, name).map_err(e)?;
                for i in 0..firsts.height() {
                    if let (Some(r), Some(k), Some(f)) = (r[i], k[i], f[i]) {
                        first_step.insert((r as u32, k as u32, *m), f);
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
    if let Some(lf) = (!nonfinite.is_empty()).then(|| concat(nonfinite.into_iter().map(|d| d.lazy()).collect::<Vec<_>>(), UnionArgs::default())) {
        let df = lf.map_err(e)?.collect().map_err(e)?;
        let (r, s, k, n) = (i64s(&df, c::RANK).map_err(e)?, i64s(&df, c::STEP).map_err(e)?, i64s(&df, KID).map_err(e)?, i64s(&df, "count").map_err(e)?);
        if let Some(first) = s.iter().flatten().min().copied() {
            let mut ranks = BTreeSet::new();
            let mut total = 0i64;
            let mut tensors: Vec<(u64, usize, u32, u32)> = Vec::new();
            for i in 0..df.height() {
                if s[i] != Some(first) {
                    continue;
                }
                let (Some(rank), Some(kid)) = (r[i], k[i]) else { continue };
                ranks.insert(rank as u32);
                total += n[i].unwrap_or(0);
                if let Some(key) = keys.get(kid as u32) {
                    let order = naming.rank(key.layer, &key.module, &key.role);
                    let g = Gemm::parse(&key.gemm).map_or(usize::MAX, |g| g as usize);
                    tensors.push((order, g, rank as u32, kid as u32));
                }
            }
            tensors.sort();
            let n_tensors = tensors.iter().map(|t| t.3).collect::<BTreeSet<_>>().len();
            let mut f = Finding::new(check::FIRST_NONFINITE);
            f.step = Some(first);
            f.ranks = ranks.iter().copied().collect();
            f.value = serde_json::Value::from(total);
            f.expected = serde_json::Value::from(0);
            if let Some(&(_, _, rank, kid)) = tensors.first() {
                if let Some(key) = keys.get(kid) {
                    let site = naming.site(key.layer, &key.module);
                    f.module = Some(site.clone());
                    f.role = Some(key.role.clone());
                    f.gemm = Some(key.gemm.clone());
                    f.message = format!(
                        "the first non-finite statistics are at step {first}, on rank(s) {:?}: {total} NaN/Inf value(s) in {n_tensors} tensor(s), the first in execution order {site}.{} ({}) on rank {rank}",
                        f.ranks, key.role, key.gemm
                    );
                }
            }
            f.magnitude = format!("{total} NaN/Inf in {n_tensors} tensor(s)");
            res.findings.push(f);
        }
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
