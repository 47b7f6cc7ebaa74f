//! End to end: FP8 failure mechanisms in the statistics (saturation, underflow surges) and the early
//! warnings (quantization bias, gradient below quantization noise) come before the loss moves, a
//! clean run stays quiet, and a run that has one without a loss anomaly is not called healthy.

mod common;

use common::{HEAVY, analyze, capture, train_tiny};

#[test]
fn the_drift_scenarios_underflow_surge_is_seen_before_the_drift() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (fp8, bf16) = (dir.path().join("fp8"), dir.path().join("bf16"));
    train_tiny(&fp8, &["--recipe", "delayed", "--scenario", "drift", "--quiet"]);
    train_tiny(&bf16, &["--recipe", "bf16", "--scenario", "drift", "--quiet"]);
    let o = analyze(&["--json", "anomalies", fp8.to_str().unwrap(), "--baseline", bf16.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let first = &v["mechanisms"][0];
    assert_eq!(first["kind"], "underflow surge", "{first}");
    assert_eq!(first["role"], "gradient");
    let (warned, drifted) = (first["step"].as_i64().unwrap(), v["drift"]["first_step"].as_i64().unwrap());
    assert!(warned + 20 < drifted, "the surge (step {warned}) comes well before the drift (step {drifted})");
    // The gradient drowns in the wgrad quantization noise from the scenario's batch on, long before
    // the loss drifts.
    let noise =
        v["mechanisms"].as_array().unwrap().iter().find(|m| m["kind"] == "gradient below quantization noise").unwrap_or_else(|| panic!("{}", v["mechanisms"]));
    let (at, ratio) = (noise["step"].as_i64().unwrap(), noise["value"].as_f64().unwrap());
    assert!(at + 20 < drifted && ratio < 8.0 && ratio > 1.0, "gradient-to-noise {ratio} from step {at}, drift at {drifted}");
    let text = String::from_utf8_lossy(&analyze(&["anomalies", fp8.to_str().unwrap(), "--baseline", bf16.to_str().unwrap()]).stdout).to_string();
    assert!(text.contains("before the loss moved") && text.contains("gradient below quantization noise: ‖g‖ / ‖wgrad quantization noise‖ down to"), "{text}");
    // A clean run stays quiet.
    let clean = dir.path().join("clean");
    train_tiny(&clean, &["--recipe", "delayed", "--steps", "150", "--quiet"]);
    let o = analyze(&["--json", "anomalies", clean.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["mechanisms"], serde_json::json!([]), "{}", v["mechanisms"]);
    // Its FP8 weights move freely through the grid: about one bin flipped per bin moved, on every
    // fprop weight at every step but the first.
    let sql = "SELECT COUNT(flip_ratio) AS n, AVG(flip_ratio) AS mean, MAX(flip_ratio) AS hi FROM stats WHERE gemm = 'fprop' AND role = 'weight'";
    let q = analyze(&["query", clean.to_str().unwrap(), "--format", "json", "--sql", sql]);
    let rows: serde_json::Value = serde_json::from_slice(&q.stdout).unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&q.stderr)));
    let (n, mean, hi) = (rows[0]["n"].as_i64().unwrap(), rows[0]["mean"].as_f64().unwrap(), rows[0]["hi"].as_f64().unwrap());
    assert_eq!(n, 149 * 8, "8 fprop weights, steps 2 to 150");
    assert!((mean - 1.0).abs() < 0.03 && hi < 1.5, "flip ratio mean {mean}, max {hi}");
}

