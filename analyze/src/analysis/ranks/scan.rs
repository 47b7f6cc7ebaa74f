//! Reading a table of a multi-rank run a batch of ranks at a time.
//!
//! `ranks` reads casts and statistics of every rank, which for 1,024 ranks is far more than fits in
//! memory at once (`Run::scan` over every part and a group-by would decode it all first). So each
//! table's parts are listed by rank partition, their footers checked once (bad parts stop the command,
//! or are skipped with a warning under `--lenient`, as `load` does), and a batch of ranks is scanned
//! with only the columns a check needs. A row's `rank` comes from the row; where a writer left it null
//! it is the rank of the partition the part lies in (parts of a flat layout count as rank 0's).

use crate::error::AnalyzeError;
use crate::load::polars_schema;
use fp8scope_schemas::layout::{rank_of_partition, RunDir, Table};
use fp8scope_schemas::parts::check_part;
use fp8scope_schemas::tables::col as c;
use polars::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The checked parts of one rank's partition of a table.
#[derive(Clone, Debug)]
pub struct RankParts {
    pub rank: u32,
    pub paths: Vec<PathBuf>,
    /// Rows in those parts (from their footers).
    pub rows: u64,
}

/// The good parts of `table` of the run at `dir`, by rank. A bad part fails the call with its name,
/// or, when `lenient`, is left out with a warning on stderr and its reason pushed to `skipped`.
pub fn table_parts(dir: &Path, table: Table, lenient: bool, skipped: &mut Vec<String>) -> Result<Vec<RankParts>, AnalyzeError> {
    let mut out: Vec<RankParts> = Vec::new();
    for part in RunDir::new(dir).parts(table)? {
        let info = match check_part(&part, table) {
            Ok(info) => info,
            Err(e) if lenient => {
                eprintln!("fp8-analyze: warning: skipping {e}");
                skipped.push(e.to_string());
                continue;
            }
            Err(e) => return Err(AnalyzeError::BadPart { source: e }),
        };
        let rank = part
            .parent()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
            .and_then(rank_of_partition)
            .unwrap_or(0);
        match out.iter_mut().find(|r| r.rank == rank) {
            Some(r) => {
                r.paths.push(part);
                r.rows += info.rows;
            }
            None => out.push(RankParts { rank, paths: vec![part], rows: info.rows }),
        }
    }
    out.sort_by_key(|r| r.rank);
    Ok(out)
}

/// A lazy scan of `columns` of `table` over the parts of `ranks`, typed as the table's schema says
/// (a column an older part lacks reads as null), with `rank` filled from the partition where null.
pub fn scan(run: &str, table: Table, ranks: &[&RankParts], columns: &[&str]) -> Result<LazyFrame, AnalyzeError> {
    let schema = Arc::new(polars_schema(table));
    let err = |e: PolarsError| AnalyzeError::scan(run, table.as_str(), e);
    let mut frames = Vec::with_capacity(ranks.len());
    for r in ranks {
        let paths = r.paths.iter().map(|p| PlRefPath::try_from_path(p)).collect::<PolarsResult<Vec<_>>>().map_err(err)?;
        let args = ScanArgsParquet { glob: false, schema: Some(schema.clone()), allow_missing_columns: true, ..Default::default() };
        let lf = LazyFrame::scan_parquet_files(paths.into_iter().collect(), args).map_err(err)?;
        let exprs: Vec<Expr> = columns
            .iter()
            .map(|name| {
                let typed = match schema.get(name) {
                    Some(dt) => col(*name).cast(dt.clone()),
                    None => col(*name),
                };
                if *name == c::RANK { typed.fill_null(lit(r.rank as i32)).alias(c::RANK) } else { typed }
            })
            .collect();
        frames.push(lf.select(exprs));
    }
    if frames.is_empty() {
        let empty = DataFrame::empty_with_schema(&polars_schema(table)).lazy();
        return Ok(empty.select(columns.iter().map(|n| col(*n)).collect::<Vec<_>>()));
    }
    concat(frames, UnionArgs { parallel: true, rechunk: false, ..Default::default() }).map_err(err)
}

/// Collects a scan of a batch.
pub fn collect(run: &str, table: Table, lf: LazyFrame) -> Result<DataFrame, AnalyzeError> {
    lf.collect().map_err(|e| AnalyzeError::scan(run, table.as_str(), e))
}
