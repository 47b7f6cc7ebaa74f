//! Reading the statistics logs of Transformer Engine's debug tooling (nvdlfw_inspect): finding one
//! log per rank and parsing its lines.
//!
//! nvdlfw_inspect writes `nvdlfw_inspect_statistics_logs/nvdlfw_inspect[_TIMESTAMP]_globalrank-R.log`
//! under the `log_dir` given to `debug_api.initialize`, one line per statistic through Python's
//! logging with the format `%(asctime)s - %(levelname)s - %(message)s` and the message
//! `"{name} \t\t\t\t iteration={:06d} \t\t\t\t value={:.4f}"` (`nvdlfw_inspect/logging.py`,
//! `FileLogger.log_scalar`), where name is `{layer}_{tensor}_{stat}`. Values are therefore rounded
//! to 4 decimals; NaN and infinities are written `nan`, `inf`, `-inf`.
//!
//! Bad lines: a last line without its newline was cut while being written (the process died); it
//! is skipped and counted, since its value may be cut short. Any other line that does not parse
//! stops the import with the file, the line number and what was expected: a log that is not
//! what it should be is not silently half-read.

use crate::error::AnalyzeError;
use std::path::{Path, PathBuf};

/// The folder nvdlfw_inspect writes its statistics logs to, under its `log_dir`.
pub const STATS_DIR: &str = "nvdlfw_inspect_statistics_logs";

/// One rank's log file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankLog {
    pub rank: u32,
    pub path: PathBuf,
}

/// One parsed statistic line.
#[derive(Clone, Debug, PartialEq)]
pub struct LogLine {
    /// 1-based line number in its file.
    pub line: usize,
    /// `{layer}_{tensor}_{stat}`, split later ([`crate::import::te_debug::names`]).
    pub name: String,
    pub iteration: u64,
    pub value: f64,
    /// The value as written (its decimals tell the rounding).
    pub text: String,
}

/// The lines of one file, and the cut last line skipped, if any.
#[derive(Debug)]
pub struct ParsedLog {
    pub lines: Vec<LogLine>,
    /// The line number of a last line cut while being written, skipped.
    pub truncated_line: Option<usize>,
}

/// The rank of a statistics log from its name (`…_globalrank-3.log` → 3).
pub fn rank_of_file(name: &str) -> Option<u32> {
    let stem = name.strip_suffix(".log")?;
    let (_, rank) = stem.rsplit_once("_globalrank-")?;
    rank.parse().ok()
}

/// The per-rank statistics logs under `dir`: in `dir/nvdlfw_inspect_statistics_logs/`, or in
/// `dir` itself when it is that folder. Sorted by rank; two logs of one rank are refused (two runs
/// with timestamped logs in one folder: import one at a time).
pub fn find_logs(dir: &Path) -> Result<Vec<RankLog>, AnalyzeError> {
    if !dir.is_dir() {
        return Err(AnalyzeError::usage(format!("{}: no such directory", dir.display())));
    }
    let nested = dir.join(STATS_DIR);
    let folder = if nested.is_dir() { nested } else { dir.to_path_buf() };
    let entries = std::fs::read_dir(&folder).map_err(|e| AnalyzeError::usage(format!("{}: {e}", folder.display())))?;
    let mut logs: Vec<RankLog> = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| AnalyzeError::usage(format!("{}: {e}", folder.display())))?.path();
        let Some(rank) = path.file_name().and_then(|n| n.to_str()).and_then(rank_of_file) else { continue };
        if let Some(other) = logs.iter().find(|l| l.rank == rank) {
            return Err(AnalyzeError::usage(format!(
                "two statistics logs for rank {rank}: {} and {} (logs of two runs; import one run at a time)",
                other.path.display(),
                path.display()
            )));
        }
        logs.push(RankLog { rank, path });
    }
    if logs.is_empty() {
        return Err(AnalyzeError::usage(format!(
            "{}: no nvdlfw_inspect statistics logs (expected {STATS_DIR}/nvdlfw_inspect_globalrank-N.log under the log_dir given to debug_api.initialize)",
            dir.display()
        )));
    }
    logs.sort_by_key(|l| l.rank);
    Ok(logs)
}

/// What a statistics line looks like, for error messages.
const EXPECTED: &str = "expected '<time> - INFO - <layer>_<tensor>_<stat> iteration=<N> value=<V>'";

