//! Built-in failure scenarios (`--scenario`): the three anomaly classes reproduced by the data and
//! the recipe alone, with no planted defect, so that the analyzer and `triage` can be shown and
//! tested on failures whose cause is known. capture/README.md gives the measured numbers.
//!
//! The data levers are two kinds of batch that real pipelines produce, both made with the loss
//! mask ([`IGNORE_TARGET`], PyTorch's `ignore_index`):
//!
//! - **a prompt-heavy batch** (`drift`): every target is masked except a few, as in a supervised
//!   fine-tuning batch of long prompts and one-token answers. The loss is the mean over the
//!   supervised targets, so each of them carries N/n times the usual gradient, and the amax of the
//!   residual-stream gradient casts (proj, fc2) jumps by about that factor. Delayed scaling with a long `max` history then keeps
//!   the gradient scales that much too small for the rest of the run; in E4M3 (range 2^-9..448,
//!   DeepSeek-style E4M3 everywhere) the gradient values fall into the subnormals or flush to zero,
//!   the linears learn slower, and the loss drifts above BF16's (tiny: +4.4%; current scaling
//!   +0.03%). On `tiny` a batch holds 512 tokens, so the amax rises by 2^8.5 at most, which E4M3's
//!   2^17.8 absorbs; the scenario's margin of 8 stands in for a larger batch (margins 0–6: no drift).
//!   No drift either from the margin alone.
//! - **a padding batch** (`spike`): every input is the pad token, whose embedding is zero (as
//!   `nn.Embedding(padding_idx=…)` keeps it) and never trained, and every target is masked. The
//!   first LayerNorm of a zero vector outputs its bias, so layer 0's qkv activation has an amax of
//!   max|bias| (a few hundredths, against about 3) in that step. Delayed scaling with a
//!   `most_recent` history (Transformer Engine's original default, history 1) takes the next
//!   step's scale from it, and the next ordinary batch exceeds that expectation about 100×: 97% of
//!   the cast's values saturate, layer 0's queries, keys and values shrink to sign patterns of a
//!   few hundredths, and its attention is lost for one step. The padding batch itself has no
//!   supervised target: loss 0 and no gradient. How far the loss jumps depends on how much the
//!   model leans on attention: on the default language (topic worth 0.24 nats, planted at step 150)
//!   the residual stream absorbs it (−0.1%), so the scenario steepens the language's rows (Zipf
//!   exponent 3: the topic, which only attention can fetch, is worth 1.13 nats) and plants the
//!   padding batch late (step 250), once attention has learned to fetch it. The step after jumps
//!   +14% above BF16 and the next +4.5%; from the step after that the gap is back to FP8's usual
//!   (the final loss is +0.36%, as with current scaling).

use crate::backend::Backend;
use crate::data::Batch;
use crate::layers::IGNORE_TARGET;
use crate::model::{Layout, Model};
use fp8scope_schemas::config::{Arch, RunConfig};
use fp8scope_schemas::names::Module;

/// What a scenario plants in its batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plant {
    /// Nothing: the scenario is the recipe alone.
    Nothing,
    /// Every target masked except the last one of the first `supervised` sequences.
    PromptHeavy { supervised: usize },
    /// Every input the pad token (the top id, zero embedding), every target masked.
    Padding,
    /// One input in every `every` replaced by the trigger token (the top id), targets unchanged:
    /// a token the model has never seen, from a new source of data.
    Trigger { every: usize },
}

/// An initialisation that starts one SwiGLU channel where long training takes it (Fishman et
/// al. 2024): the up projection's row equal to the gate's, so the channel's output is
/// silu(z)·z ≈ z², and both scaled by `gain`. Tokens whose normalised input points along that row
/// (`aligned_tokens`) drive z to its largest, |w|·√C, and the fc2 input to a quadratic outlier.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AlignedChannel {
    pub layer: usize,
    pub channel: usize,
    pub gain: f32,
    /// Which token embeddings are pointed along the row.
    pub tokens: AlignedTokens,
}

