//! The parameters of each architecture: their names, sizes and order in the flat list the
//! optimizer walks, where each layer's weights sit, and their initialisation.
//!
//! gpt, per layer: ln1_w ln1_b qkv_w qkv_b proj_w proj_b ln2_w ln2_b fc1_w fc1_b fc2_w fc2_b;
//! globals wte lnf_w lnf_b lm_head.
//! llama, per layer: norm1_w qkv_w proj_w norm2_w fc1_w fc2_w; globals wte normf_w and lm_head
//! unless the embeddings are tied (the lm_head is then `wte` itself).

use super::Dims;
use fp8scope_schemas::config::Arch;
use fp8scope_schemas::names::Module;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};
use rand_pcg::Pcg64;

/// Index of the token embedding (V, C) in the flat parameter list (both architectures).
pub const WTE: usize = 0;

const GPT_LAYER: [&str; 12] = ["ln1_w", "ln1_b", "qkv_w", "qkv_b", "proj_w", "proj_b", "ln2_w", "ln2_b", "fc1_w", "fc1_b", "fc2_w", "fc2_b"];
const LLAMA_LAYER: [&str; 6] = ["norm1_w", "qkv_w", "proj_w", "norm2_w", "fc1_w", "fc2_w"];

/// Where each parameter of a model sits in the flat list.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub arch: Arch,
    pub tied: bool,
}

/// A norm's (gain, bias) indices; the bias is absent for RMSNorm.
pub type NormParams = (usize, Option<usize>);

impl Layout {
    pub fn of(d: &Dims) -> Layout {
        Layout { arch: d.arch, tied: d.tied }
    }

    fn layer_names(&self) -> &'static [&'static str] {
        match self.arch {
            Arch::Gpt => &GPT_LAYER,
            Arch::Llama => &LLAMA_LAYER,
        }
    }

    fn global_names(&self) -> Vec<&'static str> {
        match (self.arch, self.tied) {
            (Arch::Gpt, false) => vec!["wte", "lnf_w", "lnf_b", "lm_head"],
            (Arch::Gpt, true) => vec!["wte", "lnf_w", "lnf_b"],
            (Arch::Llama, false) => vec!["wte", "normf_w", "lm_head"],
            (Arch::Llama, true) => vec!["wte", "normf_w"],
        }
    }

    fn globals(&self) -> usize {
        self.global_names().len()
    }

    /// Index of parameter `j` (in the layer's order) of `layer`.
    fn lp(&self, layer: usize, j: usize) -> usize {
        self.globals() + layer * self.layer_names().len() + j
    }

    /// The final norm before the lm_head.
    pub fn final_norm(&self) -> NormParams {
        match self.arch {
            Arch::Gpt => (1, Some(2)),
            Arch::Llama => (1, None),
        }
    }

    /// The lm_head's weight (V, C): its own, or the embedding when tied.
    pub fn lm_head(&self) -> usize {
        if self.tied { WTE } else { self.globals() - 1 }
    }

    /// The norm before attention (`first`) or before the MLP.
    pub fn norm(&self, layer: usize, first: bool) -> NormParams {
        match (self.arch, first) {
            (Arch::Gpt, true) => (self.lp(layer, 0), Some(self.lp(layer, 1))),
            (Arch::Gpt, false) => (self.lp(layer, 6), Some(self.lp(layer, 7))),
            (Arch::Llama, true) => (self.lp(layer, 0), None),
            (Arch::Llama, false) => (self.lp(layer, 3), None),
        }
    }

    /// The (weight, bias) of a site's linear layer; llama has no biases.
    pub fn linear(&self, layer: usize, module: Module) -> (usize, Option<usize>) {
        match self.arch {
            Arch::Gpt => {
                let j = 2 + 2 * module.index() + if module.index() >= 2 { 2 } else { 0 };
                (self.lp(layer, j), Some(self.lp(layer, j + 1)))
            }
            Arch::Llama => {
                let j = [1, 2, 4, 5][module.index()];
                (self.lp(layer, j), None)
            }
        }
    }
}

/// Sizes of every parameter, in flat order.
pub fn param_sizes(d: &Dims) -> Vec<usize> {
    let lay = Layout::of(d);
    let (v, c) = (d.v, d.c);
    let mut sizes: Vec<usize> = lay.global_names().iter().map(|n| if *n == "wte" || *n == "lm_head" { v * c } else { c }).collect();
    for _ in 0..d.l {
        for name in lay.layer_names() {
            let module = Module::ALL.into_iter().find(|m| name.starts_with(m.as_str()));
            sizes.push(match (module, name.ends_with("_b")) {
                (Some(m), false) => {
                    let l = d.linear(m);
                    l.k * l.m
                }
                (Some(m), true) => d.linear(m).m,
                (None, _) => c,
            });
        }
    }
    sizes
}

/// Human names of the flat parameters (`layers.1.fc2_w`, `wte`, …).
pub fn param_names(d: &Dims) -> Vec<String> {
    let lay = Layout::of(d);
    let mut names: Vec<String> = lay.global_names().iter().map(|s| s.to_string()).collect();
    for l in 0..d.l {
        names.extend(lay.layer_names().iter().map(|p| format!("layers.{l}.{p}")));
    }
    names
}

