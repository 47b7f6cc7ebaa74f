//! Builds a report: runs every analysis the page shows (`find_anomalies`, `compare_runs`,
//! `locate`, `summarize` from [`crate::analysis`]) and the stats and tensors the charts need, then
//! draws the charts in parallel. What cannot be drawn (no baseline, no dumps, a BF16 run, no shadow
//! records) is said in the findings instead of an empty chart. `commands/report.rs` owns the flags
//! and the text output; [`crate::report::html`] the page.

use crate::analysis::anomalies::{AnomalyParams, AnomalyReport, find_anomalies, loss_curve};
use crate::analysis::compare::{CompareReport, compare_runs};
use crate::analysis::detect;
use crate::analysis::locate::{LocateReport, LocatedGemm, locate};
use crate::analysis::summary::{Summary, summarize};
use crate::error::AnalyzeError;
use crate::load::{Run, distinct_i64, f64s, i64s, strs};
use crate::output;
use crate::report::{self, Chart, DrawError, amax, channels, heatmap, histogram, loss, ranks, sites, slug};
use fp8scope_schemas::layout::Table;
use fp8scope_schemas::names::{Gemm, Role, SiteNaming};
use fp8scope_schemas::tables::col;
use polars::prelude::*;
use rayon::prelude::*;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Instant;

#[derive(Clone, Debug, Serialize)]
pub struct RunFindings {
    pub run: String,
    pub dir: String,
    pub recipe: String,
    pub status: String,
    pub steps_completed: u32,
    pub steps_planned: u32,
    /// The findings as sentences, most important first (the page's list).
    pub findings: Vec<String>,
    pub anomalies: Option<AnomalyReport>,
    /// `locate`'s ranking (its per-step errors left out); None when it could not run.
    pub locate: Option<LocateReport>,
    pub summary: Summary,
    /// What could not be drawn for this run, and why.
    pub not_drawn: Vec<String>,
}

/// Everything `report` wrote.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub out: String,
    pub index: String,
    pub baseline: Option<String>,
    pub threshold: f64,
    pub runs: Vec<RunFindings>,
    pub charts: Vec<Chart>,
    /// What could not be drawn for the whole report (e.g. no baseline).
    pub not_drawn: Vec<String>,
    pub warnings: Vec<String>,
    pub seconds: f64,
}

/// One stats row, as the charts need it.
#[derive(Clone, Debug)]
struct StatRow {
    step: i64,
    layer: i64,
    module: String,
    gemm: String,
    role: String,
    format: String,
    underflow: f64,
    saturated: f64,
    amax: f64,
    amax_used: f64,
    scale: f64,
    /// Block-scaled casts: the spread of log2 block scales, and the share of blocks that flush.
    block_spread: f64,
    block_flushed: f64,
}

fn stat_rows(run: &Run) -> Result<Vec<StatRow>, AnalyzeError> {
    let cols = [
        col::STEP,
        col::LAYER,
        col::MODULE,
        col::GEMM,
        col::ROLE,
        col::FORMAT,
        col::UNDERFLOW_FRAC,
        col::SATURATED_FRAC,
        col::AMAX,
        col::AMAX_USED,
        col::SCALE,
        col::BLOCK_SCALE_LOG2_STD,
        col::BLOCK_SCALE_FLUSHED_FRAC,
    ];
    let lf = run.scan(Table::Stats, &cols)?;
    let df = run.collect(Table::Stats, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "stats", e);
    let (st, la) = (i64s(&df, col::STEP).map_err(e)?, i64s(&df, col::LAYER).map_err(e)?);
    let (mo, ge, ro, fo) =
        (strs(&df, col::MODULE).map_err(e)?, strs(&df, col::GEMM).map_err(e)?, strs(&df, col::ROLE).map_err(e)?, strs(&df, col::FORMAT).map_err(e)?);
    let (un, sa, am, au, sc) = (
        f64s(&df, col::UNDERFLOW_FRAC).map_err(e)?,
        f64s(&df, col::SATURATED_FRAC).map_err(e)?,
        f64s(&df, col::AMAX).map_err(e)?,
        f64s(&df, col::AMAX_USED).map_err(e)?,
        f64s(&df, col::SCALE).map_err(e)?,
    );
    let (bs, bf) = (f64s(&df, col::BLOCK_SCALE_LOG2_STD).map_err(e)?, f64s(&df, col::BLOCK_SCALE_FLUSHED_FRAC).map_err(e)?);
    let nan = f64::NAN;
    Ok((0..df.height())
        .filter_map(|i| {
            Some(StatRow {
                step: st[i]?,
                layer: la[i]?,
                module: mo[i].clone()?,
                gemm: ge[i].clone()?,
                role: ro[i].clone()?,
                format: fo[i].clone().unwrap_or_default(),
                underflow: un[i].unwrap_or(nan),
                saturated: sa[i].unwrap_or(nan),
                amax: am[i].unwrap_or(nan),
                amax_used: au[i].unwrap_or(nan),
                scale: sc[i].unwrap_or(nan),
                block_spread: bs[i].unwrap_or(nan),
                block_flushed: bf[i].unwrap_or(nan),
            })
        })
        .collect())
}

/// Sites in forward order, as the run orders them (by layer, or as its modules were first seen).
pub(super) fn site_order(naming: &SiteNaming, layers: impl Iterator<Item = (i64, String)>) -> Vec<(i64, String)> {
    let mut v: Vec<(i64, String)> = layers.collect::<BTreeSet<_>>().into_iter().collect();
    v.sort_by_key(|(l, m)| (naming.rank(*l, m, Role::Activation.as_str()), *l, m.clone()));
    v
}

pub(super) fn grid(naming: &SiteNaming, title: String, sites: &[(i64, String)], steps: &[i64], value: &BTreeMap<(i64, String, i64), f64>) -> heatmap::Grid {
    heatmap::Grid {
        title,
        rows: sites.iter().map(|(l, m)| naming.site(*l, m)).collect(),
        steps: steps.to_vec(),
        cells: sites.iter().map(|(l, m)| steps.iter().map(|s| value.get(&(*l, m.clone(), *s)).copied()).collect()).collect(),
    }
}

