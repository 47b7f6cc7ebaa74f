//! The command line: every command and flag is defined once here, with its help text and an
//! example. `lib::run` turns these raw values into validated parameters before any work starts.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// Default number of robust standard deviations above the rolling median that makes a spike.
pub const DEFAULT_SPIKE_K: f64 = 6.0;
/// Default length (in recorded steps) of the trailing window of the spike detector.
pub const DEFAULT_SPIKE_WINDOW: usize = 50;
/// Default smallest jump of the relative gap to the baseline that makes a spike against it (5%).
pub const DEFAULT_SPIKE_MIN_GAP: f64 = 0.05;
/// Default relative loss gap to the baseline that counts as drift (1%).
pub const DEFAULT_DRIFT_THRESHOLD: f64 = 0.01;
/// Default weight of the newest step in the EMA of the relative gap.
pub const DEFAULT_DRIFT_ALPHA: f64 = 0.1;
/// Default number of consecutive steps the smoothed gap must stay past the threshold.
pub const DEFAULT_DRIFT_STEPS: usize = 10;
/// Default cosine similarity under which a tensor is flagged.
pub const DEFAULT_COSINE_THRESHOLD: f64 = 0.99;

#[derive(Debug, Parser)]
#[command(
    name = "fp8-analyze",
    version,
    about = "Tells why an FP8 training run went wrong: compares it with its BF16 baseline layer by \
             layer, finds loss spikes, drift and NaN, locates the GEMM that starts the trouble, and \
             answers SQL over recorded runs.",
    after_help = "Exit status: 0 success, 1 findings (anomalies found, tensors flagged), 2 bad input.\n\
                  Example:\n  fp8-analyze anomalies runs/fp8 --baseline runs/bf16\n  \
                  fp8-analyze compare runs/fp8 --baseline runs/bf16 --json"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,

    /// Print machine-readable JSON on stdout instead of tables.
    #[arg(long, global = true)]
    pub json: bool,

    /// Skip truncated or corrupt Parquet parts with a warning on stderr instead of stopping.
    #[arg(long, global = true)]
    pub lenient: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// What was run, how it ended, the loss at checkpoints, the worst tensors by underflow and
    /// saturation.
    #[command(after_help = "Example:\n  fp8-analyze summary runs/fp8 --top 5")]
    Summary(SummaryArgs),

    /// Loss spikes (rolling median + k·MAD), drift from a baseline (EMA of the relative gap), and
    /// the first non-finite step and tensor. Exits 1 when anything is found.
    #[command(after_help = "Example:\n  fp8-analyze anomalies runs/fp8 --baseline runs/bf16 --spike-k 6 --drift-steps 10")]
    Anomalies(AnomaliesArgs),

    /// Per (step, layer, module, role): cosine, MSE, relative L2, SQNR dB and max abs diff of the
    /// run's dumped tensors against the baseline's. Exits 1 when a tensor is flagged.
    #[command(after_help = "Example:\n  fp8-analyze compare runs/fp8 --baseline runs/bf16 --only-flagged")]
    Compare(CompareArgs),

    /// Ranks GEMMs by the error each adds over its inputs' error (shadow GEMMs when recorded),
    /// with the step each first crossed the threshold and the FP8 statistics at that step.
    #[command(after_help = "Example:\n  fp8-analyze locate runs/fp8 --baseline runs/bf16 --top 5")]
    Locate(LocateArgs),

    /// SQL over the tables steps, stats, tensors, events and shadow of one or many runs; a `run`
    /// column holds each row's run name. Quote the column "values" (an SQL keyword).
    #[command(after_help = "Example:\n  fp8-analyze query runs/fp8 runs/bf16 --format csv \\\n    \
                            --sql \"SELECT run, layer, AVG(underflow_frac) FROM stats GROUP BY run, layer\"")]
    Query(QueryArgs),

    /// PNG charts and an index.html with the findings in words: loss against the baseline, layer ×
    /// step heatmaps, amax of the top GEMMs, log2|x| histograms against the FP8 range.
    #[command(after_help = "Example:\n  fp8-analyze report runs/fp8 --baseline runs/bf16 --out report/")]
    Report(crate::commands::report::ReportArgs),

    /// The whole method on one run: records a BF16 baseline and the FP8 run, finds the anomaly,
    /// sends each GEMM kind back to BF16, bisects the sites to the culprits, tries current scaling.
    /// Exits 0 healthy, 1 anomaly (the verdict is printed), 2 bad input.
    #[command(after_help = "Example:\n  fp8-analyze triage --preset tiny --steps 150 --out runs/triage \\\n    \
                            --inject site=layers.1.fc2,gemm=dgrad,kind=overflow,step=50")]
    Triage(crate::commands::triage::TriageArgs),

    /// The blog's pytest: records bf16, fp8, fp8 without dgrad and fp8 with current scaling, and
    /// checks each final loss and gap to bf16 against its bound. Exits 1 when a mode fails.
    #[command(after_help = "Example:\n  fp8-analyze regress --preset tiny --out runs/regress --max-gap 0.02")]
    Regress(crate::commands::regress::RegressArgs),
}

