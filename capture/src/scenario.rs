//! Built-in failure scenarios (`--scenario`): the three anomaly classes reproduced by the data and
//! the recipe alone, with no planted defect, so that the analyzer and `triage` can be shown and
//! tested on failures whose cause is known.
//!
//! The lever is a set of *loud tokens*: the top ids of the vocabulary, which the synthetic language
//! never emits, with embeddings concentrated in one channel. The model is pre-LN, so a loud token's
//! residual is normalised before every GEMM; but a vector concentrated in one of C channels
//! normalises to about √(C−1) in that channel (7.9 at C = 64), where ordinary tokens peak near 4.
//! A burst of loud tokens therefore raises the amax of every LayerNorm-fed cast (qkv and fc1
//! activations of every layer) above what delayed scaling's history has seen.

use crate::backend::Backend;
use crate::data::Batch;
use fp8scope_schemas::config::RunConfig;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;

/// A built-in scenario: the data it plants and the recipe defaults it sets.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: &'static str,
    pub about: &'static str,
    /// Number of loud token ids (the top ids of the vocabulary).
    pub loud_tokens: u32,
    /// Channel the loud tokens' embeddings are concentrated in.
    pub loud_channel: usize,
    /// Value of that channel in a loud token's embedding (the others are 0).
    pub loud_value: f32,
    /// Steps (1-based, inclusive ranges) whose batches carry loud tokens.
    pub bursts: Vec<(u32, u32)>,
    /// Fraction of input positions (not the topic marker) replaced by loud tokens in a burst.
    pub loud_frac: f64,
    /// Recipe defaults the scenario sets (flags given explicitly still win).
    pub amax_history: Option<u32>,
    pub amax_algo_most_recent: Option<bool>,
    pub margin: Option<i32>,
    pub e4m3: Option<bool>,
    /// Non-saturating casts (`--overflow nan`).
    pub overflow_nan: bool,
}

pub const NAMES: [&str; 3] = ["spike", "drift", "nan"];

/// The scenario called `name`, if there is one.
pub fn scenario(name: &str) -> Option<Scenario> {
    let s = match name {
        "spike" => Scenario {
            name: "spike",
            about: "a burst of loud tokens saturates the delayed-scaled casts, then the run recovers",
            loud_tokens: 4,
            loud_channel: 0,
            loud_value: 1.0,
            bursts: vec![(150, 150)],
            loud_frac: 0.25,
            amax_history: Some(16),
            amax_algo_most_recent: None,
            margin: None,
            e4m3: None,
            overflow_nan: false,
        },
        "drift" => Scenario {
            name: "drift",
            about: "one burst of loud tokens inflates a long max amax history; small values underflow",
            loud_tokens: 4,
            loud_channel: 0,
            loud_value: 1.0,
            bursts: vec![(50, 50)],
            loud_frac: 0.25,
            amax_history: Some(1024),
            amax_algo_most_recent: Some(false),
            margin: None,
            e4m3: None,
            overflow_nan: false,
        },
        "nan" => Scenario {
            name: "nan",
            about: "non-saturating casts (PyTorch-style): the first value past the delayed-scaling amax becomes NaN",
            loud_tokens: 0,
            loud_channel: 0,
            loud_value: 0.0,
            bursts: vec![],
            loud_frac: 0.0,
            amax_history: None,
            amax_algo_most_recent: None,
            margin: Some(0),
            e4m3: None,
            overflow_nan: true,
        },
        _ => return None,
    };
    Some(s)
}

impl Scenario {
    /// The loud token ids for a vocabulary of `vocab`.
    pub fn loud_ids(&self, vocab: u32) -> std::ops::Range<u32> {
        vocab - self.loud_tokens..vocab
    }

    fn in_burst(&self, step: u32) -> bool {
        self.bursts.iter().any(|&(a, b)| (a..=b).contains(&step))
    }

    /// Replaces a fraction of a burst step's input tokens by loud tokens (targets are unchanged).
    pub fn apply(&self, step: u32, seq: usize, vocab: u32, seed: u64, batch: &mut Batch) {
        if !self.in_burst(step) {
            return;
        }
        let mut rng = Pcg64::seed_from_u64(seed ^ 0x10D0_7EC5 ^ (step as u64) << 20);
        let ids = self.loud_ids(vocab);
        for (i, tok) in batch.inputs.iter_mut().enumerate() {
            if i % seq != 0 && rng.random::<f64>() < self.loud_frac {
                *tok = rng.random_range(ids.clone());
            }
        }
    }

    /// Writes the loud tokens' embedding rows into `wte` (V, C).
    pub fn init_embedding<B: Backend>(&self, be: &mut B, wte: &mut B::Buf, vocab: usize, c: usize) {
        let mut host = be.download(wte, 0, vocab * c, 1);
        for id in self.loud_ids(vocab as u32) {
            let row = &mut host[id as usize * c..][..c];
            row.fill(0.0);
            row[self.loud_channel % c] = self.loud_value;
        }
        *wte = be.upload(&host);
    }
}

/// The scenario of a run's configuration.
pub fn of(cfg: &RunConfig) -> Option<Scenario> {
    cfg.scenario.as_deref().and_then(scenario)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_scenario_exists_and_unknown_names_do_not() {
        for n in NAMES {
            assert_eq!(scenario(n).map(|s| s.name), Some(n));
        }
        assert!(scenario("explode").is_none());
    }

    #[test]
    fn loud_tokens_go_only_into_burst_steps_and_never_replace_the_topic_marker() {
        let s = scenario("spike").unwrap();
        let (seq, vocab) = (64usize, 512u32);
        let fresh = || Batch { inputs: vec![5; 8 * seq], targets: vec![6; 8 * seq] };
        let mut quiet = fresh();
        s.apply(s.bursts[0].0 - 1, seq, vocab, 0, &mut quiet);
        assert!(quiet.inputs.iter().all(|&t| t == 5));
        let (mut a, mut b) = (fresh(), fresh());
        s.apply(s.bursts[0].0, seq, vocab, 0, &mut a);
        s.apply(s.bursts[0].0, seq, vocab, 0, &mut b);
        assert_eq!(a.inputs, b.inputs, "a burst depends only on (seed, step)");
        let loud = a.inputs.iter().filter(|&&t| s.loud_ids(vocab).contains(&t)).count();
        // 8·63 eligible positions at loud_frac 0.25: 126 expected, σ ≈ 9.7.
        assert!((80..=170).contains(&loud), "{loud} loud tokens");
        assert!(a.inputs.iter().step_by(seq).all(|&t| t == 5));
        assert!(a.targets.iter().all(|&t| t == 6), "targets are unchanged");
    }
}
