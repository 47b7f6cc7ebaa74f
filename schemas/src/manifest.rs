//! The manifest `run.json`: what was run, on what, how it ended, and how many rows each table got.
//!
//! It is written when the run starts (`status: running`), rewritten atomically (temp file + rename)
//! as parts close, and finally with `completed`, `diverged` or `crashed`. A run killed without a
//! chance to write stays `running`; readers treat a `running` manifest whose process is gone as
//! not completed.
//!
//! Runs written elsewhere (the PyTorch recorder, `fp8-analyze import te-debug`) say so in `source`
//! and describe themselves in `origin`: the framework, the module paths in the order first seen,
//! the decimals their statistics were rounded to, and what the run lacks.

use crate::config::RunConfig;
use crate::layout::RunDir;
use crate::names::SiteNaming;
pub use crate::ranks::{Parallel, ProcessGroup, RankInfo};
use crate::{SCHEMA_VERSION, SUPPORTED_SCHEMA_VERSIONS, SchemaError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// Still training, or killed before it could say otherwise.
    Running,
    /// Every step ran.
    Completed,
    /// The loss went non-finite; the step where it did is recorded in full, then training stopped.
    Diverged,
    /// An error stopped the run; `error` says which.
    Crashed,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Completed => "completed",
            RunStatus::Diverged => "diverged",
            RunStatus::Crashed => "crashed",
        }
    }
}

/// Where the run trained.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// `cpu` or `cuda`.
    pub kind: String,
    /// CPU model or GPU name.
    pub name: String,
    /// e.g. `9.0` for a GPU, null on the CPU.
    pub compute_capability: Option<String>,
    /// Threads (CPU) or SMs (GPU).
    pub parallelism: u32,
    /// How `block` scaling ran its GEMMs (`emulated-cpu`, `cublaslt-block-scaling`,
    /// `dequantize-bf16`), null for other recipes.
    pub block_gemm: Option<String>,
}

/// Facts about the training data that the analyzer uses to judge a loss.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DataInfo {
    /// Lowest achievable mean cross-entropy (nats) on this data, when known.
    pub entropy_floor: Option<f64>,
    /// ln V: the loss of a uniform guess.
    pub ln_vocab: f64,
}

/// Rows written per table (closed parts only).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowCounts {
    pub steps: u64,
    pub stats: u64,
    pub tensors: u64,
    pub events: u64,
    pub shadow: u64,
    /// Absent in version-1 runs (which have no such table).
    #[serde(default)]
    pub extra_stats: u64,
    /// Absent before version 3.
    #[serde(default)]
    pub casts: u64,
}

/// Who wrote the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RunSource {
    /// `fp8-capture` trained and recorded it (the default: runs before the field existed).
    #[default]
    #[serde(rename = "fp8-capture")]
    Fp8Capture,
    /// The Python recorder, hooked into the user's own PyTorch training.
    #[serde(rename = "pytorch")]
    Pytorch,
    /// Imported from Transformer Engine's debug statistics logs (nvdlfw_inspect).
    #[serde(rename = "te-debug")]
    TeDebug,
}

impl RunSource {
    pub fn as_str(self) -> &'static str {
        match self {
            RunSource::Fp8Capture => "fp8-capture",
            RunSource::Pytorch => "pytorch",
            RunSource::TeDebug => "te-debug",
        }
    }
    /// Whether fp8scope did not train the run: its sites are named by module path.
    pub fn is_external(self) -> bool {
        self != RunSource::Fp8Capture
    }
}

/// What a run of another framework is made of (null for `fp8-capture` runs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    /// The framework and its version: `torch 2.5.1`, `nvdlfw_inspect 0.2.2`.
    pub framework: String,
    /// Module paths (`layers.3.fc1`, `blocks.0.attn.qkv`, `lm_head`) in the order they were first
    /// seen: the forward execution order, as far as the writer could tell.
    #[serde(default)]
    pub modules: Vec<String>,
    /// Decimals the statistics were rounded to by their source (Transformer Engine's logs: 4),
    /// null when they are exact.
    #[serde(default)]
    pub stats_decimals: Option<u32>,
    /// What the run does not have, from [`lacks`]: `loss`, `dumps`, `shadow`, `events`.
    #[serde(default)]
    pub lacks: Vec<String>,
    /// Free text: what was assumed, what was skipped.
    #[serde(default)]
    pub notes: Vec<String>,
}

