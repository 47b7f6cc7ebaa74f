//! Turns what a step measured (GEMM reports, dumps) into the rows of the stats, tensors, events and
//! shadow tables.

use crate::backend::{CastReport, GemmReport};
use crate::model::DumpCapture;
use fp8scope_schemas::names::{Gemm, Role, Site};
use fp8scope_schemas::tables::{CastRow, EventRow, ShadowRow, StatRow, TensorRow};

fn frac(count: u64, of: u64) -> f64 {
    if of == 0 { 0.0 } else { count as f64 / of as f64 }
}

/// A stats row from one operand cast (`moments` must have been measured).
pub fn stat_row(step: u32, report: &GemmReport, cast: &CastReport) -> Option<StatRow> {
    let m = cast.moments?;
    let role = cast.role?;
    let nonzero = cast.numel - cast.zeros - cast.nan - cast.inf;
    Some(StatRow {
        step,
        layer: report.id.layer,
        module: report.id.module,
        gemm: report.id.gemm,
        role,
        format: cast.format,
        scale: cast.scale,
        amax: cast.amax,
        amax_used: cast.amax_used,
        numel: cast.numel,
        underflow_frac: frac(cast.underflow, nonzero),
        saturated_frac: frac(cast.saturated, cast.numel),
        nan_count: cast.nan,
        inf_count: cast.inf,
        zero_frac: frac(cast.zeros, cast.numel),
        min: m.min,
        max: m.max,
        mean: m.mean,
        std: m.std,
        dynamic_range_log2: m.dynamic_range_log2,
        quant_mse: cast.quant_error.map(|e| e.mse),
        quant_cos: cast.quant_error.map(|e| e.cos),
        amax_channel: cast.channels.and_then(|c| c.amax_channel),
        top_channel_sq_frac: cast.channels.and_then(|c| c.top_channel_sq_frac),
        rank: None,
        quant_bias: cast.quant_error.map(|e| e.bias),
        flip_frac: cast.weight_motion.map(|w| frac(w.flips, cast.numel)),
        flip_ratio: cast.weight_motion.and_then(|w| w.flip_ratio()),
        block_scales: cast.blocks.as_ref().filter(|b| b.blocks > 0).map(|b| fp8scope_schemas::tables::BlockScaleStats {
            count: b.blocks,
            log2_mean: b.log2_mean,
            log2_std: b.log2_std,
            log2_min: b.log2_min,
            log2_max: b.log2_max,
            saturated_frac: b.saturated as f64 / b.blocks as f64,
            flushed_frac: b.flushed as f64 / b.blocks as f64,
            log2_hist: b.hist.clone(),
        }),
    })
}

/// A casts row from one FP8 operand cast (None for a BF16 operand): the scale it used, this rank's
/// own amax and the amax the scale came from. The rank is set by the writer.
pub fn cast_row(step: u32, report: &GemmReport, cast: &CastReport) -> Option<CastRow> {
    let role = cast.role?;
    if cast.format == "bf16" || !role.is_quantized() {
        return None;
    }
    Some(CastRow {
        step,
        rank: None,
        layer: report.id.layer,
        module: report.id.module.as_str().to_string(),
        gemm: report.id.gemm,
        role,
        source: "fp8-capture".into(),
        format: Some(cast.format.to_string()),
        scale: Some(cast.scale),
        amax_local: Some(cast.amax),
        amax_used: Some(cast.amax_used),
        numel: Some(cast.numel),
        digest: None,
        audit_checked: None,
        audit_mismatched: None,
        master_checked: None,
        master_mismatched: None,
        master_changed: None,
        forward_changed: None,
    })
}

/// A `nonfinite_tensor` event for `role` of the GEMM `r`.
fn nonfinite_event(step: u32, r: &GemmReport, role: Option<Role>, count: u64, what: String) -> EventRow {
    EventRow {
        step,
        kind: "nonfinite_tensor".into(),
        layer: Some(r.id.layer),
        module: Some(r.id.module),
        gemm: Some(r.id.gemm),
        role,
        value: Some(count as f64),
        message: format!(
            "{what} in {}.{} ({} {})",
            Site::new(r.id.layer, r.id.module),
            role.map(|x| x.as_str()).unwrap_or("?"),
            if role == Some(r.id.gemm.result()) { "result of" } else { "operand of" },
            r.id
        ),
        rank: None,
    }
}

