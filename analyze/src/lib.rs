//! fp8-analyze: loads recorded fp8scope runs and answers why an FP8 run went wrong.
//!
//! - [`load`] opens runs (manifest and part footers checked) and scans their tables with polars;
//! - [`tensors`] streams dumped tensors row group by row group for [`analysis::compare`];
//! - [`analysis`] computes every answer (detectors, noise band, comparisons, ranking, bisection
//!   planning) as typed values, with no flags and no rendering;
//! - [`commands`] holds one file per command: its flags, its call into [`analysis`], its
//!   rendering; [`report`] draws the charts and the page; [`output`] renders tables, CSV and JSON;
//! - [`import`] turns other tools' records (Transformer Engine's debug logs) into runs.
//!
//! `main` only parses the command line and calls [`run`].

pub mod analysis;
pub mod capture_driver;
pub mod cli;
pub mod commands;
pub mod error;
pub mod import;
pub mod load;
pub mod output;
pub mod report;
pub mod tensors;

pub use cli::Cli;
pub use commands::Outcome;
pub use error::AnalyzeError;

use cli::Command;
use load::LoadOptions;

/// Runs the parsed command line.
pub fn run(cli: Cli) -> Result<Outcome, AnalyzeError> {
    // Commands over every rank get `opts`; those that read one rank of a multi-rank run get
    // `opts.one_rank()` (the lowest rank unless --rank names another).
    let opts = LoadOptions { lenient: cli.lenient, rank: cli.rank, one_rank: false };
    match &cli.command {
        Command::Summary(a) => commands::summary::run(a, opts.one_rank(), cli.json),
        Command::Anomalies(a) => commands::anomalies::run(a, opts.one_rank(), cli.json),
        Command::Compare(a) => commands::compare::run(a, opts.one_rank(), cli.json),
        Command::Locate(a) => commands::locate::run(a, opts.one_rank(), cli.json),
        Command::Predict(a) => commands::predict::run(a, opts.one_rank(), cli.json),
        Command::Query(a) => commands::query::run(a, opts, cli.json),
        Command::Whatif(a) => commands::whatif::run(a, opts, cli.json),
        Command::Ranks(a) => commands::ranks::run(a, opts, cli.json),
        Command::Report(a) => commands::report::run(a, opts.one_rank(), cli.json),
        Command::Triage(a) => commands::triage::run(a, cli.json),
        Command::Regress(a) => commands::regress::run(a, cli.json),
        Command::Schedule(a) => commands::schedule::run(a, cli.json),
        Command::Import(a) => import::run(a, cli.json),
    }
}
