//! The detectors, as pure functions over loss curves and candidate lists, so that `anomalies`,
//! `report` and `triage` share one definition of each (README.md states them):
//!
//! - **spike**: a step whose loss exceeds `median + k·σ` of the trailing window, σ = 1.4826·MAD;
//! - **spike against a baseline**: the same test on the relative gap (run − baseline) / baseline
//!   of two runs that saw the same batches, with a minimum jump: the batch-to-batch noise that both
//!   runs share cancels, so an FP8-only jump of a few percent stands out, and a spike the baseline
//!   has too (a hard batch) is not one;
//! - **drift**: the EMA of the relative gap (run − baseline) / baseline past a threshold for N
//!   consecutive steps;
//! - **non-finite**: the first step with a non-finite loss, and the first tensor in execution order
//!   that went non-finite at the earliest step any did.

use fp8scope_schemas::names::{Gemm, SiteNaming};
use serde::Serialize;

/// Scale from the median absolute deviation to the standard deviation of a normal distribution.
pub const MAD_TO_SIGMA: f64 = 1.4826;
/// Steps with fewer earlier finite losses than this are not tested for spikes.
pub const MIN_SPIKE_HISTORY: usize = 8;
/// σ never falls below this fraction of the median, so that a flat curve's rounding noise is no
/// spike.
pub const SIGMA_FLOOR_REL: f64 = 1e-4;
/// σ of the relative gap never falls below this (0.1%): two runs that agree to rounding are no
/// spike source.
pub const GAP_SIGMA_FLOOR: f64 = 1e-3;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpikeParams {
    /// Robust standard deviations above the median.
    pub k: f64,
    /// Trailing window length in recorded steps.
    pub window: usize,
}

/// One spike: where it started, peaked and recovered.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Spike {
    /// First step whose loss left the band.
    pub start: i64,
    pub start_loss: f64,
    /// Step of the highest loss before recovery.
    pub peak: i64,
    pub peak_loss: f64,
    /// First step after `start` whose loss is back within the band; None if it never came back.
    pub recovery: Option<i64>,
    /// Median of the trailing window at `start`.
    pub median: f64,
    /// σ = max(1.4826·MAD, 1e-4·|median|) of that window.
    pub sigma: f64,
    /// The band's upper edge, median + k·σ, frozen at `start`.
    pub upper: f64,
    /// (peak_loss − median) / σ.
    pub peak_z: f64,
}

/// The median of a sorted slice (NaN when it is empty).
pub fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        sorted[n / 2]
    } else {
        0.5 * (sorted[n / 2 - 1] + sorted[n / 2])
    }
}

/// Median and σ of a window of finite losses.
/// Median and 1.4826·MAD of a window of finite values.
fn robust_band(window: &[f64]) -> (f64, f64) {
    let mut v = window.to_vec();
    v.sort_by(f64::total_cmp);
    let m = median(&v);
    let mut dev: Vec<f64> = v.iter().map(|x| (x - m).abs()).collect();
    dev.sort_by(f64::total_cmp);
    (m, MAD_TO_SIGMA * median(&dev))
}

/// How an excursion test reads a series.
struct Band {
    k: f64,
    window: usize,
    /// σ's floor given the window's median.
    sigma_floor: fn(f64) -> f64,
    /// The band's upper edge is at least this far above the median.
    min_jump: f64,
}

