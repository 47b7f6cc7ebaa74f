//! End-to-end tests of `fp8-analyze triage` and `fp8-analyze regress` on the CPU, driving the built
//! `fp8-capture` the way a user does.
//!
//! - a matrix of planted faults (kinds × GEMM kinds × layers × modules): triage names exactly the
//!   planted GEMM in every case, confirmed on a second seed (found / planted, the planted GEMM's
//!   rank in `locate` and the runs are printed);
//! - clean runs of three seeds and two lengths on `tiny`, and a clean `small` run in its steep
//!   phase, are healthy or inconclusive, never a culprit (each judged against its noise band);
//! - the `nan` scenario is detected as nan and current scaling cures it;
//! - the `drift` scenario is detected as drift in the gradient GEMMs and current scaling cures it;
//! - the `spike` scenario is detected as a spike in layer 0's forward GEMMs and current scaling
//!   cures it;
//! - triage on `tiny` (300 steps) finishes in under 10 minutes on the CI's 2 cores;
//! - on two data-parallel ranks (`-- --dp 2`) and two tensor-parallel ranks (`-- --tp 2`), triage
//!   names a planted GEMM as on one rank, and one rank's corrupted scale as a mechanism on that rank;
//! - regress passes on a clean run and fails with a planted fault;
//! - bad input exits 2 with one line.
//!
//! The matrix uses 150 steps with faults from step 50 (every planted fault still moves the loss by
//! more than the drift detector's 1%: 1.9% for the weakest, outlier fc1 dgrad) and shares one BF16
//! baseline and two replicas through `--baseline-run` and `--noise-run`, to stay within CI's time.

mod common;

use common::{HEAVY, bin, capture};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Instant;

fn analyze(args: &[&str]) -> Output {
    Command::new(bin("fp8-analyze")).args(args).output().expect("spawn fp8-analyze")
}

fn triage(out: &Path, args: &[&str]) -> (Option<i32>, Value, String) {
    let out_s = out.display().to_string();
    let mut all = vec!["triage", "--json", "--quiet", "--device", "cpu", "--out", out_s.as_str()];
    all.extend_from_slice(args);
    let o = analyze(&all);
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("triage {args:?}: no JSON ({e}); stderr: {stderr}"));
    (o.status.code(), v, stderr)
}

/// The verdict's entry for the run called `name` (null when there is none).
fn run_entry(v: &Value, name: &str) -> Value {
    v["runs"].as_array().and_then(|r| r.iter().find(|e| e["name"] == name)).cloned().unwrap_or(Value::Null)
}

fn culprits(v: &Value) -> Vec<String> {
    v["culprits"]
        .as_array()
        .expect("culprits")
        .iter()
        .map(|c| format!("layers.{}.{}.{}", c["layer"], c["module"].as_str().unwrap_or("?"), c["gemm"].as_str().unwrap_or("?")))
        .collect()
}

/// The verdict's JSON has exactly the documented keys, and every run is on disk.
fn check_shape(v: &Value) {
    let keys: Vec<&str> = v.as_object().expect("object").keys().map(|k| k.as_str()).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        [
            "anomaly",
            "block_scaling_cures",
            "confirmation",
            "culprits",
            "current_scaling_cures",
            "healthy",
            "inconclusive",
            "mechanisms",
            "mxfp8_cures",
            "noise",
            "predicted",
            "runs"
        ],
        "verdict keys"
    );
    for r in v["runs"].as_array().expect("runs") {
        let dir = r["dir"].as_str().expect("dir");
        assert!(Path::new(dir).join("run.json").is_file(), "run {} kept on disk at {dir}", r["name"]);
        assert!(r["flags"].is_array() && r["outcome"]["status"].is_string(), "run entry {r}");
    }
}

/// Records a BF16 run of `tiny`; `jitter` makes it a replica (`--init-jitter`).
fn record_baseline(dir: &Path, steps: &str, seed: &str, jitter: Option<&str>) {
    let d = dir.display().to_string();
    let mut args = vec!["train", "--preset", "tiny", "--device", "cpu", "--quiet", "--recipe", "bf16", "--steps", steps, "--seed", seed, "--out", &d];
    if let Some(j) = jitter {
        args.extend(["--init-jitter", j]);
    }
    let o = capture(&args);
    assert!(o.status.success(), "baseline: {}", String::from_utf8_lossy(&o.stderr));
}

/// The planted GEMM's rank in the FP8 run's `locate` (by harm), from the triage's saved report.
fn locate_rank(out: &Path, gemm: &str) -> Option<usize> {
    let text = std::fs::read_to_string(out.join("reports").join("fp8.locate.json")).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    v["ranked"].as_array()?.iter().position(|g| g["gemm_name"] == gemm).map(|i| i + 1)
}

