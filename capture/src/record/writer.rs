//! The writer thread: receives rows from the training loop, closes a Parquet part of each table
//! every `flush_every` steps (and at the end), and rewrites the manifest with the row counts after
//! each flush, so a run killed at any moment leaves closed, readable parts and a manifest that says
//! it did not complete.

use fp8scope_schemas::layout::RunDir;
use fp8scope_schemas::manifest::{now_rfc3339, Manifest, RunStatus};
use fp8scope_schemas::parts::PartWriter;
use fp8scope_schemas::tables::{EventRow, ShadowRow, StatRow, StepRow, TensorRow};
use fp8scope_schemas::SchemaError;
use std::sync::mpsc;
use std::thread::JoinHandle;

/// Rows of one step.
#[derive(Default)]
pub struct StepRows {
    pub step: Option<StepRow>,
    pub stats: Vec<StatRow>,
    pub tensors: Vec<TensorRow>,
    pub events: Vec<EventRow>,
    pub shadow: Vec<ShadowRow>,
}

enum Msg {
    Rows(Box<StepRows>),
    Flush { steps_completed: u32 },
    Finish { status: RunStatus, steps_completed: u32, final_loss: Option<f64>, error: Option<String> },
}

struct Tables {
    steps: PartWriter<StepRow>,
    stats: PartWriter<StatRow>,
    tensors: PartWriter<TensorRow>,
    events: PartWriter<EventRow>,
    shadow: PartWriter<ShadowRow>,
}

impl Tables {
    fn flush(&mut self, manifest: &mut Manifest, run: &RunDir) -> Result<(), SchemaError> {
        self.steps.flush()?;
        self.stats.flush()?;
        self.tensors.flush()?;
        self.events.flush()?;
        self.shadow.flush()?;
        manifest.rows.steps = self.steps.rows_written();
        manifest.rows.stats = self.stats.rows_written();
        manifest.rows.tensors = self.tensors.rows_written();
        manifest.rows.events = self.events.rows_written();
        manifest.rows.shadow = self.shadow.rows_written();
        // The heartbeat: a reader tells a live run from one killed without closing by its age.
        manifest.heartbeat_at = Some(now_rfc3339());
        manifest.write(run.root())
    }
}

/// Handle of the writer thread held by the training loop.
pub struct Writer {
    tx: mpsc::SyncSender<Msg>,
    handle: Option<JoinHandle<Result<Manifest, SchemaError>>>,
}

impl Writer {
    /// Writes the initial manifest and starts the thread.
    pub fn start(run: RunDir, manifest: Manifest) -> Result<Writer, SchemaError> {
        manifest.write(run.root())?;
        let mut tables = Tables {
            steps: PartWriter::new(&run)?,
            stats: PartWriter::new(&run)?,
            tensors: PartWriter::new(&run)?,
            events: PartWriter::new(&run)?,
            shadow: PartWriter::new(&run)?,
        };
        // A small bound: the loop may run a few steps ahead of the encoder, not unboundedly.
        let (tx, rx) = mpsc::sync_channel::<Msg>(64);
        let handle = std::thread::Builder::new()
            .name("fp8scope-writer".into())
            .spawn(move || {
                let mut manifest = manifest;
                for msg in rx {
                    match msg {
                        Msg::Rows(rows) => {
                            let r = *rows;
                            if let Some(s) = r.step {
                                tables.steps.push(s);
                            }
                            tables.stats.extend(r.stats);
                            tables.tensors.extend(r.tensors);
                            tables.events.extend(r.events);
                            tables.shadow.extend(r.shadow);
                        }
                        Msg::Flush { steps_completed } => {
                            manifest.steps_completed = steps_completed;
                            tables.flush(&mut manifest, &run)?;
                        }
                        Msg::Finish { status, steps_completed, final_loss, error } => {
                            manifest.steps_completed = steps_completed;
                            manifest.status = status;
                            manifest.final_loss = final_loss;
                            manifest.error = error;
                            manifest.ended_at = Some(now_rfc3339());
                            manifest.pid = None;
                            tables.flush(&mut manifest, &run)?;
                            break;
                        }
                    }
                }
                Ok(manifest)
            })
            .map_err(|e| SchemaError::Write { path: std::path::PathBuf::from("writer thread"), message: e.to_string() })?;
        Ok(Writer { tx, handle: Some(handle) })
    }

    fn send(&mut self, msg: Msg) -> Result<(), SchemaError> {
        if self.tx.send(msg).is_err() {
            // The thread stopped early: its error says why.
            return Err(self.join_error());
        }
        Ok(())
    }

    fn join_error(&mut self) -> SchemaError {
        match self.handle.take().map(|h| h.join()) {
            Some(Ok(Err(e))) => e,
            _ => SchemaError::Write { path: "writer thread".into(), message: "stopped unexpectedly".into() },
        }
    }

    pub fn rows(&mut self, rows: StepRows) -> Result<(), SchemaError> {
        self.send(Msg::Rows(Box::new(rows)))
    }

    pub fn flush(&mut self, steps_completed: u32) -> Result<(), SchemaError> {
        self.send(Msg::Flush { steps_completed })
    }

    /// Closes every table, writes the final manifest and returns it.
    pub fn finish(mut self, status: RunStatus, steps_completed: u32, final_loss: Option<f64>, error: Option<String>) -> Result<Manifest, SchemaError> {
        self.send(Msg::Finish { status, steps_completed, final_loss, error })?;
        match self.handle.take().map(|h| h.join()) {
            Some(Ok(r)) => r,
            _ => Err(SchemaError::Write { path: "writer thread".into(), message: "panicked".into() }),
        }
    }
}