/// Excursions of a series of finite (step, value) points above a trailing robust band, as
/// [`Spike`]s (whose `*_loss` fields hold the series' values).
///
/// A point is tested when the window of the up to `window` points before it holds at least
/// [`MIN_SPIKE_HISTORY`]; it starts an excursion when its value > median + max(k·σ, min_jump) of
/// that window. The band is then frozen: the peak is the highest value from there until the first
/// later point ≤ the band's upper edge (the recovery). Testing resumes after the recovery.
fn excursions(pts: &[(i64, f64)], b: &Band) -> Vec<Spike> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < pts.len() {
        let lo = i.saturating_sub(b.window);
        if i - lo < MIN_SPIKE_HISTORY.min(b.window) {
            i += 1;
            continue;
        }
        let window: Vec<f64> = pts[lo..i].iter().map(|&(_, l)| l).collect();
        let (m, mad_sigma) = robust_band(&window);
        let sigma = mad_sigma.max((b.sigma_floor)(m));
        let upper = m + (b.k * sigma).max(b.min_jump);
        let (start, start_loss) = pts[i];
        if start_loss <= upper {
            i += 1;
            continue;
        }
        let (mut peak, mut peak_loss) = (start, start_loss);
        let mut j = i + 1;
        let mut recovery = None;
        while j < pts.len() {
            let (s, l) = pts[j];
            if l <= upper {
                recovery = Some(s);
                break;
            }
            if l > peak_loss {
                (peak, peak_loss) = (s, l);
            }
            j += 1;
        }
        out.push(Spike { start, start_loss, peak, peak_loss, recovery, median: m, sigma, upper, peak_z: (peak_loss - m) / sigma });
        i = j + 1;
    }
    out
}

/// Spikes of the curve (`steps` ascending, `loss` aligned): see [`excursions`], with σ at least
/// [`SIGMA_FLOOR_REL`] of the median. Non-finite losses are skipped: they are neither tested nor
/// part of any window.
pub fn spikes(steps: &[i64], loss: &[f64], p: SpikeParams) -> Vec<Spike> {
    let pts: Vec<(i64, f64)> = steps.iter().zip(loss).filter(|(_, l)| l.is_finite()).map(|(&s, &l)| (s, l)).collect();
    excursions(&pts, &Band { k: p.k, window: p.window, sigma_floor: |m| SIGMA_FLOOR_REL * m.abs(), min_jump: 0.0 })
}

/// A spike of the run against its baseline: a jump of the relative gap at steps where both runs
/// saw the same batch.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GapSpike {
    /// First step whose gap left the band.
    pub start: i64,
    /// Step of the largest gap before recovery, with both losses there.
    pub peak: i64,
    pub peak_loss: f64,
    pub peak_base_loss: f64,
    /// (run − baseline) / baseline at the peak.
    pub peak_gap: f64,
    /// First step after `start` whose gap is back within the band; None if it never came back.
    pub recovery: Option<i64>,
    /// Median and σ of the trailing window of gaps at `start`, and the band's upper edge.
    pub median_gap: f64,
    pub sigma: f64,
    pub upper: f64,
    /// (peak_gap − median_gap) / σ.
    pub peak_z: f64,
    /// The noise band of the raw gap at the peak, when replicas measured one.
    pub noise_band: Option<f64>,
    /// Whether the peak gap is within the noise band's margin: such a spike does not count.
    pub within_noise: bool,
}

/// Spikes of the run against its baseline over their common steps (`steps` ascending, `run` and
/// `base` aligned): [`excursions`] of the relative gap (steps where either loss is non-finite or
/// the baseline's is 0 are skipped), σ at least [`GAP_SIGMA_FLOOR`], and a jump of at least
/// `min_gap` above the window's median gap.
pub fn gap_spikes(steps: &[i64], run: &[f64], base: &[f64], p: SpikeParams, min_gap: f64) -> Vec<GapSpike> {
    let gaps: Vec<(i64, f64)> = relative_gaps(steps, run, base).collect();
    excursions(&gaps, &Band { k: p.k, window: p.window, sigma_floor: |_| GAP_SIGMA_FLOOR, min_jump: min_gap })
        .into_iter()
        .map(|x| {
            // The peak is one of `steps` (ascending): both losses there.
            let at = steps.partition_point(|&s| s < x.peak);
            GapSpike {
                start: x.start,
                peak: x.peak,
                peak_loss: run[at],
                peak_base_loss: base[at],
                peak_gap: x.peak_loss,
                recovery: x.recovery,
                median_gap: x.median,
                sigma: x.sigma,
                upper: x.upper,
                peak_z: x.peak_z,
                noise_band: None,
                within_noise: false,
            }
        })
        .collect()
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DriftParams {
    /// |smoothed gap| must exceed this.
    pub threshold: f64,
    /// EMA weight of the newest step.
    pub alpha: f64,
    /// Consecutive steps needed.
    pub steps: usize,
}

/// The first sustained drift from the baseline.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Drift {
    /// First step of the first streak of `steps` consecutive common steps whose smoothed gap
    /// exceeds the threshold with the same sign.
    pub first_step: i64,
    /// The step where the streak reached its required length.
    pub confirmed_step: i64,
    /// `above` (the run's loss is higher: worse) or `below`.
    pub sign: &'static str,
    /// Smoothed gap at `first_step`.
    pub first_gap: f64,
    /// Last common step.
    pub final_step: i64,
    /// Smoothed gap at the last common step (signed).
    pub final_gap: f64,
    /// Raw gap at the last common step (signed).
    pub final_raw_gap: f64,
    /// The bound |e| had to pass at the last common step (the threshold, or the noise band's).
    pub final_bound: f64,
    /// Whether the gap is still past the bound, with the same sign, at the last common step: drift
    /// is what persists; a gap that closed before the end is transient.
    pub persists: bool,
}

