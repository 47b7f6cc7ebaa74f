//! Opening runs: the manifest (its schema version checked) when the run is opened; the footer of
//! every part of a table checked the first time a command touches that table (bad parts stop the
//! command, or are skipped with a warning under `--lenient`); lazy polars scans over the good parts
//! only, with only the columns a command asks for.
//!
//! Every scan has the table's schema of this build: a part of an older supported schema version
//! that lacks a column added since (e.g. the stats table's `amax_channel`, new in version 2) reads
//! it as null, so commands, SQL and multi-run unions see one schema whatever wrote the runs.

use crate::error::AnalyzeError;
use fp8scope_schemas::layout::{RunDir, Table};
use fp8scope_schemas::manifest::Manifest;
use fp8scope_schemas::names::SiteNaming;
use fp8scope_schemas::parts::check_part;
use fp8scope_schemas::tables::schema;
use polars::prelude::*;
use std::cell::{OnceCell, RefCell};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Name of the column that holds each row's run name in multi-run scans and in SQL.
pub const RUN_COL: &str = "run";

/// How to treat bad parts, and which ranks of a multi-rank run to read.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadOptions {
    /// Skip truncated or corrupt parts with a warning instead of failing.
    pub lenient: bool,
    /// Read only this rank's parts, of every table (`--rank`); None: see `one_rank`.
    pub rank: Option<u32>,
    /// The command reads one rank (loss curves, comparisons, rankings): of a run of several
    /// ranks, it reads the lowest rank's parts of the tables whose rows repeat across ranks
    /// ([`Run::per_rank`]) and every rank's statistics. Commands over every rank (`query`,
    /// `ranks`) leave it false.
    pub one_rank: bool,
}

impl LoadOptions {
    /// The same options for a command that reads one rank.
    pub fn one_rank(self) -> LoadOptions {
        LoadOptions { one_rank: true, ..self }
    }
}

/// One opened run: its manifest, and for each table a command touched, the parts whose footers
/// checked out.
#[derive(Debug)]
pub struct Run {
    /// The label of the run in outputs and in the `run` column: the manifest's name, or the
    /// directory as given when two loaded runs share a name.
    pub name: String,
    pub dir: PathBuf,
    pub manifest: Manifest,
    /// How this run's sites are named and ordered (by layer, or by module path for runs from
    /// elsewhere).
    pub naming: SiteNaming,
    opts: LoadOptions,
    /// The rank whose parts are read, for a run partitioned by rank; None: every part.
    pub rank_view: Option<u32>,
    /// The ranks that wrote parts (their partitions of steps or stats); empty for a flat run.
    pub ranks: Vec<u32>,
    /// Checked parts per table, in `Table::ALL` order, filled on first use.
    parts: [OnceCell<Vec<PathBuf>>; Table::ALL.len()],
    /// Parts skipped under `--lenient`, with the reason.
    skipped: RefCell<Vec<String>>,
}

impl Run {
    /// Opens the run at `path`: reads and checks `run.json`. Parts are checked when first used.
    pub fn open(path: &Path, opts: LoadOptions) -> Result<Run, AnalyzeError> {
        let manifest = Manifest::read(path)?;
        let dir = RunDir::new(path);
        let mut ranks: Vec<u32> = Vec::new();
        for table in [Table::Steps, Table::Stats] {
            ranks.extend(dir.partitions(table)?.into_iter().map(|(r, _)| r));
        }
        ranks.sort_unstable();
        ranks.dedup();
        let rank_view = match opts.rank {
            Some(r) if !ranks.is_empty() && !ranks.contains(&r) => {
                return Err(AnalyzeError::Usage(format!(
                    "{}: --rank {r}: the run has no parts of rank {r} (its ranks: {})",
                    path.display(),
                    compact_ranks(&ranks)
                )));
            }
            Some(r) if !ranks.is_empty() => Some(r),
            Some(r) if r > 0 => return Err(AnalyzeError::Usage(format!("{}: --rank {r}: the run has one rank (0)", path.display()))),
            Some(_) => None,
            None if opts.one_rank && ranks.len() > 1 => ranks.first().copied(),
            None => None,
        };
        Ok(Run {
            name: manifest.name.clone(),
            dir: path.to_path_buf(),
            naming: manifest.site_naming(),
            manifest,
            opts,
            rank_view,
            ranks,
            parts: Default::default(),
            skipped: RefCell::new(Vec::new()),
        })
    }

