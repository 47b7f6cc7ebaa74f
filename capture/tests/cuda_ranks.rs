//! Ranks sharing one GPU (`fp8-capture train --device cuda --dp N / --tp N`): each rank a thread
//! with its own CUDA backend on a stream of its own, the collectives through the host. Against one
//! rank of the same seed on the same GPU: every rank records the same loss, step 1 agrees (the
//! same weights everywhere; only the loss's and the reductions' order differ) and every later
//! step stays within the bound the CPU's ranks keep (2%); a rank planted to die ends the job
//! `crashed`, naming it, within 30 s. `bench/gpu_ranks.sh` measures the full figures. Without a
//! GPU each test says SKIPPED and passes.

mod cuda_common;

use arrow::array::AsArray;
use arrow::datatypes::Float64Type;
use clap::Parser;
use fp8scope_schemas::layout::{RunDir, Table};
use fp8scope_schemas::manifest::{Manifest, RunStatus};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `fp8-capture train --device cuda --quiet FLAGS --out DIR/NAME` in this process; returns the run
/// and the exit status.
fn train(dir: &Path, name: &str, flags: &[&str]) -> (PathBuf, i32) {
    let out = dir.join(name);
    let mut argv: Vec<String> = ["fp8-capture", "train", "--device", "cuda", "--quiet", "--seed", "0"].iter().map(|s| s.to_string()).collect();
    argv.extend(flags.iter().map(|s| s.to_string()));
    argv.extend(["--out".to_string(), out.display().to_string()]);
    let code = fp8_capture::run(fp8_capture::cli::Cli::try_parse_from(argv).expect("flags parse")).unwrap_or_else(|e| {
        println!("{name}: {e:#}");
        1
    });
    (out, code)
}

/// step → loss, asserting that every rank recorded the same.
fn losses(run: &Path) -> BTreeMap<i64, f64> {
    let mut out = BTreeMap::new();
    for b in fp8scope_schemas::parts::read_table(&RunDir::new(run), Table::Steps).expect("steps") {
        let steps = b.column_by_name("step").expect("step").as_primitive::<arrow::datatypes::Int64Type>().clone();
        let loss = b.column_by_name("loss").expect("loss").as_primitive::<Float64Type>().clone();
        for i in 0..b.num_rows() {
            let l = *out.entry(steps.value(i)).or_insert(loss.value(i));
            assert_eq!(l.to_bits(), loss.value(i).to_bits(), "{}: step {}: the ranks record the same loss", run.display(), steps.value(i));
        }
    }
    out
}

/// Trains `preset` under `recipe` on one rank and with `ranks` (e.g. `--dp 2`), and holds the
/// loss of the ranks to one rank's.
fn against_one_rank(test: &str, preset: &str, recipe: &str, ranks: &[&str]) {
    if cuda_common::gpu(test).is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let flags = ["--preset", preset, "--recipe", recipe, "--steps", "30"];
    let (one, code) = train(dir.path(), "one", &flags);
    assert_eq!(code, 0, "one rank completes");
    let (many, code) = train(dir.path(), "ranks", &[&flags[..], ranks].concat());
    assert_eq!(code, 0, "{ranks:?} completes");
    let m = Manifest::read(&many).expect("manifest");
    assert_eq!(m.status, RunStatus::Completed);
    assert!(m.ranks.iter().all(|r| r.device.as_deref() == Some("cuda:0")), "every rank on cuda:0: {:?}", m.ranks);
    let (a, b) = (losses(&one), losses(&many));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>(), "the same steps");
    let rel: Vec<(i64, f64)> = a.iter().map(|(&s, &x)| (s, (b[&s] - x).abs() / x.abs())).collect();
    println!(
        "{preset} {recipe} {ranks:?} on one GPU against one rank: loss step 1 {:.1e}, largest {:.1e}",
        rel[0].1,
        rel.iter().map(|r| r.1).fold(0.0, f64::max)
    );
    assert!(rel[0].1 <= 1e-4, "step 1: the same weights on every rank, loss within 1e-4 of one rank's: {:.2e}", rel[0].1);
    for (s, r) in rel {
        assert!(r <= 0.02, "step {s}: loss within 2% of one rank's: {r:.2e}");
    }
}

#[test]
fn two_data_parallel_ranks_on_one_gpu_train_as_one_rank() {
    against_one_rank("cuda_ranks dp", "tiny", "delayed", &["--dp", "2"]);
}

#[test]
fn two_tensor_parallel_llama_ranks_on_one_gpu_train_as_one_rank() {
    against_one_rank("cuda_ranks tp", "llama-small", "delayed", &["--tp", "2"]);
}

#[test]
fn a_rank_that_dies_on_the_gpu_ends_the_job_crashed_and_named() {
    if cuda_common::gpu("cuda_ranks rank-dies").is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let started = std::time::Instant::now();
    let (run, code) =
        train(dir.path(), "dies", &["--preset", "tiny", "--recipe", "delayed", "--steps", "60", "--dp", "2", "--inject", "kind=rank-dies,rank=1,step=20"]);
    let took = started.elapsed().as_secs_f64();
    let m = Manifest::read(&run).expect("manifest");
    println!("rank-dies on one GPU: exit {code}, {:?} in {took:.1} s: {:?}", m.status, m.error);
    assert_ne!(code, 0, "a crashed job exits non-zero");
    assert_eq!(m.status, RunStatus::Crashed);
    assert!(m.error.as_deref().is_some_and(|e| e.contains("rank 1")), "the error names rank 1: {:?}", m.error);
    assert!(took < 30.0, "crashed within 30 s, not {took:.1} s");
}
