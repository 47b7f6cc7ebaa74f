//! GEMMs whose operand is an activation function's output or gradient, computed as the operand is
//! cast (`Backend::gemm_of_activation`, `Backend::gemm_of_activation_grad`): fc2's fprop reads
//! act = SwiGLU(h) or GELU(h), fc1's dgrad reads dh = their backward, each from fc1's saved output
//! h (and dact). Unfused, a kernel of `kernels/swiglu.cu` or `gelu.cu` writes act or dh in f32 and
//! the cast reads it back; fused, the cast kernel of a computed source (`kernels/cast.cu`:
//! `cast_src_*`) computes each value with the same element math (`kernels/activations.cuh`) as it
//! loads it, so the codes and statistics are bit-identical and the f32 tensor is neither written
//! nor read. For BF16 operands and FP8 ones of one scale per tensor (see `computes_operand`). The cast is kept for the site's
//! wgrad under the unwritten buffer's address (`cast.rs`: `CastInput::Computed`), so the wgrad
//! takes it as it takes any kept cast.

use super::cast::{CastInput, SRC_DGELU, SRC_DSWIGLU, SRC_GELU, SRC_SWIGLU, computable};
use super::{CudaBackend, DevBuf};
use crate::backend::operands::operand_shapes;
use crate::backend::{Activation, Backend, GemmCall, OperandCast, ScaleSource, StatsLevel};

impl CudaBackend {
    /// Whether `call`'s operand a is computed as it is cast ([`Self::computes_operand_of`]).
    pub(super) fn computes_operand(&self, call: &GemmCall, inputs_ok: bool) -> bool {
        self.computes_operand_of(call, 0, inputs_ok)
    }

    /// Whether `call`'s operand `operand` (0: a, 1: b) is computed as it is cast: a BF16 operand or
    /// an FP8 one of one scale per tensor (given, or current: the amax pass is then the computed
    /// source's own kernel), not beside a BF16 shadow GEMM (which casts the operand again, from the
    /// buffer), statistics below the full level (the computed-source kernels are compiled for the amax
    /// and cheap levels; the channels level is the cheap kernel with channel targets),
    /// inputs the kernel reads (`inputs_ok`: for the activations BF16 inputs and rows of a
    /// multiple of 4 values, [`computable`]), and no error kept.
    ///
    /// For an FP8 operand the computed source's tiled cast writes both layouts, as the plain dual
    /// cast does, from the layer's inputs instead of the f32 tensor its kernel would have written.
    pub(super) fn computes_operand_of(&self, call: &GemmCall, operand: usize, inputs_ok: bool) -> bool {
        let how = if operand == 0 { call.cast_a } else { call.cast_b };
        let castable = match how {
            OperandCast::Bf16 => true,
            OperandCast::Fp8Tensor { scale, .. } => matches!(scale, ScaleSource::Given { .. } | ScaleSource::Current { .. }),
            OperandCast::Fp8Block { .. } | OperandCast::Mxfp8 { .. } | OperandCast::Nvfp4 { .. } => false,
        };
        self.error.is_none() && castable && !call.shadow && call.stats <= StatsLevel::Channels && inputs_ok
    }

    /// Whether an activation source of `kind` from `h` (and `b`) is computable for `call`'s
    /// operand a ([`computable`] at its width).
    fn activation_computable(call: &GemmCall, kind: i32, h: &DevBuf, b: Option<&DevBuf>) -> bool {
        computable(kind, operand_shapes(call.id.gemm, call.dims)[0].1, h, b)
    }

    /// See [`Backend::gemm_of_activation`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gemm_of_activation_impl(
        &mut self,
        call: &GemmCall,
        out: &mut DevBuf,
        act: &mut DevBuf,
        h: &DevBuf,
        kind: Activation,
        w: &DevBuf,
        bias: Option<&DevBuf>,
    ) -> bool {
        let src = match kind {
            Activation::Gelu => SRC_GELU,
            Activation::Swiglu { .. } => SRC_SWIGLU,
        };
        if !self.computes_operand(call, Self::activation_computable(call, src, h, None)) {
            self.activation_fwd(act, h, kind);
            self.gemm(call, out, act, w, bias, None);
            return true;
        }
        let a = CastInput::Computed { kind: src, h, b: None, like: act };
        self.spanned("gemm", |me| me.linear(call, out, a, CastInput::Buf(w), bias.map(|b| &**b), None, false, true, true));
        false
    }

    /// See [`Backend::gemm_of_activation_grad`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gemm_of_activation_grad_impl(
        &mut self,
        call: &GemmCall,
        out: &mut DevBuf,
        dh: &mut DevBuf,
        h: &DevBuf,
        dact: &DevBuf,
        kind: Activation,
        w: &DevBuf,
    ) -> bool {
        let src = match kind {
            Activation::Gelu => SRC_DGELU,
            Activation::Swiglu { .. } => SRC_DSWIGLU,
        };
        if !self.computes_operand(call, Self::activation_computable(call, src, h, Some(dact))) {
            self.activation_bwd(dh, h, dact, kind);
            self.gemm(call, out, dh, w, None, None);
            return true;
        }
        let a = CastInput::Computed { kind: src, h, b: Some(dact), like: dh };
        self.spanned("gemm", |me| me.linear(call, out, a, CastInput::Buf(w), None, None, false, true, true));
        false
    }
}
