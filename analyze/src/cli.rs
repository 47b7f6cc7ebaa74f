//! The command line: the commands, each with its help text and an example. Each command's flags
//! are defined once, in its own file under `commands/`, beside the code that validates them.

use clap::{Parser, Subcommand};

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

    /// Of a run recorded by several ranks, read this rank's parts only. Without it, summary,
    /// anomalies, compare, locate and report read the lowest rank's loss, dumps, shadow GEMMs and
    /// events, and every rank's statistics; query and ranks read every rank (each row has a
    /// `rank` column).
    #[arg(long, global = true, value_name = "N")]
    pub rank: Option<u32>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// What was run, how it ended, the loss at checkpoints, the worst tensors by underflow and
    /// saturation.
    #[command(after_help = "Example:\n  fp8-analyze summary runs/fp8 --top 5")]
    Summary(crate::commands::summary::SummaryArgs),

    /// Loss spikes (rolling median + k·MAD), drift from a baseline (EMA of the relative gap), and
    /// the first non-finite step and tensor. Exits 1 when anything is found.
    #[command(after_help = "Example:\n  fp8-analyze anomalies runs/fp8 --baseline runs/bf16 --spike-k 6 --drift-steps 10")]
    Anomalies(crate::commands::anomalies::AnomaliesArgs),

    /// Per (step, layer, module, role): cosine, MSE, relative L2, SQNR dB and max abs diff of the
    /// run's dumped tensors against the baseline's. Exits 1 when a tensor is flagged.
    #[command(after_help = "Example:\n  fp8-analyze compare runs/fp8 --baseline runs/bf16 --only-flagged")]
    Compare(crate::commands::compare::CompareArgs),

    /// Ranks GEMMs by the error each adds over its inputs' error (shadow GEMMs when recorded),
    /// with the step each first crossed the threshold and the FP8 statistics at that step.
    #[command(after_help = "Example:\n  fp8-analyze locate runs/fp8 --baseline runs/bf16 --top 5")]
    Locate(crate::commands::locate::LocateArgs),

    /// Predicts, from one FP8 run recorded with --shadow (CPU backend), the share of its loss gap
    /// each set of GEMMs routed back to BF16 would recover: each kind, the top GEMMs, any set you
    /// name, and the fewest GEMMs that hold 90% of the first-order mass, with the share of the
    /// GEMM FLOPs each set would run in BF16. No run is recorded.
    #[command(after_help = "Example:
  fp8-analyze predict runs/fp8
                              fp8-analyze predict runs/fp8 --set mlp=layers.1.fc1.dgrad,layers.1.fc2.dgrad --json")]
    Predict(crate::commands::predict::PredictArgs),

    /// What another format would do to the run's dumped tensors: each whole dump cast as e4m3 or
    /// e5m2 (per tensor), mxfp8, nvfp4 or block (DeepSeek's tiles) would cast it, with fp8-capture's
    /// exact CPU emulation; per tensor and format the underflow and saturation shares, MSE, cosine
    /// and SQNR. Works on runs of any source with whole dumps, on any machine.
    #[command(after_help = "Example:\n  fp8-analyze whatif runs/fp8\n  fp8-analyze whatif runs/fp8 --formats mxfp8,nvfp4 --step 100 --json")]
    Whatif(crate::commands::whatif::WhatIfArgs),

    /// SQL over the tables steps, stats, tensors, events, shadow and extra_stats of one or many
    /// runs; a `run` column holds each row's run name. Quote the column "values" (an SQL keyword).
    #[command(after_help = "Example:\n  fp8-analyze query runs/fp8 runs/bf16 --format csv \\\n    \
                            --sql \"SELECT run, layer, AVG(underflow_frac) FROM stats GROUP BY run, layer\"")]
    Query(crate::commands::query::QueryArgs),

    /// Across the ranks of a multi-rank run: scales, used amaxes and weight bytes that differ within
    /// a dp, fsdp or tp group, the group each amax was actually reduced over, integrity audits of
    /// the casts, one rank's statistics out of line, the first rank to go non-finite, stragglers,
    /// and ranks stopped, crashed or missing. Exits 1 when anything is found.
    #[command(after_help = "Example:\n  fp8-analyze ranks runs/ddp\n  fp8-analyze ranks runs/ddp --json")]
    Ranks(crate::commands::ranks::RanksArgs),

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

    /// From which step, and which GEMM kind, sent back to BF16 recovers the FP8 run's loss gap at
    /// the least BF16 compute: records the baseline, a replica, the FP8 run and one run per kind ×
    /// switch step (fp8-capture --bf16-gemms K --from-step S), and reports the BF16 share of the
    /// GEMM FLOPs beside each. Exits 1 when no schedule tried recovers the gap.
    #[command(after_help = "Example:\n  fp8-analyze schedule --out runs/sched --preset tiny --scenario drift --from 0,0.5,0.8")]
    Schedule(crate::commands::schedule::ScheduleArgs),

    /// Turns another tool's records into an fp8scope run that every command reads: `te-debug`
    /// imports Transformer Engine's debug statistics logs (nvdlfw_inspect), one per rank.
    #[command(after_help = "Example:\n  fp8-analyze import te-debug /path/to/log_dir --out runs/te\n  fp8-analyze summary runs/te")]
    Import(crate::import::ImportArgs),
}