/// The tokens whose embedding an [`AlignedChannel`] points along its gate row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlignedTokens {
    /// The trigger token (the top id), which only a [`Plant::Trigger`] batch contains.
    Trigger,
    /// Delimiters, on which Sun et al. (2024) find massive activations: the synthetic language's
    /// topic markers (the first token of every sequence), or the newline of text.
    Delimiters,
}

/// A built-in scenario: the batches it plants and the recipe defaults it sets.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: &'static str,
    pub about: &'static str,
    pub plant: Plant,
    /// Steps (1-based) whose batches are planted.
    pub steps: Vec<u32>,
    /// Data and recipe defaults the scenario sets (flags given explicitly still win).
    pub zipf_exponent: Option<f64>,
    pub amax_history: Option<u32>,
    pub amax_algo_most_recent: Option<bool>,
    pub margin: Option<i32>,
    pub e4m3: Option<bool>,
    /// Non-saturating casts (`--overflow nan`).
    pub overflow_nan: bool,
    /// The architecture the scenario's mechanism needs, if one.
    pub arch: Option<Arch>,
    /// A SwiGLU channel aligned at initialisation.
    pub aligned: Option<AlignedChannel>,
}

pub const NAMES: [&str; 5] = ["spike", "drift", "nan", "swiglu-outliers", "massive-activations"];

/// The scenario called `name`, if there is one.
pub fn scenario(name: &str) -> Option<Scenario> {
    let s = match name {
        "spike" => Scenario {
            name: "spike",
            about: "a padding batch collapses the most-recent amax of layer 0's qkv activation; the next batch saturates and loses attention",
            plant: Plant::Padding,
            steps: vec![250],
            zipf_exponent: Some(3.0),
            amax_history: Some(1),
            amax_algo_most_recent: Some(true),
            margin: None,
            e4m3: None,
            overflow_nan: false,
            arch: None,
            aligned: None,
        },
        "drift" => Scenario {
            name: "drift",
            about: "a prompt-heavy batch inflates a long max amax history of every gradient; E4M3 gradients underflow",
            plant: Plant::PromptHeavy { supervised: 1 },
            steps: vec![25],
            zipf_exponent: None,
            amax_history: Some(1024),
            amax_algo_most_recent: Some(false),
            margin: Some(8),
            e4m3: Some(true),
            overflow_nan: false,
            arch: None,
            aligned: None,
        },
        "nan" => Scenario {
            name: "nan",
            about: "non-saturating casts (PyTorch-style): the first value past the delayed-scaling amax becomes NaN",
            plant: Plant::Nothing,
            steps: vec![],
            zipf_exponent: None,
            amax_history: None,
            amax_algo_most_recent: None,
            margin: Some(0),
            e4m3: None,
            overflow_nan: true,
            arch: None,
            aligned: None,
        },
        "swiglu-outliers" => Scenario {
            name: "swiglu-outliers",
            about: "an aligned SwiGLU channel meets a new token: a quadratic outlier in fc2's input that the delayed amax has never seen saturates",
            plant: Plant::Trigger { every: 8 },
            steps: vec![SWIGLU_STEP],
            zipf_exponent: None,
            amax_history: Some(16),
            amax_algo_most_recent: Some(false),
            margin: Some(0),
            e4m3: None,
            overflow_nan: false,
            arch: Some(Arch::Llama),
            aligned: Some(AlignedChannel { layer: 0, channel: 0, gain: SWIGLU_GAIN, tokens: AlignedTokens::Trigger }),
        },
        "massive-activations" => Scenario {
            name: "massive-activations",
            about: "the first token of every sequence drives an aligned SwiGLU channel to a massive value; the per-tensor scale sized for it flushes the rest of fc2's input to zero",
            plant: Plant::Nothing,
            steps: vec![],
            zipf_exponent: None,
            amax_history: Some(1024),
            amax_algo_most_recent: Some(false),
            margin: Some(0),
            e4m3: None,
            overflow_nan: false,
            arch: Some(Arch::Llama),
            aligned: Some(AlignedChannel { layer: 0, channel: 0, gain: MASSIVE_GAIN, tokens: AlignedTokens::Delimiters }),
        },
        _ => return None,
    };
    Some(s)
}

