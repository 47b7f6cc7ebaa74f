//! Helpers of the end-to-end tests: find the built binaries, run them in temporary directories,
//! read what they wrote.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

/// Serialises the CPU-heavy runs of one test binary, so that timings are not shared between tests.
pub static HEAVY: Mutex<()> = Mutex::new(());

/// The directory holding the workspace's binaries (next to this test's executable).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent().and_then(|p| p.parent()).expect("target/<profile>/deps").to_path_buf()
}

pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(path.is_file(), "{} not built: run `cargo build --release --workspace` first", path.display());
    path
}

/// The repository root: `cargo test` says where at run time (a test binary reused from a build of
/// a checkout at another path would otherwise look there), else the path it was built from.
pub fn repo_root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// Runs `fp8-capture` with `args`; returns its output.
pub fn capture(args: &[&str]) -> Output {
    Command::new(bin("fp8-capture")).args(args).output().expect("spawn fp8-capture")
}

/// Runs `fp8-analyze` with `args`; returns its output.
pub fn analyze(args: &[&str]) -> Output {
    Command::new(bin("fp8-analyze")).args(args).output().expect("spawn fp8-analyze")
}

/// `fp8-analyze query RUN --format csv --sql SQL`'s output, asserting success.
pub fn query_csv(run: &Path, sql: &str) -> String {
    let o = analyze(&["query", run.to_str().unwrap(), "--format", "csv", "--sql", sql]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// Runs `fp8-capture train --quiet` with the tiny preset and `extra` flags into `out`, asserting success.
pub fn train_tiny(out: &Path, extra: &[&str]) -> Output {
    let out_s = out.display().to_string();
    let mut args = vec!["train", "--preset", "tiny", "--device", "cpu", "--out", out_s.as_str()];
    args.extend_from_slice(extra);
    let o = capture(&args);
    assert!(o.status.success(), "fp8-capture {args:?} failed: {}", String::from_utf8_lossy(&o.stderr));
    o
}

/// Runs a Python script of tests/ with `args`; panics with a clear message if Python or its packages
/// are missing (CI installs them from tests/requirements.txt).
pub fn python(script: &str, args: &[&str]) -> Output {
    let path = repo_root().join("tests").join(script);
    let o = Command::new("python3").arg(&path).args(args).output().expect("python3 must be installed");
    let err = String::from_utf8_lossy(&o.stderr);
    if err.contains("ModuleNotFoundError") {
        panic!("missing Python package: pip install -r tests/requirements.txt ({})", err.lines().last().unwrap_or(""));
    }
    o
}

/// The `loss` column of a run, via the schemas crate.
pub fn losses(run: &Path) -> Vec<f64> {
    use arrow_cast_free::column_f64;
    let rd = fp8scope_schemas::layout::RunDir::new(run);
    let batches = fp8scope_schemas::parts::read_table(&rd, fp8scope_schemas::layout::Table::Steps).expect("steps table");
    batches.iter().flat_map(|b| column_f64(b, "loss")).collect()
}

mod arrow_cast_free {
    use fp8scope_schemas::arrow_reexport::{array::Float64Array, record_batch::RecordBatch};
    pub fn column_f64(b: &RecordBatch, name: &str) -> Vec<f64> {
        let col = b.column_by_name(name).expect("column");
        col.as_any().downcast_ref::<Float64Array>().expect("f64 column").values().to_vec()
    }
}

/// Every file under `dir` with its bytes, for checking that nothing changed.
pub fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.clone(), std::fs::read(&p).expect("read")));
            }
        }
    }
    out.sort();
    out
}
