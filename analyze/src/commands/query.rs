//! `query RUN... --sql '…'`: polars SQL over the tables `steps`, `stats`, `tensors`, `events`,
//! `shadow` and `extra_stats` of every run given, each a lazy scan of the run's checked parts with a first column
//! `run` (the run's name) so that one query compares runs. Out as an aligned table, CSV, JSON or
//! Parquet, on stdout or in `--output FILE`.

use crate::commands::Outcome;
use crate::error::AnalyzeError;
use crate::load::{LoadOptions, Run, scan_union};
use crate::output;
use clap::{Args, ValueEnum};
use fp8scope_schemas::layout::Table;
use polars::prelude::*;
use polars::sql::SQLContext;
use std::path::PathBuf;

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
    /// The SQL (polars dialect) over the tables steps, stats, tensors, events, shadow and
    /// extra_stats (statistics of imported runs kept under their own names).
    #[arg(long)]
    pub sql: String,
    /// Output format (--json is the same as --format json).
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Write the result to this file instead of stdout (required for parquet).
    #[arg(long)]
    pub output: Option<PathBuf>,
}

/// A SQL context with every table of `runs` registered under its name.
pub fn context(runs: &[Run]) -> Result<SQLContext, AnalyzeError> {
    let ctx = SQLContext::new();
    for table in Table::ALL {
        ctx.register(table.as_str(), scan_union(runs, table, &[])?);
    }
    Ok(ctx)
}

/// Runs `sql` over `runs`.
pub fn query(runs: &[Run], sql: &str) -> Result<DataFrame, AnalyzeError> {
    let mut ctx = context(runs)?;
    let lf = ctx.execute(sql).map_err(|e| AnalyzeError::Sql { message: e.to_string() })?;
    lf.collect().map_err(|e| AnalyzeError::Query { message: e.to_string() })
}

/// The command.
pub fn run(args: &QueryArgs, opts: LoadOptions, json: bool) -> Result<Outcome, AnalyzeError> {
    let format = if json { Format::Json } else { args.format };
    if format == Format::Parquet && args.output.is_none() {
        return Err(AnalyzeError::usage("--format parquet needs --output FILE"));
    }
    let runs = Run::open_many(&args.runs, opts)?;
    let mut df = query(&runs, &args.sql)?;
    let text = match format {
        Format::Table => output::frame_table(&df)?,
        Format::Csv => output::frame_csv(&df)?,
        Format::Json => output::frame_json(&df)?,
        Format::Parquet => {
            if let Some(path) = &args.output {
                output::frame_parquet(&mut df, path)?;
            }
            return Ok(Outcome::clean(String::new()));
        }
    };
    match &args.output {
        Some(path) => {
            output::write_file(path, &text)?;
            Ok(Outcome::clean(String::new()))
        }
        None => Ok(Outcome::clean(text)),
    }
}