/// The smoothed relative gap at each common step where both losses are finite:
/// g = (run − base) / |base|, e₀ = g₀, eₜ = α·gₜ + (1 − α)·eₜ₋₁. Returns (step, raw gap, smoothed).
pub fn smoothed_gap(steps: &[i64], run: &[f64], base: &[f64], alpha: f64) -> Vec<(i64, f64, f64)> {
    let mut e: Option<f64> = None;
    relative_gaps(steps, run, base)
        .map(|(s, g)| {
            let next = ema(e, g, alpha);
            e = Some(next);
            (s, g, next)
        })
        .collect()
}

/// (step, (run − base) / |base|) at each step where both losses are finite and the baseline's is
/// not 0.
fn relative_gaps<'a>(steps: &'a [i64], run: &'a [f64], base: &'a [f64]) -> impl Iterator<Item = (i64, f64)> + 'a {
    steps.iter().zip(run).zip(base).filter(|&((_, r), b)| r.is_finite() && b.is_finite() && *b != 0.0).map(|((&s, &r), &b)| (s, (r - b) / b.abs()))
}

/// One step of the EMA: the first value as it is, then α·g + (1 − α)·previous.
fn ema(prev: Option<f64>, g: f64, alpha: f64) -> f64 {
    prev.map_or(g, |p| alpha * g + (1.0 - alpha) * p)
}

/// The first drift of the run from its baseline over their common steps (see [`smoothed_gap`]),
/// with the threshold as the bound at every step.
pub fn drift(steps: &[i64], run: &[f64], base: &[f64], p: DriftParams) -> Option<Drift> {
    drift_past(steps, run, base, p, &|_| p.threshold)
}

/// The first streak of `p.steps` consecutive common steps whose smoothed gap is past `bound(step)`
/// with one sign (`p.threshold` is not used: put it in the bound).
pub fn drift_past(steps: &[i64], run: &[f64], base: &[f64], p: DriftParams, bound: &dyn Fn(i64) -> f64) -> Option<Drift> {
    let gaps = smoothed_gap(steps, run, base, p.alpha);
    let &(final_step, final_raw_gap, final_gap) = gaps.last()?;
    let mut streak_start: Option<usize> = None;
    for (i, &(s, _, e)) in gaps.iter().enumerate() {
        let past = e.abs() > bound(s);
        let same_sign = streak_start.is_some_and(|s| gaps[s].2.signum() == e.signum());
        streak_start = match (past, same_sign) {
            (false, _) => None,
            (true, true) => streak_start,
            (true, false) => Some(i),
        };
        if let Some(s) = streak_start
            && i + 1 - s >= p.steps.max(1)
        {
            let (first_step, _, first_gap) = gaps[s];
            let final_bound = bound(final_step);
            return Some(Drift {
                first_step,
                confirmed_step: gaps[i].0,
                sign: if first_gap > 0.0 { "above" } else { "below" },
                first_gap,
                final_step,
                final_gap,
                final_raw_gap,
                final_bound,
                persists: final_gap.abs() > final_bound && final_gap.signum() == first_gap.signum(),
            });
        }
    }
    None
}

