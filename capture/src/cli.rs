//! The flags of `fp8-capture`, each defined once with its help, and their validation into a
//! [`RunConfig`]. Nothing touches the disk until every flag has been checked.

use crate::config::{PRESETS, preset};
use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use fp8scope_schemas::config::*;
use fp8scope_schemas::names::{Gemm, Role, Site};
use fp8scope_schemas::quant::{E8m0Rounding, Nvfp4Switches};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "fp8-capture",
    version,
    about = "Train a transformer with FP8 GEMMs and record why it goes wrong.",
    long_about = "Trains a pre-LN transformer whose linear layers run FP8 GEMMs (exactly emulated on \
the CPU), and records the run as Parquet: the loss every step, FP8 statistics of every quantized \
tensor, sampled tensors with their raw FP8 bytes, and anomalies. Read the runs with fp8-analyze.",
    after_help = "Examples:\n  fp8-capture train --preset tiny --recipe bf16 --out runs/bf16\n  \
fp8-capture train --preset tiny --recipe delayed --out runs/fp8 --dump-every 50 --shadow\n  \
fp8-capture train --preset tiny --recipe delayed --bf16-gemms dgrad --out runs/no-dgrad\n  \
fp8-capture presets"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Train and record one run.
    #[command(after_help = "Examples:\n  \
