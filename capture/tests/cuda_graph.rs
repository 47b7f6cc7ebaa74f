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
    // A training step has nothing to run at once: none leaves its recording (that would be
    // correct, only slower).
    assert_eq!(counts.left_steps, 0, "{preset}: no recorded step left its recording: {counts:?}");
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
/// through patched arguments. The overflow saturates step 9's dgrad operand, which fires the
/// anomaly replay: step 9 is launched again with every statistic, one more step launch (graphed:
/// 8 graphed in all, 9 launch by launch), and the tables are still the same bits both ways.
#[test]
fn a_gpt_run_in_graphs_is_the_run_launch_by_launch() {
    let flags = [
        "--recipe",
        "delayed",
        "--steps",
        "16",
        "--channel-stats-every",
        "2",
        "--quant-error-every",
        "5",
        "--dump-every",
        "6",
        "--inject",
        "site=layers.1.fc2,gemm=dgrad,kind=overflow,step=9",
    ];
    let Some(c) = both_ways("step graphs, small", "small", &flags) else { return };
    assert_eq!((c.graphed_steps, c.ungraphed_steps), (8, 9), "{c:?}");
    assert!(c.captured >= 1 && c.replayed >= 1 && c.patched_nodes >= 1, "{c:?}");
}

/// 10 steps of `llama-small` with delayed scaling and statistics every step, channels included
/// (the quantisation error never, so that every step is of one kind), then current scaling (its
/// scales computed on the device: nothing to patch but the tables).
#[test]
fn a_llama_run_in_graphs_is_the_run_launch_by_launch() {
    for recipe in ["delayed", "current"] {
        let flags = ["--recipe", recipe, "--steps", "10", "--quant-error-every", "0", "--channel-stats-every", "1"];
        let Some(c) = both_ways(&format!("step graphs, llama-small {recipe}"), "llama-small", &flags) else { return };
        // Every step is of one kind (no dumps by default): step 1 launch by launch, 2 to 10 graphed.
        assert_eq!((c.graphed_steps, c.ungraphed_steps), (9, 1), "{recipe}: {c:?}");
        assert!(c.replayed >= c.captured, "{recipe}: most segments replayed: {c:?}");
    }
}

/// A recorded step that must run work at once leaves its recording instead of failing, and runs
/// its rest launch by launch with the values a step launch by launch gives: a read of the device
/// mid-way (it sees every op recorded before it), and a GEMM shape first met in a recorded step
/// (timed then). The next step of the kind is recorded whole again.
#[test]
fn a_step_that_must_run_work_at_once_leaves_its_recording() {
    use fp8_capture::backend::{Backend, GemmCall, GemmId, LinearDims};
    use fp8scope_schemas::names::{Gemm, Module};
    let Some(mut be) = cuda_common::gpu("step graphs, leaving a recorded step") else { return };
    be.set_step_graphs(true).expect("graphs on");
    let (n, k) = (64usize, 32usize);
    let x = be.upload(&(0..n * k).map(|i| (i % 13) as f32 / 8.0 - 0.75).collect::<Vec<f32>>());
    let weight = |be: &mut CudaBackend, m: usize| be.upload(&(0..m * k).map(|i| (i % 7) as f32 / 16.0 - 0.2).collect::<Vec<f32>>());
    let (w48, w80) = (weight(&mut be, 48), weight(&mut be, 80));
    let gemm = |be: &mut CudaBackend, w: &_, m: usize| {
        let call = GemmCall::bf16(GemmId { layer: 0, module: Module::Fc1, gemm: Gemm::Fprop }, LinearDims { n, k, m });
        let mut out = be.zeros(n * m);
        be.gemm(&call, &mut out, &x, w, None, None);
        out
    };
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<u32>>();
    let read = |be: &mut CudaBackend, b: &_| {
        let len = be.len(b);
        bits(be.download(b, 0, len, 1))
    };
    // Kind 7: y = x + x, a read of y, y += x, a GEMM. Step 1 launched, step 2 recorded until the read.
    let reading_step = |be: &mut CudaBackend| {
        be.begin_step_work(Some(7));
        let mut y = be.zeros(n * k);
        be.add(&mut y, &x, &x);
        let mid = read(be, &y);
        be.add_inplace(&mut y, &x);
        let out = gemm(be, &w48, 48);
        be.end_step_work();
        be.take_reports();
        (mid, read(be, &y), read(be, &out))
    };
    let first = reading_step(&mut be);
    let xs = be.download(&x, 0, n * k, 1);
    assert_eq!(first.0, bits(xs.iter().map(|v| v + v).collect()), "the read sees the add before it");
    assert_eq!(reading_step(&mut be), first, "a recorded step that reads mid-way");
    let c = be.step_graph_counts();
    assert_eq!((c.graphed_steps, c.left_steps), (1, 1), "{c:?}");
    // Kind 8: y = x + x, then a GEMM of M columns: step 1 with M 48 (launched), step 2 with M 80,
    // a shape never timed (recorded until the GEMM), step 3 with M 80 again (recorded whole).
    let gemm_step = |be: &mut CudaBackend, m: usize| {
        be.begin_step_work(Some(8));
        let mut y = be.zeros(n * k);
        be.add(&mut y, &x, &x);
        let out = gemm(be, if m == 48 { &w48 } else { &w80 }, m);
        be.end_step_work();
        be.take_reports();
        (read(be, &y), read(be, &out))
    };
    gemm_step(&mut be, 48);
    let timed = be.gemm_shapes_timed();
    let timed_inside = gemm_step(&mut be, 80);
    // The new shape is timed unless its algorithm was cached by an earlier run or cuBLASLt
    // offers one candidate only; timing it leaves the recording.
    let left = (be.gemm_shapes_timed() > timed) as u64;
    println!("the new GEMM shape was {}timed inside the recorded step", if left == 1 { "" } else { "not (cached, or one candidate) " });
    let c = be.step_graph_counts();
    assert_eq!((c.graphed_steps, c.left_steps), (2, 1 + left), "a timed shape left the recording: {c:?}");
    let recorded_whole = gemm_step(&mut be, 80);
    let c = be.step_graph_counts();
    assert_eq!((c.graphed_steps, c.left_steps), (3, 1 + left), "the next step of the kind is recorded whole: {c:?}");
    assert_eq!(be.take_error(), None, "no step failed");
    assert_eq!(be.step_graph_failure(), None);
    be.set_step_graphs(false).expect("graphs off");
    let plain = gemm(&mut be, &w80, 80);
    let plain = read(&mut be, &plain);
    assert_eq!(timed_inside.0, first.0);
    assert_eq!(timed_inside.1, plain, "the GEMM timed inside a recorded step");
    assert_eq!(recorded_whole, timed_inside, "the same step recorded whole");
}
