//! Streaming the `tensors` table of a run, row by row, without loading it: one thread per run
//! decodes its parts with arrow-rs (only the key columns and `values`, only the row groups whose
//! step range meets the wanted steps, batches sized to a few million floats) and hands the batches
//! over a bounded channel, so the memory held stays a few batches whatever the dump's size.
//!
//! Polars does the planning elsewhere (which steps, which tables); here the values stay flat f32
//! buffers that [`crate::analysis::metrics::Accum`] reads in place.

use crate::error::AnalyzeError;
use crate::load::Run;
use arrow::array::{AsArray, Float32Array, Int32Array, Int64Array, ListArray, StringArray};
use arrow::datatypes::{Float32Type, Int32Type, Int64Type};
use arrow::record_batch::RecordBatch;
use fp8scope_schemas::layout::Table;
use fp8scope_schemas::tables::col;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::statistics::Statistics;
use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

/// Floats decoded per batch (4 MB of f32): large enough to amortize decoding, small enough that a
/// few batches in flight stay far under the memory budget (~110 MB peak for two runs).
const FLOATS_PER_BATCH: usize = 1 << 20;
/// Batches a reader thread may decode ahead of the consumer.
const BATCHES_IN_FLIGHT: usize = 2;

/// The identity of one dumped tensor chunk: two runs with the same seed, data and dump flags write
/// the same keys in the same order.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TensorKey {
    pub step: i64,
    pub layer: i32,
    pub module: String,
    pub role: String,
    pub offset: i64,
}

impl TensorKey {
    /// `layers.1.fc1.gradient (offset 0)`, for messages.
    pub fn describe(&self) -> String {
        format!("layers.{}.{}.{} (offset {})", self.layer, self.module, self.role, self.offset)
    }
}

/// A decoded batch with its columns cast to their concrete types.
struct Batch {
    step: Int64Array,
    layer: Int32Array,
    module: StringArray,
    role: StringArray,
    offset: Int64Array,
    values: ListArray,
    floats: Float32Array,
}

impl Batch {
    fn new(b: &RecordBatch, path: &Path) -> Result<Batch, AnalyzeError> {
        let get = |name: &str| {
            b.column_by_name(name).cloned().ok_or_else(|| AnalyzeError::ReadPart { path: path.to_path_buf(), message: format!("no column '{name}'") })
        };
        let wrong = |name: &str| AnalyzeError::ReadPart { path: path.to_path_buf(), message: format!("column '{name}' has the wrong type") };
        let step = get(col::STEP)?.as_primitive_opt::<Int64Type>().ok_or_else(|| wrong(col::STEP))?.clone();
        let layer = get(col::LAYER)?.as_primitive_opt::<Int32Type>().ok_or_else(|| wrong(col::LAYER))?.clone();
        let module = get(col::MODULE)?.as_string_opt::<i32>().ok_or_else(|| wrong(col::MODULE))?.clone();
        let role = get(col::ROLE)?.as_string_opt::<i32>().ok_or_else(|| wrong(col::ROLE))?.clone();
        let offset = get(col::OFFSET)?.as_primitive_opt::<Int64Type>().ok_or_else(|| wrong(col::OFFSET))?.clone();
        let values = get(col::VALUES)?.as_list_opt::<i32>().ok_or_else(|| wrong(col::VALUES))?.clone();
        let floats = values.values().as_primitive_opt::<Float32Type>().ok_or_else(|| wrong(col::VALUES))?.clone();
        Ok(Batch { step, layer, module, role, offset, values, floats })
    }

    fn len(&self) -> usize {
        self.step.len()
    }

    fn key(&self, i: usize) -> TensorKey {
        TensorKey {
            step: self.step.value(i),
            layer: self.layer.value(i),
            module: self.module.value(i).to_string(),
            role: self.role.value(i).to_string(),
            offset: self.offset.value(i),
        }
    }

    fn step(&self, i: usize) -> i64 {
        self.step.value(i)
    }

    fn values(&self, i: usize) -> &[f32] {
        let offsets = self.values.value_offsets();
        let (lo, hi) = (offsets[i] as usize, offsets[i + 1] as usize);
        &self.floats.values()[lo..hi]
    }
}

/// A cursor over the rows of a run's tensors table, fed by a reader thread.
pub struct TensorCursor {
    run: String,
    /// Step of the last row advanced past: steps never decrease in a recorded run.
    last_step: Option<i64>,
    rx: Option<Receiver<Result<Batch, AnalyzeError>>>,
    reader: Option<JoinHandle<()>>,
    batch: Option<Batch>,
    row: usize,
}

