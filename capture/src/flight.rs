//! The flight recorder (`--flight-recorder K`): the dumped sites' operands and shadow GEMMs at the
//! step where something goes wrong and the K steps after it, so that `locate` can score the GEMMs at
//! the anomaly step itself, which fixed dump steps miss (a one-step spike falls between them). A
//! clean run writes no dumps, and its steps cost what steps without a recorder cost but for one
//! early look at their reports.
//!
//! Each step's loss and reports are checked by the triggers before the optimizer runs
//! (`train.rs`); a step that fires is launched again with the dumps and shadow GEMMs, on the same
//! weights and batch, as the anomaly replay launches one again with every statistic (`replay.rs`),
//! so training is unchanged. The next K steps are then dumped as they come (what follows the
//! trigger: a spike whose saturation starts a step after its batch), and the recorder does not fire
//! again before they pass, so that one anomaly is written once. The steps before the firing are
//! not kept: keeping them would mean dumping every step (on the GPU, operands downloaded and shadow
//! GEMMs run at every step, which left the device a few percent busy at the `seed` preset). Each
//! firing adds a `flight_recorder` event saying why.
//!
//! Triggers, in this order:
//! - **non-finite**: an operand or a GEMM result holds NaN/Inf, or the loss is not finite;
//! - **saturation burst**: an FP8 operand cast saturates at least [`SATURATION_BURST`] of its
//!   values (past delayed scaling's warm-up: a cast whose scale came from a real amax);
//! - **loss spike**: the loss exceeds median + [`SPIKE_K`]·σ of the trailing [`SPIKE_WINDOW`]
//!   losses, σ = max(1.4826·MAD, 1e-4·|median|), with at least [`MIN_SPIKE_HISTORY`] of them:
//!   `fp8-analyze anomalies`' spike rule with its defaults, online.

use crate::backend::GemmReport;
use std::collections::VecDeque;

/// Share of an FP8 cast's values that, saturated, fires the recorder.
pub const SATURATION_BURST: f64 = 0.01;
/// The spike rule's k, window and least history (the analyzer's defaults).
pub const SPIKE_K: f64 = 6.0;
pub const SPIKE_WINDOW: usize = 50;
pub const MIN_SPIKE_HISTORY: usize = 8;

/// The trailing losses and the online spike rule over them.
#[derive(Default)]
pub struct LossWatch {
    losses: VecDeque<f64>,
}

impl LossWatch {
    /// Why `loss` is anomalous against the losses seen so far (a spike, or not finite), then keeps
    /// it in the window.
    pub fn observe(&mut self, loss: f64) -> Option<String> {
        let why = if loss.is_finite() { self.spike(loss) } else { Some(format!("non-finite loss ({loss})")) };
        self.losses.push_back(loss);
        while self.losses.len() > SPIKE_WINDOW {
            self.losses.pop_front();
        }
        why
    }

    fn spike(&self, loss: f64) -> Option<String> {
        let w: Vec<f64> = self.losses.iter().copied().filter(|x| x.is_finite()).collect();
        if w.len() < MIN_SPIKE_HISTORY {
            return None;
        }
        let (median, sigma) = robust_band(&w);
        let limit = median + SPIKE_K * sigma;
        (loss > limit).then(|| format!("loss spike: {loss:.4} over median {median:.4} + {SPIKE_K}·σ ({sigma:.2e}) of the last {} steps", w.len()))
    }
}

/// When the recorder fired last, whether it may fire again, and the trailing losses.
pub struct FlightRecorder {
    k: u32,
    losses: LossWatch,
    /// Steps before this one are written as they come (the K steps after a firing).
    writing_until: u32,
    /// False from a firing until a step on which no trigger holds: an anomaly that lasts (an
    /// operand that saturates every step from a planted overflow on) fires once, not every K + 1
    /// steps, which would dump nearly every step.
    armed: bool,
}

impl FlightRecorder {
    pub fn new(k: u32) -> FlightRecorder {
        FlightRecorder { k: k.max(1), losses: LossWatch::default(), writing_until: 0, armed: true }
    }

    /// Whether `step` follows a firing closely enough to be dumped as it comes.
    pub fn writing(&self, step: u32) -> bool {
        step < self.writing_until
    }

    /// Why the recorder fires at `step` (None: it does not), from the step's loss and reports
    /// before its optimizer runs. Call once per step; a firing opens the K steps after it
    /// ([`Self::writing`]), during which it does not fire again, and it fires again only once a
    /// step has passed on which no trigger held (a non-finite loss, which ends the run, fires
    /// whenever it is not within those K steps).
    pub fn fires(&mut self, step: u32, loss: f64, reports: &[GemmReport]) -> Option<String> {
        let Some(why) = anomaly(&mut self.losses, loss, reports) else {
            self.armed = true;
            return None;
        };
        // A non-finite loss ends the run: it fires even when not re-armed.
        if self.writing(step) || (!self.armed && loss.is_finite()) {
            return None;
        }
        self.writing_until = step + 1 + self.k;
        self.armed = false;
        Some(why)
    }

