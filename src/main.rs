//! `fp8scope`: the main job in one command (`cargo run --release`). Records, on the GPU when there
//! is one and on the CPU otherwise, three runs of the `tiny` preset into `runs/demo-<time>/`:
//! a BF16 baseline, a healthy FP8 run (delayed scaling), and an FP8 run with a planted defect (a
//! saturating mis-scale in `layers.1.fc2`'s dgrad from step 100); then lets fp8-analyze find the
//! anomaly, locate the GEMM that causes it, and write a report, and prints the findings and where
//! the report is.
//!
//! Flags given to the demo are passed on to every capture (e.g. `cargo run --release -- --steps 200`).

use anyhow::Context;
use clap::Parser;
use std::path::{Path, PathBuf};

fn main() {
    if let Err(e) = run() {
        eprintln!("fp8scope: {}", e.chain().map(|c| c.to_string()).collect::<Vec<_>>().join(": "));
        std::process::exit(1);
    }
}

/// Records one run with fp8-capture's library entry point.
fn capture(out: &Path, flags: &[&str], extra: &[String]) -> anyhow::Result<fp8scope_schemas::manifest::Manifest> {
    let mut argv: Vec<String> = ["fp8-capture", "train", "--preset", "tiny", "--device", "auto", "--dump-every", "50", "--shadow", "--quiet"]
        .iter()
        .chain(flags)
        .map(|s| s.to_string())
        .collect();
    argv.push("--out".into());
    argv.push(out.display().to_string());
    argv.push("--name".into());
    argv.push(out.file_name().and_then(|n| n.to_str()).unwrap_or("run").to_string());
    argv.extend(extra.iter().cloned());
    println!("== fp8-capture {}", argv[1..].join(" "));
    let cli = fp8_capture::cli::Cli::try_parse_from(&argv)
        .map_err(|e| anyhow::anyhow!("{}", e.render().to_string().lines().next().unwrap_or("bad flags").to_string()))?;
    fp8_capture::run(cli)?;
    fp8scope_schemas::manifest::Manifest::read(out).context("reading the run back")
}

/// Runs one fp8-analyze command through its library entry point and prints what it says.
fn analyze(args: &[&str]) -> anyhow::Result<()> {
    let argv: Vec<&str> = std::iter::once("fp8-analyze").chain(args.iter().copied()).collect();
    println!("\n== {}", argv.join(" "));
    let cli = fp8_analyze::Cli::try_parse_from(&argv).map_err(|e| anyhow::anyhow!("{}", e.render().to_string().lines().next().unwrap_or("bad flags").to_string()))?;
    let outcome = fp8_analyze::run(cli).map_err(|e| anyhow::anyhow!("{e}"))?;
    print!("{}", outcome.stdout);
    Ok(())
}

fn run() -> anyhow::Result<()> {
    let extra: Vec<String> = std::env::args().skip(1).collect();
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let root = PathBuf::from("runs").join(format!("demo-{secs}"));
    let (bf16_dir, fp8_dir, bad_dir) = (root.join("bf16"), root.join("fp8-delayed"), root.join("fp8-planted"));
    let bf16 = capture(&bf16_dir, &["--recipe", "bf16"], &extra)?;
    let fp8 = capture(&fp8_dir, &["--recipe", "delayed"], &extra)?;
    let bad = capture(&bad_dir, &["--recipe", "delayed", "--inject", "site=layers.1.fc2,gemm=dgrad,kind=overflow,step=100"], &extra)?;
    println!("\nRecorded three runs of the tiny preset under {} (on {}):", root.display(), bf16.device.name);
    for (m, dir) in [(&bf16, "bf16"), (&fp8, "fp8-delayed"), (&bad, "fp8-planted")] {
        println!(
            "  {:<12} {:<9} final loss {:>7}  rows: steps {} stats {} tensors {} shadow {}",
            dir,
            m.status.as_str(),
            m.final_loss.map(|l| format!("{l:.4}")).unwrap_or_else(|| "n/a".into()),
            m.rows.steps,
            m.rows.stats,
            m.rows.tensors,
            m.rows.shadow
        );
    }
    if let Some(floor) = bf16.data.entropy_floor {
        println!("  data entropy floor {floor:.4}, ln V {:.4}", bf16.data.ln_vocab);
    }
    let (b, f, p) = (bf16_dir.display().to_string(), fp8_dir.display().to_string(), bad_dir.display().to_string());
    analyze(&["anomalies", &f, "--baseline", &b])?;
    analyze(&["anomalies", &p, "--baseline", &b])?;
    analyze(&["locate", &p, "--top", "5"])?;
    let report = root.join("report");
    analyze(&["report", &f, &p, "--baseline", &b, "--out", &report.display().to_string()])?;
    println!("\nOpen {} to see the report.", report.join("index.html").display());
    Ok(())
}
