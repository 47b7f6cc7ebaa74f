//! End to end: a block-scaled run (MXFP8) records each operand's block scales (`stats.block_*`),
//! one block per 32 elements, and `report` draws their spread and flushed share.

mod common;

use common::{HEAVY, analyze, train_tiny};

#[test]
fn an_mxfp8_run_records_its_block_scales_and_report_draws_them() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("mx");
    train_tiny(&run, &["--recipe", "mxfp8", "--steps", "12", "--quiet"]);
    let sql = "SELECT numel, block_count, block_scale_log2_min, block_scale_log2_max, block_scale_log2_std, block_scale_flushed_frac, format FROM stats WHERE step = 12";
    let o = analyze(&["query", run.to_str().unwrap(), "--format", "csv", "--sql", sql]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let csv = String::from_utf8_lossy(&o.stdout).to_string();
    let mut fp8_rows = 0;
    for line in csv.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f[6] == "bf16" {
            assert_eq!(f[1], "", "a BF16 operand has no blocks: {line}");
            continue;
        }
        fp8_rows += 1;
        let (numel, blocks): (u64, u64) = (f[0].parse().unwrap(), f[1].parse().unwrap());
        assert_eq!(blocks, numel / 32, "MXFP8 blocks hold 32 elements: {line}");
        let (lo, hi, sd): (f64, f64, f64) = (f[2].parse().unwrap(), f[3].parse().unwrap(), f[4].parse().unwrap());
        assert!(lo <= hi && sd >= 0.0 && sd <= hi - lo, "{line}");
        assert_eq!(lo.fract(), 0.0, "E8M0 scales are powers of two: {line}");
        assert!((0.0..=1.0).contains(&f[5].parse::<f64>().unwrap()), "{line}");
    }
    assert!(fp8_rows >= 24, "every FP8 operand of the step has block statistics:\n{csv}");

    let out = dir.path().join("report");
    let o = analyze(&["report", run.to_str().unwrap(), "--out", out.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for kind in ["heatmap-block-spread", "heatmap-block-flushed"] {
        let c = j["charts"].as_array().unwrap().iter().find(|c| c["kind"] == kind).unwrap_or_else(|| panic!("no {kind} chart: {}", j["charts"]));
        assert_eq!((c["width"].as_u64(), c["height"].as_u64()), (Some(1200), Some(900)));
        assert!(out.join(c["file"].as_str().unwrap()).is_file());
    }
}
