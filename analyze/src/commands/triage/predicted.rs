//! `triage --predict`: the suspects come from the FP8 run's own shadow GEMMs
//! ([`crate::analysis::predict`]) and two runs test them, instead of sending each kind back to
//! BF16, bisecting and confirming on a second seed (13 to 25 runs):
//! - **cure:** the suspects in BF16, everything else FP8: the anomaly must be gone (judged against
//!   the noise band as every cure is);
//! - **alone:** only the suspects in FP8, everything else BF16 (`fp8-capture --fp8-sites`): the
//!   anomaly must come back (the detectors find it again, or the run ends beyond the band on the
//!   FP8 run's side).
//!
//! Necessary and sufficient together name the suspects as the culprits. When either test fails,
//! triage goes on with the full method, the two runs counted in its total.
//!
//! When several suspects held, one more batch sends each alone to BF16 (one run each, at most
//! [`MAX_SUSPECTS`], side by side): when exactly one of them cures the run by itself, the others
//! stayed in FP8 without the anomaly and are not needed, so the verdict names that one. (When
//! several cure alone, the anomaly needs them together in FP8; when none does, each holds a part:
//! the verdict names them all.) A planted fault's suspects at `seed`'s size held with a second
//! GEMM of large excess beside it, which two runs alone cannot exclude.
//!
//! The suspects, in this order:
//! - for a spike, from the shadow GEMMs of its first two steps (the FP8 run of `--predict` records
//!   with the flight recorder, so they exist): the forward GEMMs whose error raised the loss there
//!   (⟨δY, dY⟩ > 0), the fewest that hold [`SUSPECT_SHARE`] of that rise, when the rise explains at
//!   least [`SPIKE_EXPLAINED`] of the spike's jump over the baseline (a spike that comes from
//!   corrupted gradients, steps after the fault, is not a forward error at its own step);
//! - for a run that went non-finite, every GEMM of unbounded mass (`predict`): the first that went
//!   non-finite and, where the casts turn an overflow into NaN, each that ran at its limit; none
//!   (the full method) when that takes more than [`MAX_SUSPECTS`];
//! - the leads when there are any (the GEMM whose operand went non-finite first; for a spike
//!   without signed records, the GEMMs whose casts saturated at its first step);
//! - else the GEMM kind of the largest first-order excess mass (the bound mass where no GEMM has
//!   an excess), and within it the fewest GEMMs that hold [`SUSPECT_SHARE`] of the kind's mass (a
//!   fault that lives in one kind, as a stale scale's underflow does in the gradients, spreads its
//!   mass over that kind's GEMMs).
//!
//! At most [`MAX_SUSPECTS`] in every case.

use super::method::{Triage, classify};
use super::{Culprit, PredictedTest, RecipeTest, SuspectAlone};
use crate::analysis::anomalies::AnomalyReport;
use crate::analysis::locate::LocateReport;
use crate::analysis::predict::{GemmMass, at_risk_count, by_excess, predict, predict_set, recipe_wide};
use crate::capture_driver::RunSpec;
use crate::error::AnalyzeError;
use crate::load::{Run, f64s, i64s, strs};
use fp8scope_schemas::config::ModelDims;
use fp8scope_schemas::layout::Table;
use fp8scope_schemas::tables::col;
use polars::prelude::*;
use std::collections::BTreeMap;

/// Share of the first-order mass (of their kind), or of a spike's rise, the suspects must hold.
pub const SUSPECT_SHARE: f64 = 0.75;
/// Share of a spike's jump the forward GEMMs' first-order rise must explain to be its suspects.
pub const SPIKE_EXPLAINED: f64 = 0.5;
/// Most GEMMs tested as suspects.
pub const MAX_SUSPECTS: usize = 4;

/// The fewest of `ranked` (name, weight; largest first) holding [`SUSPECT_SHARE`] of `total`;
/// None when more than [`MAX_SUSPECTS`] would be needed.
fn fewest_holding(ranked: &[(String, f64)], total: f64) -> Option<Vec<String>> {
    let mut held = 0.0;
    let mut out = Vec::new();
    for (name, w) in ranked.iter().take(MAX_SUSPECTS) {
        out.push(name.clone());
        held += w;
        if total > 0.0 && held >= SUSPECT_SHARE * total {
            return Some(out);
        }
    }
    None
}