/// Underflow or saturation panels, one per quantized role that ran in FP8 (max over the GEMMs
/// that cast it).
fn fraction_panels(naming: &SiteNaming, rows: &[StatRow], pick: fn(&StatRow) -> f64) -> Vec<heatmap::Grid> {
    let fp8: Vec<&StatRow> = rows.iter().filter(|r| r.format != "bf16").collect();
    let sites = site_order(naming, fp8.iter().map(|r| (r.layer, r.module.clone())));
    let steps: Vec<i64> = fp8.iter().map(|r| r.step).collect::<BTreeSet<_>>().into_iter().collect();
    let mut out = Vec::new();
    for role in Role::ALL.iter().filter(|r| r.is_quantized()) {
        let mine: Vec<&&StatRow> = fp8.iter().filter(|r| r.role == role.as_str()).collect();
        if mine.is_empty() {
            continue;
        }
        let mut v: BTreeMap<(i64, String, i64), f64> = BTreeMap::new();
        for r in &mine {
            let x = pick(r);
            // A statistic the run did not record (a run from elsewhere) reads as NaN: no value.
            if x.is_nan() {
                continue;
            }
            let e = v.entry((r.layer, r.module.clone(), r.step)).or_insert(x);
            *e = if x.is_nan() || e.is_nan() { f64::NAN } else { e.max(x) };
        }
        let formats: BTreeSet<String> = mine.iter().map(|r| r.format.to_uppercase()).collect();
        let title = format!("{} ({})", role.as_str(), formats.into_iter().collect::<Vec<_>>().join("/"));
        out.push(grid(naming, title, &sites, &steps, &v));
    }
    out
}

fn cosine_panels(naming: &SiteNaming, c: &CompareReport) -> Vec<heatmap::Grid> {
    let sites = site_order(naming, c.tensors.iter().map(|t| (t.layer, t.module.clone())));
    let mut out = Vec::new();
    for role in Role::ALL {
        let v: BTreeMap<(i64, String, i64), f64> =
            c.tensors.iter().filter(|t| t.role == role.as_str()).map(|t| ((t.layer, t.module.clone(), t.step), t.metrics.cosine)).collect();
        if !v.is_empty() {
            out.push(grid(naming, role.as_str().to_string(), &sites, &c.common_steps, &v));
        }
    }
    out
}

/// The dumped values of one tensor at one step (its rows concatenated), with the cast's format,
/// scale and the tensor's element count; None when it was not dumped or not cast to FP8.
fn tensor_sample(run: &Run, step: i64, layer: i64, module: &str, role: &str) -> Result<Option<histogram::TensorSample>, AnalyzeError> {
    let lf = run.scan(Table::Tensors, &[col::STEP, col::LAYER, col::MODULE, col::ROLE, col::FORMAT, col::SCALE, col::NUMEL, col::VALUES])?.filter(
        col(col::STEP)
            .eq(lit(step))
            .and(col(col::LAYER).cast(DataType::Int64).eq(lit(layer)))
            .and(col(col::MODULE).eq(lit(module.to_string())))
            .and(col(col::ROLE).eq(lit(role.to_string()))),
    );
    let df = run.collect(Table::Tensors, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "tensors", e);
    if df.height() == 0 {
        return Ok(None);
    }
    let (fo, sc, nu) = (strs(&df, col::FORMAT).map_err(e)?, f64s(&df, col::SCALE).map_err(e)?, i64s(&df, col::NUMEL).map_err(e)?);
    let (Some(format), Some(scale)) = (fo[0].clone(), sc[0]) else { return Ok(None) };
    let Some(range) = histogram::Fp8Range::of(&format) else { return Ok(None) };
    let mut values = Vec::new();
    let lists = df.column(col::VALUES).map_err(e)?.list().map_err(e)?.clone();
    for s in lists.amortized_iter().flatten() {
        let s = s.as_ref();
        let s = s.cast(&DataType::Float32).map_err(e)?;
        values.extend(s.f32().map_err(e)?.iter().map(|v| v.unwrap_or(f32::NAN)));
    }
    Ok(Some(histogram::TensorSample {
        label: format!("{} at step {step} ({}, scale {})", run.naming.tensor(layer, module, role), range.name, report::short(scale)),
        range,
        scale,
        numel: nu[0].unwrap_or(values.len() as i64),
        values,
    }))
}

/// The dump rows of the activation of `layers.{layer}.{module}` at `step`, as per-channel maxima;
/// None when the run did not dump it there.
fn channel_sample(run: &Run, step: i64, layer: i64, module: &str) -> Result<Option<channels::ChannelAmax>, AnalyzeError> {
    let lf = run.scan(Table::Tensors, &[col::STEP, col::LAYER, col::MODULE, col::ROLE, col::SHAPE, col::OFFSET, col::STRIDE, col::VALUES])?.filter(
        col(col::STEP)
            .eq(lit(step))
            .and(col(col::LAYER).cast(DataType::Int64).eq(lit(layer)))
            .and(col(col::MODULE).eq(lit(module.to_string())))
            .and(col(col::ROLE).eq(lit(Role::Activation.as_str()))),
    );
    let df = run.collect(Table::Tensors, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "tensors", e);
    let (off, stride) = (i64s(&df, col::OFFSET).map_err(e)?, i64s(&df, col::STRIDE).map_err(e)?);
    let list = |name: &str, dt: DataType| -> Result<Vec<Series>, AnalyzeError> {
        let l = df.column(name).map_err(e)?.list().map_err(e)?.clone();
        l.amortized_iter().map(|s| s.map(|s| s.as_ref().cast(&dt)).unwrap_or_else(|| Ok(Series::new_empty("".into(), &dt))).map_err(e)).collect()
    };
    let (shapes, values) = (list(col::SHAPE, DataType::Int64)?, list(col::VALUES, DataType::Float32)?);
    let mut rows = Vec::new();
    for i in 0..df.height() {
        rows.push(channels::DumpRow {
            shape: shapes[i].i64().map_err(e)?.iter().map(|v| v.unwrap_or(0)).collect(),
            offset: off[i].unwrap_or(0),
            stride: stride[i].unwrap_or(1),
            values: values[i].f32().map_err(e)?.iter().map(|v| v.unwrap_or(f32::NAN)).collect(),
        });
    }
    Ok(channels::ChannelAmax::of(format!("layers.{layer}.{module}.activation at step {step}"), &rows))
}

