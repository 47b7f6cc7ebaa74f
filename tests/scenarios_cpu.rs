//! End-to-end checks of `fp8-capture --scenario`: the manifest records the scenario and the recipe
//! it implies, and the `nan` scenario dies where it should and is cured by current scaling.

mod common;

use common::{capture, HEAVY};

fn manifest(dir: &std::path::Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("run.json")).expect("run.json")).expect("manifest JSON")
}

fn train(out: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let out_s = out.display().to_string();
    let mut args = vec!["train", "--preset", "tiny", "--device", "cpu", "--quiet", "--out", out_s.as_str()];
    args.extend_from_slice(extra);
    capture(&args)
}

#[test]
fn the_nan_scenario_diverges_at_step_2_under_delayed_scaling_and_current_scaling_cures_it() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tempdir");
    let delayed = tmp.path().join("delayed");
    let o = train(&delayed, &["--scenario", "nan", "--steps", "6"]);
    assert_eq!(o.status.code(), Some(3), "a diverged run exits 3: {}", String::from_utf8_lossy(&o.stderr));
    let m = manifest(&delayed);
    assert_eq!(m["status"], "diverged");
    assert_eq!(m["steps_completed"], 2, "ordinary amax growth overflows at the first step with a history");
    assert_eq!(m["config"]["scenario"], "nan");
    assert_eq!(m["config"]["recipe"]["overflow"], "nan");
    assert_eq!(m["config"]["recipe"]["margin"], 0);

    let current = tmp.path().join("current");
    let o = train(&current, &["--scenario", "nan", "--steps", "6", "--recipe", "current"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(manifest(&current)["status"], "completed");
}

#[test]
fn a_scenario_sets_recipe_defaults_that_explicit_flags_override() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tempdir");
    let spike = tmp.path().join("spike");
    assert!(train(&spike, &["--scenario", "spike", "--steps", "2"]).status.success());
    let m = manifest(&spike);
    assert_eq!((m["config"]["scenario"].as_str(), m["config"]["recipe"]["amax_history"].as_u64()), (Some("spike"), Some(16)));
    // The loud tokens are reserved: the language's floor counts 4 fewer words.
    let plain = tmp.path().join("plain");
    assert!(train(&plain, &["--steps", "2"]).status.success());
    let (f_spike, f_plain) = (m["data"]["entropy_floor"].as_f64().unwrap(), manifest(&plain)["data"]["entropy_floor"].as_f64().unwrap());
    let expected = ((508.0f64 - 4.0).ln() - (512.0f64 - 4.0).ln()) / 64.0;
    assert!((f_spike - f_plain - expected).abs() < 1e-12, "floor {f_spike} vs {f_plain}");

    let over = tmp.path().join("over");
    assert!(train(&over, &["--scenario", "spike", "--steps", "2", "--amax-history", "64"]).status.success());
    assert_eq!(manifest(&over)["config"]["recipe"]["amax_history"], 64);
    let bad = train(&tmp.path().join("bad"), &["--scenario", "explode"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown scenario 'explode'"));
}
