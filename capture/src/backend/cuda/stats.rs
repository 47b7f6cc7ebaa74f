//! Reductions on the GPU: the launchers of `sumsq_partial`, `sum_partials` and `count_nonfinite`
//! in `kernels/stats.cu` (the per-channel statistics kernels of that file are launched from
//! `channels.rs`). There is no CPU reference for these in `layers/`: the CPU backend sums in
//! `backend/cpu/mod.rs` (`sumsq`, `count_nonfinite`). Sums are in f64, in a fixed order: each
//! buffer's blocks depend only on its size, and one block adds the partials in order.

use super::{CudaBackend, CudaError, DevBuf, cfg, grid_for, grow};
use cudarc::driver::PushKernelArg;

/// Threads per block of `sumsq_partial` and `count_nonfinite`.
const THREADS: u32 = 256;
/// Elements each thread of `sumsq_partial` covers, at most (before the block count is capped).
const PER_THREAD: usize = 16;
/// Most blocks of `sumsq_partial` per buffer.
const MAX_BLOCKS: usize = 1024;

impl CudaBackend {
    /// Σ x² over every buffer of `xs`, in f64: `sumsq_partial` per buffer into consecutive
    /// partials, then `sum_partials` over all of them. Synchronises (downloads the result).
    /// Each buffer in f32 or BF16 storage.
    pub(super) fn sumsq_impl(&mut self, xs: &[&DevBuf]) -> Result<f64, CudaError> {
        // Blocks per buffer depend only on its size, so the summation order is fixed.
        let blocks: Vec<usize> = xs.iter().map(|x| x.len().div_ceil(THREADS as usize * PER_THREAD).clamp(1, MAX_BLOCKS)).collect();
        let total: usize = blocks.iter().sum();
        grow(&self.stream, &mut self.red, total + 1)?;
        let base = self.ptr(&self.red);
        let mut off = 0usize;
        for (x, &nb) in xs.iter().zip(&blocks) {
            let (n, xp) = (x.len(), self.ptr(x.raw()));
            launch!(self, "sumsq_partial", cfg((nb as u32, 1, 1), THREADS), xp, x.is_bf16() as i32, n as u64, base + (off * 8) as u64)?;
            off += nb;
        }
        let outp = base + (total * 8) as u64;
        launch!(self, "sum_partials", cfg((1, 1, 1), 1024), base, total as u64, outp)?;
        let v = self.stream.clone_dtoh(&self.red.slice(total..total + 1))?;
        Ok(v[0])
    }

    /// The number of non-finite values of x (f32 or BF16 storage). Synchronises (downloads the count).
    pub(super) fn count_nonfinite_impl(&mut self, x: &DevBuf) -> Result<u64, CudaError> {
        let n = x.len();
        self.stream.memset_zeros(&mut self.counter)?;
        let (xp, cp) = (self.ptr(x.raw()), self.ptr(&self.counter));
        launch!(self, "count_nonfinite", grid_for(n, THREADS), xp, x.is_bf16() as i32, n as u64, cp)?;
        Ok(self.stream.clone_dtoh(&self.counter)?[0])
    }
}
