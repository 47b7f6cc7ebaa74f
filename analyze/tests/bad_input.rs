//! Bad input gets one line on stderr naming what is wrong and exit status 2, never a panic: a path
//! that is not a run, a truncated part (named; skipped with a warning under --lenient), another
//! schema version, runs that cannot be compared (model shape, dump selection, no common steps),
//! SQL errors, bad flag values.

mod common;

use common::*;
use fp8scope_schemas::config::RecipeKind;
use fp8scope_schemas::layout::{RunDir, Table};

#[test]
fn a_directory_that_is_not_a_run_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for cmd in [vec!["summary"], vec!["anomalies"], vec!["query", "--sql", "SELECT * FROM steps"]] {
        let mut args: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
        args.push(p(tmp.path()));
        analyze(&args).assert_one_line_error(2, &["not an fp8scope run directory", &p(tmp.path())]);
    }
    analyze(&["summary", "/no/such/run"]).assert_one_line_error(2, &["/no/such/run"]);
}

#[test]
fn a_truncated_part_is_named_and_skipped_only_with_lenient() {
    let tmp = tempfile::tempdir().unwrap();
    let run = fp8(tmp.path());
    let part = RunDir::new(&run).part(Table::Stats, 1);
    let bytes = std::fs::read(&part).unwrap();
    std::fs::write(&part, &bytes[..bytes.len() / 2]).unwrap();

    analyze(&["summary", &p(&run)]).assert_one_line_error(2, &["stats/part-00001.parquet", "--lenient"]);

    let out = analyze(&["summary", &p(&run), "--lenient", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stderr.contains("warning") && out.stderr.contains("part-00001.parquet"), "{}", out.stderr);
    let j = out.json();
    assert_eq!(j["skipped_parts"].as_array().unwrap().len(), 1);
    // The steps table is whole; stats lost steps 51..=100 but the rest is read.
    assert_eq!(j["steps_recorded"], 200);
}

#[test]
fn a_bad_part_of_a_table_the_command_does_not_read_stops_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let run = fp8(tmp.path());
    std::fs::write(RunDir::new(&run).part(Table::Tensors, 0), b"garbage").unwrap();
    let out = analyze(&["summary", &p(&run), "--json"]);
    assert_eq!((out.code, out.stderr.as_str()), (0, ""));
    // A query that reads the tensors table finds it.
    analyze(&["query", &p(&run), "--sql", "SELECT COUNT(*) FROM steps"]).assert_one_line_error(2, &["tensors/part-00000.parquet"]);
}

