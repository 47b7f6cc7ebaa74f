//! Early warnings: FP8 failure mechanisms that the quantization error shows before the loss moves,
//! read from the `stats` rows that carry it (`quant_mse`, `quant_bias`: step 1, every
//! `stats_every · quant_error_every` steps, dump steps). [`crate::analysis::mechanisms`] lists them
//! beside saturation and underflow surges.
//!
//! - **quantization bias** (Su et al., arXiv 2506.20752: a systematic multiplicative bias of the
//!   quantized operands, not their noise, is what destabilizes low-precision training): the first
//!   run of at least [`BIAS_STEPS`] measured steps where an FP8 operand's cast shrinks or inflates it
//!   along itself by at least [`BIAS`] (|⟨x, q⟩ / ⟨x, x⟩ − 1|, `stats.quant_bias`). Round-to-nearest
//!   is unbiased up to rounding: the clean `tiny` and `llama-tiny` runs stay within 1.3%.
//! - **gradient below quantization noise** (Chmiel et al., "FP4 All the Way", arXiv 2505.19115:
//!   quantized training stops helping once the gradient norm falls below about √3 times the
//!   quantization noise): the first run of at least [`GRADIENT_NOISE_STEPS`] measured steps where
//!   the ratio R = ‖g‖ / ‖ε‖ stays below [`GRADIENT_NOISE`]. ‖g‖ is the step's gradient norm
//!   (`steps.grad_norm`, before clipping); ‖ε‖ the weight gradients' quantization noise, summed over
//!   the wgrad GEMMs under the independent-rounding model: for dW = dYᵀ·X with cast errors of mean
//!   square σ²_dY and σ²_X, E‖ε‖² = σ²_dY · m · ‖X‖² + σ²_X · k · ‖dY‖² (m output and k input
//!   features; ‖X‖² = numel · (std² + mean²); m and k follow from the numels of dY, X and W). The
//!   warning sits above the paper's √3, where the loss has not reacted yet. Measured with
//!   `--quant-error-every 1`: clean runs stay at R ≥ 29 (`tiny`) and ≥ 23.8 (`llama-tiny`), NVFP4 on
//!   `tiny` at ≥ 10.4; the `drift` scenario measures 2.8 to 6.8 from its first step (its loss
//!   drifts past 1% at step 60), an underflowing wgrad gradient (`kind=underflow` on
//!   `layers.1.fc2` wgrad) 6.0 to 7.6.
//! - **weight oscillation** (TetraJet-v2, Chen et al.: FP4 master weights that settle at rounding
//!   boundaries flip their quantized value back and forth): the first run of at least
//!   [`OSCILLATION_STEPS`] recorded steps where an fprop weight flips at least [`OSCILLATION`] bins
//!   per unit of master-weight change (`stats.flip_ratio`, capture/src/weight_motion.rs; ≈ 1 for
//!   weights moving freely). Clean `tiny` runs measure 1.00 on average and 0.84 to 1.19 at single
//!   steps; a learning rate of 1e-4 reaches 1.7 at single late steps. Steps where under
//!   [`OSCILLATION_MIN_FLIPS`] of the elements flip do not count. No run of the library
//!   oscillates by itself: per-tensor FP8 weights do not, in these runs. The planted case
//!   (`--inject site=S,kind=oscillation`, capture/src/oscillation.rs: the weight parked at its
//!   grid's rounding boundaries, 1/64 of a bin past them on alternate sides) measures about 30
//!   from its step, with no loss anomaly.

use crate::analysis::mechanisms::Mechanism;
use crate::error::AnalyzeError;
use crate::load::{Run, f64s, i64s};
use fp8scope_schemas::layout::Table;
use fp8scope_schemas::tables::col;
use polars::prelude::*;
use std::collections::BTreeMap;

/// |quant_bias| that, sustained, is a biased cast.
pub const BIAS: f64 = 0.05;
/// Consecutive measured steps a bias must last.
pub const BIAS_STEPS: usize = 3;
/// Gradient-to-noise ratio below which the gradient is drowning in quantization noise.
pub const GRADIENT_NOISE: f64 = 8.0;
/// Consecutive measured steps the ratio must stay below [`GRADIENT_NOISE`].
pub const GRADIENT_NOISE_STEPS: usize = 3;
/// Bins flipped per unit of master-weight change that, sustained, is oscillation.
pub const OSCILLATION: f64 = 1.5;
/// Consecutive recorded steps the flip ratio must stay at or above [`OSCILLATION`].
pub const OSCILLATION_STEPS: usize = 10;
/// Share of a weight's elements that must flip at a step for its ratio to count: a weight whose
/// updates have all but stopped (a gradient that underflows to zero) flips a handful of elements,
/// whose ratio is noise (up to 19 at single steps in the library's wgrad-underflow cases).
pub const OSCILLATION_MIN_FLIPS: f64 = 0.01;
/// The ratio below which, by Chmiel et al., quantized training stops helping (reported beside).
pub const PAPER_THRESHOLD: f64 = 1.732_050_807_568_877_2;

