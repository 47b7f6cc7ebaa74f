//! The noise band: how far runs that should be equivalent drift apart.
//!
//! A gap between an FP8 run and its BF16 baseline means something only against the gap between
//! two BF16 runs that differ by a perturbation that cannot matter. `fp8-capture --init-jitter`
//! gives such runs (*replicas*): the same seed, data and recipe, every initial weight multiplied
//! by 1 ± 2⁻⁹, the rounding a BF16 GEMM applies to its inputs at every step anyway. On a model in
//! a stable phase the replicas stay within a fraction of a percent of the baseline; where training
//! is chaotic (a plateau whose exit any perturbation moves by a few steps) they spread by several
//! percent, and so would any FP8 run, faulty or not.
//!
//! From K replicas the band is, per step t, the largest gap of any replica to the baseline over a
//! trailing window of W recorded steps (W = the spike window):
//!
//! - `smoothed(t)` = max over replicas and s ∈ (t − W, t] of |e_k(s)|, e_k the EMA of replica k's
//!   relative gap (the drift detector's smoothing), for drift;
//! - `raw(t)` = the same over the raw relative gaps, for spikes against the baseline;
//! - `final_gap` = max over replicas of |final gap| (the mean of the last 20 losses, as triage's
//!   run table reports gaps), and `horizontal` = max over replicas of |horizontal gap| in steps.
//!
//! A gap is significant when it exceeds `margin` × the band (default 2): with K replicas drawn
//! like the FP8 run would be if FP8 did nothing, the chance that the FP8 run alone exceeds all K
//! is 1/(K + 1); exceeding twice the largest of them is what the band's margin asks for.

use crate::analysis::detect;
use crate::analysis::dynamics::{final_loss, horizontal_gap, relative_gap};
use serde::Serialize;
use std::collections::BTreeMap;

/// One replica's gaps to the baseline.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplicaGap {
    pub name: String,
    /// Relative gap of the final losses (mean of the last 20 steps).
    pub final_gap: Option<f64>,
    /// The EMA of the relative gap at the last common step.
    pub final_smoothed_gap: Option<f64>,
    /// Horizontal gap in steps at the last common step.
    pub horizontal_steps: Option<f64>,
    /// Largest |raw relative gap| over the common steps.
    pub max_abs_gap: f64,
}

/// The run-to-run spread of a baseline and its replicas.
#[derive(Clone, Debug, Serialize)]
pub struct NoiseBand {
    pub replicas: Vec<ReplicaGap>,
    /// Trailing window of the per-step envelopes, in recorded steps.
    pub window: usize,
    /// A gap counts when it exceeds this many times the band.
    pub margin: f64,
    /// max |final gap| over the replicas.
    pub final_gap: f64,
    /// max |horizontal gap| over the replicas, in steps (None when none could be measured).
    pub horizontal_steps: Option<f64>,
    /// Per step, the envelope of the smoothed gaps (drift).
    #[serde(skip)]
    smoothed: BTreeMap<i64, f64>,
    /// Per step, the envelope of the raw gaps (spikes).
    #[serde(skip)]
    raw: BTreeMap<i64, f64>,
}

/// A curve: (steps ascending, losses aligned).
pub type Curve<'a> = (&'a [i64], &'a [f64]);

/// The trailing-window maximum of |values| (aligned with `steps`), as a map from step.
fn envelope(per_replica: &[Vec<(i64, f64)>], window: usize) -> BTreeMap<i64, f64> {
    let mut at: BTreeMap<i64, f64> = BTreeMap::new();
    for series in per_replica {
        for (i, &(s, _)) in series.iter().enumerate() {
            let lo = (i + 1).saturating_sub(window.max(1));
            let m = series[lo..=i].iter().map(|x| x.1.abs()).fold(0.0, f64::max);
            let e = at.entry(s).or_insert(0.0);
            *e = e.max(m);
        }
    }
    at
}

