//! Runs that fp8-capture did not record, through the real `fp8-analyze` binary: a Transformer
//! Engine debug log imported with `import te-debug` (summary, query, locate, anomalies, compare and
//! report read it and say what it lacks), and a run as the PyTorch recorder writes it (a
//! hand-written manifest with source "pytorch" and its origin, stats written by the schemas
//! crate's writers) read by summary and compare.

mod common;

use common::{bin, repo_root};
use fp8scope_schemas::layout::RunDir;
use fp8scope_schemas::names::{Gemm, Role};
use fp8scope_schemas::parts::PartWriter;
use fp8scope_schemas::tables::{ExternalStatRow, StepRow};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn analyze(args: &[&str]) -> Output {
    Command::new(bin("fp8-analyze")).args(args).output().expect("spawn fp8-analyze")
}

/// Runs `fp8-analyze` expecting exit status `code`; returns stdout.
fn ok(args: &[&str], code: i32) -> String {
    let o = analyze(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "fp8-analyze {args:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn json(args: &[&str], code: i32) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    serde_json::from_str(&ok(&a, code)).expect("JSON output")
}

#[test]
fn an_imported_transformer_engine_log_is_a_run_every_command_reads() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("te");
    let r = run.to_str().unwrap();
    let logs = repo_root().join("analyze/tests/fixtures/te_debug/multi_rank");
    let imp = json(&["import", "te-debug", logs.to_str().unwrap(), "--out", r], 0);
    assert_eq!((imp["ranks"].clone(), imp["stats_decimals"].as_u64()), (serde_json::json!([0, 1]), Some(4)));
    // A second import into the same directory is refused in one line; the run stays.
    let o = analyze(&["import", "te-debug", logs.to_str().unwrap(), "--out", r]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!((o.status.code(), err.trim_end().lines().count()), (Some(2), 1), "{err}");
    assert!(err.contains("already holds a run"), "{err}");

    // summary: where it came from, what it lacks, module paths, the rounding caveat.
    let s = json(&["summary", r], 0);
    assert_eq!(s["provenance"]["source"], "te-debug");
    assert_eq!(s["provenance"]["stats_decimals"], 4);
    for l in ["loss", "dumps", "shadow"] {
        assert!(s["provenance"]["lacks"].as_array().unwrap().iter().any(|x| x == l), "lacks {l}: {}", s["provenance"]);
    }
    assert_eq!(s["worst_underflow"][0]["tensor"], "model.output_layer.gradient", "named by module path");
    let text = ok(&["summary", r], 0);
    assert!(text.contains("lacks      a loss curve") && text.contains("rounded to 4 decimals"), "{text}");

    // query: both ranks, and the kept statistics.
    let q = json(&["query", r, "--sql", "SELECT rank, COUNT(*) AS n FROM stats GROUP BY rank ORDER BY rank"], 0);
    assert_eq!(q.as_array().unwrap().iter().map(|x| x["rank"].as_i64().unwrap()).collect::<Vec<_>>(), vec![0, 1]);
    let q = json(&["query", r, "--sql", "SELECT step, rank, module, value FROM extra_stats WHERE stat = 'l1_norm'"], 0);
    assert_eq!(q.as_array().unwrap().len(), 24, "3 modules × 4 steps × 2 ranks");

    // locate: no shadow, no dumps: ranked from the statistics, saying so, with the caveat.
    let l = json(&["locate", r], 0);
    assert_eq!((l["method"].as_str(), l["ranked_by"].as_str()), (Some("stats"), Some("cast loss")));
    assert!(l["note"].as_str().unwrap().contains("lacks shadow GEMM records"), "{}", l["note"]);
    assert!(l["stats_caveat"].as_str().unwrap().contains("4 decimals"));
    assert_eq!(l["ranked"][0]["gemm_name"], "model.output_layer.dgrad");
    // gradient underflows% at iteration 3 of model.output_layer: 12.5 + 2 + 3 = 17.5%.
    assert!((l["ranked"][0]["peak_error"].as_f64().unwrap() - 0.175).abs() < 1e-9);

    // anomalies: no loss curve, said plainly; nothing found in the statistics.
    let a = json(&["anomalies", r], 0);
    assert!(a["unavailable"][0].as_str().unwrap().contains("lacks a loss curve"), "{}", a["unavailable"]);
    // compare against itself: no dumps to compare, said plainly, exit 0.
    let c = json(&["compare", r, "--baseline", r], 0);
    assert!(c["unavailable"].as_str().unwrap().contains("lacks dumped tensors"), "{}", c["unavailable"]);

    // report: no empty loss chart, the statistics' charts, the caveat in the findings.
    let out = tmp.path().join("report");
    let rep = json(&["report", r, "--out", out.to_str().unwrap()], 0);
    let kinds: Vec<&str> = rep["charts"].as_array().unwrap().iter().map(|c| c["kind"].as_str().unwrap()).collect();
    assert!(!kinds.contains(&"loss") && kinds.contains(&"heatmap-underflow") && kinds.contains(&"sites"), "{kinds:?}");
    for c in rep["charts"].as_array().unwrap() {
        assert!(out.join(c["file"].as_str().unwrap()).is_file());
    }
    let findings = rep["runs"][0]["findings"].to_string();
    assert!(findings.contains("rounded to 4 decimals") && findings.contains("model.output_layer.dgrad"), "{findings}");
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(html.contains("no run has a loss curve"), "the page says why there is no loss chart");
}

/// A run directory as the PyTorch recorder writes it: `run.json` by hand, per the contract.
fn pytorch_run(dir: &Path, name: &str, scale: f64) {
    std::fs::create_dir_all(dir).unwrap();
    let modules = ["blocks.0.attn.qkv", "blocks.0.mlp.fc1", "lm_head"];
    let rd = RunDir::new(dir);
    let mut stats = PartWriter::<ExternalStatRow>::new(&rd).unwrap();
    let mut steps = PartWriter::<StepRow>::new(&rd).unwrap();
    for step in 1..=3u32 {
        steps.push(StepRow { step, loss: 3.0 - 0.1 * step as f64, grad_norm: 1.0, lr: 1e-3, tokens: 1024, step_ms: 10.0, nonfinite_tensors: 0, rank: None });
        for (i, m) in modules.iter().enumerate() {
            for (gemm, role) in [(Gemm::Fprop, Role::Activation), (Gemm::Fprop, Role::Weight), (Gemm::Dgrad, Role::Gradient)] {
                let mut r = ExternalStatRow::new(step, None, m, gemm, role);
                r.format = Some(if role == Role::Gradient { "e5m2" } else { "e4m3" }.into());
                r.amax = Some(1.0);
                r.underflow_frac = Some(scale * 0.01 * (i + 1) as f64 * if role == Role::Gradient { 3.0 } else { 1.0 });
                r.saturated_frac = Some(0.0);
                stats.push(r);
            }
        }
    }
    stats.flush().unwrap();
    steps.flush().unwrap();
    let manifest = serde_json::json!({
        "schema_version": 2, "name": name, "status": "completed", "writer": "fp8scope python recorder 0.1.0",
        "config": {
            "preset": "pytorch",
            "model": {"vocab": 0, "channels": 0, "ffn": 0, "heads": 0, "layers": 1, "batch": 0, "seq": 0, "attn_mask": "causal"},
            "recipe": {"kind": "current", "format": "hybrid", "amax_history": 1, "amax_algo": "max", "margin": 0},
            "routing": {"bf16_gemms": [], "bf16_layers": [], "bf16_sites": []},
            "data": {"kind": "external", "path": null, "language_seed": 0, "branching": 0, "topics": 0},
            "train": {"steps": 3, "lr": 0.001, "warmup_steps": 0, "weight_decay": 0.0, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "grad_clip": 1.0, "seed": 0},
            "record": {"stats_every": 1, "quant_error_every": 1, "dump_every": 0, "dump_layers": "", "dump_roles": [], "dump_max_elems": 0, "dump_sample": "first", "shadow": false, "flush_every": 1},
            "injections": [], "scenario": null, "device": "cuda"
        },
        "device": {"kind": "cuda", "name": "NVIDIA H200", "compute_capability": "9.0", "parallelism": 132, "block_gemm": null},
        "libraries": {"torch": "2.5.1"},
        "data": {"entropy_floor": null, "ln_vocab": 0.0},
        "started_at": "2026-01-01T00:00:00Z", "ended_at": "2026-01-01T00:01:00Z",
        "steps_completed": 3, "final_loss": 2.8,
        "rows": {"steps": 3, "stats": 27, "tensors": 0, "events": 0, "shadow": 0},
        "error": null, "command": ["python", "train.py"], "pid": null,
        "source": "pytorch",
        "origin": {"framework": "torch 2.5.1", "modules": modules, "stats_decimals": null, "lacks": ["dumps", "shadow"], "notes": ["written by hand per the contract"]}
    });
    std::fs::write(dir.join("run.json"), serde_json::to_string_pretty(&manifest).unwrap()).unwrap();
}

#[test]
fn a_run_written_by_the_pytorch_recorder_is_read_by_summary_and_compare() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("torch-fp8"), tmp.path().join("torch-bf16"));
    pytorch_run(&a, "torch-fp8", 1.0);
    pytorch_run(&b, "torch-bf16", 0.0);
    let (ra, rb) = (a.to_str().unwrap(), b.to_str().unwrap());
    let s = json(&["summary", ra], 0);
    assert_eq!(s["provenance"]["source"], "pytorch");
    assert_eq!(s["provenance"]["framework"], "torch 2.5.1");
    assert!(s["provenance"]["stats_decimals"].is_null() && s["provenance"]["stats_caveat"].is_null());
    assert_eq!(s["steps_recorded"], 3);
    assert_eq!(s["worst_underflow"][0]["tensor"], "lm_head.gradient", "module path alone, no layers.N prefix");
    assert!((s["worst_underflow"][0]["mean_underflow_frac"].as_f64().unwrap() - 0.09).abs() < 1e-12);
    let text = ok(&["summary", ra], 0);
    assert!(text.contains("source     pytorch (torch 2.5.1)") && text.contains("lacks      dumped tensors, shadow GEMM records"), "{text}");
    let c = json(&["compare", ra, "--baseline", rb], 0);
    assert!(c["unavailable"].as_str().unwrap().contains("lacks dumped tensors"), "{c}");
    assert_eq!(c["tensors"].as_array().unwrap().len(), 0);
    let text = ok(&["compare", ra, "--baseline", rb], 0);
    assert!(text.contains("nothing compared"), "{text}");
}

