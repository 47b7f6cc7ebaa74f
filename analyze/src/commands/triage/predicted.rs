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
//! The suspects: the leads when there are any (the GEMM whose operand went non-finite first; for a
//! spike, the GEMMs whose casts saturated at its first step), else the fewest GEMMs of the largest
//! first-order mass that hold [`SUSPECT_SHARE`] of it, at most [`MAX_SUSPECTS`].

use super::method::{Triage, classify};
use super::{Culprit, PredictedTest};
use crate::analysis::anomalies::AnomalyReport;
use crate::analysis::locate::LocateReport;
use crate::analysis::predict::{predict, predict_set};
use crate::capture_driver::RunSpec;
use crate::error::AnalyzeError;
use fp8scope_schemas::config::ModelDims;

/// Share of the first-order mass the suspects must hold.
pub const SUSPECT_SHARE: f64 = 0.5;
/// Most GEMMs tested as suspects.
pub const MAX_SUSPECTS: usize = 4;

/// The suspects: the leads, else the fewest top GEMMs by mass that hold [`SUSPECT_SHARE`]; None
/// when more than [`MAX_SUSPECTS`] would be needed or nothing has mass.
pub fn suspects(loc: &LocateReport, dims: &ModelDims, leads: &[String]) -> Option<Vec<String>> {
    if !leads.is_empty() {
        let mut l: Vec<String> = Vec::new();
        for x in leads {
            if !l.contains(x) {
                l.push(x.clone());
            }
        }
        l.truncate(MAX_SUSPECTS);
        return Some(l);
    }
    let p = predict(loc, dims, &[]);
    let names: Vec<String> = p.masses.iter().filter(|m| m.bound > 0.0).map(|m| m.gemm_name.clone()).collect();
    (1..=MAX_SUSPECTS.min(names.len())).map(|k| names[..k].to_vec()).find(|s| predict_set(loc, dims, "s", s).recovery >= SUSPECT_SHARE)
}

fn culprit_of(name: &str) -> Option<Culprit> {
    let rest = name.strip_prefix("layers.")?;
    let mut it = rest.splitn(3, '.');
    let layer = it.next()?.parse().ok()?;
    Some(Culprit { layer, module: it.next()?.to_string(), gemm: it.next()?.to_string() })
}

/// Records the two runs that test `suspects`; returns the test.
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
    let end = |r: &AnomalyReport| r.end_gap.as_ref().and_then(|e| e.gap);
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
    let recovered = match (fp8_gap, cure_gap) {
        (Some(f), Some(c)) if f.abs() > 0.0 => Some(1.0 - c.abs() / f.abs()),
        _ => None,
    };
    let pred = predict_set(loc, dims, "suspects", suspects);
    let cures = cured.first().copied().unwrap_or(false);
    Ok(PredictedTest {
        suspects: culprits,
        predicted_recovery: pred.recovery,
        bf16_flops_share: pred.bf16_flops_share,
        cures,
        reproduced: reproduced.clone(),
        held: cures && reproduced.is_some(),
        recovered,
    })
}

#[cfg(test)]
mod tests {
    use super::culprit_of;

    #[test]
    fn a_gemm_name_reads_back_as_a_culprit() {
        let c = culprit_of("layers.12.fc2.dgrad").unwrap();
        assert_eq!((c.layer, c.module.as_str(), c.gemm.as_str()), (12, "fc2", "dgrad"));
        assert!(culprit_of("lm_head.fprop").is_none());
    }
}