/// (kind, site, gemm): every kind, every GEMM kind, both layers, all four modules. Underflow only
/// on fprop: on dgrad and wgrad it cannot change the loss (capture/README.md). Left out because
/// they do not move the loss at 150 steps (triage rightly calls them healthy): outlier in
/// layers.0.fc2 fprop and layers.0.qkv wgrad, underflow in layers.1.qkv fprop.
const MATRIX: &[(&str, &str, &str)] = &[
    ("overflow", "layers.1.fc2", "dgrad"),
    ("overflow", "layers.1.fc1", "wgrad"),
    ("overflow", "layers.0.qkv", "fprop"),
    ("overflow", "layers.0.proj", "fprop"),
    ("overflow", "layers.0.fc2", "wgrad"),
    ("overflow", "layers.1.qkv", "dgrad"),
    ("underflow", "layers.0.fc1", "fprop"),
    ("outlier", "layers.1.fc1", "dgrad"),
    ("overflow", "layers.0.fc1", "dgrad"),
    ("underflow", "layers.1.proj", "fprop"),
    ("nan", "layers.0.proj", "wgrad"),
    ("nan", "layers.1.qkv", "dgrad"),
    ("nan", "layers.0.fc1", "fprop"),
];

/// Steps of the clean `small` run: it ends while the loss still falls steeply.
const SMALL_STEEP_STEPS: &str = "80";

#[test]
fn triage_names_exactly_the_planted_gemm_in_every_case_of_the_matrix() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tempdir");
    let base = tmp.path().join("baseline");
    record_baseline(&base, "150", "0", None);
    let base_s = base.display().to_string();
    // Two replicas for the noise band, shared like the baseline.
    let reps: Vec<String> = ["1", "2"]
        .iter()
        .map(|j| {
            let d = tmp.path().join(format!("replica-{j}"));
            record_baseline(&d, "150", "0", Some(j));
            d.display().to_string()
        })
        .collect();
    let mut ranks = Vec::new();
    let mut found = 0;
    let mut report = Vec::new();
    let t_all = Instant::now();
    for (i, (kind, site, gemm)) in MATRIX.iter().enumerate() {
        let spec = format!("site={site},gemm={gemm},kind={kind},step=50");
        let t0 = Instant::now();
        let case = tmp.path().join(format!("case{i:02}"));
        let (code, v, stderr) =
            triage(&case, &["--steps", "150", "--baseline-run", &base_s, "--noise-run", &reps[0], "--noise-run", &reps[1], "--inject", &spec]);
        let secs = t0.elapsed().as_secs_f64();
        check_shape(&v);
        let planted = format!("{site}.{gemm}");
        let got = culprits(&v);
        let held = v["confirmation"]["held"] == true;
        let ok = code == Some(1) && got == [planted.clone()] && v["healthy"] == false && held;
        found += ok as usize;
        let rank = locate_rank(&case, &planted);
        ranks.push(rank);
        let n_runs = v["runs"].as_array().map_or(0, |r| r.len());
        let bisect_runs = v["runs"].as_array().map_or(0, |r| r.iter().filter(|e| e["outcome"]["purpose"] == "bisect").count());
        let top_cured = run_entry(&v, "top-ranked")["outcome"]["cured"] == true;
        let line = format!(
            "{kind:>9} {planted:<22} -> {:<30} anomaly {:<6} current cures {:<5} locate #{:<2} top-ranked cures {top_cured:<5} runs {:>2} (bisect {:>2}) confirmed {held:<5} {secs:5.1} s {}",
            got.join(","),
            v["anomaly"].as_str().unwrap_or("-"),
            v["current_scaling_cures"],
            rank.map_or("-".into(), |r| r.to_string()),
            n_runs,
            bisect_runs,
            if ok { "ok" } else { "MISSED" }
        );
        println!("{line}");
        if !ok {
            eprintln!("{stderr}");
        }
        report.push(line);
    }
    let top2 = ranks.iter().filter(|r| r.is_some_and(|r| r <= 2)).count();
    println!(
        "triage matrix: found {found} / planted {} in {:.0} s; the planted GEMM is #1 or #2 in locate in {top2} / {}",
        MATRIX.len(),
        t_all.elapsed().as_secs_f64(),
        MATRIX.len()
    );
    assert_eq!(found, MATRIX.len(), "triage missed planted faults:\n{}", report.join("\n"));
}

