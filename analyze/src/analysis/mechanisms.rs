//! FP8 failure mechanisms seen in the statistics, whether or not the loss has moved yet: a cast that
//! saturates, an operand whose underflow surges, and the early warnings of
//! [`crate::analysis::early_warnings`] (a biased cast, a gradient below the quantization noise).
//! `anomalies` lists them beside the loss detectors (and says which came first), and `triage` says
//! "mechanism present, no loss anomaly yet" instead of "healthy" when they fire without a loss
//! anomaly (the `swiglu-outliers` case: fc2's input saturates at step 200, then 46% of it
//! underflows for 16 steps, and the loss never reacts).
//!
//! Read from the `stats` table, FP8 operands only, after delayed scaling's warm-up (a cast whose
//! scale came from a real amax, `amax_used` > 0):
//! - **saturation**: the first step an operand's cast saturates at least [`SATURATION`] of its
//!   values;
//! - **underflow surge**: the first run of at least [`SURGE_STEPS`] recorded steps whose underflow
//!   share exceeds the operand's own reference (the median of its first [`REFERENCE_STEPS`] recorded
//!   steps) by at least [`SURGE`].

use crate::error::AnalyzeError;
use crate::load::{Run, f64s, i64s};
use fp8scope_schemas::layout::Table;
use fp8scope_schemas::tables::col;
use polars::prelude::*;
use serde::Serialize;
use std::collections::BTreeMap;

/// Share of a cast's values that, saturated, is a mechanism.
pub const SATURATION: f64 = 0.01;
/// Rise of the underflow share over the operand's reference that counts as a surge.
pub const SURGE: f64 = 0.2;
/// Consecutive recorded steps a surge must last.
pub const SURGE_STEPS: usize = 4;
/// Recorded steps (after warm-up) whose median is an operand's reference underflow share.
pub const REFERENCE_STEPS: usize = 20;

/// One mechanism, at its first step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Mechanism {
    /// `saturation`, `underflow surge`, or an early warning: `quantization bias`, `gradient below
    /// quantization noise`, `weight oscillation` ([`crate::analysis::early_warnings`]).
    pub kind: &'static str,
    /// `layers.0.fc2.fprop`
    pub gemm_name: String,
    pub role: String,
    pub rank: Option<i64>,
    pub step: i64,
    /// Recorded steps it lasted (1 for a saturation; measured steps for the early warnings).
    pub steps: usize,
    /// The saturated share, the peak underflow share of the surge, the largest bias, the lowest
    /// gradient-to-noise ratio, or the highest flip ratio.
    pub value: f64,
    /// The operand's reference underflow share (surges only).
    pub reference: Option<f64>,
}

impl Mechanism {
    /// "saturation: 94.9% of layers.0.qkv.fprop's activation at step 251".
    pub fn describe(&self) -> String {
        let at = self.rank.map(|r| format!(" on rank {r}")).unwrap_or_default();
        match (self.kind, self.reference) {
            (_, Some(r)) => format!(
                "underflow surge: {}'s {} underflows up to {:.1}% (against {:.1}% before) from step {} for {} recorded steps{at}",
                self.gemm_name,
                self.role,
                100.0 * self.value,
                100.0 * r,
                self.step,
                self.steps
            ),
            ("quantization bias", None) => format!(
                "quantization bias: the cast {} {}'s {} by up to {:.1}% along itself from step {} for {} measured steps{at}",
                if self.value < 0.0 { "shrinks" } else { "inflates" },
                self.gemm_name,
                self.role,
                100.0 * self.value.abs(),
                self.step,
                self.steps
            ),
            ("gradient below quantization noise", None) => format!(
                "gradient below quantization noise: ‖g‖ / ‖wgrad quantization noise‖ down to {:.2} (warning below {}, training stops helping below √3 by arXiv 2505.19115) from step {} for {} measured steps{at}",
                self.value,
                crate::analysis::early_warnings::GRADIENT_NOISE,
                self.step,
                self.steps
            ),
            ("weight oscillation", None) => format!(
                "weight oscillation: {}'s {} flips up to {:.2} bins per bin its master weight moves (warning from {}, ≈ 1 moving freely) from step {} for {} recorded steps{at}",
                self.gemm_name,
                self.role,
                self.value,
                crate::analysis::early_warnings::OSCILLATION,
                self.step,
                self.steps
            ),
            _ => format!("saturation: {:.1}% of {}'s {} at step {}{at}", 100.0 * self.value, self.gemm_name, self.role, self.step),
        }
    }
}

/// The median of unsorted values.
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    crate::analysis::detect::median(&v)
}

