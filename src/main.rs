//! `fp8scope`: the main job in one command. Records a BF16 baseline and an FP8 (delayed scaling)
//! run of the `tiny` preset on the CPU into `runs/demo-<time>/`, then prints where they went and
//! how they ended.
//!
//! Run it with `cargo run --release` from the repository root.

use anyhow::Context;
use std::path::PathBuf;

fn main() {
    if let Err(e) = run() {
        eprintln!("fp8scope: {}", e.chain().map(|c| c.to_string()).collect::<Vec<_>>().join(": "));
        std::process::exit(1);
    }
}

fn capture(out: &PathBuf, recipe: &str, extra: &[String]) -> anyhow::Result<fp8scope_schemas::manifest::Manifest> {
    use clap::Parser;
    let mut argv: Vec<String> = ["fp8-capture", "train", "--preset", "tiny", "--device", "cpu", "--recipe", recipe, "--dump-every", "50", "--shadow", "--out"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    argv.push(out.display().to_string());
    argv.extend(extra.iter().cloned());
    let cli = fp8_capture::cli::Cli::try_parse_from(&argv).map_err(|e| anyhow::anyhow!("{}", e.render().to_string().lines().next().unwrap_or("bad flags").to_string()))?;
    println!("== fp8-capture {}", argv[1..].join(" "));
    fp8_capture::run(cli)?;
    fp8scope_schemas::manifest::Manifest::read(out).context("reading the run back")
}

fn run() -> anyhow::Result<()> {
    // Flags given to the demo are passed on to both captures (e.g. `--steps 100`).
    let extra: Vec<String> = std::env::args().skip(1).collect();
    let stamp = chrono_stamp();
    let root = PathBuf::from("runs").join(format!("demo-{stamp}"));
    let bf16 = capture(&root.join("bf16"), "bf16", &extra)?;
    let fp8 = capture(&root.join("fp8-delayed"), "delayed", &extra)?;
    println!();
    println!("Recorded two runs of the tiny preset under {}:", root.display());
    for (m, dir) in [(&bf16, "bf16"), (&fp8, "fp8-delayed")] {
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
    if let (Some(a), Some(b)) = (bf16.final_loss, fp8.final_loss) {
        println!("  FP8 vs BF16 final loss gap: {:+.2}%", (b - a) / a * 100.0);
    }
    if let Some(floor) = bf16.data.entropy_floor {
        println!("  data entropy floor {floor:.4}, ln V {:.4}", bf16.data.ln_vocab);
    }
    Ok(())
}

fn chrono_stamp() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    format!("{secs}")
}
