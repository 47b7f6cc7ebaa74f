//! The writer thread: receives rows from the training loop, closes a Parquet part of each table
//! every `flush_every` steps (and at the end), and rewrites the manifest with the row counts after
//! each flush, so a run killed at any moment leaves closed, readable parts and a manifest that says
//! it did not complete.
//!
//! A rank of a job of several ([`Writer::start_rank`]) writes its own partition of every table
//! (`stats/rank=00003/…`, `rank` set in every row), the `casts` table of its FP8 casts, and its
//! liveness file (`ranks/rank=00003.json`) when it starts, with each flush and when it ends; rank 0
//! alone writes the manifest, its row counts the sum of every rank's liveness file.

use fp8scope_schemas::SchemaError;
use fp8scope_schemas::layout::RunDir;
use fp8scope_schemas::manifest::RowCounts;
use fp8scope_schemas::manifest::{Manifest, RunStatus, now_rfc3339};
use fp8scope_schemas::parts::PartWriter;
use fp8scope_schemas::ranks::RankLiveness;
use fp8scope_schemas::tables::{CastRow, EventRow, ShadowRow, StatRow, StepRow, TensorRow};
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
    /// The FP8 casts (written by the ranks of a job of several only).
    pub casts: Vec<CastRow>,
}

/// Who writes: one rank of a job of several.
#[derive(Clone, Debug)]
pub struct RankWriting {
    pub rank: u32,
    pub host: String,
    pub pid: u32,
}

/// A rank's liveness and where it goes.
struct Live {
    file: RankLiveness,
    last_beat: Option<std::time::Instant>,
}

impl Live {
    fn beat(&mut self, run: &RunDir, steps_completed: u32, rows: RowCounts) -> Result<(), SchemaError> {
        let now = std::time::Instant::now();
        if let Some(t) = self.last_beat {
            self.file.heartbeat_every_s = Some(now.duration_since(t).as_secs_f64());
        }
        self.last_beat = Some(now);
        self.file.heartbeat_at = now_rfc3339();
        self.file.steps_completed = steps_completed;
        self.file.rows = rows;
        self.file.write(run.root())
    }
}

enum Msg {
    Rows(Box<StepRows>),
    Flush { steps_completed: u32 },
    FirstStep { seconds: f64 },
    Finish { status: RunStatus, steps_completed: u32, final_loss: Option<f64>, error: Option<String> },
}

struct Tables {
    steps: PartWriter<StepRow>,
    stats: PartWriter<StatRow>,
    tensors: PartWriter<TensorRow>,
    events: PartWriter<EventRow>,
    shadow: PartWriter<ShadowRow>,
    /// A rank of several: its casts table, and its liveness.
    casts: Option<PartWriter<CastRow>>,
    live: Option<Live>,
}

impl Tables {
    fn open(run: &RunDir, rank: Option<u32>) -> Result<Tables, SchemaError> {
        fn w<R: fp8scope_schemas::tables::Row>(run: &RunDir, rank: Option<u32>) -> Result<PartWriter<R>, SchemaError> {
            match rank {
                Some(r) => PartWriter::for_rank(run, r),
                None => PartWriter::new(run),
            }
        }
        Ok(Tables {
            steps: w(run, rank)?,
            stats: w(run, rank)?,
            tensors: w(run, rank)?,
            events: w(run, rank)?,
            shadow: w(run, rank)?,
            casts: rank.map(|r| PartWriter::for_rank(run, r)).transpose()?,
            live: None,
        })
    }

    fn push(&mut self, r: StepRows) {
        let rank = self.live.as_ref().map(|l| l.file.rank);
        match rank {
            None => {
                if let Some(s) = r.step {
                    self.steps.push(s);
                }
                self.stats.extend(r.stats);
                self.tensors.extend(r.tensors);
                self.events.extend(r.events);
                self.shadow.extend(r.shadow);
            }
            Some(k) => {
                let rank = Some(k);
                if let Some(s) = r.step {
                    self.steps.push(StepRow { rank, ..s });
                }
                self.stats.extend(r.stats.into_iter().map(|x| StatRow { rank, ..x }));
                self.tensors.extend(r.tensors.into_iter().map(|x| TensorRow { rank, ..x }));
                self.events.extend(r.events.into_iter().map(|x| EventRow { rank, ..x }));
                self.shadow.extend(r.shadow.into_iter().map(|x| ShadowRow { rank, ..x }));
                if let Some(c) = self.casts.as_mut() {
                    c.extend(r.casts.into_iter().map(|x| CastRow { rank, ..x }));
                }
            }
        }
    }

