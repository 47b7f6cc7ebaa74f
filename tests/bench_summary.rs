//! `bench/speed_summary.py`, the verdicts of the GPU speed benchmark (`bench/speed.sh`), on rows
//! written here (no GPU needed): a target measured once is met or missed; the statistics cost and
//! the FP8 speed-up, measured over repeated pairs of runs, are met only when every pair meets them,
//! missed when none does, and unsettled when the pairs straddle the target; the repeats stay out of
//! the table; bad input gets one line and a non-zero exit. Also `bench/step_kernels.py`, which turns
//! Nsight Compute's CSV of a training run (`bench/step_kernels.sh`) into a step's kernels by name,
//! and `bench/power_summary.py`, which reads the clock and power of a run from an nvidia-smi log.
//! And `bench/load_waits.py`, which finds the kernels whose threads wait for their global loads one
//! at a time, in their SASS: it lists a known case, and none in the kernels fixed of it; and
//! `bench/sass_diff.py`, which says which kernels of two builds differ and how. And
//! `bench/stats_cost.sh`, run on the CPU: each variant of the statistics against its round's run
//! without them; and `bench/env_bin.sh`, which wraps a build's binaries with variables set.

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
    let out = Command::new("python3").arg(repo_root().join("bench/speed_summary.py")).arg(&jsonl).arg(&md).output().expect("python3 must be installed");
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
    // No card named beside the rows: no GPU line; one named (speed.sh's gpu.txt): the table says it.
    assert!(text.starts_with("| run |"), "{text}");
    std::fs::write(dir.path().join("gpu.txt"), "NVIDIA H100 80GB HBM3, 580.159\n").unwrap();
    let (_, text) = summarise(dir.path(), &b32_rows(&[(59.85, 57.35)]));
    assert!(text.starts_with("GPU: NVIDIA H100 80GB HBM3, 580.159\n\n| run |"), "{text}");
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
fn the_dump_cost_is_projected_to_one_dump_every_50_steps() {
    let dir = tempfile::tempdir().unwrap();
    let dump_line = |text: &str| text.lines().find(|l| l.starts_with("- llama-1b, dump of layers.5.fc1")).expect("no dump line").to_string();
    // The rows of speed.sh's llama mode on an H200: a dump every 10 steps, 26 steps timed (5 to
    // 30, dumps at 10, 20 and 30), against the same steps without dumps.
    let timed = |run: &str, mean: f64, dumps: Option<u32>| {
        let d = dumps.map(|k| format!(r#", "window_dumps": {k}"#)).unwrap_or_default();
        format!(r#"{{"run": "{run}", "steps": 30, "median_ms": 93.0, "mean_ms": {mean}, "tokens": 8192, "window_steps": 26{d}}}"#)
    };
    let rows = vec![timed("llama-1b-delayed-dump10", 111.24, Some(3)), timed("llama-1b-delayed-nodump", 96.68, None)];
    let (out, text) = summarise(dir.path(), &rows);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // (111.24 - 96.68) x 26 / 3 = 126 ms a dump; over 50 steps of 96.68 ms: +2.6%.
    let l = dump_line(&text);
    assert!(l.contains("from 3 dumps in 26 timed steps (126 ms a dump; dump/nodump mean ms as measured 1.151)"), "{l}");
    assert!(l.ends_with(": 1.026 (target <= 1.05: met)"), "{l}");
    // Dumps that cost more than 5% of 50 steps: missed.
    let (_, text) = summarise(dir.path(), &[timed("llama-1b-delayed-dump10", 160.0, Some(3)), timed("llama-1b-delayed-nodump", 96.68, None)]);
    assert!(dump_line(&text).ends_with("(target <= 1.05: missed)"), "{text}");
    // Rows from before the dump counts were written: the measured ratio, said to be an upper bound.
    let (_, text) = summarise(dir.path(), &[row("llama-1b-delayed-dump10", 111.24), row("llama-1b-delayed-nodump", 96.68)]);
    assert!(dump_line(&text).contains("(measured more often: dump/nodump mean ms, an upper bound): 1.151 (target <= 1.05: missed)"), "{text}");
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

/// Nsight Compute's CSV of `step_kernels.sh`: a message line, one launch before the first step, and
/// three steps, the first to be left out; times in ns, µs and ms (ncu picks the unit a row).
const NCU_CSV: &str = r#"==PROF== Connected to process 1 (fp8-capture)
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","fp8-capture","h","fill_zero","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","9.00"
"1","1","fp8-capture","h","embedding_fwd","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","50.00"
"2","1","fp8-capture","h","nvjet_sm90_tst_256x128","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","msecond","3.00"
"3","1","fp8-capture","h","embedding_fwd","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","50.00"
"4","1","fp8-capture","h","nvjet_sm90_tst_256x128","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","1,000,000"
"5","1","fp8-capture","h","gemm_nonfinite_count","1","7","(256, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","2.50"
"6","1","fp8-capture","h","gemm_nonfinite_count","1","7","(256, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","2.70"
"7","1","fp8-capture","h","embedding_fwd","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","50.00"
"8","1","fp8-capture","h","nvjet_sm90_tst_256x128","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","msecond","1.20"
"9","1","fp8-capture","h","gemm_nonfinite_count","1","7","(256, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","2.80"
"#;

fn step_kernels(csv: &Path) -> Output {
    Command::new("python3").arg(repo_root().join("bench/step_kernels.py")).arg(csv).args(["--steps", "3"]).output().expect("python3 must be installed")
}

#[test]
fn a_steps_kernels_are_summed_by_name_past_the_first_step() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("kernels.csv");
    std::fs::write(&csv, NCU_CSV).unwrap();
    let out = step_kernels(&csv);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    // Steps 2 and 3: the GEMM 1.0 + 1.2 ms, the count 2.5 + 2.7 + 2.8 µs, the embedding 2 x 50 µs;
    // the first step's 3 ms GEMM and the launch before it are left out.
    assert!(text.starts_with("2 steps after the first; kernels' GPU time a step 1.154 ms, 3.5 launches"), "{text}");
    let gemm = text.lines().find(|l| l.contains("nvjet")).expect("no GEMM row");
    assert_eq!(gemm.split_whitespace().take(3).collect::<Vec<_>>(), ["1.100", "1.0", "1100.0"], "{gemm}");
    let count = text.lines().find(|l| l.contains("gemm_nonfinite_count")).expect("no count row");
    assert_eq!(count.split_whitespace().take(3).collect::<Vec<_>>(), ["0.004", "1.5", "2.7"], "{count}");
    assert!(!text.contains("fill_zero"), "{text}");
}

#[test]
fn step_kernels_refuses_bad_input_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("absent.csv");
    let bad_unit = dir.path().join("unit.csv");
    std::fs::write(&bad_unit, NCU_CSV.replace("\"msecond\"", "\"fortnight\"")).unwrap();
    let one_step = dir.path().join("one.csv");
    std::fs::write(&one_step, NCU_CSV.lines().take(5).collect::<Vec<_>>().join("\n")).unwrap();
    for (csv, says) in [(&missing, "No such file"), (&bad_unit, "unknown time unit 'fortnight'"), (&one_step, "fewer than two steps")] {
        let out = step_kernels(csv);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{csv:?}");
        let last = err.trim().lines().last().unwrap_or("");
        assert!(last.contains(says), "{csv:?}: {err}");
        assert!(!err.contains("Traceback"), "{csv:?}: {err}");
    }
}

/// nvidia-smi's CSV of a run (bench/power.sh): loading and compiling at low power, then the steps.
const SMI_CSV: &str = "\
2026/12/03 19:49:30.100, 1980 MHz, 3201 MHz, 90.12 W, 40, 0x0000000000000000
2026/12/03 19:49:30.200, 1980 MHz, 3201 MHz, [N/A], 40, 0x0000000000000000
2026/12/03 19:49:30.300, 1700 MHz, 3201 MHz, 690.00 W, 55, 0x0000000000000004
2026/12/03 19:49:30.400, 1600 MHz, 3201 MHz, 698.00 W, 57, 0x0000000000000004
2026/12/03 19:49:30.500, 1800 MHz, 3201 MHz, 600.00 W, 56, 0x0000000000000000
not a sample
";

fn power_summary(log: &Path, extra: &[&str]) -> Output {
    Command::new("python3").arg(repo_root().join("bench/power_summary.py")).arg(log).args(extra).output().expect("python3 must be installed")
}

fn json_field(text: &str, key: &str) -> Option<String> {
    let at = text.find(&format!("\"{key}\": "))? + key.len() + 4;
    Some(text[at..].split([',', '}']).next()?.trim().to_string())
}

#[test]
fn the_power_of_a_run_is_read_from_its_busy_samples() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.smi.csv");
    std::fs::write(&log, SMI_CSV).unwrap();
    let out = power_summary(&log, &["--step-ms", "100", "--name", "bf16"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    // The three samples over 200 W: clocks 1600, 1700, 1800; power 600, 690, 698 W.
    for (key, want) in [
        ("busy_samples", "3"),
        ("sm_mhz_median", "1700.0"),
        ("sm_mhz_min", "1600.0"),
        ("power_w_median", "690.0"),
        ("power_capped_share", "0.667"),
        ("joules_per_step", "69.0"),
    ] {
        assert_eq!(json_field(&text, key).as_deref(), Some(want), "{key}: {text}");
    }
    // A held run's samples mix the hold's power with the steps': no energy.
    let held = power_summary(&log, &["--step-ms", "100", "--held"]);
    let text = String::from_utf8_lossy(&held.stdout);
    assert_eq!(json_field(&text, "held").as_deref(), Some("true"), "{text}");
    assert!(json_field(&text, "joules_per_step").is_none(), "{text}");
}

#[test]
fn power_summary_refuses_bad_input_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.smi.csv");
    std::fs::write(&log, SMI_CSV).unwrap();
    let missing = dir.path().join("absent.csv");
    for (args, says) in [
        (vec![missing.to_str().unwrap()], "No such file"),
        (vec![log.to_str().unwrap(), "--busy-w", "900"], "no sample draws more than 900 W (4 readable samples)"),
        (vec![log.to_str().unwrap(), "--step-ms", "fast"], "--step-ms fast: not a number"),
    ] {
        let out = Command::new("python3").arg(repo_root().join("bench/power_summary.py")).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// `bench/load_waits.py` with these arguments, from the repository root.
fn load_waits(args: &[&str]) -> Output {
    Command::new("python3").arg(repo_root().join("bench/load_waits.py")).args(args).current_dir(repo_root()).output().expect("python3 must be installed")
}

#[test]
fn load_waits_lists_a_kernel_that_waits_for_each_load() {
    // The cross-entropy kernel before its fix: 32 loads, each used in its own branch.
    let out = load_waits(&["--sass", "tests/fixtures/load_waits/crossentropy_split_a8bdde5.sass"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("crossentropy_split_fwd: runs of loads waited for one at a time: [32]"), "{text}");
    // Its runs of fewer than 33 are not listed with --min-run 33.
    let out = load_waits(&["--min-run", "33", "--sass", "tests/fixtures/load_waits/crossentropy_split_a8bdde5.sass"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn the_attention_delta_and_the_cross_entropy_keep_their_loads_in_flight() {
    // Compiled for sm_90 by NVRTC and disassembled (the wheels tests/requirements.txt installs):
    // flash_bwd_delta and crossentropy_split_fwd issue their loads together since they were fixed
    // (bench/results/2026-12-04-delta-rows), as do the bias gradients' rowsum_dequant and
    // colsum_bf16_partial since theirs were batched, and no other kernel of the files waits either.
    let out = load_waits(&["kernels/flash_attention.cu", "kernels/loss.cu", "kernels/bias_grad.cu"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("0 kernel(s) with a run of 4 or more"), "{text}");
}

#[test]
fn load_waits_refuses_bad_input_with_one_line() {
    for (args, says) in [
        (vec!["--min-run", "x"], "--min-run needs a whole number"),
        (vec!["--min-run", "0"], "--min-run must be at least 1"),
        (vec!["kernels/absent.cu"], "kernels/absent.cu: not a .cu file"),
        (vec!["--sass", "absent.sass"], "--sass needs an nvdisasm listing"),
    ] {
        let out = load_waits(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// `python3 bench/SCRIPT args…` from the repository root.
fn bench_script(script: &str, args: &[&str]) -> Output {
    Command::new("python3").arg(repo_root().join("bench").join(script)).args(args).current_dir(repo_root()).output().expect("python3 must be installed")
}

#[test]
fn sass_diff_names_the_kernels_that_differ_and_how() {
    // bias_grad.cu compiled twice by NVRTC: as it is, and with rowsum_dequant's loads one a batch
    // (RS_BATCH=1, its tuning macro). Only rowsum_dequant differs, and by its unrolled loads.
    let dir = tempfile::tempdir().unwrap();
    let (one, four) = (dir.path().join("one.cubin"), dir.path().join("four.cubin"));
    for (cubin, defs) in [(&one, vec!["-D", "RS_BATCH=1"]), (&four, vec![])] {
        let args = [vec!["kernels/bias_grad.cu", "--cubin", cubin.to_str().unwrap()], defs].concat();
        let out = bench_script("kernel_regs.py", &args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let out = bench_script("sass_diff.py", &[one.to_str().unwrap(), four.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("2 of 3 kernels run the same instructions") && text.contains("differ: rowsum_dequant"), "{text}");
    let how = text.lines().find(|l| l.trim_start().starts_with("rowsum_dequant:")).unwrap_or_else(|| panic!("no line of how: {text}"));
    let counts: Vec<usize> = how.split(" instructions").next().unwrap().split(':').nth(1).unwrap().split('→').map(|n| n.trim().parse().unwrap()).collect();
    assert!(counts[1] > counts[0], "four loads a batch unroll the loop: {how}");
    assert!(how.contains("DADD "), "the sums moved with the loads: {how}");
    // The same build against itself: nothing differs, exit 0.
    let out = bench_script("sass_diff.py", &[four.to_str().unwrap(), four.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stdout).contains("3 of 3 kernels run the same instructions"));
}

/// `bench/stats_cost.sh` on the CPU (`DEVICE=cpu`, the tiny preset, 3 steps) with `env` set.
fn stats_cost(out: &Path, pairs: &str, env: &[(&str, &str)]) -> Output {
    let bin_dir = common::bin("fp8-capture").parent().unwrap().to_path_buf();
    let mut c = Command::new("bash");
    c.arg(repo_root().join("bench/stats_cost.sh")).arg(&bin_dir).arg(out).args(["tiny", "delayed", pairs, "3"]).env("DEVICE", "cpu");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("bash must be installed")
}

/// The `channel_stats_every` a run's manifest records.
fn channel_cadence(run: &Path) -> u64 {
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap();
    m["config"]["record"]["channel_stats_every"].as_u64().unwrap()
}

#[test]
fn stats_cost_takes_each_variant_against_its_rounds_run_without_statistics() {
    let _heavy = common::HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let out = stats_cost(dir.path(), "2", &[("VARIANTS", "--channel-stats-every 1;--channel-stats-every 3")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    // A line a round and variant, named by its flags, then one JSON line a variant over both rounds.
    for p in 1..=2 {
        for flags in ["--channel-stats-every 1", "--channel-stats-every 3"] {
            assert!(text.lines().any(|l| l.starts_with(&format!("pair {p} [{flags}]: ")) && l.contains(" without: ")), "{text}");
        }
    }
    let verdicts: Vec<serde_json::Value> = text.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(verdicts.len(), 2, "{text}");
    for (v, flags) in verdicts.iter().zip(["--channel-stats-every 1", "--channel-stats-every 3"]) {
        assert_eq!(v["stats_flags"], flags);
        assert_eq!(v["pairs"], 2);
        assert!(v["gpu"].as_str().is_some_and(|g| !g.is_empty()), "the card, or none: {v}");
        let (lo, mid, hi) = (v["lowest"].as_f64().unwrap(), v["median_ratio"].as_f64().unwrap(), v["highest"].as_f64().unwrap());
        assert!(lo > 0.0 && lo <= mid && mid <= hi, "{v}");
    }
    // Each variant's runs carry its flags; the first keeps the names of a call without VARIANTS.
    let runs = dir.path().join("runs");
    assert_eq!(channel_cadence(&runs.join("stats-1")), 1);
    assert_eq!(channel_cadence(&runs.join("stats-v1-2")), 3);
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(runs.join("nostats-2/run.json")).unwrap()).unwrap();
    assert_eq!(m["config"]["record"]["stats_every"], 0, "the round's run without statistics");
}

#[test]
fn stats_cost_refuses_bad_input_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    for (pairs, env, says) in [("0", vec![], "PAIRS and STEPS are positive integers"), ("1", vec![("VARIANTS", "")], "VARIANTS is set but names no variant")] {
        let out = stats_cost(dir.path(), pairs, &env);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(says), "{err}");
    }
    let out = Command::new("bash").arg(repo_root().join("bench/stats_cost.sh")).arg(dir.path()).arg(dir.path().join("o")).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no fp8-capture in"));
}

#[test]
fn env_bin_wraps_each_executable_with_its_variables_and_refuses_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dest) = (dir.path().join("bin"), dir.path().join("each"));
    std::fs::create_dir(&src).unwrap();
    let tool = src.join("fp8-capture");
    std::fs::write(&tool, "#!/usr/bin/env bash\necho \"$FP8SCOPE_WEIGHT_CASTS|$SPACED|$*\"\n").unwrap();
    std::fs::write(src.join("notes.txt"), "not a tool").unwrap();
    let chmod = Command::new("chmod").arg("+x").arg(&tool).status().unwrap();
    assert!(chmod.success());
    let env_bin = |args: &[&str]| Command::new("bash").arg(repo_root().join("bench/env_bin.sh")).args(args).output().unwrap();
    let out = env_bin(&[src.to_str().unwrap(), dest.to_str().unwrap(), "FP8SCOPE_WEIGHT_CASTS=each", "SPACED=a b"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!dest.join("notes.txt").exists(), "only executables are wrapped");
    let run = Command::new(dest.join("fp8-capture")).args(["train", "--x y"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&run.stdout).trim(), "each|a b|train --x y");
    for (args, says) in [
        (vec![src.to_str().unwrap(), dest.to_str().unwrap()], "name at least one NAME=VALUE"),
        (vec![src.to_str().unwrap(), dest.to_str().unwrap(), "each"], "is not NAME=VALUE"),
        (vec![dest.join("missing").to_str().unwrap(), dest.to_str().unwrap(), "A=1"], "No such file"),
    ] {
        let out = env_bin(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}
