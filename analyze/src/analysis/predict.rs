//! What each BF16 routing would recover, predicted from one recorded FP8 run (its shadow GEMMs),
//! before any routed run is recorded.
//!
//! Each GEMM's error at a shadow step is δ = FP8 result − BF16 result on the same inputs. Paired
//! with its dual (`locate`), it has a signed first-order effect ⟨δ, dual⟩ (`shadow.dual_inner`) and
//! a bound ‖δ‖·‖dual‖ (`locate`'s harm). Summed over the scored steps (after delayed scaling's
//! warm-up), each GEMM gets:
//! - its **bound mass** Σ‖δ‖·‖dual‖, the most its error can have moved the loss to first order;
//! - its **harmful signed mass**: Σ⟨δY, dY⟩ for an fprop (> 0 raises the loss), −Σ⟨δ, g⟩ for a
//!   gradient GEMM (> 0: the FP8 gradient lost descent signal along its own direction), clamped
//!   at 0.
//!
//! - its **excess mass**: the bound mass of its error beyond its own floor, Σ‖δ‖·‖dual‖ ·
//!   max(0, 1 − √(e_floor / e)), with e = 1 − cosine of its output at the step and e_floor the 10th
//!   percentile of e over the scored steps. Every FP8 GEMM has an error floor, the rounding of its
//!   operands, that a run beside BF16 carries without a gap; what moves the loss is the error a
//!   fault, a stale scale or a flush adds over it (‖δ‖ grows as √e).
//!
//! The predicted recovery of a set of GEMMs routed to BF16 is its share of the run's mass:
//! Σ_set / Σ_all. A run that went non-finite has unbounded mass, held by the GEMM that went
//! non-finite first and, where its casts turn an overflow into NaN, by every GEMM whose operands
//! came as close to their limit ([`crate::analysis::overflow_risk`]): a set that holds all of them
//! recovers it whole (1), one that leaves any out recovers nothing (0). When more than
//! [`RECIPE_WIDE_SHARE`] of the GEMMs came that close, the scales themselves failed (a run that
//! diverges as its scales leave warm-up): closeness no longer says which GEMM overflows next
//! (measured on `llama-tiny`'s `nan` scenario, where 21 of 24 GEMMs were within 5% and one of the
//! other three overflowed next), so every GEMM holds a share and only the whole set, or the recipe,
//! recovers it.
//!
//! The headline share ([`SetPrediction::recovery`]), the ranking of the GEMMs, the top sets and the
//! recommendation use the excess mass wherever any GEMM has one (the bound where none has): over
//! the scenario and planted-fault library it follows the measured recoveries more closely
//! (`bench/predict_library.py`), and `triage --predict` chooses its suspects by it. The bound and
//! the signed shares are kept beside it. These
//! are first-order: an error whose harm comes through the optimizer's state (a gradient spike that
//! inflates Adam's second moment for many steps) or through the operands of later GEMMs is seen only
//! where it lands, which `bench/predict_library.py` measures against real routed runs.
//!
//! Beside each set: the share of the run's GEMM FLOPs it would run in BF16 (each site's three GEMMs
//! cost 2·N·in·out FLOPs each).

use crate::analysis::locate::{LocateReport, LocatedGemm};
use crate::analysis::overflow_risk::AT_RISK_RATIO;
use fp8scope_schemas::config::ModelDims;
use fp8scope_schemas::names::{Gemm, Module};
use serde::Serialize;

/// Share of the run's mass the recommended set must hold.
pub const RECOMMENDED_SHARE: f64 = 0.9;
/// Share of a non-finite run's GEMMs at their limit past which every GEMM is held at risk (see
/// the module).
pub const RECIPE_WIDE_SHARE: f64 = 0.5;

