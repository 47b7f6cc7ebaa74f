//! End-to-end tests of `fp8-capture` under abuse: a run killed with SIGKILL keeps its closed parts
//! readable and a manifest that says it did not complete; bad flags get one line, a non-zero exit,
//! and touch no existing run.

mod common;

use common::*;
use fp8scope_schemas::layout::{RunDir, Table};
use fp8scope_schemas::manifest::{Manifest, RunStatus};
use fp8scope_schemas::parts::check_part;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Starts an endless tiny run into `out` and returns once its steps table has `parts` closed parts.
fn train_until_parts(out: &std::path::Path, extra: &[&str], parts: usize) -> std::process::Child {
    let child = Command::new(bin("fp8-capture"))
        .args(["train", "--preset", "tiny", "--device", "cpu", "--quiet", "--steps", "100000", "--flush-every", "2"])
        .args(extra)
        .arg("--out")
        .arg(out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let run = RunDir::new(out);
    let t0 = Instant::now();
    while run.parts(Table::Steps).map(|p| p.len()).unwrap_or(0) < parts {
        assert!(t0.elapsed() < Duration::from_secs(60), "fewer than {parts} parts after 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

#[test]
fn a_run_killed_midway_keeps_every_closed_part_readable() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("killed");
    let mut child = train_until_parts(&out, &["--dump-every", "3"], 4);
    let run = RunDir::new(&out);
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let m = Manifest::read(&out).unwrap();
    assert_eq!(m.status, RunStatus::Running, "a killed run cannot say it completed");
    assert!(!m.finished());
    assert!(m.heartbeat_at.is_some() && m.host.is_some(), "the manifest carries a heartbeat and the host");
    // Its process is gone from this host: the analyzer says so instead of `running`.
    let o = Command::new(bin("fp8-analyze")).args(["summary", out.to_str().unwrap()]).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("stopped without closing") && text.contains(&format!("process {}", child.id())), "{text}");
    let o = Command::new(bin("fp8-analyze")).args(["summary", out.to_str().unwrap(), "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["liveness"]["ranks"][0]["stopped"], true, "{v}");
    let mut parts = 0;
    for table in Table::ALL {
        for p in run.parts(table).unwrap() {
            check_part(&p, table).unwrap_or_else(|e| panic!("{e}"));
            parts += 1;
        }
    }
    assert!(parts >= 8, "only {parts} parts");
    // The independent reader agrees (row counts may exceed the manifest's last flush).
    let o = python("check_run.py", &[out.to_str().unwrap(), "--allow-incomplete"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
}

/// Runs a bad command line and checks: non-zero exit, exactly one line on stderr containing `needle`.
fn refused(args: &[&str], needle: &str) {
    let o = capture(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{args:?} should exit 2 (bad input)");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: not one line:\n{err}");
    assert!(err.contains(needle), "{args:?}: '{needle}' not in: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_flags_get_one_line_and_touch_no_existing_run() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let existing = dir.path().join("existing");
    train_tiny(&existing, &["--steps", "3", "--quiet"]);
    let before = snapshot(&existing);
    let ex = existing.to_str().unwrap();
    let fresh = dir.path().join("fresh");
    let fr = fresh.to_str().unwrap();
    refused(&["train", "--recipe", "fp4", "--out", fr], "fp4");
    refused(&["train", "--steps", "-5", "--out", fr], "-5");
    refused(&["train", "--steps", "0", "--out", fr], "positive");
    refused(&["train", "--dump-layers", "layers.(1", "--out", fr], "--dump-layers");
    refused(&["train", "--preset", "huge", "--out", fr], "unknown preset");
    refused(&["train", "--bf16-layers", "7", "--out", fr], "--bf16-layers");
    refused(&["train", "--inject", "site=layers.9.fc2,gemm=dgrad,kind=overflow", "--out", fr], "--inject");
    refused(&["train", "--heads", "3", "--out", fr], "--heads");
    refused(&["train", "--zipf-exponent", "inf", "--out", fr], "number ≥ 0");
    refused(&["train", "--scenario-step", "5", "--out", fr], "--scenario-step needs --scenario");
    refused(&["train", "--scenario", "nan", "--scenario-step", "5", "--out", fr], "plants no batch");
    refused(&["train", "--steps", "2", "--out", ex], "already holds a run");
    refused(&["train", "--device", "cuda", "--out", fr], "--device cuda");
    refused(&["train", "--dp", "2", "--flight-recorder", "4", "--out", fr], "--flight-recorder records a run of one rank");
    assert!(!fresh.exists(), "a refused run created its directory");
    assert_eq!(snapshot(&existing), before, "an existing run was modified");
    let m = Manifest::read(&existing).unwrap();
    assert_eq!(m.status, RunStatus::Completed);
}

#[test]
fn presets_and_help_teach() {
    let o = capture(&["presets"]);
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("tiny") && s.contains("32000"), "{s}");
    let o = capture(&["train", "--help"]);
    let s = String::from_utf8_lossy(&o.stdout);
    for flag in ["--recipe", "--amax-history", "--bf16-sites", "--dump-layers", "--shadow", "--inject"] {
        assert!(s.contains(flag), "--help lacks {flag}");
    }
}

#[test]
fn sigint_stops_after_the_current_step_and_says_so() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("interrupted");
    let child = train_until_parts(&out, &[], 2);
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let mut child = child;
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    let m = Manifest::read(&out).unwrap();
    assert_eq!(m.status, RunStatus::Crashed);
    assert!(m.error.as_deref().unwrap_or("").contains("interrupted"), "{:?}", m.error);
    assert_eq!(m.rows.steps, m.steps_completed as u64, "every trained step is recorded");
    let o = python("check_run.py", &[out.to_str().unwrap(), "--allow-incomplete"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
}
