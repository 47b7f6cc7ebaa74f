//! End to end: `fp8-capture --flight-recorder K` dumps the dumped sites with their shadow GEMMs at
//! the step where something fires (launched again before its optimizer, so training is unchanged)
//! and the K steps after it; `locate` then scores the GEMMs at the anomaly step.

mod common;

use common::{HEAVY, analyze, train_tiny};
use std::path::Path;

fn csv(run: &Path, sql: &str) -> String {
    let o = analyze(&["query", run.to_str().unwrap(), "--format", "csv", "--sql", sql]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).to_string()
}

fn manifest(run: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap()
}

#[test]
fn a_nan_at_step_n_writes_the_dumps_of_step_n_and_a_clean_run_writes_none() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let nan = dir.path().join("nan");
    let out = nan.display().to_string();
    let o = common::capture(&[
        "train",
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--recipe",
        "delayed",
        "--steps",
        "80",
        "--quiet",
        "--flight-recorder",
        "8",
        "--inject",
        "site=layers.1.fc2,gemm=fprop,kind=nan,step=60",
        "--out",
        &out,
    ]);
    assert_eq!(o.status.code(), Some(3), "the run diverges: {}", String::from_utf8_lossy(&o.stderr));
    let steps = csv(&nan, "SELECT DISTINCT step FROM tensors ORDER BY step");
    let got: Vec<u32> = steps.lines().skip(1).map(|l| l.trim().parse().unwrap()).collect();
    // The NaN's own step, launched again with the dumps; the run stops there.
    assert_eq!(got, [60]);
    let shadow = csv(&nan, "SELECT MIN(step) AS a, MAX(step) AS b FROM shadow");
    assert_eq!(shadow.lines().nth(1).unwrap(), "60,60");
    let ev = csv(&nan, "SELECT step, message FROM events WHERE kind = 'flight_recorder'");
    assert!(ev.contains("60,") && ev.contains("non-finite") && ev.contains("steps 60-68"), "{ev}");
    assert_eq!(manifest(&nan)["config"]["record"]["flight_recorder"], 8);
    // The step written is the NaN's own: every GEMM downstream of the planted one has NaN operands
    // there, yet only the planted GEMM holds the run's unbounded mass, and it alone is the cure.
    let p = common::analyze(&["--json", "predict", &out]);
    assert!(p.status.success(), "{}", String::from_utf8_lossy(&p.stderr));
    let v: serde_json::Value = serde_json::from_slice(&p.stdout).unwrap();
    let unbounded: Vec<&str> = v["masses"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["bound"].is_null() || m["bound"].as_f64() == Some(f64::INFINITY))
        .map(|m| m["gemm_name"].as_str().unwrap())
        .collect();
    assert_eq!(unbounded, ["layers.1.fc2.fprop"], "{}", v["masses"]);
    assert_eq!(v["recommended"]["gemms"], serde_json::json!(["layers.1.fc2.fprop"]));

    let clean = dir.path().join("clean");
    train_tiny(&clean, &["--recipe", "delayed", "--steps", "120", "--quiet", "--flight-recorder", "8"]);
    let m = manifest(&clean);
    assert_eq!(m["rows"]["tensors"], 0, "a clean run gets no dumps");
    assert_eq!(m["rows"]["shadow"], 0);
    assert_eq!(m["rows"]["events"], 0, "nothing fired");
}

#[test]
fn the_flight_recorder_sees_the_one_step_spike_that_dump_steps_miss() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("spike");
    train_tiny(&run, &["--recipe", "delayed", "--scenario", "spike", "--quiet", "--flight-recorder", "8"]);
    let ev = csv(&run, "SELECT step, message FROM events WHERE kind = 'flight_recorder'");
    assert!(ev.lines().count() == 2 && ev.starts_with("step,message\n250,") && ev.contains("saturation burst"), "one firing, at the scenario's batch: {ev}");
    let steps = csv(&run, "SELECT DISTINCT step FROM shadow ORDER BY step");
    let got: Vec<u32> = steps.lines().skip(1).map(|l| l.parse().unwrap()).collect();
    assert_eq!(got, (250..=258).collect::<Vec<_>>(), "the firing step and the 8 after it");
    // Training is unchanged, bit for bit: the same run without the recorder.
    let plain = dir.path().join("plain");
    train_tiny(&plain, &["--recipe", "delayed", "--scenario", "spike", "--quiet"]);
    let losses = "SELECT step, loss, grad_norm FROM steps ORDER BY step";
    assert_eq!(csv(&run, losses), csv(&plain, losses), "the recorder changed training");
    let o = analyze(&["--json", "locate", run.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<&str> = v["ranked"].as_array().unwrap().iter().map(|g| g["gemm_name"].as_str().unwrap()).collect();
    // The scenario's culprits (triage: layers.0.qkv.fprop + layers.0.proj.fprop; fixed dump steps
    // every 25 put them at #3 and #15): the qkv cast saturates 95% at step 251.
    assert_eq!(names[0], "layers.0.qkv.fprop", "{names:?}");
    assert_eq!(v["ranked"][0]["peak_step"], 251);
    let proj = names.iter().position(|n| *n == "layers.0.proj.fprop").unwrap() + 1;
    assert!(proj <= 3, "layers.0.proj.fprop ranks #{proj}: {names:?}");
    // The signed first-order loss change of the two fprops at the spike are its two largest.
    let fprops = csv(&run, "SELECT layer, module FROM shadow WHERE gemm = 'fprop' AND step IN (251, 252) ORDER BY dual_inner DESC LIMIT 2");
    assert_eq!(fprops.lines().skip(1).collect::<Vec<_>>(), ["0,qkv", "0,proj"], "{fprops}");
}
