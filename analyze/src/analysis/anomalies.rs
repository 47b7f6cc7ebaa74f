//! The detectors applied to recorded runs: loss spikes, drift from the baseline, and the first
//! non-finite step and tensor, every gap judged against the noise band when replicas measured one.
//! The definitions live in [`crate::analysis::detect`], [`crate::analysis::noise`] and README.md;
//! this file fetches the columns they need (steps: step and loss; stats: the non-finite counts;
//! events: non-finite events).

use crate::analysis::compat;
use crate::analysis::detect::{self, Drift, DriftParams, GapSpike, NonFiniteTensor, Spike, SpikeParams};
use crate::analysis::dynamics::{HorizontalGap, MAX_SHIFT_FRAC, final_loss, horizontal_gap, relative_gap};
use crate::analysis::noise::NoiseBand;
use crate::analysis::params::*;
use crate::analysis::provenance::{lacking, rounding_caveat};
use crate::error::AnalyzeError;
use crate::load::{Run, f64s, i64s, strs};
use fp8scope_schemas::layout::Table;
use fp8scope_schemas::manifest::lacks;
use fp8scope_schemas::tables::col;
use polars::prelude::*;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// Validated detector settings.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct AnomalyParams {
    pub spike_k: f64,
    pub spike_window: usize,
    pub spike_min_gap: f64,
    pub drift_threshold: f64,
    pub drift_alpha: f64,
    pub drift_steps: usize,
    /// A gap counts when it exceeds this many times the noise band.
    pub noise_margin: f64,
}

impl AnomalyParams {
    /// The documented defaults (`report` and `triage` use them).
    pub fn defaults() -> AnomalyParams {
        AnomalyParams {
            spike_k: DEFAULT_SPIKE_K,
            spike_window: DEFAULT_SPIKE_WINDOW,
            spike_min_gap: DEFAULT_SPIKE_MIN_GAP,
            drift_threshold: DEFAULT_DRIFT_THRESHOLD,
            drift_alpha: DEFAULT_DRIFT_ALPHA,
            drift_steps: DEFAULT_DRIFT_STEPS,
            noise_margin: DEFAULT_NOISE_MARGIN,
        }
    }

    /// Checks every value; one line naming the flag when one is out of range.
    pub fn validated(self) -> Result<AnomalyParams, AnalyzeError> {
        let a = self;
        if !(a.spike_k > 0.0 && a.spike_k.is_finite()) {
            return Err(AnalyzeError::usage(format!("--spike-k must be a positive number, got {}", a.spike_k)));
        }
        if a.spike_window < 2 {
            return Err(AnalyzeError::usage(format!("--spike-window must be at least 2, got {}", a.spike_window)));
        }
        if !(a.spike_min_gap >= 0.0 && a.spike_min_gap.is_finite()) {
            return Err(AnalyzeError::usage(format!("--spike-min-gap must be a number ≥ 0, got {}", a.spike_min_gap)));
        }
        if !(a.drift_threshold > 0.0 && a.drift_threshold.is_finite()) {
            return Err(AnalyzeError::usage(format!("--drift-threshold must be positive, got {}", a.drift_threshold)));
        }
        if !(a.drift_alpha > 0.0 && a.drift_alpha <= 1.0) {
            return Err(AnalyzeError::usage(format!("--drift-alpha must be in (0, 1], got {}", a.drift_alpha)));
        }
        if a.drift_steps == 0 {
            return Err(AnalyzeError::usage("--drift-steps must be at least 1"));
        }
        if !(a.noise_margin >= 1.0 && a.noise_margin.is_finite()) {
            return Err(AnalyzeError::usage(format!("--noise-margin must be a number ≥ 1, got {}", a.noise_margin)));
        }
        Ok(a)
    }

    fn drift(&self) -> DriftParams {
        DriftParams { threshold: self.drift_threshold, alpha: self.drift_alpha, steps: self.drift_steps }
    }
}

