//! End to end: `--checkpoint-every N` writes whole checkpoints, and `--resume RUN --at-step S`
//! continues from one bit for bit (the same recipe gives the uninterrupted run's losses and
//! statistics at every later step), or under another routing (a precision switch from step S);
//! what cannot be resumed is refused in one line, before any directory is made.

mod common;

use common::{capture, query_csv as csv, train_tiny};

#[test]
fn a_resumed_run_continues_bit_for_bit_and_can_switch_precision() {
    let dir = tempfile::tempdir().unwrap();
    let (full, resumed, switched) = (dir.path().join("full"), dir.path().join("resumed"), dir.path().join("switched"));
    let common = ["--recipe", "delayed", "--steps", "24", "--quiet", "--dump-every", "0"];
    train_tiny(&full, &[&common[..], &["--checkpoint-every", "8"]].concat());
    let ckpts: Vec<String> = std::fs::read_dir(full.join("checkpoints")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    let mut ckpts = ckpts;
    ckpts.sort();
    assert_eq!(ckpts, ["step-00000008.ckpt", "step-00000016.ckpt", "step-00000024.ckpt"], "whole checkpoints only, no partial file");

    let from = full.display().to_string();
    train_tiny(&resumed, &[&common[..], &["--resume", &from, "--at-step", "16"]].concat());
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(resumed.join("run.json")).unwrap()).unwrap();
    assert_eq!(m["config"]["train"]["resume_from"], serde_json::json!({"run": from, "step": 16}));
    assert_eq!(m["steps_completed"], 24);
    // The same steps 17..24: every loss, gradient norm and statistic equal to the bit.
    let steps = "SELECT step, loss, grad_norm FROM steps WHERE step > 16 ORDER BY step";
    let stats = "SELECT step, layer, module, gemm, role, amax, scale, underflow_frac, saturated_frac FROM stats WHERE step > 16 ORDER BY step, layer, module, gemm, role";
    assert_eq!(
        csv(&resumed, "SELECT MIN(step) AS first, COUNT(step) AS n FROM steps"),
        "first,n\n17,8\n",
        "the resumed run's tables begin after the checkpoint"
    );
    assert_eq!(csv(&resumed, steps), csv(&full, steps));
    assert_eq!(csv(&resumed, stats), csv(&full, stats));

    // A precision switch from step 16: the forward GEMMs in BF16 from there on.
    train_tiny(&switched, &[&common[..], &["--resume", &from, "--at-step", "8", "--bf16-gemms", "fprop"]].concat());
    let formats = csv(&switched, "SELECT DISTINCT format FROM stats WHERE gemm = 'fprop' ORDER BY format");
    assert_eq!(formats, "format\nbf16\n");
    assert_ne!(csv(&switched, steps), csv(&full, steps), "the switch changes the run");
}

#[test]
fn what_cannot_be_resumed_gets_one_line_and_no_directory() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base");
    train_tiny(&base, &["--steps", "6", "--quiet", "--checkpoint-every", "3"]);
    let from = base.display().to_string();
    // A truncated checkpoint.
    let cut = dir.path().join("cut");
    std::fs::create_dir_all(cut.join("checkpoints")).unwrap();
    let bytes = std::fs::read(base.join("checkpoints/step-00000003.ckpt")).unwrap();
    std::fs::write(cut.join("checkpoints/step-00000003.ckpt"), &bytes[..bytes.len() - 100]).unwrap();
    let cut_s = cut.display().to_string();
    let empty = dir.path().join("empty").display().to_string();
    std::fs::create_dir_all(&empty).unwrap();
    for (args, says) in [
        (vec!["--resume", from.as_str(), "--at-step", "4"], "no checkpoint of step 4; it has steps 3, 6"),
        (vec!["--resume", empty.as_str(), "--at-step", "3"], "the run has no checkpoints"),
        (vec!["--resume", from.as_str(), "--at-step", "3", "--seed", "9"], "the checkpoint's seed differs"),
        (vec!["--resume", from.as_str(), "--at-step", "3", "--layers", "3"], "the checkpoint's model differs"),
        (vec!["--resume", from.as_str(), "--at-step", "6"], "the run must go past the checkpoint"),
        (vec!["--resume", cut_s.as_str(), "--at-step", "3"], "truncated"),
        (vec!["--resume", from.as_str()], "--at-step"),
    ] {
        let out = dir.path().join("new");
        let o = capture(&[&["train", "--preset", "tiny", "--device", "cpu", "--steps", "6", "--out", out.to_str().unwrap()][..], &args[..]].concat());
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: one line: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!out.exists(), "{args:?}: no run directory is made");
    }
}
