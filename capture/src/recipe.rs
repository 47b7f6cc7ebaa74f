//! Scaling recipes: the per-tensor state (amax history) of delayed scaling, and the cast each GEMM
//! operand gets under bf16 / delayed / current / block scaling.
//!
//! Delayed scaling follows Transformer Engine's DelayedScaling: each quantized tensor
//! (`layers.{i}.{module}.{role}`) keeps the amaxes of its last H steps; the scale used at a step is
//! `(fp8_max / reduce(history)) / 2^margin`, reduce being `max` or `most_recent`, and 1.0 while
//! the history is empty. The history is updated after each step with the amax the casts saw.

use crate::backend::{GemmReport, OperandCast, ScaleSource};
use crate::config::{block_tile, format_for, is_fp8};
use crate::fp8;
use fp8scope_schemas::config::{AmaxAlgo, RecipeKind, RunConfig};
use fp8scope_schemas::names::{Gemm, Role, Site};
use std::collections::{HashMap, VecDeque};

/// Scaling state of every quantized tensor of the model.
pub struct Scaling {
    kind: RecipeKind,
    algo: AmaxAlgo,
    history_len: usize,
    margin: i32,
    history: HashMap<(Site, Role), VecDeque<f32>>,
}

impl Scaling {
    pub fn new(cfg: &RunConfig) -> Scaling {
        Scaling {
            kind: cfg.recipe.kind,
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

    /// How `role`, operand of `gemm` at `site`, is cast this step.
    pub fn operand_cast(&self, cfg: &RunConfig, site: Site, gemm: Gemm, role: Role) -> OperandCast {
        if !is_fp8(cfg, site, gemm) {
            return OperandCast::Bf16;
        }
        let format = format_for(cfg, role);
        match self.kind {
            RecipeKind::Bf16 => OperandCast::Bf16,
            RecipeKind::Current => OperandCast::Fp8Tensor { format, scale: ScaleSource::Current { margin: self.margin } },
            RecipeKind::Block => {
                let (tile_rows, tile_cols) = block_tile(gemm, role);
                OperandCast::Fp8Block { format, tile_rows, tile_cols, margin: self.margin }
            }
            RecipeKind::Delayed => {
                let (scale, amax_used) = match self.history_amax(site, role) {
                    Some(a) => (fp8::scale_for_amax(format, a, self.margin), a),
                    None => (1.0, 0.0),
                };
                OperandCast::Fp8Tensor { format, scale: ScaleSource::Given { scale, amax_used } }
            }
        }
    }

    /// Pushes this step's amaxes (the largest any FP8 cast of a tensor saw) into the histories.
    pub fn observe(&mut self, reports: &[GemmReport]) {
        if self.kind != RecipeKind::Delayed {
            return;
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
        for (key, amax) in seen {
            let h = self.history.entry(key).or_default();
            h.push_back(amax);
            while h.len() > self.history_len {
                h.pop_front();
            }
        }
    }
}
