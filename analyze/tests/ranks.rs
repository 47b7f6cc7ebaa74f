//! `fp8-analyze ranks`: multi-rank runs with one planted fault per check are named exactly (check,
//! tensor, role, ranks, first step); clean 2-rank and 4-rank runs exit 0 with no finding; the JSON
//! keys other tools read; what a run without casts or statistics could not check; bad input.

mod common;
mod ranks_common;

use common::{analyze, p};
use fp8scope_schemas::config::RecipeKind;
use fp8scope_schemas::manifest::{Manifest, RunSource};
use fp8scope_schemas::ranks::GroupKind;
use ranks_common::{Ending, Plant, Spec, write};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn dp2(name: &str) -> Spec {
    Spec::new(name, &[("dp", GroupKind::Dp, 2)])
}

/// 4 ranks: data parallel 2 × tensor parallel 2 (rank = 2·dp + tp): tp instances [0,1] [2,3], dp
/// instances [0,2] [1,3].
fn dp2tp2(name: &str) -> Spec {
    Spec::new(name, &[("dp", GroupKind::Dp, 2), ("tp", GroupKind::Tp, 2)])
}

fn written(tmp: &Path, spec: &Spec) -> PathBuf {
    write(tmp, spec, common::config(RecipeKind::Current))
}

/// Runs `ranks --json` and returns (exit code, JSON).
fn ranks_json(run: &Path) -> (i32, Value) {
    let out = analyze(&["ranks", &p(run), "--json"]);
    assert!(out.stderr.is_empty(), "stderr: {}", out.stderr);
    (out.code, out.json())
}

fn findings<'a>(j: &'a Value, check: &str) -> Vec<&'a Value> {
    j["findings"].as_array().unwrap().iter().filter(|f| f["check"] == check).collect()
}

/// The one finding of `check`, asserted to name (module, role, ranks, first step).
fn assert_one(j: &Value, check: &str, module: Option<&str>, role: Option<&str>, ranks: &[u32], step: Option<i64>) -> Value {
    let f = findings(j, check);
    assert_eq!(f.len(), 1, "one {check} finding expected, got {:#?}", j["findings"]);
    let f = f[0];
    assert_eq!(f["module"].as_str(), module, "{f:#}");
    assert_eq!(f["role"].as_str(), role, "{f:#}");
    let got: Vec<u32> = f["ranks"].as_array().unwrap().iter().map(|r| r.as_u64().unwrap() as u32).collect();
    assert_eq!(got, ranks, "{f:#}");
    assert_eq!(f["step"].as_i64(), step, "{f:#}");
    assert!(!f["message"].as_str().unwrap().is_empty());
    f.clone()
}

fn checks(j: &Value) -> Vec<String> {
    let mut v: Vec<String> = j["findings"].as_array().unwrap().iter().map(|f| f["check"].as_str().unwrap().to_string()).collect();
    v.sort();
    v
}

// ---------------------------------------------------------------- clean runs

#[test]
fn a_clean_two_rank_data_parallel_run_has_no_finding() {
    let tmp = tempfile::tempdir().unwrap();
    let run = written(tmp.path(), &dp2("dp2"));
    let (code, j) = ranks_json(&run);
    assert_eq!(code, 0, "{:#}", j["findings"]);
    assert_eq!(j["findings"].as_array().unwrap().len(), 0);
    assert_eq!((j["world_size"].as_u64(), j["steps"].as_u64()), (Some(2), Some(20)));
    // Every weight cast of both replicas compared: 2 layers × 4 sites × 20 steps, one dp instance.
    assert_eq!(j["checked"]["agreement_groups"].as_i64(), Some(8 * 20));
    // Every cast's reduction set checked: 2 ranks × 24 casts × 20 steps.
    assert_eq!(j["checked"]["amax_casts"].as_i64(), Some(2 * 24 * 20));
    assert_eq!(j["checked"]["not_checked"].as_array().unwrap().len(), 0, "{:#}", j["checked"]);
    assert_eq!(j["step_ms"].as_array().unwrap().len(), 2);
    assert!(j["liveness"].as_array().unwrap().iter().all(|l| l["status"] == "completed" && l["stopped"] == false));
}