/// Step of the `swiglu-outliers` trigger batch, and the gain of its aligned channel.
const SWIGLU_STEP: u32 = 200;
const SWIGLU_GAIN: f32 = 128.0;
/// Gain of the `massive-activations` channel.
const MASSIVE_GAIN: f32 = 512.0;

impl Scenario {
    /// Token ids the scenario reserves at the top of the vocabulary (the synthetic language
    /// never emits them).
    pub fn reserved_tokens(&self) -> u32 {
        match self.plant {
            Plant::Padding | Plant::Trigger { .. } => 1,
            Plant::Nothing | Plant::PromptHeavy { .. } => 0,
        }
    }

    /// The same scenario with its batch planted at `step` (`--scenario-step`); None for a scenario
    /// that plants no batch.
    pub fn planted_at(mut self, step: u32) -> Option<Scenario> {
        if self.steps.is_empty() {
            return None;
        }
        self.steps = vec![step];
        Some(self)
    }

    /// The pad token of a vocabulary of `vocab` (the top id).
    pub fn pad_id(vocab: u32) -> u32 {
        vocab - 1
    }

    fn planted(&self, step: u32) -> bool {
        self.steps.contains(&step)
    }

    /// Plants the scenario's batch at a planted step (sequences of `seq` tokens).
    pub fn apply(&self, step: u32, seq: usize, vocab: u32, batch: &mut Batch) {
        if !self.planted(step) {
            return;
        }
        match self.plant {
            Plant::Nothing => {}
            Plant::PromptHeavy { supervised } => {
                for (i, t) in batch.targets.iter_mut().enumerate() {
                    let (sequence, pos) = (i / seq, i % seq);
                    if !(sequence < supervised && pos == seq - 1) {
                        *t = IGNORE_TARGET;
                    }
                }
            }
            Plant::Padding => {
                batch.inputs.fill(Self::pad_id(vocab));
                batch.targets.fill(IGNORE_TARGET);
            }
            Plant::Trigger { every } => {
                // Every `every`-th position but the first of each sequence (the topic marker).
                for (i, t) in batch.inputs.iter_mut().enumerate() {
                    if i % seq != 0 && i % every == every / 2 {
                        *t = Self::pad_id(vocab);
                    }
                }
            }
        }
    }

    /// Whether the scenario needs the synthetic language (it plants batches, or its tokens are a
    /// trigger only the synthetic language leaves free).
    pub fn needs_synthetic(&self) -> bool {
        self.plant != Plant::Nothing || self.aligned.is_some_and(|a| a.tokens == AlignedTokens::Trigger)
    }

    /// Applies the scenario's initialisation to a fresh model: the pad token's zero embedding,
    /// an aligned SwiGLU channel and the embeddings pointed along it.
    pub fn init_model<B: Backend>(&self, be: &mut B, model: &mut Model<B>, delimiters: &[u32]) {
        let d = model.dims;
        self.init_embedding(be, &mut model.state.params[crate::model::WTE], d.v, d.c);
        let Some(al) = self.aligned else { return };
        let (f, c) = (d.f, d.c);
        // Layer `al.layer`'s gate row, scaled by the gain, becomes the gate and the up row of the
        // channel in that layer and every later one (one direction û, as one outlier feature).
        let mut gate: Vec<f32> = Vec::new();
        for layer in al.layer..d.l {
            let w = Layout::of(&d).linear(layer, Module::Fc1).0;
            // fc1's weight is (2F, C): rows 0..F the gate, F..2F the up projection.
            let mut fc1 = be.download(&model.state.params[w], 0, 2 * f * c, 1);
            if gate.is_empty() {
                gate = fc1[al.channel * c..][..c].iter().map(|x| x * al.gain).collect();
            }
            fc1[al.channel * c..][..c].copy_from_slice(&gate);
            fc1[(f + al.channel) * c..][..c].copy_from_slice(&gate);
            model.state.params[w] = be.upload(&fc1);
        }
        // Point the chosen tokens' embeddings along the gate row û, with the norm of a typical
        // embedding row times 3 (so that the row dominates what attention adds in layer 0); every
        // other token gets a component of −1 typical norm along û instead of its random one, so
        // that the channel's gate is negative and SiLU keeps it silent there: the outlier is
        // selective, as the published ones are (a few tokens, one channel).
        let norm = gate.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt() as f32;
        let unit: Vec<f32> = gate.iter().map(|g| g / norm).collect();
        let mut wte = be.download(&model.state.params[crate::model::WTE], 0, d.v * c, 1);
        let typical = 0.02 * (c as f32).sqrt();
        let chosen: Vec<usize> = match al.tokens {
            AlignedTokens::Trigger => vec![Self::pad_id(d.v as u32) as usize],
            AlignedTokens::Delimiters => delimiters.iter().map(|&t| t as usize).collect(),
        };
        for t in 0..d.v {
            let row = &mut wte[t * c..][..c];
            if chosen.contains(&t) {
                for (e, u) in row.iter_mut().zip(&unit) {
                    *e = u * typical * 3.0;
                }
            } else {
                let along: f32 = row.iter().zip(&unit).map(|(e, u)| e * u).sum();
                for (e, u) in row.iter_mut().zip(&unit) {
                    *e += (-typical - along) * u;
                }
            }
        }
        model.state.params[crate::model::WTE] = be.upload(&wte);
    }

