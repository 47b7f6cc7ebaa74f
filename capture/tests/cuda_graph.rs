//! The step in CUDA graphs (on by default, `backend/cuda/step_graph/`) against the step
//! launch by launch, on the GPU: whole training runs of `small` (GPT) and `llama-small` recorded
//! both ways in one process, and every table compared bit for bit but the step's wall time.
//! The runs mix the kinds of step a graph must tell apart: statistics levels on their cadences,
//! dump steps (never graphed), and a fault planted mid-run (a new kind from its step on). Without
//! a GPU each test says SKIPPED and passes.

mod cuda_common;

use arrow::record_batch::RecordBatch;
use clap::Parser;
use fp8_capture::backend::cuda::CudaBackend;
use fp8_capture::backend::cuda::step_graph::GraphCounts;
use fp8_capture::cli::{Cli, Command};
use fp8scope_schemas::layout::{RunDir, Table};

/// Trains `preset` on `be` with `flags` into a fresh directory under `dir`; returns the run's path.
fn train(be: &mut CudaBackend, dir: &std::path::Path, name: &str, preset: &str, flags: &[&str]) -> std::path::PathBuf {
    let out = dir.join(name);
    let mut argv: Vec<String> = ["fp8-capture", "train", "--device", "cuda", "--preset", preset].iter().map(|s| s.to_string()).collect();
    argv.extend(flags.iter().map(|s| s.to_string()));
    argv.extend(["--out".to_string(), out.display().to_string()]);
    let Command::Train(t) = Cli::try_parse_from(argv).expect("flags parse").command else { panic!("not train") };
    let cfg = t.validate("cuda").expect("valid flags").config;
    std::fs::create_dir_all(&out).expect("run dir");
    fp8_capture::train::train(be, &cfg, RunDir::new(&out), name.into(), true).expect("the run trains");
    out
}

/// A table of a run in one batch, without the columns named in `skip` (None: the run wrote none
/// of it).
fn table(run: &std::path::Path, t: Table, skip: &[&str]) -> Option<RecordBatch> {
    let parts = fp8scope_schemas::parts::read_table(&RunDir::new(run), t).expect("table");
    let first = parts.first()?;
    let all = arrow::compute::concat_batches(&first.schema(), &parts).expect("one batch");
    let keep: Vec<usize> = all.schema().fields().iter().enumerate().filter(|(_, f)| !skip.contains(&f.name().as_str())).map(|(i, _)| i).collect();
    Some(all.project(&keep).expect("projection"))
}

/// Trains `preset` launch by launch and in graphs, and holds every table of the two runs to the
/// same bits (the steps table but its wall time); returns what the graphs did.
fn both_ways(test: &str, preset: &str, flags: &[&str]) -> Option<GraphCounts> {
    let mut be = cuda_common::gpu(test)?;
    let dir = tempfile::tempdir().expect("temp dir");
    be.set_step_graphs(false).expect("graphs off");
    let plain = train(&mut be, dir.path(), "plain", preset, flags);
    assert_eq!(be.step_graph_counts(), GraphCounts::default(), "graphs off: nothing graphed");
    be.set_step_graphs(true).expect("graphs on");
    let graphed = train(&mut be, dir.path(), "graphed", preset, flags);
    let counts = be.step_graph_counts();
    assert_eq!(be.step_graph_failure(), None, "{preset}: the graphs ran to the end");
    for t in Table::ALL {
        let skip: &[&str] = if t == Table::Steps { &["step_ms"] } else { &[] };
        let (a, b) = match (table(&plain, t, skip), table(&graphed, t, skip)) {
            (Some(a), Some(b)) => (a, b),
            (None, None) => continue,
            (a, b) => panic!("{preset} {t:?}: written by one run only (launched {}, graphed {})", a.is_some(), b.is_some()),
        };
        assert_eq!(a.schema(), b.schema(), "{preset} {t:?}: schema");
        assert_eq!(a.num_rows(), b.num_rows(), "{preset} {t:?}: rows");
        for (i, f) in a.schema().fields().iter().enumerate() {
            assert!(a.column(i).as_ref() == b.column(i).as_ref(), "{preset} {t:?}.{}: graphed steps differ from launched ones", f.name());
        }
        println!("{preset} {t:?}: {} rows, the same bits both ways", a.num_rows());
    }
    println!("{preset}: {counts:?}");
    Some(counts)
}

/// 16 steps of `small` with delayed scaling: channel statistics every 2nd step, the quantisation
/// error every 5th, dumps at steps 1, 6 and 12, and an overflow planted from step 9 on (its steps
/// are new kinds). A kind's first step runs launch by launch, its later ones in graphs: steps 4,
/// 7 and 8 (channels, cheap, channels), then, with the fault, 11, 13 (cheap), 15 (quantisation
/// error) and 16 (channels). The delayed scales, which change every step, reach the graphs
/// through patched arguments.
#[test]
fn a_gpt_run_in_graphs_is_the_run_launch_by_launch() {
    let flags = [
        "--recipe", "delayed", "--steps", "16", "--channel-stats-every", "2", "--quant-error-every", "5", "--dump-every", "6",
        "--inject", "site=layers.1.fc2,gemm=dgrad,kind=overflow,step=9",
    ];
    let Some(c) = both_ways("step graphs, small", "small", &flags) else { return };
    assert_eq!((c.graphed_steps, c.ungraphed_steps), (7, 9), "{c:?}");
    assert!(c.captured >= 1 && c.replayed >= 1 && c.patched_nodes >= 1, "{c:?}");
}

/// 10 steps of `llama-small` with delayed scaling and the default statistics (every step, channels
/// included; the quantisation error never, so that every step is of one kind), then current scaling (its scales computed on the device: nothing to patch but the
/// tables).
#[test]
fn a_llama_run_in_graphs_is_the_run_launch_by_launch() {
    for recipe in ["delayed", "current"] {
        let flags = ["--recipe", recipe, "--steps", "10", "--quant-error-every", "0"];
        let Some(c) = both_ways(&format!("step graphs, llama-small {recipe}"), "llama-small", &flags) else { return };
        // Every step is of one kind (no dumps by default): step 1 launch by launch, 2 to 10 graphed.
        assert_eq!((c.graphed_steps, c.ungraphed_steps), (9, 1), "{recipe}: {c:?}");
        assert!(c.replayed >= c.captured, "{recipe}: most segments replayed: {c:?}");
    }
}
