//! What-ifs on recorded runs: what another format's cast would do to each dumped tensor, computed
//! with fp8-capture's exact CPU emulation of the format (the casts its CPU backend trains with).
//!
//! Each dump of a quantized operand (activation, weight, gradient) that holds leading whole rows of
//! a 2-D tensor (offset 0, stride 1: `--dump-sample first`, the default; the whole tensor with
//! `--dump-max-elems` ≥ its size) is cast as it would be under each format, in the tensor's
//! row-major layout, which is the operand's layout in its fprop or dgrad (blocks run along each
//! row: the reduction dimension there). A row-wise block's scale depends on its block only, so
//! mxfp8 and block's 1×128 tiles are exact on leading rows; the per-tensor scales (e4m3, e5m2,
//! nvfp4's FP32 tensor scale) and block's 128×128 weight tiles come from the rows dumped, exact
//! only for whole dumps (`whole` in the rows says which).
//! - `e4m3`, `e5m2`: one scale for the tensor, from its own amax (current scaling, margin 0);
//! - `mxfp8`: E4M3 in 1×32 blocks with E8M0 scales, Transformer Engine's rounding;
//! - `nvfp4`: E2M1 in 1×16 blocks (16×16 for weights) with E4M3 scales under an FP32 tensor
//!   scale, round to nearest (no Hadamard transform: that is wgrad's, along the other dimension);
//! - `block`: E4M3 with one scale per 1×128 tile (128×128 for weights), DeepSeek-V3's.
//!
//! Reported per tensor and format: the share of finite non-zero values flushed to zero
//! (underflow), the share clamped (saturated), and the MSE, cosine and SQNR of the dequantized cast
//! against the recorded values.

use crate::error::AnalyzeError;
use crate::load::{Run, i64s, strs};
use fp8_capture::backend::cpu::cast::cast_operand;
use fp8_capture::backend::{OperandCast, OperandFault, ScaleSource, StatsLevel};
use fp8_capture::fp8::Fp8Format;
use fp8scope_schemas::layout::Table;
use fp8scope_schemas::quant::E8m0Rounding;
use fp8scope_schemas::tables::col;
use polars::prelude::*;
use rayon::prelude::*;
use serde::Serialize;

/// The formats `whatif` knows, in the order it reports them.
pub const FORMATS: [&str; 5] = ["e4m3", "e5m2", "mxfp8", "nvfp4", "block"];

/// One tensor under one format.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WhatIfRow {
    pub step: i64,
    pub layer: i64,
    pub module: String,
    pub role: String,
    /// Rows cast (the dumped rows) and the tensor's.
    pub rows: usize,
    pub tensor_rows: usize,
    pub cols: usize,
    /// Whether the dump holds the whole tensor.
    pub whole: bool,
    pub format: &'static str,
    /// Finite non-zero values that dequantize to zero (their code flushed, or their block's
    /// scale), over the finite non-zero values.
    pub underflow_frac: f64,
    /// Values the cast clamps to the format's largest magnitude, over all values.
    pub saturated_frac: f64,
    pub mse: f64,
    pub cosine: f64,
    /// 10·log10(mean x² / MSE) in dB; None when the cast is exact (MSE 0).
    pub sqnr_db: Option<f64>,
}

/// The cast of `format` for a tensor of `role`.
fn cast_of(format: &str, role: &str) -> Option<OperandCast> {
    let weight = role == "weight";
    Some(match format {
        "e4m3" => OperandCast::Fp8Tensor { format: Fp8Format::E4M3, scale: ScaleSource::Current { margin: 0 } },
        "e5m2" => OperandCast::Fp8Tensor { format: Fp8Format::E5M2, scale: ScaleSource::Current { margin: 0 } },
        "mxfp8" => OperandCast::Mxfp8 { format: Fp8Format::E4M3, rounding: E8m0Rounding::Te, tile_rows: 1, tile_cols: 32 },
        "nvfp4" => OperandCast::Nvfp4 { tile_rows: if weight { 16 } else { 1 }, tile_cols: 16, rht: false, stochastic_seed: None },
        "block" => OperandCast::Fp8Block { format: Fp8Format::E4M3, tile_rows: if weight { 128 } else { 1 }, tile_cols: 128, margin: 0 },
        _ => return None,
    })
}