/// The suspects without a spike's signed records: a non-finite run's unbounded GEMMs, else the
/// leads, else the fewest GEMMs of the kind of the largest (excess) mass that hold
/// [`SUSPECT_SHARE`] of it; None when none can be chosen.
pub fn suspects(loc: &LocateReport, dims: &ModelDims, leads: &[String]) -> Option<Vec<String>> {
    let p = predict(loc, dims, &[]);
    let unbounded: Vec<String> = p.masses.iter().filter(|m| m.bound.is_infinite()).map(|m| m.gemm_name.clone()).collect();
    if !unbounded.is_empty() {
        return unbounded_suspects(&unbounded, leads);
    }
    if !leads.is_empty() {
        let mut l = distinct(leads);
        l.truncate(MAX_SUSPECTS);
        return Some(l);
    }
    let ranked = heaviest_kind(&p.masses);
    let total: f64 = ranked.iter().map(|r| r.1).sum();
    fewest_holding(&ranked, total)
}

/// The GEMMs of the kind that holds the most weight, heaviest first, each with its weight: the
/// excess mass (the error beyond each GEMM's own floor, `predict`) where any GEMM has one, else the
/// bound mass. A planted fault's GEMM stands out by its excess: at `seed`'s size the bound of the
/// first layers' gradient GEMMs, whose duals are the largest, outweighed it.
fn heaviest_kind(masses: &[GemmMass]) -> Vec<(String, f64)> {
    let excess = by_excess(masses);
    let weight = |m: &GemmMass| m.weight(excess);
    let mut per_kind: BTreeMap<&str, f64> = BTreeMap::new();
    for m in masses {
        *per_kind.entry(m.gemm.as_str()).or_default() += weight(m);
    }
    let Some((kind, _)) = per_kind.into_iter().max_by(|a, b| a.1.total_cmp(&b.1)) else { return Vec::new() };
    let mut ranked: Vec<(String, f64)> = masses.iter().filter(|m| m.gemm == kind && weight(m) > 0.0).map(|m| (m.gemm_name.clone(), weight(m))).collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked
}

/// The suspects of a run that went non-finite: every GEMM of unbounded mass, the first that went
/// non-finite and, where the casts turn an overflow into NaN, each that ran at its scale's limit
/// (`predict`: a routing that leaves any of them in FP8 still diverges), the leads first. None when
/// more than [`MAX_SUSPECTS`] are needed: no short list can cure the run, and two runs testing the
/// first of them would be spent for nothing (the full method follows).
fn unbounded_suspects(unbounded: &[String], leads: &[String]) -> Option<Vec<String>> {
    let out = distinct(leads.iter().filter(|l| unbounded.contains(l)).chain(unbounded));
    (out.len() <= MAX_SUSPECTS).then_some(out)
}

/// `names` without repeats, in their first order.
fn distinct<'a>(names: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for n in names {
        if !out.contains(n) {
            out.push(n.clone());
        }
    }
    out
}

/// The suspects of a spike starting at `start` whose loss jumped `jump` over the baseline's, from
/// the signed effect of the forward GEMMs in the shadow records of steps `start` and `start + 1`;
/// None without such records, or when their rise explains less than [`SPIKE_EXPLAINED`] of it.
pub fn spike_suspects(run: &Run, start: i64, jump: f64) -> Result<Option<Vec<String>>, AnalyzeError> {
    if !run.has(Table::Shadow)? {
        return Ok(None);
    }
    let lf = run
        .scan(Table::Shadow, &[col::STEP, col::LAYER, col::MODULE, col::GEMM, col::DUAL_INNER])?
        .filter(col(col::STEP).gt_eq(lit(start)).and(col(col::STEP).lt_eq(lit(start + 1))).and(col(col::GEMM).eq(lit("fprop"))));
    let df = run.collect(Table::Shadow, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "shadow", e);
    let (la, mo, inner) = (i64s(&df, col::LAYER).map_err(e)?, strs(&df, col::MODULE).map_err(e)?, f64s(&df, col::DUAL_INNER).map_err(e)?);
    let mut rise: BTreeMap<String, f64> = BTreeMap::new();
    for i in 0..df.height() {
        if let (Some(l), Some(m), Some(v)) = (la[i], mo[i].as_deref(), inner[i])
            && v > 0.0
        {
            *rise.entry(run.naming.gemm(l, m, "fprop")).or_default() += v;
        }
    }
    let mut ranked: Vec<(String, f64)> = rise.into_iter().collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let total: f64 = ranked.iter().map(|r| r.1).sum();
    if !(total >= SPIKE_EXPLAINED * jump.abs()) {
        return Ok(None);
    }
    Ok(fewest_holding(&ranked, total))
}

