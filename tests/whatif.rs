//! End to end: `fp8-analyze whatif` casts a run's dumped operands as each format would, and every
//! figure agrees with an independent numpy + ml_dtypes computation (tests/whatif_check.py), on
//! whole dumps and on dumps of leading rows; bad input gets one line.

mod common;

use common::{analyze, python, train_tiny};

#[test]
fn whatif_agrees_with_numpy_on_whole_dumps_and_on_leading_rows() {
    let dir = tempfile::tempdir().unwrap();
    // Whole dumps (the largest tiny tensor is 512 × 256), and the default dumps of 4096 values.
    for (name, extra) in [("whole", vec!["--dump-max-elems", "131072"]), ("rows", vec![])] {
        let run = dir.path().join(name);
        let mut args = vec!["--recipe", "delayed", "--steps", "20", "--dump-every", "10", "--quiet"];
        args.extend(extra);
        train_tiny(&run, &args);
        let o = analyze(&["--json", "whatif", run.to_str().unwrap()]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let rows = v["rows"].as_array().unwrap();
        // 3 dump steps (1, 10, 20) × 2 layers × 4 sites × 3 operands (activation, weight, gradient),
        // each under 5 formats.
        assert_eq!(rows.len(), 3 * 2 * 4 * 3 * 5, "{name}");
        let whole = rows.iter().filter(|r| r["whole"] == true).count();
        if name == "whole" {
            assert_eq!(whole, rows.len());
        } else {
            assert!(whole < rows.len() / 2, "the default dumps are mostly leading rows: {whole}");
        }
        let json = dir.path().join(format!("{name}.json"));
        std::fs::write(&json, &o.stdout).unwrap();
        let check = python("whatif_check.py", &[run.to_str().unwrap(), json.to_str().unwrap()]);
        let out = String::from_utf8_lossy(&check.stdout);
        assert!(check.status.success() && out.starts_with("OK 360 rows"), "{name}: {out}{}", String::from_utf8_lossy(&check.stderr));
        // NVFP4's E2M1 elements lose far more than E4M3's per-tensor cast, on every tensor.
        let cos = |f: &str| rows.iter().filter(|r| r["format"] == f).map(|r| r["cosine"].as_f64().unwrap()).fold(f64::INFINITY, f64::min);
        assert!(cos("nvfp4") < cos("e4m3") && cos("e4m3") > 0.999, "worst cosines: nvfp4 {}, e4m3 {}", cos("nvfp4"), cos("e4m3"));
        let text = String::from_utf8_lossy(&analyze(&["whatif", run.to_str().unwrap(), "--formats", "nvfp4", "--top", "1"]).stdout).to_string();
        assert!(text.contains("| nvfp4") && text.contains("nvfp4: the 1 worst tensor(s) by cosine"), "{text}");
        assert_eq!(text.contains("leading rows, not the whole tensor"), name == "rows", "{text}");
    }
    // Bad input: an unknown format, a run without dumps.
    let plain = dir.path().join("plain");
    train_tiny(&plain, &["--recipe", "delayed", "--steps", "3", "--quiet"]);
    for (args, says) in [
        (vec!["whatif", dir.path().join("whole").to_str().unwrap(), "--formats", "fp6"], "unknown format 'fp6'"),
        (vec!["whatif", plain.to_str().unwrap()], "has no dumped tensors"),
    ] {
        let o = analyze(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.trim_end().lines().count() == 1 && err.contains(says), "{args:?}: {err}");
    }
}
