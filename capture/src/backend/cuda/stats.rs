//! Reductions on the GPU: the launchers of `sumsq_partial`, `sumsq_multi`, `sum_partials` and
//! `count_nonfinite` in `kernels/stats.cu`, and of `zero_multi`, which clears the gradients that
//! accumulate (the per-channel statistics kernels of that file are launched from
//! `channels.rs`). There is no CPU reference for these in `layers/`: the CPU backend sums in
//! `backend/cpu/mod.rs` (`sumsq`, `count_nonfinite`). Sums are in f64, in a fixed order: each
//! buffer's blocks depend only on its size, and one block adds the partials in order.

use super::multi_tensor::Entry;
use super::{CudaBackend, CudaError, DevBuf, cfg, grid_for, grow};
use cudarc::driver::PushKernelArg;

/// Threads per block of `sumsq_partial` and `count_nonfinite`.
const THREADS: u32 = 256;
/// Elements each thread of `sumsq_partial` covers, at most (before the block count is capped).
const PER_THREAD: usize = 16;
/// Most blocks of `sumsq_partial` (and of `zero_multi`) per buffer.
const MAX_BLOCKS: usize = 1024;
/// 4-byte words each thread of `zero_multi` clears, at most (before the block count is capped).
const ZERO_PER_THREAD: usize = 16;

impl CudaBackend {
    /// Σ x² over every buffer of `xs`, in f64: `sumsq_partial` per buffer (or, for more than one,
    /// `sumsq_multi` over all of them in one launch, the same partials) into consecutive partials,
    /// then `sum_partials` over all of them. Synchronises (downloads the result). Each buffer in
    /// f32 or BF16 storage.
    pub(super) fn sumsq_impl(&mut self, xs: &[&DevBuf]) -> Result<f64, CudaError> {
        self.leave_step_graph()?;
        self.sumsq_launches(xs, xs.len() > 1)
    }

    /// [`Backend::sumsq_all`](crate::backend::Backend::sumsq_all) with one launch of
    /// `sumsq_partial` a buffer, as before `sumsq_multi`: for the test that holds the two to the
    /// same bits.
    pub fn sumsq_all_launch_a_buffer(&mut self, xs: &[DevBuf]) -> f64 {
        let refs: Vec<&DevBuf> = xs.iter().collect();
        self.guarded("sumsq_all", |me| me.sumsq_launches(&refs, false)).unwrap_or(f64::NAN)
    }

    fn sumsq_launches(&mut self, xs: &[&DevBuf], one_launch: bool) -> Result<f64, CudaError> {
        // Blocks per buffer depend only on its size, so the summation order is fixed.
        let blocks: Vec<usize> = xs.iter().map(|x| x.len().div_ceil(THREADS as usize * PER_THREAD).clamp(1, MAX_BLOCKS)).collect();
        let total: usize = blocks.iter().sum();
        grow(&self.stream, &mut self.red, total + 1)?;
        let base = self.ptr(&self.red);
        if one_launch {
            let entries: Vec<Entry> =
                xs.iter().zip(&blocks).map(|(x, &nb)| Entry { blocks: nb, n: x.len(), bf16: x.is_bf16(), ptrs: [self.ptr(x.raw()), 0, 0, 0] }).collect();
            let t = self.mt_sumsq.upload(&self.stream, &entries)?;
            launch!(self, "sumsq_multi", cfg((t.blocks, 1, 1), THREADS), t.table, t.count, base)?;
        } else {
            let mut off = 0usize;
            for (x, &nb) in xs.iter().zip(&blocks) {
                let (n, xp) = (x.len(), self.ptr(x.raw()));
                launch!(self, "sumsq_partial", cfg((nb as u32, 1, 1), THREADS), xp, x.is_bf16() as i32, n as u64, base + (off * 8) as u64)?;
                off += nb;
            }
        }
        let outp = base + (total * 8) as u64;
        launch!(self, "sum_partials", cfg((1, 1, 1), 1024), base, total as u64, outp)?;
        let v = self.stream.clone_dtoh(&self.red.slice(total..total + 1))?;
        Ok(v[0])
    }

    /// Zeroes every buffer of `xs` (their whole storage) in one launch of `zero_multi`.
    pub(super) fn zero_all_impl(&mut self, xs: &[&mut DevBuf]) -> Result<(), CudaError> {
        if xs.is_empty() {
            return Ok(());
        }
        let entries: Vec<Entry> = xs
            .iter()
            .map(|x| {
                let words = x.raw().len();
                Entry {
                    blocks: words.div_ceil(THREADS as usize * ZERO_PER_THREAD).clamp(1, MAX_BLOCKS),
                    n: words,
                    bf16: false,
                    ptrs: [self.ptr(x.raw()), 0, 0, 0],
                }
            })
            .collect();
        let t = self.mt_zero.upload(&self.stream, &entries)?;
        launch!(self, "zero_multi", cfg((t.blocks, 1, 1), THREADS), t.table, t.count)
    }

    /// The number of non-finite values of x (f32 or BF16 storage). Synchronises (downloads the count).
    pub(super) fn count_nonfinite_impl(&mut self, x: &DevBuf) -> Result<u64, CudaError> {
        self.leave_step_graph()?;
        let n = x.len();
        self.stream.memset_zeros(&mut self.counter)?;
        let (xp, cp) = (self.ptr(x.raw()), self.ptr(&self.counter));
        launch!(self, "count_nonfinite", grid_for(n, THREADS), xp, x.is_bf16() as i32, n as u64, cp)?;
        Ok(self.stream.clone_dtoh(&self.counter)?[0])
    }
}