fn culprit_of(name: &str) -> Option<Culprit> {
    let rest = name.strip_prefix("layers.")?;
    let mut it = rest.splitn(3, '.');
    let layer = it.next()?.parse().ok()?;
    Some(Culprit { layer, module: it.next()?.to_string(), gemm: it.next()?.to_string() })
}

/// Records the two runs that test `suspects` (and, when several held, each alone in BF16); returns
/// the test.
pub(super) fn test(
    t: &mut Triage,
    loc: &LocateReport,
    dims: &ModelDims,
    suspects: &[String],
    fp8: &AnomalyReport,
    anomaly: &str,
    fp8_flags: &dyn Fn(&[String]) -> Vec<String>,
) -> Result<PredictedTest, AnalyzeError> {
    let culprits: Vec<Culprit> = suspects.iter().filter_map(|s| culprit_of(s)).collect();
    let sites: Vec<String> = culprits.iter().map(Culprit::site_flag).collect();
    let specs = vec![
        RunSpec { name: "predicted-cure".into(), flags: fp8_flags(&["--bf16-sites".into(), sites.join(",")]) },
        RunSpec { name: "predicted-alone".into(), flags: fp8_flags(&["--fp8-sites".into(), sites.join(",")]) },
    ];
    let cured = t.batch("predicted", "predicted", &specs)?;
    let alone_rep = t.reports.get("predicted-alone").cloned();
    let end = AnomalyReport::final_gap;
    let fp8_gap = end(fp8);
    // The anomaly comes back with the suspects alone in FP8: the detectors find it again, or the
    // run ends beyond the band on the FP8 run's side.
    let reproduced = alone_rep.as_ref().and_then(|r| {
        classify(r).map(str::to_string).or_else(|| {
            let (g, f, n) = (end(r)?, fp8_gap?, t.noise.as_ref()?);
            (g.signum() == f.signum() && n.beyond(g, n.final_gap) && g.abs() > 0.0).then(|| format!("{anomaly} (a gap beyond the band)"))
        })
    });
    let cure_gap = t.reports.get("predicted-cure").and_then(end);
    let recovered = recovered_share(fp8_gap, cure_gap);
    let pred = predict_set(loc, dims, "suspects", suspects);
    let cures = cured.first().copied().unwrap_or(false);
    let held = cures && reproduced.is_some();
    let each_alone = if held && culprits.len() > 1 { each_alone(t, &culprits, fp8_gap, fp8_flags)? } else { Vec::new() };
    Ok(PredictedTest {
        named: named(&culprits, &each_alone),
        suspects: culprits,
        predicted_recovery: pred.recovery,
        bf16_flops_share: pred.bf16_flops_share,
        cures,
        reproduced: reproduced.clone(),
        held,
        recovered,
        each_alone,
        recipe: None,
    })
}