/// Checks a `--formats` list against [`FORMATS`].
pub fn parse_formats(list: &str) -> Result<Vec<&'static str>, String> {
    let mut out = Vec::new();
    for f in list.split(',').map(str::trim).filter(|f| !f.is_empty()) {
        match FORMATS.iter().find(|&&k| k == f) {
            Some(&k) if !out.contains(&k) => out.push(k),
            Some(_) => {}
            None => return Err(format!("--formats: unknown format '{f}' (known: {})", FORMATS.join(", "))),
        }
    }
    if out.is_empty() {
        return Err(format!("--formats: name at least one of {}", FORMATS.join(", ")));
    }
    Ok(out)
}

/// One tensor under one format: its row, from the exact CPU cast.
pub fn whatif_tensor(x: &[f32], rows: usize, cols: usize, format: &'static str, role: &str) -> Option<(usize, f64, f64, f64, f64, Option<f64>)> {
    let how = cast_of(format, role)?;
    let cast = cast_operand(x, rows, cols, how, OperandFault::NONE, StatsLevel::Full, false);
    let r = &cast.report;
    let q = r.quant_error?;
    // Underflow as the GEMM sees it: a finite non-zero value whose dequantized value is 0, whether
    // its own code flushed or its block's scale did (NVFP4's E4M3 block scales can).
    let (flushed, nonzero) = x.iter().zip(&cast.dequantized).fold((0u64, 0u64), |(f, n), (&v, &d)| {
        let live = v.is_finite() && v != 0.0;
        (f + u64::from(live && d == 0.0), n + u64::from(live))
    });
    let frac = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let (sum_sq, n) = x.iter().filter(|v| v.is_finite()).fold((0.0f64, 0u64), |(s, n), &v| (s + f64::from(v) * f64::from(v), n + 1));
    let mean_sq = if n == 0 { 0.0 } else { sum_sq / n as f64 };
    let sqnr = (q.mse > 0.0 && mean_sq > 0.0).then(|| 10.0 * (mean_sq / q.mse).log10());
    Some((r.numel as usize, frac(flushed, nonzero), frac(r.saturated, r.numel), q.mse, q.cos, sqnr))
}