/// The first run of at least `len` consecutive entries of `series` (step, value) that satisfy
/// `hit`: (first step, entries, the most extreme value by `worse`).
fn first_run(series: &[(i64, f64)], len: usize, hit: impl Fn(f64) -> bool, worse: impl Fn(f64, f64) -> bool) -> Option<(i64, usize, f64)> {
    let mut i = 0;
    while i < series.len() {
        if !hit(series[i].1) {
            i += 1;
            continue;
        }
        let j = (i..series.len()).take_while(|&j| hit(series[j].1)).last().unwrap_or(i);
        if j + 1 - i >= len {
            let peak = series[i..=j].iter().map(|r| r.1).reduce(|a, b| if worse(b, a) { b } else { a }).unwrap_or(series[i].1);
            return Some((series[i].0, j + 1 - i, peak));
        }
        i = j + 1;
    }
    None
}

/// A sustained bias in one operand's series of (step, quant_bias), sorted by step.
fn bias_of_series(series: &[(i64, f64)]) -> Option<(i64, usize, f64)> {
    first_run(series, BIAS_STEPS, |b| b.abs() >= BIAS, |a, b| a.abs() > b.abs())
}

/// A sustained low gradient-to-noise ratio in a series of (step, R), sorted by step.
fn gradient_noise_of_series(series: &[(i64, f64)]) -> Option<(i64, usize, f64)> {
    first_run(series, GRADIENT_NOISE_STEPS, |r| r < GRADIENT_NOISE, |a, b| a < b)
}

/// A sustained oscillation in one weight's series of (step, flip_ratio), sorted by step.
fn oscillation_of_series(series: &[(i64, f64)]) -> Option<(i64, usize, f64)> {
    first_run(series, OSCILLATION_STEPS, |r| r >= OSCILLATION, |a, b| a > b)
}

/// The wgrad quantization noise E‖ε‖² of one site at one step, from its wgrad operands dY and X
/// and its weight W: (numel, mean, std, quant_mse) each.
pub fn wgrad_noise_sq(dy: (f64, f64, f64, f64), x: (f64, f64, f64, f64), w_numel: f64) -> Option<f64> {
    if w_numel <= 0.0 || dy.0 <= 0.0 || x.0 <= 0.0 {
        return None;
    }
    let tokens = (dy.0 * x.0 / w_numel).sqrt();
    let (m, k) = (dy.0 / tokens, x.0 / tokens);
    let sq = |o: (f64, f64, f64, f64)| o.0 * (o.2 * o.2 + o.1 * o.1);
    Some(dy.3 * m * sq(x) + x.3 * k * sq(dy))
}

/// (rank, step, layer, module) of a site at one step.
type Key = (Option<i64>, i64, i64, String);