    /// The steps a firing at `step` writes: itself and the K after it.
    pub fn window(&self, step: u32) -> (u32, u32) {
        (step, step + self.k)
    }
}

/// Median and σ = max(1.4826·MAD, 1e-4·|median|) of `w` (not empty).
fn robust_band(w: &[f64]) -> (f64, f64) {
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
    };
    let m = median(&mut w.to_vec());
    let mad = median(&mut w.iter().map(|x| (x - m).abs()).collect());
    (m, (1.4826 * mad).max(1e-4 * m.abs()))
}

/// Why a step is anomalous, by the recorder's triggers in its order (a non-finite value, a
/// saturation burst, a loss spike against `losses`, which keeps the loss): the anomaly replay's
/// trigger (`train.rs`).
pub fn anomaly(losses: &mut LossWatch, loss: f64, reports: &[GemmReport]) -> Option<String> {
    let spike = losses.observe(loss).filter(|_| loss.is_finite());
    nonfinite(loss, reports).or_else(|| saturation(reports)).or(spike)
}

fn nonfinite(loss: f64, reports: &[GemmReport]) -> Option<String> {
    if !loss.is_finite() {
        return Some(format!("non-finite loss ({loss})"));
    }
    let r = reports.iter().find(|r| r.a.nan + r.a.inf + r.b.nan + r.b.inf + r.output_nonfinite > 0)?;
    Some(format!("non-finite values in layers.{}.{}.{}", r.id.layer, r.id.module.as_str(), r.id.gemm.as_str()))
}

fn saturation(reports: &[GemmReport]) -> Option<String> {
    reports.iter().flat_map(|r| [(r, &r.a), (r, &r.b)]).find_map(|(r, c)| {
        let frac = if c.numel > 0 { c.saturated as f64 / c.numel as f64 } else { 0.0 };
        (c.format != "bf16" && c.amax_used > 0.0 && frac >= SATURATION_BURST).then(|| {
            format!(
                "saturation burst: {:.1}% of layers.{}.{}.{}'s {} saturated",
                100.0 * frac,
                r.id.layer,
                r.id.module.as_str(),
                r.id.gemm.as_str(),
                c.role.map(|x| x.as_str()).unwrap_or("operand")
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spike_fires_once_and_opens_the_next_k_steps() {
        let mut f = FlightRecorder::new(3);
        for step in 1..=20u32 {
            let loss = 3.0 - 0.01 * step as f64 + if step % 2 == 0 { 1e-3 } else { 0.0 };
            assert_eq!(f.fires(step, loss, &[]), None, "no spike in a smooth descent at step {step}");
            assert!(!f.writing(step + 1));
        }
        let why = f.fires(21, 4.0, &[]).expect("a jump of 1.2 fires");
        assert!(why.starts_with("loss spike"), "{why}");
        assert_eq!(f.window(21), (21, 24));
        // The next K steps are written as they come, and it does not fire again meanwhile.
        assert!(f.writing(22) && f.writing(24) && !f.writing(25));
        assert_eq!(f.fires(22, 9.0, &[]), None);
        assert_eq!(f.fires(24, f64::NAN, &[]), None, "a non-finite loss within the window is written as it comes");
        assert!(f.fires(25, f64::NAN, &[]).unwrap().contains("non-finite loss"));
    }

    #[test]
    fn an_anomaly_that_lasts_fires_once_and_the_next_one_after_a_quiet_step() {
        use crate::backend::{CastReport, GemmId};
        use fp8scope_schemas::names::{Gemm, Module};
        let saturated = |frac: f64| {
            let c = CastReport { format: "e4m3", amax_used: 1.0, numel: 1000, saturated: (frac * 1000.0) as u64, ..CastReport::default() };
            vec![GemmReport {
                id: GemmId { layer: 0, module: Module::Fc1, gemm: Gemm::Fprop },
                a: c.clone(),
                b: CastReport::default(),
                shadow: None,
                output_nonfinite: 0,
            }]
        };
        let mut f = FlightRecorder::new(2);
        let fired: Vec<u32> = (1..=20u32)
            .filter(|&step| {
                // Saturated from step 3 to 12, quiet at 13, saturated again from 14.
                let frac = if (3..=12).contains(&step) || step >= 14 { 0.05 } else { 0.0 };
                f.fires(step, 3.0, &saturated(frac)).is_some()
            })
            .collect();
        assert_eq!(fired, [3, 14]);
    }
}