#[test]
fn a_clean_four_rank_dp_by_tp_run_has_no_finding() {
    let tmp = tempfile::tempdir().unwrap();
    let run = written(tmp.path(), &dp2tp2("clean4"));
    let (code, j) = ranks_json(&run);
    assert_eq!(code, 0, "{:#}", j["findings"]);
    assert_eq!(j["findings"].as_array().unwrap().len(), 0);
    // dp: weights of 2 instances; tp: all 24 tensors of 2 instances; over 20 steps.
    assert_eq!(j["checked"]["agreement_groups"].as_i64(), Some((2 * 8 + 2 * 24) * 20));
    assert_eq!(j["checked"]["amax_casts"].as_i64(), Some(4 * 24 * 20));
    assert_eq!(j["checked"]["stats_series"].as_u64(), Some(4 * 48));
    let out = analyze(&["ranks", &p(&run)]);
    assert_eq!(out.code, 0);
    assert!(out.stdout.lines().next().unwrap().contains("clean"), "{}", out.stdout);
}

#[test]
fn the_json_has_the_documented_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = dp2tp2("keys");
    spec.plants.push(Plant::Slow { rank: 3, factor: 1.6 });
    let (code, j) = ranks_json(&written(tmp.path(), &spec));
    assert_eq!(code, 1);
    let keys = |v: &Value| -> Vec<String> {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&j), ["checked", "findings", "groups", "liveness", "run", "step_ms", "steps", "world_size"]);
    assert_eq!(keys(&j["findings"][0]), ["check", "expected", "gemm", "group", "message", "module", "ranks", "role", "step", "value"]);
    assert_eq!(keys(&j["groups"][0]), ["instances", "kind", "name", "size"]);
    assert_eq!(keys(&j["step_ms"][0]), ["median_ms", "p90_ms", "rank", "steps"]);
    assert_eq!(keys(&j["liveness"][0]), ["heartbeat_at", "rank", "reason", "status", "steps_completed", "stopped"]);
    assert!(j["checked"]["not_checked"].is_array());
    assert_eq!(j["groups"][1], serde_json::json!({"name": "tp", "kind": "tp", "size": 2, "instances": 2}));
}

// ---------------------------------------------------------------- a, b: agreement and amax groups

#[test]
fn a_rank_that_skips_the_tp_reduction_disagrees_on_its_scale_and_reduced_locally() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = dp2tp2("tp-local");
    spec.plants.push(Plant::LocalAmax { rank: 3, step: 7, layer: 1, site: "fc1", role: "activation" });
    let (code, j) = ranks_json(&written(tmp.path(), &spec));
    assert_eq!(code, 1);
    assert_eq!(checks(&j), ["amax_group", "scale_disagrees"], "{:#}", j["findings"]);
    let f = assert_one(&j, "scale_disagrees", Some("layers.1.fc1"), Some("activation"), &[3], Some(7));
    assert_eq!(f["group"], "tp");
    // The halved local amax doubles the scale: a relative gap of at least 1/3 (amaxes in [1, 1.5)).
    let (v, e) = (f["value"].as_f64().unwrap(), f["expected"].as_f64().unwrap());
    assert!(v / e > 1.33, "{f:#}");
    let a = assert_one(&j, "amax_group", Some("layers.1.fc1"), Some("activation"), &[3], Some(7));
    assert_eq!((a["value"].as_str(), a["expected"].as_str(), a["group"].as_str()), (Some("local"), Some("tp"), Some("tp")));
    // The text output: a verdict, then one line per finding.
    let out = analyze(&["ranks", &p(&tmp.path().join("tp-local"))]);
    assert_eq!(out.code, 1);
    assert!(out.stdout.lines().next().unwrap().contains("2 finding(s)"), "{}", out.stdout);
    let cells = |l: &str| -> Vec<String> { l.split('|').map(|c| c.trim().to_string()).filter(|c| !c.is_empty()).collect() };
    assert!(
        out.stdout.lines().any(|l| cells(l).starts_with(&["7", "scale_disagrees", "layers.1.fc1.activation (fprop)", "3", "tp"].map(String::from))),
        "{}",
        out.stdout
    );
}

#[test]
fn a_replica_whose_weight_bytes_differ_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = dp2tp2("digest");
    spec.plants.push(Plant::Digest { rank: 2, step: 4, layer: 0, site: "qkv" });
    let (code, j) = ranks_json(&written(tmp.path(), &spec));
    assert_eq!(code, 1);
    assert_eq!(checks(&j), ["digest_disagrees"], "{:#}", j["findings"]);
    let f = assert_one(&j, "digest_disagrees", Some("layers.0.qkv"), Some("weight"), &[2], Some(4));
    assert_eq!(f["group"], "dp");
    assert_eq!(f["value"].as_i64().unwrap() - f["expected"].as_i64().unwrap(), 1);
}