    /// Zeroes the pad token's embedding row in `wte` (V, C). It stays zero: the pad token only
    /// appears in batches without a supervised target, whose gradients are zero.
    fn init_embedding<B: Backend>(&self, be: &mut B, wte: &mut B::Buf, vocab: usize, c: usize) {
        if self.plant != Plant::Padding {
            return;
        }
        let mut host = be.download(wte, 0, vocab * c, 1);
        host[Self::pad_id(vocab as u32) as usize * c..][..c].fill(0.0);
        *wte = be.upload(&host);
    }
}

/// The scenario of a run's configuration, planted at its `scenario_step` when one is set.
pub fn of(cfg: &RunConfig) -> Option<Scenario> {
    let s = cfg.scenario.as_deref().and_then(scenario)?;
    Some(match cfg.scenario_step {
        Some(step) => s.planted_at(step)?,
        None => s,
    })
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

    fn fresh(seq: usize) -> Batch {
        Batch { inputs: vec![5; 8 * seq], targets: vec![6; 8 * seq] }
    }

    #[test]
    fn a_prompt_heavy_batch_masks_every_target_but_the_last_of_the_first_sequences() {
        let s = scenario("drift").unwrap();
        let (seq, vocab) = (64usize, 512u32);
        let mut quiet = fresh(seq);
        s.apply(s.steps[0] - 1, seq, vocab, &mut quiet);
        assert!(quiet.targets.iter().all(|&t| t == 6), "only planted steps change");
        let mut b = fresh(seq);
        s.apply(s.steps[0], seq, vocab, &mut b);
        let kept: Vec<usize> = (0..b.targets.len()).filter(|&i| b.targets[i] != IGNORE_TARGET).collect();
        assert_eq!(kept, [seq - 1], "one supervised target: the last of sequence 0");
        assert_eq!(b.targets[seq - 1], 6);
        assert!(b.inputs.iter().all(|&t| t == 5), "inputs are unchanged");
    }

    #[test]
    fn a_padding_batch_is_all_pad_inputs_and_masked_targets() {
        let s = scenario("spike").unwrap();
        assert_eq!(s.reserved_tokens(), 1);
        let (seq, vocab) = (64usize, 512u32);
        let mut b = fresh(seq);
        s.apply(s.steps[0], seq, vocab, &mut b);
        assert!(b.inputs.iter().all(|&t| t == 511));
        assert!(b.targets.iter().all(|&t| t == IGNORE_TARGET));
        let mut other = fresh(seq);
        s.apply(s.steps[0] + 1, seq, vocab, &mut other);
        assert!(other.inputs.iter().all(|&t| t == 5) && other.targets.iter().all(|&t| t == 6));
    }
}
