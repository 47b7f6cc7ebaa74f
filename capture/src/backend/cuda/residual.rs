//! Residual sums on the GPU: the launchers of `kernels/residual.cu` (the CPU reference is
//! `layers/residual.rs`). `residual_fwd` is the backend's `add`, `residual_bwd` its `add_inplace`
//! (a gradient accumulated into a buffer that already holds one). Element-wise, grid-stride.

use super::{CudaBackend, CudaError, DevBuf, grid_for};
use cudarc::driver::{CudaSlice, PushKernelArg};

/// Threads per block of both kernels.
const THREADS: u32 = 256;

impl CudaBackend {
    /// out `=` a + b (b in f32 or BF16 storage).
    pub(super) fn residual_fwd_impl(&mut self, out: &mut CudaSlice<f32>, a: &CudaSlice<f32>, b: &DevBuf) -> Result<(), CudaError> {
        let n = a.len();
        if b.len() != n || out.len() != n {
            return Err(CudaError::Unsupported(format!("add of {n} and {} values into {}", b.len(), out.len())));
        }
        let (o, ap, bp) = (self.ptr(out), self.ptr(a), self.ptr(b.raw()));
        launch!(self, "residual_fwd", grid_for(n, THREADS), o, ap, bp, b.is_bf16() as i32, n as u64)
    }

    /// acc `+=` x.
    pub(super) fn residual_bwd_impl(&mut self, acc: &mut CudaSlice<f32>, x: &CudaSlice<f32>) -> Result<(), CudaError> {
        let n = x.len();
        let (a, xp) = (self.ptr(acc), self.ptr(x));
        launch!(self, "residual_bwd", grid_for(n, THREADS), a, xp, n as u64)
    }
}
