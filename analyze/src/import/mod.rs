//! `import SOURCE …`: turns what other tools recorded into an ordinary fp8scope run directory, so
//! that every command reads it. One source so far: `te-debug`, the statistics logs of Transformer
//! Engine's debug tooling ([`te_debug`]).

pub mod te_debug;

use crate::commands::Outcome;
use crate::error::AnalyzeError;
use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct ImportArgs {
    #[command(subcommand)]
    pub source: ImportSource,
}

#[derive(Debug, Subcommand)]
pub enum ImportSource {
    /// Transformer Engine / nvdlfw_inspect statistics logs (LogTensorStats, LogFp8TensorStats,
    /// LogNvfp4TensorStats): one `nvdlfw_inspect_statistics_logs/nvdlfw_inspect_globalrank-R.log`
    /// per rank under LOG_DIR.
    #[command(after_help = te_debug::AFTER_HELP)]
    TeDebug(te_debug::TeDebugArgs),
}

/// The command.
pub fn run(args: &ImportArgs, json: bool) -> Result<Outcome, AnalyzeError> {
    match &args.source {
        ImportSource::TeDebug(a) => te_debug::run(a, json),
    }
}
