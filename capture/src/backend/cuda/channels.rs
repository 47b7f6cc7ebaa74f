//! Per-channel statistics of recorded operand casts on the GPU (`kernels/stats.cu`:
//! `channel_stats_partial`, `channel_stats_reduce`): for each cast recorded at the channels level
//! or above (`StatsLevel::Channels`: `--channel-stats-every`), the per-column Σx² (f64) and
//! max |x| land in a step-long device buffer, at an offset kept with the cast's statistics slot;
//! [`CudaBackend::channel_summaries`] brings the buffer to the host with the step's other
//! statistics, and [`crate::channel_stats::summarize`] finishes there exactly as the CPU reference
//! does.
//!
//! When the model says the step's GEMMs are done (`Backend::gemms_done`, before the optimizer), the
//! buffer is copied to page-locked host memory on a stream of its own
//! ([`CudaBackend::prefetch_channels`]), and the summaries are computed as soon as that copy lands:
//! both while the optimizer runs, instead of after the step (2.8 ms a llama-1b step otherwise).
//!
//! A cast writes its partials (one row of columns per chunk of rows; for the tiled casts, per run
//! of a block's tiles in one column tile: `cast.rs`, `channel_slots`) into an arena; the casts'
//! reductions wait there, and one launch reduces a whole batch of them (up to `CHAN_BATCH` casts,
//! or as many as the arena holds), so that a llama-1b step launches about ten reductions
//! instead of one per recorded cast (each a 16 µs latency-bound launch of a few blocks).
//!
//! Determinism: each (column, chunk of rows) is summed by one thread in row order (in a tiled
//! cast, by one block: each thread in tile order, then a fixed tree) and the chunks by one thread
//! per column in chunk order; the chunking depends only on the shape and the grid, which depends
//! on the shape and the GPU's SM count.

use super::{CudaBackend, CudaError, cfg};
use crate::backend::OperandFault;
use crate::backend::operands::outlier_indices;
use crate::channel_stats::{ChannelStats, summarize};
use cudarc::driver::{CudaSlice, CudaStream, PinnedHostSlice, PushKernelArg};
use std::sync::Arc;

/// Blocks the partial pass aims for: eight per SM of an H200, enough loads in flight to run at
/// memory bandwidth (two per SM left the pass latency-bound: 14 ms a llama-1b step).
const TARGET_BLOCKS: usize = 1056;

/// Casts reduced by one launch at most (kernels/stats.cu: CHAN_BATCH).
const CHAN_BATCH: usize = 32;

/// Partials (per value: an f64 and an f32) the arena holds before a batch must be reduced: 8 Mi
/// values, 96 MiB, about one llama-1b layer's recorded casts. A larger cast grows it.
const ARENA_VALUES: usize = 1 << 23;

/// The step's per-channel records on the device and where each recorded cast's columns are.
pub(super) struct ChannelRecords {
    /// The arena of pending casts' partials.
    part_sq: CudaSlice<f64>,
    part_amax: CudaSlice<f32>,
    /// Partials used in the arena by the pending casts.
    part_next: usize,
    /// Casts whose partials wait in the arena for their reduction.
    pending: Vec<ChannelTarget>,
    sq: CudaSlice<f64>,
    amax: CudaSlice<f32>,
    /// Columns used in `sq` / `amax` this step.
    next: usize,
    /// Statistics slot → (offset, columns) in `sq` / `amax`.
    by_slot: Vec<Option<(usize, usize)>>,
    /// The host copy's stream and buffers, once a step has been prefetched.
    copy: Option<HostCopy>,
    /// Columns of `sq` / `amax` queued for the host copy this step (0: none).
    copied: usize,
}

/// The record columns' copy on the host: page-locked buffers, written by their own stream. Their
/// reader waits for that stream ([`ChannelRecords::settle_copy`] or its `synchronize`), never for
/// the buffers' cudarc events, which are not recorded with event tracking off.
struct HostCopy {
    stream: Arc<CudaStream>,
    sq: PinnedHostSlice<f64>,
    amax: PinnedHostSlice<f32>,
}

