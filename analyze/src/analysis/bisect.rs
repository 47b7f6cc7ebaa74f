//! Bisection planning for `triage`: the order candidate GEMMs are tried in, and the search for a
//! minimal set of them whose return to BF16 cures the run. The search only plans: it asks a
//! `probe` whether each set of candidate indices cures (the caller records those runs), so it is
//! tested here against known answers.
//!
//! 1. **Top of the ranking first.** The first round tries, in parallel, the top candidate alone,
//!    the top two together, then the next candidates alone, as many sets as there are jobs (at
//!    least two). A good ranking (locate by harm) then needs one run, or two for a pair.
//! 2. **Prefix search.** Otherwise the smallest prefix of the ordered candidates that cures (with
//!    the culprits found so far) ends in a culprit, found with `jobs` probes per round; culprits
//!    are added one at a time until they cure the run together, so the set is minimal.

use std::collections::BTreeMap;

/// Where the search ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BisectOutcome {
    /// Indices into the candidate pool, ascending: a set that cured (minimal when `complete`).
    pub culprits: Vec<usize>,
    /// Sets probed (runs recorded).
    pub runs: usize,
    /// The search stopped at `max_runs` before the culprits cured the run together.
    pub stopped_at_max: bool,
    /// Every candidate was used and the run was still not cured (the faults interact).
    pub ran_out: bool,
}

impl BisectOutcome {
    pub fn complete(&self) -> bool {
        !self.stopped_at_max && !self.ran_out
    }
}

/// Orders `all` (given in execution order) by `rank`: the names in `leads` first in their order,
/// then by `ranking`'s order, then the rest in execution order. `name` gives a candidate's name.
pub fn order_candidates<T: Clone>(all: &[T], name: impl Fn(&T) -> String, leads: &[String], ranking: &[String]) -> Vec<T> {
    let mut rank: BTreeMap<String, usize> = BTreeMap::new();
    for (i, n) in ranking.iter().enumerate() {
        rank.entry(n.clone()).or_insert(leads.len() + i);
    }
    for (i, n) in leads.iter().enumerate().rev() {
        rank.insert(n.clone(), i);
    }
    let mut v: Vec<(usize, usize, T)> = all.iter().enumerate().map(|(i, c)| (rank.get(&name(c)).copied().unwrap_or(usize::MAX), i, c.clone())).collect();
    v.sort_by_key(|x| (x.0, x.1));
    v.into_iter().map(|x| x.2).collect()
}

