//! The full configuration of a recorded run, as stored in the manifest: model shape, recipe,
//! routing, data, training hyper-parameters, recording selection, injections.
//!
//! `fp8-capture` builds it from its flags; `fp8-analyze` reads it to decide whether two runs can be
//! compared and to re-run a capture with changed flags (`triage`).

use crate::names::{Gemm, Role, Site};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Model dimensions. Names follow llm.c: V vocabulary, C channels, F feed-forward width, NH heads,
/// L layers, B sequences per step, T tokens per sequence. The Llama family adds KV heads (grouped-
/// query attention), the rotary base and the RMSNorm epsilon; runs recorded before the family
/// existed have none of these fields and read as `gpt`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelDims {
    /// The architecture; absent in runs recorded before it was a choice (`gpt`).
    #[serde(default)]
    pub arch: Arch,
    pub vocab: u32,
    pub channels: u32,
    pub ffn: u32,
    pub heads: u32,
    pub layers: u32,
    pub batch: u32,
    pub seq: u32,
    /// `causal` (each token attends to itself and earlier ones) or `full`.
    pub attn_mask: AttnMask,
    /// Key/value heads of grouped-query attention (Llama); absent: one per query head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_heads: Option<u32>,
    /// Base θ of the rotary position embeddings (Llama).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// Epsilon of the RMSNorm (Llama).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm_eps: Option<f64>,
    /// The lm_head shares the token embedding's weights.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tie_embeddings: bool,
}

impl ModelDims {
    pub fn tokens_per_step(&self) -> u64 {
        self.batch as u64 * self.seq as u64
    }
    /// Key/value heads (equal to `heads` unless grouped-query attention is on).
    pub fn kv_heads(&self) -> u32 {
        self.kv_heads.unwrap_or(self.heads)
    }
    /// Width of one attention head, C / NH.
    pub fn head_dim(&self) -> u32 {
        self.channels / self.heads.max(1)
    }
    /// The (in, out) features of a site's linear layer: qkv C → C + 2·KVH·HD, proj C → C,
    /// fc1 C → F (GELU) or C → 2F (SwiGLU's gate and up projections in one GEMM), fc2 F → C.
    pub fn site_features(&self, module: crate::names::Module) -> (usize, usize) {
        use crate::names::Module;
        let (c, f) = (self.channels as usize, self.ffn as usize);
        let kv = (self.kv_heads() * self.head_dim()) as usize;
        match module {
            Module::Qkv => (c, c + 2 * kv),
            Module::Proj => (c, c),
            Module::Fc1 => (c, if self.arch == Arch::Llama { 2 * f } else { f }),
            Module::Fc2 => (f, c),
        }
    }
}

/// The transformer family a run trains.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// GPT-2 style: pre-LN LayerNorm with bias, GELU MLP, multi-head attention, biases.
    #[default]
    Gpt,
    /// Llama style: RMSNorm, SwiGLU MLP, rotary embeddings, grouped-query attention, no biases.
    Llama,
}

impl Arch {
    pub fn as_str(self) -> &'static str {
        match self {
            Arch::Gpt => "gpt",
            Arch::Llama => "llama",
        }
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
    /// OCP MXFP8 as Transformer Engine's MXFP8BlockScaling: E4M3 elements in blocks of 32 along the
    /// reduction dimension with E8M0 power-of-two scales (`quant::operand_quant`).
    Mxfp8,
    /// Transformer Engine's NVFP4BlockScaling: E2M1 elements in blocks of 16 (16×16 for weights), E4M3
    /// block scales under an FP32 tensor scale, random Hadamard transform on the wgrad operands and
    /// stochastic rounding of gradients (`quant::operand_quant`).
    Nvfp4,
}