#[test]
fn a_mis_scaled_cast_is_a_quantization_bias_before_any_loss_anomaly() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("ov");
    // From step 100 layers.1.fc2's fprop operands are cast with twice their scale and dequantized
    // with the true one: the GEMM sees them doubled. The activation saturates under 1% (no
    // saturation mechanism); only its bias names it.
    train_tiny(&run, &["--recipe", "delayed", "--steps", "150", "--inject", "site=layers.1.fc2,gemm=fprop,kind=overflow,step=100,magnitude=1", "--quiet"]);
    let o = analyze(&["--json", "anomalies", run.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mech = v["mechanisms"].as_array().unwrap();
    let act = mech.iter().find(|m| m["role"] == "activation").unwrap_or_else(|| panic!("{mech:?}"));
    assert_eq!(
        (act["kind"].as_str(), act["gemm_name"].as_str(), act["step"].as_i64()),
        (Some("quantization bias"), Some("layers.1.fc2.fprop"), Some(100)),
        "{act}"
    );
    let bias = act["value"].as_f64().unwrap();
    assert!((bias - 1.0).abs() < 0.05, "a doubled operand: bias {bias} ≈ +100%");
    assert!(mech.iter().all(|m| m["step"].as_i64() == Some(100) && m["gemm_name"] == "layers.1.fc2.fprop"), "only the planted GEMM: {mech:?}");
    assert!(mech.iter().all(|m| !(m["kind"] == "saturation" && m["role"] == "activation")), "{mech:?}");
    let text = String::from_utf8_lossy(&analyze(&["anomalies", run.to_str().unwrap()]).stdout).to_string();
    assert!(text.contains("quantization bias: the cast inflates layers.1.fc2.fprop's activation by up to"), "{text}");
}

#[test]
fn a_weight_parked_at_its_rounding_boundaries_is_an_oscillation_before_any_loss_anomaly() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (run, bf16) = (dir.path().join("osc"), dir.path().join("bf16"));
    // From step 60 layers.1.fc1's weight sits at its FP8 grid's rounding boundaries, 1/64 of a bin
    // past them on alternate sides (TetraJet-v2's oscillation, planted): its forward weight flips
    // every element every step while the master moves 1/32 of a bin.
    train_tiny(&run, &["--recipe", "delayed", "--steps", "120", "--inject", "site=layers.1.fc1,kind=oscillation,step=60", "--quiet"]);
    train_tiny(&bf16, &["--recipe", "bf16", "--steps", "120", "--quiet"]);
    let o = analyze(&["--json", "anomalies", run.to_str().unwrap(), "--baseline", bf16.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mech = v["mechanisms"].as_array().unwrap();
    let osc = mech.iter().find(|m| m["kind"] == "weight oscillation").unwrap_or_else(|| panic!("{mech:?}"));
    assert_eq!((osc["gemm_name"].as_str(), osc["role"].as_str(), osc["step"].as_i64()), (Some("layers.1.fc1.fprop"), Some("weight"), Some(60)), "{osc}");
    let ratio = osc["value"].as_f64().unwrap();
    assert!(ratio > 20.0 && ratio < 40.0, "flip ratio {ratio}: about 1 / (2 · 1/64) = 32");
    assert!(mech.iter().all(|m| m["kind"] != "weight oscillation" || m["gemm_name"] == "layers.1.fc1.fprop"), "only the planted weight: {mech:?}");
    // It fires first: the loss shows nothing.
    assert_eq!(
        (v["gap_spikes"].as_array().map(Vec::len), &v["drift"], &v["nonfinite"]["first_loss_step"]),
        (Some(0), &serde_json::Value::Null, &serde_json::Value::Null),
        "{v}"
    );
    let text = String::from_utf8_lossy(&analyze(&["anomalies", run.to_str().unwrap(), "--baseline", bf16.to_str().unwrap()]).stdout).to_string();
    assert!(text.contains("with no loss anomaly yet") && text.contains("weight oscillation: layers.1.fc1.fprop's weight flips up to"), "{text}");
    // Only with delayed scaling's given scale, and only on a forward weight.
    let refuse = |recipe: &str, spec: &str| {
        let out = dir.path().join(recipe).display().to_string();
        capture(&["train", "--preset", "tiny", "--device", "cpu", "--steps", "2", "--recipe", recipe, "--inject", spec, "--out", &out])
    };
    let current = refuse("current", "site=layers.1.fc1,kind=oscillation,step=1");
    assert_eq!(current.status.code(), Some(2), "{}", String::from_utf8_lossy(&current.stderr));
    assert!(String::from_utf8_lossy(&current.stderr).contains("--recipe delayed"), "{}", String::from_utf8_lossy(&current.stderr));
    let dgrad = refuse("delayed", "site=layers.1.fc1,gemm=dgrad,kind=oscillation,step=1");
    assert_eq!(dgrad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&dgrad.stderr).contains("gemm=fprop"), "{}", String::from_utf8_lossy(&dgrad.stderr));
}

#[test]
fn triage_says_mechanism_present_for_swiglu_outliers_instead_of_healthy() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t");
    let o = analyze(&["--json", "triage", "--out", out.to_str().unwrap(), "--preset", "llama-tiny", "--device", "cpu", "--scenario", "swiglu-outliers"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&o.stderr)));
    assert_eq!(o.status.code(), Some(0), "no loss anomaly: exit 0");
    assert_eq!(v["anomaly"], serde_json::Value::Null, "{v}");
    assert_eq!(v["healthy"], false, "not called healthy");
    let mech: Vec<&str> = v["mechanisms"].as_array().unwrap().iter().map(|m| m.as_str().unwrap()).collect();
    assert!(mech.iter().any(|m| m.contains("layers.0.fc2.fprop's activation underflows") && m.contains("from step 201")), "{mech:?}");
    let text = std::fs::read_to_string(out.join("verdict.txt")).unwrap();
    assert!(text.contains("mechanism present, no loss anomaly yet"), "{text}");
}
