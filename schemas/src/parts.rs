//! Crash-safe Parquet parts: the writer closes each part (footer written, file renamed from `.tmp`)
//! before opening the next, so a run killed at any moment keeps every closed part readable; the
//! reader checks a part's table name and schema version before anyone trusts it.

use crate::layout::{PART_TMP_SUFFIX, RunDir, Table};
use crate::tables::{Row, schema};
use crate::{META_SCHEMA_VERSION, META_TABLE, SCHEMA_VERSION, SUPPORTED_SCHEMA_VERSIONS, SchemaError};
use arrow::record_batch::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::Compression;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use std::fs::File;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

/// Buffers rows of one table and writes them as numbered parts.
pub struct PartWriter<R: Row> {
    run: RunDir,
    /// The rank partition it writes into; None: the flat layout.
    rank: Option<u32>,
    next_index: u32,
    pending: Vec<R>,
    rows_written: u64,
    _row: PhantomData<R>,
}

impl<R: Row> PartWriter<R> {
    /// A writer for the table of `R` in `run`; creates the table's folder.
    pub fn new(run: &RunDir) -> Result<Self, SchemaError> {
        let dir = run.table_dir(R::TABLE);
        std::fs::create_dir_all(&dir).map_err(|e| SchemaError::io(&dir, e))?;
        let next_index = run.parts(R::TABLE)?.len() as u32;
        Ok(PartWriter { run: run.clone(), rank: None, next_index, pending: Vec::new(), rows_written: 0, _row: PhantomData })
    }

    /// A writer for `rank`'s partition of the table of `R` (`stats/rank=00003/`); creates it.
    pub fn for_rank(run: &RunDir, rank: u32) -> Result<Self, SchemaError> {
        let dir = run.rank_table_dir(R::TABLE, rank);
        std::fs::create_dir_all(&dir).map_err(|e| SchemaError::io(&dir, e))?;
        let next_index = run.rank_parts(R::TABLE, rank)?.len() as u32;
        Ok(PartWriter { run: run.clone(), rank: Some(rank), next_index, pending: Vec::new(), rows_written: 0, _row: PhantomData })
    }

    pub fn push(&mut self, row: R) {
        self.pending.push(row);
    }

    pub fn extend(&mut self, rows: impl IntoIterator<Item = R>) {
        self.pending.extend(rows);
    }

    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Rows in closed parts.
    pub fn rows_written(&self) -> u64 {
        self.rows_written
    }

    /// Writes the pending rows as one closed part (nothing when none are pending).
    pub fn flush(&mut self) -> Result<(), SchemaError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let batch = R::to_batch(&self.pending);
        let path = match self.rank {
            Some(rank) => self.run.rank_part(R::TABLE, rank, self.next_index),
            None => self.run.part(R::TABLE, self.next_index),
        };
        write_part(&path, R::TABLE, &batch)?;
        self.next_index += 1;
        self.rows_written += self.pending.len() as u64;
        self.pending.clear();
        Ok(())
    }
}

/// Writer properties every part uses: snappy, the table and schema version in the metadata.
pub(crate) fn properties(table: Table) -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_key_value_metadata(Some(vec![
            KeyValue::new(META_SCHEMA_VERSION.to_string(), SCHEMA_VERSION.to_string()),
            KeyValue::new(META_TABLE.to_string(), table.as_str().to_string()),
        ]))
        .build()
}

/// Writes `batch` to `path` as a closed Parquet file: `path.tmp` first, renamed when complete.
pub fn write_part(path: &Path, table: Table, batch: &RecordBatch) -> Result<(), SchemaError> {
    let tmp = PathBuf::from(format!("{}{}", path.display(), PART_TMP_SUFFIX));
    let werr = |e: parquet::errors::ParquetError| SchemaError::Write { path: tmp.clone(), message: e.to_string() };
    let file = File::create(&tmp).map_err(|e| SchemaError::io(&tmp, e))?;
    let mut writer = ArrowWriter::try_new(file, schema(table).clone(), Some(properties(table))).map_err(werr)?;
    writer.write(batch).map_err(werr)?;
    writer.close().map_err(werr)?;
    std::fs::rename(&tmp, path).map_err(|e| SchemaError::io(path, e))
}

/// What a part's footer says about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartInfo {
    pub path: PathBuf,
    pub table: String,
    pub schema_version: u32,
    pub rows: u64,
}