/// The names of what an external run may lack, as listed in [`Origin::lacks`].
pub mod lacks {
    /// No steps table: no loss curve.
    pub const LOSS: &str = "loss";
    /// No tensors table: no dumped tensor values.
    pub const DUMPS: &str = "dumps";
    /// No shadow table: no per-GEMM error against BF16 on the same inputs.
    pub const SHADOW: &str = "shadow";
    /// No events table.
    pub const EVENTS: &str = "events";
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub schema_version: u32,
    /// Run name (the directory's name when written).
    pub name: String,
    pub status: RunStatus,
    /// Version of the program that wrote the run.
    pub writer: String,
    pub config: RunConfig,
    pub device: DeviceInfo,
    /// Versions of the libraries that shaped the numbers (e.g. cuBLASLt, NVRTC).
    pub libraries: BTreeMap<String, String>,
    pub data: DataInfo,
    /// RFC 3339 times.
    pub started_at: String,
    pub ended_at: Option<String>,
    /// Steps fully recorded.
    pub steps_completed: u32,
    /// Mean loss of the last min(20, steps) steps, when finite.
    pub final_loss: Option<f64>,
    pub rows: RowCounts,
    /// Why the run crashed, or the first non-finite step of a diverged run.
    pub error: Option<String>,
    /// The command line that produced the run.
    pub command: Vec<String>,
    /// Process id while running (lets readers tell a live run from a killed one).
    pub pid: Option<u32>,
    /// Who wrote the run (absent before version 2: `fp8-capture`).
    #[serde(default)]
    pub source: RunSource,
    /// What a run of another framework is made of; null for `fp8-capture` runs.
    #[serde(default)]
    pub origin: Option<Origin>,
    /// Host name of the process that wrote the manifest (rank 0's); absent before version 3.
    #[serde(default)]
    pub host: Option<String>,
    /// When the writer last closed a part (RFC 3339): its heartbeat. Absent before version 3.
    #[serde(default)]
    pub heartbeat_at: Option<String>,
    /// Processes of the job (1 when absent).
    #[serde(default)]
    pub world_size: Option<u32>,
    /// How the job is split over its ranks: the launcher, the backend, the device mesh and the
    /// process groups; absent for one process.
    #[serde(default)]
    pub parallel: Option<Parallel>,
    /// Each rank's host and process, by rank; empty for one process.
    #[serde(default)]
    pub ranks: Vec<RankInfo>,
    /// What recording cost the run's own steps, where the writer measured it (the PyTorch recorder);
    /// absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorder_cost: Option<RecorderCost>,
    /// Seconds from the writer's process start to the end of its first training step: the start-up
    /// a user waits through (the GPU's kernels, the weights, the data). Absent where not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_step_s: Option<f64>,
}

/// The recorder's own cost, per step after the first (see python/README.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecorderCost {
    /// Steps it covers.
    pub steps: u32,
    /// Mean step time, measured between the recorder's `step()` calls.
    pub step_ms: f64,
    /// Host time in the recorder (its hooks and `step()`).
    pub host_ms: f64,
    /// Device time of its batched work (CUDA events); null where not measured.
    #[serde(default)]
    pub device_ms: Option<f64>,
    /// (host_ms + device_ms) / step_ms: an upper bound of its share where host and device overlap.
    pub share: f64,
    /// Whether the statistics were batched (false: the per-operand reference path).
    #[serde(default)]
    pub batched: bool,
}

