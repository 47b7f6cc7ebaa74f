//! End to end: precision-switch schedules (`--bf16-gemms … --from-step S --until-step E`) and
//! `fp8-analyze predict` on a planted fault, through the real binaries.

mod common;

use common::{HEAVY, analyze, capture, train_tiny};

/// `fp8-analyze --json triage --predict` on `tiny` on the CPU with `extra`, into `out`: the exit
/// status, the verdict and its text.
fn triage_tiny_predict(out: &std::path::Path, extra: &[&str]) -> (Option<i32>, serde_json::Value, String) {
    let mut args = vec!["--json", "triage", "--out", out.to_str().unwrap(), "--preset", "tiny", "--device", "cpu", "--predict"];
    args.extend_from_slice(extra);
    let o = analyze(&args);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&o.stderr)));
    (o.status.code(), v, std::fs::read_to_string(out.join("verdict.txt")).unwrap_or_default())
}

fn culprit_names(v: &serde_json::Value) -> Vec<String> {
    let mut c: Vec<String> = v["culprits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| format!("layers.{}.{}.{}", c["layer"], c["module"].as_str().unwrap(), c["gemm"].as_str().unwrap()))
        .collect();
    c.sort();
    c
}

fn formats_by_half(run: &std::path::Path, switch: u32) -> String {
    let sql = format!("SELECT step >= {switch} AS after, gemm, format, COUNT(*) AS n FROM stats WHERE role = 'activation' GROUP BY 1, 2, 3 ORDER BY 1, 2, 3");
    let o = analyze(&["query", run.to_str().unwrap(), "--format", "csv", "--sql", &sql]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).to_string()
}

#[test]
fn a_schedule_routes_its_gemms_to_bf16_only_between_its_steps() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("sched");
    train_tiny(&run, &["--recipe", "delayed", "--steps", "40", "--quiet", "--bf16-gemms", "fprop", "--from-step", "20"]);
    let csv = formats_by_half(&run, 20);
    // Before step 20 every GEMM casts to FP8; from it on, the fprops run in BF16 and the wgrads stay FP8.
    assert!(csv.contains("false,fprop,e4m3"), "{csv}");
    assert!(!csv.contains("false,fprop,bf16"), "{csv}");
    assert!(csv.contains("true,fprop,bf16") && !csv.contains("true,fprop,e4m3"), "{csv}");
    assert!(csv.contains("true,wgrad,e4m3"), "{csv}");
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap();
    assert_eq!(m["config"]["routing"]["from_step"], 20);
    assert!(m["config"]["routing"].get("until_step").is_none());
    let s = analyze(&["summary", run.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&s.stdout).contains("bf16 routing from step 20 until the end"));

    // --until-step: BF16 first, FP8 again from the step on.
    let back = dir.path().join("until");
    train_tiny(&back, &["--recipe", "delayed", "--steps", "40", "--quiet", "--bf16-gemms", "fprop", "--until-step", "20"]);
    let csv = formats_by_half(&back, 20);
    assert!(csv.contains("false,fprop,bf16") && csv.contains("true,fprop,e4m3") && !csv.contains("true,fprop,bf16"), "{csv}");
}

#[test]
fn a_schedule_without_a_routing_or_upside_down_is_refused_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x");
    for (flags, says) in [
        (vec!["--from-step", "10"], "give --bf16-gemms"),
        (vec!["--bf16-gemms", "fprop", "--from-step", "30", "--until-step", "20"], "must come before --until-step 20"),
    ] {
        let mut args = vec!["train", "--preset", "tiny", "--device", "cpu", "--steps", "5", "--out", out.to_str().unwrap()];
        args.extend(flags.iter());
        let o = capture(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{flags:?}: {err}");
        assert!(err.contains(says) && err.trim().lines().count() == 1, "{flags:?}: {err}");
        assert!(!out.exists(), "nothing is written for bad flags");
    }
}

