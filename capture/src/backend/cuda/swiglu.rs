//! SwiGLU on the GPU: the launchers of `kernels/swiglu.cu` (the CPU reference is
//! `layers/swiglu.rs`). Element-wise: one thread per 4 consecutive elements of a row of the
//! (N, F) side (one vector load and store each when 4 divides F), which in the backward writes
//! both the gate and the up gradient of each.

use super::{CudaBackend, CudaError, DevBuf, cfg};
use cudarc::driver::{CudaSlice, PushKernelArg};

/// Threads per block of both kernels.
const THREADS: u32 = 256;
/// Most blocks along the rows (the kernels stride over the rest).
const MAX_ROW_BLOCKS: usize = 65535;

/// The grid of both kernels for n rows of F: (blocks across a row, blocks down the rows).
fn grid(n: usize, f: usize) -> (u32, u32, u32) {
    (f.div_ceil(4 * THREADS as usize) as u32, n.min(MAX_ROW_BLOCKS) as u32, 1)
}

/// Rows N of an (N, 2F) input, or an error naming the layer.
fn rows(layer: &str, len: usize, f: usize) -> Result<usize, CudaError> {
    if f == 0 || !len.is_multiple_of(2 * f) {
        return Err(CudaError::Unsupported(format!("{layer}: {len} values are not rows of 2F = {}", 2 * f)));
    }
    Ok(len / (2 * f))
}

impl CudaBackend {
    /// out (N, F) `=` silu(gate)·up from inp (N, 2F) = [gate | up] (f32 or BF16 storage).
    pub(super) fn swiglu_fwd_impl(&mut self, out: &mut CudaSlice<f32>, inp: &DevBuf, f: usize) -> Result<(), CudaError> {
        let n = rows("swiglu_fwd", inp.len(), f)?;
        if n == 0 {
            return Ok(());
        }
        let (o, x) = (self.ptr(out), self.ptr(inp.raw()));
        launch!(self, "swiglu_fwd", cfg(grid(n, f), THREADS), o, x, inp.is_bf16() as i32, n as u64, f as i32)
    }

    /// dinp (N, 2F) `=` from inp (N, 2F) and dout (N, F) (each in f32 or BF16 storage).
    pub(super) fn swiglu_bwd_impl(&mut self, dinp: &mut CudaSlice<f32>, inp: &DevBuf, dout: &DevBuf, f: usize) -> Result<(), CudaError> {
        let n = rows("swiglu_bwd", inp.len(), f)?;
        if n == 0 {
            return Ok(());
        }
        let (d, x, g) = (self.ptr(dinp), self.ptr(inp.raw()), self.ptr(dout.raw()));
        launch!(self, "swiglu_bwd", cfg(grid(n, f), THREADS), d, x, inp.is_bf16() as i32, g, dout.is_bf16() as i32, n as u64, f as i32)
    }
}