/// Events for non-finite operands and outputs, in execution order of the reports.
pub fn nonfinite_events(step: u32, reports: &[GemmReport]) -> Vec<EventRow> {
    let mut out = Vec::new();
    for r in reports {
        for c in [&r.a, &r.b] {
            if c.nan + c.inf > 0 {
                out.push(nonfinite_event(step, r, c.role, c.nan + c.inf, format!("{} nan and {} inf", c.nan, c.inf)));
            }
        }
        if r.output_nonfinite > 0 {
            out.push(nonfinite_event(step, r, Some(r.id.gemm.result()), r.output_nonfinite, format!("{} non-finite values", r.output_nonfinite)));
        }
    }
    out
}

/// Number of tensors (operands and results) with a non-finite value.
pub fn count_nonfinite_tensors(reports: &[GemmReport]) -> u32 {
    reports.iter().map(|r| (r.a.nan + r.a.inf > 0) as u32 + (r.b.nan + r.b.inf > 0) as u32 + (r.output_nonfinite > 0) as u32).sum()
}

pub fn shadow_rows(step: u32, reports: &[GemmReport]) -> Vec<ShadowRow> {
    reports
        .iter()
        .filter_map(|r| {
            let s = r.shadow?;
            Some(ShadowRow {
                step,
                layer: r.id.layer,
                module: r.id.module,
                gemm: r.id.gemm,
                numel: s.numel,
                cosine: s.cosine,
                mse: s.mse,
                rel_l2: s.rel_l2,
                max_abs_diff: s.max_abs_diff,
                rank: None,
                dual_inner: s.dual_inner,
                dual_norm: s.dual_norm,
            })
        })
        .collect()
}

/// The GEMMs whose cast of a quantized role supplies the dumped FP8 bytes, in preference order
/// (the operand's own layout first), as (GEMM, operand index).
pub fn byte_sources(role: Role) -> &'static [(Gemm, usize)] {
    match role {
        Role::Activation => &[(Gemm::Fprop, 0), (Gemm::Wgrad, 1)],
        Role::Weight => &[(Gemm::Fprop, 1), (Gemm::Dgrad, 1)],
        Role::Gradient => &[(Gemm::Dgrad, 0), (Gemm::Wgrad, 0)],
        _ => &[],
    }
}

/// Tensor rows for the dumps of a step, with the FP8 bytes (and scales) of the sampled elements
/// from the first FP8 GEMM that cast the tensor.
pub fn tensor_rows(step: u32, dumps: Vec<DumpCapture>, reports: &[GemmReport]) -> Vec<TensorRow> {
    dumps
        .into_iter()
        .map(|d| {
            let mut row = TensorRow {
                step,
                layer: d.site.layer,
                module: d.site.module,
                role: d.role,
                gemm: None,
                format: None,
                shape: vec![d.shape.0 as u64, d.shape.1 as u64],
                offset: d.offset as u64,
                stride: d.stride as u64,
                values: d.values,
                fp8: None,
                scale: None,
                block_scales: None,
                block_rows: None,
                block_cols: None,
                rank: None,
            };
            for &(gemm, operand) in byte_sources(d.role) {
                let Some(r) = reports.iter().find(|r| r.id.layer == d.site.layer && r.id.module == d.site.module && r.id.gemm == gemm) else { continue };
                let cast = if operand == 0 { &r.a } else { &r.b };
                let Some(q) = &cast.quantized else { continue };
                let n = row.values.len();
                row.fp8 = Some((0..n).map(|i| q[d.offset + i * d.stride]).collect());
                row.gemm = Some(gemm);
                row.format = Some(cast.format);
                match &cast.block_scales {
                    Some((scales, tr, tc)) => {
                        row.block_scales = Some(scales.clone());
                        row.block_rows = Some(*tr as u32);
                        row.block_cols = Some(*tc as u32);
                    }
                    None => row.scale = Some(cast.scale),
                }
                break;
            }
            row
        })
        .collect()
}