#[test]
fn an_amax_reduced_over_every_rank_names_the_world() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = dp2tp2("world");
    spec.plants.push(Plant::WorldAmax { high: 0, step: 3, layer: 0, site: "fc2", role: "gradient" });
    let (code, j) = ranks_json(&written(tmp.path(), &spec));
    assert_eq!(code, 1);
    assert_eq!(checks(&j), ["amax_group"], "{:#}", j["findings"]);
    // Ranks 0 and 1 hold rank 0's amax in their tp instance; 2 and 3 do not.
    let f = assert_one(&j, "amax_group", Some("layers.0.fc2"), Some("gradient"), &[2, 3], Some(3));
    assert_eq!((f["value"].as_str(), f["expected"].as_str()), (Some("world"), Some("tp")));
}

#[test]
fn a_configured_reduction_that_did_not_happen_is_found() {
    let tmp = tempfile::tempdir().unwrap();
    // The data reduces activations over tp (the default); the manifest says over dp and tp, which
    // on a 2 × 2 mesh is every rank. The tp instance that does not hold the world's max mismatches
    // at every step, on every activation tensor.
    let run = written(tmp.path(), &dp2tp2("dp-config"));
    let mut m = Manifest::read(&run).unwrap();
    if let Some(par) = m.parallel.as_mut() {
        par.amax_groups = Some([("activation".to_string(), vec!["dp".to_string(), "tp".to_string()])].into_iter().collect());
    }
    m.write(&run).unwrap();
    let (code, j) = ranks_json(&run);
    assert_eq!(code, 1);
    // The dp replicas that should share one reduced amax do not: their scales disagree too.
    assert_eq!(checks(&j).iter().filter(|c| *c != "amax_group" && *c != "scale_disagrees").count(), 0, "{:#}", j["findings"]);
    let sd = findings(&j, "scale_disagrees");
    assert!(!sd.is_empty() && sd.iter().all(|f| f["role"] == "activation" && f["group"] == "dp"), "{:#}", j["findings"]);
    let f = findings(&j, "amax_group");
    assert_eq!(f.len(), 8, "every activation tensor: {:#}", j["findings"]);
    assert!(f.iter().all(|f| f["value"] == "tp" && f["expected"] == "world" && f["role"] == "activation" && f["step"] == 1), "{:#}", j["findings"]);
}

#[test]
fn delayed_scaling_is_not_held_to_this_steps_amaxes() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = dp2tp2("delayed");
    spec.recipe = RecipeKind::Delayed;
    spec.plants.push(Plant::LocalAmax { rank: 3, step: 7, layer: 1, site: "fc1", role: "activation" });
    let run = written(tmp.path(), &spec);
    // Casts that fp8-capture made under delayed scaling: their amax_used is a history's.
    let mut m = Manifest::read(&run).unwrap();
    m.source = RunSource::Fp8Capture;
    m.write(&run).unwrap();
    let (code, j) = ranks_json(&run);
    assert_eq!(code, 1);
    assert_eq!(checks(&j), ["scale_disagrees"]);
    let nc = j["checked"]["not_checked"].as_array().unwrap();
    assert!(nc.iter().any(|n| n.as_str().unwrap().contains("delayed scaling")), "{nc:?}");
    // A PyTorch run's casts are the module's own (torchao: dynamic scaling), whatever recipe
    // fp8scope's statistics emulate: the unreduced amax is named as such.
    m.source = RunSource::Pytorch;
    m.write(&run).unwrap();
    let (code, j) = ranks_json(&run);
    assert_eq!(code, 1);
    assert!(checks(&j).contains(&"amax_group".to_string()), "{:#}", j["findings"]);
    let f = findings(&j, "amax_group");
    assert!(f.iter().all(|f| f["module"] == "layers.1.fc1" && f["role"] == "activation" && f["value"] == "local" && f["step"] == 7), "{:#}", j["findings"]);
}

