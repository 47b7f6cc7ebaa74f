//! Scaling recipes: the per-tensor state (amax history) of delayed scaling, and the cast each GEMM
//! operand gets under bf16 / delayed / current / block scaling, MXFP8 and NVFP4 — which element
//! format, block and scale is the quantization contract's (`fp8scope_schemas::quant`).
//!
//! Delayed scaling follows Transformer Engine's DelayedScaling: each quantized tensor
//! (`layers.{i}.{module}.{role}`) keeps the amaxes of its last H steps; the scale used at a step is
//! `(fp8_max / reduce(history)) / 2^margin`, reduce being `max` or `most_recent`, and 1.0 while
//! the history is empty. The history is updated after each step with the amax the casts saw; a
//! zero amax (an all-zero tensor) is skipped, as Transformer Engine keeps the previous scale then.

use crate::backend::{GemmReport, OperandCast, ScaleSource};
use crate::config::is_fp8;
use crate::fp8::{self, Fp8Format};
use fp8scope_schemas::config::{AmaxAlgo, RecipeKind, RunConfig};
use fp8scope_schemas::names::{Gemm, Role, Site};
use fp8scope_schemas::quant::{self, BlockShape, ScaleEncoding};
use std::collections::{HashMap, VecDeque};

/// The stochastic-rounding seed of one cast: the run's seed, the step and the operand, mixed by
/// SplitMix64 so that every cast of a run draws its own numbers and a rerun draws the same.
pub fn rounding_seed(run_seed: u64, step: u32, site: Site, gemm: Gemm, role: Role) -> u64 {
    let module = fp8scope_schemas::names::Module::ALL.iter().position(|&m| m == site.module).unwrap_or(0) as u64;
    let gemm = Gemm::ALL.iter().position(|&g| g == gemm).unwrap_or(0) as u64;
    let role = Role::ALL.iter().position(|&r| r == role).unwrap_or(0) as u64;
    let key = (u64::from(step) << 32) | (u64::from(site.layer) << 12) | (module << 8) | (gemm << 4) | role;
    let hi = crate::micro::e2m1::random_bits(run_seed, key);
    let lo = crate::micro::e2m1::random_bits(run_seed ^ 0x5851_F42D_4C95_7F2D, key);
    (u64::from(hi) << 32) | u64::from(lo)
}

/// Scaling state of every quantized tensor of the model.
pub struct Scaling {
    /// Whether some GEMM runs under delayed scaling (the only recipe with a history).
    delayed: bool,
    algo: AmaxAlgo,
    history_len: usize,
    margin: i32,
    history: HashMap<(Site, Role), VecDeque<f32>>,
}

impl Scaling {
    /// Every amax history, oldest first, for a checkpoint.
    pub fn histories(&self) -> Vec<(Site, Role, Vec<f32>)> {
        let mut v: Vec<(Site, Role, Vec<f32>)> = self.history.iter().map(|(&(s, r), h)| (s, r, h.iter().copied().collect())).collect();
        v.sort_by_key(|(s, r, _)| (*s, *r));
        v
    }

    /// Puts back histories taken by [`Scaling::histories`] (a resumed run), in place of these.
    pub fn restore(&mut self, histories: Vec<(Site, Role, Vec<f32>)>) {
        self.history = histories.into_iter().map(|(s, r, h)| ((s, r), h.into_iter().collect())).collect();
    }

    pub fn new(cfg: &RunConfig) -> Scaling {
        Scaling {
            delayed: cfg.recipe.kinds().contains(&RecipeKind::Delayed),
            algo: cfg.recipe.amax_algo,
            history_len: cfg.recipe.amax_history.max(1) as usize,
            margin: cfg.recipe.margin,
            history: HashMap::new(),
        }
    }

    /// The amax delayed scaling would use now for this tensor (None with an empty history).
    pub fn history_amax(&self, site: Site, role: Role) -> Option<f32> {
        let h = self.history.get(&(site, role))?;
        match self.algo {
            AmaxAlgo::Max => h.iter().copied().reduce(f32::max),
            AmaxAlgo::MostRecent => h.back().copied(),
        }
    }

