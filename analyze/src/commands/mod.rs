//! One file per command. Each exposes a library function that computes its answer as a typed,
//! serializable value (reused by later commands such as `report` and `triage`) and a `run` that
//! renders it as text or JSON.

pub mod anomalies;
pub mod compare;
pub mod locate;
pub mod predict;
pub mod query;
pub mod ranks;
pub mod regress;
pub mod report;
pub mod schedule;
pub mod summary;
pub mod triage;
pub mod whatif;

/// What a command printed and whether it found something (exit status 1 for the commands that
/// say so in their help).
#[derive(Debug)]
pub struct Outcome {
    /// Text for stdout (possibly empty when the output went to a file).
    pub stdout: String,
    /// True when the command found what it looks for (anomalies, flagged tensors).
    pub findings: bool,
}

impl Outcome {
    pub fn clean(stdout: String) -> Outcome {
        Outcome { stdout, findings: false }
    }
}