/// [`drift`] without the steps of the spikes against the baseline that came back in band (start
/// to recovery): drift is a sustained gap, and a spike's tail in the EMA is not one.
pub fn drift_outside_spikes(steps: &[i64], run: &[f64], base: &[f64], spikes: &[GapSpike], p: DriftParams, bound: &dyn Fn(i64) -> f64) -> Option<Drift> {
    let keep: Vec<usize> = (0..steps.len()).filter(|&i| !in_recovered_spike(spikes, steps[i])).collect();
    let pick = |v: &[f64]| keep.iter().map(|&i| v[i]).collect::<Vec<f64>>();
    let kept_steps: Vec<i64> = keep.iter().map(|&i| steps[i]).collect();
    drift_past(&kept_steps, &pick(run), &pick(base), p, bound)
}

/// Whether `step` lies in a spike against the baseline that came back in band (start to recovery).
pub fn in_recovered_spike(spikes: &[GapSpike], step: i64) -> bool {
    spikes.iter().any(|g| g.recovery.is_some_and(|end| (g.start..end).contains(&step)))
}

/// [`smoothed_gap`] as [`drift_outside_spikes`] sees it: every step's raw gap, and an EMA that
/// holds its value through the steps of a recovered spike.
pub fn smoothed_gap_outside_spikes(steps: &[i64], run: &[f64], base: &[f64], spikes: &[GapSpike], alpha: f64) -> Vec<(i64, f64, f64)> {
    let mut e: Option<f64> = None;
    relative_gaps(steps, run, base)
        .map(|(s, g)| {
            if !in_recovered_spike(spikes, s) {
                e = Some(ema(e, g, alpha));
            }
            (s, g, e.unwrap_or(0.0))
        })
        .collect()
}

/// A tensor seen non-finite at a step, from the stats table or from the capture's events.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NonFiniteTensor {
    pub step: i64,
    pub layer: i64,
    pub module: String,
    pub gemm: Option<String>,
    pub role: String,
    /// `layers.1.fc1.gradient`.
    pub tensor: String,
    /// `stats` or `events`.
    pub source: &'static str,
    pub nan_count: Option<i64>,
    pub inf_count: Option<i64>,
}

impl NonFiniteTensor {
    /// A candidate seen in `source` (`stats` or `events`); the tensor is named as the run names
    /// its sites.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        naming: &SiteNaming,
        step: i64,
        layer: i64,
        module: String,
        gemm: Option<String>,
        role: String,
        source: &'static str,
        counts: (Option<i64>, Option<i64>),
    ) -> NonFiniteTensor {
        NonFiniteTensor { step, layer, tensor: naming.tensor(layer, &module, &role), module, gemm, role, source, nan_count: counts.0, inf_count: counts.1 }
    }
}

fn gemm_rank(g: Option<&str>) -> usize {
    g.and_then(Gemm::parse).map(|g| g as usize).unwrap_or(usize::MAX)
}