/// Every rank's loss and step time, from the steps table of every rank (a multi-rank run).
fn rank_series(run: &Run) -> Result<Vec<ranks::RankSeries>, AnalyzeError> {
    let all = run.all_ranks()?;
    let lf = all.scan(Table::Steps, &[col::RANK, col::STEP, col::LOSS, col::STEP_MS])?.sort([col::RANK, col::STEP], Default::default());
    let df = all.collect(Table::Steps, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "steps", e);
    let (rk, st, lo, ms) =
        (i64s(&df, col::RANK).map_err(e)?, i64s(&df, col::STEP).map_err(e)?, f64s(&df, col::LOSS).map_err(e)?, f64s(&df, col::STEP_MS).map_err(e)?);
    let mut by: BTreeMap<u32, ranks::RankSeries> = BTreeMap::new();
    for i in 0..df.height() {
        let r = rk[i].unwrap_or(0) as u32;
        let s = by.entry(r).or_insert_with(|| ranks::RankSeries { rank: r, ..Default::default() });
        s.steps.push(st[i].unwrap_or(0));
        s.loss.push(lo[i].unwrap_or(f64::NAN));
        s.step_ms.push(ms[i].unwrap_or(f64::NAN));
    }
    Ok(by.into_values().collect())
}

/// The per-rank chart's job and caption, for a run of several ranks.
fn ranks_job(run: &Run, file_stem: &str) -> Result<Option<Job>, AnalyzeError> {
    if !run.multi_rank() {
        return Ok(None);
    }
    let series = rank_series(run)?;
    if series.len() < 2 {
        return Ok(None);
    }
    let medians: Vec<(u32, f64)> = series.iter().filter_map(|s| s.median_ms().map(|m| (s.rank, m))).collect();
    let slowest = medians.iter().max_by(|a, b| a.1.total_cmp(&b.1));
    let fastest = medians.iter().min_by(|a, b| a.1.total_cmp(&b.1));
    let spread = match (slowest, fastest) {
        (Some(s), Some(f)) => format!(" Median step time: slowest rank {} ({} ms), fastest rank {} ({} ms).", s.0, report::short(s.1), f.0, report::short(f.1)),
        _ => String::new(),
    };
    let how = if series.len() > ranks::MAX_LINES { "the minimum, median and maximum over the ranks at each step" } else { "one line per rank" };
    let caption = format!(
        "Each rank's loss as it recorded it (the PyTorch recorder: its own shard of the batch; fp8-capture: the global batch's, the same on every rank) and step time, {how}; a rank that leaves the bundle, stops early or runs slow stands out. `fp8-analyze ranks` checks what must agree across ranks.{spread}"
    );
    let title = format!("{}: loss and step time per rank", run.name);
    Ok(Some(Job::Ranks { chart: chart(format!("{file_stem}_ranks.png"), "ranks", &run.name, report::RANKS_SIZE, title, caption), series }))
}

/// What one run contributes: findings and the charts to draw (drawn later, in parallel).
struct RunWork {
    findings: RunFindings,
    curve: loss::RunCurve,
    jobs: Vec<Job>,
}

