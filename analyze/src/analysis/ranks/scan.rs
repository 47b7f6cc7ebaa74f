//! Reading a table of a multi-rank run a window of steps and a batch of ranks at a time.
//!
//! `ranks` reads the casts and statistics of every rank, which for 1,024 ranks is far more than fits
//! in memory at once. So each table's parts are listed by rank partition, their footers checked
//! once (bad parts stop the command, or are skipped with a warning under `--lenient`, as `load`
//! does) and their step range read from the footer's statistics; a batch of ranks is scanned with
//! only the columns a check needs. A row's `rank` comes from the row; where a writer left it null it
//! is the rank of the partition the part lies in (parts of a flat layout count as rank 0's).
//!
//! **Windows.** The casts checks compare ranks at one step, so they hold a window of steps of every
//! rank at once. Windows follow the parts: the step ranges of all parts are merged where they
//! overlap (ranks that flush every 50 steps give windows of 50 steps, each part read once); a
//! window holding more than [`WINDOW_ROWS`] rows is cut into equal step ranges, each read with a
//! filter on `step`.

use crate::error::AnalyzeError;
use crate::load::polars_schema;
use fp8scope_schemas::layout::{RunDir, Table, rank_of_partition};
use fp8scope_schemas::parts::check_part;
use fp8scope_schemas::tables::col as c;
use polars::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Rows of one window of the casts table held at once (about 20 bytes each once laid out by rank,
/// step and tensor: a few hundred MB).
pub const WINDOW_ROWS: u64 = 12_000_000;

/// One checked part.
#[derive(Clone, Debug)]
pub struct Part {
    pub path: PathBuf,
    pub rows: u64,
    /// Its smallest and largest step (from the footer's statistics), when known.
    pub steps: Option<(i64, i64)>,
}

/// The checked parts of one rank's partition of a table.
#[derive(Clone, Debug)]
pub struct RankParts {
    pub rank: u32,
    pub parts: Vec<Part>,
    /// Rows in those parts.
    pub rows: u64,
}

/// The smallest and largest `step` of a part, from its row groups' statistics.
fn step_range(path: &Path) -> Option<(i64, i64)> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::file::statistics::Statistics;
    let reader = SerializedFileReader::new(std::fs::File::open(path).ok()?).ok()?;
    let md = reader.metadata();
    let idx = md.file_metadata().schema_descr().columns().iter().position(|col| col.name() == c::STEP)?;
    let mut range: Option<(i64, i64)> = None;
    for rg in md.row_groups() {
        let Some(Statistics::Int64(s)) = rg.column(idx).statistics() else { return None };
        let (lo, hi) = (*s.min_opt()?, *s.max_opt()?);
        range = Some(range.map_or((lo, hi), |(a, b)| (a.min(lo), b.max(hi))));
    }
    range
}

/// The good parts of `table` of the run at `dir`, by rank, with their step ranges when `steps`. A
/// bad part fails the call with its name, or, when `lenient`, is left out with a warning on stderr
/// and its reason pushed to `skipped`.
pub fn table_parts(dir: &Path, table: Table, lenient: bool, steps: bool, skipped: &mut Vec<String>) -> Result<Vec<RankParts>, AnalyzeError> {
    let mut out: Vec<RankParts> = Vec::new();
    for path in RunDir::new(dir).parts(table)? {
        let info = match check_part(&path, table) {
            Ok(info) => info,
            Err(e) if lenient => {
                eprintln!("fp8-analyze: warning: skipping {e}");
                skipped.push(e.to_string());
                continue;
            }
            Err(e) => return Err(AnalyzeError::BadPart { source: e }),
        };
        let rank = path.parent().and_then(|p| p.file_name()).and_then(|n| n.to_str()).and_then(rank_of_partition).unwrap_or(0);
        let part = Part { steps: if steps { step_range(&path) } else { None }, path, rows: info.rows };
        match out.iter_mut().find(|r| r.rank == rank) {
            Some(r) => {
                r.rows += part.rows;
                r.parts.push(part);
            }
            None => out.push(RankParts { rank, rows: part.rows, parts: vec![part] }),
        }
    }
    out.sort_by_key(|r| r.rank);
    Ok(out)
}

/// A window of steps: the parts of each rank it reads, and whether to filter them on `step`.
#[derive(Clone, Debug)]
pub struct Window<'a> {
    pub lo: i64,
    pub hi: i64,
    /// (rank, its parts in the window, their rows in the window (estimated when filtered)).
    pub ranks: Vec<(u32, Vec<&'a Part>, u64)>,
    pub filter: bool,
}

impl Window<'_> {
    /// Batches of the window's ranks holding about `target` rows each.
    pub fn batches(&self, target: u64) -> Vec<&[(u32, Vec<&Part>, u64)]> {
        let mut out = Vec::new();
        let (mut start, mut rows) = (0, 0);
        for (i, r) in self.ranks.iter().enumerate() {
            if i > start && rows + r.2 > target {
                out.push(&self.ranks[start..i]);
                start = i;
                rows = 0;
            }
            rows += r.2;
        }
        if start < self.ranks.len() {
            out.push(&self.ranks[start..]);
        }
        out
    }
}