#[test]
fn a_truncated_tensors_part_stops_compare_with_its_name() {
    let tmp = tempfile::tempdir().unwrap();
    let (run, base) = (fp8(tmp.path()), bf16(tmp.path()));
    let part = RunDir::new(&base).part(Table::Tensors, 2);
    std::fs::write(&part, b"PAR1 not really").unwrap();
    analyze(&["compare", &p(&run), "--baseline", &p(&base)]).assert_one_line_error(2, &["tensors/part-00002.parquet"]);
    // Lenient: the steps of the skipped part are simply not common.
    let out = analyze(&["compare", &p(&run), "--baseline", &p(&base), "--json", "--lenient"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    let steps = out.json()["common_steps"].as_array().unwrap().len();
    assert_eq!(steps, dump_steps(STEPS).len() - 5, "one part of five dump steps skipped");
}

#[test]
fn a_run_of_another_schema_version_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let run = bf16(tmp.path());
    let path = run.join("run.json");
    let current = format!("\"schema_version\": {}", fp8scope_schemas::SCHEMA_VERSION);
    let text = std::fs::read_to_string(&path).unwrap().replace(&current, "\"schema_version\": 99");
    std::fs::write(&path, text).unwrap();
    analyze(&["summary", &p(&run)]).assert_one_line_error(2, &["schema version 99", "run.json"]);
}

#[test]
fn runs_of_different_model_shapes_cannot_be_compared() {
    let tmp = tempfile::tempdir().unwrap();
    let run = fp8(tmp.path());
    let mut plan = Plan::new("wide", RecipeKind::Bf16);
    plan.config.model.channels = 128;
    plan.config.model.heads = 8;
    let other = write_run(tmp.path(), &plan);
    for cmd in ["compare", "locate", "anomalies"] {
        analyze(&[cmd, &p(&run), "--baseline", &p(&other)])
            .assert_one_line_error(2, &["runs cannot be compared", "different model shapes", "channels 64 vs 128", "heads 4 vs 8"]);
    }
}

#[test]
fn runs_with_different_dump_selections_cannot_be_compared() {
    let tmp = tempfile::tempdir().unwrap();
    let run = fp8(tmp.path());
    let mut plan = Plan::new("fewer", RecipeKind::Bf16);
    plan.config.record.dump_layers = "layers\\.1\\..*".into();
    let other = write_run(tmp.path(), &plan);
    analyze(&["compare", &p(&run), "--baseline", &p(&other)]).assert_one_line_error(2, &["different dump selections", "dump_layers '.*' vs 'layers\\.1\\..*'"]);
}

#[test]
fn runs_without_common_steps_cannot_be_compared() {
    let tmp = tempfile::tempdir().unwrap();
    let run = fp8(tmp.path());
    let mut plan = Plan::new("late", RecipeKind::Bf16);
    plan.dump_steps = vec![5, 15, 25];
    let other = write_run(tmp.path(), &plan);
    analyze(&["compare", &p(&run), "--baseline", &p(&other)])
        .assert_one_line_error(2, &["no common dump steps", "21 steps from 1 to 200", "3 steps from 5 to 25"]);
    let mut plan = Plan::new("later", RecipeKind::Bf16);
    plan.steps = (300..400).collect();
    let other = write_run(tmp.path(), &plan);
    analyze(&["anomalies", &p(&run), "--baseline", &p(&other)]).assert_one_line_error(2, &["no common recorded steps"]);
}

/// Rewrites the only tensors part of `run` with its rows reordered by `order` (row indices).
fn reorder_tensors(run: &std::path::Path, order: impl Fn(usize) -> Vec<u32>) {
    let dir = RunDir::new(run);
    let parts = dir.parts(Table::Tensors).unwrap();
    assert_eq!(parts.len(), 1);
    let batches = fp8scope_schemas::parts::read_part(&parts[0], Table::Tensors).unwrap();
    let b = arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap();
    let idx = arrow::array::UInt32Array::from(order(b.num_rows()));
    let cols = b.columns().iter().map(|c| arrow::compute::take(c, &idx, None).unwrap()).collect();
    let reordered = arrow::record_batch::RecordBatch::try_new(b.schema(), cols).unwrap();
    fp8scope_schemas::parts::write_part(&parts[0], Table::Tensors, &reordered).unwrap();
}

#[test]
fn tensors_in_another_order_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let run = fp8(tmp.path());
    let mut plan = Plan::new("reversed", RecipeKind::Bf16);
    plan.dump_steps = vec![1, 10];
    let other = write_run(tmp.path(), &plan);
    // Within step 1 (the first half of the rows), the last tensor comes first.
    reorder_tensors(&other, |n| (0..n as u32 / 2).rev().chain(n as u32 / 2..n as u32).collect());
    analyze(&["compare", &p(&run), "--baseline", &p(&other)]).assert_one_line_error(
        2,
        &["the dumped tensors differ at step 1", "run 'fp8' has layers.0.qkv.activation (offset 0)", "baseline 'reversed' has layers.1.fc2.wgrad"],
    );
}

#[test]
fn tensors_out_of_step_order_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let run = fp8(tmp.path());
    let mut plan = Plan::new("swapped", RecipeKind::Bf16);
    plan.dump_steps = vec![1, 10];
    let other = write_run(tmp.path(), &plan);
    // Step 10's rows first, then step 1's.
    reorder_tensors(&other, |n| (n as u32 / 2..n as u32).chain(0..n as u32 / 2).collect());
    analyze(&["compare", &p(&run), "--baseline", &p(&other)]).assert_one_line_error(2, &["run 'swapped'", "not in step order (step 1 follows step 10)"]);
}

#[test]
fn sql_errors_show_polars_message() {
    let tmp = tempfile::tempdir().unwrap();
    let run = bf16(tmp.path());
    analyze(&["query", &p(&run), "--sql", "SELEC step FROM steps"]).assert_one_line_error(2, &["SQL error"]);
    analyze(&["query", &p(&run), "--sql", "SELECT * FROM nope"]).assert_one_line_error(2, &["nope"]);
    let out = analyze(&["query", &p(&run), "--sql", "SELECT no_such_column FROM steps"]);
    out.assert_one_line_error(2, &["no_such_column"]);
}

#[test]
fn bad_flags_are_one_line_too() {
    let tmp = tempfile::tempdir().unwrap();
    let run = bf16(tmp.path());
    analyze(&["anomalies", &p(&run), "--drift-alpha", "0"]).assert_one_line_error(2, &["--drift-alpha must be in (0, 1]"]);
    analyze(&["anomalies", &p(&run), "--spike-window", "1"]).assert_one_line_error(2, &["--spike-window"]);
    analyze(&["anomalies", &p(&run), "--spike-min-gap", "nan"]).assert_one_line_error(2, &["--spike-min-gap"]);
    analyze(&["compare", &p(&run)]).assert_one_line_error(2, &["--baseline"]);
    analyze(&["query", &p(&run), "--sql", "SELECT 1", "--format", "parquet"]).assert_one_line_error(2, &["--output"]);
    analyze(&["locate", &p(&run)]).assert_one_line_error(2, &["no shadow records", "--baseline"]);
    analyze(&["frobnicate"]).assert_one_line_error(2, &["frobnicate"]);
}
