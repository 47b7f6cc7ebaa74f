//! The full configuration of a recorded run, as stored in the manifest: model shape, recipe,
//! routing, data, training hyper-parameters, recording selection, injections.
//!
//! `fp8-capture` builds it from its flags; `fp8-analyze` reads it to decide whether two runs can be
//! compared and to re-run a capture with changed flags (`triage`).

use serde::{Deserialize, Serialize};

/// Model dimensions. Names follow llm.c: V vocabulary, C channels, F feed-forward width, NH heads,
/// L layers, B sequences per step, T tokens per sequence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelDims {
    pub vocab: u32,
    pub channels: u32,
    pub ffn: u32,
    pub heads: u32,
    pub layers: u32,
    pub batch: u32,
    pub seq: u32,
    /// `causal` (each token attends to itself and earlier ones) or `full`.
    pub attn_mask: AttnMask,
}

impl ModelDims {
    pub fn tokens_per_step(&self) -> u64 {
        self.batch as u64 * self.seq as u64
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttnMask {
    Causal,
    Full,
}

/// Scaling recipe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecipeKind {
    /// No FP8: every GEMM in BF16. The baseline.
    Bf16,
    /// Transformer Engine's DelayedScaling: the scale comes from an amax history.
    Delayed,
    /// The scale comes from the tensor's own amax just before the cast.
    Current,
    /// DeepSeek-V3 style: 1×128 tiles for activation and gradient, 128×128 blocks for weights, E4M3.
    Block,
}

impl RecipeKind {
    pub const ALL: [RecipeKind; 4] =
        [RecipeKind::Bf16, RecipeKind::Delayed, RecipeKind::Current, RecipeKind::Block];
    pub fn as_str(self) -> &'static str {
        match self {
            RecipeKind::Bf16 => "bf16",
            RecipeKind::Delayed => "delayed",
            RecipeKind::Current => "current",
            RecipeKind::Block => "block",
        }
    }
}

/// FP8 formats per role: `hybrid` = E4M3 forward, E5M2 for gradients; `e4m3` everywhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FormatPolicy {
    Hybrid,
    E4m3,
}

/// How delayed scaling reduces its amax history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AmaxAlgo {
    Max,
    MostRecent,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecipeConfig {
    pub kind: RecipeKind,
    pub format: FormatPolicy,
    /// Length of the amax history (delayed scaling).
    pub amax_history: u32,
    pub amax_algo: AmaxAlgo,
    /// scale = (fp8_max / amax) / 2^margin.
    pub margin: i32,
    /// What a value past the format's largest finite number becomes: `saturate` (±max, as
    /// `cvt.rn.satfinite` and Transformer Engine do) or `nan` (a plain, non-saturating cast such
    /// as PyTorch's `tensor.to(torch.float8_e4m3fn)`: NaN in E4M3, ±Inf in E5M2). Absent in older
    /// manifests, where it means `saturate`.
    #[serde(default)]
    pub overflow: Overflow,
}

/// See [`RecipeConfig::overflow`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Overflow {
    #[default]
    Saturate,
    Nan,
}

