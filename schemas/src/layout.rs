//! The run directory: where each file of a run lives.
//!
//! ```text
//! runs/<name>/
//!   run.json               the manifest (see `manifest`)
//!   steps/part-00000.parquet …    one row per step
//!   stats/part-*.parquet   per-tensor FP8 statistics
//!   tensors/part-*.parquet sampled tensor values at dump steps
//!   events/part-*.parquet  anomalies the capture itself saw
//!   shadow/part-*.parquet  shadow-GEMM errors at dump steps (with --shadow)
//!   extra_stats/part-*.parquet  statistics with no column of their own (imported runs)
//! ```
//! Parts are written to `part-NNNNN.parquet.tmp` and renamed when closed, so every file that ends in
//! `.parquet` is complete.

use crate::SchemaError;
use std::path::{Path, PathBuf};

/// File name of the manifest inside a run directory.
pub const MANIFEST_FILE: &str = "run.json";
/// Suffix of a part still being written (never read).
pub const PART_TMP_SUFFIX: &str = ".tmp";

/// The tables of a run, each a folder of parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Table {
    Steps,
    Stats,
    Tensors,
    Events,
    Shadow,
    /// Statistics of runs from elsewhere that have no column in `stats`, kept by name.
    ExtraStats,
}

impl Table {
    pub const ALL: [Table; 6] =
        [Table::Steps, Table::Stats, Table::Tensors, Table::Events, Table::Shadow, Table::ExtraStats];
    pub fn as_str(self) -> &'static str {
        match self {
            Table::Steps => "steps",
            Table::Stats => "stats",
            Table::Tensors => "tensors",
            Table::Events => "events",
            Table::Shadow => "shadow",
            Table::ExtraStats => "extra_stats",
        }
    }
    pub fn parse(s: &str) -> Option<Table> {
        Table::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

/// Paths inside one run directory.
#[derive(Clone, Debug)]
pub struct RunDir {
    root: PathBuf,
}

impl RunDir {
    pub fn new(root: impl Into<PathBuf>) -> RunDir {
        RunDir { root: root.into() }
    }
    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn manifest(&self) -> PathBuf {
        self.root.join(MANIFEST_FILE)
    }
    pub fn table_dir(&self, table: Table) -> PathBuf {
        self.root.join(table.as_str())
    }
    pub fn part(&self, table: Table, index: u32) -> PathBuf {
        self.table_dir(table).join(format!("part-{index:05}.parquet"))
    }
    /// The closed parts of a table, in index order (`.tmp` files are skipped).
    pub fn parts(&self, table: Table) -> Result<Vec<PathBuf>, SchemaError> {
        let dir = self.table_dir(table);
        if !dir.exists() {
            return Ok(Vec::new());
        }
        let mut parts = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(|e| SchemaError::io(&dir, e))? {
            let path = entry.map_err(|e| SchemaError::io(&dir, e))?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with("part-") && name.ends_with(".parquet") {
                parts.push(path);
            }
        }
        parts.sort();
        Ok(parts)
    }
    /// Whether `root` looks like a run (has a manifest).
    pub fn is_run(&self) -> bool {
        self.manifest().is_file()
    }
}