/// Initial parameters: N(0, 0.02) for matrices (gpt: proj and fc2 scaled by 1/√(2L), GPT-2
/// style; llama: all 0.02, Hugging Face's initializer_range), zero biases, unit norm gains.
pub fn init_params(d: &Dims, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = Pcg64::seed_from_u64(seed ^ 0x5EED_0F_1A7E);
    let std = 0.02f32;
    let resid_std = match d.arch {
        Arch::Gpt => std / (2.0 * d.l as f32).sqrt(),
        Arch::Llama => std,
    };
    param_sizes(d)
        .into_iter()
        .zip(param_names(d))
        .map(|(size, name)| {
            let suffix = name.rsplit('.').next().unwrap_or(&name).to_string();
            if (suffix.starts_with("ln") || suffix.starts_with("norm")) && suffix.ends_with("_w") {
                vec![1.0; size]
            } else if suffix.ends_with("_b") {
                vec![0.0; size]
            } else {
                let s = if suffix == "proj_w" || suffix == "fc2_w" { resid_std } else { std };
                let normal = Normal::new(0.0f32, s).expect("finite std");
                (0..size).map(|_| normal.sample(&mut rng)).collect()
            }
        })
        .collect()
}

/// Relative size of the `--init-jitter` perturbation: half a BF16 ulp (BF16 keeps 8 significand
/// bits, so rounding to it moves a value by up to 2⁻⁹ of itself).
pub const INIT_JITTER_REL: f32 = 1.0 / 512.0;

/// Multiplies every value by 1 ± [`INIT_JITTER_REL`], the sign drawn from `seed` (a stream of its
/// own, so the weights' draw is unchanged). Zeros stay zeros.
pub fn jitter_params(params: &mut [Vec<f32>], seed: u64) {
    let mut rng = Pcg64::seed_from_u64(seed ^ 0x0717_7E12_5EED);
    for p in params.iter_mut() {
        for x in p.iter_mut() {
            let up: bool = rng.random();
            *x *= if up { 1.0 + INIT_JITTER_REL } else { 1.0 - INIT_JITTER_REL };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(arch: Arch, kvh: usize, tied: bool) -> Dims {
        Dims { arch, v: 512, c: 64, f: 256, nh: 4, kvh, hd: 16, l: 2, b: 8, t: 64, n: 512, causal: true, tied, rope_theta: 1e4, eps: 1e-5, tp: 1, tp_rank: 0 }
    }

    #[test]
    fn gpt_sizes_match_the_parameter_count_formula() {
        let d = dims(Arch::Gpt, 4, false);
        let total: usize = param_sizes(&d).iter().sum();
        let per_layer = 4 * d.c + 3 * d.c * d.c + 3 * d.c + d.c * d.c + d.c + 2 * d.f * d.c + d.f + d.c;
        assert_eq!(total, 2 * d.v * d.c + 2 * d.c + d.l * per_layer);
        assert_eq!(param_names(&d).len(), param_sizes(&d).len());
        let lay = Layout::of(&d);
        assert_eq!(param_names(&d)[lay.linear(1, Module::Fc1).0], "layers.1.fc1_w");
        assert_eq!(param_names(&d)[lay.linear(1, Module::Proj).1.unwrap()], "layers.1.proj_b");
        assert_eq!(param_names(&d)[lay.norm(1, false).1.unwrap()], "layers.1.ln2_b");
        assert_eq!(param_names(&d)[lay.lm_head()], "lm_head");
    }

    #[test]
    fn llama_sizes_match_the_hugging_face_parameter_count() {
        // LlamaForCausalLM: embed V·C, per layer 2C (norms) + C·(C + 2·KVH·HD) + C·C + 3·C·F, norm C, lm_head V·C.
        for (kvh, tied) in [(2, false), (4, true)] {
            let d = dims(Arch::Llama, kvh, tied);
            let total: usize = param_sizes(&d).iter().sum();
            let per_layer = 2 * d.c + d.c * (d.c + 2 * kvh * d.hd) + d.c * d.c + 3 * d.c * d.f;
            assert_eq!(total, d.v * d.c * if tied { 1 } else { 2 } + d.c + d.l * per_layer);
            let names = param_names(&d);
            let lay = Layout::of(&d);
            assert_eq!(names[lay.linear(1, Module::Fc2).0], "layers.1.fc2_w");
            assert_eq!(names[lay.norm(0, false).0], "layers.0.norm2_w");
            assert_eq!(names[lay.lm_head()], if tied { "wte" } else { "lm_head" });
        }
    }

    #[test]
    fn the_init_jitter_moves_every_weight_by_half_a_bf16_ulp_and_keeps_zeros() {
        let d = dims(Arch::Gpt, 4, false);
        let base = init_params(&d, 7);
        let mut j1 = base.clone();
        jitter_params(&mut j1, 1);
        let mut j2 = base.clone();
        jitter_params(&mut j2, 2);
        let (mut up, mut down, mut differ) = (0usize, 0usize, 0usize);
        for ((b, a), c) in base.iter().flatten().zip(j1.iter().flatten()).zip(j2.iter().flatten()) {
            if *b == 0.0 {
                assert_eq!(*a, 0.0, "zeros stay zeros");
                continue;
            }
            let r = (*a as f64 - *b as f64) / *b as f64;
            assert!((r.abs() - 1.0 / 512.0).abs() < 1e-6, "relative change {r}");
            if r > 0.0 {
                up += 1
            } else {
                down += 1
            }
            differ += (a != c) as usize;
        }
        let n = up + down;
        assert!(up.abs_diff(down) < n / 50, "signs balanced: {up} up, {down} down");
        assert!(differ > n / 3, "another seed draws other signs: {differ} of {n}");
    }
}