impl RecipeKind {
    pub const ALL: [RecipeKind; 6] = [RecipeKind::Bf16, RecipeKind::Delayed, RecipeKind::Current, RecipeKind::Block, RecipeKind::Mxfp8, RecipeKind::Nvfp4];
    pub fn as_str(self) -> &'static str {
        match self {
            RecipeKind::Bf16 => "bf16",
            RecipeKind::Delayed => "delayed",
            RecipeKind::Current => "current",
            RecipeKind::Block => "block",
            RecipeKind::Mxfp8 => "mxfp8",
            RecipeKind::Nvfp4 => "nvfp4",
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
    /// How FP8 GEMMs accumulate their products on the GPU (cuBLASLt's fast-accumulation mode):
    /// `split` promotes the tensor cores' partial sums to FP32 as it goes (the most exact);
    /// `fast_fprop` lets the forward GEMMs accumulate in the tensor cores' own reduced precision
    /// and keeps dgrad and wgrad split (Transformer Engine's, torchao's and XLA's default); `fast`
    /// does so for every GEMM. The CPU accumulates every product in FP32 whatever this says.
    /// Absent in older manifests, where it means `split` (what those runs did).
    #[serde(default)]
    pub accumulation: Accumulation,
    /// MXFP8's E8M0 scale rounding (`te`: up, Transformer Engine's; `ocp`: down, the OCP
    /// specification's). Absent in older manifests, where it means `te` (and was unused).
    #[serde(default)]
    pub mx_rounding: crate::quant::E8m0Rounding,
    /// NVFP4's switches, as Transformer Engine names them. Absent in older manifests: all off.
    #[serde(default)]
    pub nvfp4: crate::quant::Nvfp4Switches,
    /// A recipe per GEMM kind (`--recipe fprop=mxfp8,dgrad=delayed,wgrad=bf16`, as Transformer
    /// Engine's CustomRecipe allows); `kind` is then the first of them, in fprop, dgrad, wgrad
    /// order, that is not BF16 (BF16 if none). Absent: `kind` for every GEMM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_gemm: Option<PerGemmRecipe>,
    /// How the CPU accumulates FP8 GEMMs: `exact` (FP32, the default) or `hopper` (Hopper's
    /// tensor cores emulated, in the mode `accumulation` names for each GEMM kind). Absent in
    /// older manifests and when exact.
    #[serde(default, skip_serializing_if = "CpuAccumulator::is_exact")]
    pub cpu_accumulator: CpuAccumulator,
}

/// See [`RecipeConfig::cpu_accumulator`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CpuAccumulator {
    #[default]
    Exact,
    Hopper,
}

impl CpuAccumulator {
    pub fn as_str(self) -> &'static str {
        match self {
            CpuAccumulator::Exact => "exact",
            CpuAccumulator::Hopper => "hopper",
        }
    }
    pub fn is_exact(&self) -> bool {
        *self == CpuAccumulator::Exact
    }
}

/// The recipe of each GEMM kind: see [`RecipeConfig::per_gemm`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PerGemmRecipe {
    pub fprop: RecipeKind,
    pub dgrad: RecipeKind,
    pub wgrad: RecipeKind,
}

impl PerGemmRecipe {
    /// The recipe of `gemm`.
    pub fn of(&self, gemm: Gemm) -> RecipeKind {
        match gemm {
            Gemm::Fprop => self.fprop,
            Gemm::Dgrad => self.dgrad,
            Gemm::Wgrad => self.wgrad,
        }
    }

    /// The run's headline recipe: the first that is not BF16, in fprop, dgrad, wgrad order.
    pub fn headline(&self) -> RecipeKind {
        [self.fprop, self.dgrad, self.wgrad].into_iter().find(|&k| k != RecipeKind::Bf16).unwrap_or(RecipeKind::Bf16)
    }
}

impl RecipeConfig {
    /// The recipe `gemm` runs under.
    pub fn kind_for(&self, gemm: Gemm) -> RecipeKind {
        self.per_gemm.map_or(self.kind, |p| p.of(gemm))
    }

    /// Every recipe some GEMM runs under.
    pub fn kinds(&self) -> Vec<RecipeKind> {
        let mut v: Vec<RecipeKind> = Gemm::ALL.iter().map(|&g| self.kind_for(g)).collect();
        v.dedup();
        v.sort_by_key(|k| k.as_str());
        v.dedup();
        v
    }

