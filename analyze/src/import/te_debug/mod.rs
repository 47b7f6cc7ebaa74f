//! `import te-debug LOG_DIR --out RUN`: Transformer Engine's debug statistics logs as an fp8scope
//! run: its flags, the run's manifest, and the crash-safe write.
//!
//! The run gets `source: te-debug`, an `origin` that lists the module paths in the order first
//! seen, `stats_decimals` (4: the logs round every value to 4 decimals), what it lacks (loss,
//! dumps, shadow, events) and notes on every assumption; a `stats` table with a `rank` column
//! (null for a single log) and the statistics that map to its columns; an `extra_stats` table
//! with the rest under their own names. Like `fp8-capture`, it refuses a directory that holds a
//! run or anything else, writes `run.json` as `running` first, closes every part with its footer
//! before renaming it, and says `completed` last: an import killed midway is never mistaken for a
//! whole run.

pub mod log;
pub mod names;
pub mod rows;

use crate::commands::Outcome;
use crate::error::AnalyzeError;
use crate::output;
use clap::{Args, ValueEnum};
use fp8scope_schemas::config::*;
use fp8scope_schemas::layout::RunDir;
use fp8scope_schemas::manifest::{DataInfo, DeviceInfo, Manifest, Origin, RunSource, RunStatus, lacks, prepare_new_run_dir};
use fp8scope_schemas::names::Role;
use fp8scope_schemas::parts::PartWriter;
use fp8scope_schemas::tables::{ExternalStatRow, ExtraStatRow};
use rows::{RankLines, RowOptions, Rows, build_rows};
use serde::Serialize;
use std::path::PathBuf;

pub const AFTER_HELP: &str = "\
Statistics mapped to fp8scope's stats columns: min, max, mean, std; cur_amax → amax; dynamic_range →
dynamic_range_log2; of the training recipe's cast (no recipe prefix, or its own prefix):
underflows% → underflow_frac (÷100), overflows% → saturated_frac (÷100), scale_inv_max → scale
(1/x), mse → quant_mse; `_columnwise` ones belong to the transposed cast (wgrad, or dgrad for the
weight). Kept under their own names in the extra_stats table: l1_norm, l2_norm, scale_inv_min,
blockwise dynamic ranges, what-if stats of other recipes (mxfp8_underflows% in a delayed-scaling
run), and scale_inv values the logs rounded to 0.0000. The logs round every value to 4 decimals:
the run's manifest says so, and so does every finding that rests on them.

Example:
  fp8-analyze import te-debug /path/to/log_dir --out runs/te --recipe delayed
  fp8-analyze summary runs/te";

/// Transformer Engine recipes, as the flag takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TeRecipe {
    /// No FP8 (the logs hold only high-precision statistics).
    Bf16,
    /// DelayedScaling (fp8_delayed_scaling).
    Delayed,
    /// Float8CurrentScaling (fp8_current_scaling).
    Current,
    /// Float8BlockScaling (fp8_block_scaling).
    Block,
    /// MXFP8BlockScaling (recorded as block scaling).
    Mxfp8,
    /// NVFP4BlockScaling (recorded as block scaling).
    Nvfp4,
}