#[test]
fn ranks_come_from_the_partition_when_rows_leave_them_null() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = dp2tp2("null-ranks");
    spec.null_ranks = true;
    spec.plants.push(Plant::LocalAmax { rank: 3, step: 7, layer: 1, site: "fc1", role: "activation" });
    spec.plants.push(Plant::Slow { rank: 2, factor: 2.0 });
    let (code, j) = ranks_json(&written(tmp.path(), &spec));
    assert_eq!(code, 1);
    assert_one(&j, "scale_disagrees", Some("layers.1.fc1"), Some("activation"), &[3], Some(7));
    assert_one(&j, "straggler", None, None, &[2], Some(1));
}

// ---------------------------------------------------------------- c: statistics per rank

#[test]
fn one_ranks_underflow_and_the_first_ranks_to_go_non_finite_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = dp2tp2("stats");
    spec.plants.push(Plant::Underflow { rank: 1, step: 5, layer: 1, site: "fc2", gemm: "dgrad", role: "gradient", frac: 0.3 });
    spec.plants.push(Plant::Nan { rank: 2, step: 9, layer: 0, site: "proj", gemm: "wgrad", role: "gradient", count: 3 });
    spec.plants.push(Plant::Nan { rank: 3, step: 9, layer: 1, site: "qkv", gemm: "fprop", role: "activation", count: 2 });
    spec.plants.push(Plant::Nan { rank: 1, step: 12, layer: 0, site: "qkv", gemm: "fprop", role: "activation", count: 1 });
    let (code, j) = ranks_json(&written(tmp.path(), &spec));
    assert_eq!(code, 1);
    assert_eq!(checks(&j), ["first_nonfinite", "rank_outlier"], "{:#}", j["findings"]);
    let o = assert_one(&j, "rank_outlier", Some("layers.1.fc2"), Some("gradient"), &[1], Some(5));
    assert_eq!(o["gemm"], "dgrad");
    // 16 of 20 steps at 30%, 4 at ~1.1%.
    assert!((o["value"].as_f64().unwrap() - (16.0 * 0.3 + 4.0 * 0.011) / 20.0).abs() < 0.002, "{o:#}");
    // Ranks 2 and 3 at step 9: layer 1's forward activation runs before layer 0's wgrad.
    let n = assert_one(&j, "first_nonfinite", Some("layers.1.qkv"), Some("activation"), &[2, 3], Some(9));
    assert_eq!(n["value"].as_i64(), Some(5));
}

// ---------------------------------------------------------------- d: step time

#[test]
fn a_slow_rank_is_a_straggler() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = dp2tp2("slow");
    spec.plants.push(Plant::Slow { rank: 3, factor: 1.6 });
    let (code, j) = ranks_json(&written(tmp.path(), &spec));
    assert_eq!(code, 1);
    assert_eq!(checks(&j), ["straggler"]);
    let f = assert_one(&j, "straggler", None, None, &[3], Some(1));
    // Step times are 100 ms ± 5%: the straggler's median is 1.6× that, within 5%.
    assert!((f["value"].as_f64().unwrap() / f["expected"].as_f64().unwrap() - 1.6).abs() < 0.1, "{f:#}");
    let s = &j["step_ms"][3];
    assert_eq!((s["rank"].as_u64(), s["steps"].as_u64()), (Some(3), Some(20)));
    assert!(s["p90_ms"].as_f64().unwrap() >= s["median_ms"].as_f64().unwrap());
}

// ---------------------------------------------------------------- e: integrity audits

#[test]
fn the_integrity_audits_are_reported_per_rank() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = dp2tp2("audits");
    spec.plants.push(Plant::AuditMismatch { rank: 1, step: 10, layer: 1, site: "qkv", role: "activation", count: 5 });
    spec.plants.push(Plant::MasterMismatch { rank: 2, step: 10, layer: 0, site: "fc1", count: 12 });
    spec.plants.push(Plant::Stale { ranks: vec![0, 2], step: 15, layer: 1, site: "proj" });
    let (code, j) = ranks_json(&written(tmp.path(), &spec));
    assert_eq!(code, 1);
    assert_eq!(checks(&j), ["cast_mismatch", "forward_weight_mismatch", "stale_forward_weight"], "{:#}", j["findings"]);
    let c = assert_one(&j, "cast_mismatch", Some("layers.1.qkv"), Some("activation"), &[1], Some(10));
    assert_eq!(c["value"].as_i64(), Some(5));
    let m = assert_one(&j, "forward_weight_mismatch", Some("layers.0.fc1"), Some("weight"), &[2], Some(10));
    assert_eq!(m["value"].as_i64(), Some(12));
    let s = assert_one(&j, "stale_forward_weight", Some("layers.1.proj"), Some("weight"), &[0, 2], Some(15));
    assert!(s["message"].as_str().unwrap().contains("4 rank-step(s)"), "{s:#}");
}