    /// How `role`, operand of `gemm` at `site`, is cast at `step`: as the quantization contract
    /// (`fp8scope_schemas::quant::operand_quant`) says for the recipe, BF16 where the routing (and
    /// its schedule) says so.
    pub fn operand_cast(&self, cfg: &RunConfig, site: Site, gemm: Gemm, role: Role, step: u32) -> OperandCast {
        if !is_fp8(cfg, site, gemm, step) {
            return OperandCast::Bf16;
        }
        let r = &cfg.recipe;
        let kind = r.kind_for(gemm);
        let Some(q) = quant::operand_quant(kind, r.format, r.mx_rounding, r.nvfp4, gemm, role) else {
            return OperandCast::Bf16;
        };
        let (tile_rows, tile_cols) = match q.block {
            BlockShape::Tile { rows, cols } => (rows, cols),
            BlockShape::Tensor => (0, 0),
        };
        let fp8_element =
            || Fp8Format::of_element(q.element).unwrap_or_else(|| panic!("the contract gives {} scales to {} elements", q.scale.name(), q.element.name()));
        match q.scale {
            ScaleEncoding::Fp32Tensor if kind == RecipeKind::Current => {
                OperandCast::Fp8Tensor { format: fp8_element(), scale: ScaleSource::Current { margin: self.margin } }
            }
            ScaleEncoding::Fp32Tensor => {
                let format = fp8_element();
                let (scale, amax_used) = match self.history_amax(site, role) {
                    Some(a) => (fp8::scale_for_amax(format, a, self.margin), a),
                    None => (1.0, 0.0),
                };
                OperandCast::Fp8Tensor { format, scale: ScaleSource::Given { scale, amax_used } }
            }
            ScaleEncoding::Fp32Block => OperandCast::Fp8Block { format: fp8_element(), tile_rows, tile_cols, margin: self.margin },
            ScaleEncoding::E8m0Block(rounding) => OperandCast::Mxfp8 { format: fp8_element(), rounding, tile_rows, tile_cols },
            ScaleEncoding::E4m3BlockUnderFp32Tensor => OperandCast::Nvfp4 {
                tile_rows,
                tile_cols,
                rht: q.rht,
                stochastic_seed: q.stochastic.then(|| rounding_seed(cfg.train.seed, step, site, gemm, role)),
            },
        }
    }

    /// Pushes this step's amaxes (the largest any FP8 cast of a tensor saw) into the histories.
    pub fn observe(&mut self, reports: &[GemmReport]) {
        let amaxes = self.step_amaxes(reports);
        self.push_amaxes(&amaxes);
    }

    /// This step's amax of every quantized tensor (the largest any FP8 cast of it saw), sorted by
    /// tensor, so that every rank lists the same tensors in the same order; empty unless some GEMM
    /// runs under delayed scaling (the only recipe with a history).
    pub fn step_amaxes(&self, reports: &[GemmReport]) -> Vec<((Site, Role), f32)> {
        if !self.delayed {
            return Vec::new();
        }
        let mut seen: HashMap<(Site, Role), f32> = HashMap::new();
        for r in reports {
            let site = Site::new(r.id.layer, r.id.module);
            for c in [&r.a, &r.b] {
                if c.format == "bf16" {
                    continue;
                }
                if let Some(role) = c.role {
                    let e = seen.entry((site, role)).or_insert(0.0);
                    *e = e.max(c.amax);
                }
            }
        }
        let mut out: Vec<_> = seen.into_iter().collect();
        out.sort_unstable_by_key(|&(k, _)| k);
        out
    }

    /// Pushes amaxes (this step's, reduced over the ranks that share the scale) into the histories.
    pub fn push_amaxes(&mut self, amaxes: &[((Site, Role), f32)]) {
        for &(key, amax) in amaxes {
            // An all-zero tensor (e.g. every gradient of a batch without a supervised target)
            // leaves the history as it was: Transformer Engine keeps the previous scale when
            // amax = 0, where a zero would otherwise reset the scale to 1.
            if amax == 0.0 {
                continue;
            }
            let h = self.history.entry(key).or_default();
            h.push_back(amax);
            while h.len() > self.history_len {
                h.pop_front();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{CastReport, GemmId};
    use crate::cli::{Cli, Command};
    use clap::Parser;
    use fp8scope_schemas::names::Module;

    fn config(extra: &[&str]) -> RunConfig {
        let mut args = vec!["fp8-capture", "train", "--preset", "tiny", "--recipe", "delayed", "--out", "/nonexistent/run"];
        args.extend_from_slice(extra);
        let Command::Train(t) = Cli::try_parse_from(args).expect("flags parse").command else { panic!("not train") };
        t.validate("cpu").expect("valid flags").config
    }

    fn report(amax: f32) -> GemmReport {
        let cast = |role| CastReport { role: Some(role), format: "e4m3", amax, ..Default::default() };
        GemmReport {
            id: GemmId { layer: 0, module: Module::Qkv, gemm: Gemm::Fprop },
            a: cast(Role::Activation),
            b: cast(Role::Weight),
            shadow: None,
            output_nonfinite: 0,
        }
    }

    #[test]
    fn an_all_zero_tensor_keeps_the_previous_scale_as_in_transformer_engine() {
        let cfg = config(&["--amax-algo", "most-recent", "--amax-history", "1"]);
        let mut s = Scaling::new(&cfg);
        let site = Site::new(0, Module::Qkv);
        s.observe(&[report(2.0)]);
        assert_eq!(s.history_amax(site, Role::Activation), Some(2.0));
        s.observe(&[report(0.0)]);
        assert_eq!(s.history_amax(site, Role::Activation), Some(2.0), "a zero amax is not recorded");
        s.observe(&[report(0.5)]);
        assert_eq!(s.history_amax(site, Role::Activation), Some(0.5));
    }
}
