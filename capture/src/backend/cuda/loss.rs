//! Cross-entropy on the GPU: the launcher of `crossentropy_fwd` in `kernels/loss.cu` (the CPU
//! reference is `layers/loss.rs`). One block per token computes its loss and overwrites its row of
//! logits with the dlogits in the same pass (forward and backward fused, as on the CPU).

use super::{CudaBackend, CudaError, CudaTokens, cfg};
use cudarc::driver::{CudaSlice, PushKernelArg};

/// Threads per block (kernels/loss.cu: LOSS_THREADS).
const THREADS: u32 = 512;

impl CudaBackend {
    /// losses (N) `=` −log softmax(logits)[target]; `logits` (N, V) is then overwritten with the
    /// dlogits (softmax − onehot)·dloss.
    pub(super) fn crossentropy_fwd_impl(&mut self, losses: &mut CudaSlice<f32>, logits: &mut CudaSlice<f32>, targets: &CudaTokens, v: usize, dloss: f32) -> Result<(), CudaError> {
        let n = logits.len().checked_div(v).ok_or_else(|| CudaError::Unsupported("crossentropy_fwd with V = 0".into()))?;
        let (l, x, t) = (self.ptr(losses), self.ptr(logits), self.ptr(&targets.ids));
        launch!(self, "crossentropy_fwd", cfg((n as u32, 1, 1), THREADS), l, x, t, v as i32, dloss)
    }
}
