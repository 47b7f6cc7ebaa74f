//! The statistics reductions of the step's operand casts, batched (`kernels/cast.cu`:
//! `cast_stats_reduce`).
//!
//! Each block of a cast kernel writes its partial statistics (`STAT_FIELDS` doubles, field-major).
//! A cast used to reduce them itself: its last block to finish, found by an atomic counter, read
//! every block's partials and reduced them while the rest of the GPU waited for the kernel to end,
//! one such tail per cast, hundreds a step at the 1B scale. Now a recorded cast leaves its partials
//! in an arena, and one launch reduces a batch of up to [`STAT_BATCH`] casts, a block each, before
//! the step's reports are read. A cast nobody records writes no partials at all.
//!
//! The amax pass of current scaling keeps its own last-block reduction: the cast right after it
//! reads the scale that reduction writes.
//!
//! Determinism: a job's block folds the partials in the order the cast's last block did (the same
//! device function, `reduce_partials`, with the same block size), so the records are bit-identical
//! to a per-cast reduction's.

use super::{CAST_GRID_MAX, CAST_THREADS, CudaBackend, CudaError, STAT_FIELDS, cfg};
use cudarc::driver::{CudaSlice, CudaStream, PushKernelArg};
use std::sync::Arc;

/// Casts reduced by one launch at most (kernels/cast.cu: STAT_BATCH).
const STAT_BATCH: usize = 64;

/// One cast's reduction (kernels/cast.cu: StatJob): its blocks' partials, its record, its
/// statistics level (0 to 2).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct StatJob {
    parts: u64,
    record: u64,
    blocks: i32,
    level: i32,
}

/// A batch of reductions, passed by value (kernels/cast.cu: StatBatch).
#[repr(C)]
#[derive(Clone, Copy)]
struct StatBatch {
    job: [StatJob; STAT_BATCH],
    n: i32,
}

// SAFETY: StatBatch is plain data laid out as kernels/cast.cu's struct of the same name (repr(C):
// 64 jobs of two 8-byte addresses and two i32, then n, padded to 8 bytes), 1544 bytes, under the
// 4 KiB a kernel's parameters may take.
unsafe impl cudarc::driver::DeviceRepr for StatBatch {}
const _: () = assert!(std::mem::size_of::<StatBatch>() == 1544 && std::mem::size_of::<StatJob>() == 24);

/// The arena of partials waiting for their reduction, and the casts they belong to.
pub(super) struct StatArena {
    parts: CudaSlice<f64>,
    /// Doubles of `parts` used by the pending casts.
    next: usize,
    pending: Vec<StatJob>,
}

impl StatArena {
    /// An arena that holds a full batch of the largest cast grids.
    pub(super) fn new(stream: &Arc<CudaStream>) -> Result<StatArena, CudaError> {
        Ok(StatArena { parts: stream.alloc_zeros(STAT_BATCH * CAST_GRID_MAX * STAT_FIELDS)?, next: 0, pending: Vec::new() })
    }

    /// Forgets the pending reductions (a failed step: its records are never read).
    pub(super) fn reset(&mut self) {
        self.next = 0;
        self.pending.clear();
    }
}

impl CudaBackend {
    /// Where a recorded cast of `blocks` blocks at statistics `level` writes its partials (a device
    /// address in the arena); its reduction into the record at `record` (a device address) waits
    /// until [`Self::flush_stats`]. A full batch is reduced first.
    pub(super) fn stat_target(&mut self, blocks: usize, level: usize, record: u64) -> Result<u64, CudaError> {
        let need = blocks * STAT_FIELDS;
        if need > self.stat.parts.len() {
            return Err(CudaError::Unsupported(format!("a cast of {blocks} blocks: its statistics outgrow the arena of {} partials", self.stat.parts.len())));
        }
        if !self.stat_room(blocks) {
            self.flush_stats()?;
        }
        let parts = self.ptr(&self.stat.parts) + (self.stat.next * 8) as u64;
        self.stat.next += need;
        self.stat.pending.push(StatJob { parts, record, blocks: blocks as i32, level: level as i32 });
        Ok(parts)
    }

    /// Whether [`Self::stat_target`] would queue a cast of `blocks` blocks beside the pending ones,
    /// rather than reduce those first (a caller that registers several casts before launching
    /// them launches the ones registered so far first when it would not).
    pub(super) fn stat_room(&self, blocks: usize) -> bool {
        self.stat.pending.len() < STAT_BATCH && self.stat.next + blocks * STAT_FIELDS <= self.stat.parts.len()
    }

    /// Reduces every pending cast's partials into its record, one block each, in one launch; the
    /// arena is free again after (for the casts queued behind it on the stream).
    pub(super) fn flush_stats(&mut self) -> Result<(), CudaError> {
        let jobs = std::mem::take(&mut self.stat.pending);
        self.stat.next = 0;
        if jobs.is_empty() {
            return Ok(());
        }
        let mut b = StatBatch { job: [StatJob::default(); STAT_BATCH], n: jobs.len() as i32 };
        b.job[..jobs.len()].copy_from_slice(&jobs);
        self.span("gemm.cast.stat_reduce", |me| launch!(me, "cast_stats_reduce", cfg((jobs.len() as u32, 1, 1), CAST_THREADS), b))
    }
}

#[cfg(test)]
mod tests {
    use super::super::kernels::Family;
    use super::{STAT_BATCH, STAT_FIELDS};

    #[test]
    fn the_batch_and_its_block_size_match_the_kernel() {
        assert_eq!(Family::Cast.define("STAT_BATCH"), STAT_BATCH);
        assert_eq!(Family::Cast.define("STAT_FIELDS"), STAT_FIELDS);
        assert_eq!(Family::Cast.define("CAST_THREADS"), super::CAST_THREADS as usize);
    }
}