/// Parses one line (without its newline).
pub fn parse_line(text: &str, line: usize) -> Result<LogLine, String> {
    // `<asctime> - <LEVEL> - <message>`: the time holds no " - ".
    let mut parts = text.splitn(3, " - ");
    let (Some(_time), Some(level), Some(message)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(format!("not a log line ({EXPECTED})"));
    };
    if level.is_empty() || !level.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(format!("no log level ({EXPECTED})"));
    }
    let mut tokens = message.split_whitespace();
    let value_tok = tokens.next_back().ok_or_else(|| format!("empty message ({EXPECTED})"))?;
    let iter_tok = tokens.next_back().ok_or_else(|| format!("no iteration ({EXPECTED})"))?;
    let name: Vec<&str> = tokens.collect();
    let value_text = value_tok.strip_prefix("value=").ok_or_else(|| format!("'{value_tok}' is not value=<V> ({EXPECTED})"))?;
    let iter_text = iter_tok.strip_prefix("iteration=").ok_or_else(|| format!("'{iter_tok}' is not iteration=<N> ({EXPECTED})"))?;
    if name.len() != 1 {
        return Err(format!("the statistic's name should be one word, found {} ({EXPECTED})", name.len()));
    }
    let iteration: u64 = iter_text.parse().map_err(|_| format!("iteration '{iter_text}' is not a whole number"))?;
    let value: f64 = value_text.parse().map_err(|_| format!("value '{value_text}' is not a number"))?;
    Ok(LogLine { line, name: name[0].to_string(), iteration, value, text: value_text.to_string() })
}

/// Parses a whole log (see the module's note on bad lines).
pub fn parse_log(path: &Path) -> Result<ParsedLog, AnalyzeError> {
    let bytes = std::fs::read(path).map_err(|e| AnalyzeError::usage(format!("{}: {e}", path.display())))?;
    let text = String::from_utf8_lossy(&bytes);
    let ends_clean = text.is_empty() || text.ends_with('\n');
    let all: Vec<&str> = text.split_terminator('\n').collect();
    let mut lines = Vec::with_capacity(all.len());
    let mut truncated_line = None;
    for (i, raw) in all.iter().enumerate() {
        let n = i + 1;
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        if !ends_clean && i + 1 == all.len() {
            truncated_line = Some(n);
            break;
        }
        if raw.trim().is_empty() {
            continue;
        }
        let parsed = parse_line(raw, n).map_err(|message| AnalyzeError::BadLog { path: path.to_path_buf(), line: n, message })?;
        lines.push(parsed);
    }
    Ok(ParsedLog { lines, truncated_line })
}

/// Decimals written after the point, when the value is written as a plain decimal.
pub fn decimals(text: &str) -> Option<u32> {
    let (_, frac) = text.split_once('.')?;
    frac.bytes().all(|b| b.is_ascii_digit()).then_some(frac.len() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_as_nvdlfw_inspect_writes_them_parse() {
        let l = "2025-05-19 12:00:01,123 - INFO - model.layers.0.fc1_activation_underflows% \t\t\t\t iteration=000042 \t\t\t\t value=0.0312";
        let p = parse_line(l, 7).unwrap();
        assert_eq!((p.name.as_str(), p.iteration, p.value, p.line), ("model.layers.0.fc1_activation_underflows%", 42, 0.0312, 7));
        let n = parse_line("2025-05-19 12:00:01,123 - INFO - a_weight_max \t iteration=000001 \t value=nan", 1).unwrap();
        assert!(n.value.is_nan());
        assert_eq!(parse_line("t - INFO - a_gradient_min iteration=3 value=-inf", 1).unwrap().value, f64::NEG_INFINITY);
    }

    #[test]
    fn malformed_lines_say_what_was_expected() {
        for bad in [
            "garbage",
            "t - INFO - name iteration=x value=1",
            "t - INFO - name iteration=1 value=abc",
            "t - INFO - name value=1",
            "t - INFO - two words iteration=1 value=1",
        ] {
            let e = parse_line(bad, 1).unwrap_err();
            assert!(!e.is_empty(), "{bad}");
        }
    }

    #[test]
    fn rank_comes_from_the_file_name() {
        assert_eq!(rank_of_file("nvdlfw_inspect_globalrank-0.log"), Some(0));
        assert_eq!(rank_of_file("nvdlfw_inspect_20250519_120000_globalrank-12.log"), Some(12));
        assert_eq!(rank_of_file("nvdlfw_inspect_globalrank-x.log"), None);
        assert_eq!(rank_of_file("notes.txt"), None);
    }

    #[test]
    fn decimals_are_counted_from_the_text() {
        assert_eq!(decimals("0.0312"), Some(4));
        assert_eq!(decimals("-12.5000"), Some(4));
        assert_eq!(decimals("nan"), None);
    }
}