/// The early warnings of `run`: sustained quantization biases (per operand), a gradient below the
/// quantization noise (per rank) and oscillating weights (per fprop weight).
pub fn find_early_warnings(run: &Run) -> Result<Vec<Mechanism>, AnalyzeError> {
    if !run.has(Table::Stats)? {
        return Ok(Vec::new());
    }
    let cols = [
        col::STEP,
        col::LAYER,
        col::MODULE,
        col::GEMM,
        col::ROLE,
        col::FORMAT,
        col::AMAX_USED,
        col::NUMEL,
        col::MEAN,
        col::STD,
        col::QUANT_MSE,
        col::QUANT_BIAS,
        col::RANK,
    ];
    let lf = run.scan(Table::Stats, &cols)?.filter(col(col::QUANT_MSE).is_not_null());
    let df = run.collect(Table::Stats, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "stats", e);
    let (st, la, mo, ge, ro) = crate::load::operand_keys(&df).map_err(e)?;
    let fm = crate::load::strs(&df, col::FORMAT).map_err(e)?;
    let (au, nu, me, sd) =
        (f64s(&df, col::AMAX_USED).map_err(e)?, i64s(&df, col::NUMEL).map_err(e)?, f64s(&df, col::MEAN).map_err(e)?, f64s(&df, col::STD).map_err(e)?);
    let (qm, qb, rk) = (f64s(&df, col::QUANT_MSE).map_err(e)?, f64s(&df, col::QUANT_BIAS).map_err(e)?, i64s(&df, col::RANK).map_err(e)?);

    let mut biases: BTreeMap<Operand, Vec<(i64, f64)>> = BTreeMap::new();
    // (rank, step, layer, module) → (dY, X, W numel) of the site's wgrad.
    let mut sites: BTreeMap<Key, [Option<(f64, f64, f64, f64)>; 3]> = BTreeMap::new();
    for i in 0..df.height() {
        let (Some(step), Some(layer), Some(module), Some(gemm), Some(role)) = (st[i], la[i], mo[i].clone(), ge[i].clone(), ro[i].clone()) else { continue };
        let fp8 = fm[i].as_deref().is_some_and(|f| f != "bf16") && au[i].is_some_and(|a| a > 0.0);
        if let (true, Some(b)) = (fp8, qb[i]) {
            biases.entry((layer, module.clone(), gemm.clone(), role.clone(), rk[i])).or_default().push((step, b));
        }
        let slot = match (gemm.as_str(), role.as_str()) {
            ("wgrad", "gradient") => 0,
            ("wgrad", "activation") => 1,
            ("fprop", "weight") => 2,
            _ => continue,
        };
        if let (Some(n), Some(mean), Some(std), Some(mse)) = (nu[i], me[i], sd[i], qm[i]) {
            sites.entry((rk[i], step, layer, module)).or_default()[slot] = Some((n as f64, mean, std, mse));
        }
    }

    let mut out = per_operand(run, "quantization bias", biases, bias_of_series);
    let mut noise: BTreeMap<(Option<i64>, i64), f64> = BTreeMap::new();
    for ((rank, step, ..), [dy, x, w]) in sites {
        if let (Some(dy), Some(x), Some(w)) = (dy, x, w)
            && let Some(n2) = wgrad_noise_sq(dy, x, w.0)
        {
            *noise.entry((rank, step)).or_default() += n2;
        }
    }
    let norms = grad_norms(run)?;
    let mut ratios: BTreeMap<Option<i64>, Vec<(i64, f64)>> = BTreeMap::new();
    for ((rank, step), n2) in noise {
        if let Some(&g) = norms.get(&(rank, step)).or_else(|| norms.get(&(None, step)))
            && n2 > 0.0
            && g.is_finite()
        {
            ratios.entry(rank).or_default().push((step, g / n2.sqrt()));
        }
    }
    for (rank, series) in ratios {
        if let Some((step, steps, value)) = gradient_noise_of_series(&series) {
            out.push(Mechanism {
                kind: "gradient below quantization noise",
                gemm_name: "the wgrad GEMMs".into(),
                role: "gradient".into(),
                rank,
                step,
                steps,
                value,
                reference: None,
            });
        }
    }
    out.extend(oscillations(run)?);
    Ok(out)
}

/// Sustained weight oscillations of `run` (`stats.flip_ratio`), one per fprop weight.
fn oscillations(run: &Run) -> Result<Vec<Mechanism>, AnalyzeError> {
    let cols = [col::STEP, col::LAYER, col::MODULE, col::GEMM, col::ROLE, col::FLIP_RATIO, col::FLIP_FRAC, col::RANK];
    let lf = run.scan(Table::Stats, &cols)?.filter(col(col::FLIP_RATIO).is_not_null());
    let df = run.collect(Table::Stats, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "stats", e);
    let (st, la, mo, ge, ro) = crate::load::operand_keys(&df).map_err(e)?;
    let (fr, ff, rk) = (f64s(&df, col::FLIP_RATIO).map_err(e)?, f64s(&df, col::FLIP_FRAC).map_err(e)?, i64s(&df, col::RANK).map_err(e)?);
    let mut by: BTreeMap<Operand, Vec<(i64, f64)>> = BTreeMap::new();
    for i in 0..df.height() {
        let (Some(step), Some(layer), Some(module), Some(gemm), Some(role), Some(r)) = (st[i], la[i], mo[i].clone(), ge[i].clone(), ro[i].clone(), fr[i])
        else {
            continue;
        };
        // A step with too few flips to judge keeps its place in the series but cannot count (NaN
        // compares false), so it ends a run of high ratios.
        let r = if ff[i].is_some_and(|f| f >= OSCILLATION_MIN_FLIPS) { r } else { f64::NAN };
        by.entry((layer, module, gemm, role, rk[i])).or_default().push((step, r));
    }
    Ok(per_operand(run, "weight oscillation", by, oscillation_of_series))
}