impl NoiseBand {
    /// Measures the band of `replicas` (name, curve) against `base`, with the drift detector's
    /// EMA weight `alpha`, a trailing window of `window` recorded steps and the given margin.
    pub fn measure(base: Curve, replicas: &[(String, Curve)], alpha: f64, window: usize, margin: f64) -> NoiseBand {
        let base_at: BTreeMap<i64, f64> = base.0.iter().copied().zip(base.1.iter().copied()).collect();
        let base_final = final_loss(base.1);
        let (mut smoothed, mut raw, mut gaps) = (Vec::new(), Vec::new(), Vec::new());
        for (name, (steps, loss)) in replicas {
            let common: Vec<usize> = (0..steps.len()).filter(|&i| base_at.contains_key(&steps[i])).collect();
            let cs: Vec<i64> = common.iter().map(|&i| steps[i]).collect();
            let r: Vec<f64> = common.iter().map(|&i| loss[i]).collect();
            let b: Vec<f64> = cs.iter().map(|s| base_at[s]).collect();
            let sg = detect::smoothed_gap(&cs, &r, &b, alpha);
            raw.push(sg.iter().map(|&(s, g, _)| (s, g)).collect::<Vec<_>>());
            smoothed.push(sg.iter().map(|&(s, _, e)| (s, e)).collect::<Vec<_>>());
            gaps.push(ReplicaGap {
                name: name.clone(),
                final_gap: relative_gap(final_loss(loss), base_final),
                final_smoothed_gap: sg.last().map(|x| x.2),
                horizontal_steps: horizontal_gap(&cs, &r, &b, alpha).and_then(|h| h.steps),
                max_abs_gap: sg.iter().map(|x| x.1.abs()).fold(0.0, f64::max),
            });
        }
        let final_gap = gaps.iter().filter_map(|g| g.final_gap).map(f64::abs).fold(0.0, f64::max);
        let hs: Vec<f64> = gaps.iter().filter_map(|g| g.horizontal_steps).map(f64::abs).collect();
        NoiseBand {
            window,
            margin,
            final_gap,
            horizontal_steps: (!hs.is_empty()).then(|| hs.iter().copied().fold(0.0, f64::max)),
            smoothed: envelope(&smoothed, window),
            raw: envelope(&raw, window),
            replicas: gaps,
        }
    }

    /// The envelope at `step`: its value at the latest step ≤ `step` the replicas recorded (0 before any).
    fn at(map: &BTreeMap<i64, f64>, step: i64) -> f64 {
        map.range(..=step).next_back().map(|(_, v)| *v).unwrap_or(0.0)
    }

    /// The band of the smoothed relative gap at `step` (drift).
    pub fn smoothed_at(&self, step: i64) -> f64 {
        Self::at(&self.smoothed, step)
    }

    /// The band of the raw relative gap at `step` (spikes).
    pub fn raw_at(&self, step: i64) -> f64 {
        Self::at(&self.raw, step)
    }

    /// How many bands `gap` is (∞ when the band is 0 and the gap is not).
    pub fn ratio(gap: f64, band: f64) -> f64 {
        if band > 0.0 {
            gap.abs() / band
        } else if gap == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    }

    /// Whether a gap of `gap` against a band of `band` is beyond the margin.
    pub fn beyond(&self, gap: f64, band: f64) -> bool {
        gap.abs() > self.margin * band
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_band_is_the_largest_replica_gap_over_the_trailing_window() {
        let steps: Vec<i64> = (1..=100).collect();
        let base = vec![2.0; 100];
        // Replica a: +1% from step 40 to 44, else equal; replica b: −0.5% everywhere.
        let a: Vec<f64> = steps.iter().map(|&s| if (40..45).contains(&s) { 2.02 } else { 2.0 }).collect();
        let b = vec![1.99; 100];
        let reps = vec![("a".to_string(), (&steps[..], &a[..])), ("b".to_string(), (&steps[..], &b[..]))];
        let band = NoiseBand::measure((&steps, &base), &reps, 1.0, 10, 2.0);
        assert!((band.raw_at(30) - 0.005).abs() < 1e-12, "b alone before the bump");
        assert!((band.raw_at(42) - 0.01).abs() < 1e-12, "a's bump");
        assert!((band.raw_at(53) - 0.01).abs() < 1e-12, "still inside the trailing window of 10 (44..53)");
        assert!((band.raw_at(54) - 0.005).abs() < 1e-12, "out of the window");
        assert!((band.final_gap - 0.005).abs() < 1e-12);
        assert_eq!(band.replicas.len(), 2);
        assert!(band.beyond(0.011, 0.005) && !band.beyond(0.009, 0.005));
        assert_eq!(NoiseBand::ratio(0.01, 0.005), 2.0);
        assert_eq!(NoiseBand::ratio(0.01, 0.0), f64::INFINITY);
        assert_eq!(band.raw_at(0), 0.0, "before any step");
    }
}