/// Where the run first went non-finite.
#[derive(Clone, Debug, Default, Serialize)]
pub struct NonFinite {
    /// First step whose loss is NaN or ±∞ (steps table or a `nonfinite_loss` event).
    pub first_loss_step: Option<i64>,
    /// The first tensor, in execution order, among those non-finite at the earliest step any was.
    pub first_tensor: Option<NonFiniteTensor>,
}

impl NonFinite {
    pub fn found(&self) -> bool {
        self.first_loss_step.is_some() || self.first_tensor.is_some()
    }
}

/// The run's gap to the baseline at the end, vertical and horizontal, each beside its band.
#[derive(Clone, Debug, Serialize)]
pub struct EndGap {
    /// Relative gap of the final losses (mean of the last 20 steps).
    pub gap: Option<f64>,
    /// The noise band of that gap (max |final gap| of the replicas), when measured.
    pub band: Option<f64>,
    /// |gap| / band.
    pub ratio: Option<f64>,
    /// How many more steps the run needs to reach the baseline's final loss (negative: fewer).
    pub horizontal: Option<HorizontalGap>,
    /// The band of the horizontal gap (max |horizontal gap| of the replicas, in steps).
    pub horizontal_band: Option<f64>,
    pub horizontal_ratio: Option<f64>,
}

/// Everything `anomalies` found.
#[derive(Clone, Debug, Serialize)]
pub struct AnomalyReport {
    pub run: String,
    pub status: String,
    pub baseline: Option<String>,
    pub params: AnomalyParams,
    /// Steps recorded in the run's steps table.
    pub steps: usize,
    /// Spikes of the run's own loss curve.
    pub spikes: Vec<Spike>,
    /// Spikes against the baseline (empty without one); those within the noise band are marked.
    pub gap_spikes: Vec<GapSpike>,
    /// The significant drift: past the threshold and the noise band's margin, persisting to the
    /// end, and more than a time shift within the spread. None without a baseline or without one.
    pub drift: Option<Drift>,
    /// A streak past the threshold alone that the significant test rejects (within the band, a
    /// time shift within the spread, or closed before the end), when there is one.
    pub drift_rejected: Option<Drift>,
    pub nonfinite: NonFinite,
    /// The gap at the end (None without a baseline).
    pub end_gap: Option<EndGap>,
    /// The noise band the gaps were judged against (None: no replicas).
    pub noise: Option<NoiseBand>,
    /// What the detectors saw that the band or persistence explains, in words: the reason a run is
    /// inconclusive rather than anomalous.
    pub within_noise: Vec<String>,
    pub warnings: Vec<String>,
    /// What could not be looked for because a run lacks it, in words (no loss curve: no spike or
    /// drift).
    pub unavailable: Vec<String>,
    /// The caveat of the statistics the non-finite search read, when their source rounded them.
    pub stats_caveat: Option<String>,
    /// FP8 failure mechanisms in the statistics (saturation, underflow surges, and the early
    /// warnings: quantization bias, gradient below quantization noise), earliest first,
    /// whether or not the loss moved ([`crate::analysis::mechanisms`]).
    pub mechanisms: Vec<crate::analysis::mechanisms::Mechanism>,
}

impl AnomalyReport {
    /// The relative gap of the run's end against the baseline, when there is one.
    pub fn final_gap(&self) -> Option<f64> {
        self.end_gap.as_ref()?.gap
    }

    /// The first step any loss anomaly starts at (non-finite loss, a counted spike, the drift).
    pub fn first_anomaly_step(&self) -> Option<i64> {
        let spike = if self.baseline.is_some() { self.counted_gap_spikes().first().map(|s| s.start) } else { self.spikes.first().map(|s| s.start) };
        [self.nonfinite.first_loss_step, spike, self.drift.as_ref().map(|d| d.first_step)].into_iter().flatten().min()
    }

    /// Whether the run spiked: against the baseline when there is one (a spike the baseline shares
    /// came from the data, not from FP8), else in its own curve. A jump of the gap that never comes
    /// back in band is a step change, not a spike, when the drift detector covers it.
    pub fn spiked(&self) -> bool {
        if self.baseline.is_some() { !self.counted_gap_spikes().is_empty() } else { !self.spikes.is_empty() }
    }