impl TeRecipe {
    /// TE's name of the recipe in stat prefixes.
    fn te_name(self) -> Option<&'static str> {
        match self {
            TeRecipe::Bf16 => None,
            TeRecipe::Delayed => Some("fp8_delayed_scaling"),
            TeRecipe::Current => Some("fp8_current_scaling"),
            TeRecipe::Block => Some("fp8_block_scaling"),
            TeRecipe::Mxfp8 => Some("mxfp8"),
            TeRecipe::Nvfp4 => Some("nvfp4"),
        }
    }
    fn kind(self) -> RecipeKind {
        match self {
            TeRecipe::Bf16 => RecipeKind::Bf16,
            TeRecipe::Delayed => RecipeKind::Delayed,
            TeRecipe::Current => RecipeKind::Current,
            TeRecipe::Block | TeRecipe::Mxfp8 | TeRecipe::Nvfp4 => RecipeKind::Block,
        }
    }
    /// TE's default formats: HYBRID for the per-tensor recipes, E4M3 for the block ones.
    fn policy(self) -> FormatPolicy {
        match self {
            TeRecipe::Delayed | TeRecipe::Current | TeRecipe::Bf16 => FormatPolicy::Hybrid,
            _ => FormatPolicy::E4m3,
        }
    }
    fn format_of(self) -> fn(Role) -> Option<String> {
        match self {
            TeRecipe::Bf16 => |r| r.is_quantized().then(|| "bf16".to_string()),
            TeRecipe::Delayed | TeRecipe::Current => |r| r.is_quantized().then(|| if r == Role::Gradient { "e5m2" } else { "e4m3" }.to_string()),
            TeRecipe::Block | TeRecipe::Mxfp8 => |r| r.is_quantized().then(|| "e4m3".to_string()),
            TeRecipe::Nvfp4 => |r| r.is_quantized().then(|| "nvfp4".to_string()),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    Cuda,
    Cpu,
}

#[derive(Debug, Args)]
pub struct TeDebugArgs {
    /// The log_dir given to debug_api.initialize (holds nvdlfw_inspect_statistics_logs/), or that
    /// statistics folder itself.
    pub log_dir: PathBuf,
    /// The run directory to create; must not exist or be empty (an existing run is never
    /// overwritten).
    #[arg(long)]
    pub out: PathBuf,
    /// The run's name (default: the --out folder's name).
    #[arg(long)]
    pub name: Option<String>,
    /// The recipe the run trained with. Default: delayed when the logs hold a delayed-scaling
    /// statistic (fp8_delayed_scaling_* or overflows%), bf16 when they hold no FP8 statistic; FP8
    /// statistics of another recipe need this flag, since the logs do not name it.
    #[arg(long, value_enum)]
    pub recipe: Option<TeRecipe>,
    /// fp8scope's step = nvdlfw_inspect's iteration + this (its iterations count from 0 unless
    /// debug_api.initialize got init_training_step; fp8scope's steps from 1).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    pub step_offset: i64,
    /// Where the run trained (the logs do not say).
    #[arg(long, value_enum, default_value_t = DeviceArg::Cuda)]
    pub device: DeviceArg,
}

/// What the import did.
#[derive(Debug, Serialize)]
pub struct ImportReport {
    pub run: String,
    pub out: String,
    pub logs: Vec<String>,
    pub ranks: Vec<u32>,
    pub recipe: TeRecipe,
    pub recipe_inferred: bool,
    pub lines: usize,
    pub mapped_lines: usize,
    pub kept_lines: usize,
    pub stats_rows: u64,
    pub extra_stats_rows: u64,
    pub steps: usize,
    pub first_step: Option<u32>,
    pub last_step: Option<u32>,
    pub modules: usize,
    pub stats_decimals: Option<u32>,
    /// Cut last lines skipped: "file:line".
    pub skipped_lines: Vec<String>,
    pub duplicates: usize,
    pub mapped_stats: Vec<String>,
    pub kept_stats: Vec<String>,
    pub notes: Vec<String>,
}

/// Rows per closed part.
const ROWS_PER_PART: usize = 100_000;

/// The command.
pub fn run(args: &TeDebugArgs, json: bool) -> Result<Outcome, AnalyzeError> {
    let report = import(args)?;
    let stdout = if json { output::json_text(&report) } else { render(&report) };
    Ok(Outcome::clean(stdout))
}

/// Reads the logs, builds the rows and writes the run.
pub fn import(args: &TeDebugArgs) -> Result<ImportReport, AnalyzeError> {
    let logs = log::find_logs(&args.log_dir)?;
    let parsed = logs.iter().map(|l| log::parse_log(&l.path)).collect::<Result<Vec<_>, _>>()?;
    let multi = logs.len() > 1;

    // The training recipe: the flag, or what the statistics' names give away.
    let names: Vec<&str> = parsed.iter().flat_map(|p| p.lines.iter()).filter_map(|l| names::split_name(&l.name).map(|n| n.stat)).collect();
    let (recipe, inferred) = match args.recipe {
        Some(r) => (r, false),
        None => {
            let delayed = names.iter().any(|s| {
                let p = names::stat_parts(s);
                p.recipe == Some("fp8_delayed_scaling") || (p.recipe.is_none() && p.base == "overflows%")
            });
            if delayed {
                (TeRecipe::Delayed, true)
            } else if let Some(s) = names.iter().find(|s| names::is_cast_stat(s)) {
                return Err(AnalyzeError::usage(format!(
                    "the logs hold FP8 statistics ('{s}') but do not say which recipe trained the run; pass --recipe delayed|current|block|mxfp8|nvfp4"
                )));
            } else {
                (TeRecipe::Bf16, true)
            }
        }
    };
    let opts = RowOptions {
        training: recipe.te_name(),
        per_tensor: matches!(recipe, TeRecipe::Delayed | TeRecipe::Current),
        step_offset: args.step_offset,
        format_of: recipe.format_of(),
    };
    let ranks: Vec<RankLines> = logs.iter().zip(&parsed).map(|(l, p)| RankLines { rank: multi.then_some(l.rank), lines: &p.lines }).collect();
    let rows = build_rows(&ranks, &opts).map_err(|(ri, line, message)| AnalyzeError::BadLog { path: logs[ri].path.clone(), line, message })?;
    if rows.lines == 0 {
        return Err(AnalyzeError::usage(format!("{}: the statistics logs hold no statistics line", args.log_dir.display())));
    }
    let skipped: Vec<String> = logs.iter().zip(&parsed).filter_map(|(l, p)| p.truncated_line.map(|n| format!("{}:{n}", l.path.display()))).collect();
    let notes = notes(&rows, recipe, inferred, args.step_offset, &skipped);

    // Write: refuse an existing run, manifest first (running), parts, manifest last.
    prepare_new_run_dir(&args.out)?;
    let name = args.name.clone().unwrap_or_else(|| args.out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "te-debug".into()));
    let mut manifest = manifest(args, &name, recipe, &rows, notes.clone());
    manifest.write(&args.out)?;
    let dir = RunDir::new(&args.out);
    // Several ranks' logs: each rank's rows in its own partition (`stats/rank=00003/`), as every
    // multi-rank writer lays them out; one log: the flat layout.
    let rank_list: Vec<Option<u32>> = if multi { logs.iter().map(|l| Some(l.rank)).collect() } else { vec![None] };
    for rank in rank_list {
        let (mut stats, mut extra) = match rank {
            Some(r) => (PartWriter::<ExternalStatRow>::for_rank(&dir, r)?, PartWriter::<ExtraStatRow>::for_rank(&dir, r)?),
            None => (PartWriter::<ExternalStatRow>::new(&dir)?, PartWriter::<ExtraStatRow>::new(&dir)?),
        };
        let mine: Vec<&ExternalStatRow> = rows.stats.iter().filter(|r| r.rank == rank).collect();
        for chunk in mine.chunks(ROWS_PER_PART) {
            stats.extend(chunk.iter().map(|r| (*r).clone()));
            stats.flush()?;
        }
        let mine: Vec<&ExtraStatRow> = rows.extra.iter().filter(|r| r.rank == rank).collect();
        for chunk in mine.chunks(ROWS_PER_PART) {
            extra.extend(chunk.iter().map(|r| (*r).clone()));
            extra.flush()?;
        }
        manifest.rows.stats += stats.rows_written();
        manifest.rows.extra_stats += extra.rows_written();
    }
    if multi {
        manifest.world_size = Some(logs.iter().map(|l| l.rank + 1).max().unwrap_or(1));
    }
    manifest.ended_at = Some(fp8scope_schemas::manifest::now_rfc3339());
    manifest.pid = None;
    if skipped.is_empty() {
        manifest.status = RunStatus::Completed;
    } else {
        manifest.status = RunStatus::Crashed;
        manifest.error = Some(format!("a log ends in a line cut while being written ({}): training was stopped while logging", skipped.join(", ")));
    }
    manifest.write(&args.out)?;

    Ok(ImportReport {
        run: name,
        out: args.out.display().to_string(),
        logs: logs.iter().map(|l| l.path.display().to_string()).collect(),
        ranks: logs.iter().map(|l| l.rank).collect(),
        recipe,
        recipe_inferred: inferred,
        lines: rows.lines,
        mapped_lines: rows.mapped,
        kept_lines: rows.kept,
        stats_rows: manifest.rows.stats,
        extra_stats_rows: manifest.rows.extra_stats,
        steps: rows.steps.len(),
        first_step: rows.steps.first().copied(),
        last_step: rows.steps.last().copied(),
        modules: rows.modules.len(),
        stats_decimals: rows.decimals,
        skipped_lines: skipped,
        duplicates: rows.duplicates,
        mapped_stats: rows.mapped_names.iter().cloned().collect(),
        kept_stats: rows.kept_names.iter().cloned().collect(),
        notes,
    })
}