    /// Opens several runs; runs that share a manifest name are labelled by their directory.
    pub fn open_many(paths: &[PathBuf], opts: LoadOptions) -> Result<Vec<Run>, AnalyzeError> {
        let mut runs = paths.iter().map(|p| Run::open(p, opts)).collect::<Result<Vec<_>, _>>()?;
        let names: Vec<String> = runs.iter().map(|r| r.name.clone()).collect();
        for (i, run) in runs.iter_mut().enumerate() {
            if names.iter().filter(|n| **n == names[i]).count() > 1 {
                run.name = run.dir.display().to_string();
            }
        }
        // Still equal (the same directory given twice): number them.
        let labels: Vec<String> = runs.iter().map(|r| r.name.clone()).collect();
        for (i, run) in runs.iter_mut().enumerate() {
            let earlier = labels[..i].iter().filter(|n| **n == labels[i]).count();
            if earlier > 0 {
                run.name = format!("{}#{}", labels[i], earlier + 1);
            }
        }
        Ok(runs)
    }

    /// The parts of `table` whose footers say they are complete parts of that table in a
    /// supported schema version, in index order. The first call checks them; a bad part fails the
    /// call, or is skipped with a warning under `--lenient`.
    pub fn parts(&self, table: Table) -> Result<&[PathBuf], AnalyzeError> {
        let cell = &self.parts[Table::ALL.iter().position(|t| *t == table).unwrap_or(0)];
        if cell.get().is_none() {
            let mut good = Vec::new();
            let dir = RunDir::new(&self.dir);
            let parts = match self.rank_view {
                Some(rank) if self.opts.rank.is_some() || Self::per_rank(table) => dir.rank_parts(table, rank)?,
                _ => dir.parts(table)?,
            };
            for part in parts {
                match check_part(&part, table) {
                    Ok(_) => good.push(part),
                    Err(e) if self.opts.lenient => {
                        eprintln!("fp8-analyze: warning: skipping {e}");
                        self.skipped.borrow_mut().push(e.to_string());
                    }
                    Err(e) => return Err(AnalyzeError::BadPart { source: e }),
                }
            }
            let _ = cell.set(good);
        }
        Ok(cell.get().map(Vec::as_slice).unwrap_or(&[]))
    }

    /// Whether a one-rank view reads only its rank's parts of `table`: the tables whose rows would
    /// repeat across ranks (the loss curve, dumped tensors aligned row by row, shadow GEMMs,
    /// events). Statistics keep every rank, each row with its `rank`: their views take the worst
    /// rank, and `fp8-analyze ranks` compares them.
    pub fn per_rank(table: Table) -> bool {
        matches!(table, Table::Steps | Table::Tensors | Table::Shadow | Table::Events)
    }

    /// Whether `table` has at least one good part.
    pub fn has(&self, table: Table) -> Result<bool, AnalyzeError> {
        Ok(!self.parts(table)?.is_empty())
    }

    /// The parts skipped so far under `--lenient`, with the reason.
    pub fn skipped(&self) -> Vec<String> {
        self.skipped.borrow().clone()
    }

    /// The same run read over every rank (for the few views of a one-rank command that compare
    /// ranks, such as the report's per-rank chart).
    pub fn all_ranks(&self) -> Result<Run, AnalyzeError> {
        let mut r = Run::open(&self.dir, LoadOptions { rank: None, one_rank: false, ..self.opts })?;
        r.name = self.name.clone();
        Ok(r)
    }

    /// Whether several ranks wrote the run.
    pub fn multi_rank(&self) -> bool {
        self.ranks.len() > 1 || self.manifest.world_size() > 1
    }