    /// The spikes against the baseline that count (see [`AnomalyReport::spiked`]), not those
    /// within the noise band.
    pub fn counted_gap_spikes(&self) -> Vec<&GapSpike> {
        self.gap_spikes.iter().filter(|s| !s.within_noise && (s.recovery.is_some() || self.drift.is_none())).collect()
    }

    pub fn found(&self) -> bool {
        self.spiked() || self.drift.is_some() || self.nonfinite.found()
    }

    /// Nothing significant, but something the band explains: neither healthy nor anomalous.
    pub fn inconclusive(&self) -> bool {
        !self.found() && !self.within_noise.is_empty()
    }
}

/// The loss curve of a run, sorted by step: (steps, losses).
pub fn loss_curve(run: &Run) -> Result<(Vec<i64>, Vec<f64>), AnalyzeError> {
    let lf = run.scan(Table::Steps, &[col::STEP, col::LOSS])?;
    let df = run.collect(Table::Steps, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "steps", e);
    let steps = i64s(&df, col::STEP).map_err(e)?;
    let loss = f64s(&df, col::LOSS).map_err(e)?;
    let mut pts: Vec<(i64, f64)> = steps.into_iter().zip(loss).filter_map(|(s, l)| Some((s?, l.unwrap_or(f64::NAN)))).collect();
    pts.sort_by_key(|p| p.0);
    Ok(pts.into_iter().unzip())
}

/// Measures the noise band of `replicas` against `base` (checked comparable with it).
pub fn noise_band(base: &Run, replicas: &[Run], p: AnomalyParams) -> Result<NoiseBand, AnalyzeError> {
    let (bs, bl) = loss_curve(base)?;
    let mut curves = Vec::new();
    for r in replicas {
        compat::check_model(r, base)?;
        let (s, l) = loss_curve(r)?;
        curves.push((r.name.clone(), s, l));
    }
    let views: Vec<(String, (&[i64], &[f64]))> = curves.iter().map(|(n, s, l)| (n.clone(), (&s[..], &l[..]))).collect();
    Ok(NoiseBand::measure((&bs, &bl), &views, p.drift_alpha, p.spike_window, p.noise_margin))
}

