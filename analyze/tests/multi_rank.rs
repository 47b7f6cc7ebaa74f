//! The analyzer's commands on a run of several ranks (tables partitioned by rank, a liveness file per
//! rank): which rank each command reads, `--rank`, how each rank ended (a rank killed without
//! closing, a rank that crashed), the report's per-rank chart, and Transformer Engine logs of
//! several ranks imported into rank partitions.

mod common;

use arrow::array::{ArrayRef, Int32Array};
use arrow::record_batch::RecordBatch;
use common::{analyze, base_loss, p};
use fp8scope_schemas::layout::{RunDir, Table};
use fp8scope_schemas::manifest::{DataInfo, DeviceInfo, Manifest, Origin, RunSource, RunStatus};
use fp8scope_schemas::names::{Gemm, Role};
use fp8scope_schemas::parts::write_part;
use fp8scope_schemas::ranks::{GroupKind, Parallel, ProcessGroup, RankInfo, RankLiveness, host_name};
use fp8scope_schemas::tables::{ExternalStatRow, Row, StepRow};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const STEPS: u32 = 60;
const MODULES: [&str; 2] = ["layers.0.fc1", "layers.0.fc2"];

/// `batch` with its `rank` column (the last) set to `rank`.
fn with_rank(batch: RecordBatch, rank: u32) -> RecordBatch {
    let mut cols: Vec<ArrayRef> = batch.columns().to_vec();
    let last = cols.len() - 1;
    assert_eq!(batch.schema().field(last).name(), "rank");
    cols[last] = Arc::new(Int32Array::from(vec![rank as i32; batch.num_rows()]));
    RecordBatch::try_new(batch.schema(), cols).unwrap()
}

/// Each rank's loss: the baseline's curve, shifted by the rank (each sees its own shard).
fn loss_of(rank: u32, step: u32) -> f64 {
    base_loss(step) + 0.25 * rank as f64
}

/// How a rank of the planted run ends.
#[derive(Clone, Copy, PartialEq)]
enum End {
    Completed,
    /// Killed without closing after `steps` steps: its process (pid 0) is gone.
    Killed(u32),
    Crashed(u32),
}

fn write_job(parent: &Path, name: &str, ends: &[End]) -> PathBuf {
    let dir = parent.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let run = RunDir::new(&dir);
    let world = ends.len() as u32;
    let device = DeviceInfo { kind: "cpu".into(), name: "test".into(), compute_capability: None, parallelism: 1, block_gemm: None };
    let mut m = Manifest::new_running(
        name.into(),
        common::config(fp8scope_schemas::config::RecipeKind::Current),
        device,
        DataInfo { entropy_floor: None, ln_vocab: 6.0 },
    );
    m.source = RunSource::Pytorch;
    m.origin = Some(Origin { framework: "torch (test)".into(), modules: MODULES.map(String::from).to_vec(), ..Default::default() });
    m.world_size = Some(world);
    m.parallel = Some(Parallel {
        launcher: "torchrun".into(),
        backend: Some("gloo".into()),
        groups: vec![ProcessGroup { name: "dp".into(), kind: GroupKind::Dp, members: vec![(0..world).collect()] }],
        wrappers: vec!["DDP".into()],
        ..Default::default()
    });
    let host = host_name().unwrap_or_else(|| "localhost".into());
    m.ranks = (0..world).map(|r| RankInfo { rank: r, local_rank: Some(r), host: host.clone(), pid: 0, device: Some("cpu".into()) }).collect();
    for (rank, end) in ends.iter().enumerate() {
        let rank = rank as u32;
        for table in [Table::Steps, Table::Stats] {
            std::fs::create_dir_all(run.rank_table_dir(table, rank)).unwrap();
        }
        let last = match end {
            End::Completed => STEPS,
            End::Killed(s) | End::Crashed(s) => *s,
        };
        let steps: Vec<StepRow> = (1..=last)
            .map(|s| StepRow {
                step: s,
                loss: loss_of(rank, s),
                grad_norm: 1.0,
                lr: 1e-3,
                tokens: 256,
                step_ms: 10.0 + rank as f64,
                nonfinite_tensors: 0,
                rank: Some(rank),
            })
            .collect();
        write_part(&run.rank_part(Table::Steps, rank, 0), Table::Steps, &with_rank(StepRow::to_batch(&steps), rank)).unwrap();
        let mut stats = Vec::new();
        for s in 1..=last {
            for module in MODULES {
                for (gemm, role) in [(Gemm::Fprop, Role::Activation), (Gemm::Fprop, Role::Weight), (Gemm::Dgrad, Role::Gradient)] {
                    let mut r = ExternalStatRow::new(s, Some(rank), module, gemm, role);
                    r.format = Some("e4m3".into());
                    r.underflow_frac = Some(if role == Role::Gradient { 0.01 * (rank + 1) as f64 } else { 0.0 });
                    r.saturated_frac = Some(0.0);
                    r.amax = Some(1.0);
                    stats.push(r);
                }
            }
        }
        write_part(&run.rank_part(Table::Stats, rank, 0), Table::Stats, &ExternalStatRow::to_batch(&stats)).unwrap();
        let (status, error) = match end {
            End::Completed => (RunStatus::Completed, None),
            End::Killed(_) => (RunStatus::Running, None),
            End::Crashed(_) => (RunStatus::Crashed, Some("crashed: RuntimeError: boom (after step 20)".to_string())),
        };
        RankLiveness {
            rank,
            host: host.clone(),
            // pid 0 is no user process: a `running` record of it is a process that is gone.
            pid: 0,
            status,
            started_at: m.started_at.clone(),
            heartbeat_at: m.started_at.clone(),
            ended_at: (status != RunStatus::Running).then(|| m.started_at.clone()),
            steps_completed: last,
            heartbeat_every_s: Some(1.0),
            error,
            rows: Default::default(),
        }
        .write(&dir)
        .unwrap();
    }
    m.status = RunStatus::Completed;
    m.steps_completed = STEPS;
    m.pid = None;
    m.write(&dir).unwrap();
    dir
}

