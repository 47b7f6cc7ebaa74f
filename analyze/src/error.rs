//! Errors of the analyzer. Each variant names what the user can act on: the run, the file, the
//! step, the tensor. `main` prints any of them as one line and exits with status 2.

use fp8scope_schemas::SchemaError;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum AnalyzeError {
    /// The run directory, its manifest or a part's footer is wrong (not a run, other schema
    /// version, unreadable manifest).
    #[error(transparent)]
    Schema(#[from] SchemaError),

    /// A Parquet part is truncated or corrupt and `--lenient` was not given.
    #[error("{source} (pass --lenient to skip bad parts)")]
    BadPart { source: SchemaError },

    /// Reading a table of a run failed after its parts' footers were checked.
    #[error("run '{run}': reading table '{table}' failed: {message}")]
    Scan { run: String, table: &'static str, message: String },

    /// Reading the tensors of a part failed in the middle of the file.
    #[error("{path}: {message}")]
    ReadPart { path: PathBuf, message: String },

    /// Two runs that cannot be compared; `reason` says which difference stops it.
    #[error("runs cannot be compared: {reason}")]
    Incompatible { reason: String },

    /// A run lacks what a command needs (no steps, no tensors, no baseline and no shadow table).
    #[error("run '{run}': {message}")]
    Missing { run: String, message: String },

    /// A run whose files contradict the format's promises (e.g. tensors out of step order).
    #[error("run '{run}': {message}")]
    Malformed { run: String, message: String },

    /// The SQL did not parse or plan; `message` is polars' own.
    #[error("SQL error: {message}")]
    Sql { message: String },

    /// The SQL planned but its execution failed.
    #[error("query failed: {message}")]
    Query { message: String },

    /// A flag value or combination that cannot work.
    #[error("{0}")]
    Usage(String),

    /// A line of an imported log that is not what its format promises.
    #[error("{path}:{line}: {message}")]
    BadLog { path: PathBuf, line: usize, message: String },

    /// Writing an output file failed.
    #[error("writing {path}: {message}")]
    Output { path: PathBuf, message: String },
}

impl AnalyzeError {
    pub(crate) fn scan(run: &str, table: &'static str, e: impl std::fmt::Display) -> Self {
        AnalyzeError::Scan { run: run.to_string(), table, message: e.to_string() }
    }
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        AnalyzeError::Usage(message.into())
    }
    pub(crate) fn incompatible(reason: impl Into<String>) -> Self {
        AnalyzeError::Incompatible { reason: reason.into() }
    }
}