/// One GEMM's accumulated first-order mass.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GemmMass {
    pub gemm_name: String,
    pub site: String,
    pub gemm: String,
    /// Σ ‖δ‖·‖dual‖ over the scored steps (∞ for the GEMM that went non-finite first).
    pub bound: f64,
    /// The harmful part of Σ ⟨δ, dual⟩ (see the module); None without signed records.
    pub signed: Option<f64>,
    /// The bound mass beyond the GEMM's own error floor (see the module; ∞ for the GEMM that went
    /// non-finite first).
    pub excess: f64,
}

impl GemmMass {
    /// The mass that ranks it: the excess where the run's GEMMs have one ([`by_excess`]).
    pub fn weight(&self, by_excess: bool) -> f64 {
        if by_excess { self.excess } else { self.bound }
    }
}

/// Whether `masses` are weighed by their excess: some GEMM has a finite excess above zero (else
/// every error sits at its floor and the bound decides).
pub fn by_excess(masses: &[GemmMass]) -> bool {
    masses.iter().any(|m| m.excess.is_finite() && m.excess > 0.0)
}

/// The predicted recovery of one set of GEMMs routed to BF16.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SetPrediction {
    pub name: String,
    /// `layers.1.fc2.dgrad`, …
    pub gemms: Vec<String>,
    /// The predicted share of the loss gap it recovers: its share of the excess mass, or of the
    /// bound mass where no GEMM has an excess ([`by_excess`]).
    pub recovery: f64,
    /// Share of the bound mass the set holds.
    pub bound_recovery: f64,
    /// Share of the harmful signed mass (None without signed records).
    pub signed_recovery: Option<f64>,
    /// Share of the excess mass.
    pub excess_recovery: f64,
    /// Share of the run's GEMM FLOPs the set runs in BF16.
    pub bf16_flops_share: f64,
}

/// Everything `predict` found.
#[derive(Clone, Debug, Serialize)]
pub struct Prediction {
    pub run: String,
    /// Every GEMM's masses, heaviest first by `ranked_by`.
    pub masses: Vec<GemmMass>,
    /// "excess" or "bound": the mass that ranks the GEMMs and gives the headline share.
    pub ranked_by: &'static str,
    /// Whether more than [`RECIPE_WIDE_SHARE`] of a non-finite run's GEMMs ran at their limit, so
    /// that every GEMM holds a share of its unbounded mass (see the module).
    pub recipe_wide: bool,
    /// The three kinds, then the top 1, 2 and 3 GEMMs by that mass, then the sets asked for.
    pub sets: Vec<SetPrediction>,
    /// The fewest GEMMs, heaviest first, that hold [`RECOMMENDED_SHARE`] of that mass.
    pub recommended: SetPrediction,
}

/// The harmful part of a GEMM's signed total: an fprop's raises the loss when positive, a gradient
/// GEMM's loses descent when negative.
fn harmful(gemm: &str, signed_total: f64) -> f64 {
    let v = if gemm == Gemm::Fprop.as_str() { signed_total } else { -signed_total };
    v.max(0.0)
}

/// The excess mass of `g` (see the module): its scored steps' harm beyond its error floor.
fn excess_of(g: &LocatedGemm) -> f64 {
    let scored = crate::analysis::locate::scored_steps(&g.errors);
    let mut errs: Vec<f64> = scored.iter().map(|e| e.output_error).filter(|e| e.is_finite() && *e > 0.0).collect();
    if errs.is_empty() {
        return 0.0;
    }
    errs.sort_by(f64::total_cmp);
    let floor = errs[(errs.len() - 1) / 10];
    scored
        .iter()
        .filter(|e| e.output_error.is_finite() && e.output_error > floor)
        .map(|e| e.harm.unwrap_or(0.0) * (1.0 - (floor / e.output_error).sqrt()))
        .sum()
}

/// Whether `g` holds a share of a non-finite run's unbounded mass: it went non-finite first, or the
/// run's casts turn an overflow into NaN and its operands came within [`AT_RISK_RATIO`] of their
/// limit up to that step (routed alone, the others would overflow in their turn).
fn unbounded(g: &LocatedGemm) -> bool {
    g.nonfinite_at.is_some() || g.headroom_ratio.is_some_and(|r| r >= AT_RISK_RATIO)
}