/// A chart to draw.
enum Job {
    Heatmap { chart: Chart, bar: &'static str, scale: heatmap::Scale, panels: Vec<heatmap::Grid> },
    Sites { chart: Chart, threshold: f64, bars: Vec<sites::Bar> },
    Amax { chart: Chart, gemms: Vec<amax::GemmSeries> },
    Histogram { chart: Chart, tensors: Vec<histogram::TensorSample> },
    Channels { chart: Chart, tensor: channels::ChannelAmax },
    Ranks { chart: Chart, series: Vec<ranks::RankSeries> },
}

impl Job {
    fn chart(&self) -> &Chart {
        match self {
            Job::Heatmap { chart, .. }
            | Job::Sites { chart, .. }
            | Job::Amax { chart, .. }
            | Job::Histogram { chart, .. }
            | Job::Channels { chart, .. }
            | Job::Ranks { chart, .. } => chart,
        }
    }
    fn draw(&self, dir: &Path) -> Result<(), DrawError> {
        let path = dir.join(&self.chart().file);
        match self {
            Job::Heatmap { chart, bar, scale, panels } => heatmap::draw(&path, &chart.title, bar, *scale, panels),
            Job::Sites { chart, threshold, bars } => sites::draw(&path, chart.run.as_deref().unwrap_or(""), *threshold, bars),
            Job::Amax { chart, gemms } => amax::draw(&path, chart.run.as_deref().unwrap_or(""), gemms),
            Job::Histogram { chart, tensors } => histogram::draw(&path, chart.run.as_deref().unwrap_or(""), tensors),
            Job::Channels { chart, tensor } => channels::draw(&path, chart.run.as_deref().unwrap_or(""), tensor),
            Job::Ranks { chart, series } => ranks::draw(&path, chart.run.as_deref().unwrap_or(""), series),
        }
    }
}

fn chart(file: String, kind: &'static str, run: &str, size: (u32, u32), title: String, caption: String) -> Chart {
    Chart { file, kind, run: Some(run.to_string()), width: size.0, height: size.1, title, caption }
}

/// Gathers one run's findings and chart data.
fn analyze_run(run: &Run, base: Option<&Run>, file_stem: &str, p: AnomalyParams, threshold: f64, top: usize) -> Result<RunWork, AnalyzeError> {
    let m = &run.manifest;
    let summary = summarize(run, 5)?;
    let mut not_drawn = Vec::new();
    let mut findings = Vec::new();
    let is_bf16 = m.config.recipe.kind.as_str() == "bf16";

    // Anomalies, with drift against the baseline when the two can be compared.
    let anomalies = match find_anomalies(run, base, None, p) {
        Ok(a) => Some(a),
        Err(e) if base.is_some() => {
            not_drawn.push(format!("the gap to the baseline: {e}"));
            find_anomalies(run, None, None, p).ok()
        }
        Err(e) => {
            not_drawn.push(format!("the loss curve: {e}"));
            None
        }
    };
    if let Some(a) = &anomalies {
        findings.extend(anomaly_sentences(a));
    }
    let (steps, loss_v) = loss_curve(run)?;
    let gap = match (base, &anomalies) {
        (Some(b), Some(a)) if a.baseline.is_some() => {
            let (bs, bl) = loss_curve(b)?;
            let at: BTreeMap<i64, f64> = bs.into_iter().zip(bl).collect();
            let (cs, (r, bv)): (Vec<i64>, (Vec<f64>, Vec<f64>)) = steps.iter().zip(&loss_v).filter_map(|(s, l)| at.get(s).map(|b| (*s, (*l, *b)))).unzip();
            detect::smoothed_gap_outside_spikes(&cs, &r, &bv, &a.gap_spikes, p.drift_alpha)
        }
        _ => Vec::new(),
    };
    let curve = loss::RunCurve {
        curve: loss::Curve { name: run.name.clone(), steps, loss: loss_v },
        spike_peaks: anomalies.as_ref().map(spike_peaks).unwrap_or_default(),
        drift_first: anomalies.as_ref().and_then(|a| a.drift.as_ref().map(|d| d.first_step)),
        first_nonfinite: anomalies.as_ref().and_then(|a| a.nonfinite.first_loss_step),
        gap,
    };

    let mut jobs = Vec::new();
    let has_tensors = run.has(Table::Tensors)?;
    if let Some(note) = run.rank_note() {
        findings.push(format!("Read {note}."));
    }
    let lv = &summary.liveness;
    if !lv.stopped().is_empty() || !lv.crashed().is_empty() || !lv.missing.is_empty() {
        let missing = if lv.missing.is_empty() { String::new() } else { format!("; ranks {} left nothing", crate::load::compact_ranks(&lv.missing)) };
        findings.push(format!("The run {}{missing}.", lv.status));
    }
    jobs.extend(ranks_job(run, file_stem)?);

    // Cosine heatmap: needs a baseline and dumps in both.
    let compare = match base {
        None => {
            not_drawn.push("cosine to the baseline heatmap: no --baseline given".into());
            None
        }
        Some(_) if !has_tensors => {
            not_drawn.push("cosine to the baseline heatmap: the run dumped no tensors (record with --dump-every N)".into());
            None
        }
        Some(b) => match compare_runs(run, b, threshold) {
            Ok(c) => Some(c),
            Err(e) => {
                not_drawn.push(format!("cosine to the baseline heatmap: {e}"));
                None
            }
        },
    };
    if let Some(c) = &compare {
        let panels = cosine_panels(&run.naming, c);
        if !panels.is_empty() {
            let worst = c.tensors.iter().min_by(|a, b| {
                let k = |t: &crate::analysis::compare::TensorComparison| if t.metrics.cosine.is_finite() { t.metrics.cosine } else { f64::NEG_INFINITY };
                k(a).total_cmp(&k(b))
            });
            let mut caption = format!(
                "Cosine similarity of each dumped tensor to the baseline's, per site (rows) and dump step (columns), one panel per role; {} of {} tensors below {}.",
                c.flagged,
                c.tensors.len(),
                threshold
            );
            if let Some(w) = worst {
                caption += &format!(" Lowest: {} at step {} (cosine {}).", w.tensor, w.step, output::cos(w.metrics.cosine));
            }
            jobs.push(Job::Heatmap {
                chart: chart(
                    format!("{file_stem}-cosine.png"),
                    "heatmap-cosine",
                    &run.name,
                    report::HEATMAP_SIZE,
                    format!("{}: cosine to baseline '{}'", run.name, c.baseline),
                    caption,
                ),
                bar: "cosine to baseline",
                scale: heatmap::Scale::Cosine,
                panels,
            });
        }
    }

    // Underflow and saturation heatmaps: need FP8 casts.
    let rows = stat_rows(run)?;
    let multi_rank = summary.manifest.source.is_external() && distinct_i64(run, Table::Stats, col::RANK)?.len() > 1;
    if rows.is_empty() {
        not_drawn.push("underflow and saturation heatmaps: the run has no stats rows".into());
    } else if rows.iter().all(|r| r.underflow.is_nan() && r.saturated.is_nan()) {
        not_drawn.push("underflow and saturation heatmaps: the run's statistics hold no underflow or saturation (its logs recorded none)".into());
    } else if rows.iter().all(|r| r.format == "bf16") {
        not_drawn
            .push(format!("underflow and saturation heatmaps: every GEMM ran in BF16 (recipe {}), nothing was cast to FP8", m.config.recipe.kind.as_str()));
    } else {
        for (kind, what, pick, worst) in [
            ("heatmap-underflow", "underflow", (|r: &StatRow| r.underflow) as fn(&StatRow) -> f64, &summary.worst_underflow),
            ("heatmap-saturated", "saturated", (|r: &StatRow| r.saturated) as fn(&StatRow) -> f64, &summary.worst_saturation),
        ] {
            let panels = fraction_panels(&run.naming, &rows, pick);
            let explain = if what == "underflow" { "non-zero values that cast to ±0" } else { "values beyond the format's max, clipped" };
            let mut caption = format!(
                "Share of {explain}, per site (rows) and step (columns), one panel per quantized role (the worst GEMM that cast it{}).",
                if multi_rank { " and the worst rank" } else { "" }
            );
            if let Some(c) = &summary.provenance.stats_caveat {
                caption += &format!(" From {c}.");
            }
            match worst.first() {
                Some(t) => {
                    caption += &format!(
                        " Worst on average: {} ({}), mean {}, max {}.",
                        t.tensor,
                        t.gemm,
                        report::percent(if what == "underflow" { t.mean_underflow_frac } else { t.mean_saturated_frac }),
                        report::percent(if what == "underflow" { t.max_underflow_frac } else { t.max_saturated_frac })
                    )
                }
                None => caption += &format!(" No operand {what} at any step."),
            }
            jobs.push(Job::Heatmap {
                chart: chart(
                    format!("{file_stem}-{what}.png"),
                    kind,
                    &run.name,
                    report::HEATMAP_SIZE,
                    format!("{}: {what} fraction of FP8 casts", run.name),
                    caption,
                ),
                bar: if what == "underflow" { "underflow fraction" } else { "saturated fraction" },
                scale: heatmap::Scale::Fraction,
                panels,
            });
        }
    }

    // Block-scale heatmaps: for block-scaled casts (block, mxfp8, nvfp4) that recorded them.
    if rows.iter().any(|r| r.block_spread.is_finite()) {
        for (kind, what, bar, scale, pick, explain) in [
            (
                "heatmap-block-spread",
                "block-scale spread",
                "std of log2 block scale (bits)",
                heatmap::Scale::Bits,
                (|r: &StatRow| r.block_spread) as fn(&StatRow) -> f64,
                "Spread of each operand's block scales: the standard deviation of their log2, in bits (0: every block got the same scale)",
            ),
            (
                "heatmap-block-flushed",
                "flushed blocks",
                "share of blocks flushed",
                heatmap::Scale::Fraction,
                (|r: &StatRow| r.block_flushed) as fn(&StatRow) -> f64,
                "Share of each operand's non-zero blocks whose scale is zero or below its format's range (their elements vanish: NVFP4's E4M3 block scale rounds to 0 under 2^-10/448 of the tensor's amax)",
            ),
        ] {
            let panels = fraction_panels(&run.naming, &rows, pick);
            let caption = format!("{explain}, per site (rows) and step (columns), one panel per quantized role (the worst GEMM that cast it).");
            jobs.push(Job::Heatmap {
                chart: chart(
                    format!("{file_stem}-{}.png", kind.trim_start_matches("heatmap-")),
                    kind,
                    &run.name,
                    report::HEATMAP_SIZE,
                    format!("{}: {what} of block-scaled casts", run.name),
                    caption,
                ),
                bar,
                scale,
                panels,
            });
        }
    }

    // What-ifs: the last dumps cast as each other format would cast them.
    match report::whatif::whatif_chart(run) {
        Ok(Some(w)) => {
            findings.extend(w.finding);
            jobs.push(Job::Heatmap {
                chart: chart(
                    format!("{file_stem}-whatif.png"),
                    "heatmap-whatif",
                    &run.name,
                    report::HEATMAP_SIZE,
                    format!("{}: what other formats would do to the dumped operands (cosine)", run.name),
                    w.caption,
                ),
                bar: "cosine against the recorded values",
                scale: heatmap::Scale::Cosine,
                panels: w.panels,
            });
        }
        Ok(None) => not_drawn.push("what-if chart: the run has no whole 2-D operand dumps (record with --dump-every N)".into()),
        Err(e) => not_drawn.push(format!("what-if chart: {e}")),
    }

    // locate: shadow records, or the baseline's tensors.
    let located = if is_bf16 {
        not_drawn.push("locate's ranking, amax, histograms and channels: the run is BF16 (no FP8 GEMM to blame)".into());
        None
    } else {
        match locate(run, base, threshold) {
            Ok(l) => Some(l),
            Err(e) => {
                not_drawn.push(format!("locate's ranking, amax, histograms and channels: {e}"));
                None
            }
        }
    };
    if let Some(l) = &located {
        findings.extend(locate_sentences(l));
        if l.ranked.is_empty() {
            not_drawn.push(if l.method == "stats" {
                "locate's ranking: no GEMM could be scored (the run's statistics hold no underflow or saturation)".to_string()
            } else {
                "locate's ranking: no GEMM could be scored (no result tensors dumped)".to_string()
            });
        } else {
            let method = match l.method {
                "shadow" => "shadow GEMMs against BF16 on the same inputs".to_string(),
                "stats" => "the share of values each GEMM's casts lost, from the statistics: the run lacks shadow records and dumps".to_string(),
                _ => format!("tensors against baseline '{}'", l.baseline.as_deref().unwrap_or("?")),
            };
            let bars: Vec<sites::Bar> = l
                .ranked
                .iter()
                .take(10)
                .map(|g| sites::Bar { name: g.gemm_name.clone(), score: g.peak_error, peak_step: g.peak_error_step, first_crossed: g.first_crossed })
                .collect();
            jobs.push(Job::Sites {
                chart: chart(
                    format!("{file_stem}-sites.png"),
                    "sites",
                    &run.name,
                    report::SITES_SIZE,
                    if l.method == "stats" { format!("{}: share of values each GEMM's casts lost", run.name) } else { format!("{}: error each GEMM adds, in order of harm", run.name) },
                    format!("locate's top GEMMs in its order (by harm, the error in loss units, when shadow records and stats allow; {method}): the largest error (1 − cosine) each adds at a dump step after delayed scaling's warm-up; bars past the dashed threshold crossed it."),
                ),
                threshold,
                bars,
            });
            // amax against amax_used for the top GEMMs.
            let gemms: Vec<amax::GemmSeries> = l
                .ranked
                .iter()
                .take(top.clamp(1, 3))
                .enumerate()
                .map(|(i, g)| {
                    let ops = Gemm::parse(&g.gemm).map(|x| x.operands().map(|r| r.as_str().to_string()).to_vec()).unwrap_or_default();
                    let operands = ops
                        .into_iter()
                        .map(|role| {
                            let mut mine: Vec<&StatRow> =
                                rows.iter().filter(|r| r.layer == g.layer && r.module == g.module && r.gemm == g.gemm && r.role == role).collect();
                            mine.sort_by_key(|r| r.step);
                            amax::Operand {
                                format: mine.first().map(|r| r.format.to_uppercase()).unwrap_or_default(),
                                role,
                                steps: mine.iter().map(|r| r.step).collect(),
                                amax: mine.iter().map(|r| r.amax).collect(),
                                amax_used: mine.iter().map(|r| r.amax_used).collect(),
                                scale: mine.iter().map(|r| r.scale).collect(),
                            }
                        })
                        .filter(|o| !o.steps.is_empty())
                        .collect();
                    amax::GemmSeries { name: g.gemm_name.clone(), rank: i + 1, first_crossed: g.first_crossed, operands }
                })
                .filter(|g| !g.operands.is_empty())
                .collect();
            if gemms.is_empty() {
                not_drawn.push("amax over time: no stats rows for the top GEMMs".into());
            } else {
                let recipe = m.config.recipe.label();
                jobs.push(Job::Amax {
                    chart: chart(
                        format!("{file_stem}-amax.png"),
                        "amax",
                        &run.name,
                        report::AMAX_SIZE,
                        format!("{}: amax and scale of the top GEMMs", run.name),
                        format!(
                            "For locate's top {} GEMM(s): each operand's amax per step (solid) against the amax its scale was computed from (dashed), and the scale. Recipe {recipe}{}.",
                            gemms.len(),
                            if recipe == "delayed" { format!(": the scale follows the max of the last {} amaxes, so a dashed line that trails a jump in the solid one is delayed scaling lagging a spike", m.config.recipe.amax_history) } else { String::new() }
                        ),
                    ),
                    gemms,
                });
            }
            // Per-channel max |x| of the activation of the top GEMM's site.
            if let Some(job) = channel_job(run, &l.ranked[0], has_tensors, file_stem, &mut not_drawn)? {
                jobs.push(job);
            }
            // Histograms of the top GEMMs' operands at the step they crossed (or peaked).
            if !has_tensors {
                not_drawn.push(if m.source.is_external() {
                    "log2|x| histograms: the run lacks dumped tensors".into()
                } else {
                    "log2|x| histograms: the run dumped no tensors (record with --dump-every N)".into()
                });
            } else {
                let dump_steps = distinct_i64(run, Table::Tensors, col::STEP)?;
                let mut tensors = Vec::new();
                let mut seen = BTreeSet::new();
                for g in l.ranked.iter().take(2) {
                    let want = g.first_crossed.unwrap_or(g.peak_step);
                    // The dump step at or just before the wanted one.
                    let Some(step) = dump_steps.range(..=want).next_back().or(dump_steps.iter().next()).copied() else { continue };
                    for role in Gemm::parse(&g.gemm).map(|x| x.operands().to_vec()).unwrap_or_default() {
                        if seen.insert((g.layer, g.module.clone(), role.as_str(), step))
                            && let Some(t) = tensor_sample(run, step, g.layer, &g.module, role.as_str())?
                        {
                            tensors.push(t);
                        }
                    }
                }
                if tensors.is_empty() {
                    not_drawn.push("log2|x| histograms: the top GEMMs' operands were not dumped as FP8 casts".into());
                } else {
                    let list = tensors.iter().map(|t| {
                        let s = histogram::shares(&t.values, t.range, t.scale);
                        format!("{}: {} round to 0, {} saturate", t.label, report::percent(s.underflow), report::percent(s.saturated))
                    });
                    jobs.push(Job::Histogram {
                        chart: chart(
                            format!("{file_stem}-histograms.png"),
                            "histogram",
                            &run.name,
                            report::HISTOGRAM_SIZE,
                            format!("{}: log2|x| against the FP8 range", run.name),
                            format!(
                                "Dumped values of the top GEMMs' operands with the FP8 format's smallest subnormal, smallest normal and max at the cast's scale (dashed); shaded: values that round to 0 (left) and that saturate (right). {}.",
                                list.collect::<Vec<_>>().join("; ")
                            ),
                        ),
                        tensors: tensors.into_iter().take(4).collect(),
                    });
                }
            }
        }
    }
    if findings.is_empty() {
        findings.push("No spike, drift, non-finite value or GEMM past the threshold was found.".into());
    }
    // What the run lacks and the caveat of rounded statistics, said once, first.
    let p = &summary.provenance;
    let mut head = Vec::new();
    if m.source.is_external() {
        head.push(format!(
            "Recorded by {} ({}); sites are named by module path. It lacks {}.",
            p.source,
            p.framework.as_deref().unwrap_or("framework unknown"),
            if p.lacks.is_empty() { "nothing".to_string() } else { p.lacks.join(", ") }
        ));
    }
    if let Some(c) = &p.stats_caveat {
        head.push(format!("Every finding from its statistics rests on {c}."));
    }
    for u in anomalies.iter().flat_map(|a| a.unavailable.iter()) {
        not_drawn.push(format!("spikes and drift: {u}"));
    }
    findings.splice(0..0, head);
    Ok(RunWork {
        findings: RunFindings {
            run: run.name.clone(),
            dir: run.dir.display().to_string(),
            recipe: m.config.recipe.label(),
            status: m.status.as_str().to_string(),
            steps_completed: m.steps_completed,
            steps_planned: m.config.train.steps,
            findings,
            anomalies,
            locate: located.map(|mut l| {
                l.ranked.truncate(10);
                l.ranked.iter_mut().for_each(|g| g.errors.clear());
                l
            }),
            summary,
            not_drawn,
        },
        curve,
        jobs,
    })
}

/// The channel chart of the activation of `g`'s site at the dump step at or before the step `g`
/// crossed (or peaked), or why it cannot be drawn (pushed to `not_drawn`).
fn channel_job(run: &Run, g: &LocatedGemm, has_tensors: bool, file_stem: &str, not_drawn: &mut Vec<String>) -> Result<Option<Job>, AnalyzeError> {
    let what = format!("per-channel max|x| of {}.activation", g.site);
    if !has_tensors {
        not_drawn.push(format!("{what}: the run has no dump of it (it dumped no tensors; record with --dump-every N)"));
        return Ok(None);
    }
    let want = g.first_crossed.unwrap_or(g.peak_step);
    let dump_steps = distinct_i64(run, Table::Tensors, col::STEP)?;
    let step = dump_steps.range(..=want).next_back().or(dump_steps.iter().next()).copied();
    let Some(t) = step.map(|s| channel_sample(run, s, g.layer, &g.module)).transpose()?.flatten() else {
        not_drawn.push(format!("{what}: the run has no dump of it (record with --dump-roles including activation and --dump-layers matching {})", g.site));
        return Ok(None);
    };
    let caption = format!(
        "Per-channel max|x| of the dumped values of {}.activation, the input of the site of locate's top GEMM {} (a channel is a column of the {}×{} tensor), over {} of its {} rows ({} values): {}. One tall bar is an outlier channel, which a per-tensor scale must fit at the expense of every other channel.",
        g.site,
        g.gemm_name,
        t.rows,
        t.amax.len(),
        t.rows_seen,
        t.rows,
        t.values,
        t.headline()
    );
    Ok(Some(Job::Channels {
        chart: chart(
            format!("{file_stem}-channels.png"),
            "channels",
            &run.name,
            report::CHANNELS_SIZE,
            format!("{}: per-channel max|x| of {}", run.name, t.label),
            caption,
        ),
        tensor: t,
    }))
}

fn anomaly_sentences(a: &AnomalyReport) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(s) = a.nonfinite.first_loss_step {
        let mut t = format!("The loss went non-finite at step {s}");
        if let Some(x) = &a.nonfinite.first_tensor {
            t += &format!("; the first tensor to hold NaN/Inf was {} at step {}", x.tensor, x.step);
            if let Some(g) = &x.gemm {
                t += &format!(" (cast for {g})");
            }
        }
        out.push(t + ".");
    } else if let Some(x) = &a.nonfinite.first_tensor {
        out.push(format!("A tensor held NaN/Inf: {} at step {}, though the loss stayed finite.", x.tensor, x.step));
    }
    for s in a.counted_gap_spikes() {
        out.push(format!(
            "Loss spike against the baseline from step {} peaking at step {}: {} against the baseline's {} ({:+.1}%, z = {:.1} of the gap's rolling noise), {}.",
            s.start,
            s.peak,
            report::short(s.peak_loss),
            report::short(s.peak_base_loss),
            100.0 * s.peak_gap,
            s.peak_z,
            output::back_in_band(s.recovery)
        ));
    }
    if let Some(d) = &a.drift {
        out.push(format!(
            "The loss drifted {} the baseline from step {} (confirmed at {}); the smoothed gap at step {} is {:+.2}% (raw {:+.2}%).",
            d.sign,
            d.first_step,
            d.confirmed_step,
            d.final_step,
            100.0 * d.final_gap,
            100.0 * d.final_raw_gap
        ));
    }
    // The mechanisms in the statistics: the first of each kind, and whether it came before the loss moved.
    let mut kinds: Vec<&str> = Vec::new();
    for m in &a.mechanisms {
        if kinds.contains(&m.kind) {
            continue;
        }
        kinds.push(m.kind);
        let n = a.mechanisms.iter().filter(|o| o.kind == m.kind).count();
        let more = if n > 1 { format!(" ({} more of this kind in anomalies --json)", n - 1) } else { String::new() };
        let when = match a.first_anomaly_step() {
            Some(s) if m.step < s => format!(", {} step(s) before the loss moved", s - m.step),
            Some(_) => String::new(),
            None => ", with no loss anomaly yet".into(),
        };
        let mut t = m.describe();
        if let Some(first) = t.get(..1) {
            t = first.to_uppercase() + &t[1..];
        }
        out.push(format!("{t}{when}{more}."));
    }
    let own = if a.baseline.is_some() { " in the run's own curve (the baseline may share it: only spikes against the baseline count)" } else { "" };
    for s in &a.spikes {
        out.push(format!(
            "Loss spike{own} from step {} peaking at step {} ({} against a rolling median of {}, z = {:.1}), {}.",
            s.start,
            s.peak,
            report::short(s.peak_loss),
            report::short(s.median),
            s.peak_z,
            output::back_in_band(s.recovery)
        ));
    }
    out
}