/// When the FP8 run went non-finite with most of its GEMMs at their scale's limit (`predict`'s
/// `recipe_wide`): no short list of GEMMs can cure it, and the scales failed, so one run tests the
/// recipe instead: the same run with current scaling (`current_flags`), which must end finite and
/// without the anomaly. Returns None where that is not the prediction.
pub(super) fn test_recipe(t: &mut Triage, loc: &LocateReport, current_flags: Vec<String>) -> Result<Option<PredictedTest>, AnalyzeError> {
    if !recipe_wide(loc) {
        return Ok(None);
    }
    let at_risk = at_risk_count(loc);
    let cured = t.batch("predicted", "predicted", &[RunSpec { name: "predicted-current".into(), flags: current_flags }])?;
    let cures = cured.first().copied().unwrap_or(false);
    Ok(Some(PredictedTest {
        suspects: Vec::new(),
        predicted_recovery: 1.0,
        bf16_flops_share: 0.0,
        cures,
        reproduced: None,
        held: cures,
        recovered: None,
        each_alone: Vec::new(),
        named: Vec::new(),
        recipe: Some(RecipeTest { at_risk, gemms: loc.ranked.len(), tried: "current".into() }),
    }))
}

/// The share of `fp8_gap` a run ending at `gap` recovered.
fn recovered_share(fp8_gap: Option<f64>, gap: Option<f64>) -> Option<f64> {
    match (fp8_gap, gap) {
        (Some(f), Some(c)) if f.abs() > 0.0 => Some(1.0 - c.abs() / f.abs()),
        _ => None,
    }
}

/// Each of several held suspects alone in BF16, everything else in FP8: one run each, one batch.
fn each_alone(
    t: &mut Triage,
    culprits: &[Culprit],
    fp8_gap: Option<f64>,
    fp8_flags: &dyn Fn(&[String]) -> Vec<String>,
) -> Result<Vec<SuspectAlone>, AnalyzeError> {
    let name = |c: &Culprit| format!("predicted-only-{}", c.name());
    let specs: Vec<RunSpec> = culprits.iter().map(|c| RunSpec { name: name(c), flags: fp8_flags(&["--bf16-sites".into(), c.site_flag()]) }).collect();
    let cured = t.batch("predicted, each alone", "predicted", &specs)?;
    Ok(culprits
        .iter()
        .zip(cured)
        .map(|(c, cures)| {
            let gap = t.reports.get(&name(c)).and_then(AnomalyReport::final_gap);
            SuspectAlone { culprit: c.clone(), cures, recovered: recovered_share(fp8_gap, gap) }
        })
        .collect())
}