/// Reads a part's footer and checks that it is a complete Parquet file of `table` in a supported
/// schema version. Cheap: reads only the footer.
pub fn check_part(path: &Path, table: Table) -> Result<PartInfo, SchemaError> {
    let bad = |message: String| SchemaError::BadPart { path: path.to_path_buf(), message };
    let file = File::open(path).map_err(|e| SchemaError::io(path, e))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| bad(e.to_string()))?;
    let meta = builder.metadata().file_metadata();
    let kv = meta.key_value_metadata().cloned().unwrap_or_default();
    let get = |k: &str| kv.iter().find(|e| e.key == k).and_then(|e| e.value.clone());
    let found_table = get(META_TABLE).ok_or_else(|| bad("no fp8scope table name in its metadata".into()))?;
    let version: u32 = get(META_SCHEMA_VERSION).and_then(|v| v.parse().ok()).ok_or_else(|| bad("no fp8scope schema version in its metadata".into()))?;
    if found_table != table.as_str() {
        return Err(SchemaError::WrongTable { path: path.to_path_buf(), expected: table.as_str().into(), found: found_table });
    }
    if !SUPPORTED_SCHEMA_VERSIONS.contains(&version) {
        return Err(SchemaError::UnsupportedVersion { path: path.to_path_buf(), found: version, supported: SUPPORTED_SCHEMA_VERSIONS.to_vec() });
    }
    Ok(PartInfo { path: path.to_path_buf(), table: found_table, schema_version: version, rows: meta.num_rows() as u64 })
}

/// Reads a whole part into batches (for tests and small tables; the analyzer scans with polars).
pub fn read_part(path: &Path, table: Table) -> Result<Vec<RecordBatch>, SchemaError> {
    check_part(path, table)?;
    let bad = |message: String| SchemaError::BadPart { path: path.to_path_buf(), message };
    let file = File::open(path).map_err(|e| SchemaError::io(path, e))?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| bad(e.to_string()))?.build().map_err(|e| bad(e.to_string()))?;
    reader.map(|b| b.map_err(|e| bad(e.to_string()))).collect()
}

/// Reads every closed part of a table of a run.
pub fn read_table(run: &RunDir, table: Table) -> Result<Vec<RecordBatch>, SchemaError> {
    let mut out = Vec::new();
    for part in run.parts(table)? {
        out.extend(read_part(&part, table)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::{Gemm, Module, Role};
    use crate::tables::{StepRow, TensorRow};

    fn step(step: u32) -> StepRow {
        StepRow { step, loss: 1.0 / (step as f64 + 1.0), grad_norm: 0.5, lr: 1e-3, tokens: 512, step_ms: 3.0, nonfinite_tensors: 0, rank: None }
    }

    #[test]
    fn parts_round_trip_and_carry_their_table_and_version() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        let mut w = PartWriter::<StepRow>::new(&run).unwrap();
        w.extend((0..10).map(step));
        w.flush().unwrap();
        w.extend((10..15).map(step));
        w.flush().unwrap();
        w.flush().unwrap(); // nothing pending: no empty part
        let parts = run.parts(Table::Steps).unwrap();
        assert_eq!(parts.len(), 2);
        let info = check_part(&parts[1], Table::Steps).unwrap();
        assert_eq!((info.rows, info.schema_version, info.table.as_str()), (5, SCHEMA_VERSION, "steps"));
        let rows: usize = read_table(&run, Table::Steps).unwrap().iter().map(|b| b.num_rows()).sum();
        assert_eq!(rows, 15);
        assert_eq!(w.rows_written(), 15);
        assert!(matches!(check_part(&parts[0], Table::Stats), Err(SchemaError::WrongTable { .. })));
    }

    #[test]
    fn a_truncated_part_is_reported_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        let mut w = PartWriter::<TensorRow>::new(&run).unwrap();
        w.push(TensorRow {
            step: 1,
            layer: 0,
            module: Module::Fc1,
            role: Role::Activation,
            gemm: Some(Gemm::Fprop),
            format: Some("e4m3"),
            shape: vec![2, 3],
            offset: 0,
            stride: 1,
            values: vec![1.0; 6],
            fp8: Some(vec![0x38; 6]),
            scale: Some(1.0),
            block_scales: None,
            block_rows: None,
            block_cols: None,
            rank: None,
        });
        w.flush().unwrap();
        let part = &run.parts(Table::Tensors).unwrap()[0];
        let bytes = std::fs::read(part).unwrap();
        std::fs::write(part, &bytes[..bytes.len() / 2]).unwrap();
        let err = check_part(part, Table::Tensors).unwrap_err().to_string();
        assert!(err.contains("part-00000.parquet"), "{err}");
    }
}