fn locate_sentences(l: &LocateReport) -> Vec<String> {
    let how = match l.method {
        "shadow" => "its shadow GEMMs (FP8 against BF16 on the same inputs)",
        "stats" => "the share of values its casts lost (underflow + saturation, from the rounded statistics)",
        _ => "its tensors against the baseline's",
    };
    if l.method == "stats" {
        let Some(g) = l.ranked.first() else { return Vec::new() };
        let mut s = format!(
            "Ranked by {how}, the worst GEMM is {}: its casts lost {} of an operand's values at step {}",
            g.gemm_name,
            report::percent(g.peak_error),
            g.peak_error_step
        );
        s += &match g.first_crossed {
            Some(c) => format!(", more than {} first at step {c}.", report::percent(1.0 - l.threshold)),
            None => format!(", never more than {}.", report::percent(1.0 - l.threshold)),
        };
        return vec![s];
    }
    let Some(name) = &l.first else {
        return vec![format!("No GEMM adds more than {} error (1 − {}) according to {how}.", report::short(1.0 - l.threshold), l.threshold)];
    };
    let Some(g) = l.ranked.iter().find(|g| &g.gemm_name == name) else { return Vec::new() };
    let mut s = format!(
        "The first GEMM to add more than {} error (1 − cosine {}) is {} at step {}, according to {how}; it adds at most {} (step {}).",
        report::short(1.0 - l.threshold),
        l.threshold,
        g.gemm_name,
        output::opt(g.first_crossed),
        report::short(g.peak_error),
        g.peak_error_step
    );
    let ev: Vec<String> = g
        .evidence
        .iter()
        .map(|e| {
            format!(
                "{} {} saturated {}, underflow {}, amax {} vs amax used by the scale {}",
                e.role,
                e.format.as_deref().unwrap_or("?").to_uppercase(),
                e.saturated_frac.map(report::percent).unwrap_or("-".into()),
                e.underflow_frac.map(report::percent).unwrap_or("-".into()),
                e.amax.map(report::short).unwrap_or("-".into()),
                e.amax_used.map(report::short).unwrap_or("-".into())
            )
        })
        .collect();
    if !ev.is_empty() {
        s += &format!(" Its operands at step {}: {}.", g.evidence[0].step, ev.join("; "));
    }
    let channels: Vec<String> = g.evidence.iter().filter_map(|e| e.channel_phrase()).collect();
    if !channels.is_empty() {
        s += &format!(" Channels: {}.", channels.join("; "));
    }
    vec![s]
}