/// The windows of `ranks`' parts, in step order.
pub fn windows(ranks: &[RankParts], max_rows: u64) -> Vec<Window<'_>> {
    let mut parts: Vec<(i64, i64, u32, &Part)> = ranks
        .iter()
        .flat_map(|r| {
            r.parts.iter().map(move |p| {
                let (lo, hi) = p.steps.unwrap_or((i64::MIN, i64::MAX));
                (lo, hi, r.rank, p)
            })
        })
        .collect();
    parts.sort_by_key(|p| (p.0, p.1, p.2));
    // Merge overlapping step ranges.
    let mut merged: Vec<(i64, i64, Vec<(u32, &Part)>)> = Vec::new();
    for (lo, hi, rank, p) in parts {
        match merged.last_mut() {
            Some(m) if lo <= m.1 => {
                m.1 = m.1.max(hi);
                m.2.push((rank, p));
            }
            _ => merged.push((lo, hi, vec![(rank, p)])),
        }
    }
    let mut out = Vec::new();
    for (lo, hi, members) in merged {
        let rows: u64 = members.iter().map(|m| m.1.rows).sum();
        let span = hi.saturating_sub(lo).saturating_add(1);
        let k = rows.div_ceil(max_rows.max(1)).max(1) as i64;
        let splittable = lo != i64::MIN && hi != i64::MAX && k > 1 && span >= k;
        let cuts: Vec<(i64, i64)> = if splittable { (0..k).map(|i| (lo + span * i / k, lo + span * (i + 1) / k - 1)).collect() } else { vec![(lo, hi)] };
        for (a, b) in cuts {
            let mut by_rank: Vec<(u32, Vec<&Part>, u64)> = Vec::new();
            for (rank, p) in &members {
                let (plo, phi) = p.steps.unwrap_or((i64::MIN, i64::MAX));
                if phi < a || plo > b {
                    continue;
                }
                let share = if splittable {
                    let pspan = (phi - plo + 1).max(1) as f64;
                    let overlap = (phi.min(b) - plo.max(a) + 1).max(0) as f64;
                    (p.rows as f64 * overlap / pspan).ceil() as u64
                } else {
                    p.rows
                };
                match by_rank.iter_mut().find(|r| r.0 == *rank) {
                    Some(r) => {
                        r.1.push(p);
                        r.2 += share;
                    }
                    None => by_rank.push((*rank, vec![p], share)),
                }
            }
            by_rank.sort_by_key(|r| r.0);
            out.push(Window { lo: a, hi: b, ranks: by_rank, filter: splittable });
        }
    }
    out
}

/// A lazy scan of `columns` of `table` over the given parts of each rank, typed as the table's
/// schema says (a column an older part lacks reads as null), with `rank` filled from the partition
/// where null, and only the rows of steps `lo..=hi` when `filter`.
pub fn scan(run: &str, table: Table, ranks: &[(u32, Vec<&Path>)], columns: &[&str], filter: Option<(i64, i64)>) -> Result<LazyFrame, AnalyzeError> {
    let schema = Arc::new(polars_schema(table));
    let err = |e: PolarsError| AnalyzeError::scan(run, table.as_str(), e);
    let mut frames = Vec::with_capacity(ranks.len());
    for (rank, paths) in ranks {
        let paths = paths.iter().map(|p| PlRefPath::try_from_path(p)).collect::<PolarsResult<Vec<_>>>().map_err(err)?;
        let args = ScanArgsParquet { glob: false, schema: Some(schema.clone()), allow_missing_columns: true, ..Default::default() };
        let mut lf = LazyFrame::scan_parquet_files(paths.into_iter().collect(), args).map_err(err)?;
        if let Some((lo, hi)) = filter {
            lf = lf.filter(col(c::STEP).gt_eq(lit(lo)).and(col(c::STEP).lt_eq(lit(hi))));
        }
        let exprs: Vec<Expr> = columns
            .iter()
            .map(|name| {
                let typed = match schema.get(name) {
                    Some(dt) => col(*name).cast(dt.clone()),
                    None => col(*name),
                };
                if *name == c::RANK { typed.fill_null(lit(*rank as i32)).alias(c::RANK) } else { typed }
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

/// Scans and collects.
pub fn load(run: &str, table: Table, ranks: &[(u32, Vec<&Path>)], columns: &[&str], filter: Option<(i64, i64)>) -> Result<DataFrame, AnalyzeError> {
    scan(run, table, ranks, columns, filter)?.collect().map_err(|e| AnalyzeError::scan(run, table.as_str(), e))
}

/// A column as values of `T` (nulls as None), cast first.
pub fn f32s(df: &DataFrame, name: &str) -> PolarsResult<Vec<Option<f32>>> {
    let c = df.column(name)?.cast(&DataType::Float32)?;
    Ok(c.f32()?.iter().collect())
}
pub fn f64s(df: &DataFrame, name: &str) -> PolarsResult<Vec<Option<f64>>> {
    let c = df.column(name)?.cast(&DataType::Float64)?;
    Ok(c.f64()?.iter().collect())
}
pub fn i64s(df: &DataFrame, name: &str) -> PolarsResult<Vec<Option<i64>>> {
    let c = df.column(name)?.cast(&DataType::Int64)?;
    Ok(c.i64()?.iter().collect())
}
pub fn bools(df: &DataFrame, name: &str) -> PolarsResult<Vec<Option<bool>>> {
    let c = df.column(name)?.cast(&DataType::Boolean)?;
    Ok(c.bool()?.iter().collect())
}
