//! Cross-entropy on the GPU: the launchers of `kernels/loss.cu` (the CPU reference is
//! `layers/loss.rs`). One block per token computes its loss and overwrites its row of logits with
//! the dlogits in the same pass (forward and backward fused, as on the CPU): `crossentropy_smem_fwd`
//! where the row fits in a block's shared memory (it reads the logits once), `crossentropy_fwd`
//! (three reads) otherwise; both give the same bits.

use super::{CudaBackend, CudaError, CudaTokens, cfg};
use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaFunction, CudaSlice, PushKernelArg};
use std::collections::HashMap;

/// Threads per block (kernels/loss.cu: LOSS_THREADS).
const THREADS: u32 = 512;
/// The dynamic shared memory `crossentropy_smem_fwd` asks to be allowed: the most a block may
/// take on an H100 or H200 (227 KiB), less 1 KiB for the kernel's static reductions. A row of V
/// logits takes 4 V bytes: up to V = 57,856.
const ROW_SMEM_MAX: usize = 226 * 1024;

/// Lets `crossentropy_smem_fwd` take up to [`ROW_SMEM_MAX`] bytes of shared memory; returns the
/// bytes granted, 0 where the GPU refuses (its rows then take `crossentropy_fwd`).
pub(super) fn configure(funcs: &HashMap<&'static str, CudaFunction>) -> Result<usize, CudaError> {
    funcs.get("crossentropy_smem_fwd").ok_or(CudaError::MissingKernel("crossentropy_smem_fwd"))?;
    Ok(loss_row_smem_granted(funcs))
}

/// The bytes `crossentropy_smem_fwd` is allowed ([`configure`]), 0 where refused.
fn loss_row_smem_granted(funcs: &HashMap<&'static str, CudaFunction>) -> usize {
    let Some(f) = funcs.get("crossentropy_smem_fwd") else { return 0 };
    f.set_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, ROW_SMEM_MAX as i32).map(|_| ROW_SMEM_MAX).unwrap_or(0)
}

impl CudaBackend {
    /// Whether rows that fit take `crossentropy_smem_fwd` (the default where the GPU allows it) or
    /// every row `crossentropy_fwd`: for the test that holds the two to the same bits. Returns
    /// whether the shared-memory kernel is now in use.
    pub fn set_loss_rows_in_shared_memory(&mut self, on: bool) -> bool {
        self.loss_row_smem = if on { loss_row_smem_granted(&self.funcs) } else { 0 };
        self.loss_row_smem > 0
    }

    /// losses (N) `=` −log softmax(logits)[target]; `logits` (N, V) is then overwritten with the
    /// dlogits (softmax − onehot)·dloss.
    pub(super) fn crossentropy_fwd_impl(&mut self, losses: &mut CudaSlice<f32>, logits: &mut CudaSlice<f32>, targets: &CudaTokens, v: usize, dloss: f32) -> Result<(), CudaError> {
        let n = logits.len().checked_div(v).ok_or_else(|| CudaError::Unsupported("crossentropy_fwd with V = 0".into()))?;
        let (l, x, t) = (self.ptr(losses), self.ptr(logits), self.ptr(&targets.ids));
        let row_bytes = 4 * v;
        if row_bytes <= self.loss_row_smem {
            let mut lc = cfg((n as u32, 1, 1), THREADS);
            lc.shared_mem_bytes = row_bytes as u32;
            launch!(self, "crossentropy_smem_fwd", lc, l, x, t, v as i32, dloss)
        } else {
            launch!(self, "crossentropy_fwd", cfg((n as u32, 1, 1), THREADS), l, x, t, v as i32, dloss)
        }
    }
}