impl ChannelRecords {
    pub(super) fn new(stream: &Arc<CudaStream>) -> Result<ChannelRecords, CudaError> {
        Ok(ChannelRecords {
            part_sq: stream.alloc_zeros(1 << 12)?,
            part_amax: stream.alloc_zeros(1 << 12)?,
            part_next: 0,
            pending: Vec::new(),
            sq: stream.alloc_zeros(1 << 14)?,
            amax: stream.alloc_zeros(1 << 14)?,
            next: 0,
            by_slot: Vec::new(),
            copy: None,
            copied: 0,
        })
    }

    /// Forgets the step's records (their slots are about to be reused), pending reductions included.
    pub(super) fn reset(&mut self) {
        self.next = 0;
        self.by_slot.clear();
        self.pending.clear();
        self.part_next = 0;
        self.copied = 0;
    }

    /// Waits for the host copy's stream (before `sq` / `amax` may move or be rewritten).
    fn settle_copy(&self) -> Result<(), CudaError> {
        match &self.copy {
            Some(c) => Ok(c.stream.synchronize()?),
            None => Ok(()),
        }
    }
}

/// The channel statistics of every recorded cast, by statistics slot, from the step's columns on
/// the host, summarised on all cores (hundreds of casts a step at the 1B scale, thousands of
/// channels each).
fn summarize_all(by_slot: &[Option<(usize, usize)>], sq: &[f64], amax: &[f32]) -> Vec<Option<ChannelStats>> {
    use rayon::prelude::*;
    by_slot.par_iter().map(|s| s.map(|(off, cols)| summarize(&sq[off..off + cols], &amax[off..off + cols]))).collect()
}

/// Threads per block of the per-column kernels: one per column, up to 256.
fn column_threads(cols: usize) -> usize {
    cols.next_multiple_of(32).clamp(32, 256)
}

/// (threads per block, column blocks, chunks, rows per chunk) of the partial pass.
fn plan(rows: usize, cols: usize) -> (u32, usize, usize, usize) {
    let threads = column_threads(cols);
    let col_blocks = cols.div_ceil(threads);
    let want = TARGET_BLOCKS.div_ceil(col_blocks).clamp(1, rows.max(1));
    let per = rows.div_ceil(want).max(1);
    (threads as u32, col_blocks, rows.div_ceil(per).max(1), per)
}

/// Grows `buf` to hold `n` values, keeping its first `used` (queued on `stream`, like every use).
fn grow_keep<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    buf: &mut CudaSlice<T>,
    used: usize,
    n: usize,
) -> Result<(), CudaError> {
    if buf.len() >= n {
        return Ok(());
    }
    if super::step_graph::recording() {
        // Recorded ops not launched yet would write the old buffer after the copy.
        return Err(CudaError::Unsupported(
            "the channel records grew inside a step recorded into CUDA graphs (channel_target leaves the recording first)".into(),
        ));
    }
    let mut bigger = stream.alloc_zeros::<T>(n.next_power_of_two())?;
    if used > 0 {
        stream.memcpy_dtod(&buf.slice(0..used), &mut bigger)?;
    }
    *buf = bigger;
    Ok(())
}

/// Where a cast's per-channel partials go (device addresses in the arena, which does not move
/// while a cast is pending) and where its reduced columns land: an offset into the step's record
/// columns, which may move to a larger buffer before the reduction runs.
#[derive(Clone, Copy)]
pub(super) struct ChannelTarget {
    pub part_sq: u64,
    pub part_amax: u64,
    off: usize,
    chunks: usize,
    cols: usize,
}

/// One cast's reduction in a batch (kernels/stats.cu: ChanJob).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ChanJob {
    sq_part: u64,
    amax_part: u64,
    sq: u64,
    amax: u64,
    chunks: i32,
    cols: i32,
}

/// A batch of reductions, passed by value (kernels/stats.cu: ChanBatch): the jobs' columns are
/// numbered one after another, job j's from `col_start[j]`.
#[repr(C)]
#[derive(Clone, Copy)]
struct ChanBatch {
    job: [ChanJob; CHAN_BATCH],
    n: i32,
    col_start: [i32; CHAN_BATCH + 1],
}

// SAFETY: ChanBatch is plain data laid out as kernels/stats.cu's struct of the same name (repr(C):
// 32 jobs of four 8-byte addresses and two i32, then n and col_start), 1416 bytes, under the 4 KiB
// a kernel's parameters may take.
unsafe impl cudarc::driver::DeviceRepr for ChanBatch {}
const _: () = assert!(std::mem::size_of::<ChanBatch>() == 1416 && std::mem::size_of::<ChanJob>() == 40);

