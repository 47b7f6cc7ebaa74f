//! GEMM operands held in BF16 buffers (`Backend::gemm` on a [`DevBuf`] stored in 16 bits): the
//! attention's output, which proj's fprop and wgrad read, and GPT's dqkv, which qkv's dgrad and
//! wgrad read. The CPU reference is the same GEMM on the f32 values (`layers/matmul.rs`): a BF16
//! buffer holds exactly the values an f32 one would, so every code and statistic is the same.
//!
//! Such an operand is cast by the computed-source kernel of kind SRC_BF16 (`kernels/cast_src.cuh`),
//! which widens each value to f32 as it loads it: no f32 copy is written or read, and the cast is
//! kept for the site's other GEMM under the buffer's own address, as an f32 buffer's is. A BF16
//! operand is not even cast: its codes are the buffer's bits, so the GEMMs read the buffer and the
//! kernel computes only the statistics and column sums (`cast.rs`: `cast_bf16_as_is`). Where the
//! computed-source kernels do not go (statistics at the full level, a BF16 shadow GEMM beside the
//! GEMM, rows of a width that is not a multiple of 4, an error kept), the values are first widened
//! into a scratch buffer (`widen_bf16`), and the plain cast reads that.

use super::cast::{CastInput, SRC_BF16, computable};
use super::{CudaBackend, CudaError, DevBuf, grid_for, grow};
use crate::backend::GemmCall;
use crate::backend::operands::operand_shapes;
use cudarc::driver::{CudaSlice, PushKernelArg};

impl CudaBackend {
    /// `call`'s GEMM (`Backend::gemm`) on operands a and b, either of which may hold BF16 values.
    pub(super) fn gemm_of_buffers(
        &mut self,
        call: &GemmCall,
        out: &mut DevBuf,
        a: &DevBuf,
        b: &DevBuf,
        bias: Option<&CudaSlice<f32>>,
        dbias: Option<&mut CudaSlice<f32>>,
    ) -> Result<(), CudaError> {
        let shapes = operand_shapes(call.id.gemm, call.dims);
        // The operands widened into scratch first (the scratch is taken out of `self` while the
        // GEMM borrows it, and put back after).
        let mut widened: [Option<CudaSlice<f32>>; 2] = [None, None];
        let mut result = Ok(());
        for (i, x) in [a, b].into_iter().enumerate() {
            let cols = shapes[i].1;
            if result.is_ok() && x.is_bf16() && !self.computes_operand_of(call, i, computable(SRC_BF16, cols, x, None)) {
                // An allocation that fails is kept as the result, like a failed widening, so
                // that a scratch already taken out is put back below.
                let scratch = match self.widened[i].take() {
                    Some(s) => Ok(s),
                    None => self.stream.alloc_zeros::<f32>(1).map_err(CudaError::from),
                };
                match scratch {
                    Ok(mut s) => {
                        result = self.widen(&mut s, x);
                        self.widened_operands += 1;
                        widened[i] = Some(s);
                    }
                    Err(e) => result = Err(e),
                }
            }
        }
        if result.is_ok() {
            let [wa, wb] = &widened;
            result = self.linear(call, out, held_input(a, wa.as_ref()), held_input(b, wb.as_ref()), bias, dbias, false, true, true);
        }
        for (i, w) in widened.into_iter().enumerate() {
            if w.is_some() {
                self.widened[i] = w;
            }
        }
        result
    }

    /// How many BF16 GEMM operands were widened into scratch so far (the rest were cast from their
    /// buffers): for the tests that hold both ways to the same bits.
    pub fn bf16_operands_widened(&self) -> u64 {
        self.widened_operands
    }

    /// scratch = the values of the BF16 buffer `x`, as f32 (exact), grown to hold them.
    fn widen(&mut self, scratch: &mut CudaSlice<f32>, x: &DevBuf) -> Result<(), CudaError> {
        let n = x.len();
        grow(&self.stream, scratch, n.max(1))?;
        let (out, h) = (self.ptr(scratch), self.ptr(x.raw()));
        launch!(self, "widen_bf16", grid_for(n, 256), out, h, n as u64)
    }
}

/// What the cast of operand `x` reads: its f32 values; or, for a BF16 buffer, its widened copy
/// when there is one, else the buffer itself through the computed-source kernel (SRC_BF16).
fn held_input<'a>(x: &'a DevBuf, widened: Option<&'a CudaSlice<f32>>) -> CastInput<'a> {
    match widened {
        Some(w) => CastInput::Buf(w),
        None if x.is_bf16() => CastInput::Computed { kind: SRC_BF16, h: x, b: None, like: x },
        None => CastInput::Buf(x),
    }
}
