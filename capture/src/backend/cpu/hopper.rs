//! A linear layer's FP8 GEMM as Hopper's tensor cores and cuBLASLt compute it
//! (`--cpu-accumulator hopper`): the codes multiplied and accumulated by
//! [`crate::accumulator`], then cuBLASLt's epilogue as modelled here: the product of the two
//! dequantisation factors (each `1/scale`, as the GPU's casts store them), the accumulator times
//! it, plus the BF16-rounded bias, each an FP32 operation rounded to nearest, and the result
//! rounded to BF16.

use super::cast::{TensorCodes, to_bf16};
use crate::accumulator::{self, CodeRows, Mode};
use crate::backend::LinearDims;
use fp8scope_schemas::names::Gemm;
use rayon::prelude::*;

/// `gemm`'s output (the layout of `raw_gemm`: fprop n×m, dgrad n×k, wgrad m×k) from operand a's
/// and b's codes (in their row-major layouts: see `GemmCall`), accumulated in `mode`.
pub fn linear_gemm(gemm: Gemm, a: &TensorCodes, b: &TensorCodes, bias: Option<&[f32]>, d: LinearDims, mode: Mode) -> Vec<f32> {
    let LinearDims { n, k, m } = d;
    // Both operands K-major (cuBLASLt's TN), as the GPU hands them over.
    let (ak, bk, kk) = match gemm {
        // X (n×k) · Wᵀ: W (m×k) is already K-major.
        Gemm::Fprop => (None, None, k),
        // dY (n×m) · W: K is m; W's columns, so Wᵀ (k×m).
        Gemm::Dgrad => (None, Some(accumulator::transpose(&b.codes, m, k)), m),
        // dYᵀ · X: K is n; dYᵀ (m×n) and Xᵀ (k×n).
        Gemm::Wgrad => (Some(accumulator::transpose(&a.codes, n, m)), Some(accumulator::transpose(&b.codes, n, k)), n),
    };
    let rows_a = CodeRows { codes: ak.as_deref().unwrap_or(&a.codes), format: a.format, k: kk };
    let rows_b = CodeRows { codes: bk.as_deref().unwrap_or(&b.codes), format: b.format, k: kk };
    let mut out = accumulator::gemm_tn(&rows_a, &rows_b, mode);
    let factor = (1.0f32 / a.scale) * (1.0f32 / b.scale);
    let cols = match gemm {
        Gemm::Fprop => m,
        Gemm::Dgrad | Gemm::Wgrad => k,
    };
    out.par_chunks_mut(cols.max(1)).for_each(|row| {
        for (j, v) in row.iter_mut().enumerate() {
            let scaled = *v * factor;
            *v = to_bf16(bias.map_or(scaled, |b| scaled + b[j]));
        }
    });
    out
}