impl TensorCursor {
    /// Starts reading the checked parts of `run`'s tensors table, keeping only the row groups
    /// that can hold one of `steps` (all when `steps` is None).
    pub fn open(run: &Run, steps: Option<BTreeSet<i64>>) -> Result<TensorCursor, AnalyzeError> {
        let parts = run.parts(Table::Tensors)?.to_vec();
        let max_elems = run.manifest.config.record.dump_max_elems.max(1) as usize;
        let rows_per_batch = (FLOATS_PER_BATCH / max_elems).clamp(1, 8192);
        let (tx, rx) = sync_channel(BATCHES_IN_FLIGHT);
        let reader = std::thread::spawn(move || read_parts(&parts, rows_per_batch, steps.as_ref(), &tx));
        Ok(TensorCursor { run: run.name.clone(), last_step: None, rx: Some(rx), reader: Some(reader), batch: None, row: 0 })
    }

    /// Makes sure a current row exists; false at the end of the table.
    fn fill(&mut self) -> Result<bool, AnalyzeError> {
        loop {
            if let Some(b) = &self.batch
                && self.row < b.len()
            {
                return Ok(true);
            }
            let Some(rx) = &self.rx else { return Ok(false) };
            match rx.recv() {
                Ok(Ok(b)) => {
                    self.batch = Some(b);
                    self.row = 0;
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    self.batch = None;
                    self.finish();
                    return Ok(false);
                }
            }
        }
    }

    /// The key of the current row, None at the end.
    pub fn peek(&mut self) -> Result<Option<TensorKey>, AnalyzeError> {
        Ok(if self.fill()? { self.batch.as_ref().map(|b| b.key(self.row)) } else { None })
    }

    /// The step of the current row (cheaper than the whole key), None at the end. Fails when
    /// the steps go backwards: the analyzer relies on the recording order.
    pub fn peek_step(&mut self) -> Result<Option<i64>, AnalyzeError> {
        let step = if self.fill()? { self.batch.as_ref().map(|b| b.step(self.row)) } else { None };
        if let (Some(s), Some(last)) = (step, self.last_step)
            && s < last
        {
            return Err(AnalyzeError::Malformed {
                run: self.run.clone(),
                message: format!("its dumped tensors are not in step order (step {s} follows step {last})"),
            });
        }
        Ok(step)
    }

    /// The values of the current row (call after a `peek` that returned a key).
    pub fn values(&self) -> &[f32] {
        match &self.batch {
            Some(b) if self.row < b.len() => b.values(self.row),
            _ => &[],
        }
    }

    pub fn advance(&mut self) {
        if let Some(b) = &self.batch
            && self.row < b.len()
        {
            self.last_step = Some(b.step(self.row));
        }
        self.row += 1;
    }

    /// Stops the reader thread (it ends when it sees the channel closed) and waits for it.
    fn finish(&mut self) {
        self.rx = None;
        if let Some(h) = self.reader.take() {
            let _ = h.join();
        }
    }
}

impl Drop for TensorCursor {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The reader thread's body: decodes every part in order and sends its batches; stops at the
/// first error (sent on) or when the consumer hangs up.
fn read_parts(parts: &[PathBuf], rows_per_batch: usize, steps: Option<&BTreeSet<i64>>, tx: &SyncSender<Result<Batch, AnalyzeError>>) {
    for path in parts {
        match read_part(path, rows_per_batch, steps, tx) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        }
    }
}

/// Sends the batches of one part; Ok(false) when the consumer no longer listens.
fn read_part(path: &Path, rows_per_batch: usize, steps: Option<&BTreeSet<i64>>, tx: &SyncSender<Result<Batch, AnalyzeError>>) -> Result<bool, AnalyzeError> {
    let bad = |e: &dyn std::fmt::Display| AnalyzeError::ReadPart { path: path.to_path_buf(), message: e.to_string() };
    let file = File::open(path).map_err(|e| bad(&e))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| bad(&e))?;
    let descr = builder.parquet_schema();
    let mask = ProjectionMask::columns(descr, [col::STEP, col::LAYER, col::MODULE, col::ROLE, col::OFFSET, col::VALUES]);
    let step_leaf = descr.columns().iter().position(|c| c.path().parts() == [col::STEP.to_string()]);
    let groups: Vec<usize> = (0..builder.metadata().num_row_groups())
        .filter(|&g| match (steps, step_leaf) {
            (Some(steps), Some(leaf)) => match builder.metadata().row_group(g).column(leaf).statistics() {
                Some(Statistics::Int64(s)) => match (s.min_opt(), s.max_opt()) {
                    (Some(&lo), Some(&hi)) => steps.range(lo..=hi).next().is_some(),
                    _ => true,
                },
                _ => true,
            },
            _ => true,
        })
        .collect();
    let reader = builder.with_projection(mask).with_row_groups(groups).with_batch_size(rows_per_batch).build().map_err(|e| bad(&e))?;
    for batch in reader {
        let batch = batch.map_err(|e| bad(&e))?;
        if tx.send(Batch::new(&batch, path)).is_err() {
            return Ok(false);
        }
    }
    Ok(true)
}