    fn rows(&self) -> RowCounts {
        RowCounts {
            steps: self.steps.rows_written(),
            stats: self.stats.rows_written(),
            tensors: self.tensors.rows_written(),
            events: self.events.rows_written(),
            shadow: self.shadow.rows_written(),
            casts: self.casts.as_ref().map_or(0, |c| c.rows_written()),
            ..Default::default()
        }
    }

    /// Closes a part of every table; rewrites the liveness file (a rank) and the manifest (one
    /// process, or rank 0, with every rank's rows).
    fn flush(&mut self, manifest: &mut Manifest, run: &RunDir, write_manifest: bool) -> Result<(), SchemaError> {
        self.steps.flush()?;
        self.stats.flush()?;
        self.tensors.flush()?;
        self.events.flush()?;
        self.shadow.flush()?;
        if let Some(c) = self.casts.as_mut() {
            c.flush()?;
        }
        let rows = self.rows();
        let steps_completed = manifest.steps_completed;
        manifest.rows = rows.clone();
        if let Some(live) = self.live.as_mut() {
            live.file.status = manifest.status;
            live.file.error = manifest.error.clone();
            live.file.ended_at = manifest.ended_at.clone();
            live.beat(run, steps_completed, rows)?;
            manifest.rows = sum_rows(run)?;
        }
        if !write_manifest {
            return Ok(());
        }
        // The heartbeat: a reader tells a live run from one killed without closing by its age.
        manifest.heartbeat_at = Some(now_rfc3339());
        manifest.write(run.root())
    }
}

/// The rows of every rank's liveness file, added up.
pub fn sum_rows(run: &RunDir) -> Result<RowCounts, SchemaError> {
    let mut t = RowCounts::default();
    for l in RankLiveness::read_all(run.root())? {
        t.steps += l.rows.steps;
        t.stats += l.rows.stats;
        t.tensors += l.rows.tensors;
        t.events += l.rows.events;
        t.shadow += l.rows.shadow;
        t.extra_stats += l.rows.extra_stats;
        t.casts += l.rows.casts;
    }
    Ok(t)
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
        let tables = Tables::open(&run, None)?;
        Self::spawn(run, manifest, tables, true)
    }

    /// Starts the writer of one rank of several: its liveness file now, the manifest too on rank 0.
    pub fn start_rank(run: RunDir, manifest: Manifest, who: RankWriting) -> Result<Writer, SchemaError> {
        let mut tables = Tables::open(&run, Some(who.rank))?;
        let now = now_rfc3339();
        let mut live = Live {
            file: RankLiveness {
                rank: who.rank,
                host: who.host,
                pid: who.pid,
                status: RunStatus::Running,
                started_at: now.clone(),
                heartbeat_at: now,
                ended_at: None,
                steps_completed: 0,
                heartbeat_every_s: None,
                error: None,
                rows: RowCounts::default(),
            },
            last_beat: None,
        };
        live.beat(&run, 0, RowCounts::default())?;
        tables.live = Some(live);
        let write_manifest = who.rank == 0;
        if write_manifest {
            manifest.write(run.root())?;
        }
        Self::spawn(run, manifest, tables, write_manifest)
    }

    fn spawn(run: RunDir, manifest: Manifest, mut tables: Tables, write_manifest: bool) -> Result<Writer, SchemaError> {
        // A small bound: the loop may run a few steps ahead of the encoder, not unboundedly.
        let (tx, rx) = mpsc::sync_channel::<Msg>(64);
        let handle = std::thread::Builder::new()
            .name("fp8scope-writer".into())
            .spawn(move || {
                let mut manifest = manifest;
                for msg in rx {
                    match msg {
                        Msg::Rows(rows) => tables.push(*rows),
                        Msg::Flush { steps_completed } => {
                            manifest.steps_completed = steps_completed;
                            tables.flush(&mut manifest, &run, write_manifest)?;
                        }
                        Msg::FirstStep { seconds } => manifest.first_step_s = Some(seconds),
                        Msg::Finish { status, steps_completed, final_loss, error } => {
                            manifest.steps_completed = steps_completed;
                            manifest.status = status;
                            manifest.final_loss = final_loss;
                            manifest.error = error;
                            manifest.ended_at = Some(now_rfc3339());
                            manifest.pid = None;
                            tables.flush(&mut manifest, &run, write_manifest)?;
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

    /// Notes the seconds from the process start to the end of the first step (in the manifest from
    /// its next write).
    pub fn first_step(&mut self, seconds: f64) -> Result<(), SchemaError> {
        self.send(Msg::FirstStep { seconds })
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
