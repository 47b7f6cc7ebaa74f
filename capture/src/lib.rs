//! fp8-capture: trains a transformer with FP8 GEMMs — exactly emulated on the CPU — and records the
//! run (loss, per-tensor FP8 statistics, sampled tensors, anomalies) in the format of
//! `fp8scope-schemas`.
//!
//! The binary (`main.rs`) only parses flags and calls [`run`]; everything else lives here so that
//! tests and the `fp8scope` demo can reach it.

pub mod accumulator;
pub mod backend;
pub mod block_stats;
pub mod channel_stats;
pub mod checkpoint;
pub mod cli;
pub mod collective;
pub mod config;
pub mod data;
pub mod dist;
pub mod flight;
pub mod fp8;
pub mod hf_config;
pub mod interrupt;
pub mod layers;
pub mod micro;
pub mod model;
pub mod oscillation;
pub mod process_clock;
pub mod recipe;
pub mod record;
pub mod replay;
pub mod scenario;
pub mod selection;
pub mod step;
pub mod tensor_stats;
pub mod text;
pub mod train;
pub mod weight_motion;

use anyhow::{Context, bail};
use cli::{Cli, Command, DeviceArg, TrainArgs};
use fp8scope_schemas::layout::RunDir;
use fp8scope_schemas::manifest::{Manifest, RunStatus, prepare_new_run_dir};

/// An error in what the user asked for (a flag, an output directory): exit status 2.
#[derive(Debug, thiserror::Error)]
#[error("{0:#}")]
pub struct UsageError(pub anyhow::Error);

/// Runs a parsed command line. Returns the process exit code for outcomes that are not errors
/// (0 for a completed run, 3 for a diverged one).
pub fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Presets => {
            println!("{:<6} {:>6} {:>5} {:>5} {:>3} {:>3} {:>9}  for", "preset", "V", "C", "F", "NH", "L", "B x T");
            for p in config::PRESETS {
                let (v, c, f, nh, l, b, t) = p.dims;
                println!("{:<6} {v:>6} {c:>5} {f:>5} {nh:>3} {l:>3} {:>9}  {}", p.name, format!("{b} x {t}"), p.about);
            }
            Ok(0)
        }
        Command::Train(args) => train_command(&args),
        Command::Formats { json } => {
            if json {
                println!("{}", serde_json::to_string_pretty(&fp8scope_schemas::quant::contract_json())?);
            } else {
                print!("{}", formats_table());
            }
            Ok(0)
        }
    }
}

/// The quantization contract as text: the formats' constants, then each recipe's operands.
pub fn formats_table() -> String {
    use fp8scope_schemas::config::RecipeKind;
    use fp8scope_schemas::names::Gemm;
    use fp8scope_schemas::quant::{BlockShape, E8m0Rounding, ElementFormat, Nvfp4Switches, default_policy, operand_quant};
    use std::fmt::Write;
    let mut t = String::new();
    let _ = writeln!(t, "{:<6} {:>4} {:>3} {:>3} {:>5} {:>14} {:>14} {:>14}", "format", "bits", "E", "M", "bias", "max finite", "min normal", "min subnormal");
    for f in ElementFormat::ALL {
        let s = f.spec();
        let sub = s.min_subnormal.map_or("-".to_string(), |v| format!("{v:e}"));
        let _ = writeln!(
            t,
            "{:<6} {:>4} {:>3} {:>3} {:>5} {:>14e} {:>14e} {:>14}",
            s.name, s.bits, s.exponent_bits, s.mantissa_bits, s.bias, s.max_finite, s.min_normal, sub
        );
    }
    let _ = writeln!(t, "\nE8M0 roundings (--mx-rounding):");
    for r in E8m0Rounding::ALL {
        let _ = writeln!(t, "  {:<4} {}", r.as_str(), r.about());
    }
    let _ = writeln!(t, "\nrecipe   gemm   role        element  block      scale                   rht  stochastic   (default --format and switches)");
    for recipe in RecipeKind::ALL {
        for gemm in Gemm::ALL {
            for role in gemm.operands() {
                let Some(q) = operand_quant(recipe, default_policy(recipe), E8m0Rounding::Te, Nvfp4Switches::default(), gemm, role) else { continue };
                let block = match q.block {
                    BlockShape::Tensor => "tensor".to_string(),
                    BlockShape::Tile { rows, cols } => format!("{rows}x{cols}"),
                };
                let _ = writeln!(
                    t,
                    "{:<8} {:<6} {:<11} {:<8} {:<10} {:<23} {:<4} {}",
                    recipe.as_str(),
                    gemm.as_str(),
                    role.as_str(),
                    q.element.name(),
                    block,
                    q.scale.name(),
                    q.rht,
                    q.stochastic
                );
            }
        }
    }
    t
}

/// The device a run uses: `auto` is CUDA when a GPU of compute capability ≥ 8.9 is found (and the
/// recipe runs there), else the CPU; `cuda` without such a GPU is an error saying why, in one line.
pub fn resolve_device(arg: DeviceArg, recipe: cli::RecipeSpec) -> anyhow::Result<&'static str> {
    let block = recipe.cpu_only();
    match arg {
        DeviceArg::Cpu => Ok("cpu"),
        DeviceArg::Cuda if matches!(recipe, cli::RecipeSpec::PerGemm(_)) => {
            bail!("--device cuda: per-GEMM recipes run on the CPU only (the CUDA backend takes one recipe for every GEMM); use --device cpu")
        }
        DeviceArg::Cuda if matches!(recipe, cli::RecipeSpec::One(cli::RecipeArg::Mxfp8 | cli::RecipeArg::Nvfp4)) => {
            let name = if matches!(recipe, cli::RecipeSpec::One(cli::RecipeArg::Mxfp8)) { "mxfp8" } else { "nvfp4" };
            bail!("--device cuda: the {name} recipe is emulated on the CPU only (the CUDA backend has no {name} casts yet); use --device cpu")
        }
        DeviceArg::Auto => Ok(if !block && gpu_usable().is_ok() { "cuda" } else { "cpu" }),
        DeviceArg::Cuda => {
            if let Err(e) = gpu_usable() {
                bail!("--device cuda: {e}; use --device cpu");
            }
            if block {
                bail!("--device cuda: the block recipe is not implemented on the CUDA backend yet; use --device cpu");
            }
            Ok("cuda")
        }
    }
}