/// A clean run is healthy or inconclusive, never a culprit: its verdict runs stop after the
/// first batch (baseline, two replicas, FP8 run).
fn assert_clean(label: &str, code: Option<i32>, v: &Value, stderr: &str) {
    check_shape(v);
    println!(
        "{label}: healthy {} inconclusive {} (fp8 gap {}, {} × band; band {})",
        v["healthy"],
        v["inconclusive"],
        run_entry(v, "fp8")["outcome"]["gap"],
        run_entry(v, "fp8")["outcome"]["gap_band_ratio"],
        v["noise"]["final_gap"]
    );
    assert_eq!(code, Some(0), "{label}: a clean run exits 0: {stderr}");
    assert!(v["healthy"] == true || v["inconclusive"] == true, "{label}: false alarm: {v}");
    assert_eq!(v["anomaly"], Value::Null);
    assert!(culprits(v).is_empty());
    assert_eq!(v["runs"].as_array().map(|r| r.len()), Some(4), "baseline, two replicas and the FP8 run only");
}

#[test]
fn triage_says_healthy_or_inconclusive_for_clean_runs_of_three_seeds_and_two_lengths() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tempdir");
    // 60 steps ends in tiny's steep descent; 150 in its slow phase.
    for steps in ["60", "150"] {
        for seed in ["0", "1", "2"] {
            let (code, v, stderr) = triage(&tmp.path().join(format!("s{steps}-seed{seed}")), &["--steps", steps, "--seed", seed]);
            assert_clean(&format!("tiny {steps} steps, seed {seed}"), code, &v, &stderr);
        }
    }
}

#[test]
fn triage_names_no_culprit_for_a_clean_small_run_in_its_steep_phase() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tempdir");
    let t0 = Instant::now();
    let (code, v, stderr) = triage(&tmp.path().join("small"), &["--preset", "small", "--steps", SMALL_STEEP_STEPS]);
    assert_clean(&format!("small {SMALL_STEEP_STEPS} steps ({:.0} s)", t0.elapsed().as_secs_f64()), code, &v, &stderr);
}

#[test]
fn the_nan_scenario_is_detected_as_nan_and_current_scaling_cures_it() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tempdir");
    let t0 = Instant::now();
    let (code, v, stderr) = triage(&tmp.path().join("nan"), &["--steps", "60", "--scenario", "nan"]);
    check_shape(&v);
    println!(
        "nan scenario: anomaly {}, culprits {:?}, current cures {}, {} runs, {:.1} s",
        v["anomaly"],
        culprits(&v),
        v["current_scaling_cures"],
        v["runs"].as_array().map_or(0, |r| r.len()),
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(v["anomaly"], "nan");
    assert_eq!(v["current_scaling_cures"], true, "current scaling never lets a value overflow: {v}");
}

#[test]
fn the_drift_scenario_is_detected_as_drift_in_the_gradient_gemms_and_current_scaling_cures_it() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tempdir");
    let t0 = Instant::now();
    // The preset's 300 steps: the prompt-heavy batch at step 25 leaves the gradient scales 2^8.5
    // too small for the rest of the run (capture/README.md has the numbers).
    let (code, v, stderr) = triage(&tmp.path().join("drift"), &["--scenario", "drift"]);
    check_shape(&v);
    let run = |name: &str| run_entry(&v, name);
    let gap = |name: &str| run(name)["outcome"]["gap"].as_f64().unwrap_or(f64::NAN);
    let got = culprits(&v);
    println!(
        "drift scenario: anomaly {}, fp8 gap {:+.2}%, current gap {:+.2}%, culprits {got:?}, current cures {}, {} runs, {:.1} s",
        v["anomaly"],
        100.0 * gap("fp8"),
        100.0 * gap("current"),
        v["current_scaling_cures"],
        v["runs"].as_array().map_or(0, |r| r.len()),
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(v["anomaly"], "drift", "{v}");
    assert!(gap("fp8") > 0.02, "the delayed-scaled run ends more than 2% above BF16: {}", gap("fp8"));
    assert_eq!(v["current_scaling_cures"], true, "current scaling takes each step's own amax: {v}");
    assert!(gap("current").abs() < 0.01, "current scaling ends within 1% of BF16: {}", gap("current"));
    assert_eq!(run("bf16-fprop")["outcome"]["cured"], false, "the forward GEMMs are not the cause");
    assert_eq!(v["confirmation"]["held"], true, "the culprits are confirmed on seed 1: {}", v["confirmation"]);
    assert!(!got.is_empty() && got.iter().all(|c| c.ends_with(".dgrad") || c.ends_with(".wgrad")), "culprits are gradient GEMMs: {got:?}");
    // The fault builds up after its first step: the verdict also cites the operands at the peak.
    let text = std::fs::read_to_string(tmp.path().join("drift").join("verdict.txt")).expect("verdict.txt");
    assert!(text.contains("at the peak, step") && text.contains("gradient underflow"), "the verdict cites the peak's evidence:\n{text}");
    // The cause is the history's lag: a 16-step history forgets the outlier and cures the run.
    assert_eq!(run("short-history")["outcome"]["cured"], true, "a short amax history cures a lagging scale: {v}");
    assert!(text.contains("the scale lags"), "the verdict names the lag:\n{text}");
}