/// Runs every detector; with `noise`, every gap is judged against its band.
pub fn find_anomalies(run: &Run, base: Option<&Run>, noise: Option<&NoiseBand>, p: AnomalyParams) -> Result<AnomalyReport, AnalyzeError> {
    let (steps, loss) = loss_curve(run)?;
    let mut unavailable = Vec::new();
    let no_base_loss = match base {
        Some(b) => loss_curve(b)?.0.is_empty(),
        None => false,
    };
    if steps.is_empty() {
        unavailable.push(lacking(run, lacks::LOSS, "no spike or drift can be looked for; the non-finite search reads its statistics only"));
    } else if let Some(b) = base.filter(|_| no_base_loss) {
        unavailable.push(lacking(b, lacks::LOSS, "the run's loss cannot be compared with it: no drift or spike against it"));
    }
    let spikes = detect::spikes(&steps, &loss, SpikeParams { k: p.spike_k, window: p.spike_window });
    let mut warnings = Vec::new();
    let mut gap_spikes = Vec::new();
    let mut within_noise = Vec::new();
    let (mut drift, mut drift_rejected, mut end_gap) = (None, None, None);
    if let Some(base) = base.filter(|_| !steps.is_empty() && !no_base_loss) {
        compat::check_model(run, base)?;
        warnings.extend(compat::warnings(run, base));
        let (bsteps, bloss) = loss_curve(base)?;
        let a: BTreeSet<i64> = steps.iter().copied().collect();
        let b: BTreeSet<i64> = bsteps.iter().copied().collect();
        let common = compat::common_steps("recorded", run, &a, base, &b)?;
        let run_at: BTreeMap<i64, f64> = steps.iter().copied().zip(loss.iter().copied()).collect();
        let base_at: BTreeMap<i64, f64> = bsteps.iter().copied().zip(bloss.iter().copied()).collect();
        let cs: Vec<i64> = common.into_iter().collect();
        let r: Vec<f64> = cs.iter().map(|s| run_at[s]).collect();
        let b: Vec<f64> = cs.iter().map(|s| base_at[s]).collect();
        gap_spikes = detect::gap_spikes(&cs, &r, &b, SpikeParams { k: p.spike_k, window: p.spike_window }, p.spike_min_gap);
        if let Some(n) = noise {
            for g in &mut gap_spikes {
                let band = n.raw_at(g.peak);
                g.noise_band = Some(band);
                g.within_noise = !n.beyond(g.peak_gap, band);
                if g.within_noise {
                    within_noise.push(format!(
                        "a jump of the gap to {:+.2}% at step {} is within the noise band ({} × {:.2}%)",
                        100.0 * g.peak_gap,
                        g.peak,
                        n.margin,
                        100.0 * band
                    ));
                }
            }
        }
        let counted: Vec<GapSpike> = gap_spikes.iter().filter(|g| !g.within_noise).cloned().collect();
        let horizontal = horizontal_gap(&cs, &r, &b, p.drift_alpha);
        let gap = relative_gap(final_loss(&r), final_loss(&b));
        end_gap = Some(EndGap {
            gap,
            band: noise.map(|n| n.final_gap),
            ratio: noise.and_then(|n| gap.map(|g| NoiseBand::ratio(g, n.final_gap))),
            horizontal: horizontal.clone(),
            horizontal_band: noise.and_then(|n| n.horizontal_steps),
            horizontal_ratio: noise.and_then(|n| Some(NoiseBand::ratio(horizontal.as_ref()?.steps?, n.horizontal_steps?))),
        });
        let dp = p.drift();
        let bound = |s: i64| noise.map_or(p.drift_threshold, |n| p.drift_threshold.max(n.margin * n.smoothed_at(s)));
        let plain = detect::drift_outside_spikes(&cs, &r, &b, &counted, dp, &|_| p.drift_threshold);
        // Without a band the bound is the threshold: the banded streak is the plain one.
        let banded = if noise.is_some() { detect::drift_outside_spikes(&cs, &r, &b, &counted, dp, &bound) } else { plain.clone() };
        // A significant drift persists to the end and is more than a time shift within the spread.
        // (Only where the replicas' horizontal spread is small: on a plateau it is ill-defined.)
        let time_shift = match (noise, horizontal.as_ref().and_then(|h| Some((h.steps?, h.at_step)))) {
            (Some(n), Some((h, t))) => n.horizontal_steps.filter(|&band| band <= MAX_SHIFT_FRAC * t as f64 && !n.beyond(h, band)),
            _ => None,
        };
        match banded {
            Some(d) if d.persists && time_shift.is_none() => drift = Some(d),
            Some(d) => {
                within_noise.push(if !d.persists {
                    format!(
                        "the gap passed the bound from step {} but closed before the end (smoothed gap {:+.2}% at step {}, bound {:.2}%)",
                        d.first_step,
                        100.0 * d.final_gap,
                        d.final_step,
                        100.0 * d.final_bound
                    )
                } else {
                    let h = horizontal.as_ref().and_then(|h| h.steps).unwrap_or(0.0);
                    format!(
                        "the gap ({:+.2}% at the end) is a time shift of {h:+.1} steps, within the replicas' spread of {:.1} steps (× {})",
                        100.0 * d.final_gap,
                        time_shift.unwrap_or(0.0),
                        noise.map_or(0.0, |n| n.margin)
                    )
                });
                drift_rejected = Some(d);
            }
            None => {
                // Without a band the bound is the threshold itself, so only a band can reject here.
                if let (Some(d), Some(n)) = (plain, noise) {
                    within_noise.push(format!(
                        "the gap passes the {:.1}% threshold from step {} but stays within {} × the noise band ({:+.2}% at the end against a band of {:.2}%)",
                        100.0 * p.drift_threshold,
                        d.first_step,
                        n.margin,
                        100.0 * d.final_gap,
                        100.0 * n.smoothed_at(d.final_step)
                    ));
                    drift_rejected = Some(d);
                }
            }
        }
    }
    let nonfinite = find_nonfinite(run, &steps, &loss)?;
    Ok(AnomalyReport {
        run: run.name.clone(),
        status: run.manifest.status.as_str().to_string(),
        baseline: base.map(|b| b.name.clone()),
        params: p,
        steps: steps.len(),
        spikes,
        gap_spikes,
        drift,
        drift_rejected,
        nonfinite,
        end_gap,
        noise: noise.cloned(),
        within_noise,
        warnings,
        unavailable,
        stats_caveat: run.manifest.stats_decimals().map(rounding_caveat),
        mechanisms: crate::analysis::mechanisms::find_mechanisms(run)?,
    })
}