    /// The recipe as the command line names it: `delayed`, or `fprop=mxfp8,dgrad=delayed,wgrad=bf16`.
    pub fn label(&self) -> String {
        match self.per_gemm {
            None => self.kind.as_str().to_string(),
            Some(p) => format!("fprop={},dgrad={},wgrad={}", p.fprop.as_str(), p.dgrad.as_str(), p.wgrad.as_str()),
        }
    }
}

/// See [`RecipeConfig::accumulation`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Accumulation {
    #[default]
    Split,
    FastFprop,
    Fast,
}

impl Accumulation {
    pub const ALL: [Accumulation; 3] = [Accumulation::Split, Accumulation::FastFprop, Accumulation::Fast];
    /// The name in manifests and on the command line (`fast_fprop` is spelled `fast-fprop` there).
    pub fn as_str(self) -> &'static str {
        match self {
            Accumulation::Split => "split",
            Accumulation::FastFprop => "fast_fprop",
            Accumulation::Fast => "fast",
        }
    }
    /// Whether an FP8 `gemm` accumulates in the tensor cores' reduced precision.
    pub fn is_fast(self, gemm: Gemm) -> bool {
        match self {
            Accumulation::Split => false,
            Accumulation::FastFprop => gemm == Gemm::Fprop,
            Accumulation::Fast => true,
        }
    }
}

/// See [`RecipeConfig::overflow`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Overflow {
    #[default]
    Saturate,
    Nan,
}

fn is_zero(x: &u32) -> bool {
    *x == 0
}

/// Which GEMMs are sent back to BF16 while the recipe is FP8.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutingConfig {
    /// GEMM kinds in BF16 everywhere: any of `fprop`, `dgrad`, `wgrad`.
    pub bf16_gemms: Vec<Gemm>,
    /// Layers whose GEMMs all run in BF16.
    pub bf16_layers: Vec<u32>,
    /// Single sites or GEMMs: `layers.7.fc2` (all three GEMMs) or `layers.7.fc2:dgrad`.
    pub bf16_sites: Vec<SiteSelector>,
    /// Only these sites or GEMMs run in FP8; every other GEMM runs in BF16 (empty: no such
    /// restriction). The complement of `bf16_sites`: a suspect kept alone in FP8 shows whether it
    /// suffices to make the anomaly. Absent in older runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fp8_sites: Vec<SiteSelector>,
    /// A precision-switch schedule: the routing holds from this step on (absent: from the first);
    /// before it, those GEMMs run in FP8. Absent in older runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_step: Option<u32>,
    /// The routing holds before this step (absent: to the end); from it on, FP8 again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_step: Option<u32>,
}

impl RoutingConfig {
    /// Whether this routing sends `gemm` of `site` to BF16 at some step.
    pub fn sends_to_bf16(&self, site: Site, gemm: Gemm) -> bool {
        let selects = |s: &SiteSelector| s.site == site && s.gemm.is_none_or(|g| g == gemm);
        self.bf16_gemms.contains(&gemm)
            || self.bf16_layers.contains(&site.layer)
            || self.bf16_sites.iter().any(selects)
            || (!self.fp8_sites.is_empty() && !self.fp8_sites.iter().any(selects))
    }

    /// Whether the schedule holds at `step` (`from_step` ≤ step < `until_step`).
    pub fn active_at(&self, step: u32) -> bool {
        self.from_step.is_none_or(|f| step >= f) && self.until_step.is_none_or(|u| step < u)
    }

    /// Whether this routing sends `gemm` of `site` to BF16 at `step`.
    pub fn sends_to_bf16_at(&self, site: Site, gemm: Gemm, step: u32) -> bool {
        self.active_at(step) && self.sends_to_bf16(site, gemm)
    }

    /// Whether anything is routed at all.
    pub fn is_empty(&self) -> bool {
        self.bf16_gemms.is_empty() && self.bf16_layers.is_empty() && self.bf16_sites.is_empty() && self.fp8_sites.is_empty()
    }
}