/// Logs written by nvdlfw_inspect 0.2.2 itself (its LogTensorStats feature through its YAML config,
/// `bench/te_debug_logs.py` on an H200 with torch, 40 steps of a two-Linear MLP) import whole.
#[test]
fn real_nvdlfw_inspect_logs_import_line_for_line() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("real");
    let r = run.to_str().unwrap();
    let logs = repo_root().join("analyze/tests/fixtures/te_debug/real_nvdlfw_0.2.2_torch");
    let imp = json(&["import", "te-debug", logs.to_str().unwrap(), "--out", r], 0);
    assert_eq!(imp["stats_decimals"].as_u64(), Some(4), "{imp}");
    let count = |sql: &str| json(&["query", r, "--sql", sql], 0)[0]["n"].as_i64().unwrap_or(-1);
    // 2640 lines: min, max, mean, std map to columns; l1_norm and l2_norm are kept under their names.
    assert_eq!(count("SELECT CAST(COUNT(*) AS BIGINT) AS n FROM extra_stats"), 880);
    assert_eq!(count("SELECT CAST(COUNT(DISTINCT module) AS BIGINT) AS n FROM stats"), 2);
    assert_eq!(count("SELECT CAST(MAX(step) AS BIGINT) AS n FROM stats"), 40);
    let s = ok(&["summary", r], 0);
    assert!(s.contains("model.0") && s.contains("rounded to 4 decimals"), "{s}");
}
