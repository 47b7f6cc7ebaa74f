//! `compare` against an independent pyarrow + numpy computation over the same Parquet files
//! (`compare_check.py`): every metric of every tensor must agree to 1e-9 relative. Needs python3
//! with pyarrow and numpy; without them the test fails and says what to install.

mod common;

use common::*;
use serde_json::Value;
use std::process::Command;

fn numpy_metrics(run: &std::path::Path, base: &std::path::Path) -> Vec<Value> {
    let script = common::package_dir().join("tests/compare_check.py");
    let out = match Command::new("python3").arg(script).arg(run).arg(base).output() {
        Ok(out) => out,
        Err(e) => panic!("cannot run python3 ({e}): install Python 3, then `pip install pyarrow numpy ml_dtypes`"),
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "compare_check.py failed: {stderr}\n(if a module is missing: `pip install pyarrow numpy ml_dtypes`)");
    serde_json::from_slice::<Value>(&out.stdout).expect("JSON from compare_check.py").as_array().cloned().unwrap()
}

fn close(ours: &Value, theirs: &Value, what: &str) {
    match (ours.as_f64(), theirs.as_f64()) {
        (Some(a), Some(b)) => {
            let tol = 1e-9 * a.abs().max(b.abs());
            assert!((a - b).abs() <= tol, "{what}: fp8-analyze {a:e} vs numpy {b:e} (rel {:e})", (a - b).abs() / b.abs());
        }
        _ => assert_eq!(ours, theirs, "{what}"),
    }
}

#[test]
fn compare_matches_numpy_to_1e_9_relative() {
    let tmp = tempfile::tempdir().unwrap();
    let (run, base) = (fp8(tmp.path()), bf16(tmp.path()));
    let out = analyze(&["compare", &p(&run), "--baseline", &p(&base), "--json"]);
    assert!(out.code == 0 || out.code == 1, "{}", out.stderr);
    let ours = out.json()["tensors"].as_array().cloned().unwrap();
    let theirs = numpy_metrics(&run, &base);
    assert_eq!(ours.len(), theirs.len());
    let key = |v: &Value| (v["step"].as_i64(), v["layer"].as_i64(), v["module"].as_str().map(String::from), v["role"].as_str().map(String::from));
    let mut by_key = std::collections::HashMap::new();
    for t in &theirs {
        by_key.insert(key(t), t);
    }
    for o in &ours {
        let t = by_key.get(&key(o)).unwrap_or_else(|| panic!("numpy has no {o}"));
        assert_eq!(o["numel"], t["numel"]);
        for m in ["cosine", "mse", "rel_l2", "sqnr_db", "max_abs_diff"] {
            close(&o[m], &t[m], &format!("{} step {} {m}", o["tensor"], o["step"]));
        }
    }
}