#[test]
fn the_spike_scenario_is_detected_as_a_spike_in_layer_0_attention_and_current_scaling_cures_it() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tempdir");
    let t0 = Instant::now();
    // The preset's 300 steps: the padding batch at step 250 collapses layer 0's most-recent qkv
    // amax, and step 251 saturates it (capture/README.md has the numbers).
    let (code, v, stderr) = triage(&tmp.path().join("spike"), &["--scenario", "spike"]);
    check_shape(&v);
    let run = |name: &str| run_entry(&v, name);
    let got = culprits(&v);
    println!(
        "spike scenario: anomaly {}, culprits {got:?}, current cures {}, {} runs, {:.1} s",
        v["anomaly"],
        v["current_scaling_cures"],
        v["runs"].as_array().map_or(0, |r| r.len()),
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(v["anomaly"], "spike", "{v}");
    assert_eq!(v["current_scaling_cures"], true, "current scaling takes each step's own amax: {v}");
    assert_eq!(run("bf16-fprop")["outcome"]["cured"], true, "the forward GEMMs are the cause: {v}");
    assert!(got.contains(&"layers.0.qkv.fprop".to_string()), "the saturated cast is a culprit: {got:?}");
    assert!(got.iter().all(|c| c.starts_with("layers.0.") && c.ends_with(".fprop")), "culprits are layer 0's forward GEMMs: {got:?}");
    assert_eq!(v["confirmation"]["held"], true, "the culprits are confirmed on seed 1: {}", v["confirmation"]);
    let text = std::fs::read_to_string(tmp.path().join("spike").join("verdict.txt")).expect("verdict.txt");
    assert!(text.contains("a spike against the baseline from step 251"), "the verdict says where:\n{text}");
    assert!(text.contains("layers.0.qkv.fprop: at the spike's first step, 251: activation underflow"), "the verdict cites the saturated cast:\n{text}");
    assert_eq!(run("short-history")["outcome"]["cured"], true, "the max of a 16-step history foresees the ordinary batch: {v}");
}

#[test]
fn triage_on_tiny_finishes_in_under_ten_minutes() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tempdir");
    let t0 = Instant::now();
    // The preset's default 300 steps, its own baseline, the README's fault from step 100.
    let (code, v, stderr) = triage(&tmp.path().join("t"), &["--inject", "site=layers.1.fc2,gemm=dgrad,kind=overflow,step=100"]);
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "triage on tiny (300 steps, {} runs, {} cores): {secs:.1} s",
        v["runs"].as_array().map_or(0, |r| r.len()),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(culprits(&v), ["layers.1.fc2.dgrad"]);
    assert!(secs < 600.0, "triage on tiny took {secs:.0} s, over the 10-minute target");
    // A mis-scaled cast is not a lagging history: a short history does not cure it.
    let short = v["runs"].as_array().and_then(|r| r.iter().find(|e| e["name"] == "short-history")).expect("a short-history run");
    assert_eq!(short["outcome"]["cured"], false, "{short}");
    let text = std::fs::read_to_string(tmp.path().join("t").join("verdict.txt")).expect("verdict.txt");
    assert!(text.contains("saturated") && text.contains("locate ranks it #1"), "the verdict cites the evidence:\n{text}");
}