impl CudaBackend {
    /// Reserves the step's record columns of the cast in `slot` (cols channels) and arena room for
    /// the partials of `chunks` row chunks; the reduction waits until [`Self::flush_channels`].
    pub(super) fn channel_target(&mut self, cols: usize, chunks: usize, slot: usize) -> Result<ChannelTarget, CudaError> {
        let need = chunks * cols;
        if !self.channel_room(cols, chunks) {
            self.flush_channels()?;
        }
        if self.chan.next + cols > self.chan.sq.len() {
            // The records grow with their contents copied (grow_keep): recorded ops not launched
            // yet would write the old buffer after the copy, so a recorded step stops recording.
            self.leave_step_graph()?;
        }
        let stream = self.stream.clone();
        let c = &mut self.chan;
        // Nothing is pending when the arena must grow (a full arena was flushed above).
        super::grow(&stream, &mut c.part_sq, need.max(ARENA_VALUES))?;
        super::grow(&stream, &mut c.part_amax, need.max(ARENA_VALUES))?;
        let (part, off) = (c.part_next, c.next);
        if off + cols > c.sq.len() {
            // The columns move to a larger buffer: not while the host copy reads them.
            c.settle_copy()?;
        }
        grow_keep(&stream, &mut c.sq, off, off + cols)?;
        grow_keep(&stream, &mut c.amax, off, off + cols)?;
        c.part_next += need;
        c.next += cols;
        if c.by_slot.len() <= slot {
            c.by_slot.resize(slot + 1, None);
        }
        c.by_slot[slot] = Some((off, cols));
        let t = ChannelTarget {
            part_sq: self.ptr(&self.chan.part_sq) + (part * 8) as u64,
            part_amax: self.ptr(&self.chan.part_amax) + (part * 4) as u64,
            off,
            chunks,
            cols,
        };
        self.chan.pending.push(t);
        Ok(t)
    }

    /// Whether [`Self::channel_target`] would queue a cast of `cols` channels and `chunks` row
    /// chunks beside the pending ones, rather than reduce those first (as [`Self::stat_room`]).
    pub(super) fn channel_room(&self, cols: usize, chunks: usize) -> bool {
        self.chan.pending.len() < CHAN_BATCH && self.chan.part_next + chunks * cols <= self.chan.part_sq.len()
    }

    /// Reduces every pending cast's partials into its record columns, chunks in order, in one
    /// launch; the arena is free again after (for the casts queued behind it on the stream).
    pub(super) fn flush_channels(&mut self) -> Result<(), CudaError> {
        let jobs = std::mem::take(&mut self.chan.pending);
        self.chan.part_next = 0;
        if jobs.is_empty() {
            return Ok(());
        }
        let mut b = ChanBatch { job: [ChanJob::default(); CHAN_BATCH], n: jobs.len() as i32, col_start: [0; CHAN_BATCH + 1] };
        let (sq, amax) = (self.ptr(&self.chan.sq), self.ptr(&self.chan.amax));
        let mut cols = 0usize;
        for (j, t) in jobs.iter().enumerate() {
            let (sq, amax) = (sq + (t.off * 8) as u64, amax + (t.off * 4) as u64);
            b.job[j] = ChanJob { sq_part: t.part_sq, amax_part: t.part_amax, sq, amax, chunks: t.chunks as i32, cols: t.cols as i32 };
            b.col_start[j] = cols as i32;
            cols += t.cols;
        }
        for s in &mut b.col_start[jobs.len()..] {
            *s = cols as i32;
        }
        let threads = 256u32;
        let blocks = cols.div_ceil(threads as usize) as u32;
        self.span("gemm.cast.channel_reduce", |me| launch!(me, "channel_stats_reduce", cfg((blocks, 1, 1), threads), b))
    }