#[derive(Debug, Args)]
pub struct SummaryArgs {
    /// The run directory (holds run.json).
    pub run: PathBuf,
    /// How many tensors to list by underflow and by saturation.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
}

#[derive(Debug, Args)]
pub struct AnomaliesArgs {
    /// The run directory.
    pub run: PathBuf,
    /// A baseline run (usually BF16, same seed): drift from it, and spikes against it instead of in the
    /// run's own curve.
    #[arg(long)]
    pub baseline: Option<PathBuf>,
    /// A spike is a loss more than this many robust standard deviations above the rolling median.
    #[arg(long, default_value_t = DEFAULT_SPIKE_K)]
    pub spike_k: f64,
    /// Trailing window (recorded steps) of the rolling median and MAD.
    #[arg(long, default_value_t = DEFAULT_SPIKE_WINDOW)]
    pub spike_window: usize,
    /// With a baseline, a spike is a jump of the relative gap (run − baseline) / baseline by more
    /// than --spike-k robust σ of its rolling window and by at least this much (0.05 = 5 points).
    #[arg(long, default_value_t = DEFAULT_SPIKE_MIN_GAP)]
    pub spike_min_gap: f64,
    /// Drift: the smoothed relative gap |run − baseline| / baseline must exceed this.
    #[arg(long, default_value_t = DEFAULT_DRIFT_THRESHOLD)]
    pub drift_threshold: f64,
    /// Drift: weight of the newest step in the exponential moving average of the gap (0 < α ≤ 1).
    #[arg(long, default_value_t = DEFAULT_DRIFT_ALPHA)]
    pub drift_alpha: f64,
    /// Drift: consecutive steps the smoothed gap must stay past the threshold.
    #[arg(long, default_value_t = DEFAULT_DRIFT_STEPS)]
    pub drift_steps: usize,
}

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The run directory (usually the FP8 run).
    pub run: PathBuf,
    /// The reference run (usually BF16), same seed, data and dump flags.
    #[arg(long)]
    pub baseline: PathBuf,
    /// Flag tensors whose cosine similarity to the baseline is below this (or not finite).
    #[arg(long, default_value_t = DEFAULT_COSINE_THRESHOLD)]
    pub threshold: f64,
    /// Print only the flagged tensors (the JSON always holds every tensor).
    #[arg(long)]
    pub only_flagged: bool,
}

#[derive(Debug, Args)]
pub struct LocateArgs {
    /// The run directory (usually the FP8 run).
    pub run: PathBuf,
    /// The reference run; needed unless the run recorded shadow GEMMs (`--shadow`).
    #[arg(long)]
    pub baseline: Option<PathBuf>,
    /// Cosine threshold: a GEMM crosses it when the error it adds exceeds 1 − threshold.
    #[arg(long, default_value_t = DEFAULT_COSINE_THRESHOLD)]
    pub threshold: f64,
    /// How many GEMMs to print (the JSON always holds every one).
    #[arg(long, default_value_t = 10)]
    pub top: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Csv,
    Json,
    Parquet,
}

#[derive(Debug, Args)]
pub struct QueryArgs {
    /// One or more run directories.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// The SQL (polars dialect) over the tables steps, stats, tensors, events and shadow.
    #[arg(long)]
    pub sql: String,
    /// Output format (--json is the same as --format json).
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Write the result to this file instead of stdout (required for parquet).
    #[arg(long)]
    pub output: Option<PathBuf>,
}