fp8-capture train --preset tiny --recipe bf16 --out runs/bf16\n  \
fp8-capture train --preset tiny --recipe delayed --dump-every 50 --shadow --out runs/fp8\n  \
fp8-capture train --preset tiny --recipe delayed --bf16-gemms dgrad --out runs/fp8-no-dgrad\n  \
fp8-capture train --preset tiny --recipe delayed --inject site=layers.1.fc2,gemm=dgrad,kind=overflow,step=100 --out runs/planted\n  \
fp8-capture train --preset tiny --recipe delayed --device cpu --dp 4 --out runs/dp4   (4 ranks, each 1/4 of the batch)\n  \
fp8-capture train --preset tiny --recipe delayed --device cpu --dp 2 --inject kind=rank-dies,rank=1,step=50 --out runs/dies\n  \
fp8-capture train --preset llama-tiny --recipe delayed --device cpu --tp 2 --out runs/tp2   (2 ranks, each half of every layer)\n  \
fp8-capture train --preset tiny --recipe delayed --device cpu --dp 2 --tp 2 --inject kind=amax-dp-only,site=layers.0.fc2,step=20 --out runs/pr442\n  \
fp8-capture train --preset small --recipe delayed --device cuda --dp 2 --out runs/dp2-gpu   (2 ranks sharing GPU 0)\n\n\
The run directory holds run.json and Parquet tables (steps, stats, tensors, events, shadow); \
read it with fp8-analyze. Exit status: 0 completed, 3 diverged (non-finite loss), \
130 interrupted, 1 error, 2 bad flags.\n\n\
On the GPU, kept between runs: the compiled kernels in ~/.cache/fp8scope/kernels \
(FP8SCOPE_KERNEL_CACHE=DIR moves them, 0 turns the cache off) and the timed GEMM algorithms in \
~/.cache/fp8scope/gemm-algorithms.json (FP8SCOPE_GEMM_CACHE=FILE moves it; FP8SCOPE_GEMM_TUNE=0 takes \
cuBLASLt's first choice untimed); $XDG_CACHE_HOME replaces ~/.cache when set. FP8SCOPE_PROFILE=1 \
prints where a step's GPU and host time go (and launches the steps op by op). Each step's forward and \
backward is launched as CUDA graphs of the first step of its kind (the same launches, the same bits; \
FP8SCOPE_GRAPH=0 launches them op by op; with FP8SCOPE_VERBOSE=1 it says how many steps it graphed, \
and how long the host took between steps while the GPU waited).")]
    Train(Box<TrainArgs>),
    /// List the model presets.
    Presets,
    /// The quantization contract: every element and scale format with its constants (max finite,
    /// smallest normal and subnormal, mantissa bits, bias), the E8M0 roundings, and for each recipe
    /// the element format, block and scale of every GEMM operand.
    #[command(after_help = "Examples:\n  fp8-capture formats\n  fp8-capture formats --json > formats.json\n\n\
The JSON is what python/fp8scope/_formats.json holds (the Python package reads its constants from it).")]
    Formats {
        /// Print the contract as JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DeviceArg {
    /// CUDA when a GPU is found, else the CPU.
    Auto,
    Cpu,
    Cuda,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ArchArg {
    /// GPT-2 style: LayerNorm, GELU, biases.
    Gpt,
    /// Llama style: RMSNorm, SwiGLU, rotary embeddings, grouped-query attention, no biases.
    Llama,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RecipeArg {
    Bf16,
    Delayed,
    Current,
    Block,
    Mxfp8,
    Nvfp4,
}

impl RecipeArg {
    /// Whether only the CPU backend implements the recipe.
    pub fn cpu_only(self) -> bool {
        matches!(self, RecipeArg::Block | RecipeArg::Mxfp8 | RecipeArg::Nvfp4)
    }

    pub fn kind(self) -> RecipeKind {
        match self {
            RecipeArg::Bf16 => RecipeKind::Bf16,
            RecipeArg::Delayed => RecipeKind::Delayed,
            RecipeArg::Current => RecipeKind::Current,
            RecipeArg::Block => RecipeKind::Block,
            RecipeArg::Mxfp8 => RecipeKind::Mxfp8,
            RecipeArg::Nvfp4 => RecipeKind::Nvfp4,
        }
    }
}

/// `--recipe`: one recipe for every GEMM, or one per GEMM kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecipeSpec {
    One(RecipeArg),
    /// fprop, dgrad, wgrad.
    PerGemm([RecipeArg; 3]),
}

impl RecipeSpec {
    /// Whether only the CPU backend implements it: the block recipes, and every per-GEMM recipe.
    pub fn cpu_only(self) -> bool {
        match self {
            RecipeSpec::One(r) => r.cpu_only(),
            RecipeSpec::PerGemm(_) => true,
        }
    }

    /// Every recipe it uses.
    pub fn args(self) -> Vec<RecipeArg> {
        match self {
            RecipeSpec::One(r) => vec![r],
            RecipeSpec::PerGemm(k) => k.to_vec(),
        }
    }
}

/// `delayed`, or `fprop=mxfp8,dgrad=delayed,wgrad=bf16` (each GEMM kind named once).
fn parse_recipe(s: &str) -> Result<RecipeSpec, String> {
    let one = |v: &str| RecipeArg::from_str(v.trim(), true).map_err(|_| format!("unknown recipe '{}' (bf16, delayed, current, block, mxfp8, nvfp4)", v.trim()));
    if !s.contains('=') {
        return one(s).map(RecipeSpec::One);
    }
    let mut kinds: [Option<RecipeArg>; 3] = [None; 3];
    for part in s.split(',') {
        let (gemm, recipe) = part.split_once('=').ok_or_else(|| format!("'{part}': write GEMM=RECIPE, e.g. fprop=mxfp8,dgrad=delayed,wgrad=bf16"))?;
        let i = match gemm.trim() {
            "fprop" => 0,
            "dgrad" => 1,
            "wgrad" => 2,
            other => return Err(format!("'{other}' is not a GEMM kind (fprop, dgrad, wgrad)")),
        };
        if kinds[i].replace(one(recipe)?).is_some() {
            return Err(format!("{} is named twice", gemm.trim()));
        }
    }
    match kinds {
        [Some(f), Some(d), Some(w)] => Ok(RecipeSpec::PerGemm([f, d, w])),
        _ => Err("a per-GEMM recipe names fprop, dgrad and wgrad, each once (e.g. fprop=mxfp8,dgrad=delayed,wgrad=bf16)".into()),
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum MxRoundingArg {
    /// Transformer Engine's: the exponent of amax/max rounded up; no element clips.
    Te,
    /// The OCP MX specification's: floor(log2 amax) - emax of the element format; the block's
    /// largest elements may clip to max.
    Ocp,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum FormatArg {
    /// E4M3 for activations and weights, E5M2 for gradients.
    Hybrid,
    /// E4M3 everywhere.
    E4m3,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum AmaxAlgoArg {
    Max,
    MostRecent,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum OverflowArg {
    /// Clip to ±max, as cvt.rn.satfinite and Transformer Engine do.
    Saturate,
    /// A plain cast, like PyTorch's tensor.to(torch.float8_e4m3fn): NaN in E4M3, ±Inf in E5M2.
    Nan,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum AccumulationArg {
    /// Every FP8 GEMM promotes its partial sums to FP32 as it goes (cuBLASLt's default; the most exact).
    Split,
    /// Forward GEMMs accumulate in the tensor cores' reduced precision (faster), dgrad and wgrad
    /// split: Transformer Engine's, torchao's and XLA's default.
    FastFprop,
    /// Every FP8 GEMM accumulates in the tensor cores' reduced precision.
    Fast,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum CpuAccumulatorArg {
    /// Every product summed in FP32 (the reference the GPU's casts and layers are checked against).
    Exact,
    /// Hopper's FP8 tensor cores and cuBLASLt's promotion, emulated (`capture/src/accumulator.rs`).
    Hopper,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DataArg {
    /// Seeded Markov language with a known entropy floor.
    Synthetic,
    /// Uniformly random tokens: the loss cannot fall below ln V.
    Uniform,
    /// Text files (--text), tokenized by --tokenizer or read as bytes (V ≥ 256).
    Text,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum MaskArg {
    Causal,
    Full,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum SampleArg {
    /// Leading rows, like t[:32].
    First,
    /// Evenly spaced elements over the whole tensor.
    Strided,
}

fn parse_gemm(s: &str) -> Result<Gemm, String> {
    Gemm::parse(s.trim()).ok_or_else(|| format!("'{s}' is not fprop, dgrad or wgrad"))
}

fn parse_role(s: &str) -> Result<Role, String> {
    Role::parse(s.trim()).ok_or_else(|| format!("'{s}' is not a role (activation, weight, gradient, output, dgrad, wgrad)"))
}

fn parse_site_selector(s: &str) -> Result<SiteSelector, String> {
    SiteSelector::parse(s).ok_or_else(|| format!("'{s}' is not layers.N.MODULE[:GEMM] (modules qkv, proj, fc1, fc2)"))
}

fn positive(s: &str) -> Result<u32, String> {
    match s.parse::<i64>() {
        Ok(v) if v > 0 && v <= u32::MAX as i64 => Ok(v as u32),
        Ok(v) => Err(format!("{v} is not a positive whole number")),
        Err(_) => Err(format!("'{s}' is not a positive whole number")),
    }
}

fn non_negative(s: &str) -> Result<u32, String> {
    match s.parse::<i64>() {
        Ok(v) if v >= 0 && v <= u32::MAX as i64 => Ok(v as u32),
        _ => Err(format!("'{s}' is not a whole number ≥ 0")),
    }
}

fn positive_f64(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("'{s}' is not a positive number")),
    }
}

fn non_negative_f64(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v >= 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("'{s}' is not a number ≥ 0")),
    }
}

#[derive(Args, Debug)]
pub struct TrainArgs {
    /// Directory of the new run. Must not exist or be empty [default: runs/<name>].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Run name [default: <preset>-<recipe>-s<seed>].
    #[arg(long)]
    pub name: Option<String>,
    /// Where to train.
    #[arg(long, value_enum, default_value = "auto")]
    pub device: DeviceArg,
    /// With --device cuda: the GPU to train on, as the driver numbers the visible ones
    /// (CUDA_VISIBLE_DEVICES applies first). The ranks of --dp / --tp all share it.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub gpu: u32,
    /// CPU threads (default: all cores).
    #[arg(long, value_parser = positive)]
    pub threads: Option<u32>,
    /// No progress bar and no log lines.
    #[arg(long, short)]
    pub quiet: bool,

    // ---- model
    /// Model size preset: tiny (CPU demo), small, seed (the reference repro), llama-tiny,
    /// llama-small, llama-1b. See `presets`.
    #[arg(long, default_value = "tiny", help_heading = "Model")]
    pub preset: String,
    /// Architecture: gpt (LayerNorm, GELU, biases) or llama (RMSNorm, SwiGLU, rotary embeddings,
    /// grouped-query attention, no biases) [default: the preset's].
    #[arg(long, value_enum, help_heading = "Model")]
    pub arch: Option<ArchArg>,
    /// Train the shape of a Hugging Face Llama-family config.json (hidden_size, intermediate_size,
    /// num_hidden_layers, num_attention_heads, num_key_value_heads, vocab_size, rope_theta,
    /// rms_norm_eps, tie_word_embeddings, max_position_embeddings). Sets --arch llama; --batch and
    /// --seq still come from the preset or their flags; other dimension flags are refused with it.
    #[arg(long, value_name = "PATH", help_heading = "Model")]
    pub model_config: Option<PathBuf>,
    /// Vocabulary size V.
    #[arg(long, value_parser = positive, help_heading = "Model")]
    pub vocab: Option<u32>,
    /// Channels C.
    #[arg(long, value_parser = positive, help_heading = "Model")]
    pub channels: Option<u32>,
    /// Feed-forward width F.
    #[arg(long, value_parser = positive, help_heading = "Model")]
    pub ffn: Option<u32>,
    /// Attention heads NH (must divide C).
    #[arg(long, value_parser = positive, help_heading = "Model")]
    pub heads: Option<u32>,
    /// Key/value heads of grouped-query attention (llama; must divide NH) [default: the preset's,
    /// or NH].
    #[arg(long, value_parser = positive, help_heading = "Model")]
    pub kv_heads: Option<u32>,
    /// Base θ of the rotary position embeddings (llama) [default: 10000].
    #[arg(long, value_parser = positive_f64, help_heading = "Model")]
    pub rope_theta: Option<f64>,
    /// Transformer layers L.
    #[arg(long, value_parser = positive, help_heading = "Model")]
    pub layers: Option<u32>,
    /// Sequences per step B.
    #[arg(long, value_parser = positive, help_heading = "Model")]
    pub batch: Option<u32>,
    /// Tokens per sequence T.
    #[arg(long, value_parser = positive, help_heading = "Model")]
    pub seq: Option<u32>,
    /// Attention mask.
    #[arg(long, value_enum, default_value = "causal", help_heading = "Model")]
    pub attn_mask: MaskArg,

    // ---- recipe
    /// Scaling recipe: bf16 (no FP8, the baseline), delayed (TE DelayedScaling), current, block
    /// (DeepSeek-V3 1×128 / 128×128 tiles, E4M3), mxfp8 (E4M3 in blocks of 32 with E8M0 scales),
    /// nvfp4 (E2M1 in blocks of 16, 16×16 for weights, E4M3 block scales under an FP32 tensor
    /// scale; RHT on wgrad operands, stochastic rounding of gradients). `fp8-capture formats` lists
    /// what each operand gets. block, mxfp8 and nvfp4 run on the CPU only. Or one recipe per GEMM
    /// kind, as Transformer Engine's CustomRecipe allows: `fprop=mxfp8,dgrad=delayed,wgrad=bf16`
    /// (each kind named once; on the CPU only).
    #[arg(long, default_value = "delayed", value_parser = parse_recipe, help_heading = "FP8 recipe")]
    pub recipe: RecipeSpec,
    /// FP8 formats per role.
    /// [default: hybrid (e4m3 for mxfp8, as Transformer Engine), or the scenario's]
    #[arg(long, value_enum, help_heading = "FP8 recipe")]
    pub format: Option<FormatArg>,
    /// Delayed scaling: steps of amax history [default: 1024, or the scenario's].
    #[arg(long, value_parser = positive, help_heading = "FP8 recipe")]
    pub amax_history: Option<u32>,
    /// Delayed scaling: how the history is reduced [default: max, or the scenario's].
    #[arg(long, value_enum, help_heading = "FP8 recipe")]
    pub amax_algo: Option<AmaxAlgoArg>,
    /// scale = (fp8_max / amax) / 2^margin [default: 0, or the scenario's].
    #[arg(long, allow_negative_numbers = true, help_heading = "FP8 recipe")]
    pub margin: Option<i32>,
    /// What a value past the FP8 range becomes [default: saturate, or the scenario's].
    #[arg(long, value_enum, help_heading = "FP8 recipe")]
    pub overflow: Option<OverflowArg>,
    /// How FP8 GEMMs accumulate on the GPU (cuBLASLt's fast-accumulation mode). The CPU
    /// accumulates in FP32 unless --cpu-accumulator hopper; the manifest records what was asked.
    #[arg(long, value_enum, default_value = "fast-fprop", help_heading = "FP8 recipe")]
    pub accumulation: AccumulationArg,
    /// How the CPU accumulates per-tensor FP8 GEMMs: `exact` (FP32) or `hopper` (Hopper's tensor
    /// cores emulated bit for bit as MMA-Sim models them: 32 products a step truncated to 13
    /// fraction bits, promoted to FP32 every 128 in split mode, never in fast mode, each GEMM kind
    /// in the mode --accumulation gives it). CPU only; slower (an integer sum per product).
    #[arg(long, value_enum, default_value = "exact", help_heading = "FP8 recipe")]
    pub cpu_accumulator: CpuAccumulatorArg,
    /// mxfp8: how a block's E8M0 scale is rounded from its amax.
    #[arg(long, value_enum, default_value = "te", help_heading = "FP8 recipe")]
    pub mx_rounding: MxRoundingArg,
    /// nvfp4: no random Hadamard transform on the wgrad operands (TE's disable_rht).
    #[arg(long, help_heading = "FP8 recipe")]
    pub nvfp4_disable_rht: bool,
    /// nvfp4: gradients rounded to nearest, not stochastically (TE's disable_stochastic_rounding).
    #[arg(long, help_heading = "FP8 recipe")]
    pub nvfp4_disable_stochastic_rounding: bool,
    /// nvfp4: weights in 1×16 blocks, not 16×16 (TE's disable_2d_quantization).
    #[arg(long, help_heading = "FP8 recipe")]
    pub nvfp4_disable_2d_quantization: bool,

    // ---- routing
    /// GEMM kinds sent back to BF16 everywhere: fprop,dgrad,wgrad.
    #[arg(long, value_delimiter = ',', value_parser = parse_gemm, help_heading = "GEMM routing")]
    pub bf16_gemms: Vec<Gemm>,
    /// Layers whose GEMMs run in BF16: 0,3-5.
    #[arg(long, value_delimiter = ',', help_heading = "GEMM routing")]
    pub bf16_layers: Vec<String>,
    /// Sites or single GEMMs in BF16: layers.7.fc2 or layers.7.fc2:dgrad (comma-separated).
    #[arg(long, value_delimiter = ',', value_parser = parse_site_selector, help_heading = "GEMM routing")]
    pub bf16_sites: Vec<SiteSelector>,
    /// Only these sites or single GEMMs run in FP8, every other GEMM in BF16: layers.7.fc2 or
    /// layers.7.fc2:dgrad (comma-separated). Shows whether a suspect alone makes the anomaly.
    #[arg(long, value_delimiter = ',', value_parser = parse_site_selector, help_heading = "GEMM routing")]
    pub fp8_sites: Vec<SiteSelector>,
    /// A precision-switch schedule: the BF16 routing above holds from this step on; before it,
    /// those GEMMs run in FP8 (e.g. --bf16-gemms fprop --from-step 800: the forward GEMMs in BF16
    /// for the last part of the run, as before a learning-rate decay).
    #[arg(long, value_name = "STEP", help_heading = "GEMM routing")]
    pub from_step: Option<u32>,
    /// The BF16 routing holds before this step; from it on, FP8 again.
    #[arg(long, value_name = "STEP", help_heading = "GEMM routing")]
    pub until_step: Option<u32>,

    // ---- data and training
    /// Training data.
    #[arg(long, value_enum, default_value = "synthetic", help_heading = "Data and training")]
    pub data: DataArg,
    /// Text files for --data text, concatenated in the order given (repeat the flag or separate
    /// with commas).
    #[arg(long, alias = "data-path", value_name = "FILE", value_delimiter = ',', help_heading = "Data and training")]
    pub text: Vec<String>,
    /// A Hugging Face tokenizer.json for --data text; without it, bytes are tokens. V must cover
    /// the tokenizer's vocabulary.
    #[arg(long, value_name = "FILE", help_heading = "Data and training")]
    pub tokenizer: Option<String>,
    /// Successors per token of the synthetic language (its entropy grows with it).
    #[arg(long, default_value = "8", value_parser = positive, help_heading = "Data and training")]
    pub branching: u32,
    /// Topics of the synthetic language: a sequence opens with a topic marker and follows that
    /// topic's transitions (attention must look back at the marker).
    #[arg(long, default_value = "4", value_parser = positive, help_heading = "Data and training")]
    pub topics: u32,
    /// Steepness s of the synthetic language's rows, p_j ∝ 1/(j+1)^s: the higher, the more of each
    /// prediction the topic decides (0.24 nats at s = 1, 1.13 at s = 3) [default: 1, or the scenario's].
    #[arg(long, value_name = "S", value_parser = non_negative_f64, help_heading = "Data and training")]
    pub zipf_exponent: Option<f64>,
    /// Seed of the synthetic language's transition table.
    #[arg(long, default_value = "1234", help_heading = "Data and training")]
    pub language_seed: u64,
    /// Training steps.
    #[arg(long, default_value = "300", value_parser = positive, help_heading = "Data and training")]
    pub steps: u32,
    /// Peak learning rate [default: the preset's].
    #[arg(long, value_parser = positive_f64, help_heading = "Data and training")]
    pub lr: Option<f64>,
    /// Linear warm-up steps [default: steps/10].
    #[arg(long, value_parser = non_negative, help_heading = "Data and training")]
    pub warmup: Option<u32>,
    #[arg(long, default_value = "0.0", help_heading = "Data and training")]
    pub weight_decay: f64,
    #[arg(long, default_value = "0.9", help_heading = "Data and training")]
    pub beta1: f64,
    #[arg(long, default_value = "0.95", help_heading = "Data and training")]
    pub beta2: f64,
    #[arg(long, default_value = "1e-8", help_heading = "Data and training")]
    pub eps: f64,
    /// Global gradient-norm clip (0: off).
    #[arg(long, default_value = "1.0", help_heading = "Data and training")]
    pub grad_clip: f64,
    /// Seed of the weights and the batches.
    #[arg(long, default_value = "0", help_heading = "Data and training")]
    pub seed: u64,
    /// Multiply every initial weight by 1 ± 2⁻⁹ (half a BF16 ulp; the sign drawn from this seed).
    /// A BF16 GEMM rounds its inputs by that much at every step, so runs that differ only by the
    /// jitter are equivalent: how far they drift apart is the run-to-run spread (noise band)
    /// `fp8-analyze triage` and `anomalies` judge every gap against.
    #[arg(long, value_name = "SEED", help_heading = "Data and training")]
    pub init_jitter: Option<u64>,
    /// Start from the checkpoint RUN wrote at --at-step S (`--checkpoint-every`): its weights,
    /// AdamW moments and amax histories, then train steps S+1 to --steps. The model, data, seed and
    /// schedule must be RUN's; the recipe, routing and recording may differ, so that a precision
    /// switch from step S costs only the steps after it (e.g. `--resume fp8-run --at-step 400
    /// --bf16-gemms fprop`). One rank only. The new run's tables begin at step S+1.
    #[arg(long, value_name = "RUN", requires = "at_step", help_heading = "Data and training")]
    pub resume: Option<PathBuf>,
    /// The checkpoint step of --resume.
    #[arg(long, value_name = "S", requires = "resume", value_parser = positive, help_heading = "Data and training")]
    pub at_step: Option<u32>,

    // ---- recording
    /// Record FP8 statistics every N steps (0: never).
    #[arg(long, default_value = "1", value_parser = non_negative, help_heading = "Recording")]
    pub stats_every: u32,
    /// Compute quant_mse / quant_cos every N statistics steps (0: only at dump steps).
    #[arg(long, default_value = "10", value_parser = non_negative, help_heading = "Recording")]
    pub quant_error_every: u32,
    /// Compute the per-channel statistics (amax_channel, top_channel_sq_frac: where an outlier
    /// channel sits) every N statistics steps and at step 1 (0: never on their own); the quant_mse
    /// steps and dump steps always take them. They cost more than the other every-step columns:
    /// a larger N makes statistics every step cheaper, and leaves those two columns null on the
    /// steps between. Default: 1 on the CPU; 10 on the GPU, where every step would cost about 2% of
    /// the step more. Whatever N, a step whose loss spikes or is not finite gets every statistic:
    /// it is launched again with them before the optimizer runs (one rank; a `full_statistics`
    /// event says so).
    #[arg(long, value_parser = non_negative, help_heading = "Recording")]
    pub channel_stats_every: Option<u32>,
    /// Dump sampled tensors every N steps, and at step 1 (0: never).
    #[arg(long, default_value = "0", value_parser = non_negative, help_heading = "Recording")]
    pub dump_every: u32,
    /// Regex selecting the dumped sites by name (layers.1.fc2): a site is dumped when the regex
    /// matches anywhere in its name ('layers\.3\.' takes every site of layer 3; anchor with ^…$
    /// for an exact name). A regex that selects no site is refused.
    #[arg(long, default_value = ".*", help_heading = "Recording")]
    pub dump_layers: String,
    /// Roles dumped: activation,weight,gradient,output,dgrad,wgrad.
    #[arg(long, value_delimiter = ',', default_value = "activation,weight,gradient,output,dgrad,wgrad", value_parser = parse_role, help_heading = "Recording")]
    pub dump_roles: Vec<Role>,
    /// At most this many elements per dumped tensor.
    #[arg(long, default_value = "4096", value_parser = positive, help_heading = "Recording")]
    pub dump_max_elems: u32,
    /// Which elements a dump takes.
    #[arg(long, value_enum, default_value = "first", help_heading = "Recording")]
    pub dump_sample: SampleArg,
    /// At dump steps, also run each FP8 GEMM of the dumped sites in BF16 and record its error.
    #[arg(long, help_heading = "Recording")]
    pub shadow: bool,
    /// Dump the dumped sites (--dump-layers) with their shadow GEMMs at the step where something
    /// fires and the K steps after it: a non-finite value, a saturation burst (≥ 1% of an FP8
    /// cast) or a loss spike (the analyzer's rule, online). The firing step is launched again with
    /// the dumps before its optimizer runs, so training is unchanged and locate scores the GEMMs
    /// at the anomaly step itself. A clean run writes no dumps and costs one early look at each
    /// step's statistics. One rank only.
    #[arg(long, value_name = "K", default_value = "0", help_heading = "Recording")]
    pub flight_recorder: u32,
    /// Close a Parquet part of every table at least every N steps.
    #[arg(long, default_value = "25", value_parser = positive, help_heading = "Recording")]
    pub flush_every: u32,
    /// Write a checkpoint (weights, AdamW moments, amax histories: 12 bytes a parameter) to
    /// RUN/checkpoints/ every N steps, for --resume (0: never).
    #[arg(long, value_name = "N", default_value = "0", help_heading = "Recording")]
    pub checkpoint_every: u32,
    /// Write a checkpoint after each of these steps too (comma-separated), e.g. the steps a
    /// precision switch will resume from.
    #[arg(long, value_name = "S,...", value_delimiter = ',', value_parser = positive, help_heading = "Recording")]
    pub checkpoint_at: Vec<u32>,

    // ---- scenarios and faults
    /// A built-in failure scenario made by the data and the recipe, no planted defect: spike, drift
    /// or nan (see the README). It may set recipe defaults (amax history and algorithm, margin,
    /// format, overflow); flags given explicitly still win. Recorded in the manifest.
    #[arg(long, value_name = "NAME", help_heading = "Planted faults")]
    pub scenario: Option<String>,
    /// Plant the scenario's batch at this step instead of its own (spike: 250, drift: 25), e.g. to
    /// see how the spike grows as the model learns. Recorded in the manifest.
    #[arg(long, value_name = "STEP", value_parser = positive, help_heading = "Planted faults")]
    pub scenario_step: Option<u32>,
    /// Plant a defect: site=layers.1.fc2,gemm=dgrad,kind=overflow|underflow|outlier|nan,step=50[,magnitude=X];
    /// or site=S,kind=oscillation,step=N[,magnitude=F]: from step N, S's weight parked at its FP8
    /// grid's rounding boundaries before each step's casts, F (1/64) of the bin past them on
    /// alternate sides, so its forward weight flips every step (TetraJet-v2's oscillation; delayed).
    /// With --dp or --tp 2 or more, a fault of the ranks: kind=amax-local,site=S,step=N (from step
    /// N that site's amaxes are not reduced: each rank's own); kind=amax-dp-only,site=S,step=N
    /// (--tp 2 or more: from step N the amaxes of that site's tensor-parallel shards are reduced
    /// over dp only, each shard its own scale); kind=scale-corrupt,rank=R,site=S,step=N
    /// [,role=weight][,magnitude=16] (rank R's scale of that tensor × magnitude);
    /// kind=stale-weight,rank=R,site=S,step=N (N ≥ 2: from step N rank R's GEMMs use that weight,
    /// and its scale, as its forward had them at step N−1); kind=rank-dies,rank=R,step=N (rank R
    /// stops before step N without closing; the others end the run crashed). Repeatable.
    #[arg(long, value_name = "SPEC", help_heading = "Planted faults")]
    pub inject: Vec<String>,

    // ---- ranks
    /// Data-parallel ranks, as threads of this process: on the CPU, or with --device cuda all on
    /// GPU 0, each rank its own CUDA backend and stream (to test the ranks' GPU path on one GPU;
    /// their collectives go through the host). Each rank holds a replica of the model and trains on rows [r·B/N, (r+1)·B/N) of each global batch (--batch stays the global
    /// batch, so a run of N ranks and a run of one see the same data); the gradients are summed
    /// over the ranks in rank order. Each rank writes its own partition of every table
    /// (stats/rank=00001/…) and a liveness file (ranks/rank=00001.json). B must be a multiple of N.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = positive, help_heading = "Ranks")]
    pub dp: u32,
    /// Tensor-parallel ranks, as threads of this process (on the CPU, or sharing GPU 0 with
    /// --device cuda, as --dp does), in the Megatron layout: qkv
    /// and fc1 column-parallel (each rank its attention heads, key/value heads and MLP features;
    /// Llama's gate and up split alike), proj and fc2 row-parallel (their outputs all-reduced in
    /// the forward), the column-parallel GEMMs' input gradients all-reduced in the backward; norms,
    /// embedding and lm_head replicated. With --dp, a dp × tp mesh of dp·tp ranks (rank =
    /// d·tp + t). The heads, key/value heads and --ffn must divide by N.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = positive, help_heading = "Ranks")]
    pub tp: u32,
    /// The group delayed scaling's amaxes are reduced over before they enter the histories
    /// (Transformer Engine's amax_reduction_group): dp (the amax of the global batch's tensor, as
    /// one rank sees it), world (every rank), tp (the tensor-parallel group: without tensor
    /// parallelism, each rank's own) or none (each rank's own). The inputs a tensor-parallel GEMM
    /// sees whole on every rank are reduced over tp whatever the group (Transformer Engine requires
    /// it); a shard of a tensor keeps its own scale unless the group spans tp. Recorded in the
    /// manifest's parallel.amax_groups. [default: world with --tp 2 or more, else dp]
    #[arg(long, value_enum, value_name = "GROUP", help_heading = "Ranks")]
    pub amax_reduce: Option<crate::dist::AmaxReduce>,
}

/// Parses `0,3-5` into layer indices, each < `n_layers`.
pub fn parse_layers(items: &[String], n_layers: u32) -> anyhow::Result<Vec<u32>> {
    let mut out = Vec::new();
    for item in items.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        let (a, b) = match item.split_once('-') {
            Some((a, b)) => (a, b),
            None => (item, item),
        };
        let parse = |s: &str| s.trim().parse::<u32>().with_context(|| format!("--bf16-layers: '{item}' is not a layer or a range like 3-5"));
        let (a, b) = (parse(a)?, parse(b)?);
        if a > b || b >= n_layers {
            bail!("--bf16-layers: '{item}' is outside the model's layers 0-{}", n_layers - 1);
        }
        out.extend(a..=b);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Parses one `--inject` spec.
pub fn parse_injection(spec: &str, n_layers: u32) -> anyhow::Result<Injection> {
    let mut site = None;
    let mut gemm = None;
    let mut kind = None;
    let mut step = None;
    let mut magnitude = None;
    for kv in spec.split(',') {
        let (k, v) = kv.split_once('=').with_context(|| format!("--inject '{spec}': '{kv}' is not key=value"))?;
        match k.trim() {
            "site" => site = Some(v.trim().to_string()),
            "gemm" => gemm = Some(v.trim().to_string()),
            "kind" => kind = Some(v.trim().to_string()),
            "step" => step = Some(positive(v.trim()).map_err(|e| anyhow::anyhow!("--inject '{spec}': step {e}"))?),
            "magnitude" | "k" | "factor" => {
                magnitude = Some(v.trim().parse::<f64>().with_context(|| format!("--inject '{spec}': magnitude '{v}' is not a number"))?)
            }
            other => bail!("--inject '{spec}': unknown key '{other}' (site, gemm, kind, step, magnitude)"),
        }
    }
    let site = site.with_context(|| format!("--inject '{spec}': missing site=layers.N.MODULE"))?;
    let site = Site::parse(&site).with_context(|| format!("--inject '{spec}': '{site}' is not a site like layers.1.fc2"))?;
    if site.layer >= n_layers {
        bail!("--inject '{spec}': the model has layers 0-{}", n_layers - 1);
    }
    let kind = kind.with_context(|| format!("--inject '{spec}': missing kind=overflow|underflow|outlier|nan|oscillation"))?;
    let kind = InjectionKind::parse(&kind).with_context(|| format!("--inject '{spec}': kind must be overflow, underflow, outlier, nan or oscillation"))?;
    // An oscillation parks the weight its forward cast reads: gemm=fprop, or none.
    let gemm = match (gemm, kind) {
        (None, InjectionKind::Oscillation) => "fprop".to_string(),
        (g, _) => g.with_context(|| format!("--inject '{spec}': missing gemm=fprop|dgrad|wgrad"))?,
    };
    let gemm = Gemm::parse(&gemm).with_context(|| format!("--inject '{spec}': gemm must be fprop, dgrad or wgrad"))?;
    let magnitude = magnitude.unwrap_or(kind.default_magnitude());
    if kind == InjectionKind::Oscillation {
        if gemm != Gemm::Fprop {
            bail!("--inject '{spec}': kind=oscillation parks the site's weight, which its forward cast reads: gemm=fprop (or no gemm)");
        }
        if !(magnitude > 0.0 && magnitude < 0.5) {
            bail!("--inject '{spec}': kind=oscillation's magnitude is the offset past the rounding boundary, a fraction of the bin in (0, 0.5)");
        }
    }
    Ok(Injection { site, gemm, kind, step: step.unwrap_or(1), magnitude })
}

fn data_kind_is_synthetic(d: DataArg) -> bool {
    matches!(d, DataArg::Synthetic)
}

/// Validated configuration of a `train` call.
pub struct TrainPlan {
    pub config: RunConfig,
    /// How the job is split over ranks (one rank unless --dp).
    pub dist: crate::dist::DistPlan,
    pub out: PathBuf,
    pub name: String,
}

impl TrainArgs {
    /// Checks every flag and builds the run's configuration. Touches no file.
    pub fn validate(&self, device: &str) -> anyhow::Result<TrainPlan> {
        let p = preset(&self.preset)
            .with_context(|| format!("unknown preset '{}' (choose {})", self.preset, PRESETS.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")))?;
        let mut model = p.model();
        let (batch, seq) = (self.batch.unwrap_or(model.batch), self.seq.unwrap_or(model.seq));
        let mut notes = Vec::new();
        if let Some(path) = &self.model_config {
            let hf = crate::hf_config::read(path, batch, seq)?;
            notes = hf.notes;
            model = hf.model;
        }
        if let Some(a) = self.arch {
            let arch = match a {
                ArchArg::Gpt => Arch::Gpt,
                ArchArg::Llama => Arch::Llama,
            };
            if self.model_config.is_some() && arch != Arch::Llama {
                bail!("--model-config reads a Llama-family model; --arch {} contradicts it", arch.as_str());
            }
            if arch != model.arch {
                model.arch = arch;
                let llama = arch == Arch::Llama;
                model.rope_theta = llama.then_some(crate::config::LLAMA_ROPE_THETA);
                model.norm_eps = llama.then_some(crate::config::LLAMA_NORM_EPS);
                model.kv_heads = None;
            }
        }
        let o = |v: Option<u32>, d: u32| v.unwrap_or(d);
        model.vocab = o(self.vocab, model.vocab);
        model.channels = o(self.channels, model.channels);
        model.ffn = o(self.ffn, model.ffn);
        if let Some(h) = self.heads {
            model.heads = h;
            model.kv_heads = model.kv_heads.filter(|&kv| h % kv == 0);
        }
        model.layers = o(self.layers, model.layers);
        model.batch = batch;
        model.seq = seq;
        model.attn_mask = match self.attn_mask {
            MaskArg::Causal => AttnMask::Causal,
            MaskArg::Full => AttnMask::Full,
        };
        if model.channels % model.heads != 0 {
            bail!("--heads {} does not divide --channels {}", model.heads, model.channels);
        }
        if model.arch == Arch::Llama {
            if let Some(kv) = self.kv_heads {
                model.kv_heads = Some(kv);
            }
            if model.heads % model.kv_heads() != 0 {
                bail!("--kv-heads {} does not divide --heads {}", model.kv_heads(), model.heads);
            }
            if model.head_dim() % 2 != 0 {
                bail!("rotary embeddings need an even head width; C/NH = {}", model.head_dim());
            }
            if let Some(t) = self.rope_theta {
                model.rope_theta = Some(t);
            }
        } else if self.kv_heads.is_some() || self.rope_theta.is_some() {
            bail!("--kv-heads and --rope-theta belong to --arch llama; the {} preset is gpt", p.name);
        }
        if !self.quiet {
            for n in &notes {
                eprintln!("fp8-capture: note: {n}");
            }
        }
        let per_gemm = match self.recipe {
            RecipeSpec::One(_) => None,
            RecipeSpec::PerGemm([f, d, w]) => Some(PerGemmRecipe { fprop: f.kind(), dgrad: d.kind(), wgrad: w.kind() }),
        };
        let kind = match self.recipe {
            RecipeSpec::One(r) => r.kind(),
            RecipeSpec::PerGemm(_) => per_gemm.map_or(RecipeKind::Bf16, |p| p.headline()),
        };
        let kinds: Vec<RecipeKind> = self.recipe.args().into_iter().map(RecipeArg::kind).collect();
        let micro_kind = kinds.iter().copied().find(|k| matches!(k, RecipeKind::Mxfp8 | RecipeKind::Nvfp4));
        if matches!(self.cpu_accumulator, CpuAccumulatorArg::Hopper) && device != "cpu" {
            bail!(
                "--cpu-accumulator hopper emulates the GPU's accumulation on the CPU; with --device {device} the GPU accumulates itself (--accumulation sets how)"
            );
        }
        if !kinds.contains(&RecipeKind::Mxfp8) && !matches!(self.mx_rounding, MxRoundingArg::Te) {
            bail!("--mx-rounding belongs to --recipe mxfp8");
        }
        if !kinds.contains(&RecipeKind::Nvfp4) && (self.nvfp4_disable_rht || self.nvfp4_disable_stochastic_rounding || self.nvfp4_disable_2d_quantization) {
            bail!("--nvfp4-disable-* belong to --recipe nvfp4");
        }
        if let Some(m) = micro_kind
            && (!self.inject.is_empty() || matches!(self.overflow, Some(OverflowArg::Nan)))
        {
            bail!("--recipe {}: --inject and --overflow nan plant faults in per-tensor and block FP8 casts, not in {} casts yet", m.as_str(), m.as_str());
        }
        // FP8SCOPE_FP8_{FPROP,DGRAD,WGRAD}=0 is the environment spelling of --bf16-gemms.
        let mut bf16_gemms = self.bf16_gemms.clone();
        for g in Gemm::ALL {
            let var = format!("FP8SCOPE_FP8_{}", g.as_str().to_uppercase());
            if std::env::var(&var).is_ok_and(|v| v.trim() == "0") && !bf16_gemms.contains(&g) {
                bf16_gemms.push(g);
            }
        }
        for (flag, list) in [("--bf16-sites", &self.bf16_sites), ("--fp8-sites", &self.fp8_sites)] {
            for s in list {
                if s.site.layer >= model.layers {
                    bail!("{flag}: '{s}' names no GEMM of this model (layers 0-{})", model.layers - 1);
                }
            }
        }
        let routing = RoutingConfig {
            bf16_gemms,
            bf16_layers: parse_layers(&self.bf16_layers, model.layers)?,
            bf16_sites: self.bf16_sites.clone(),
            fp8_sites: self.fp8_sites.clone(),
            from_step: self.from_step,
            until_step: self.until_step,
        };
        if (routing.from_step.is_some() || routing.until_step.is_some()) && routing.is_empty() {
            bail!("--from-step / --until-step schedule a BF16 routing: give --bf16-gemms, --bf16-layers or --bf16-sites too");
        }
        if let (Some(f), Some(u)) = (routing.from_step, routing.until_step)
            && f >= u
        {
            bail!("--from-step {f} must come before --until-step {u}");
        }
        crate::selection::dumped_sites(&self.dump_layers, model.layers).map_err(|e| anyhow::anyhow!("--dump-layers: {e}"))?;
        let mut scen = match &self.scenario {
            Some(n) => Some(crate::scenario::scenario(n).with_context(|| format!("unknown scenario '{n}' (choose {})", crate::scenario::NAMES.join(", ")))?),
            None => None,
        };
        if let Some(step) = self.scenario_step {
            let Some(s) = scen.take() else { bail!("--scenario-step needs --scenario") };
            let name = s.name;
            scen = Some(s.planted_at(step).with_context(|| format!("--scenario-step: the {name} scenario plants no batch"))?);
        }
        if let Some(s) = &scen {
            if let Some(arch) = s.arch
                && arch != model.arch
            {
                bail!(
                    "--scenario {} reproduces a mechanism of the {} architecture; use a {} preset (e.g. --preset {}-tiny)",
                    s.name,
                    arch.as_str(),
                    arch.as_str(),
                    arch.as_str()
                );
            }
            if data_kind_is_synthetic(self.data) && s.reserved_tokens() + self.topics + self.branching >= model.vocab {
                bail!("--scenario {} needs {} spare token ids; the vocabulary is too small", s.name, s.reserved_tokens());
            }
            if !data_kind_is_synthetic(self.data) && s.needs_synthetic() {
                bail!("--scenario {} plants its tokens in the synthetic language; use --data synthetic", s.name);
            }
            if let Some(&last) = s.steps.iter().max()
                && self.steps <= last
                && !self.quiet
            {
                eprintln!(
                    "fp8-capture: note: --scenario {} plants its batch at step {last}; a run of {} steps ends before the step after it, so it shows nothing",
                    s.name, self.steps
                );
            }
        }
        let (dist_specs, gemm_specs): (Vec<&String>, Vec<&String>) = self.inject.iter().partition(|s| crate::dist::DistFault::is_dist_spec(s));
        let injections = gemm_specs.iter().map(|s| parse_injection(s, model.layers)).collect::<anyhow::Result<Vec<_>>>()?;
        let dist_faults = dist_specs.iter().map(|s| crate::dist::DistFault::parse(s, self.dp, self.tp, model.layers)).collect::<anyhow::Result<Vec<_>>>()?;
        if self.tp > 1 {
            crate::model::Dims::from_model(&model).shard(self.tp as usize, 0).map_err(|e| anyhow::anyhow!(e))?;
            if matches!(kind, RecipeKind::Current | RecipeKind::Block) {
                bail!("--tp {}: the {} recipe reduces its amaxes before each cast, inside the step; use --recipe delayed or bf16", self.tp, kind.as_str());
            }
            if let Some(s) = &scen {
                bail!("--tp {}: --scenario {} edits the whole model's weights before training; run it on one rank or with --dp", self.tp, s.name);
            }
        }
        let amax_reduce = self.amax_reduce.unwrap_or(crate::dist::DistPlan::default_amax_reduce(self.tp));
        if dist_faults.iter().any(|f| matches!(f, crate::dist::DistFault::AmaxDpOnly { .. })) && amax_reduce != crate::dist::AmaxReduce::World {
            bail!(
                "--inject kind=amax-dp-only takes tp out of a reduction over dp × tp; it needs --amax-reduce world (the default with --tp), not {}",
                amax_reduce.as_str()
            );
        }
        if self.flight_recorder > 0 && self.dp * self.tp > 1 {
            // A firing step is launched again, which every rank's collectives would have to agree on.
            bail!("--flight-recorder records a run of one rank; not with --dp {} --tp {} (use --dump-every there)", self.dp, self.tp);
        }
        if (self.checkpoint_every > 0 || !self.checkpoint_at.is_empty()) && self.dp * self.tp > 1 {
            bail!("--checkpoint-every: a checkpoint holds one rank's state; not with --dp {} --tp {}", self.dp, self.tp);
        }
        if self.resume.is_some() {
            if self.dp * self.tp > 1 {
                bail!("--resume: a checkpoint holds one rank's state; it resumes runs of one rank, not --dp {} --tp {}", self.dp, self.tp);
            }
            if self.at_step.is_some_and(|s| s >= self.steps) {
                bail!("--at-step {}: the run must go past the checkpoint (--steps {})", self.at_step.unwrap_or(0), self.steps);
            }
        }
        if self.gpu != 0 && device != "cuda" {
            bail!("--gpu {}: a GPU is chosen for --device cuda; this run trains on the {device}", self.gpu);
        }
        if self.dp > 1 {
            if model.batch % self.dp != 0 {
                bail!("--dp {}: the global batch (--batch {}) must be a multiple of the ranks, each taking B/N rows", self.dp, model.batch);
            }
            if matches!(kind, RecipeKind::Current | RecipeKind::Block) {
                bail!("--dp {}: the {} recipe reduces its amaxes before each cast, inside the step; use --recipe delayed or bf16", self.dp, kind.as_str());
            }
        }
        if kind != RecipeKind::Delayed && injections.iter().any(|i| i.kind == InjectionKind::Oscillation) {
            bail!("--inject kind=oscillation parks a weight at the boundaries of the grid its given scale makes: use --recipe delayed");
        }
        if self.tp > 1 && injections.iter().any(|i| i.kind == InjectionKind::Oscillation) {
            bail!("--inject kind=oscillation parks a whole weight; with --tp {} each rank holds a shard: run it on one rank or with --dp", self.tp);
        }
        if kind != RecipeKind::Delayed && dist_faults.iter().any(|f| !matches!(f, crate::dist::DistFault::RankDies { .. })) {
            bail!(
                "--inject kind=amax-local, amax-dp-only, scale-corrupt and stale-weight plant faults in delayed scaling's scales and casts; use --recipe delayed"
            );
        }
        let dist = crate::dist::DistPlan { dp: self.dp, tp: self.tp, amax_reduce, faults: dist_faults };
        if !injections.is_empty() && kind == RecipeKind::Bf16 {
            bail!("--inject plants faults in FP8 casts; --recipe bf16 has none");
        }
        let data_kind = match self.data {
            DataArg::Synthetic => DataKind::Synthetic,
            DataArg::Uniform => DataKind::Uniform,
            DataArg::Text => DataKind::Text,
        };
        let mut tokenizer = None;
        if data_kind == DataKind::Text {
            if self.text.is_empty() {
                bail!("--data text needs --text FILE");
            }
            for path in &self.text {
                if !std::path::Path::new(path).is_file() {
                    bail!("--text {path}: no such file");
                }
            }
            let need = match &self.tokenizer {
                Some(t) => {
                    let tk = crate::text::load_tokenizer(t)?;
                    tokenizer = Some(t.clone());
                    tk.get_vocab_size(true) as u32
                }
                None => 256,
            };
            if model.vocab < need {
                bail!("--data text: the vocabulary must cover the tokens' {need} ids (--vocab is {})", model.vocab);
            }
        } else if !self.text.is_empty() || self.tokenizer.is_some() {
            bail!("--text and --tokenizer belong to --data text");
        }
        if data_kind == DataKind::Synthetic && (self.topics >= model.vocab / 2 || self.branching > model.vocab - self.topics) {
            bail!(
                "--topics {} and --branching {} do not fit a vocabulary of {} (need topics < V/2 and branching ≤ V − topics)",
                self.topics,
                self.branching,
                model.vocab
            );
        }
        for (flag, v) in [("--beta1", self.beta1), ("--beta2", self.beta2)] {
            if !(0.0..1.0).contains(&v) {
                bail!("{flag} must be in [0, 1), got {v}");
            }
        }
        if !(self.eps > 0.0) || !(self.weight_decay >= 0.0) || !(self.grad_clip >= 0.0) {
            bail!("--eps must be > 0, --weight-decay and --grad-clip ≥ 0");
        }
        let recipe_name = kind.as_str();
        let name = self.name.clone().unwrap_or_else(|| format!("{}-{}-s{}", p.name, recipe_name, self.seed));
        if name.is_empty() || name.contains('/') {
            bail!("--name '{name}' must be a non-empty name without '/'");
        }
        let out = self.out.clone().unwrap_or_else(|| PathBuf::from("runs").join(&name));
        let config = RunConfig {
            preset: p.name.to_string(),
            model,
            recipe: RecipeConfig {
                kind,
                format: match self.format {
                    Some(FormatArg::Hybrid) => FormatPolicy::Hybrid,
                    Some(FormatArg::E4m3) => FormatPolicy::E4m3,
                    None if scen.as_ref().and_then(|s| s.e4m3) == Some(true) => FormatPolicy::E4m3,
                    // A per-GEMM recipe takes its recipes' default when they agree, hybrid otherwise.
                    None if kinds.iter().filter(|&&k| k != RecipeKind::Bf16).all(|&k| k == kind) => fp8scope_schemas::quant::default_policy(kind),
                    None => FormatPolicy::Hybrid,
                },
                amax_history: self.amax_history.or(scen.as_ref().and_then(|s| s.amax_history)).unwrap_or(1024),
                amax_algo: match self.amax_algo {
                    Some(AmaxAlgoArg::Max) => AmaxAlgo::Max,
                    Some(AmaxAlgoArg::MostRecent) => AmaxAlgo::MostRecent,
                    None if scen.as_ref().and_then(|s| s.amax_algo_most_recent) == Some(true) => AmaxAlgo::MostRecent,
                    None => AmaxAlgo::Max,
                },
                margin: self.margin.or(scen.as_ref().and_then(|s| s.margin)).unwrap_or(0),
                overflow: match self.overflow {
                    Some(OverflowArg::Saturate) => Overflow::Saturate,
                    Some(OverflowArg::Nan) => Overflow::Nan,
                    None if scen.as_ref().is_some_and(|s| s.overflow_nan) => Overflow::Nan,
                    None => Overflow::Saturate,
                },
                mx_rounding: match self.mx_rounding {
                    MxRoundingArg::Te => E8m0Rounding::Te,
                    MxRoundingArg::Ocp => E8m0Rounding::Ocp,
                },
                nvfp4: Nvfp4Switches {
                    disable_rht: self.nvfp4_disable_rht,
                    disable_stochastic_rounding: self.nvfp4_disable_stochastic_rounding,
                    disable_2d_quantization: self.nvfp4_disable_2d_quantization,
                },
                accumulation: match self.accumulation {
                    AccumulationArg::Split => Accumulation::Split,
                    AccumulationArg::FastFprop => Accumulation::FastFprop,
                    AccumulationArg::Fast => Accumulation::Fast,
                },
                per_gemm,
                cpu_accumulator: match self.cpu_accumulator {
                    CpuAccumulatorArg::Exact => CpuAccumulator::Exact,
                    CpuAccumulatorArg::Hopper => CpuAccumulator::Hopper,
                },
            },
            routing,
            data: DataConfig {
                kind: data_kind,
                path: self.text.first().cloned(),
                paths: self.text.clone(),
                tokenizer,
                language_seed: self.language_seed,
                branching: self.branching,
                topics: self.topics,
                zipf_exponent: self.zipf_exponent.or(scen.as_ref().and_then(|s| s.zipf_exponent)).unwrap_or(1.0),
            },
            train: TrainConfig {
                steps: self.steps,
                lr: self.lr.unwrap_or(p.lr),
                warmup_steps: self.warmup.unwrap_or(self.steps / 10),
                weight_decay: self.weight_decay,
                beta1: self.beta1,
                beta2: self.beta2,
                eps: self.eps,
                grad_clip: self.grad_clip,
                seed: self.seed,
                init_jitter: self.init_jitter,
                resume_from: self.resume.as_ref().map(|r| ResumeFrom { run: r.display().to_string(), step: self.at_step.unwrap_or(0) }),
            },
            record: RecordConfig {
                stats_every: self.stats_every,
                quant_error_every: self.quant_error_every,
                channel_stats_every: self.channel_stats_every.unwrap_or(if device == "cuda" { 10 } else { 1 }),
                dump_every: self.dump_every,
                dump_layers: self.dump_layers.clone(),
                dump_roles: self.dump_roles.clone(),
                dump_max_elems: self.dump_max_elems,
                dump_sample: match self.dump_sample {
                    SampleArg::First => DumpSample::First,
                    SampleArg::Strided => DumpSample::Strided,
                },
                shadow: self.shadow || self.flight_recorder > 0,
                flush_every: self.flush_every,
                flight_recorder: self.flight_recorder,
                checkpoint_every: self.checkpoint_every,
                checkpoint_at: self.checkpoint_at.clone(),
            },
            injections,
            scenario: scen.as_ref().map(|s| s.name.to_string()),
            model_config: self.model_config.as_ref().map(|p| p.display().to_string()),
            scenario_step: self.scenario_step,
            device: device.to_string(),
        };
        Ok(TrainPlan { config, out, name, dist })
    }
}