#[test]
fn predict_puts_a_planted_dgrad_overflow_first_and_its_kind_ahead() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("planted");
    train_tiny(
        &run,
        &[
            "--recipe",
            "delayed",
            "--steps",
            "80",
            "--quiet",
            "--dump-every",
            "10",
            "--shadow",
            "--inject",
            "site=layers.1.fc2,gemm=dgrad,kind=overflow,step=40",
        ],
    );
    let o = analyze(&["--json", "predict", run.to_str().unwrap(), "--set", "mlp1=layers.1.fc1.dgrad,layers.1.fc2.dgrad"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let p: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(p["masses"][0]["gemm_name"], "layers.1.fc2.dgrad", "{}", p["masses"]);
    let set = |name: &str| p["sets"].as_array().unwrap().iter().find(|s| s["name"] == name).cloned().unwrap();
    let dgrad = set("bf16-dgrad")["recovery"].as_f64().unwrap();
    assert!(dgrad > 0.8 && dgrad > set("bf16-fprop")["recovery"].as_f64().unwrap() && dgrad > set("bf16-wgrad")["recovery"].as_f64().unwrap(), "{dgrad}");
    assert!(set("mlp1")["recovery"].as_f64().unwrap() >= set("top-1")["recovery"].as_f64().unwrap());
    let rec = &p["recommended"];
    assert!(rec["gemms"].as_array().unwrap().iter().any(|g| g == "layers.1.fc2.dgrad"), "{rec}");
    assert!(rec["recovery"].as_f64().unwrap() >= 0.9);
    // The excess share (beyond each GEMM's own error floor) is the headline and ranks the GEMMs; it
    // gives the planted GEMM more of the mass than the bound share, and the other kinds less.
    assert_eq!(p["ranked_by"], "excess");
    let (top, ex, bound) = (set("top-1"), |n: &str| set(n)["excess_recovery"].as_f64().unwrap(), |n: &str| set(n)["bound_recovery"].as_f64().unwrap());
    assert_eq!(top["recovery"], top["excess_recovery"]);
    assert!(ex("top-1") > bound("top-1"), "{top}");
    assert!(ex("bf16-fprop") < bound("bf16-fprop") && ex("bf16-wgrad") < bound("bf16-wgrad"));
    // The CPU backend records the signed effect of every shadow GEMM's error.
    let q = analyze(&["query", run.to_str().unwrap(), "--format", "csv", "--sql", "SELECT COUNT(*) AS n, COUNT(dual_inner) AS signed FROM shadow"]);
    let csv = String::from_utf8_lossy(&q.stdout);
    let row: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    assert_eq!(row[0], row[1], "every shadow row has its signed effect: {csv}");

    // A GEMM that is not the run's, and a run without shadow records: one line, exit 2 / 1.
    let bad = analyze(&["predict", run.to_str().unwrap(), "--set", "x=layers.9.fc2.dgrad"]);
    assert_eq!(bad.status.code(), Some(2), "{}", String::from_utf8_lossy(&bad.stderr));
    let plain = dir.path().join("plain");
    train_tiny(&plain, &["--recipe", "delayed", "--steps", "5", "--quiet"]);
    let none = analyze(&["predict", plain.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&none.stderr);
    assert!(!none.status.success() && err.contains("--shadow") && err.trim().lines().count() == 1, "{err}");
}

#[test]
fn triage_predict_names_a_planted_fault_with_two_runs_beyond_the_baseline_replicas_and_fp8_run() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (code, v, text) = triage_tiny_predict(&dir.path().join("t"), &["--steps", "200", "--inject", "site=layers.1.fc2,gemm=dgrad,kind=overflow,step=100"]);
    assert_eq!(code, Some(1), "{v}");
    assert_eq!(culprit_names(&v), ["layers.1.fc2.dgrad"], "{v}");
    assert_eq!(v["predicted"]["held"], true, "{}", v["predicted"]);
    let names: Vec<&str> = v["runs"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 6, "baseline, two replicas, the FP8 run and the two tests: {names:?}");
    assert!(names.contains(&"predicted-cure") && names.contains(&"predicted-alone"), "{names:?}");
    assert!(text.contains("alone in FP8 brings the") && text.contains("rests on 6 runs"), "{text}");
    // Without shadow GEMMs there is nothing to predict from: one line, exit 2.
    let bad = analyze(&["triage", "--out", dir.path().join("u").to_str().unwrap(), "--preset", "tiny", "--dump-every", "0", "--predict"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--dump-every"));
}

#[test]
fn triage_predict_sends_each_of_two_held_suspects_alone_to_bf16_and_names_both_when_neither_cures_alone() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    // Two planted dgrad overflows: the suspects are both; each alone in BF16 leaves the other's gap.
    let faults = ["site=layers.1.fc2,gemm=dgrad,kind=overflow,step=100", "site=layers.0.fc1,gemm=dgrad,kind=overflow,step=100"];
    let (_, v, text) = triage_tiny_predict(&dir.path().join("t"), &["--steps", "200", "--inject", faults[0], "--inject", faults[1]]);
    let p = &v["predicted"];
    assert_eq!(p["held"], true, "{p}");
    let each = p["each_alone"].as_array().unwrap();
    assert_eq!(each.len(), 2, "{p}");
    for a in each {
        assert_eq!(a["cures"], false, "{a}");
        let r = a["recovered"].as_f64().unwrap();
        assert!(r > 0.05 && r < 0.8, "each fault alone recovers a part of the gap: {a}");
    }
    assert_eq!(culprit_names(&v), ["layers.0.fc1.dgrad", "layers.1.fc2.dgrad"], "{v}");
    assert_eq!(v["runs"].as_array().unwrap().len(), 8, "baseline, two replicas, FP8, the two tests, each suspect alone");
    assert!(text.contains("layers.1.fc2.dgrad alone in BF16: does not cure the run") && text.contains("each suspect alone in BF16 by 2"), "{text}");
}

#[test]
fn triage_predict_on_a_run_whose_scales_fail_at_once_tests_the_recipe_with_one_run() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (_, v, text) = triage_tiny_predict(&dir.path().join("t"), &["--scenario", "nan", "--steps", "60"]);
    assert_eq!(v["anomaly"], "nan", "{v}");
    let p = &v["predicted"];
    // Every GEMM of tiny ran at its limit by step 2: the prediction is the recipe, and current
    // scaling keeps the run finite.
    assert_eq!((p["recipe"]["at_risk"].as_u64(), p["recipe"]["gemms"].as_u64()), (Some(24), Some(24)), "{p}");
    assert_eq!((p["held"].as_bool(), v["current_scaling_cures"].as_bool()), (Some(true), Some(true)), "{v}");
    assert!(culprit_names(&v).is_empty());
    let names: Vec<&str> = v["runs"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 5, "baseline, two replicas, the FP8 run and current scaling: {names:?}");
    assert!(names.contains(&"predicted-current"), "{names:?}");
    assert!(text.contains("caused by the recipe") && text.contains("rests on 5 runs"), "{text}");
}

#[test]
fn schedule_finds_the_cheapest_switch_that_recovers_a_planted_fault() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("s");
    let o = analyze(&[
        "--json",
        "schedule",
        "--out",
        out.to_str().unwrap(),
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--steps",
        "120",
        "--inject",
        "site=layers.1.fc2,gemm=dgrad,kind=overflow,step=60",
        "--kinds",
        "fprop,dgrad",
        "--from",
        "0,0.5",
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["rows"].as_array().unwrap().len(), 4);
    assert_eq!(v["runs"], 7, "baseline, FP8, one replica and four schedules");
    // The fault lives from step 60 in the dgrad: dgrad in BF16 from step 60 (half the run, a sixth
    // of the GEMM FLOPs) recovers it; the forward GEMMs do not.
    let a = &v["answer"];
    assert_eq!((a["kind"].as_str(), a["from_step"].as_u64()), (Some("dgrad"), Some(60)), "{v}");
    assert!((a["bf16_share"].as_f64().unwrap() - 1.0 / 6.0).abs() < 1e-9);
    let fprop0 = v["rows"].as_array().unwrap().iter().find(|r| r["kind"] == "fprop" && r["from_step"] == 0).unwrap();
    assert!(fprop0["recovery"].as_f64().unwrap() < 0.5, "{fprop0}");
    // The two schedules from step 60 resumed from the FP8 run's checkpoint after step 59: 61 steps
    // each, not 120.
    assert_eq!(v["resumed"], 2, "{v}");
    assert_eq!(v["steps_trained"], 3 * 120 + 2 * 120 + 2 * 61, "{v}");
    // And a resumed schedule ends exactly where the same schedule trained from step 1 ends.
    let scratch = dir.path().join("scratch");
    let o = capture(&[
        "train",
        "--preset",
        "tiny",
        "--seed",
        "0",
        "--device",
        "cpu",
        "--steps",
        "120",
        "--recipe",
        "delayed",
        "--inject",
        "site=layers.1.fc2,gemm=dgrad,kind=overflow,step=60",
        "--bf16-gemms",
        "dgrad",
        "--from-step",
        "60",
        "--quiet",
        "--out",
        scratch.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(scratch.join("run.json")).unwrap()).unwrap();
    assert_eq!(a["final_loss"], m["final_loss"], "resumed from step 60 vs trained from step 1");
    // Nonsense fractions: one line, exit 2.
    let bad = analyze(&["schedule", "--out", dir.path().join("b").to_str().unwrap(), "--from", "1.5"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--from 1.5"));
}

#[test]
fn predict_on_a_run_whose_scales_fail_at_once_wants_every_gemm_and_names_the_recipe() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let tiny = |out: &std::path::Path, extra: &[&str]| {
        let o = out.display().to_string();
        let mut args = vec!["train", "--preset", "tiny", "--device", "cpu", "--scenario", "nan", "--steps", "30", "--quiet", "--out", o.as_str()];
        args.extend_from_slice(extra);
        let r = capture(&args);
        // Exit 3: the run went non-finite (and was recorded up to there).
        assert_eq!(r.status.code(), Some(3), "{args:?}: {}", String::from_utf8_lossy(&r.stderr));
    };
    let run = dir.path().join("nan");
    tiny(&run, &["--shadow", "--dump-every", "25"]);
    let o = analyze(&["--json", "predict", run.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let p: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rec = |name: &str| p["sets"].as_array().unwrap().iter().find(|s| s["name"] == name).unwrap()["recovery"].as_f64().unwrap();
    // The scenario's casts turn an overflow into NaN, and (scales out of warm-up at step 2) most
    // operands pass their delayed amax at once: no kind alone is predicted to recover the run ...
    for kind in ["bf16-fprop", "bf16-dgrad", "bf16-wgrad", "top-1"] {
        assert_eq!(rec(kind), 0.0, "{kind}");
    }
    // ... more than half of the GEMMs ran within 5% of their limit: the scales failed, so only every
    // GEMM in BF16 is predicted to recover it, and the recipe is named as the cure.
    assert_eq!(p["recipe_wide"], true, "{}", p["masses"]);
    let recommended = p["recommended"]["gemms"].as_array().unwrap().len();
    assert_eq!(recommended, p["masses"].as_array().unwrap().len(), "{}", p["recommended"]);
    assert_eq!(p["recommended"]["recovery"].as_f64(), Some(1.0));
    let text = analyze(&["predict", run.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("the scales failed, not one GEMM") && text.contains("The cure to try is the recipe"), "{text}");
    // And so it is: with the forward GEMMs in BF16 the run still diverges.
    tiny(&dir.path().join("fprop"), &["--bf16-gemms", "fprop"]);
}