/// Ok when GPU 0 exists and has FP8 tensor cores (compute capability ≥ 8.9).
pub fn gpu_usable() -> Result<(), backend::cuda::CudaError> {
    let (name, (major, minor)) = backend::cuda::probe_gpu()?;
    if (major, minor) < (8, 9) {
        return Err(backend::cuda::CudaError::OldGpu { name, major, minor });
    }
    Ok(())
}

/// `fp8-capture train`: validate, prepare the directory, train on the chosen device, report.
pub fn train_command(args: &TrainArgs) -> anyhow::Result<i32> {
    // The ranks of --dp and --tp run as threads of this process, on the CPU unless --device cuda
    // puts them all on GPU 0: `auto` means the CPU then.
    let device =
        if args.dp * args.tp > 1 && matches!(args.device, DeviceArg::Auto) { "cpu" } else { resolve_device(args.device, args.recipe).map_err(UsageError)? };
    let plan = args.validate(device).map_err(UsageError)?;
    if let Some(r) = &plan.config.train.resume_from {
        checkpoint::check(std::path::Path::new(&r.run), r.step, &plan.config).map_err(UsageError)?;
    }
    if let Some(n) = args.threads {
        // Ignore the error of a pool that already exists (a second run in one process).
        let _ = rayon::ThreadPoolBuilder::new().num_threads(n as usize).build_global();
    }
    // Start the GPU (kernels compiled, libraries loaded) before anything touches the disk.
    let gpu = args.gpu as usize;
    let mut cuda = if device == "cuda" { Some(backend::cuda::CudaBackend::open(gpu, false).context("starting the CUDA backend")?) } else { None };
    if let Some(note) = cuda.as_ref().and_then(|be| be.attention_note(plan.config.model.channels as usize, plan.config.model.heads as usize)) {
        eprintln!("note: {note}");
    }
    prepare_new_run_dir(&plan.out).map_err(|e| UsageError(e.into()))?;
    let run = RunDir::new(&plan.out);
    interrupt::install();
    let outcome = if plan.dist.world() > 1 {
        let (cfg, dist, name) = (&plan.config, &plan.dist, plan.name.clone());
        let manifest = if cuda.is_some() {
            // The kernels are loaded (and NVRTC's disk cache filled) once above; each rank opens
            // its own backend on the same GPU, on a stream of its own.
            drop(cuda.take());
            let open = |_rank: u32| backend::cuda::CudaBackend::open(gpu, true).context("starting the CUDA backend");
            let device = format!("cuda:{gpu}");
            dist::driver::train_ranks(cfg, dist, dist::driver::RankDevice { name: &device, open: &open }, run.clone(), name, args.quiet)
        } else {
            let open = |_rank: u32| Ok(backend::cpu::CpuBackend::for_recipe(&cfg.recipe));
            dist::driver::train_ranks(cfg, dist, dist::driver::RankDevice { name: "cpu", open: &open }, run.clone(), name, args.quiet)
        };
        manifest.map(|manifest| train::Outcome { manifest, died_before: None })
    } else if let Some(be) = cuda.as_mut() {
        train::train(be, &plan.config, run.clone(), plan.name.clone(), args.quiet)
    } else {
        let mut be = backend::cpu::CpuBackend::for_recipe(&plan.config.recipe);
        train::train(&mut be, &plan.config, run.clone(), plan.name.clone(), args.quiet)
    };
    let manifest = match outcome {
        Ok(o) => o.manifest,
        Err(e) => {
            // Say in the manifest why the run stopped; the closed parts stay as they are.
            if let Ok(mut m) = Manifest::read(run.root()) {
                m.status = RunStatus::Crashed;
                m.error = Some(format!("{e:#}"));
                m.ended_at = Some(fp8scope_schemas::manifest::now_rfc3339());
                m.pid = None;
                let _ = m.write(run.root());
            }
            return Err(e).with_context(|| format!("run {} crashed", plan.out.display()));
        }
    };
    if !args.quiet {
        let floor = manifest.data.entropy_floor.map(|f| format!(", entropy floor {f:.4}")).unwrap_or_default();
        let fl = manifest.final_loss.map(|l| format!("{l:.4}")).unwrap_or_else(|| "n/a".into());
        println!(
            "{}: {} after {} steps, final loss {fl} (ln V = {:.4}{floor}) -> {}",
            manifest.name,
            manifest.status.as_str(),
            manifest.steps_completed,
            manifest.data.ln_vocab,
            plan.out.display()
        );
    }
    // A job of several ranks that crashed (a rank failed or stopped) is an error, in one line.
    if plan.dist.world() > 1 && manifest.status == RunStatus::Crashed && !manifest.error.as_deref().unwrap_or("").contains("interrupted by a signal") {
        bail!("run {} crashed: {}", plan.out.display(), manifest.error.as_deref().unwrap_or("a rank failed"));
    }
    Ok(match manifest.status {
        RunStatus::Diverged => 3,
        RunStatus::Crashed => 130,
        _ => 0,
    })
}
