//! The linear layers' GEMMs on the GPU (the CPU reference: `layers/matmul.rs`). `linear` casts a
//! GEMM's two operands (`cast.rs`: once a step for the site's two GEMMs that use each), runs the
//! GEMM into the layer's output buffer (`gemm_output.rs`, `blas.rs`), adds the bias gradient from
//! the operand the wgrad GEMM read (`bias_grad.rs`), and queues the GEMM's report; the lm_head's
//! BF16 GEMMs take it with nothing recorded.

use super::{CudaBackend, CudaError, DevBuf, MAX_SLOTS, PendingGemm, PendingOp, Side, cast, gemm_output};
use crate::backend::operands::operand_shapes;
use crate::backend::{GemmCall, LinearDims, OperandCast, OperandFault, ScaleSource, ShadowError, StatsLevel};
use cudarc::driver::CudaSlice;
use fp8scope_schemas::names::Gemm;

impl CudaBackend {
    /// The linear-layer GEMM of `call` into `out` (= or, with `accumulate`, +=). Returns the
    /// pending report when `report` is set. With `share`, each operand is cast once for the two
    /// GEMMs of its site that use it ([`cast`]); the BF16 shadow GEMMs, which cast the same
    /// operands another way, do not share.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn linear(
        &mut self,
        call: &GemmCall,
        out: &mut DevBuf,
        a: cast::CastInput,
        b: cast::CastInput,
        bias: Option<&CudaSlice<f32>>,
        dbias: Option<&mut CudaSlice<f32>>,
        accumulate: bool,
        report: bool,
        share: bool,
    ) -> Result<(), CudaError> {
        let out_bf16 = out.is_bf16();
        if out_bf16 && accumulate {
            return Err(CudaError::Unsupported("a GEMM cannot accumulate into a BF16 buffer".into()));
        }
        let d = call.dims;
        let [(ar, ac), (br, bc)] = operand_shapes(call.id.gemm, d);
        // (rows, cols, k) of D = P·Qᵀ with P from A, Q from B (transposed as `operands_transposed`).
        let [ta, tb] = cast::operands_transposed(call.id.gemm);
        let (rows, cols, k) = match call.id.gemm {
            Gemm::Fprop => (d.n, d.m, d.k),
            Gemm::Dgrad => (d.n, d.k, d.m),
            Gemm::Wgrad => (d.m, d.k, d.n),
        };
        let level = if report { call.stats } else { StatsLevel::Amax };
        let [role_a, role_b] = call.id.gemm.operands();
        let site = (call.id.layer, call.id.module);
        let use_a = cast::CastUse { site, role: role_a, transposed: ta, share, column_sums: call.a_column_sums };
        let use_b = cast::CastUse { site, role: role_b, transposed: tb, share, column_sums: false };
        let (pa, slot_a) = self.span(a.span_name(), |me| me.cast(a, ar, ac, use_a, call.cast_a, call.fault_a, level, report, Side::P))?;
        let (pb, slot_b) = self.span(b.span_name(), |me| me.cast(b, br, bc, use_b, call.cast_b, call.fault_b, level, report, Side::Q))?;
        let n_out = rows * cols;
        let gemm_slot = self.next_gemm;
        let nf_ptr = if report {
            if gemm_slot >= MAX_SLOTS {
                return Err(CudaError::Unsupported(format!("more than {MAX_SLOTS} GEMMs in one step")));
            }
            self.next_gemm += 1;
            self.ptr(&self.nonfinite) + (gemm_slot * 8) as u64
        } else {
            0
        };
        let g = gemm_output::LinearGemm { rows, cols, k, p: pa, q: pb, fast: call.fast_accumulation };
        self.linear_output(&g, out, bias, accumulate, call.nan_output, nf_ptr)?;
        if let Some(db) = dbias {
            let column_slots = self.kept_column_sums(use_a, &pa);
            self.span("gemm.bias_grad", |me| me.bias_grad(pa, rows, k, db, column_slots))?;
        }
        if !report {
            return Ok(());
        }
        let qa = if call.keep_quantized[0] && pa.ty.is_fp8() { Some(self.operand_bytes(&pa, ar, ac, ta)?) } else { None };
        let qb = if call.keep_quantized[1] && pb.ty.is_fp8() { Some(self.operand_bytes(&pb, br, bc, tb)?) } else { None };
        let is_fp8 = pa.ty.is_fp8() || pb.ty.is_fp8();
        let shadow = if call.shadow && is_fp8 {
            // The same GEMM in BF16 on the same inputs, compared on the device (dump steps only).
            let bf = GemmCall {
                cast_a: OperandCast::Bf16,
                cast_b: OperandCast::Bf16,
                fault_a: OperandFault::NONE,
                fault_b: OperandFault::NONE,
                nan_output: false,
                shadow: false,
                keep_quantized: [false; 2],
                ..call.clone()
            };
            let mut reference = DevBuf::f32(self.stream.alloc_zeros::<f32>(n_out)?);
            self.linear(&bf, &mut reference, a, b, bias, None, false, false, false)?;
            let e = self.output_error_impl(out, &reference)?;
            // A gradient's dual is its BF16 value (as on the CPU); an fprop's, dY, comes with the
            // backward, which this backend does not pair: null.
            let (dual_inner, dual_norm) = if call.id.gemm == Gemm::Fprop { (None, None) } else { (Some(e.inner_with_reference), Some(e.reference_norm)) };
            Some(ShadowError { numel: n_out as u64, cosine: e.cosine, mse: e.mse, rel_l2: e.rel_l2, max_abs_diff: e.max_abs_diff, dual_inner, dual_norm })
        } else {
            None
        };
        let given = |c: OperandCast| match c {
            OperandCast::Fp8Tensor { scale: ScaleSource::Given { amax_used, .. }, .. } => Some(amax_used),
            _ => None,
        };
        let (sa, sb) = (slot_a.unwrap_or(0), slot_b.unwrap_or(0));
        self.pending.push(PendingGemm {
            id: call.id,
            a: PendingOp {
                slot: sa,
                role: role_a,
                format: pa.ty.name(),
                fp8: pa.ty.is_fp8(),
                level,
                given_amax: given(call.cast_a),
                numel: (ar * ac) as u64,
                quantized: qa,
            },
            b: PendingOp {
                slot: sb,
                role: role_b,
                format: pb.ty.name(),
                fp8: pb.ty.is_fp8(),
                level,
                given_amax: given(call.cast_b),
                numel: (br * bc) as u64,
                quantized: qb,
            },
            gemm_slot,
            shadow,
        });
        Ok(())
    }

    /// The lm_head's forward: out (n, m) `=` inp (n, k) · w (m, k)ᵀ, BF16 operands, nothing recorded.
    pub(super) fn matmul_bf16_fwd_impl(&mut self, out: &mut DevBuf, inp: &CudaSlice<f32>, w: &CudaSlice<f32>, dims: LinearDims) -> Result<(), CudaError> {
        self.linear(&plain_call(Gemm::Fprop, dims), out, cast::CastInput::Buf(inp), cast::CastInput::Buf(w), None, None, false, false, true)
    }

    /// The lm_head's backward: dinp (=) dout·w, dw (+=) doutᵀ·inp, BF16 operands, nothing recorded.
    /// A `dout` held in BF16 (the cross-entropy's gradient of BF16 logits) is the operand as it is;
    /// an f32 one is cast once and kept for the wgrad.
    pub(super) fn matmul_bf16_bwd_impl(
        &mut self,
        dinp: &mut DevBuf,
        dw: &mut DevBuf,
        dout: &DevBuf,
        inp: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        dims: LinearDims,
    ) -> Result<(), CudaError> {
        let a = || if dout.is_bf16() { cast::CastInput::Held(dout) } else { cast::CastInput::Buf(dout.raw()) };
        self.linear(&plain_call(Gemm::Dgrad, dims), dinp, a(), cast::CastInput::Buf(w), None, None, false, false, true)?;
        self.linear(&plain_call(Gemm::Wgrad, dims), dw, a(), cast::CastInput::Buf(inp), None, None, true, false, true)
    }
}

/// A BF16 GEMM call with nothing recorded (the lm_head).
fn plain_call(gemm: Gemm, dims: LinearDims) -> GemmCall {
    // The lm_head: a site of its own (outside the layer stack) for the casts it keeps.
    let id = crate::backend::GemmId { layer: u32::MAX, module: fp8scope_schemas::names::Module::Qkv, gemm };
    GemmCall::bf16(id, dims)
}