/// How many GEMMs of a run went non-finite first or ran at their limit up to then.
pub fn at_risk_count(loc: &LocateReport) -> usize {
    loc.ranked.iter().filter(|g| unbounded(g)).count()
}

/// Whether more than [`RECIPE_WIDE_SHARE`] of the GEMMs of a run hold unbounded mass (see the module).
pub fn recipe_wide(loc: &LocateReport) -> bool {
    let at_risk = at_risk_count(loc);
    at_risk > 1 && at_risk as f64 > RECIPE_WIDE_SHARE * loc.ranked.len() as f64
}

/// Every GEMM's masses, in `locate`'s order.
pub fn masses(loc: &LocateReport) -> Vec<GemmMass> {
    let wide = recipe_wide(loc);
    loc.ranked.iter().map(|g| mass_of(g, wide)).collect()
}

fn mass_of(g: &LocatedGemm, recipe_wide: bool) -> GemmMass {
    let nonfinite = recipe_wide || unbounded(g);
    let bound = if nonfinite { f64::INFINITY } else { g.harm_total.unwrap_or(0.0) };
    GemmMass {
        gemm_name: g.gemm_name.clone(),
        site: g.site.clone(),
        gemm: g.gemm.clone(),
        bound,
        signed: g.signed_total.map(|s| if nonfinite { f64::INFINITY } else { harmful(&g.gemm, s) }),
        excess: if nonfinite { f64::INFINITY } else { excess_of(g) },
    }
}

/// Share of `total` held by `part`. An infinite total (a non-finite run) is recovered whole by a
/// set that holds every unbounded GEMM, and not at all by one that leaves any out: the run still
/// diverges (`held_all`).
fn share(part: f64, total: f64, held_all: bool) -> f64 {
    if total.is_infinite() {
        if part.is_infinite() && held_all { 1.0 } else { 0.0 }
    } else if total > 0.0 {
        part / total
    } else {
        0.0
    }
}

/// The FLOPs of one GEMM of `site` (`layers.1.fc2`) in `dims`, up to the common factor 2·N.
fn site_flops(dims: &ModelDims, g: &LocatedGemm) -> f64 {
    Module::parse(&g.module).map(|m| dims.site_features(m)).map(|(i, o)| (i * o) as f64).unwrap_or(0.0)
}

/// Predicts the recovery of `gemms` (names as `locate` gives them) routed to BF16.
pub fn predict_set(loc: &LocateReport, dims: &ModelDims, name: &str, gemms: &[String]) -> SetPrediction {
    let masses = masses(loc);
    let total_bound: f64 = masses.iter().map(|m| m.bound).sum();
    let signed_ok = masses.iter().all(|m| m.signed.is_some());
    let total_signed: f64 = masses.iter().filter_map(|m| m.signed).sum();
    let inside = |m: &&GemmMass| gemms.contains(&m.gemm_name);
    let held_all = masses.iter().filter(|m| m.bound.is_infinite()).all(|m| gemms.contains(&m.gemm_name));
    let part_bound: f64 = masses.iter().filter(inside).map(|m| m.bound).sum();
    let part_signed: f64 = masses.iter().filter(inside).filter_map(|m| m.signed).sum();
    let (part_excess, total_excess): (f64, f64) = (masses.iter().filter(inside).map(|m| m.excess).sum(), masses.iter().map(|m| m.excess).sum());
    // Every GEMM of every kind of every layer: 3 kinds × sites, each of its site's FLOPs.
    let all_flops: f64 = 3.0 * (0..dims.layers).flat_map(|_| Module::ALL).map(|m| dims.site_features(m)).map(|(i, o)| (i * o) as f64).sum::<f64>();
    let set_flops: f64 = loc.ranked.iter().filter(|g| gemms.contains(&g.gemm_name)).map(|g| site_flops(dims, g)).sum();
    let bound_recovery = share(part_bound, total_bound, held_all);
    let excess_recovery = share(part_excess, total_excess, held_all);
    SetPrediction {
        name: name.to_string(),
        gemms: gemms.to_vec(),
        recovery: if by_excess(&masses) { excess_recovery } else { bound_recovery },
        bound_recovery,
        signed_recovery: signed_ok.then(|| share(part_signed, total_signed, held_all)),
        excess_recovery,
        bf16_flops_share: if all_flops > 0.0 { set_flops / all_flops } else { 0.0 },
    }
}

