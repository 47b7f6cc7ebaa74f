//! The names in Transformer Engine's debug statistics: `{layer}_{tensor}_{stat}` split from the end,
//! and each statistic mapped to an fp8scope `stats` column or kept under its own name.
//!
//! Layer names hold `_` and `.` (`model.layers.0.self_attention.layernorm_qkv`), so the name is
//! split at the last `_{tensor}_` with `tensor` one of the tensors TE logs (activation, gradient,
//! weight, output, wgrad, dgrad); no statistic's name contains one of them.
//!
//! Statistics (TE's `transformer_engine/debug/features/`, nvdlfw_inspect's `LogTensorStats`):
//! - `LogTensorStats`: min, max, mean, std, l1_norm, l2_norm, cur_amax, dynamic_range,
//!   max_blockwise_dynamic_range_block_size_{B}_dims_{D}[_max_over_orientations];
//! - `LogFp8TensorStats`: `[<recipe>_]<stat>[_columnwise]` with recipe fp8_delayed_scaling,
//!   fp8_current_scaling, mxfp8, fp8_block_scaling and stat underflows%, overflows%,
//!   scale_inv_min, scale_inv_max, mse; no recipe means the training recipe; `_columnwise` is the
//!   transposed cast (mxfp8, block scaling);
//! - `LogNvfp4TensorStats`: nvfp4_underflows%, nvfp4_mse.

use fp8scope_schemas::names::{Gemm, Role};

/// The tensors TE's debug features log, as named in the logs.
pub const TENSORS: [&str; 6] = ["activation", "gradient", "weight", "output", "wgrad", "dgrad"];

/// Recipe prefixes of `LogFp8TensorStats` and `LogNvfp4TensorStats` stats.
pub const RECIPES: [&str; 5] = ["fp8_delayed_scaling", "fp8_current_scaling", "mxfp8", "fp8_block_scaling", "nvfp4"];

/// Suffix of stats of the transposed (columnwise) cast.
pub const COLUMNWISE: &str = "_columnwise";

/// `{layer}_{tensor}_{stat}`, split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatName<'a> {
    pub layer: &'a str,
    pub tensor: &'a str,
    pub stat: &'a str,
}

/// Splits a logged name at its last `_{tensor}_`; None when no known tensor is in it.
pub fn split_name(name: &str) -> Option<StatName<'_>> {
    let mut best: Option<(usize, &str)> = None;
    for t in TENSORS {
        let needle = format!("_{t}_");
        if let Some(i) = name.rfind(&needle)
            && best.is_none_or(|(j, _)| i > j)
        {
            best = Some((i, t));
        }
    }
    let (i, tensor) = best?;
    let layer = &name[..i];
    let stat = &name[i + tensor.len() + 2..];
    (!layer.is_empty() && !stat.is_empty()).then_some(StatName { layer, tensor, stat })
}

/// A `stats` column a logged statistic fills.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Column {
    Min,
    Max,
    Mean,
    Std,
    /// `cur_amax`
    Amax,
    /// `dynamic_range`: log2(amax) − log2(smallest non-zero |x|).
    DynamicRangeLog2,
    /// `underflows%` / 100.
    UnderflowFrac,
    /// `overflows%` / 100.
    SaturatedFrac,
    /// 1 / `scale_inv_max`: the smallest scale of the cast (per-tensor: the scale).
    Scale,
    /// `mse`
    QuantMse,
}

impl Column {
    /// Whether the column describes the FP8 cast (and so depends on rowwise / columnwise).
    pub fn of_cast(self) -> bool {
        matches!(self, Column::UnderflowFrac | Column::SaturatedFrac | Column::Scale | Column::QuantMse)
    }
    /// The column's value from the logged one; None when it cannot be had (a scale_inv rounded
    /// to 0 by the logs' decimals).
    pub fn convert(self, logged: f64) -> Option<f64> {
        match self {
            Column::UnderflowFrac | Column::SaturatedFrac => Some(logged / 100.0),
            Column::Scale => (logged != 0.0).then(|| 1.0 / logged),
            _ => Some(logged),
        }
    }
}

/// Where one logged statistic goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Into a `stats` column, of the rowwise cast or of the columnwise one.
    Stats { column: Column, columnwise: bool },
    /// Into `extra_stats`, under its own name.
    Extra,
}

/// A parsed statistic name: recipe prefix, base name and orientation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatParts<'a> {
    pub recipe: Option<&'static str>,
    pub base: &'a str,
    pub columnwise: bool,
}

/// Splits `[<recipe>_]<stat>[_columnwise]`.
pub fn stat_parts(stat: &str) -> StatParts<'_> {
    let (rest, columnwise) = match stat.strip_suffix(COLUMNWISE) {
        Some(r) => (r, true),
        None => (stat, false),
    };
    for r in RECIPES {
        if let Some(base) = rest.strip_prefix(r).and_then(|b| b.strip_prefix('_')) {
            return StatParts { recipe: Some(r), base, columnwise };
        }
    }
    StatParts { recipe: None, base: rest, columnwise }
}

/// Whether the statistic is one of the quantized-tensor ones (it says something about a cast).
pub fn is_cast_stat(stat: &str) -> bool {
    let p = stat_parts(stat);
    p.recipe.is_some() || p.columnwise || matches!(p.base, "underflows%" | "overflows%" | "scale_inv_min" | "scale_inv_max" | "mse")
}