/// What the reader of the run should know: the assumptions and what the logs could not give.
fn notes(rows: &Rows, recipe: TeRecipe, inferred: bool, offset: i64, skipped: &[String]) -> Vec<String> {
    let mut n = Vec::new();
    n.push(format!("step = nvdlfw_inspect iteration + {offset}"));
    match (recipe, inferred) {
        (TeRecipe::Bf16, true) => n.push("no FP8 statistic in the logs: recorded as a bf16 run (pass --recipe if it trained in FP8)".into()),
        (_, true) => n.push(format!("recipe {} inferred from the statistics' names", recipe_label(recipe))),
        (_, false) => n.push(format!("recipe {} given by --recipe", recipe_label(recipe))),
    }
    if matches!(recipe, TeRecipe::Mxfp8 | TeRecipe::Nvfp4) {
        n.push(format!("Transformer Engine recipe {} is recorded as block scaling", recipe_label(recipe)));
    }
    n.push("format, amax history and margin are Transformer Engine's defaults, not read from the logs".into());
    n.push("underflow_frac is TE's underflows%: values that cast to 0 over all elements (fp8scope's own runs divide by the non-zero ones)".into());
    n.push("std is torch.std (n − 1 in the denominator); fp8scope's own runs use the population std".into());
    if rows.scale_rounded_to_zero > 0 {
        n.push(format!(
            "{} scale_inv_max value(s) were rounded to 0 by the logs: their scale is null, the logged value kept in extra_stats",
            rows.scale_rounded_to_zero
        ));
    }
    if rows.second_for_column > 0 {
        n.push(format!(
            "{} value(s) were a second statistic for a column another had filled in the same row (e.g. fp8_delayed_scaling_overflows% beside overflows%): the first logged keeps the column, the second is kept in extra_stats",
            rows.second_for_column
        ));
    }
    if rows.duplicates > 0 {
        n.push(format!("{} value(s) were logged twice for one step (a restarted run appends to its log): the later one is kept", rows.duplicates));
    }
    for s in skipped {
        n.push(format!("skipped the last line of a log, cut while being written: {s}"));
    }
    n
}

