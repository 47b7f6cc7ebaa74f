//! The quantization contract (`schemas/src/quant.rs`) where it leaves Rust:
//! - `python/fp8scope/_formats.json`, from which the Python package takes its FP8 constants, is
//!   exactly what the contract exports now (regenerate it with the command the failure prints);
//! - `fp8-capture formats --json` prints the same JSON, and `formats` a table of it;
//! - the Python package's constants agree with the contract, and the contract's constants with
//!   ml_dtypes (`float8_e4m3fn`, `float8_e5m2`, `float4_e2m1fn`, `float8_e8m0fnu`) on every code.

mod common;

use common::*;
use std::process::Command;

const REGENERATE: &str = "FP8SCOPE_WRITE_FORMATS_JSON=1 cargo test --release --workspace --test formats_contract";

#[test]
fn formats_json_committed_in_the_python_package_is_what_the_contract_exports() {
    let now = fp8scope_schemas::quant::contract_json();
    let path = repo_root().join("python").join("fp8scope").join("_formats.json");
    if std::env::var_os("FP8SCOPE_WRITE_FORMATS_JSON").is_some() {
        std::fs::write(&path, serde_json::to_string_pretty(&now).unwrap() + "\n").expect("write _formats.json");
        eprintln!("wrote {}", path.display());
    }
    let committed: serde_json::Value = std::fs::read_to_string(&path).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or(serde_json::Value::Null);
    assert!(committed == now, "{} differs from what schemas/src/quant.rs defines now; regenerate it with\n  {REGENERATE}\nand commit it", path.display());
}

#[test]
fn the_formats_command_prints_the_contract() {
    let o = capture(&["formats", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let printed: serde_json::Value = serde_json::from_slice(&o.stdout).expect("formats --json prints JSON");
    assert_eq!(printed, fp8scope_schemas::quant::contract_json());
    let o = capture(&["formats"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success());
    for line in ["e2m1      4   2   1     1", "mxfp8    wgrad  gradient    e4m3     32x1       e8m0_block_te", "nvfp4    wgrad  gradient    e2m1     16x1"] {
        assert!(text.contains(line), "`formats` lacks '{line}':\n{text}");
    }
}

#[test]
fn python_reads_the_same_constants_and_ml_dtypes_agrees_with_them() {
    let python = repo_root().join("python");
    let o = Command::new("python3")
        .arg(repo_root().join("tests").join("formats_contract.py"))
        .env("PYTHONPATH", &python)
        .output()
        .expect("python3 must be installed");
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(!text.contains("ModuleNotFoundError"), "missing Python package: pip install -r tests/requirements.txt\n{text}");
    assert!(o.status.success(), "{text}");
    assert!(text.contains("4 formats agree"), "{text}");
}
