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
//!   casts/part-*.parquet   the module's own FP8 casts and their integrity audits (runs from elsewhere)
//! ```
//! A run of several processes partitions every table by rank, Hive style, so that polars, DuckDB and
//! Spark read all ranks with one glob, and one rank is one folder:
//! ```text
//!   stats/rank=00003/part-00000.parquet …
//!   ranks/rank=00003.json  the rank's liveness: its status and a heartbeat with each closed part
//! ```
//! A one-process run may use either layout (`fp8-capture` writes the flat one).
//! Parts are written to `part-NNNNN.parquet.tmp` and renamed when closed, so every file that ends in
//! `.parquet` is complete.

use crate::SchemaError;
use std::path::{Path, PathBuf};

/// File name of the manifest inside a run directory.
pub const MANIFEST_FILE: &str = "run.json";
/// Suffix of a part still being written (never read).
pub const PART_TMP_SUFFIX: &str = ".tmp";
/// Prefix of a table's rank partition folder (`rank=00003`) and of a rank's liveness file.
pub const RANK_PARTITION_PREFIX: &str = "rank=";
/// Digits of the rank in partition names (zero-padded, so that names sort by rank).
pub const RANK_DIGITS: usize = 5;
/// Folder of the per-rank liveness files.
pub const RANKS_DIR: &str = "ranks";

/// `rank=00003`: the partition folder of `rank` in every table, and the stem of its liveness file.
pub fn rank_partition(rank: u32) -> String {
    format!("{RANK_PARTITION_PREFIX}{rank:0RANK_DIGITS$}")
}

/// The rank of a partition folder or liveness file name (`rank=00003`, `rank=00003.json`).
pub fn rank_of_partition(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(RANK_PARTITION_PREFIX)?;
    let digits = rest.strip_suffix(".json").unwrap_or(rest);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

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
    /// The module's own FP8 casts (its scale, the local and used amax) and the integrity audits.
    Casts,
}

impl Table {
    pub const ALL: [Table; 7] = [Table::Steps, Table::Stats, Table::Tensors, Table::Events, Table::Shadow, Table::ExtraStats, Table::Casts];
    pub fn as_str(self) -> &'static str {
        match self {
            Table::Steps => "steps",
            Table::Stats => "stats",
            Table::Tensors => "tensors",
            Table::Events => "events",
            Table::Shadow => "shadow",
            Table::ExtraStats => "extra_stats",
            Table::Casts => "casts",
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
    /// The folder of `rank`'s parts of `table` in a partitioned run.
    pub fn rank_table_dir(&self, table: Table, rank: u32) -> PathBuf {
        self.table_dir(table).join(rank_partition(rank))
    }
    /// Part `index` of `rank`'s partition of `table`.
    pub fn rank_part(&self, table: Table, rank: u32, index: u32) -> PathBuf {
        self.rank_table_dir(table, rank).join(format!("part-{index:05}.parquet"))
    }
    /// The folder of the per-rank liveness files.
    pub fn ranks_dir(&self) -> PathBuf {
        self.root.join(RANKS_DIR)
    }
    /// The liveness file of `rank`.
    pub fn rank_file(&self, rank: u32) -> PathBuf {
        self.ranks_dir().join(format!("{}.json", rank_partition(rank)))
    }
    /// The closed parts of a table: those of a flat layout in index order, then those of each rank
    /// partition, by rank and index (`.tmp` files are skipped).
    pub fn parts(&self, table: Table) -> Result<Vec<PathBuf>, SchemaError> {
        let dir = self.table_dir(table);
        let mut parts = closed_parts_in(&dir)?;
        for (_, rank_dir) in self.partitions(table)? {
            parts.extend(closed_parts_in(&rank_dir)?);
        }
        Ok(parts)
    }
    /// The closed parts of `rank`'s partition of `table` (those of the flat layout for rank 0 of a
    /// run that has no partitions).
    pub fn rank_parts(&self, table: Table, rank: u32) -> Result<Vec<PathBuf>, SchemaError> {
        closed_parts_in(&self.rank_table_dir(table, rank))
    }
    /// The rank partitions of `table`: (rank, folder), by rank.
    pub fn partitions(&self, table: Table) -> Result<Vec<(u32, PathBuf)>, SchemaError> {
        let dir = self.table_dir(table);
        if !dir.is_dir() {
            return Ok(Vec::new());
        }
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(|e| SchemaError::io(&dir, e))? {
            let path = entry.map_err(|e| SchemaError::io(&dir, e))?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if let Some(rank) = rank_of_partition(name)
                && path.is_dir()
            {
                found.push((rank, path));
            }
        }
        found.sort();
        Ok(found)
    }
    /// The ranks that left a liveness file, by rank.
    pub fn liveness_ranks(&self) -> Result<Vec<u32>, SchemaError> {
        let dir = self.ranks_dir();
        if !dir.is_dir() {
            return Ok(Vec::new());
        }
        let mut ranks = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(|e| SchemaError::io(&dir, e))? {
            let path = entry.map_err(|e| SchemaError::io(&dir, e))?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.ends_with(".json")
                && let Some(rank) = rank_of_partition(name)
            {
                ranks.push(rank);
            }
        }
        ranks.sort_unstable();
        Ok(ranks)
    }
    /// Whether `root` looks like a run (has a manifest).
    pub fn is_run(&self) -> bool {
        self.manifest().is_file()
    }
}

/// The closed parts (`part-*.parquet`) directly in `dir`, in index order; none when it is absent.
fn closed_parts_in(dir: &Path) -> Result<Vec<PathBuf>, SchemaError> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut parts = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| SchemaError::io(dir, e))? {
        let path = entry.map_err(|e| SchemaError::io(dir, e))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("part-") && name.ends_with(".parquet") {
            parts.push(path);
        }
    }
    parts.sort();
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_partitions_are_named_and_parsed_alike() {
        assert_eq!(rank_partition(3), "rank=00003");
        assert_eq!(rank_of_partition("rank=00003"), Some(3));
        assert_eq!(rank_of_partition("rank=01023.json"), Some(1023));
        for bad in ["rank=", "rank=x1", "ranks=1", "part-00000.parquet", "rank=1.tmp"] {
            assert_eq!(rank_of_partition(bad), None, "{bad}");
        }
    }

    #[test]
    fn parts_of_a_partitioned_table_come_by_rank_then_index() {
        let root = std::env::temp_dir().join(format!("fp8scope-layout-{}", std::process::id()));
        let run = RunDir::new(&root);
        for (rank, index) in [(1u32, 0u32), (0, 1), (0, 0), (10, 0)] {
            let p = run.rank_part(Table::Stats, rank, index);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, b"").unwrap();
        }
        std::fs::write(run.rank_table_dir(Table::Stats, 1).join("part-00001.parquet.tmp"), b"").unwrap();
        let names: Vec<String> =
            run.parts(Table::Stats).unwrap().iter().map(|p| p.strip_prefix(run.table_dir(Table::Stats)).unwrap().display().to_string()).collect();
        assert_eq!(names, ["rank=00000/part-00000.parquet", "rank=00000/part-00001.parquet", "rank=00001/part-00000.parquet", "rank=00010/part-00000.parquet"]);
        assert_eq!(run.partitions(Table::Stats).unwrap().iter().map(|(r, _)| *r).collect::<Vec<_>>(), [0, 1, 10]);
        assert!(run.parts(Table::Steps).unwrap().is_empty());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