// ---------------------------------------------------------------- f: liveness

#[test]
fn stopped_crashed_and_missing_ranks_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = dp2tp2("liveness");
    spec.last_step.insert(1, 12);
    spec.endings.insert(1, Ending::Stopped);
    spec.last_step.insert(2, 15);
    spec.endings.insert(2, Ending::Crashed("NCCL watchdog timeout".into()));
    spec.absent.push(3);
    let (code, j) = ranks_json(&written(tmp.path(), &spec));
    assert_eq!(code, 1);
    assert_eq!(checks(&j), ["rank_crashed", "rank_missing", "rank_stopped"], "{:#}", j["findings"]);
    let s = assert_one(&j, "rank_stopped", None, None, &[1], Some(12));
    assert!(s["message"].as_str().unwrap().contains("no heartbeat"), "{s:#}");
    let c = assert_one(&j, "rank_crashed", None, None, &[2], Some(15));
    assert!(c["message"].as_str().unwrap().contains("NCCL watchdog timeout"), "{c:#}");
    assert_one(&j, "rank_missing", None, None, &[3], None);
    let live = j["liveness"].as_array().unwrap();
    assert_eq!(live.len(), 4);
    assert_eq!((live[1]["status"].as_str(), live[1]["stopped"].as_bool(), live[1]["steps_completed"].as_u64()), (Some("running"), Some(true), Some(12)));
    assert_eq!((live[3]["status"].as_str(), live[3]["steps_completed"].as_u64()), (Some("missing"), None));
}

// ---------------------------------------------------------------- what could not be checked

#[test]
fn a_run_without_casts_or_statistics_says_what_it_could_not_check() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = dp2("bare");
    spec.casts = false;
    spec.stats = false;
    let (code, j) = ranks_json(&written(tmp.path(), &spec));
    assert_eq!(code, 0);
    let nc: Vec<&str> = j["checked"]["not_checked"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(nc.iter().any(|n| n.contains("no casts table")) && nc.iter().any(|n| n.contains("no stats table")), "{nc:?}");
    assert_eq!(j["step_ms"].as_array().unwrap().len(), 2);
}

#[test]
fn a_one_process_run_is_read_as_rank_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let run = common::fp8(tmp.path());
    let (code, j) = ranks_json(&run);
    assert_eq!(code, 0, "{:#}", j["findings"]);
    assert_eq!((j["world_size"].as_u64(), j["liveness"][0]["status"].as_str()), (Some(1), Some("completed")));
    let nc: Vec<&str> = j["checked"]["not_checked"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(nc.iter().any(|n| n.contains("one rank")), "{nc:?}");
}

// ---------------------------------------------------------------- bad input

#[test]
fn bad_input_exits_2_with_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    analyze(&["ranks", "/no/such/run"]).assert_one_line_error(2, &["/no/such/run"]);
    analyze(&["ranks", &p(tmp.path())]).assert_one_line_error(2, &["not an fp8scope run directory"]);
    // --rank narrows other commands to one rank; this one compares them all.
    analyze(&["ranks", &p(&written(tmp.path(), &dp2("one"))), "--rank", "1"]).assert_one_line_error(2, &["--rank 1", "every rank"]);
    // A truncated part is named (and skipped under --lenient).
    let run = written(tmp.path(), &dp2("cut"));
    let part = run.join("casts/rank=00001/part-00001.parquet");
    let bytes = std::fs::read(&part).unwrap();
    std::fs::write(&part, &bytes[..bytes.len() / 2]).unwrap();
    analyze(&["ranks", &p(&run)]).assert_one_line_error(2, &["rank=00001/part-00001.parquet", "--lenient"]);
    let out = analyze(&["ranks", &p(&run), "--lenient", "--json"]);
    assert!(out.stderr.contains("warning"), "{}", out.stderr);
    assert_eq!(out.json()["checked"]["skipped_parts"].as_array().unwrap().len(), 1);
}
