//! End-to-end checks of `fp8-capture --scenario`: the manifest records the scenario and the recipe
//! it implies, the `nan` scenario dies where it should and is cured by current scaling, and the
//! `spike` scenario's padding batch saturates the next batch's layer-0 qkv activation and makes
//! the loss jump under delayed scaling only. (`triage` on the scenarios: tests/triage_cpu.rs.)

mod common;

use common::{HEAVY, bin, capture};
use serde_json::Value;

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
    let r = &m["config"]["recipe"];
    assert_eq!((m["config"]["scenario"].as_str(), r["amax_history"].as_u64(), r["amax_algo"].as_str()), (Some("spike"), Some(1), Some("most_recent")));
    assert_eq!(m["config"]["data"]["zipf_exponent"].as_f64(), Some(3.0), "the spike scenario steepens the language");
    // The pad token is reserved: the language's floor counts 1 word fewer.
    let plain = tmp.path().join("plain");
    assert!(train(&plain, &["--steps", "2", "--zipf-exponent", "3"]).status.success());
    let (f_spike, f_plain) = (m["data"]["entropy_floor"].as_f64().unwrap(), manifest(&plain)["data"]["entropy_floor"].as_f64().unwrap());
    let expected = ((511.0f64 - 4.0).ln() - (512.0f64 - 4.0).ln()) / 64.0;
    assert!((f_spike - f_plain - expected).abs() < 1e-12, "floor {f_spike} vs {f_plain}");
    let classic = tmp.path().join("classic");
    assert!(train(&classic, &["--scenario", "spike", "--steps", "2", "--zipf-exponent", "1"]).status.success());
    assert_eq!(manifest(&classic)["config"]["data"]["zipf_exponent"].as_f64(), Some(1.0), "an explicit flag wins");
    assert!(manifest(&classic)["data"]["entropy_floor"].as_f64().unwrap() > f_spike + 0.5, "steeper rows lower the floor");

    let drift = tmp.path().join("drift");
    assert!(train(&drift, &["--scenario", "drift", "--steps", "2"]).status.success());
    let r = manifest(&drift)["config"]["recipe"].clone();
    assert_eq!((r["amax_history"].as_u64(), r["margin"].as_i64(), r["amax_algo"].as_str()), (Some(1024), Some(8), Some("max")));

    let over = tmp.path().join("over");
    assert!(train(&over, &["--scenario", "drift", "--steps", "2", "--amax-history", "64", "--margin", "0"]).status.success());
    let r = manifest(&over)["config"]["recipe"].clone();
    assert_eq!((r["amax_history"].as_u64(), r["margin"].as_i64()), (Some(64), Some(0)));
    let bad = train(&tmp.path().join("bad"), &["--scenario", "explode"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown scenario 'explode'"));

    // --scenario-step moves the planted batch, and the manifest records it.
    let early = tmp.path().join("early");
    assert!(train(&early, &["--scenario", "spike", "--scenario-step", "3", "--steps", "4"]).status.success());
    assert_eq!(manifest(&early)["config"]["scenario_step"].as_u64(), Some(3));
    let losses: Vec<f64> = query(&early, "SELECT loss FROM steps ORDER BY step").iter().map(|r| r["loss"].as_f64().unwrap()).collect();
    assert_eq!(losses.iter().map(|&l| l == 0.0).collect::<Vec<_>>(), [false, false, true, false], "the padding batch is step 3: {losses:?}");
    assert_eq!(manifest(&spike)["config"]["scenario_step"], Value::Null, "absent when not given");
}

/// Rows of `fp8-analyze query RUN --json --sql SQL`.
fn query(run: &std::path::Path, sql: &str) -> Vec<Value> {
    let o =
        std::process::Command::new(bin("fp8-analyze")).args(["query", &run.display().to_string(), "--json", "--sql", sql]).output().expect("spawn fp8-analyze");
    assert!(o.status.success(), "query {sql}: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice::<Value>(&o.stdout).expect("JSON rows").as_array().cloned().expect("rows")
}

#[test]
fn the_spike_scenario_padding_batch_saturates_layer_0_qkv_and_the_loss_jumps_under_delayed_scaling_only() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tempdir");
    let sat = |run: &std::path::Path, step: u32| -> f64 {
        let rows = query(
            run,
            &format!("SELECT saturated_frac FROM stats WHERE step = {step} AND layer = 0 AND module = 'qkv' AND gemm = 'fprop' AND role = 'activation'"),
        );
        rows[0]["saturated_frac"].as_f64().expect("saturated_frac")
    };
    let loss =
        |run: &std::path::Path, step: u32| -> f64 { query(run, &format!("SELECT loss FROM steps WHERE step = {step}"))[0]["loss"].as_f64().expect("loss") };
    // The padding batch is step 250; step 251 is the first ordinary batch after it.
    let mut at_251 = Vec::new();
    for recipe in ["delayed", "current", "bf16"] {
        let dir = tmp.path().join(recipe);
        let o = train(&dir, &["--scenario", "spike", "--steps", "251", "--recipe", recipe]);
        assert!(o.status.success(), "{recipe}: {}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(loss(&dir, 250), 0.0, "{recipe}: the padding batch has no supervised target");
        at_251.push(loss(&dir, 251));
        if recipe == "bf16" {
            continue;
        }
        let (before, after) = (sat(&dir, 249), sat(&dir, 251));
        println!("{recipe}: layers.0.qkv fprop activation saturated {:.2}% at step 249, {:.2}% at step 251", 100.0 * before, 100.0 * after);
        assert!(before < 0.01, "{recipe}: an ordinary step barely saturates ({before})");
        if recipe == "delayed" {
            assert!(after > 0.9, "the most-recent amax of the padding batch saturates the next batch: {after}");
        } else {
            assert!(after < 1e-3, "current scaling takes the batch's own amax: {after}");
        }
    }
    let [delayed, current, bf16] = [at_251[0], at_251[1], at_251[2]];
    println!(
        "loss at step 251: delayed {delayed:.4} ({:+.2}%), current {current:.4} ({:+.2}%), bf16 {bf16:.4}",
        100.0 * (delayed / bf16 - 1.0),
        100.0 * (current / bf16 - 1.0)
    );
    assert!(delayed > 1.05 * bf16, "delayed scaling loses layer 0's attention for a step: the loss jumps (+14% measured)");
    assert!((current / bf16 - 1.0).abs() < 0.01, "current scaling does not jump");
}