/// The predictions for the kinds, the top GEMMs and `extra` named sets.
pub fn predict(loc: &LocateReport, dims: &ModelDims, extra: &[(String, Vec<String>)]) -> Prediction {
    let wide = recipe_wide(loc);
    let mut masses: Vec<GemmMass> = loc.ranked.iter().map(|g| mass_of(g, wide)).collect();
    let excess = by_excess(&masses);
    let w = |m: &GemmMass| m.weight(excess);
    masses.sort_by(|a, b| w(b).total_cmp(&w(a)).then(b.bound.total_cmp(&a.bound)).then(a.gemm_name.cmp(&b.gemm_name)));
    let mut sets = Vec::new();
    for k in Gemm::ALL {
        let names: Vec<String> = loc.ranked.iter().filter(|g| g.gemm == k.as_str()).map(|g| g.gemm_name.clone()).collect();
        sets.push(predict_set(loc, dims, &format!("bf16-{}", k.as_str()), &names));
    }
    for n in 1..=3.min(masses.len()) {
        let names: Vec<String> = masses.iter().take(n).map(|m| m.gemm_name.clone()).collect();
        sets.push(predict_set(loc, dims, &format!("top-{n}"), &names));
    }
    for (name, gemms) in extra {
        sets.push(predict_set(loc, dims, name, gemms));
    }
    let total: f64 = masses.iter().map(w).sum();
    // A non-finite run: every unbounded GEMM (`share`; they sort first); else the fewest holding
    // RECOMMENDED_SHARE.
    let mut chosen = Vec::new();
    let mut held = 0.0;
    for m in &masses {
        let enough = if total.is_infinite() { w(m).is_finite() } else { share(held, total, true) >= RECOMMENDED_SHARE };
        if enough || w(m) <= 0.0 {
            break;
        }
        chosen.push(m.gemm_name.clone());
        held += w(m);
    }
    let recommended = predict_set(loc, dims, "recommended", &chosen);
    Prediction { run: loc.run.clone(), masses, ranked_by: if excess { "excess" } else { "bound" }, recipe_wide: wide, sets, recommended }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::locate::StepError;

    fn dims() -> ModelDims {
        serde_json::from_str(r#"{"vocab":512,"channels":64,"ffn":256,"heads":4,"layers":1,"batch":8,"seq":64,"attn_mask":"causal"}"#).unwrap()
    }

    fn gemm(name: &str, module: &str, kind: &str, harm: f64, signed: f64) -> LocatedGemm {
        LocatedGemm {
            gemm_name: name.into(),
            site: name.rsplit_once('.').unwrap().0.into(),
            layer: 0,
            module: module.into(),
            gemm: kind.into(),
            execution_rank: 0,
            score: harm,
            peak_step: 0,
            peak_error: 0.0,
            peak_error_step: 0,
            first_crossed: None,
            warmup_until: None,
            harm_total: Some(harm),
            signed_total: Some(signed),
            nonfinite_at: None,
            headroom_ratio: None,
            inputs: Vec::new(),
            errors: Vec::new(),
            evidence: Vec::new(),
            evidence_at_peak: Vec::new(),
        }
    }

    fn report(ranked: Vec<LocatedGemm>) -> LocateReport {
        LocateReport {
            run: "r".into(),
            baseline: None,
            method: "shadow",
            ranked_by: "harm",
            note: None,
            stats_caveat: None,
            threshold: 0.99,
            first: None,
            ranked,
            warnings: Vec::new(),
        }
    }

    #[test]
    fn a_set_is_predicted_to_recover_its_share_of_the_mass_and_the_recommendation_holds_ninety_percent() {
        let dims = dims();
        let loc = report(vec![
            gemm("layers.0.fc2.dgrad", "fc2", "dgrad", 8.0, -6.0),
            gemm("layers.0.fc1.wgrad", "fc1", "wgrad", 1.5, 1.0),
            gemm("layers.0.qkv.fprop", "qkv", "fprop", 0.5, 2.0),
        ]);
        let p = predict(&loc, &dims, &[]);
        let dgrad = p.sets.iter().find(|s| s.name == "bf16-dgrad").unwrap();
        assert!((dgrad.recovery - 0.8).abs() < 1e-12, "{}", dgrad.recovery);
        // Harmful signed mass: dgrad 6 (descent lost), wgrad 0 (gained), fprop 2 (raised the loss).
        assert!((dgrad.signed_recovery.unwrap() - 0.75).abs() < 1e-12);
        // fc2's FLOPs: 256·64 of (64·192 + 64·64 + 64·256 + 256·64) per kind, one kind of three.
        let site = (256 * 64) as f64;
        let all = 3.0 * (64 * 192 + 64 * 64 + 64 * 256 + 256 * 64) as f64;
        assert!((dgrad.bf16_flops_share - site / all).abs() < 1e-12);
        // 80% is short of 90%: the recommendation takes the second GEMM too (95%).
        assert_eq!(p.recommended.gemms, vec!["layers.0.fc2.dgrad".to_string(), "layers.0.fc1.wgrad".to_string()]);
        assert!((p.recommended.recovery - 0.95).abs() < 1e-12);
    }

    #[test]
    fn the_gemm_that_went_non_finite_first_holds_all_of_it() {
        let dims = dims();
        let mut nan = gemm("layers.0.fc1.fprop", "fc1", "fprop", 0.1, 0.0);
        nan.nonfinite_at = Some(40);
        let loc = report(vec![gemm("layers.0.fc2.dgrad", "fc2", "dgrad", 8.0, -6.0), nan]);
        let p = predict(&loc, &dims, &[]);
        assert_eq!(p.recommended.gemms, vec!["layers.0.fc1.fprop".to_string()]);
        assert_eq!(p.sets.iter().find(|s| s.name == "bf16-dgrad").unwrap().recovery, 0.0);
        assert_eq!(p.sets.iter().find(|s| s.name == "bf16-fprop").unwrap().recovery, 1.0);
    }

    #[test]
    fn a_non_saturating_run_recovers_only_with_every_gemm_that_ran_at_its_limit() {
        let dims = dims();
        let mut first = gemm("layers.0.fc1.fprop", "fc1", "fprop", 0.1, 0.0);
        first.nonfinite_at = Some(40);
        first.headroom_ratio = Some(0.99);
        let mut close = gemm("layers.0.fc2.dgrad", "fc2", "dgrad", 8.0, -6.0);
        close.headroom_ratio = Some(0.97);
        let mut far = gemm("layers.0.qkv.wgrad", "qkv", "wgrad", 3.0, -1.0);
        far.headroom_ratio = Some(0.6);
        let loc = report(vec![first, close, far, gemm("layers.0.proj.fprop", "proj", "fprop", 0.2, 0.1), gemm("layers.0.fc1.wgrad", "fc1", "wgrad", 0.4, 0.2)]);
        let p = predict(&loc, &dims, &[("both".into(), vec!["layers.0.fc1.fprop".into(), "layers.0.fc2.dgrad".into()])]);
        let rec = |n: &str| p.sets.iter().find(|s| s.name == n).unwrap().recovery;
        // The first to go non-finite alone is not enough: fc2's dgrad ran within 3% of its limit.
        assert_eq!(rec("bf16-fprop"), 0.0);
        assert_eq!(rec("bf16-dgrad"), 0.0);
        assert_eq!(rec("both"), 1.0);
        // The recommendation holds both unbounded GEMMs, not the one far from its limit.
        let mut r = p.recommended.gemms.clone();
        r.sort();
        assert_eq!(r, vec!["layers.0.fc1.fprop".to_string(), "layers.0.fc2.dgrad".to_string()]);
        assert_eq!(p.recommended.recovery, 1.0);
        assert!(!p.recipe_wide);
    }

    fn step(step: i64, output_error: f64, harm: f64) -> StepError {
        StepError { step, output_error, input_error: 0.0, added: output_error, harm: Some(harm), signed: None, warmup: false }
    }

    #[test]
    fn when_most_gemms_ran_at_their_limit_every_gemm_holds_a_share_and_only_all_of_them_recover() {
        let dims = dims();
        let mut first = gemm("layers.0.fc1.fprop", "fc1", "fprop", 0.1, 0.0);
        first.nonfinite_at = Some(3);
        let mut near = gemm("layers.0.fc2.dgrad", "fc2", "dgrad", 8.0, -6.0);
        near.headroom_ratio = Some(0.97);
        let mut also = gemm("layers.0.qkv.fprop", "qkv", "fprop", 1.0, 0.5);
        also.headroom_ratio = Some(0.99);
        // 3 of 4 at their limit: the fourth, at 0.83, may overflow next.
        let mut next = gemm("layers.0.proj.wgrad", "proj", "wgrad", 0.3, -0.1);
        next.headroom_ratio = Some(0.83);
        let all: Vec<String> = ["layers.0.fc1.fprop", "layers.0.fc2.dgrad", "layers.0.qkv.fprop", "layers.0.proj.wgrad"].map(String::from).to_vec();
        let p = predict(&report(vec![first, near, also, next]), &dims, &[("at-risk".into(), all[..3].to_vec()), ("all".into(), all.clone())]);
        assert!(p.recipe_wide);
        let rec = |n: &str| p.sets.iter().find(|s| s.name == n).unwrap().recovery;
        assert_eq!((rec("at-risk"), rec("all")), (0.0, 1.0));
        let mut r = p.recommended.gemms.clone();
        r.sort();
        let mut want = all.clone();
        want.sort();
        assert_eq!(r, want);
    }

    #[test]
    fn the_excess_mass_ranks_the_gemms_and_gives_the_headline_share_where_any_gemm_has_one() {
        let dims = dims();
        // The largest bound, its error always at its floor: no excess.
        let mut floor = gemm("layers.0.qkv.dgrad", "qkv", "dgrad", 9.0, 0.0);
        floor.errors = (0..10).map(|i| step(i, 1e-3, 0.9)).collect();
        // A smaller bound whose error grew tenfold over its floor at half its steps.
        let mut fault = gemm("layers.0.fc2.dgrad", "fc2", "dgrad", 3.0, 0.0);
        fault.errors = (0..10).map(|i| if i < 5 { step(i, 1e-3, 0.1) } else { step(i, 1e-1, 0.5) }).collect();
        let p = predict(&report(vec![floor, fault]), &dims, &[]);
        assert_eq!(p.ranked_by, "excess");
        assert_eq!(p.masses[0].gemm_name, "layers.0.fc2.dgrad");
        let top = p.sets.iter().find(|s| s.name == "top-1").unwrap();
        assert_eq!(top.gemms, vec!["layers.0.fc2.dgrad".to_string()]);
        // Every excess is the fault's: its headline share is whole, its bound share a quarter.
        assert!((top.recovery - 1.0).abs() < 1e-12 && (top.bound_recovery - 0.25).abs() < 1e-12, "{top:?}");
        assert_eq!(p.recommended.gemms, vec!["layers.0.fc2.dgrad".to_string()]);
    }
}