/// Where `stat` goes, given the training recipe's TE name (`fp8_delayed_scaling`, …) when known:
/// statistics of the training recipe's cast (no prefix, or its own prefix) and of the tensor itself
/// map to columns; what-if statistics of another recipe, norms and blockwise ranges are kept.
pub fn target(stat: &str, training: Option<&str>) -> Target {
    let p = stat_parts(stat);
    if let Some(r) = p.recipe
        && Some(r) != training
    {
        return Target::Extra;
    }
    let column = match (p.recipe.is_some() || p.columnwise, p.base) {
        (false, "min") => Column::Min,
        (false, "max") => Column::Max,
        (false, "mean") => Column::Mean,
        (false, "std") => Column::Std,
        (false, "cur_amax") => Column::Amax,
        (false, "dynamic_range") => Column::DynamicRangeLog2,
        (_, "underflows%") => Column::UnderflowFrac,
        (_, "overflows%") => Column::SaturatedFrac,
        (_, "scale_inv_max") => Column::Scale,
        (_, "mse") => Column::QuantMse,
        _ => return Target::Extra,
    };
    Target::Stats { column, columnwise: p.columnwise }
}

/// The GEMM a tensor's cast feeds in Transformer Engine: the rowwise cast of activation and weight
/// feeds fprop, of the gradient dgrad; the columnwise (transposed) cast of activation and gradient
/// feeds wgrad, of the weight dgrad. Results belong to the GEMM that produces them.
pub fn gemm_of(role: Role, columnwise: bool) -> Gemm {
    match (role, columnwise) {
        (Role::Activation, false) | (Role::Weight, false) | (Role::Output, _) => Gemm::Fprop,
        (Role::Gradient, false) | (Role::Weight, true) | (Role::Dgrad, _) => Gemm::Dgrad,
        (Role::Activation, true) | (Role::Gradient, true) | (Role::Wgrad, _) => Gemm::Wgrad,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_at_the_last_tensor_whatever_the_layer_holds() {
        let s = split_name("model.layers.0.self_attention.layernorm_qkv_activation_underflows%").unwrap();
        assert_eq!((s.layer, s.tensor, s.stat), ("model.layers.0.self_attention.layernorm_qkv", "activation", "underflows%"));
        let s = split_name("decoder.output_layer_gradient_fp8_block_scaling_scale_inv_min_columnwise").unwrap();
        assert_eq!((s.layer, s.tensor, s.stat), ("decoder.output_layer", "gradient", "fp8_block_scaling_scale_inv_min_columnwise"));
        let s = split_name("blocks.1.weight_proj_weight_max").unwrap();
        assert_eq!((s.layer, s.tensor, s.stat), ("blocks.1.weight_proj", "weight", "max"));
        assert_eq!(split_name("fc1_max"), None);
        assert_eq!(split_name("_activation_max"), None);
    }

    #[test]
    fn stats_of_the_training_recipe_map_and_what_ifs_are_kept() {
        let d = Some("fp8_delayed_scaling");
        assert_eq!(target("underflows%", d), Target::Stats { column: Column::UnderflowFrac, columnwise: false });
        assert_eq!(target("fp8_delayed_scaling_overflows%", d), Target::Stats { column: Column::SaturatedFrac, columnwise: false });
        assert_eq!(target("mxfp8_underflows%", d), Target::Extra);
        assert_eq!(target("mxfp8_scale_inv_max_columnwise", Some("mxfp8")), Target::Stats { column: Column::Scale, columnwise: true });
        assert_eq!(target("scale_inv_min", d), Target::Extra);
        assert_eq!(target("cur_amax", None), Target::Stats { column: Column::Amax, columnwise: false });
        assert_eq!(target("l2_norm", None), Target::Extra);
        assert_eq!(target("max_blockwise_dynamic_range_block_size_32_dims_1", None), Target::Extra);
        assert_eq!(target("nvfp4_mse", Some("nvfp4")), Target::Stats { column: Column::QuantMse, columnwise: false });
        assert_eq!(target("nvfp4_mse", d), Target::Extra);
        assert!(is_cast_stat("fp8_current_scaling_mse") && is_cast_stat("underflows%") && !is_cast_stat("max"));
    }

    #[test]
    fn casts_feed_the_gemms_transformer_engine_uses_them_in() {
        assert_eq!(gemm_of(Role::Activation, false), Gemm::Fprop);
        assert_eq!(gemm_of(Role::Activation, true), Gemm::Wgrad);
        assert_eq!(gemm_of(Role::Weight, true), Gemm::Dgrad);
        assert_eq!(gemm_of(Role::Gradient, false), Gemm::Dgrad);
        assert_eq!(gemm_of(Role::Gradient, true), Gemm::Wgrad);
        assert_eq!(gemm_of(Role::Wgrad, false), Gemm::Wgrad);
        assert_eq!(Column::Scale.convert(0.0), None);
        assert_eq!(Column::Scale.convert(0.5), Some(2.0));
        assert_eq!(Column::UnderflowFrac.convert(12.5), Some(0.125));
    }
}
