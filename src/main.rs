//! `fp8scope`: the main job in one command (`cargo run --release`): the whole debugging method on
//! a built-in failure scenario. On the GPU when there is one and on the CPU otherwise, it
//! 1. runs `fp8-analyze triage` on the `tiny` preset with `--scenario drift` (a prompt-heavy batch
//!    inflates delayed scaling's amax history; E4M3 gradients underflow for the rest of the run):
//!    a BF16 baseline, two BF16 replicas (the noise band every gap is judged against) and the FP8
//!    run, the anomaly, each GEMM kind sent back to BF16, the top-ranked GEMM and the bisection to
//!    the culprits, current scaling, the confirmation on a second seed, the verdict;
//! 2. writes the report of the FP8 run against its baseline;
//! 3. prints the verdict and where the runs and the report are.
//!
//! The binary is also a stand-in for `fp8-capture` (`fp8scope train …`), so that triage can record
//! its runs with no other binary built. Flags given to the demo go to every capture
//! (`cargo run --release -- --steps 200`).

use anyhow::Context;
use clap::Parser;
use std::path::PathBuf;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // Called by triage as its capture program: behave exactly like fp8-capture.
    if matches!(args.get(1).map(String::as_str), Some("train" | "presets")) {
        std::process::exit(as_capture());
    }
    if let Err(e) = demo(&args[1..]) {
        eprintln!("fp8scope: {}", e.chain().map(|c| c.to_string()).collect::<Vec<_>>().join(": "));
        std::process::exit(1);
    }
}

/// `fp8scope train …` = `fp8-capture train …`.
fn as_capture() -> i32 {
    let argv = std::iter::once("fp8-capture".to_string()).chain(std::env::args().skip(1));
    let cli = match fp8_capture::cli::Cli::try_parse_from(argv) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fp8-capture: {}", e.render().to_string().lines().next().unwrap_or("bad flags").trim_start_matches("error: "));
            return 2;
        }
    };
    match fp8_capture::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fp8-capture: {}", e.chain().map(|c| c.to_string()).collect::<Vec<_>>().join(": "));
            if e.downcast_ref::<fp8_capture::UsageError>().is_some() { 2 } else { 1 }
        }
    }
}

/// Runs one fp8-analyze command through its library entry point and prints what it says.
fn analyze(args: &[String]) -> anyhow::Result<bool> {
    let argv: Vec<&str> = std::iter::once("fp8-analyze").chain(args.iter().map(String::as_str)).collect();
    println!("\n== {}", argv.join(" "));
    let cli = fp8_analyze::Cli::try_parse_from(&argv).map_err(|e| anyhow::anyhow!("{}", e.render().to_string().lines().next().unwrap_or("bad flags")))?;
    let outcome = fp8_analyze::run(cli).map_err(|e| anyhow::anyhow!("{e}"))?;
    print!("{}", outcome.stdout);
    Ok(outcome.findings)
}

fn demo(extra: &[String]) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("locating this program")?;
    // SAFETY: set before any thread is started.
    unsafe { std::env::set_var(fp8_analyze::capture_driver::CAPTURE_ENV, &exe) };
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let root = PathBuf::from("runs").join(format!("demo-{secs}"));
    let triage_dir = root.join("triage");
    // `--inject SPEC` and `--scenario NAME` given to the demo replace the drift scenario (they are
    // triage's flags); every other flag goes to each capture.
    let (mut failure, mut capture) = (Vec::new(), Vec::new());
    let mut it = extra.iter();
    while let Some(a) = it.next() {
        if a == "--inject" || a == "--scenario" {
            failure.push(a.clone());
            failure.extend(it.next().cloned());
        } else if a.starts_with("--inject=") || a.starts_with("--scenario=") {
            failure.push(a.clone());
        } else {
            capture.push(a.clone());
        }
    }
    if failure.is_empty() {
        println!("fp8scope demo: triage of the built-in drift scenario on the tiny preset");
        failure = vec!["--scenario".into(), "drift".into()];
    } else {
        println!("fp8scope demo: triage of an FP8 run of the tiny preset with {}", failure.join(" "));
    }
    let mut args: Vec<String> = ["triage", "--preset", "tiny"].iter().map(|s| s.to_string()).collect();
    args.extend(failure);
    args.extend(["--out".to_string(), triage_dir.display().to_string()]);
    if !capture.is_empty() {
        args.push("--".into());
        args.extend(capture);
    }
    analyze(&args)?;
    // The report of the FP8 run against its baseline, from the runs triage kept.
    let verdict_path = triage_dir.join("verdict.json");
    let verdict: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&verdict_path).with_context(|| format!("reading {}", verdict_path.display()))?)?;
    let dir_of = |purpose: &str| -> Option<String> {
        verdict["runs"].as_array()?.iter().find(|r| r["outcome"]["purpose"] == purpose).and_then(|r| r["dir"].as_str().map(String::from))
    };
    let (Some(base), Some(fp8)) = (dir_of("baseline"), dir_of("fp8")) else {
        anyhow::bail!("{} names no baseline or FP8 run", verdict_path.display());
    };
    let report = root.join("report");
    analyze(&["report".into(), fp8, "--baseline".into(), base, "--out".into(), report.display().to_string()])?;
    println!("\nEvery run triage recorded is under {}; its verdict is in {}.", triage_dir.display(), triage_dir.join("verdict.txt").display());
    println!("Open {} to see the report.", report.join("index.html").display());
    Ok(())
}