/// Which GEMMs are sent back to BF16 while the recipe is FP8.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutingConfig {
    /// GEMM kinds in BF16 everywhere: any of `fprop`, `dgrad`, `wgrad`.
    pub bf16_gemms: Vec<String>,
    /// Layers whose GEMMs all run in BF16.
    pub bf16_layers: Vec<u32>,
    /// Single sites or GEMMs: `layers.7.fc2` (all three GEMMs) or `layers.7.fc2:dgrad`.
    pub bf16_sites: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataKind {
    /// A seeded first-order Markov language whose entropy floor is known exactly.
    Synthetic,
    /// Uniformly random tokens (the loss cannot fall below ln V).
    Uniform,
    /// A text file, bytes as tokens (V must be at least 256).
    Text,
    /// Data fp8scope does not know: a run recorded by another framework (PyTorch recorder) or
    /// imported from its logs (Transformer Engine's debug statistics).
    External,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DataConfig {
    pub kind: DataKind,
    /// The text file for `text` data.
    pub path: Option<String>,
    /// Seed of the language itself (its transition table); the batches use the run's seed.
    pub language_seed: u64,
    /// Successors per token in the synthetic language.
    pub branching: u32,
    /// Topics of the synthetic language: each sequence opens with a topic marker token and follows
    /// that topic's transition table, so predicting well needs attention back to the marker.
    pub topics: u32,
    /// Exponent s of the Zipf row, p_j ∝ 1/(j+1)^s: 1 is the classic law; a steeper row makes the
    /// topic's rotation decide more of each prediction. Runs recorded before it existed used 1.
    #[serde(default = "classic_zipf")]
    pub zipf_exponent: f64,
}

fn classic_zipf() -> f64 {
    1.0
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    pub steps: u32,
    pub lr: f64,
    pub warmup_steps: u32,
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Global gradient-norm clip; 0 disables it.
    pub grad_clip: f64,
    pub seed: u64,
    /// Seed of a jitter of the initial weights by ±2⁻⁹ relative (half a BF16 ulp), or none: runs
    /// that differ only by it measure the run-to-run spread (the noise band of `fp8-analyze`).
    /// Absent in runs recorded before the field existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_jitter: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DumpSample {
    /// The first rows of the tensor (like `t[:32]`).
    First,
    /// Every k-th element, spread over the whole tensor.
    Strided,
}

/// What is recorded and when.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordConfig {
    /// Statistics of every quantized tensor every this many steps (0: never).
    pub stats_every: u32,
    /// The expensive statistics (quant_mse, quant_cos) every this many recorded steps; null otherwise.
    pub quant_error_every: u32,
    /// Tensor dumps every this many steps (0: never). Step 1 is always a dump step when > 0.
    pub dump_every: u32,
    /// Regex over site names (`layers.1.fc2`) selecting the dumped sites.
    pub dump_layers: String,
    /// Roles dumped.
    pub dump_roles: Vec<String>,
    /// At most this many elements per dumped tensor.
    pub dump_max_elems: u32,
    pub dump_sample: DumpSample,
    /// At dump steps, also run every FP8 GEMM in BF16 on the same inputs and record the error.
    pub shadow: bool,
    /// Close a Parquet part at least every this many steps.
    pub flush_every: u32,
}

/// A defect planted in the FP8 path of one GEMM (see `fp8-capture --inject`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Injection {
    /// `layers.1.fc2`
    pub site: String,
    pub gemm: String,
    /// `overflow`, `underflow`, `outlier` or `nan`.
    pub kind: String,
    /// First step the defect is active (it stays active afterwards, except `nan`: that step only).
    pub step: u32,
    /// Exponent of the scale change (overflow/underflow) or factor (outlier).
    pub magnitude: f64,
}

/// Everything needed to reproduce a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    /// Preset the dimensions started from (`tiny`, `small`, `seed`), before any per-flag change.
    pub preset: String,
    pub model: ModelDims,
    pub recipe: RecipeConfig,
    pub routing: RoutingConfig,
    pub data: DataConfig,
    pub train: TrainConfig,
    pub record: RecordConfig,
    pub injections: Vec<Injection>,
    /// Built-in failure scenario, if any.
    pub scenario: Option<String>,
    /// The step the scenario plants its batch at, when not its own (`--scenario-step`); absent in
    /// runs recorded before it existed.
    #[serde(default)]
    pub scenario_step: Option<u32>,
    /// `cpu` or `cuda`.
    pub device: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_config_of_a_run_recorded_before_the_zipf_exponent_reads_as_the_classic_law() {
        let old = r#"{"kind":"synthetic","path":null,"language_seed":1234,"branching":8,"topics":4}"#;
        let d: DataConfig = serde_json::from_str(old).expect("an older data config still reads");
        assert_eq!(d.zipf_exponent, 1.0);
        let back: DataConfig = serde_json::from_str(&serde_json::to_string(&DataConfig { zipf_exponent: 3.0, ..d }).unwrap()).unwrap();
        assert_eq!(back.zipf_exponent, 3.0);
    }
}
