//! GELU (tanh approximation) on the GPU: the launchers of `kernels/gelu.cu` (the CPU reference is
//! `layers/gelu.rs`). Element-wise, grid-stride over any shape.

use super::{CudaBackend, CudaError, DevBuf, grid_for};
use cudarc::driver::{CudaSlice, PushKernelArg};

/// Threads per block of both kernels.
const THREADS: u32 = 256;

impl CudaBackend {
    /// out `=` gelu(inp) (inp in f32 or BF16 storage).
    pub(super) fn gelu_fwd_impl(&mut self, out: &mut CudaSlice<f32>, inp: &DevBuf) -> Result<(), CudaError> {
        let n = inp.len();
        let (o, x) = (self.ptr(out), self.ptr(inp.raw()));
        launch!(self, "gelu_fwd", grid_for(n, THREADS), o, x, inp.is_bf16() as i32, n as u64)
    }

    /// dinp `=` gelu'(inp)·dout (inp and dout each in f32 or BF16 storage).
    pub(super) fn gelu_bwd_impl(&mut self, dinp: &mut CudaSlice<f32>, inp: &DevBuf, dout: &DevBuf) -> Result<(), CudaError> {
        let n = inp.len();
        let (d, x, g) = (self.ptr(dinp), self.ptr(inp.raw()), self.ptr(dout.raw()));
        launch!(self, "gelu_bwd", grid_for(n, THREADS), d, x, inp.is_bf16() as i32, g, dout.is_bf16() as i32, n as u64)
    }
}