#[test]
fn regress_passes_on_clean_tiny_and_fails_with_a_planted_fault() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tempdir");
    let run = |name: &str, extra: &[&str]| {
        let out = tmp.path().join(name).display().to_string();
        let mut args = vec!["regress", "--json", "--quiet", "--device", "cpu", "--out", out.as_str()];
        args.extend_from_slice(extra);
        let o = analyze(&args);
        let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("regress: no JSON ({e}): {}", String::from_utf8_lossy(&o.stderr)));
        (o.status.code(), v)
    };
    let (code, v) = run("clean", &[]);
    for m in v["modes"].as_array().expect("modes") {
        println!("clean {:<13} loss {} gap {} passed {}", m["mode"].as_str().unwrap_or("?"), m["final_loss"], m["gap"], m["passed"]);
    }
    println!("loss bound {}", v["max_loss"]);
    assert_eq!(code, Some(0), "clean tiny passes every bound: {v}");
    assert_eq!(v["modes"].as_array().map(|m| m.len()), Some(4));

    let (code, v) = run("fault", &["--inject", "site=layers.1.fc2,gemm=dgrad,kind=overflow,step=100"]);
    let passed: Vec<(String, bool)> =
        v["modes"].as_array().expect("modes").iter().map(|m| (m["mode"].as_str().unwrap_or("?").to_string(), m["passed"] == true)).collect();
    println!("with overflow in layers.1.fc2 dgrad: {passed:?}");
    assert_eq!(code, Some(1), "a planted fault fails regress: {v}");
    assert!(!passed[1].1, "the fp8 mode fails");
    assert!(passed[2].1, "without FP8 dgrad the fault is gone and the mode passes");
}

#[test]
fn triage_on_two_ranks_names_the_planted_gemm_and_the_rank_of_a_rank_fault() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tempdir");
    // A GEMM fault on every rank: the same method as on one rank, current and block scaling left
    // out (fp8-capture's runs of several ranks reduce amaxes between steps) and said to be.
    let out = tmp.path().join("dp2");
    let (code, v, stderr) = triage(&out, &["--steps", "150", "--inject", "site=layers.1.fc2,gemm=dgrad,kind=overflow,step=100", "--", "--dp", "2"]);
    check_shape(&v);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(culprits(&v), ["layers.1.fc2.dgrad"], "{v}");
    assert_eq!(v["confirmation"]["held"], true, "{}", v["confirmation"]);
    assert_eq!((run_entry(&v, "current"), run_entry(&v, "block")), (Value::Null, Value::Null));
    let text = std::fs::read_to_string(out.join("verdict.txt")).expect("verdict.txt");
    assert!(text.contains("4. current scaling: not tried (fp8-capture runs of several ranks") && text.contains("current scaling was not tried"), "{text}");
    // The same fault under tensor parallelism (llama-tiny, every layer halved over 2 ranks).
    let (code, v, stderr) = triage(
        &tmp.path().join("tp2"),
        &["--preset", "llama-tiny", "--steps", "150", "--inject", "site=layers.1.fc2,gemm=dgrad,kind=overflow,step=100", "--", "--tp", "2"],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(culprits(&v), ["layers.1.fc2.dgrad"], "{v}");
    assert_eq!(v["confirmation"]["held"], true, "{}", v["confirmation"]);
    // One rank's scale × 16 from step 100: the loss barely moves (under the drift threshold), and
    // the verdict names the GEMM and the rank instead of calling the run healthy.
    let (code, v, stderr) = triage(
        &tmp.path().join("corrupt"),
        &["--steps", "150", "--inject", "kind=scale-corrupt,rank=1,site=layers.1.fc2,step=100,magnitude=16", "--", "--dp", "2"],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!((v["healthy"].clone(), v["anomaly"].clone()), (Value::Bool(false), Value::Null), "{v}");
    let mech: Vec<&str> = v["mechanisms"].as_array().expect("mechanisms").iter().filter_map(|m| m.as_str()).collect();
    assert!(mech.iter().any(|m| m.contains("layers.1.fc2.fprop's weight") && m.contains("at step 100 on rank 1")), "{mech:?}");
    assert!(mech.iter().all(|m| m.ends_with("on rank 1")), "only rank 1's casts: {mech:?}");
}

#[test]
fn bad_input_exits_2_with_one_line() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("x").display().to_string();
    for args in [
        vec!["triage", "--quiet", "--out", out.as_str(), "--recipe", "bf16"],
        vec!["triage", "--quiet", "--out", out.as_str(), "--steps", "2", "--device", "cpu", "--inject", "site=layers.9.fc2,gemm=dgrad,kind=nan"],
        vec!["regress", "--out", out.as_str(), "--max-gap", "-1"],
    ] {
        let _ = std::fs::remove_dir_all(&out);
        let o = analyze(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: one line: {err}");
        assert!(err.starts_with("fp8-analyze: "), "{err}");
    }
    // An --out that holds files is refused before anything runs.
    std::fs::create_dir_all(tmp.path().join("full")).expect("mkdir");
    std::fs::write(tmp.path().join("full").join("f"), "x").expect("write");
    let o = analyze(&["triage", "--out", &tmp.path().join("full").display().to_string()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("new or empty"));
}
