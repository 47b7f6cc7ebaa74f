//! Errors of the run format: what can be wrong with a run directory, a manifest or a Parquet part.

use std::path::PathBuf;

/// Everything that can go wrong reading or writing the run format. Each variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is not an fp8scope run directory (no run.json)")]
    NotARun { path: PathBuf },
    #[error("{path}: invalid manifest: {message}")]
    BadManifest { path: PathBuf, message: String },
    #[error(
        "{path}: written with schema version {found}, this build reads version(s) {supported:?}; \
         re-record the run or use a matching fp8scope build"
    )]
    UnsupportedVersion { path: PathBuf, found: u32, supported: Vec<u32> },
    #[error("{path}: unreadable or truncated Parquet part: {message}")]
    BadPart { path: PathBuf, message: String },
    #[error("{path}: table '{found}' found where '{expected}' was expected")]
    WrongTable { path: PathBuf, expected: String, found: String },
    #[error("{path} already holds a run ({name}); choose another --out or remove it first")]
    RunExists { path: PathBuf, name: String },
    #[error("{path} exists and is not an empty directory; refusing to write a run into it")]
    NotEmpty { path: PathBuf },
    #[error("writing {path}: {message}")]
    Write { path: PathBuf, message: String },
}

impl SchemaError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        SchemaError::Io { path: path.into(), source }
    }
}