fn recipe_label(r: TeRecipe) -> &'static str {
    match r {
        TeRecipe::Bf16 => "bf16",
        TeRecipe::Delayed => "delayed",
        TeRecipe::Current => "current",
        TeRecipe::Block => "block",
        TeRecipe::Mxfp8 => "mxfp8",
        TeRecipe::Nvfp4 => "nvfp4",
    }
}

/// The manifest of the imported run (status `running` until every part is closed).
fn manifest(args: &TeDebugArgs, name: &str, recipe: TeRecipe, rows: &Rows, notes: Vec<String>) -> Manifest {
    let last = rows.steps.last().copied().unwrap_or(0);
    let every = rows.steps.iter().zip(rows.steps.iter().skip(1)).map(|(a, b)| b - a).min().unwrap_or(1);
    let layers = rows.modules.iter().map(|m| fp8scope_schemas::names::layer_of_module(m)).max().map_or(0, |l| l + 1);
    let has_int = rows.modules.iter().any(|m| m.split('.').any(|c| !c.is_empty() && c.bytes().all(|b| b.is_ascii_digit())));
    let device = match args.device {
        DeviceArg::Cuda => "cuda",
        DeviceArg::Cpu => "cpu",
    };
    let config = RunConfig {
        preset: "te-debug".into(),
        model: ModelDims {
            vocab: 0,
            channels: 0,
            ffn: 0,
            heads: 0,
            layers: if has_int { layers } else { 0 },
            batch: 0,
            seq: 0,
            attn_mask: AttnMask::Causal,
            arch: Default::default(),
            kv_heads: None,
            rope_theta: None,
            norm_eps: None,
            tie_embeddings: false,
        },
        // TE's logs do not say how its GEMMs accumulated; its recipes' default is fast for fprop.
        recipe: RecipeConfig {
            kind: recipe.kind(),
            format: recipe.policy(),
            amax_history: 1024,
            amax_algo: AmaxAlgo::Max,
            margin: 0,
            overflow: Overflow::Saturate,
            accumulation: Accumulation::FastFprop,
            mx_rounding: Default::default(),
            nvfp4: Default::default(),
            per_gemm: None,
            cpu_accumulator: Default::default(),
        },
        routing: RoutingConfig::default(),
        data: DataConfig {
            kind: DataKind::External,
            path: None,
            paths: Vec::new(),
            tokenizer: None,
            language_seed: 0,
            branching: 0,
            topics: 0,
            zipf_exponent: 1.0,
        },
        train: TrainConfig {
            steps: last,
            lr: 0.0,
            warmup_steps: 0,
            weight_decay: 0.0,
            beta1: 0.0,
            beta2: 0.0,
            eps: 0.0,
            grad_clip: 0.0,
            seed: 0,
            init_jitter: None,
            resume_from: None,
        },
        record: RecordConfig {
            stats_every: every,
            quant_error_every: 1,
            // TE's debug features log no per-channel statistics: those columns stay null.
            channel_stats_every: 0,
            dump_every: 0,
            dump_layers: String::new(),
            dump_roles: Vec::new(),
            dump_max_elems: 0,
            dump_sample: DumpSample::First,
            shadow: false,
            flush_every: 0,
            flight_recorder: 0,
            checkpoint_every: 0,
            checkpoint_at: Vec::new(),
        },
        injections: Vec::new(),
        scenario: None,
        model_config: None,
        scenario_step: None,
        device: device.into(),
    };
    let info = DeviceInfo { kind: device.into(), name: "unknown (not in the logs)".into(), compute_capability: None, parallelism: 0, block_gemm: None };
    let mut m = Manifest::new_running(name.to_string(), config, info, DataInfo { entropy_floor: None, ln_vocab: 0.0 });
    m.writer = format!("fp8-analyze import te-debug {}", env!("CARGO_PKG_VERSION"));
    m.steps_completed = last;
    m.source = RunSource::TeDebug;
    m.origin = Some(Origin {
        framework: "nvdlfw_inspect statistics logs (Transformer Engine debug features; versions not in the logs)".into(),
        modules: rows.modules.clone(),
        stats_decimals: rows.decimals,
        lacks: [lacks::LOSS, lacks::DUMPS, lacks::SHADOW, lacks::EVENTS].map(String::from).to_vec(),
        notes,
    });
    m
}