#[test]
fn one_rank_commands_read_the_lowest_rank_unless_told_and_say_so() {
    let tmp = tempfile::tempdir().unwrap();
    let run = write_job(tmp.path(), "ddp", &[End::Completed, End::Completed]);
    let o = analyze(&["summary", &p(&run), "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v = o.json();
    assert_eq!(v["rank_view"], 0);
    let last = v["checkpoints"].as_array().unwrap().iter().find(|c| c["at"] == "last").unwrap().clone();
    assert!((last["loss"].as_f64().unwrap() - loss_of(0, STEPS)).abs() < 1e-12, "{last}");
    assert_eq!(v["steps_recorded"], STEPS, "rank 0's steps only, not both ranks'");
    // The statistics are every rank's: the gradient's underflow averages ranks 0 (1%) and 1 (2%).
    let grad = v["worst_underflow"].as_array().unwrap().iter().find(|t| t["role"] == "gradient").unwrap().clone();
    assert!((grad["mean_underflow_frac"].as_f64().unwrap() - 0.015).abs() < 1e-12, "{grad}");
    let text = analyze(&["summary", &p(&run)]).stdout;
    assert!(text.contains("ranks      2 on 1 host(s), dp 1×2") && text.contains("the loss below is rank 0's"), "{text}");

    // --rank 1: rank 1's parts alone, of every table.
    let v = analyze(&["summary", &p(&run), "--rank", "1", "--json"]).json();
    let last = v["checkpoints"].as_array().unwrap().iter().find(|c| c["at"] == "last").unwrap().clone();
    assert!((last["loss"].as_f64().unwrap() - loss_of(1, STEPS)).abs() < 1e-12, "{last}");
    let grad = v["worst_underflow"].as_array().unwrap().iter().find(|t| t["role"] == "gradient").unwrap().clone();
    assert!((grad["mean_underflow_frac"].as_f64().unwrap() - 0.02).abs() < 1e-12, "{grad}");
    analyze(&["summary", &p(&run), "--rank", "7"]).assert_one_line_error(2, &["--rank 7", "no parts of rank 7", "0-1"]);

    // anomalies reads one loss curve (two interleaved ones would look like spikes).
    let o = analyze(&["anomalies", &p(&run), "--json"]);
    assert_eq!(o.code, 0, "{}\n{}", o.stdout, o.stderr);

    // query reads every rank, with the rank in every row.
    let o = analyze(&["query", &p(&run), "--format", "csv", "--sql", "SELECT rank, COUNT(*) AS n FROM steps GROUP BY rank ORDER BY rank"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.stdout.trim().lines().skip(1).collect::<Vec<_>>(), ["0,60", "1,60"], "{}", o.stdout);
    let o = analyze(&["query", &p(&run), "--rank", "1", "--format", "csv", "--sql", "SELECT DISTINCT rank FROM stats"]);
    assert_eq!(o.stdout.trim().lines().skip(1).collect::<Vec<_>>(), ["1"], "{}", o.stdout);
}

#[test]
fn summary_names_the_rank_that_stopped_without_closing_and_the_one_that_crashed() {
    let tmp = tempfile::tempdir().unwrap();
    let run = write_job(tmp.path(), "killed", &[End::Completed, End::Killed(40), End::Completed, End::Crashed(20)]);
    let v = analyze(&["summary", &p(&run), "--json"]).json();
    let lv = &v["liveness"];
    assert_eq!(lv["world_size"], 4);
    assert!(lv["status"].as_str().unwrap().starts_with("stopped without closing (rank 1 first, after step 40"), "{lv}");
    assert_eq!(lv["ranks"][1]["stopped"], true);
    assert!(lv["ranks"][1]["reason"].as_str().unwrap().contains("is gone"), "{lv}");
    assert_eq!((lv["ranks"][3]["status"].as_str(), lv["ranks"][3]["stopped"].as_bool()), (Some("crashed"), Some(false)));
    let text = analyze(&["summary", &p(&run)]).stdout;
    assert!(text.contains("rank 1     stopped without closing") && text.contains("after step 40"), "{text}");
    assert!(text.contains("rank 3     crashed after step 20: crashed: RuntimeError: boom"), "{text}");

    let crashed = write_job(tmp.path(), "crashed", &[End::Completed, End::Crashed(20)]);
    let v = analyze(&["summary", &p(&crashed), "--json"]).json();
    assert_eq!(v["liveness"]["status"], "crashed on rank 1 after step 20");

    // A rank the world size counts that left nothing (no liveness file, no part) is missing.
    let dir = RunDir::new(&crashed);
    std::fs::remove_file(dir.rank_file(1)).unwrap();
    for table in [Table::Steps, Table::Stats] {
        std::fs::remove_dir_all(dir.rank_table_dir(table, 1)).unwrap();
    }
    let v = analyze(&["summary", &p(&crashed), "--json"]).json();
    assert_eq!(v["liveness"]["missing"], serde_json::json!([1]));
}

#[test]
fn the_report_draws_each_ranks_loss_and_step_time() {
    let tmp = tempfile::tempdir().unwrap();
    let run = write_job(tmp.path(), "ddp", &[End::Completed, End::Completed, End::Killed(30)]);
    let out = tmp.path().join("report");
    let o = analyze(&["report", &p(&run), "--out", &p(&out), "--json"]);
    assert!(o.code == 0 || o.code == 1, "{}", o.stderr);
    let v = o.json();
    let chart = v["charts"].as_array().unwrap().iter().find(|c| c["kind"] == "ranks").unwrap_or_else(|| panic!("no per-rank chart: {v}")).clone();
    assert!(out.join(chart["file"].as_str().unwrap()).is_file());
    assert!(chart["caption"].as_str().unwrap().contains("slowest rank 2 (12.0 ms), fastest rank 0 (10.0 ms)"), "{chart}");
    let findings = v["runs"][0]["findings"].as_array().unwrap();
    assert!(findings.iter().any(|f| f.as_str().unwrap().contains("stopped without closing (rank 2 first, after step 30")), "{findings:?}");
    assert!(findings.iter().any(|f| f.as_str().unwrap().contains("rank 0 of 3")), "{findings:?}");
}

#[test]
fn transformer_engine_logs_of_several_ranks_import_into_rank_partitions() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = common::package_dir().join("tests/fixtures/te_debug/multi_rank");
    let out = tmp.path().join("te");
    let o = analyze(&["import", "te-debug", &p(&logs), "--out", &p(&out), "--recipe", "delayed"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let run = RunDir::new(&out);
    assert_eq!(run.partitions(Table::Stats).unwrap().iter().map(|(r, _)| *r).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(Manifest::read(&out).unwrap().world_size, Some(2));
    let o = analyze(&["query", &p(&out), "--format", "csv", "--sql", "SELECT COUNT(DISTINCT rank) AS n FROM stats"]);
    assert_eq!(o.stdout.trim().lines().nth(1), Some("2"), "{}", o.stdout);
}