/// The peaks of the spikes that count: against the baseline when there is one, else in the run's
/// own curve.
fn spike_peaks(a: &AnomalyReport) -> Vec<(i64, f64)> {
    if a.baseline.is_some() {
        a.counted_gap_spikes().into_iter().map(|s| (s.peak, s.peak_loss)).collect()
    } else {
        a.spikes.iter().map(|s| (s.peak, s.peak_loss)).collect()
    }
}

/// Builds the whole report into `out`.
pub fn build_report(runs: &[Run], base: Option<&Run>, out: &Path, threshold: f64, top: usize) -> Result<Report, AnalyzeError> {
    let t0 = Instant::now();
    if !(threshold > -1.0 && threshold <= 1.0) {
        return Err(AnalyzeError::usage(format!("--threshold must be a cosine in (-1, 1], got {threshold}")));
    }
    std::fs::create_dir_all(out).map_err(|e| AnalyzeError::Output { path: out.to_path_buf(), message: e.to_string() })?;
    let p = AnomalyParams::defaults();
    let mut stems: Vec<String> = Vec::new();
    let mut works = Vec::new();
    for run in runs {
        let mut stem = slug(&run.name);
        while stems.contains(&stem) || stem == "loss" || stem == "index" || stem == "report" {
            stem += "_";
        }
        stems.push(stem.clone());
        works.push(analyze_run(run, base, &stem, p, threshold, top)?);
    }
    let mut not_drawn = Vec::new();
    if base.is_none() {
        not_drawn.push("the relative gap to the baseline, drift and the cosine heatmaps: no --baseline given".to_string());
    }
    let base_curve = match base {
        Some(b) => {
            let (s, l) = loss_curve(b)?;
            Some(loss::Curve { name: b.name.clone(), steps: s, loss: l })
        }
        None => None,
    };
    let any_loss = base_curve.iter().chain(works.iter().map(|w| &w.curve.curve)).any(|c| !c.steps.is_empty());
    if !any_loss {
        not_drawn.push("the loss chart: no run has a loss curve (every run lacks recorded steps)".to_string());
    }
    let loss_chart = loss::LossChart { baseline: base_curve, runs: works.iter().map(|w| w.curve.clone()).collect(), drift_threshold: p.drift_threshold };
    let mut charts = vec![Chart {
        file: "loss.png".into(),
        kind: "loss",
        run: None,
        width: report::LOSS_SIZE.0,
        height: report::LOSS_SIZE.1,
        title: "Training loss".into(),
        caption: if base.is_some() {
            "Loss of every run (colours) over the baseline (black), with spike peaks (triangles), drift onset (dashed line) and the first non-finite loss (cross); below, the relative gap to the baseline in percent, raw (thin) and smoothed as the drift detector sees it (thick; it holds through a spike), with the ± drift threshold.".into()
        } else {
            "Loss of every run, with spike peaks (triangles) and the first non-finite loss (cross). No baseline: no gap panel.".into()
        },
    }];
    if !any_loss {
        charts.clear();
    }
    let jobs: Vec<&Job> = works.iter().flat_map(|w| w.jobs.iter()).collect();
    charts.extend(jobs.iter().map(|j| j.chart().clone()));

    // Draw every chart in parallel: each is its own file.
    let results: Vec<Result<(), (String, DrawError)>> = std::iter::once(None)
        .filter(|_| any_loss)
        .chain(jobs.iter().map(|j| Some(*j)))
        .collect::<Vec<_>>()
        .into_par_iter()
        .map(|j| match j {
            None => loss::draw(&out.join("loss.png"), &loss_chart).map_err(|e| ("loss.png".to_string(), e)),
            Some(j) => j.draw(out).map_err(|e| (j.chart().file.clone(), e)),
        })
        .collect();
    for r in results {
        if let Err((file, e)) = r {
            return Err(AnalyzeError::Output { path: out.join(file), message: e.to_string() });
        }
    }

    let mut warnings: Vec<String> = works.iter().flat_map(|w| w.findings.anomalies.iter().flat_map(|a| a.warnings.clone())).collect();
    warnings.dedup();
    let mut report = Report {
        out: out.display().to_string(),
        index: out.join("index.html").display().to_string(),
        baseline: base.map(|b| b.name.clone()),
        threshold,
        runs: works.into_iter().map(|w| w.findings).collect(),
        charts,
        not_drawn,
        warnings,
        seconds: 0.0,
    };
    report.seconds = t0.elapsed().as_secs_f64();
    let html = report::html::page(&report);
    output::write_file(&out.join("index.html"), &html)?;
    output::write_file(&out.join("report.json"), &output::json_text(&report))?;
    Ok(report)
}