    /// A sentence for outputs of one-rank commands on a multi-rank run: which rank they read.
    pub fn rank_note(&self) -> Option<String> {
        let r = self.rank_view?;
        self.multi_rank().then(|| {
            format!(
                "{}: the loss, dumps, shadow GEMMs and events of rank {r} of {} (ranks {}), the statistics of every rank; --rank N reads another, `fp8-analyze ranks` compares them",
                self.name,
                self.manifest.world_size().max(self.ranks.len() as u32),
                compact_ranks(&self.ranks)
            )
        })
    }

    /// Number of transformer layers of the run's model.
    pub fn n_layers(&self) -> u32 {
        self.manifest.config.model.layers
    }

    /// A lazy scan of `table` over its good parts, keeping `columns` (all when empty). A table with
    /// no parts scans as an empty frame with the table's schema.
    pub fn scan(&self, table: Table, columns: &[&str]) -> Result<LazyFrame, AnalyzeError> {
        let parts = self.parts(table)?;
        let lf = if parts.is_empty() {
            empty_frame(table).lazy()
        } else {
            let paths = parts
                .iter()
                .map(|p| PlRefPath::try_from_path(p))
                .collect::<PolarsResult<Vec<_>>>()
                .map_err(|e| AnalyzeError::scan(&self.name, table.as_str(), e))?;
            let args = ScanArgsParquet { glob: false, schema: Some(Arc::new(polars_schema(table))), allow_missing_columns: true, ..Default::default() };
            LazyFrame::scan_parquet_files(paths.into_iter().collect(), args).map_err(|e| AnalyzeError::scan(&self.name, table.as_str(), e))?
        };
        self.conform(table, lf, columns)
    }

    /// Selects `columns` (every column of the table's schema, in its order, when empty) with the
    /// schema's types; a schema column the files lack reads as nulls. Columns outside the schema
    /// that another writer added are kept after the schema's when all are asked for.
    fn conform(&self, table: Table, mut lf: LazyFrame, columns: &[&str]) -> Result<LazyFrame, AnalyzeError> {
        let found = lf.collect_schema().map_err(|e| AnalyzeError::scan(&self.name, table.as_str(), e))?;
        let fields = schema(table).fields();
        let typed = |name: &str| -> Expr {
            match fields.iter().find(|f| f.name() == name) {
                Some(f) if found.get(name).is_some() => col(name).cast(polars_dtype(f.data_type())),
                Some(f) => lit(Null {}).cast(polars_dtype(f.data_type())).alias(name),
                None => col(name),
            }
        };
        let exprs: Vec<Expr> = if columns.is_empty() {
            let mut v: Vec<Expr> = fields.iter().map(|f| typed(f.name())).collect();
            v.extend(found.iter_names().filter(|n| fields.iter().all(|f| f.name() != n.as_str())).map(|n| col(n.as_str())));
            v
        } else {
            columns.iter().map(|c| typed(c)).collect()
        };
        Ok(lf.select(exprs))
    }

    /// Like [`Run::scan`], with the run's name as a first column `run`.
    pub fn scan_labelled(&self, table: Table, columns: &[&str]) -> Result<LazyFrame, AnalyzeError> {
        let lf = self.scan(table, columns)?;
        Ok(lf.select([lit(self.name.clone()).alias(RUN_COL), all().as_expr()]))
    }

    /// Scans and collects `table` (for the small tables and for filtered, pruned scans).
    pub fn collect(&self, table: Table, lf: LazyFrame) -> Result<DataFrame, AnalyzeError> {
        lf.collect().map_err(|e| AnalyzeError::scan(&self.name, table.as_str(), e))
    }
}

/// Ranks as compact ranges: `0-3, 5, 8-15`.
pub fn compact_ranks(ranks: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        out.push(if j > i { format!("{}-{}", ranks[i], ranks[j]) } else { ranks[i].to_string() });
        i = j + 1;
    }
    out.join(", ")
}

/// One lazy frame holding `table` of every run, each row labelled with its run in `run`.
pub fn scan_union(runs: &[Run], table: Table, columns: &[&str]) -> Result<LazyFrame, AnalyzeError> {
    let frames = runs.iter().map(|r| r.scan_labelled(table, columns)).collect::<Result<Vec<_>, _>>()?;
    concat(frames, UnionArgs { rechunk: false, parallel: true, ..Default::default() }).map_err(|e| AnalyzeError::scan("(all runs)", table.as_str(), e))
}

