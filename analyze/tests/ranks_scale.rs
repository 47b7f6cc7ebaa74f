//! The generator of bench/ranks_scale.sh (ignored in the ordinary test run): a 1,024-rank run as
//! the PyTorch recorder would write it — a mesh of dp 4 × fsdp 32 × tp 8, 16 layers of 4 sites,
//! 200 steps in parts of 50, so that `stats` holds 384 rows per rank per step and `casts` 192 —
//! with one planted fault per check. Written under $RANKS_SCALE_DIR (default
//! /tmp/fp8scope-ranks-scale) as `ranks1024/`; the planted faults are listed in `planted.txt`
//! beside it.
//!
//! ```text
//! RANKS_SCALE_DIR=/tmp/x cargo test --release -p fp8-analyze --test ranks_scale -- --ignored --nocapture
//! ```

mod common;
mod ranks_common;

use fp8scope_schemas::config::RecipeKind;
use fp8scope_schemas::ranks::GroupKind;
use ranks_common::{Ending, Plant, Spec, write};
use std::path::PathBuf;

/// The 1,024-rank run with its planted faults.
fn spec() -> Spec {
    let mut s = Spec::new("ranks1024", &[("dp", GroupKind::Dp, 4), ("fsdp", GroupKind::Fsdp, 32), ("tp", GroupKind::Tp, 8)]);
    s.layers = 16;
    s.steps = 200;
    s.flush_every = 50;
    s.audit_every = 10;
    s.plants = vec![
        Plant::LocalAmax { rank: 517, step: 120, layer: 7, site: "fc2", role: "activation" },
        Plant::Digest { rank: 300, step: 60, layer: 2, site: "qkv" },
        Plant::MasterMismatch { rank: 12, step: 40, layer: 3, site: "fc1", count: 9 },
        Plant::Stale { ranks: vec![42], step: 80, layer: 5, site: "proj" },
        Plant::AuditMismatch { rank: 900, step: 150, layer: 11, site: "fc1", role: "gradient", count: 17 },
        Plant::Underflow { rank: 777, step: 100, layer: 9, site: "fc1", gemm: "dgrad", role: "gradient", frac: 0.35 },
        Plant::Nan { rank: 640, step: 190, layer: 15, site: "fc2", gemm: "wgrad", role: "gradient", count: 3 },
        Plant::Slow { rank: 333, factor: 1.5 },
    ];
    s.last_step.insert(1000, 150);
    s.endings.insert(1000, Ending::Stopped);
    s
}

#[test]
#[ignore = "writes a 1,024-rank run of a few GB: run by bench/ranks_scale.sh"]
fn generate_1024_ranks() {
    let parent = PathBuf::from(std::env::var("RANKS_SCALE_DIR").unwrap_or_else(|_| "/tmp/fp8scope-ranks-scale".into()));
    let spec = spec();
    let dir = parent.join(&spec.name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).unwrap();
    }
    std::fs::create_dir_all(&parent).unwrap();
    let t = std::time::Instant::now();
    let run = write(&parent, &spec, common::config(RecipeKind::Current));
    let mut planted: Vec<String> = spec.plants.iter().map(|p| format!("{p:?}")).collect();
    planted.push("rank 1000: stopped after step 150 (liveness says running, heartbeat an hour old)".into());
    std::fs::write(parent.join("planted.txt"), planted.join("\n") + "\n").unwrap();
    println!("wrote {} in {:.1} s", run.display(), t.elapsed().as_secs_f64());
}