/// The mechanisms of one operand's series of (step, underflow, saturated), sorted by step.
fn of_series(series: &[(i64, f64, f64)]) -> Vec<(&'static str, i64, usize, f64, Option<f64>)> {
    let mut out = Vec::new();
    if let Some(&(step, _, sat)) = series.iter().find(|(_, _, s)| *s >= SATURATION) {
        out.push(("saturation", step, 1, sat, None));
    }
    let reference = median(&series.iter().take(REFERENCE_STEPS).map(|r| r.1).collect::<Vec<_>>());
    let mut i = 0;
    while i < series.len() {
        if series[i].1 >= reference + SURGE {
            let j = (i..series.len()).take_while(|&j| series[j].1 >= reference + SURGE).last().unwrap_or(i);
            if j + 1 - i >= SURGE_STEPS {
                let peak = series[i..=j].iter().map(|r| r.1).fold(0.0, f64::max);
                out.push(("underflow surge", series[i].0, j + 1 - i, peak, Some(reference)));
                break;
            }
            i = j + 1;
        } else {
            i += 1;
        }
    }
    out
}

/// Every mechanism of `run`, earliest first.
pub fn find_mechanisms(run: &Run) -> Result<Vec<Mechanism>, AnalyzeError> {
    if !run.has(Table::Stats)? {
        return Ok(Vec::new());
    }
    let cols = [col::STEP, col::LAYER, col::MODULE, col::GEMM, col::ROLE, col::FORMAT, col::AMAX_USED, col::UNDERFLOW_FRAC, col::SATURATED_FRAC, col::RANK];
    let lf = run.scan(Table::Stats, &cols)?.filter(col(col::AMAX_USED).gt(lit(0.0)).and(col(col::FORMAT).neq(lit("bf16"))));
    let df = run.collect(Table::Stats, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "stats", e);
    let (st, la, mo, ge, ro) = crate::load::operand_keys(&df).map_err(e)?;
    let (un, sa, rk) = (f64s(&df, col::UNDERFLOW_FRAC).map_err(e)?, f64s(&df, col::SATURATED_FRAC).map_err(e)?, i64s(&df, col::RANK).map_err(e)?);
    let mut by: BTreeMap<(i64, String, String, String, Option<i64>), Vec<(i64, f64, f64)>> = BTreeMap::new();
    for i in 0..df.height() {
        let (Some(step), Some(layer), Some(module), Some(gemm), Some(role)) = (st[i], la[i], mo[i].clone(), ge[i].clone(), ro[i].clone()) else { continue };
        by.entry((layer, module, gemm, role, rk[i])).or_default().push((step, un[i].unwrap_or(0.0), sa[i].unwrap_or(0.0)));
    }
    let mut out = Vec::new();
    for ((layer, module, gemm, role, rank), mut series) in by {
        series.sort_by_key(|r| r.0);
        for (kind, step, steps, value, reference) in of_series(&series) {
            out.push(Mechanism { kind, gemm_name: run.naming.gemm(layer, &module, &gemm), role: role.clone(), rank, step, steps, value, reference });
        }
    }
    out.extend(crate::analysis::early_warnings::find_early_warnings(run)?);
    // By step, then kind (values of different kinds do not compare), then the largest first.
    let order = |k: &str| ["saturation", "underflow surge", "quantization bias", "gradient below quantization noise"].iter().position(|&o| o == k).unwrap_or(4);
    out.sort_by(|a, b| {
        a.step.cmp(&b.step).then(order(a.kind).cmp(&order(b.kind))).then(b.value.abs().total_cmp(&a.value.abs())).then(a.gemm_name.cmp(&b.gemm_name))
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::of_series;

    #[test]
    fn a_saturation_and_a_surge_are_found_and_a_quiet_series_gives_nothing() {
        let mut s: Vec<(i64, f64, f64)> = (1..=40).map(|t| (t, 0.001, 0.0)).collect();
        assert!(of_series(&s).is_empty(), "a quiet operand");
        s[24].2 = 0.3; // step 25 saturates 30%
        for r in s.iter_mut().skip(25).take(16) {
            r.1 = 0.46;
        }
        let m = of_series(&s);
        assert_eq!(m.len(), 2, "{m:?}");
        assert_eq!((m[0].0, m[0].1), ("saturation", 25));
        assert_eq!((m[1].0, m[1].1, m[1].2), ("underflow surge", 26, 15));
        assert!((m[1].3 - 0.46).abs() < 1e-12 && (m[1].4.unwrap() - 0.001).abs() < 1e-12);
        // A surge of 3 steps is too short; a rise of 15 points too small.
        let mut short: Vec<(i64, f64, f64)> = (1..=40).map(|t| (t, 0.0, 0.0)).collect();
        for r in short.iter_mut().skip(30).take(3) {
            r.1 = 0.9;
        }
        for r in short.iter_mut().skip(5).take(10) {
            r.1 = 0.15;
        }
        assert!(of_series(&short).is_empty());
    }
}