/// An operand: (layer, module, gemm, role, rank).
type Operand = (i64, String, String, String, Option<i64>);

/// One mechanism of `kind` for each operand whose series of (step, value), sorted here, `rule`
/// finds a sustained run in.
fn per_operand(run: &Run, kind: &'static str, by: BTreeMap<Operand, Vec<(i64, f64)>>, rule: fn(&[(i64, f64)]) -> Option<(i64, usize, f64)>) -> Vec<Mechanism> {
    let mut out = Vec::new();
    for ((layer, module, gemm, role, rank), mut series) in by {
        series.sort_by_key(|r| r.0);
        if let Some((step, steps, value)) = rule(&series) {
            out.push(Mechanism { kind, gemm_name: run.naming.gemm(layer, &module, &gemm), role, rank, step, steps, value, reference: None });
        }
    }
    out
}

/// The gradient norm of every (rank, step).
fn grad_norms(run: &Run) -> Result<BTreeMap<(Option<i64>, i64), f64>, AnalyzeError> {
    let lf = run.scan(Table::Steps, &[col::STEP, col::GRAD_NORM, col::RANK])?;
    let df = run.collect(Table::Steps, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "steps", e);
    let (st, gn, rk) = (i64s(&df, col::STEP).map_err(e)?, f64s(&df, col::GRAD_NORM).map_err(e)?, i64s(&df, col::RANK).map_err(e)?);
    Ok((0..df.height()).filter_map(|i| Some(((rk[i], st[i]?), gn[i]?))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sustained_bias_is_found_and_rounding_noise_is_not() {
        let quiet: Vec<(i64, f64)> = (1..=30).map(|t| (t * 10, if t % 2 == 0 { 0.012 } else { -0.012 })).collect();
        assert_eq!(bias_of_series(&quiet), None);
        let mut s = quiet.clone();
        s[12].1 = -0.3; // one measured step is not enough
        assert_eq!(bias_of_series(&s), None);
        for r in s.iter_mut().skip(20).take(4) {
            r.1 = -0.08;
        }
        s[22].1 = -0.5;
        assert_eq!(bias_of_series(&s), Some((210, 4, -0.5)));
    }

    #[test]
    fn the_ratio_must_stay_low_for_three_measured_steps() {
        let mut s: Vec<(i64, f64)> = (1..=20).map(|t| (t, 40.0)).collect();
        s[3].1 = 2.0;
        s[4].1 = 2.0;
        assert_eq!(gradient_noise_of_series(&s), None);
        for r in s.iter_mut().skip(10).take(5) {
            r.1 = 6.0;
        }
        s[12].1 = 3.0;
        assert_eq!(gradient_noise_of_series(&s), Some((11, 5, 3.0)));
    }

    #[test]
    fn oscillation_needs_ten_recorded_steps_of_one_and_a_half_bins_per_bin_moved() {
        let mut s: Vec<(i64, f64)> = (1..=60).map(|t| (t, if t % 3 == 0 { 1.19 } else { 0.95 })).collect();
        assert_eq!(oscillation_of_series(&s), None, "a clean run's spread");
        for r in s.iter_mut().skip(20).take(9) {
            r.1 = 3.0;
        }
        assert_eq!(oscillation_of_series(&s), None, "nine steps are not enough");
        for r in s.iter_mut().skip(40).take(12) {
            r.1 = 2.0;
        }
        s[45].1 = 4.5;
        assert_eq!(oscillation_of_series(&s), Some((41, 12, 4.5)));
        // A step with too few flips to judge (NaN) breaks the run.
        s[46].1 = f64::NAN;
        assert_eq!(oscillation_of_series(&s), None);
    }

    #[test]
    fn the_noise_model_matches_a_direct_sum_over_independent_errors() {
        // dW = dYᵀ X with n = 4 tokens, m = 3, k = 2: E‖ε‖² = σ²_dY m ‖X‖² + σ²_X k ‖dY‖².
        let (n, m, k) = (4.0, 3.0, 2.0);
        let x_sq = 10.0; // ‖X‖² with numel n·k = 8: mean² + std² = 1.25
        let dy_sq = 6.0; // ‖dY‖² with numel n·m = 12: 0.5
        let got = wgrad_noise_sq((n * m, 0.5, 0.5, 0.01), (n * k, 1.0, 0.5, 0.04), m * k).unwrap();
        let want = 0.01 * m * x_sq + 0.04 * k * dy_sq;
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
        assert_eq!(wgrad_noise_sq((0.0, 0.0, 0.0, 0.0), (8.0, 1.0, 0.5, 0.04), 6.0), None);
    }
}