/// A site, or one GEMM of it: `layers.7.fc2` or `layers.7.fc2:dgrad`. Stored as that string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SiteSelector {
    pub site: Site,
    pub gemm: Option<Gemm>,
}

impl SiteSelector {
    /// Parses `layers.7.fc2` or `layers.7.fc2:dgrad`.
    pub fn parse(s: &str) -> Option<SiteSelector> {
        let (site, gemm) = match s.trim().split_once(':') {
            Some((a, g)) => (a, Some(Gemm::parse(g)?)),
            None => (s.trim(), None),
        };
        Some(SiteSelector { site: Site::parse(site)?, gemm })
    }
}

impl std::fmt::Display for SiteSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.gemm {
            Some(g) => write!(f, "{}:{}", self.site, g),
            None => write!(f, "{}", self.site),
        }
    }
}

impl Serialize for SiteSelector {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SiteSelector {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        SiteSelector::parse(&s).ok_or_else(|| serde::de::Error::custom(format!("'{s}' is not layers.N.MODULE[:GEMM]")))
    }
}

/// A site stored as its name (`layers.1.fc2`).
mod site_as_str {
    use crate::names::Site;
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(site: &Site, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(site)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Site, D::Error> {
        let s = String::deserialize(d)?;
        Site::parse(&s).ok_or_else(|| serde::de::Error::custom(format!("'{s}' is not a site like layers.1.fc2")))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataKind {
    /// A seeded first-order Markov language whose entropy floor is known exactly.
    Synthetic,
    /// Uniformly random tokens (the loss cannot fall below ln V).
    Uniform,
    /// Text files, tokenized by a Hugging Face tokenizer or read as bytes (V ≥ 256).
    Text,
    /// Data fp8scope does not know: a run recorded by another framework (PyTorch recorder) or
    /// imported from its logs (Transformer Engine's debug statistics).
    External,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DataConfig {
    pub kind: DataKind,
    /// The text file for `text` data (the first of `paths`; kept for readers of older runs).
    pub path: Option<String>,
    /// Every text file of `text` data, in the order they are concatenated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// The Hugging Face `tokenizer.json` that turns text into tokens; absent: bytes are tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<String>,
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

/// [`RecordConfig::channel_stats_every`] of a manifest written before the field existed.
fn every_recorded_step() -> u32 {
    1
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
    /// `--resume RUN --at-step S`: the run began from RUN's checkpoint of step S (its weights,
    /// AdamW moments and amax histories) and trained steps S+1 on. Absent otherwise and in older runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_from: Option<ResumeFrom>,
}

/// See [`TrainConfig::resume_from`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResumeFrom {
    /// The run directory the checkpoint came from, as given.
    pub run: String,
    pub step: u32,
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
    /// The per-channel statistics (amax_channel, top_channel_sq_frac) every this many recorded
    /// steps and at step 1 (0: never on their own), and wherever the quantization error is taken;
    /// null otherwise. Runs recorded before the field existed took them at every recorded step (1).
    #[serde(default = "every_recorded_step")]
    pub channel_stats_every: u32,
    /// Tensor dumps every this many steps (0: never). Step 1 is always a dump step when > 0.
    pub dump_every: u32,
    /// Regex over site names (`layers.1.fc2`) selecting the dumped sites.
    pub dump_layers: String,
    /// Roles dumped.
    pub dump_roles: Vec<Role>,
    /// At most this many elements per dumped tensor.
    pub dump_max_elems: u32,
    pub dump_sample: DumpSample,
    /// At dump steps, also run every FP8 GEMM in BF16 on the same inputs and record the error.
    pub shadow: bool,
    /// `--flight-recorder K`: every step dumps and shadows, kept for the last K steps and written
    /// only when a non-finite value, a saturation burst or a loss spike fires (0: off; absent in
    /// older runs).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub flight_recorder: u32,
    /// Close a Parquet part at least every this many steps.
    pub flush_every: u32,
    /// `--checkpoint-every N`: the weights, AdamW moments and amax histories written to
    /// `checkpoints/step-SSSSSSSS.ckpt` every N steps, for `--resume` (0: never; absent when 0 and
    /// in older runs).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub checkpoint_every: u32,
    /// `--checkpoint-at S,...`: checkpoints at these steps too (absent when none and in older runs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checkpoint_at: Vec<u32>,
}

impl RecordConfig {
    /// Whether a checkpoint is written after `step`.
    pub fn checkpoints_at(&self, step: u32) -> bool {
        (self.checkpoint_every > 0 && step.is_multiple_of(self.checkpoint_every)) || self.checkpoint_at.contains(&step)
    }
}

/// What a planted defect does (see [`Injection`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InjectionKind {
    /// The cast's scale × 2^magnitude: values saturate.
    Overflow,
    /// The cast's scale × 2^−magnitude: values flush to zero.
    Underflow,
    /// A few elements of the operand × magnitude before the cast.
    Outlier,
    /// One NaN in the GEMM's output, at that step only.
    Nan,
    /// The site's weight parked at its FP8 grid's rounding boundaries before each step's casts, on
    /// alternate sides (TetraJet-v2's oscillation, planted; fprop, delayed scaling): its forward
    /// weight flips a bin every step while the master barely moves. Magnitude: the offset past the
    /// boundary, as a fraction of the bin.
    Oscillation,
}

impl InjectionKind {
    pub const ALL: [InjectionKind; 5] =
        [InjectionKind::Overflow, InjectionKind::Underflow, InjectionKind::Outlier, InjectionKind::Nan, InjectionKind::Oscillation];
    pub fn as_str(self) -> &'static str {
        match self {
            InjectionKind::Overflow => "overflow",
            InjectionKind::Underflow => "underflow",
            InjectionKind::Outlier => "outlier",
            InjectionKind::Nan => "nan",
            InjectionKind::Oscillation => "oscillation",
        }
    }
    pub fn parse(s: &str) -> Option<InjectionKind> {
        InjectionKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
    /// The magnitude used when the spec gives none (documented in the README).
    pub fn default_magnitude(self) -> f64 {
        match self {
            InjectionKind::Overflow => 8.0,
            InjectionKind::Underflow => 16.0,
            InjectionKind::Outlier => 1e4,
            InjectionKind::Nan => 0.0,
            InjectionKind::Oscillation => 1.0 / 64.0,
        }
    }
}

impl std::fmt::Display for InjectionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A defect planted in the FP8 path of one GEMM (see `fp8-capture --inject`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Injection {
    /// `layers.1.fc2`
    #[serde(with = "site_as_str")]
    pub site: Site,
    pub gemm: Gemm,
    pub kind: InjectionKind,
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
    /// The Hugging Face `config.json` the model's shape was read from (`--model-config`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_config: Option<String>,
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

    #[test]
    fn a_record_config_written_before_the_channel_cadence_took_channels_every_recorded_step() {
        let old = r#"{"stats_every":1,"quant_error_every":10,"dump_every":0,"dump_layers":".*","dump_roles":[],"dump_max_elems":4096,"dump_sample":"first","shadow":false,"flush_every":25}"#;
        let r: RecordConfig = serde_json::from_str(old).expect("an older record config still reads");
        assert_eq!(r.channel_stats_every, 1);
        let back: RecordConfig = serde_json::from_str(&serde_json::to_string(&RecordConfig { channel_stats_every: 10, ..r }).unwrap()).unwrap();
        assert_eq!(back.channel_stats_every, 10);
    }

    #[test]
    fn routing_injections_and_dump_roles_keep_their_strings_as_enums() {
        let json = r#"{"bf16_gemms":["dgrad"],"bf16_layers":[1],"bf16_sites":["layers.3.fc2","layers.0.qkv:wgrad"]}"#;
        // A run recorded before schedules existed routes at every step.
        let r0: RoutingConfig = serde_json::from_str(json).unwrap();
        assert_eq!((r0.from_step, r0.until_step), (None, None));
        assert!(r0.active_at(0) && r0.active_at(1_000_000));
        let sched = RoutingConfig { from_step: Some(100), until_step: Some(200), ..r0.clone() };
        let site = Site::parse("layers.3.fc2").unwrap();
        assert!(!sched.sends_to_bf16_at(site, Gemm::Fprop, 99) && sched.sends_to_bf16_at(site, Gemm::Fprop, 100));
        assert!(sched.sends_to_bf16_at(site, Gemm::Fprop, 199) && !sched.sends_to_bf16_at(site, Gemm::Fprop, 200));
        let back: RoutingConfig = serde_json::from_str(&serde_json::to_string(&sched).unwrap()).unwrap();
        assert_eq!(back, sched);
        // Only the named GEMM stays FP8.
        let alone = RoutingConfig { fp8_sites: vec![SiteSelector::parse("layers.3.fc2:dgrad").unwrap()], ..RoutingConfig::default() };
        assert!(!alone.sends_to_bf16(site, Gemm::Dgrad) && alone.sends_to_bf16(site, Gemm::Fprop));
        assert!(alone.sends_to_bf16(Site::parse("layers.0.qkv").unwrap(), Gemm::Dgrad) && !alone.is_empty());
        let r: RoutingConfig = serde_json::from_str(json).expect("routing of a recorded run reads");
        assert_eq!(r.bf16_gemms, vec![Gemm::Dgrad]);
        assert_eq!(r.bf16_sites[1], SiteSelector { site: Site::parse("layers.0.qkv").unwrap(), gemm: Some(Gemm::Wgrad) });
        assert_eq!(serde_json::to_string(&r).unwrap(), json, "the same strings are written back");
        let site = |s| Site::parse(s).unwrap();
        assert!(r.sends_to_bf16(site("layers.3.fc2"), Gemm::Fprop));
        assert!(r.sends_to_bf16(site("layers.0.qkv"), Gemm::Wgrad));
        assert!(!r.sends_to_bf16(site("layers.0.qkv"), Gemm::Fprop));
        assert!(r.sends_to_bf16(site("layers.2.proj"), Gemm::Dgrad));
        assert!(r.sends_to_bf16(site("layers.1.proj"), Gemm::Fprop));
        let bad = r#"{"bf16_gemms":[],"bf16_layers":[],"bf16_sites":["layers.3.fc9"]}"#;
        let e = serde_json::from_str::<RoutingConfig>(bad).unwrap_err().to_string();
        assert!(e.contains("layers.3.fc9"), "{e}");

        let inj = r#"{"site":"layers.1.fc2","gemm":"dgrad","kind":"overflow","step":100,"magnitude":8.0}"#;
        let i: Injection = serde_json::from_str(inj).expect("an injection of a recorded run reads");
        assert_eq!((i.kind, i.gemm, i.site), (InjectionKind::Overflow, Gemm::Dgrad, site("layers.1.fc2")));
        assert_eq!(serde_json::to_string(&i).unwrap(), inj);
        let roles: Vec<Role> = serde_json::from_str(r#"["activation","wgrad"]"#).unwrap();
        assert_eq!(roles, vec![Role::Activation, Role::Wgrad]);
    }

    #[test]
    fn a_per_gemm_recipe_names_each_kind_and_an_older_recipe_has_none() {
        let old = r#"{"kind":"delayed","format":"hybrid","amax_history":16,"amax_algo":"max","margin":0}"#;
        let r: RecipeConfig = serde_json::from_str(old).unwrap();
        assert_eq!((r.per_gemm, r.label(), r.kinds()), (None, "delayed".to_string(), vec![RecipeKind::Delayed]));
        assert!(!serde_json::to_string(&r).unwrap().contains("per_gemm"), "absent when not set");
        let p = PerGemmRecipe { fprop: RecipeKind::Bf16, dgrad: RecipeKind::Nvfp4, wgrad: RecipeKind::Delayed };
        assert_eq!(p.headline(), RecipeKind::Nvfp4);
        let mixed = RecipeConfig { kind: p.headline(), per_gemm: Some(p), ..r };
        assert_eq!(Gemm::ALL.map(|g| mixed.kind_for(g)), [RecipeKind::Bf16, RecipeKind::Nvfp4, RecipeKind::Delayed]);
        assert_eq!(mixed.label(), "fprop=bf16,dgrad=nvfp4,wgrad=delayed");
        assert_eq!(mixed.kinds(), vec![RecipeKind::Bf16, RecipeKind::Delayed, RecipeKind::Nvfp4]);
        let json = serde_json::to_string(&mixed).unwrap();
        assert!(json.contains(r#""per_gemm":{"fprop":"bf16","dgrad":"nvfp4","wgrad":"delayed"}"#), "{json}");
        assert_eq!(serde_json::from_str::<RecipeConfig>(&json).unwrap(), mixed);
        let all_bf16 = PerGemmRecipe { fprop: RecipeKind::Bf16, dgrad: RecipeKind::Bf16, wgrad: RecipeKind::Bf16 };
        assert_eq!(all_bf16.headline(), RecipeKind::Bf16);
    }

    #[test]
    fn a_recipe_recorded_before_the_accumulation_mode_reads_as_split() {
        let old = r#"{"kind":"delayed","format":"hybrid","amax_history":16,"amax_algo":"max","margin":0,"overflow":"saturate"}"#;
        let r: RecipeConfig = serde_json::from_str(old).expect("an older recipe still reads");
        assert_eq!(r.accumulation, Accumulation::Split);
        assert!(Gemm::ALL.iter().all(|&g| !r.accumulation.is_fast(g)));
        let te = RecipeConfig { accumulation: Accumulation::FastFprop, ..r };
        let json = serde_json::to_string(&te).unwrap();
        assert!(json.contains(r#""accumulation":"fast_fprop","#), "{json}");
        // The micro-scaled recipes' settings read as their defaults from an older recipe.
        assert_eq!((r.mx_rounding, r.nvfp4), (crate::quant::E8m0Rounding::Te, crate::quant::Nvfp4Switches::default()));
        assert!(
            json.ends_with(r#""mx_rounding":"te","nvfp4":{"disable_rht":false,"disable_stochastic_rounding":false,"disable_2d_quantization":false}}"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<RecipeConfig>(&json).unwrap(), te);
        let fast: Vec<Gemm> = Gemm::ALL.into_iter().filter(|&g| te.accumulation.is_fast(g)).collect();
        assert_eq!(fast, vec![Gemm::Fprop]);
        assert!(Gemm::ALL.iter().all(|&g| Accumulation::Fast.is_fast(g)));
        for a in Accumulation::ALL {
            assert_eq!(serde_json::to_string(&a).unwrap(), format!("\"{}\"", a.as_str()));
        }
    }

    #[test]
    fn model_dims_of_a_run_recorded_before_the_llama_family_read_as_gpt() {
        let old = r#"{"vocab":512,"channels":64,"ffn":256,"heads":4,"layers":2,"batch":8,"seq":64,"attn_mask":"causal"}"#;
        let m: ModelDims = serde_json::from_str(old).unwrap();
        assert_eq!((m.arch, m.kv_heads(), m.tie_embeddings), (Arch::Gpt, 4, false));
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"arch":"gpt","vocab":512,"channels":64,"ffn":256,"heads":4,"layers":2,"batch":8,"seq":64,"attn_mask":"causal"}"#
        );
        let llama = ModelDims { arch: Arch::Llama, kv_heads: Some(2), ..m };
        use crate::names::Module;
        assert_eq!(llama.site_features(Module::Qkv), (64, 64 + 2 * 2 * 16));
        assert_eq!(llama.site_features(Module::Fc1), (64, 512));
        assert_eq!(llama.site_features(Module::Fc2), (256, 64));
    }
}