fn render(r: &ImportReport) -> String {
    let mut s = format!("imported {} statistics line(s) from {} rank log(s) into run '{}' ({})\n", r.lines, r.logs.len(), r.run, r.out);
    s += &format!("  stats        {} row(s) from {} mapped line(s): {}\n", r.stats_rows, r.mapped_lines, r.mapped_stats.join(", "));
    s += &format!(
        "  extra_stats  {} row(s) from {} line(s) kept under their names: {}\n",
        r.extra_stats_rows,
        r.kept_lines,
        if r.kept_stats.is_empty() { "none".into() } else { r.kept_stats.join(", ") }
    );
    s += &format!(
        "  steps        {} ({}–{}), {} module(s), ranks {}\n",
        r.steps,
        output::opt(r.first_step),
        output::opt(r.last_step),
        r.modules,
        r.ranks.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(",")
    );
    s += &format!("  recipe       {}{}\n", recipe_label(r.recipe), if r.recipe_inferred { " (inferred)" } else { "" });
    if let Some(d) = r.stats_decimals {
        s += &format!("  caveat       {}\n", crate::analysis::provenance::rounding_caveat(d));
    }
    if !r.skipped_lines.is_empty() {
        s += &format!("  skipped      {} cut last line(s): {}\n", r.skipped_lines.len(), r.skipped_lines.join(", "));
    }
    for n in &r.notes {
        s += &format!("  note         {n}\n");
    }
    s += &format!("the run lacks a loss curve, dumps, shadow records and events: see `fp8-analyze summary {}`\n", r.out);
    s
}
