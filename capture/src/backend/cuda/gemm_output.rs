//! A linear layer's GEMM on the GPU and what it leaves in the layer's output buffer: the product
//! of the cast operands, the bias, the rounding to BF16, a planted NaN and the count of
//! non-finite results the step reports (the CPU reference: `layers/linear.rs`; the kernels:
//! `kernels/gemm_output.cu`).
//!
//! The GEMM does as much of it as cuBLASLt can, so that no pass over the output follows:
//! - a bias goes into cuBLASLt's epilogue, rounded to BF16 first (`bias_to_bf16`), with BF16 D:
//!   the output is round_bf16(acc + round_bf16(bias)), the CPU's values, written once;
//! - BF16 D goes straight into a BF16 output buffer;
//! - the non-finite count reads the output only when the GEMM could have produced a non-finite
//!   value (`gemm_nonfinite_count`: an operand's cast met a non-finite or huge value, an FP8
//!   operand's dequantisation factor is huge, or an operand was never cast); otherwise it is
//!   exactly 0, and the kernel returns at once.
//!
//! `gemm_epilogue` (a pass over D) remains for what cuBLASLt leaves: an f32 output buffer, an
//! accumulating GEMM, a planted NaN, and shapes whose bias or FP32 output cuBLASLt refuses.

use super::blas::{OpType, Operand};
use super::{CudaBackend, CudaError, DevBuf, cfg, grid_for, grow, step_graph};
use cudarc::driver::{CudaSlice, PushKernelArg};

/// A GEMM shape and types, as [`CudaBackend`] remembers what cuBLASLt refused for it.
pub(super) type ShapeKey = (usize, usize, usize, OpType, OpType, bool);

/// Blocks of `gemm_nonfinite_count`: it reads the output only when the step went wrong, so a
/// launch that finds nothing to count should cost no more than the launch.
const COUNT_BLOCKS: u32 = 132;

/// Where the GEMM left D, and what is left to do to it.
struct Product {
    /// Device address of D.
    ptr: u64,
    /// D holds BF16 values (else f32).
    bf16: bool,
    /// cuBLASLt's epilogue added the bias.
    bias_added: bool,
}

/// The GEMM `D (rows × cols) = P · Qᵀ (+ bias)` of a linear layer, its operands cast.
pub(super) struct LinearGemm {
    pub rows: usize,
    pub cols: usize,
    pub k: usize,
    pub p: Operand,
    pub q: Operand,
    pub fast: bool,
}

impl LinearGemm {
    fn key(&self) -> ShapeKey {
        (self.rows, self.cols, self.k, self.p.ty, self.q.ty, self.fast)
    }
}

/// The largest finite value of an FP8 operand's format (0 for BF16): `gemm_nonfinite_count`'s bound.
fn fp8_max(ty: OpType) -> f32 {
    match ty {
        OpType::Bf16 => 0.0,
        OpType::E4M3 => crate::fp8::Fp8Format::E4M3.max(),
        OpType::E5M2 => crate::fp8::Fp8Format::E5M2.max(),
    }
}