/// The culprits a held test names: the one suspect that cures alone in BF16 when exactly one does,
/// else every suspect.
fn named(suspects: &[Culprit], each_alone: &[SuspectAlone]) -> Vec<Culprit> {
    let curing: Vec<&SuspectAlone> = each_alone.iter().filter(|a| a.cures).collect();
    match curing.as_slice() {
        [one] => vec![one.culprit.clone()],
        _ => suspects.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::{SuspectAlone, culprit_of, fewest_holding, heaviest_kind, named, unbounded_suspects};
    use crate::analysis::predict::GemmMass;

    fn mass(name: &str, bound: f64, excess: f64) -> GemmMass {
        let gemm = name.rsplit('.').next().unwrap().to_string();
        GemmMass { gemm_name: name.into(), site: name.rsplit_once('.').unwrap().0.into(), gemm, bound, signed: None, excess }
    }

    #[test]
    fn the_heaviest_kind_is_weighed_by_the_excess_mass_where_there_is_one() {
        // A planted dgrad overflow in the last layer: the first layers' dgrads have the largest
        // bound (their duals are the largest) but no error beyond their floor.
        let masses = vec![
            mass("layers.0.qkv.dgrad", 9.0, 0.2),
            mass("layers.0.proj.dgrad", 8.0, 0.1),
            mass("layers.11.fc1.dgrad", 3.0, 6.0),
            mass("layers.0.qkv.fprop", 2.0, 0.0),
            mass("layers.3.fc2.wgrad", 5.0, 0.3),
        ];
        let r = heaviest_kind(&masses);
        assert_eq!(r[0], ("layers.11.fc1.dgrad".to_string(), 6.0));
        assert_eq!(fewest_holding(&r, r.iter().map(|x| x.1).sum()), Some(vec!["layers.11.fc1.dgrad".to_string()]));
        // Without any excess (every error at its floor), the bound decides.
        let flat: Vec<GemmMass> = masses.iter().map(|m| GemmMass { excess: 0.0, ..m.clone() }).collect();
        assert_eq!(heaviest_kind(&flat)[0].0, "layers.0.qkv.dgrad");
        assert!(heaviest_kind(&[]).is_empty());
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_non_finite_run_suspects_every_unbounded_gemm_the_lead_first_or_none_past_four() {
        // A planted NaN: its GEMM alone is unbounded, and the lead.
        assert_eq!(unbounded_suspects(&names(&["layers.1.qkv.fprop"]), &names(&["layers.1.qkv.fprop"])), Some(names(&["layers.1.qkv.fprop"])));
        // Casts that turn an overflow into NaN: the GEMMs at their limit join the lead, which comes first.
        let at_risk = names(&["layers.0.fc1.fprop", "layers.1.fc2.dgrad", "layers.0.qkv.fprop"]);
        assert_eq!(
            unbounded_suspects(&at_risk, &names(&["layers.1.fc2.dgrad"])),
            Some(names(&["layers.1.fc2.dgrad", "layers.0.fc1.fprop", "layers.0.qkv.fprop"]))
        );
        // A lead given twice, apart, is suspected once.
        assert_eq!(
            unbounded_suspects(&at_risk, &names(&["layers.1.fc2.dgrad", "layers.0.qkv.fprop", "layers.1.fc2.dgrad"])),
            Some(names(&["layers.1.fc2.dgrad", "layers.0.qkv.fprop", "layers.0.fc1.fprop"]))
        );
        // The nan scenario: 24 GEMMs at their limit; no short list cures it.
        let all: Vec<String> = (0..24).map(|i| format!("layers.{}.g{}.fprop", i / 12, i)).collect();
        assert_eq!(unbounded_suspects(&all, &all[..1]), None);
    }

    #[test]
    fn a_gemm_name_reads_back_as_a_culprit() {
        let c = culprit_of("layers.12.fc2.dgrad").unwrap();
        assert_eq!((c.layer, c.module.as_str(), c.gemm.as_str()), (12, "fc2", "dgrad"));
        assert!(culprit_of("lm_head.fprop").is_none());
    }

    #[test]
    fn the_suspects_are_the_fewest_that_hold_three_quarters() {
        let r = |v: &[(&str, f64)]| v.iter().map(|(n, w)| (n.to_string(), *w)).collect::<Vec<_>>();
        // The drift scenario's dgrad masses: 38.4 and 12.5 of 65.
        let drift = r(&[("a", 38.4), ("b", 12.5), ("c", 6.9), ("d", 3.4), ("e", 3.8)]);
        assert_eq!(fewest_holding(&drift, 65.0), Some(vec!["a".to_string(), "b".to_string()]));
        assert_eq!(fewest_holding(&r(&[("a", 0.9)]), 1.0), Some(vec!["a".to_string()]));
        // Six equal GEMMs need five: more than four, none.
        assert_eq!(fewest_holding(&r(&[("a", 1.0), ("b", 1.0), ("c", 1.0), ("d", 1.0), ("e", 1.0), ("f", 1.0)]), 6.0), None);
    }

    #[test]
    fn a_held_pair_names_the_one_suspect_that_cures_alone_else_both() {
        let (a, b) = (culprit_of("layers.11.fc1.dgrad").unwrap(), culprit_of("layers.0.qkv.dgrad").unwrap());
        let both = vec![a.clone(), b.clone()];
        let alone = |ca: bool, cb: bool| {
            vec![SuspectAlone { culprit: a.clone(), cures: ca, recovered: None }, SuspectAlone { culprit: b.clone(), cures: cb, recovered: None }]
        };
        assert_eq!(named(&both, &alone(true, false)), vec![a.clone()]);
        assert_eq!(named(&both, &alone(false, true)), vec![b.clone()]);
        // Neither alone: each holds a part. Both alone: they harm only together. Not tried: all.
        assert_eq!(named(&both, &alone(false, false)), both);
        assert_eq!(named(&both, &alone(true, true)), both);
        assert_eq!(named(&both, &[]), both);
    }
}
