//! Presets, and the questions the model asks of a run's configuration: which GEMMs run in FP8,
//! in which format each role is cast, which faults are active at a step.

use fp8scope_schemas::config::{AttnMask, FormatPolicy, ModelDims, RecipeKind, RunConfig};
use fp8scope_schemas::names::{Gemm, Module, Role, Site};
use crate::fp8::Fp8Format;

/// A named model size (DESIGN.md). Every dimension can still be changed by its own flag.
#[derive(Clone, Copy, Debug)]
pub struct Preset {
    pub name: &'static str,
    pub dims: (u32, u32, u32, u32, u32, u32, u32),
    /// Default peak learning rate.
    pub lr: f64,
    pub about: &'static str,
}

pub const PRESETS: [Preset; 3] = [
    Preset { name: "tiny", dims: (512, 64, 256, 4, 2, 8, 64), lr: 3e-3, about: "CPU demo and tests" },
    Preset { name: "small", dims: (4096, 256, 1024, 8, 4, 8, 128), lr: 1e-3, about: "GPU quick runs, CPU slow runs" },
    Preset { name: "seed", dims: (32000, 1024, 4096, 16, 12, 4, 512), lr: 3e-4, about: "the reference repro, GPU" },
];

pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

impl Preset {
    pub fn model(&self) -> ModelDims {
        let (vocab, channels, ffn, heads, layers, batch, seq) = self.dims;
        ModelDims { vocab, channels, ffn, heads, layers, batch, seq, attn_mask: AttnMask::Causal }
    }
}

/// The (in, out) features of a site's linear layer: qkv C→3C, proj C→C, fc1 C→F, fc2 F→C.
pub fn site_features(m: &ModelDims, module: Module) -> (usize, usize) {
    let (c, f) = (m.channels as usize, m.ffn as usize);
    match module {
        Module::Qkv => (c, 3 * c),
        Module::Proj => (c, c),
        Module::Fc1 => (c, f),
        Module::Fc2 => (f, c),
    }
}

/// Whether `gemm` of `site` runs in FP8 under this configuration's recipe and routing.
pub fn is_fp8(cfg: &RunConfig, site: Site, gemm: Gemm) -> bool {
    if cfg.recipe.kind == RecipeKind::Bf16 {
        return false;
    }
    let r = &cfg.routing;
    if r.bf16_gemms.iter().any(|g| g == gemm.as_str()) || r.bf16_layers.contains(&site.layer) {
        return false;
    }
    let name = site.to_string();
    let full = format!("{name}:{}", gemm.as_str());
    !r.bf16_sites.iter().any(|s| *s == name || *s == full)
}

/// The FP8 format of `role` under the recipe's format policy (block scaling is always E4M3).
pub fn format_for(cfg: &RunConfig, role: Role) -> Fp8Format {
    match (cfg.recipe.kind, cfg.recipe.format, role) {
        (RecipeKind::Block, _, _) => Fp8Format::E4M3,
        (_, FormatPolicy::Hybrid, Role::Gradient) => Fp8Format::E5M2,
        _ => Fp8Format::E4M3,
    }
}

/// Block-scaling tile (rows, cols) of an operand in its row-major layout: tiles run along the
/// GEMM's reduction dimension — 1×128 for activations and gradients in fprop and dgrad, 128×1 in
/// wgrad (where the reduction runs over tokens), 128×128 for weights.
pub fn block_tile(gemm: Gemm, role: Role) -> (usize, usize) {
    match (gemm, role) {
        (_, Role::Weight) => (128, 128),
        (Gemm::Wgrad, _) => (128, 1),
        _ => (1, 128),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_tiles_run_along_the_reduction_dimension() {
        assert_eq!(block_tile(Gemm::Fprop, Role::Activation), (1, 128));
        assert_eq!(block_tile(Gemm::Dgrad, Role::Gradient), (1, 128));
        assert_eq!(block_tile(Gemm::Wgrad, Role::Gradient), (128, 1));
        assert_eq!(block_tile(Gemm::Wgrad, Role::Activation), (128, 1));
        assert_eq!(block_tile(Gemm::Dgrad, Role::Weight), (128, 128));
    }
}