/// Every usable dump of `run` (leading whole rows of a 2-D quantized operand; at `steps`, every
/// dump step when empty; of `module` when given) under every format of `formats`, in step, layer,
/// module, role, format order. Also the number of dumps left out (strided samples, chunks past the
/// first rows, tensors that are not 2-D).
pub fn whatif(run: &Run, formats: &[&'static str], steps: &[i64], module: Option<&str>) -> Result<(Vec<WhatIfRow>, usize), AnalyzeError> {
    let quantized: Vec<&str> = fp8scope_schemas::names::Role::QUANTIZED.iter().map(|r| r.as_str()).collect();
    let mut lf = run
        .scan(Table::Tensors, &[col::STEP, col::LAYER, col::MODULE, col::ROLE, col::SHAPE, col::NUMEL, col::OFFSET, col::STRIDE, col::VALUES])?
        .filter(col(col::ROLE).is_in(lit(Series::new("q".into(), quantized)).implode(false), false));
    if !steps.is_empty() {
        lf = lf.filter(col(col::STEP).is_in(lit(Series::new("s".into(), steps.to_vec())).implode(false), false));
    }
    if let Some(m) = module {
        lf = lf.filter(col(col::MODULE).eq(lit(m.to_string())));
    }
    let df = run.collect(Table::Tensors, lf.sort([col::STEP, col::LAYER, col::MODULE, col::ROLE], Default::default()))?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "tensors", e);
    let (st, la, mo, ro) =
        (i64s(&df, col::STEP).map_err(e)?, i64s(&df, col::LAYER).map_err(e)?, strs(&df, col::MODULE).map_err(e)?, strs(&df, col::ROLE).map_err(e)?);
    let (nu, of, sd) = (i64s(&df, col::NUMEL).map_err(e)?, i64s(&df, col::OFFSET).map_err(e)?, i64s(&df, col::STRIDE).map_err(e)?);
    let shapes = df.column(col::SHAPE).and_then(|c| c.list().cloned()).map_err(e)?;
    let values = df.column(col::VALUES).and_then(|c| c.list().cloned()).map_err(e)?;
    let mut tensors = Vec::new();
    let mut partial = 0;
    for i in 0..df.height() {
        let (Some(step), Some(layer), Some(module), Some(role)) = (st[i], la[i], mo[i].clone(), ro[i].clone()) else { continue };
        let shape: Vec<i64> = shapes.get_as_series(i).and_then(|s| s.i64().ok().map(|c| c.into_no_null_iter().collect())).unwrap_or_default();
        let vals: Vec<f32> = values.get_as_series(i).and_then(|s| s.f32().ok().map(|c| c.iter().map(|v| v.unwrap_or(f32::NAN)).collect())).unwrap_or_default();
        let leading = of[i] == Some(0) && sd[i] == Some(1);
        let cols = shape.get(1).copied().unwrap_or(0);
        if shape.len() != 2 || !leading || cols <= 0 || vals.is_empty() || vals.len() as i64 % cols != 0 || vals.len() as i64 > shape[0] * cols {
            partial += 1;
            continue;
        }
        let whole = nu[i] == Some(vals.len() as i64);
        tensors.push((step, layer, module, role, vals.len() / cols as usize, shape[0] as usize, cols as usize, whole, vals));
    }
    let rows: Vec<WhatIfRow> = tensors
        .par_iter()
        .flat_map_iter(|(step, layer, module, role, r, tr, c, whole, vals)| {
            formats.iter().filter_map(move |&format| {
                let (_, underflow_frac, saturated_frac, mse, cosine, sqnr_db) = whatif_tensor(vals, *r, *c, format, role)?;
                Some(WhatIfRow {
                    step: *step,
                    layer: *layer,
                    module: module.clone(),
                    role: role.clone(),
                    rows: *r,
                    tensor_rows: *tr,
                    cols: *c,
                    whole: *whole,
                    format,
                    underflow_frac,
                    saturated_frac,
                    mse,
                    cosine,
                    sqnr_db,
                })
            })
        })
        .collect();
    Ok((rows, partial))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_format_list_is_checked_and_each_format_casts_as_documented() {
        assert_eq!(parse_formats("e4m3, nvfp4,e4m3"), Ok(vec!["e4m3", "nvfp4"]));
        assert!(parse_formats("fp6").unwrap_err().contains("unknown format 'fp6'"));
        assert!(parse_formats(" , ").is_err());
        // A tensor whose values sit on the E4M3 grid at scale 1 after current scaling: exact.
        let x: Vec<f32> = (0..64).map(|i| if i == 0 { 448.0 } else { (i % 8) as f32 * 0.5 }).collect();
        let (n, under, sat, mse, cos, sqnr) = whatif_tensor(&x, 2, 32, "e4m3", "activation").unwrap();
        assert_eq!((n, under, sat, mse, sqnr), (64, 0.0, 0.0, 0.0, None));
        assert!((cos - 1.0).abs() < 1e-12);
        // NVFP4 rounds 0.5 · 1.3 to the E2M1 grid: an error, and a finite SQNR.
        let y: Vec<f32> = (0..32).map(|i| 0.1 + i as f32 * 0.037).collect();
        let (_, _, _, mse, cos, sqnr) = whatif_tensor(&y, 1, 32, "nvfp4", "activation").unwrap();
        assert!(mse > 0.0 && cos < 1.0 && sqnr.is_some_and(|s| s > 10.0), "{mse} {cos} {sqnr:?}");
    }
}
