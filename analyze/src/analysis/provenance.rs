//! Where a run came from and what it lacks, so that every command can say it plainly: the source
//! (`fp8-capture`, `pytorch`, `te-debug`), the framework, the tables the run has no part of (no
//! loss curve, no dumps, no shadow records), and the caveat every finding from rounded statistics
//! carries (Transformer Engine's logs keep 4 decimals).

use crate::error::AnalyzeError;
use crate::load::Run;
use fp8scope_schemas::layout::{RunDir, Table};
use fp8scope_schemas::manifest::lacks;
use serde::Serialize;

/// A run's provenance, as every command reports it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Provenance {
    /// `fp8-capture`, `pytorch` or `te-debug`.
    pub source: &'static str,
    /// The framework that recorded an external run (`torch 2.5.1`), None for fp8-capture runs.
    pub framework: Option<String>,
    /// What the run lacks: the manifest's `origin.lacks` and every table among steps (`loss`),
    /// tensors (`dumps`) and shadow (`shadow`) that has no part.
    pub lacks: Vec<String>,
    /// Decimals the statistics were rounded to by their source, when they were.
    pub stats_decimals: Option<u32>,
    /// The sentence that goes with every finding resting on those statistics.
    pub stats_caveat: Option<String>,
}

impl Provenance {
    pub fn lacks(&self, what: &str) -> bool {
        self.lacks.iter().any(|l| l == what)
    }
}

/// The caveat of statistics rounded to `d` decimals.
pub fn rounding_caveat(d: u32) -> String {
    format!(
        "statistics rounded to {d} decimals by the run's logs: values below 5e-{} read as 0 (fractions logged as percentages: below 5e-{}), small scales, MSEs and norms lose their digits",
        d + 1,
        d + 3
    )
}

/// The provenance of `run`.
pub fn provenance(run: &Run) -> Result<Provenance, AnalyzeError> {
    let m = &run.manifest;
    let mut lacks: Vec<String> = m.lacks().to_vec();
    for (table, what) in [(Table::Steps, lacks::LOSS), (Table::Tensors, lacks::DUMPS), (Table::Shadow, lacks::SHADOW)] {
        // Part files listed, not read: a command that never reads a table is not stopped by a bad
        // part of it.
        if !lacks.iter().any(|l| l == what) && RunDir::new(&run.dir).parts(table)?.is_empty() {
            lacks.push(what.to_string());
        }
    }
    let d = m.stats_decimals();
    Ok(Provenance {
        source: m.source.as_str(),
        framework: m.origin.as_ref().map(|o| o.framework.clone()),
        lacks,
        stats_decimals: d,
        stats_caveat: d.map(rounding_caveat),
    })
}

/// "the run lacks X": one sentence for what a command could not do and why.
pub fn lacking(run: &Run, what: &str, consequence: &str) -> String {
    let why = match what {
        lacks::LOSS => "a loss curve (no steps recorded)",
        lacks::DUMPS => "dumped tensors",
        lacks::SHADOW => "shadow GEMM records",
        lacks::EVENTS => "events",
        other => other,
    };
    format!("run '{}' lacks {why}: {consequence}", run.name)
}