    /// Queues the per-channel statistics of `x` (rows × cols, row-major, `fault`'s planted
    /// outliers applied) for the cast recorded in `slot`, in a pass of their own (the straight
    /// casts; the transposed and dual casts compute them as they cast: `cast_transposed`).
    pub(super) fn launch_channel_stats(&mut self, x: &CudaSlice<f32>, rows: usize, cols: usize, fault: OperandFault, slot: usize) -> Result<(), CudaError> {
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let (threads, col_blocks, chunks, per) = plan(rows, cols);
        let target = self.channel_target(cols, chunks, slot)?;
        let mut o = [u64::MAX; 4];
        if fault.outlier_factor != 1.0 {
            for (j, i) in outlier_indices(rows * cols).enumerate() {
                o[j] = i as u64;
            }
        }
        let xp = self.ptr(x);
        #[rustfmt::skip]
        launch!(self, "channel_stats_partial", cfg((col_blocks as u32, chunks as u32, 1), threads), xp, rows as i32, cols as i32, per as i32,
            o[0], o[1], o[2], o[3], fault.outlier_factor, target.part_sq, target.part_amax)?;
        Ok(())
    }

    /// Starts copying the step's record columns to the host on the copy stream, behind the work
    /// queued so far (the step's casts and their reductions), while the stream goes on.
    pub(super) fn prefetch_channels(&mut self) -> Result<(), CudaError> {
        self.flush_channels()?;
        let n = self.chan.next;
        if n == 0 {
            return Ok(());
        }
        self.chan.settle_copy()?;
        if self.chan.copy.as_ref().is_none_or(|c| c.sq.len() < n) {
            let stream = match self.chan.copy.take() {
                Some(c) => c.stream,
                None => self.ctx.new_stream()?,
            };
            let len = n.next_power_of_two();
            // SAFETY: page-locked host memory (flags 0: cached, not write-combined, since the host
            // reads it), read only after a copy has written it (`channel_summaries`).
            let (sq, amax) = unsafe { (self.ctx.alloc_pinned_with_flags::<f64>(len, 0)?, self.ctx.alloc_pinned_with_flags::<f32>(len, 0)?) };
            self.chan.copy = Some(HostCopy { stream, sq, amax });
        }
        let c = &mut self.chan;
        let Some(h) = c.copy.as_mut() else { unreachable!("allocated above") };
        h.stream.join(&self.stream)?;
        h.stream.memcpy_dtoh(&c.sq.slice(0..n), &mut h.sq)?;
        h.stream.memcpy_dtoh(&c.amax.slice(0..n), &mut h.amax)?;
        c.copied = n;
        Ok(())
    }

    /// The channel statistics of the step's recorded casts, by statistics slot, and forgets the
    /// step's records. From the host copy when it holds every column (waiting for that copy only:
    /// the stream may still run the optimizer), else copied behind the stream's work. The pending
    /// reductions must have been flushed (`download_all` does it first).
    pub(super) fn channel_summaries(&mut self) -> Result<Vec<Option<ChannelStats>>, CudaError> {
        let n = self.chan.next;
        let by_slot = std::mem::take(&mut self.chan.by_slot);
        let out = match &self.chan.copy {
            _ if n == 0 => Vec::new(),
            Some(h) if self.chan.copied == n => {
                // The backend turns cudarc's event tracking off (one stream), so the pinned
                // buffers' own events are never recorded and `as_slice` would not wait for the
                // copy: the copy stream is waited for here (it holds that copy and nothing after).
                h.stream.synchronize()?;
                summarize_all(&by_slot, &h.sq.as_slice()?[..n], &h.amax.as_slice()?[..n])
            }
            _ => {
                self.chan.settle_copy()?;
                let sq = self.stream.clone_dtoh(&self.chan.sq.slice(0..n))?;
                let amax = self.stream.clone_dtoh(&self.chan.amax.slice(0..n))?;
                summarize_all(&by_slot, &sq, &amax)
            }
        };
        self.chan.reset();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::plan;

    #[test]
    fn the_partial_pass_covers_every_row_once_in_at_most_65535_chunks() {
        for (rows, cols) in [(1, 1), (512, 64), (2048, 1024), (2048, 4096), (8192, 3072), (7, 10000), (1_000_000, 33)] {
            let (threads, col_blocks, chunks, per) = plan(rows, cols);
            assert!(threads % 32 == 0 && threads <= 256 && col_blocks * threads as usize >= cols);
            assert!(chunks * per >= rows && (chunks - 1) * per < rows, "{rows}×{cols}: {chunks} × {per}");
            assert!(chunks <= 65535);
        }
    }
}
