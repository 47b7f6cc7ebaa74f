//! The noise band: `anomalies` given replicas (further `--baseline` runs) judges every gap against
//! their spread. Planted runs: a baseline with ±5% batch noise, two replicas that drift +3% and
//! −2.5% from it, and FP8 runs +2% (inside twice the band) and +12% (far outside) from step 120.

mod common;

use common::*;
use serde_json::Value;

/// +3% from step 100 on, ramping in over 10 steps.
fn up(s: u32) -> f64 {
    0.03 * ((s as f64 - 90.0) / 10.0).clamp(0.0, 1.0)
}

/// −2.5% from step 100 on.
fn down(s: u32) -> f64 {
    -0.025 * ((s as f64 - 90.0) / 10.0).clamp(0.0, 1.0)
}

#[test]
fn a_gap_within_the_band_is_inconclusive_and_one_far_outside_is_drift() {
    let tmp = tempfile::tempdir().unwrap();
    let base = bf16(tmp.path());
    let (a, b) = (replica(tmp.path(), "rep-a", up), replica(tmp.path(), "rep-b", down));
    let mild = gapped(tmp.path(), "mild", 0.02);
    let strong = gapped(tmp.path(), "strong", 0.12);

    // One baseline: the 2% gap passes the 1% threshold, so it is drift.
    let out = analyze(&["anomalies", &p(&mild), "--baseline", &p(&base), "--json"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    // (the EMA, α = 0.1, passes 1% on the seventh step of a 2% gap)
    assert_eq!(out.json()["drift"]["first_step"], DRIFT_STEP + 6);
    assert_eq!(out.json()["noise"], Value::Null);

    // With the replicas the same gap is inside 2 × the band (3%): inconclusive, exit 0.
    let out = analyze(&["anomalies", &p(&mild), "--baseline", &p(&base), "--baseline", &p(&a), "--baseline", &p(&b), "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let j = out.json();
    assert_eq!(j["drift"], Value::Null);
    assert_eq!(j["drift_rejected"]["first_step"], DRIFT_STEP + 6);
    let why = j["within_noise"].as_array().unwrap();
    assert_eq!(why.len(), 1, "{why:?}");
    assert!(why[0].as_str().unwrap().contains("within 2 × the noise band"), "{why:?}");
    let band = j["noise"]["final_gap"].as_f64().unwrap();
    assert!((band - 0.03).abs() < 0.002, "the band is the largest replica's final gap: {band}");
    let end = &j["end_gap"];
    assert!((end["gap"].as_f64().unwrap() - 0.02).abs() < 0.002 && (end["ratio"].as_f64().unwrap() - 0.02 / band).abs() < 0.01, "{end}");
    assert!(end["horizontal"]["steps"].as_f64().is_some(), "the horizontal gap is reported: {end}");

    // 12% is 4× the band: drift, and its size relative to the band is reported.
    let out = analyze(&["anomalies", &p(&strong), "--baseline", &p(&base), "--baseline", &p(&a), "--baseline", &p(&b), "--json"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    let j = out.json();
    // The bound is now 2 × the band (6%): the EMA of a 12% gap passes it on the seventh step.
    assert_eq!(j["drift"]["first_step"], DRIFT_STEP + 6);
    assert!(j["drift"]["persists"].as_bool().unwrap());
    assert!(j["end_gap"]["ratio"].as_f64().unwrap() > 3.5);
    assert!(j["within_noise"].as_array().unwrap().is_empty());

    // A margin of 5 bands makes even 12% inconclusive; a margin under 1 is refused in one line.
    let out = analyze(&["anomalies", &p(&strong), "--baseline", &p(&base), "--baseline", &p(&a), "--baseline", &p(&b), "--noise-margin", "5", "--json"]);
    assert_eq!((out.code, out.json()["drift"].clone()), (0, Value::Null));
    let out = analyze(&["anomalies", &p(&strong), "--baseline", &p(&base), "--baseline", &p(&a), "--noise-margin", "0.5"]);
    out.assert_one_line_error(2, &["--noise-margin"]);

    // The text says so in words.
    let out = analyze(&["anomalies", &p(&mild), "--baseline", &p(&base), "--baseline", &p(&a), "--baseline", &p(&b)]);
    assert!(out.stdout.contains("noise band: 2 replica(s)") && out.stdout.contains("inconclusive"), "{}", out.stdout);
    assert!(out.stdout.contains("× band") && out.stdout.contains("to reach the same loss"), "{}", out.stdout);
}