/// Finds a minimal set of the `n` candidates (0 most suspect) whose return to BF16 cures, knowing
/// that all `n` together cure. `probe` records the given sets (each ascending) in parallel and
/// says whether each cured; it is never asked the same set twice, nor a set in `known` (sets
/// already recorded, with whether each cured; they count in no run total).
pub fn bisect<E>(
    n: usize,
    jobs: usize,
    max_runs: usize,
    known: &[(Vec<usize>, bool)],
    probe: &mut dyn FnMut(&[Vec<usize>]) -> Result<Vec<bool>, E>,
) -> Result<BisectOutcome, E> {
    let jobs = jobs.max(1);
    let mut memo: BTreeMap<Vec<usize>, bool> = known.iter().cloned().collect();
    let mut runs = 0usize;
    let mut test = |sets: Vec<Vec<usize>>, memo: &mut BTreeMap<Vec<usize>, bool>, runs: &mut usize| -> Result<Vec<bool>, E> {
        let sets: Vec<Vec<usize>> = sets
            .into_iter()
            .map(|mut s| {
                s.sort_unstable();
                s.dedup();
                s
            })
            .collect();
        let mut todo: Vec<Vec<usize>> = Vec::new();
        for s in &sets {
            if !memo.contains_key(s) && !todo.contains(s) {
                todo.push(s.clone());
            }
        }
        if !todo.is_empty() {
            let cured = probe(&todo)?;
            *runs += todo.len();
            for (k, c) in todo.into_iter().zip(cured) {
                memo.insert(k, c);
            }
        }
        Ok(sets.iter().map(|s| memo.get(s).copied().unwrap_or(false)).collect())
    };
    let done = |culprits: Vec<usize>, runs: usize, stopped_at_max: bool, ran_out: bool| BisectOutcome { culprits, runs, stopped_at_max, ran_out };
    if n == 0 {
        return Ok(done(Vec::new(), 0, false, true));
    }

    // 1. The top of the ranking: {0}, {0, 1}, {1}, {2}, … as many as the jobs (at least two).
    let mut first: Vec<Vec<usize>> = vec![vec![0]];
    if n > 1 {
        first.push(vec![0, 1]);
    }
    let mut k = 1;
    while first.len() < jobs.max(2) && k < n {
        first.push(vec![k]);
        k += 1;
    }
    let res = test(first.clone(), &mut memo, &mut runs)?;
    if res[0] {
        return Ok(done(vec![0], runs, false, false));
    }
    if let Some(i) = (2..first.len()).find(|&i| res[i]) {
        return Ok(done(first[i].clone(), runs, false, false));
    }
    if n > 1 && res[1] {
        // {0, 1} cures and {0} does not: is 1 alone enough?
        let alone = test(vec![vec![1]], &mut memo, &mut runs)?[0];
        return Ok(done(if alone { vec![1] } else { vec![0, 1] }, runs, false, false));
    }

    // 2. Prefix search: the smallest prefix of the remaining pool that cures (with the culprits
    //    found so far) ends in a culprit.
    let mut needed: Vec<usize> = Vec::new();
    let mut rest: Vec<usize> = (0..n).collect();
    loop {
        if !needed.is_empty() && test(vec![needed.clone()], &mut memo, &mut runs)?[0] {
            break;
        }
        if rest.is_empty() {
            needed.sort_unstable();
            return Ok(done(needed, runs, false, true));
        }
        let (mut lo, mut hi) = (0usize, rest.len()); // prefix lo fails (0: nothing more), hi cures
        while hi - lo > 1 {
            if runs >= max_runs {
                needed.sort_unstable();
                return Ok(done(needed, runs, true, false));
            }
            let p = jobs.min(hi - lo - 1);
            let mut ks: Vec<usize> = (1..=p).map(|j| lo + (hi - lo) * j / (p + 1)).filter(|&k| k > lo && k < hi).collect();
            ks.dedup();
            let sets: Vec<Vec<usize>> = ks.iter().map(|&k| needed.iter().copied().chain(rest[..k].iter().copied()).collect()).collect();
            let res = test(sets, &mut memo, &mut runs)?;
            let new_hi = ks.iter().zip(&res).filter(|(_, c)| **c).map(|(k, _)| *k).min().unwrap_or(hi);
            let new_lo = ks.iter().zip(&res).filter(|(k, c)| !**c && **k < new_hi).map(|(k, _)| *k).max().unwrap_or(lo);
            hi = new_hi;
            lo = new_lo;
        }
        needed.push(rest[hi - 1]);
        rest.truncate(hi - 1);
    }
    needed.sort_unstable();
    Ok(done(needed, runs, false, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the search against an oracle: a set cures when it holds every culprit.
    fn search(n: usize, culprits: &[usize], jobs: usize) -> BisectOutcome {
        let mut asked: Vec<Vec<usize>> = Vec::new();
        let mut probe = |sets: &[Vec<usize>]| -> Result<Vec<bool>, ()> {
            for s in sets {
                assert!(!asked.contains(s), "asked twice: {s:?}");
                asked.push(s.clone());
            }
            Ok(sets.iter().map(|s| culprits.iter().all(|c| s.contains(c))).collect())
        };
        bisect(n, jobs, 40, &[], &mut probe).unwrap()
    }

    #[test]
    fn a_culprit_at_the_top_of_the_ranking_takes_one_round() {
        let o = search(24, &[0], 2);
        assert_eq!((o.culprits.clone(), o.runs, o.complete()), (vec![0], 2, true));
    }

    #[test]
    fn a_pair_at_the_top_takes_three_runs_and_is_minimal() {
        let o = search(24, &[0, 1], 2);
        assert_eq!((o.culprits.clone(), o.runs), (vec![0, 1], 3), "{{0, 1}} cures; {{1}} alone does not");
        let o = search(24, &[1], 2);
        assert_eq!((o.culprits.clone(), o.runs), (vec![1], 3), "{{0,1}} cures, {{0}} does not, {{1}} alone does");
    }

    #[test]
    fn culprits_deep_in_the_ranking_are_found_minimal_by_the_prefix_search() {
        for culprits in [vec![13], vec![9, 13], vec![3, 17, 21]] {
            for jobs in [1, 2, 4] {
                let o = search(24, &culprits, jobs);
                assert_eq!(o.culprits, culprits, "jobs {jobs}: {o:?}");
                assert!(o.complete() && o.runs <= 40, "{o:?}");
            }
        }
    }

    #[test]
    fn a_known_set_is_not_probed_again() {
        let mut asked = 0;
        let mut probe = |sets: &[Vec<usize>]| -> Result<Vec<bool>, ()> {
            assert!(!sets.contains(&vec![0]), "{{0}} is known");
            asked += sets.len();
            Ok(sets.iter().map(|s| s.contains(&1)).collect())
        };
        let o = bisect(24, 2, 40, &[(vec![0], false)], &mut probe).unwrap();
        assert_eq!((o.culprits, o.runs), (vec![1], 2), "{{0, 1}} cures, then {{1}} alone");
        assert_eq!(asked, 2);
    }

    #[test]
    fn the_search_stops_at_max_runs_and_says_so() {
        let mut probe = |sets: &[Vec<usize>]| -> Result<Vec<bool>, ()> { Ok(sets.iter().map(|s| s.len() == 24).collect()) };
        let o = bisect(24, 2, 6, &[], &mut probe).unwrap();
        assert!(o.stopped_at_max && !o.complete(), "{o:?}");
    }

    #[test]
    fn leads_then_ranking_then_execution_order() {
        let all: Vec<String> = ["a", "b", "c", "d", "e"].iter().map(|s| s.to_string()).collect();
        let got = order_candidates(&all, |s| s.clone(), &["d".into()], &["c".into(), "d".into(), "a".into()]);
        assert_eq!(got, ["d", "c", "a", "b", "e"]);
    }
}
