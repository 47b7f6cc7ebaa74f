//! End to end: `--recipe fprop=mxfp8,dgrad=delayed,wgrad=bf16` casts each GEMM kind as named (MXFP8
//! blocks in the forward, per-tensor delayed FP8 in dgrad, BF16 in wgrad), records it in the
//! manifest, and refuses what it cannot do with one line.

mod common;

use common::{analyze, capture, train_tiny};

#[test]
fn each_gemm_kind_is_cast_by_its_own_recipe() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("mixed");
    train_tiny(&run, &["--recipe", "fprop=mxfp8,dgrad=delayed,wgrad=bf16", "--steps", "6", "--quiet"]);
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap();
    assert_eq!(m["config"]["recipe"]["kind"], "mxfp8", "the headline is the first recipe that is not BF16");
    assert_eq!(m["config"]["recipe"]["per_gemm"], serde_json::json!({"fprop": "mxfp8", "dgrad": "delayed", "wgrad": "bf16"}));
    let sql = "SELECT DISTINCT gemm, role, format, block_count IS NOT NULL AS blocks FROM stats WHERE step = 6 ORDER BY gemm, role";
    let o = analyze(&["query", run.to_str().unwrap(), "--format", "csv", "--sql", sql]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got = String::from_utf8_lossy(&o.stdout).to_string();
    let want = "gemm,role,format,blocks\n\
                dgrad,gradient,e5m2,false\n\
                dgrad,weight,e4m3,false\n\
                fprop,activation,e4m3,true\n\
                fprop,weight,e4m3,true\n\
                wgrad,activation,bf16,false\n\
                wgrad,gradient,bf16,false\n";
    assert_eq!(got, want);
    let s = analyze(&["summary", run.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&s.stdout).contains("fprop=mxfp8,dgrad=delayed,wgrad=bf16"), "{}", String::from_utf8_lossy(&s.stdout));
}

#[test]
fn a_bad_per_gemm_recipe_or_device_gets_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x").display().to_string();
    for (recipe, device, says) in [
        ("fprop=mxfp8,dgrad=delayed", "cpu", "names fprop, dgrad and wgrad"),
        ("fprop=mxfp8,fprop=bf16,dgrad=bf16,wgrad=bf16", "cpu", "fprop is named twice"),
        ("fprop=fp4,dgrad=bf16,wgrad=bf16", "cpu", "unknown recipe 'fp4'"),
        ("xgrad=bf16,dgrad=bf16,wgrad=bf16", "cpu", "'xgrad' is not a GEMM kind"),
        ("fprop=delayed,dgrad=current,wgrad=bf16", "cuda", "per-GEMM recipes run on the CPU only"),
    ] {
        let o = capture(&["train", "--preset", "tiny", "--device", device, "--recipe", recipe, "--steps", "2", "--out", &out]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{recipe}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{recipe}: one line: {err}");
        assert!(err.contains(says), "{recipe}: {err}");
    }
}
