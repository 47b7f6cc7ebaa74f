//! `bench/speed_summary.py`, the verdicts of the GPU speed benchmark (`bench/speed.sh`), on rows
//! written here (no GPU needed): a target measured once is met or missed; the statistics cost and
//! the FP8 speed-up, measured over repeated pairs of runs, are met only when every pair meets them,
//! missed when none does, and unsettled when the pairs straddle the target; the repeats stay out of
//! the table; bad input gets one line and a non-zero exit.

mod common;

use common::repo_root;
use std::path::Path;
use std::process::{Command, Output};

/// A row as `runs.py speed` writes it.
fn row(run: &str, median_ms: f64) -> String {
    format!(r#"{{"run": "{run}", "steps": 12, "median_ms": {median_ms}, "mean_ms": {median_ms}, "tokens": 16384, "peak_mib": 1000}}"#)
}

fn summarise(dir: &Path, rows: &[String]) -> (Output, String) {
    let jsonl = dir.join("speed.jsonl");
    std::fs::write(&jsonl, rows.join("\n") + "\n").unwrap();
    let md = dir.join("rows.md");
    let out = Command::new("python3")
        .arg(repo_root().join("bench/speed_summary.py"))
        .arg(&jsonl)
        .arg(&md)
        .output()
        .expect("python3 must be installed");
    let text = std::fs::read_to_string(&md).unwrap_or_default();
    (out, text)
}

/// The seed b32 rows of one speed.sh call, the statistics pair repeated with the given medians.
fn b32_rows(pairs: &[(f64, f64)]) -> Vec<String> {
    let mut rows = vec![row("seed-bf16-b32", 67.5), row("seed-bf16-nostats-b32", 64.7)];
    for (k, &(with, without)) in pairs.iter().enumerate() {
        let tag = if k == 0 { String::new() } else { format!("-r{k}") };
        rows.push(row(&format!("seed-delayed-b32{tag}"), with));
        rows.push(row(&format!("seed-delayed-nostats-b32{tag}"), without));
    }
    rows
}

fn stats_line(text: &str) -> &str {
    text.lines().find(|l| l.starts_with("- seed b32, statistics every step")).expect("no statistics line")
}

#[test]
fn the_statistics_cost_is_judged_over_every_pair() {
    let dir = tempfile::tempdir().unwrap();
    // Every pair within 3%: met, with the median and the range.
    let (out, text) = summarise(dir.path(), &b32_rows(&[(59.0, 58.0), (58.5, 58.0), (59.2, 58.1)]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let l = stats_line(&text);
    assert!(l.ends_with("1.017, from 1.009 to 1.019 over 3 pairs (target <= 1.03: met)"), "{l}");
    // One pair past 3%: unsettled, whatever the median says.
    let (_, text) = summarise(dir.path(), &b32_rows(&[(59.0, 58.0), (60.0, 58.0), (59.2, 58.1)]));
    let l = stats_line(&text);
    assert!(l.ends_with("1.019, from 1.017 to 1.034 over 3 pairs (target <= 1.03: unsettled)"), "{l}");
    // Every pair past 3% (the seed b32 pairs of one call on an H200): missed.
    let (_, text) = summarise(dir.path(), &b32_rows(&[(59.85, 57.35), (60.35, 56.31), (59.36, 56.67)]));
    let l = stats_line(&text);
    assert!(l.contains("from 1.044 to 1.072 over 3 pairs (target <= 1.03: missed)"), "{l}");
    // The repeats' rows stay out of the table; the pair they repeat stays in.
    assert!(!text.contains("-r1 |") && !text.contains("-r2 |"), "{text}");
    assert!(text.contains("| seed-delayed-b32 | 59.85 |") && text.contains("| seed-delayed-nostats-b32 | 57.35 |"), "{text}");
    // A single pair gets a plain verdict, as every other target.
    let (_, text) = summarise(dir.path(), &b32_rows(&[(59.85, 57.35)]));
    assert!(stats_line(&text).ends_with("(delayed/delayed-nostats ms): 1.044 (target <= 1.03: missed)"), "{text}");
    // The other targets: one ratio each.
    assert!(text.contains("- seed b32, FP8 delayed speed-up over our bf16 (bf16/delayed ms): 1.128 (target >= 1.3: missed)"), "{text}");
}

#[test]
fn the_fp8_speed_up_is_judged_over_every_round() {
    let dir = tempfile::tempdir().unwrap();
    let speedup = |text: &str| text.lines().find(|l| l.starts_with("- llama-1b, FP8 delayed speed-up")).expect("no speed-up line").to_string();
    // Rounds of (bf16, delayed) medians, as speed.sh's llama rows name them.
    let rows = |rounds: &[(f64, f64)]| {
        let mut rows = vec![row("torch_llama_1b_compile_fused", 135.0)];
        for (k, &(bf16, delayed)) in rounds.iter().enumerate() {
            let tag = if k == 0 { String::new() } else { format!("-r{k}") };
            rows.push(row(&format!("llama-1b-bf16{tag}"), bf16));
            rows.push(row(&format!("llama-1b-delayed{tag}"), delayed));
        }
        rows
    };
    // The pairs straddle 1.3: unsettled, with the median and the range.
    let (out, text) = summarise(dir.path(), &rows(&[(140.49, 106.37), (136.6, 104.0), (137.0, 106.5)]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(speedup(&text).ends_with("1.313, from 1.286 to 1.321 over 3 pairs (target >= 1.3: unsettled)"), "{text}");
    // Every pair at or past 1.3: met; none: missed.
    let (_, text) = summarise(dir.path(), &rows(&[(140.0, 106.0), (138.0, 105.0), (139.0, 106.0)]));
    assert!(speedup(&text).ends_with("over 3 pairs (target >= 1.3: met)"), "{text}");
    let (_, text) = summarise(dir.path(), &rows(&[(130.0, 106.0), (131.0, 105.0)]));
    assert!(speedup(&text).ends_with("1.237, from 1.226 to 1.248 over 2 pairs (target >= 1.3: missed)"), "{text}");
    assert!(!text.contains("-r1 |"), "{text}");
}

#[test]
fn a_missing_rows_file_gets_one_line_and_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("python3")
        .arg(repo_root().join("bench/speed_summary.py"))
        .arg(dir.path().join("absent.jsonl"))
        .arg(dir.path().join("rows.md"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("absent.jsonl"), "{err}");
    assert!(!dir.path().join("rows.md").exists(), "a table was written from nothing");
}