impl Manifest {
    /// Reads and validates `run.json` of the run at `dir`.
    pub fn read(dir: &Path) -> Result<Manifest, SchemaError> {
        let run = RunDir::new(dir);
        let path = run.manifest();
        if !dir.exists() {
            return Err(SchemaError::io(dir, std::io::Error::new(std::io::ErrorKind::NotFound, "no such directory")));
        }
        if !path.is_file() {
            return Err(SchemaError::NotARun { path: dir.to_path_buf() });
        }
        let text = std::fs::read_to_string(&path).map_err(|e| SchemaError::io(&path, e))?;
        let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| SchemaError::BadManifest { path: path.clone(), message: e.to_string() })?;
        let version = value
            .get("schema_version")
            .and_then(|v| v.as_u64())
            .ok_or_else(|| SchemaError::BadManifest { path: path.clone(), message: "no schema_version".into() })? as u32;
        if !SUPPORTED_SCHEMA_VERSIONS.contains(&version) {
            return Err(SchemaError::UnsupportedVersion { path, found: version, supported: SUPPORTED_SCHEMA_VERSIONS.to_vec() });
        }
        serde_json::from_value(value).map_err(|e| SchemaError::BadManifest { path, message: e.to_string() })
    }

    /// Writes `run.json` atomically: a reader sees the old or the new manifest, never half of one.
    pub fn write(&self, dir: &Path) -> Result<(), SchemaError> {
        let path = RunDir::new(dir).manifest();
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(self).map_err(|e| SchemaError::Write { path: path.clone(), message: e.to_string() })?;
        std::fs::write(&tmp, text + "\n").map_err(|e| SchemaError::io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| SchemaError::io(&path, e))
    }

    /// A fresh manifest for a run that is about to start.
    pub fn new_running(name: String, config: RunConfig, device: DeviceInfo, data: DataInfo) -> Manifest {
        Manifest {
            schema_version: SCHEMA_VERSION,
            name,
            status: RunStatus::Running,
            writer: format!("fp8scope {}", env!("CARGO_PKG_VERSION")),
            config,
            device,
            libraries: BTreeMap::new(),
            data,
            started_at: now_rfc3339(),
            ended_at: None,
            steps_completed: 0,
            final_loss: None,
            rows: RowCounts::default(),
            error: None,
            command: std::env::args().collect(),
            pid: Some(std::process::id()),
            source: RunSource::Fp8Capture,
            origin: None,
            host: crate::ranks::host_name(),
            heartbeat_at: Some(now_rfc3339()),
            world_size: None,
            parallel: None,
            ranks: Vec::new(),
            recorder_cost: None,
            first_step_s: None,
        }
    }

    /// How the run's sites are named and ordered: `layers.{i}.{module}` by layer for `fp8-capture`
    /// runs, the module path in the order of `origin.modules` for runs from elsewhere.
    pub fn site_naming(&self) -> SiteNaming {
        if self.source.is_external() {
            SiteNaming::External { modules: self.origin.as_ref().map(|o| o.modules.clone()).unwrap_or_default() }
        } else {
            SiteNaming::Capture { n_layers: self.config.model.layers }
        }
    }

    /// The decimals the run's statistics were rounded to, when its source rounded them.
    pub fn stats_decimals(&self) -> Option<u32> {
        self.origin.as_ref().and_then(|o| o.stats_decimals)
    }

    /// What the manifest says the run lacks (empty for `fp8-capture` runs).
    pub fn lacks(&self) -> &[String] {
        self.origin.as_ref().map(|o| o.lacks.as_slice()).unwrap_or(&[])
    }

    /// Processes of the job: `world_size`, 1 when absent.
    pub fn world_size(&self) -> u32 {
        self.world_size.unwrap_or(1).max(1)
    }

    /// True when the run ended by itself (completed or diverged): its tables are whole.
    pub fn finished(&self) -> bool {
        matches!(self.status, RunStatus::Completed | RunStatus::Diverged)
    }
}

/// The current time, RFC 3339, seconds precision, UTC.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Prepares `dir` for a new run: creates it, or accepts it when empty. Refuses a directory that
/// holds a run or anything else, so that no recorded data is ever overwritten.
pub fn prepare_new_run_dir(dir: &Path) -> Result<(), SchemaError> {
    if dir.exists() {
        if !dir.is_dir() {
            return Err(SchemaError::NotEmpty { path: dir.to_path_buf() });
        }
        if RunDir::new(dir).is_run() {
            let name = Manifest::read(dir).map(|m| m.name).unwrap_or_else(|_| "unreadable manifest".into());
            return Err(SchemaError::RunExists { path: dir.to_path_buf(), name });
        }
        let mut entries = std::fs::read_dir(dir).map_err(|e| SchemaError::io(dir, e))?;
        if entries.next().is_some() {
            return Err(SchemaError::NotEmpty { path: dir.to_path_buf() });
        }
    } else {
        std::fs::create_dir_all(dir).map_err(|e| SchemaError::io(dir, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_and_origin_round_trip_and_are_optional() {
        let v = serde_json::json!({"framework": "torch 2.5.1", "modules": ["blocks.0.attn.qkv"], "stats_decimals": 4, "lacks": ["dumps"]});
        let o: Origin = serde_json::from_value(v).unwrap();
        assert_eq!((o.stats_decimals, o.lacks.as_slice(), o.notes.len()), (Some(4), &["dumps".to_string()][..], 0));
        assert_eq!(serde_json::to_value(RunSource::TeDebug).unwrap(), "te-debug");
        assert_eq!(serde_json::from_value::<RunSource>("pytorch".into()).unwrap(), RunSource::Pytorch);
        #[derive(Deserialize)]
        struct Old {
            #[serde(default)]
            source: RunSource,
            #[serde(default)]
            rows: RowCounts,
        }
        let old: Old = serde_json::from_str(r#"{"rows": {"steps": 1, "stats": 2, "tensors": 0, "events": 0, "shadow": 0}}"#).unwrap();
        assert_eq!((old.source, old.rows.extra_stats, old.rows.stats), (RunSource::Fp8Capture, 0, 2), "a version-1 manifest reads");
    }
}