/// The first non-finite tensor: earliest step, then execution order (forward roles by layer, then
/// backward roles in reverse layer order), then GEMM (fprop, dgrad, wgrad), stats before events.
pub fn first_nonfinite_tensor(naming: &SiteNaming, candidates: &[NonFiniteTensor]) -> Option<NonFiniteTensor> {
    candidates
        .iter()
        .min_by(|a, b| {
            let key = |t: &NonFiniteTensor| {
                (t.step, naming.rank(t.layer, &t.module, &t.role), gemm_rank(t.gemm.as_deref()), t.source != "stats", t.module.clone(), t.role.clone())
            };
            key(a).cmp(&key(b))
        })
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A noisy decreasing curve (deterministic pseudo-noise of ±1%).
    fn curve(n: usize) -> (Vec<i64>, Vec<f64>) {
        let steps: Vec<i64> = (1..=n as i64).collect();
        let loss = steps.iter().map(|&s| (4.0 + 6.0 * (-(s as f64) / 60.0).exp()) * (1.0 + 0.01 * ((s * 7919) % 13 - 6) as f64 / 6.0)).collect();
        (steps, loss)
    }

    const P: SpikeParams = SpikeParams { k: 6.0, window: 50 };

    #[test]
    fn a_smooth_noisy_curve_has_no_spike() {
        let (s, l) = curve(400);
        assert!(spikes(&s, &l, P).is_empty());
    }

    #[test]
    fn a_planted_spike_is_found_with_start_peak_and_recovery() {
        let (s, mut l) = curve(400);
        // Steps 200..=204 (indices 199..=203) rise to twice the loss, peaking at step 202.
        for (i, f) in [(199, 1.5), (200, 1.8), (201, 2.2), (202, 1.7), (203, 1.3)] {
            l[i] *= f;
        }
        let found = spikes(&s, &l, P);
        assert_eq!(found.len(), 1, "{found:?}");
        let sp = &found[0];
        assert_eq!((sp.start, sp.peak, sp.recovery), (200, 202, Some(205)));
        assert!(sp.peak_z > 6.0);
    }

    #[test]
    fn a_spike_that_never_recovers_has_no_recovery_step() {
        let (s, mut l) = curve(120);
        for x in &mut l[100..] {
            *x *= 3.0;
        }
        let found = spikes(&s, &l, P);
        assert_eq!(found.len(), 1);
        assert_eq!((found[0].start, found[0].recovery), (101, None));
    }

    #[test]
    fn non_finite_losses_are_skipped_by_the_spike_detector() {
        let (s, mut l) = curve(100);
        l[50] = f64::NAN;
        assert!(spikes(&s, &l, P).is_empty());
    }

    #[test]
    fn a_jump_against_the_baseline_is_a_gap_spike_and_a_shared_one_is_not() {
        let (s, base) = curve(300);
        // The run follows the baseline within ±0.2% (deterministic), and both see a hard batch at
        // step 100 (×1.8) whose raw spike the curve detector finds in each.
        let mut run: Vec<f64> = s.iter().zip(&base).map(|(&st, &b)| b * (1.0 + 0.002 * ((st * 31) % 5 - 2) as f64 / 2.0)).collect();
        let mut base = base;
        base[99] *= 1.8;
        run[99] *= 1.8;
        assert_eq!(spikes(&s, &run, P).len(), 1, "the shared hard batch is a raw spike");
        assert!(gap_spikes(&s, &run, &base, P, 0.05).is_empty(), "but not one against the baseline");
        // An FP8-only jump: +12% at step 251, +7% at 252, back within 0.2% at 253.
        run[250] *= 1.12;
        run[251] *= 1.07;
        let found = gap_spikes(&s, &run, &base, P, 0.05);
        assert_eq!(found.len(), 1, "{found:?}");
        let g = &found[0];
        assert_eq!((g.start, g.peak, g.recovery), (251, 251, Some(253)), "{g:?}");
        assert!((g.peak_gap - (run[250] / base[250] - 1.0)).abs() < 1e-12 && g.peak_gap > 0.11);
        assert_eq!((g.peak_loss, g.peak_base_loss), (run[250], base[250]));
        // A jump under the minimum gap is not a spike, however many σ it is.
        let mut small = run.clone();
        small[250] = base[250] * 1.03;
        small[251] = base[251];
        assert!(gap_spikes(&s, &small, &base, P, 0.05).is_empty());
        assert_eq!(gap_spikes(&s, &small, &base, P, 0.02).len(), 1);
    }

    #[test]
    fn a_recovered_spike_is_not_drift_but_a_step_change_still_is() {
        let steps: Vec<i64> = (1..=300).collect();
        let base: Vec<f64> = steps.iter().map(|&s| 2.0 + 1.0 / s as f64).collect();
        let mut run: Vec<f64> = base.iter().map(|b| b * 1.002).collect();
        // +30% at step 200, +15% at 201, back to +0.2% at 202: the EMA (α = 0.1) stays past 1% for
        // more than 10 steps, which plain drift reads as drift.
        run[199] = base[199] * 1.3;
        run[200] = base[200] * 1.15;
        let p = DriftParams { threshold: 0.01, alpha: 0.1, steps: 10 };
        assert!(drift(&steps, &run, &base, p).is_some(), "the EMA tail alone looks like drift");
        let spikes = gap_spikes(&steps, &run, &base, P, 0.05);
        assert_eq!((spikes.len(), spikes[0].start, spikes[0].recovery), (1, 200, Some(202)));
        assert_eq!(drift_outside_spikes(&steps, &run, &base, &spikes, p, &|_| 0.01), None, "without the spike's steps there is none");
        let shown = smoothed_gap_outside_spikes(&steps, &run, &base, &spikes, 0.1);
        assert!((shown[199].1 - 0.3).abs() < 1e-12 && shown[199].2 == shown[198].2, "the raw gap is shown, the EMA holds: {:?}", &shown[198..200]);
        assert!(shown.iter().all(|x| x.2.abs() < 0.01), "the EMA the chart draws stays within the threshold");
        // A jump that stays (no recovery) is not left out: it is the drift.
        for x in &mut run[249..] {
            *x *= 1.1;
        }
        let spikes = gap_spikes(&steps, &run, &base, P, 0.05);
        assert_eq!(spikes.last().map(|s| (s.start, s.recovery)), Some((250, None)));
        assert_eq!(drift_outside_spikes(&steps, &run, &base, &spikes, p, &|_| 0.01).map(|d| d.first_step), Some(250));
    }

    #[test]
    fn drift_reports_the_first_step_of_a_sustained_streak() {
        let steps: Vec<i64> = (1..=300).collect();
        let base: Vec<f64> = steps.iter().map(|&s| 3.0 + 1.0 / s as f64).collect();
        let run: Vec<f64> = steps.iter().zip(&base).map(|(&s, &b)| if s >= 120 { b * 1.2 } else { b * 1.001 }).collect();
        let p = DriftParams { threshold: 0.01, alpha: 0.1, steps: 10 };
        let d = drift(&steps, &run, &base, p).expect("drift");
        assert_eq!((d.first_step, d.confirmed_step, d.sign), (120, 129, "above"));
        assert!((d.final_raw_gap - 0.2).abs() < 1e-12);
        assert!((d.final_gap - 0.2).abs() < 1e-6);
        assert!(d.persists);
    }

    #[test]
    fn a_gap_that_closes_before_the_end_does_not_persist_and_a_band_raises_the_bound() {
        let steps: Vec<i64> = (1..=300).collect();
        let base = vec![3.0; 300];
        let run: Vec<f64> = steps.iter().map(|&s| if (100..200).contains(&s) { 3.1 } else { 3.0 }).collect();
        let p = DriftParams { threshold: 0.01, alpha: 0.1, steps: 10 };
        let d = drift(&steps, &run, &base, p).expect("a streak");
        assert_eq!(d.first_step, 103, "the EMA passes 1% on the fourth step of a 3.3% gap");
        assert!(!d.persists, "closed by step 300: {d:?}");
        // A bound of 5% from a noise band hides a 3.3% gap entirely.
        assert_eq!(drift_past(&steps, &run, &base, p, &|_| 0.05), None);
    }

    #[test]
    fn a_short_excursion_is_not_drift() {
        let steps: Vec<i64> = (1..=100).collect();
        let base = vec![3.0; 100];
        let run: Vec<f64> = steps.iter().map(|&s| if (50..53).contains(&s) { 3.3 } else { 3.0 }).collect();
        let p = DriftParams { threshold: 0.01, alpha: 0.5, steps: 10 };
        assert_eq!(drift(&steps, &run, &base, p), None);
    }

    #[test]
    fn the_first_nonfinite_tensor_follows_execution_order() {
        let t = |step, layer, module: &str, gemm: &str, role: &str| NonFiniteTensor {
            step,
            layer,
            module: module.into(),
            gemm: Some(gemm.into()),
            role: role.into(),
            tensor: format!("layers.{layer}.{module}.{role}"),
            source: "stats",
            nan_count: Some(1),
            inf_count: Some(0),
        };
        let c = vec![
            t(31, 0, "qkv", "fprop", "activation"),
            t(30, 0, "fc2", "dgrad", "gradient"),
            t(30, 1, "fc1", "wgrad", "gradient"),
            t(30, 1, "fc1", "dgrad", "gradient"),
            t(30, 1, "proj", "dgrad", "gradient"),
        ];
        let first = first_nonfinite_tensor(&SiteNaming::Capture { n_layers: 2 }, &c).unwrap();
        assert_eq!((first.step, first.tensor.as_str(), first.gemm.as_deref()), (30, "layers.1.fc1.gradient", Some("dgrad")));
    }
}