/// The distinct values of the integer column `column` of `table` (e.g. the steps that hold
/// dumped tensors), read with only that column.
pub fn distinct_i64(run: &Run, table: Table, column: &str) -> Result<std::collections::BTreeSet<i64>, AnalyzeError> {
    let lf = run.scan(table, &[column])?.unique(None, UniqueKeepStrategy::Any);
    let df = run.collect(table, lf)?;
    Ok(i64s(&df, column).map_err(|e| AnalyzeError::scan(&run.name, table.as_str(), e))?.into_iter().flatten().collect())
}

/// A column as i64 values (integer columns of any width), nulls as None.
pub fn i64s(df: &DataFrame, name: &str) -> PolarsResult<Vec<Option<i64>>> {
    let c = df.column(name)?.cast(&DataType::Int64)?;
    Ok(c.i64()?.iter().collect())
}

/// A column as f64 values (any float or integer column), nulls as None.
pub fn f64s(df: &DataFrame, name: &str) -> PolarsResult<Vec<Option<f64>>> {
    let c = df.column(name)?.cast(&DataType::Float64)?;
    Ok(c.f64()?.iter().collect())
}

/// A string column, nulls as None.
pub fn strs(df: &DataFrame, name: &str) -> PolarsResult<Vec<Option<String>>> {
    let c = df.column(name)?;
    Ok(c.str()?.iter().map(|s| s.map(str::to_string)).collect())
}

/// The columns that say which operand a `stats` row is of: step, layer, module, gemm, role.
pub type OperandKeys = (Vec<Option<i64>>, Vec<Option<i64>>, Vec<Option<String>>, Vec<Option<String>>, Vec<Option<String>>);

/// [`OperandKeys`] of a frame of `stats` rows.
pub fn operand_keys(df: &DataFrame) -> PolarsResult<OperandKeys> {
    use fp8scope_schemas::tables::col as c;
    Ok((i64s(df, c::STEP)?, i64s(df, c::LAYER)?, strs(df, c::MODULE)?, strs(df, c::GEMM)?, strs(df, c::ROLE)?))
}

/// A boolean column, nulls as None.
pub fn bools(df: &DataFrame, name: &str) -> PolarsResult<Vec<Option<bool>>> {
    Ok(df.column(name)?.bool()?.iter().collect())
}

/// The polars equivalent of `table`'s Arrow schema.
pub fn polars_schema(table: Table) -> Schema {
    Schema::from_iter(schema(table).fields().iter().map(|f| Field::new(f.name().as_str().into(), polars_dtype(f.data_type()))))
}

/// An empty frame with the polars equivalent of `table`'s Arrow schema.
pub fn empty_frame(table: Table) -> DataFrame {
    DataFrame::empty_with_schema(&polars_schema(table))
}

/// The polars type of each Arrow type the schemas use.
fn polars_dtype(dt: &arrow::datatypes::DataType) -> DataType {
    use arrow::datatypes::DataType as A;
    match dt {
        A::Boolean => DataType::Boolean,
        A::Int32 => DataType::Int32,
        A::Int64 => DataType::Int64,
        A::UInt32 => DataType::UInt32,
        A::Float32 => DataType::Float32,
        A::Float64 => DataType::Float64,
        A::Utf8 | A::LargeUtf8 => DataType::String,
        A::Binary | A::LargeBinary => DataType::Binary,
        A::List(inner) | A::LargeList(inner) => DataType::List(Box::new(polars_dtype(inner.data_type()))),
        _ => DataType::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_print_as_ranges() {
        assert_eq!(compact_ranks(&[0, 1, 2, 3, 5, 8, 9]), "0-3, 5, 8-9");
        assert_eq!(compact_ranks(&[]), "");
    }

    #[test]
    fn empty_frames_have_every_column_of_their_table() {
        for table in Table::ALL {
            let df = empty_frame(table);
            assert_eq!(df.width(), schema(table).fields().len(), "{}", table.as_str());
            assert!(df.columns().iter().all(|c| c.dtype() != &DataType::Null), "{}", table.as_str());
        }
    }
}
