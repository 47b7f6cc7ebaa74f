//! Presets, and the questions the model asks of a run's configuration: which GEMMs run in FP8,
//! in which format each role is cast, which faults are active at a step.

use fp8scope_schemas::config::{Arch, AttnMask, ModelDims, RecipeKind, RunConfig};
use fp8scope_schemas::names::{Gemm, Site};

/// A named model size (DESIGN.md). Every dimension can still be changed by its own flag.
#[derive(Clone, Copy, Debug)]
pub struct Preset {
    pub name: &'static str,
    pub arch: Arch,
    /// (V, C, F, NH, L, B, T).
    pub dims: (u32, u32, u32, u32, u32, u32, u32),
    /// Key/value heads (grouped-query attention; Llama presets).
    pub kv_heads: Option<u32>,
    /// Default peak learning rate.
    pub lr: f64,
    pub about: &'static str,
}

/// Rotary base and RMSNorm epsilon of the Llama presets (Llama 2's; Hugging Face's defaults).
pub const LLAMA_ROPE_THETA: f64 = 10000.0;
pub const LLAMA_NORM_EPS: f64 = 1e-5;

const fn gpt(name: &'static str, dims: (u32, u32, u32, u32, u32, u32, u32), lr: f64, about: &'static str) -> Preset {
    Preset { name, arch: Arch::Gpt, dims, kv_heads: None, lr, about }
}

const fn llama(name: &'static str, dims: (u32, u32, u32, u32, u32, u32, u32), kv: u32, lr: f64, about: &'static str) -> Preset {
    Preset { name, arch: Arch::Llama, dims, kv_heads: Some(kv), lr, about }
}

pub const PRESETS: [Preset; 6] = [
    gpt("tiny", (512, 64, 256, 4, 2, 8, 64), 3e-3, "CPU demo and tests"),
    gpt("small", (4096, 256, 1024, 8, 4, 8, 128), 1e-3, "GPU quick runs, CPU slow runs"),
    gpt("seed", (32000, 1024, 4096, 16, 12, 4, 512), 3e-4, "the reference repro, GPU"),
    llama("llama-tiny", (512, 64, 176, 4, 2, 8, 64), 2, 3e-3, "Llama family: CPU demo and tests"),
    llama("llama-small", (4096, 256, 704, 8, 4, 8, 128), 4, 1e-3, "Llama family: GPU quick runs (torch_llama.py's shape)"),
    llama("llama-1b", (32000, 2048, 8192, 32, 16, 4, 2048), 8, 3e-4, "Llama 3.2 1B shape, smaller vocabulary, GPU"),
];

pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

impl Preset {
    pub fn model(&self) -> ModelDims {
        let (vocab, channels, ffn, heads, layers, batch, seq) = self.dims;
        let is_llama = self.arch == Arch::Llama;
        ModelDims {
            arch: self.arch,
            vocab,
            channels,
            ffn,
            heads,
            layers,
            batch,
            seq,
            attn_mask: AttnMask::Causal,
            kv_heads: self.kv_heads,
            rope_theta: is_llama.then_some(LLAMA_ROPE_THETA),
            norm_eps: is_llama.then_some(LLAMA_NORM_EPS),
            tie_embeddings: false,
        }
    }
}

/// Whether `gemm` of `site` runs in FP8 at `step` under this configuration's recipe and routing
/// (with its schedule, `--from-step` / `--until-step`).
pub fn is_fp8(cfg: &RunConfig, site: Site, gemm: Gemm, step: u32) -> bool {
    if cfg.recipe.kind_for(gemm) == RecipeKind::Bf16 {
        return false;
    }
    !cfg.routing.sends_to_bf16_at(site, gemm, step)
}
