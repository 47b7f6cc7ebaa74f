//! What `ranks` reports: one finding per check and tensor (or rank), in the JSON shape other tools
//! read, and the small helpers the checks share (majority of a group's values, relative gaps).

use serde::Serialize;
use serde_json::Value;

/// The check names, as they appear in `findings[].check`.
pub mod check {
    pub const SCALE_DISAGREES: &str = "scale_disagrees";
    pub const DIGEST_DISAGREES: &str = "digest_disagrees";
    pub const AMAX_GROUP: &str = "amax_group";
    pub const RANK_OUTLIER: &str = "rank_outlier";
    pub const FIRST_NONFINITE: &str = "first_nonfinite";
    pub const STRAGGLER: &str = "straggler";
    pub const CAST_MISMATCH: &str = "cast_mismatch";
    pub const FORWARD_WEIGHT_MISMATCH: &str = "forward_weight_mismatch";
    pub const STALE_FORWARD_WEIGHT: &str = "stale_forward_weight";
    pub const RANK_STOPPED: &str = "rank_stopped";
    pub const RANK_CRASHED: &str = "rank_crashed";
    pub const RANK_MISSING: &str = "rank_missing";

    /// Every check, in the order findings of one step are listed.
    pub const ALL: [&str; 12] = [
        RANK_MISSING,
        RANK_CRASHED,
        RANK_STOPPED,
        FIRST_NONFINITE,
        SCALE_DISAGREES,
        DIGEST_DISAGREES,
        AMAX_GROUP,
        FORWARD_WEIGHT_MISMATCH,
        STALE_FORWARD_WEIGHT,
        CAST_MISMATCH,
        RANK_OUTLIER,
        STRAGGLER,
    ];
}

/// One finding.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    /// One of [`check`].
    pub check: &'static str,
    /// The first step it shows at (null for liveness findings without one).
    pub step: Option<i64>,
    /// The site (`layers.3.fc1`, or the module path of a run from elsewhere); null for rank-wide
    /// findings (straggler, liveness).
    pub module: Option<String>,
    /// The operand's role (`activation`, `weight`, `gradient`).
    pub role: Option<String>,
    /// The GEMM of the row the finding comes from.
    pub gemm: Option<String>,
    /// The ranks it names, ascending.
    pub ranks: Vec<u32>,
    /// The group it concerns: the group whose members disagree, the configured reduction set of
    /// `amax_group`; null for per-rank checks.
    pub group: Option<String>,
    /// What was found (a number, or for `amax_group` the name of the set the amax was reduced over).
    pub value: Value,
    /// What it should have been.
    pub expected: Value,
    /// The finding in one sentence, with its counts.
    pub message: String,
    /// The magnitude in a few words, for the text output.
    #[serde(skip)]
    pub magnitude: String,
}

impl Finding {
    pub fn new(check: &'static str) -> Finding {
        Finding {
            check,
            step: None,
            module: None,
            role: None,
            gemm: None,
            ranks: Vec::new(),
            group: None,
            value: Value::Null,
            expected: Value::Null,
            message: String::new(),
            magnitude: String::new(),
        }
    }

    /// The order findings are listed in: first step (those without one last), check, site, role.
    pub fn sort(findings: &mut [Finding]) {
        let order = |c: &str| check::ALL.iter().position(|x| *x == c).unwrap_or(usize::MAX);
        findings.sort_by(|a, b| {
            (a.step.is_none(), a.step, order(a.check), &a.module, &a.role, &a.ranks).cmp(&(
                b.step.is_none(),
                b.step,
                order(b.check),
                &b.module,
                &b.role,
                &b.ranks,
            ))
        });
    }
}

/// A number as JSON (`null` when not finite).
pub fn num(x: f64) -> Value {
    crate::output::jf(x)
}

/// |a − b| / |b| (∞ when b = 0 ≠ a, 0 when both are 0).
pub fn rel_gap(a: f64, b: f64) -> f64 {
    if a == b {
        0.0
    } else if b == 0.0 {
        f64::INFINITY
    } else {
        (a - b).abs() / b.abs()
    }
}

/// Of one group's values (rank, value as bits), the majority value — the most frequent; on a tie,
/// the one the lowest rank holds — and the ranks that hold another.
pub fn majority(values: &[(u32, u64)]) -> Option<(u64, Vec<u32>)> {
    if values.is_empty() {
        return None;
    }
    let mut counts: Vec<(u64, usize, u32)> = Vec::new();
    for &(rank, v) in values {
        match counts.iter_mut().find(|c| c.0 == v) {
            Some(c) => {
                c.1 += 1;
                c.2 = c.2.min(rank);
            }
            None => counts.push((v, 1, rank)),
        }
    }
    counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.2.cmp(&b.2)));
    let maj = counts[0].0;
    let mut off: Vec<u32> = values.iter().filter(|(_, v)| *v != maj).map(|(r, _)| *r).collect();
    off.sort_unstable();
    Some((maj, off))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_majority_wins_and_a_tie_goes_to_the_lowest_rank() {
        assert_eq!(majority(&[(0, 7), (1, 7), (2, 9)]), Some((7, vec![2])));
        assert_eq!(majority(&[(3, 9), (2, 7)]), Some((7, vec![3])));
        assert_eq!(majority(&[]), None);
        assert_eq!((rel_gap(2.0, 1.0), rel_gap(0.0, 0.0), rel_gap(1.0, 0.0)), (1.0, 0.0, f64::INFINITY));
    }
}