impl CudaBackend {
    /// Runs `g` into `out` (`=`, or `+=` with `accumulate`), adding `bias` (one value a column),
    /// with a NaN planted at 0 if `nan_output`, and counts the output's non-finite values into the
    /// device word at `nonfinite` (0: not counted).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn linear_output(
        &mut self,
        g: &LinearGemm,
        out: &mut DevBuf,
        bias: Option<&CudaSlice<f32>>,
        accumulate: bool,
        nan_output: bool,
        nonfinite: u64,
    ) -> Result<(), CudaError> {
        let n_out = g.rows * g.cols;
        if out.len() < n_out {
            return Err(CudaError::Unsupported(format!("a GEMM of {} × {} into a buffer of {}", g.rows, g.cols, out.len())));
        }
        let d = self.linear_product(g, out, bias, accumulate)?;
        let outp = self.ptr(out.raw());
        let in_place = d.ptr == outp && out.is_bf16();
        if in_place && (d.bias_added || bias.is_none()) && !nan_output {
            if nonfinite != 0 {
                self.span("gemm.nonfinite", |me| me.count_nonfinite_output(g, outp, n_out, d.bias_added, nonfinite))?;
            }
            return Ok(());
        }
        let bias_ptr = if d.bias_added { 0 } else { bias.map(|b| self.ptr(b)).unwrap_or(0) };
        self.span("gemm.epilogue", |me| {
            launch!(
                me,
                "gemm_epilogue",
                grid_for(n_out, 256),
                outp,
                d.ptr,
                d.bf16 as i32,
                g.rows as u64,
                g.cols as i32,
                bias_ptr,
                accumulate as i32,
                nan_output as i32,
                nonfinite,
                out.is_bf16() as i32
            )
        })
    }

    /// cuBLASLt's `D = P · Qᵀ` of `g` into `d` (BF16 or f32, with the BF16 bias at `bias` or
    /// none): run now, or recorded while the step is recorded into CUDA graphs (`step_graph/`).
    fn lt_matmul(&mut self, g: &LinearGemm, d: u64, d_bf16: bool, bias: u64) -> Result<(), CudaError> {
        let recording = self.graph.borrow().is_recording();
        let prepare = |me: &mut Self, may_tune| me.lt.prepare(g.rows, g.cols, g.k, g.p, g.q, d, d_bf16, g.fast, bias, may_tune);
        let call = match prepare(self, !recording)? {
            Some(call) => call,
            // A shape first seen in a recorded step is timed now, which runs it: the step stops
            // recording first (its recorded ops launched before the timing).
            None => {
                self.leave_step_graph()?;
                prepare(self, true)?.ok_or_else(|| CudaError::Unsupported("a GEMM shape left untimed where timing was allowed".into()))?
            }
        };
        if !self.record_op(|| step_graph::Op::Lt(call))? {
            self.lt.execute(&call)?;
        }
        Ok(())
    }

    /// How many GEMM shapes cuBLASLt's candidates were timed for so far (a shape's first product
    /// without a cached algorithm; the tests of recorded steps, which must not time, ask it).
    pub fn gemm_shapes_timed(&self) -> usize {
        self.lt.shapes_timed()
    }

    /// The GEMM itself: BF16 D with the bias in cuBLASLt's epilogue where cuBLASLt takes it, else
    /// (a bias it refuses) FP32 D for `gemm_epilogue` to add the bias to, else BF16 D; into `out`
    /// when nothing is left to convert, else into scratch.
    fn linear_product(&mut self, g: &LinearGemm, out: &DevBuf, bias: Option<&CudaSlice<f32>>, accumulate: bool) -> Result<Product, CudaError> {
        let n_out = g.rows * g.cols;
        let key = g.key();
        let outp = self.ptr(out.raw());
        // D lands in `out` itself when `out` holds D's type, is assigned and nothing is left to
        // add to it; else in scratch.
        let dst = |me: &mut Self, into_out: bool| -> Result<u64, CudaError> {
            if into_out && !accumulate {
                Ok(outp)
            } else {
                grow(&me.stream, &mut me.d_tmp, n_out)?;
                Ok(me.ptr(&me.d_tmp))
            }
        };
        if let Some(b) = bias.filter(|_| !self.bias_refused.contains(&key)) {
            let d = dst(self, out.is_bf16())?;
            let bias16 = self.span("gemm.bias_round", |me| me.bias_to_bf16(b))?;
            match self.span("gemm.matmul", |me| me.lt_matmul(g, d, true, bias16)) {
                Ok(()) => return Ok(Product { ptr: d, bf16: true, bias_added: true }),
                Err(e) => {
                    if self.settings.verbose {
                        eprintln!("cuBLASLt: {e}; adding the bias after the GEMM for this shape");
                    }
                    self.bias_refused.insert(key);
                }
            }
        }
        // Without a bias, BF16 D rounds exactly as the epilogue would (round(acc)) and moves half
        // the bytes; with one, FP32 D keeps the single rounding of acc + bias, unless cuBLASLt
        // refuses FP32 D for the shape (some FP8 combinations).
        if bias.is_some() && !self.bf16_out.contains(&key) {
            let f32_dst = dst(self, !out.is_bf16())?;
            match self.span("gemm.matmul", |me| me.lt_matmul(g, f32_dst, false, 0)) {
                Ok(()) => return Ok(Product { ptr: f32_dst, bf16: false, bias_added: false }),
                Err(e) => {
                    if !(g.p.ty.is_fp8() || g.q.ty.is_fp8()) {
                        return Err(e);
                    }
                    if self.settings.verbose {
                        eprintln!("cuBLASLt: {e}; using BF16 output for this shape");
                    }
                    self.bf16_out.insert(key);
                }
            }
        }
        let bf16_dst = dst(self, out.is_bf16() && bias.is_none())?;
        self.span("gemm.matmul", |me| me.lt_matmul(g, bf16_dst, true, 0))?;
        Ok(Product { ptr: bf16_dst, bf16: true, bias_added: false })
    }

    /// `bias` rounded to BF16 into scratch (and its RISKY flag set), for cuBLASLt's epilogue;
    /// returns the scratch's device address.
    fn bias_to_bf16(&mut self, bias: &CudaSlice<f32>) -> Result<u64, CudaError> {
        let n = bias.len();
        grow(&self.stream, &mut self.bias16, n.div_ceil(2))?;
        let (b, o, f) = (self.ptr(bias), self.ptr(&self.bias16), self.ptr(&self.bias_flag));
        launch!(self, "bias_to_bf16", cfg((1, 1, 1), 1024), b, o, n as i32, f)?;
        Ok(o)
    }

    /// `gemm_nonfinite_count` on the BF16 output at `outp`: the count, or nothing when the
    /// operands' casts (and the bias, if the GEMM added it) rule a non-finite value out.
    fn count_nonfinite_output(&mut self, g: &LinearGemm, outp: u64, n: usize, bias_added: bool, nonfinite: u64) -> Result<(), CudaError> {
        let flag = if bias_added { self.ptr(&self.bias_flag) } else { 0 };
        let blocks = (n.div_ceil(8 * 256) as u32).clamp(1, COUNT_BLOCKS);
        launch!(
            self,
            "gemm_nonfinite_count",
            cfg((blocks, 1, 1), 256),
            outp,
            n as u64,
            g.p.slot,
            fp8_max(g.p.ty),
            g.q.slot,
            fp8_max(g.q.ty),
            g.k as i32,
            flag,
            nonfinite
        )
    }

    /// Clears the RISKY flags of the scale slots the step used, before the next step reuses them.
    pub(super) fn clear_slot_flags(&mut self, used: usize) -> Result<(), CudaError> {
        if used == 0 {
            return Ok(());
        }
        let s = self.ptr(&self.scales);
        launch!(self, "slot_flags_clear", cfg(((used as u32).div_ceil(256), 1, 1), 256), s, used as i32)
    }
}

#[cfg(test)]
mod tests {
    use super::super::kernels::Family;
    use super::super::{SLOT_FLOATS, SLOT_INV};

    #[test]
    fn the_scale_slot_layout_is_the_kernels() {
        // The host reads the scale at 0 and hands cuBLASLt the inverse at SLOT_INV of slots
        // SLOT_FLOATS apart; the casts write them there, and gemm_nonfinite_count reads them.
        for family in [Family::Cast, Family::CastSrc, Family::GemmOutput] {
            assert_eq!(family.define("SLOT_FLOATS"), SLOT_FLOATS, "{family:?}");
            assert_eq!(family.define("SLOT_INV"), SLOT_INV, "{family:?}");
        }
        // Both the scale and its inverse 16-byte aligned, as cuBLASLt requires of scale pointers.
        assert_eq!(SLOT_FLOATS * 4 % 16, 0);
        assert_eq!(SLOT_INV * 4 % 16, 0);
    }
}