/// The first non-finite loss step and the first non-finite tensor (stats and events).
pub fn find_nonfinite(run: &Run, steps: &[i64], loss: &[f64]) -> Result<NonFinite, AnalyzeError> {
    let mut first_loss_step = steps.iter().zip(loss).find(|(_, l)| !l.is_finite()).map(|(&s, _)| s);
    let mut candidates = Vec::new();

    // Stats: every operand with a NaN or Inf, at the earliest step any had one. Runs from elsewhere
    // may log no counts: a non-finite min, max, mean, std or amax says the same.
    let counted = (col(col::NAN_COUNT) + col(col::INF_COUNT)).gt(lit(0)).fill_null(lit(false));
    let logged = [col::MIN, col::MAX, col::MEAN, col::STD, col::AMAX]
        .into_iter()
        .map(|c| col(c).is_finite().not().fill_null(lit(false)))
        .fold(lit(false), |a, b| a.or(b));
    let bad = counted.or(logged);
    let lf = run
        .scan(
            Table::Stats,
            &[col::STEP, col::LAYER, col::MODULE, col::GEMM, col::ROLE, col::NAN_COUNT, col::INF_COUNT, col::MIN, col::MAX, col::MEAN, col::STD, col::AMAX],
        )?
        .filter(bad)
        .filter(col(col::STEP).eq(col(col::STEP).min()));
    let df = run.collect(Table::Stats, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "stats", e);
    let (st, la, mo, ge, ro) = crate::load::operand_keys(&df).map_err(e)?;
    let (nan, inf) = (i64s(&df, col::NAN_COUNT).map_err(e)?, i64s(&df, col::INF_COUNT).map_err(e)?);
    for i in 0..df.height() {
        if let (Some(step), Some(layer), Some(module), Some(role)) = (st[i], la[i], mo[i].clone(), ro[i].clone()) {
            candidates.push(NonFiniteTensor::new(&run.naming, step, layer, module, ge[i].clone(), role, "stats", (nan[i], inf[i])));
        }
    }

    // Events: what the capture itself saw.
    let lf = run
        .scan(Table::Events, &[col::STEP, col::KIND, col::LAYER, col::MODULE, col::GEMM, col::ROLE])?
        .filter(col(col::KIND).eq(lit("nonfinite_tensor")).or(col(col::KIND).eq(lit("nonfinite_loss"))));
    let df = run.collect(Table::Events, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "events", e);
    let (st, ki, la, mo, ge, ro) = (
        i64s(&df, col::STEP).map_err(e)?,
        strs(&df, col::KIND).map_err(e)?,
        i64s(&df, col::LAYER).map_err(e)?,
        strs(&df, col::MODULE).map_err(e)?,
        strs(&df, col::GEMM).map_err(e)?,
        strs(&df, col::ROLE).map_err(e)?,
    );
    for i in 0..df.height() {
        let Some(step) = st[i] else { continue };
        if ki[i].as_deref() == Some("nonfinite_loss") {
            first_loss_step = Some(first_loss_step.map_or(step, |s| s.min(step)));
            continue;
        }
        if let (Some(layer), Some(module), Some(role)) = (la[i], mo[i].clone(), ro[i].clone()) {
            candidates.push(NonFiniteTensor::new(&run.naming, step, layer, module, ge[i].clone(), role, "events", (None, None)));
        }
    }
    Ok(NonFinite { first_loss_step, first_tensor: detect::first_nonfinite_tensor(&run.naming, &candidates) })
}
