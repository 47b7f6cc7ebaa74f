//! The statistics reductions of the step's operand casts, batched (`kernels/cast.cu`:
//! `cast_stats_reduce`).
//!
//! Each block of a cast kernel writes its partial statistics (`STAT_FIELDS` doubles, field-major).
//! A cast used to reduce them itself: its last block to finish, found by an atomic counter, read
//! every block's partials and reduced them while the rest of the GPU waited for the kernel to end,
//! one such tail per cast, hundreds a step at the 1B scale. Now a recorded cast leaves its partials
//! in an arena, and one launch reduces every pending cast's, a block each, from a table of jobs in
//! device memory, before the step's reports are read: one launch a step, unless the arena fills
//! first ([`ARENA_CASTS`] casts of the largest grid). A cast nobody records writes no partials.
//!
//! The amax pass of current scaling keeps its own last-block reduction: the cast right after it
//! reads the scale that reduction writes.
//!
//! Determinism: a job's block folds the partials in the order the cast's last block did (the same
//! device function, `reduce_partials`, with the same block size), so the records are bit-identical
//! to a per-cast reduction's.

use super::multi_tensor::StepTables;
use super::{CAST_GRID_MAX, CAST_THREADS, CudaBackend, CudaError, STAT_FIELDS, cfg};
use cudarc::driver::{CudaSlice, CudaStream, PushKernelArg};
use std::sync::Arc;

/// The arena holds the partials of this many casts of the largest grid ([`CAST_GRID_MAX`] blocks):
/// 2.2 M doubles, 17 MiB. A llama-1b step's recorded casts (16 layers of 12, tiled grids of at most
/// 396 blocks on an H200) take about 1.3 M, so a step's casts are reduced in one launch.
const ARENA_CASTS: usize = 64;

/// Words of a job of the kernel's table (kernels/cast.cu: STAT_JOB_WORDS).
const JOB_WORDS: usize = 3;

/// One cast's reduction (kernels/cast.cu: StatJob): its blocks' partials, its record, its
/// statistics level (0 to 2).
#[derive(Clone, Copy, Debug, PartialEq)]
struct StatJob {
    parts: u64,
    record: u64,
    blocks: usize,
    level: usize,
}

impl StatJob {
    /// The job's words in the kernel's table: the partials' address, the record's, and the blocks
    /// in the low and the level in the high half of the third word.
    fn words(&self) -> [u64; JOB_WORDS] {
        [self.parts, self.record, self.blocks as u64 | ((self.level as u64) << 32)]
    }
}

/// The arena of partials waiting for their reduction, the casts they belong to, and the job
/// tables of the step's reductions (one a launch of the step, so that a step like the last one
/// uploads none).
pub(super) struct StatArena {
    parts: CudaSlice<f64>,
    /// Doubles of `parts` used by the pending casts.
    next: usize,
    pending: Vec<StatJob>,
    tables: StepTables,
}

impl StatArena {
    /// An arena that holds [`ARENA_CASTS`] casts of the largest grid.
    pub(super) fn new(stream: &Arc<CudaStream>) -> Result<StatArena, CudaError> {
        Ok(StatArena { parts: stream.alloc_zeros(ARENA_CASTS * CAST_GRID_MAX * STAT_FIELDS)?, next: 0, pending: Vec::new(), tables: StepTables::default() })
    }

    /// Forgets the pending reductions (a failed step: its records are never read), and starts the
    /// next step's tables from the first (after a step's last reduction too).
    pub(super) fn reset(&mut self) {
        self.next = 0;
        self.pending.clear();
        self.tables.restart();
    }
}

impl CudaBackend {
    /// Where a recorded cast of `blocks` blocks at statistics `level` writes its partials (a device
    /// address in the arena); its reduction into the record at `record` (a device address) waits
    /// until [`Self::flush_stats`]. A full arena is reduced first.
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
        self.stat.pending.push(StatJob { parts, record, blocks, level });
        Ok(parts)
    }

    /// Whether [`Self::stat_target`] would queue a cast of `blocks` blocks beside the pending ones,
    /// rather than reduce those first (a caller that registers several casts before launching
    /// them launches the ones registered so far first when it would not).
    pub(super) fn stat_room(&self, blocks: usize) -> bool {
        self.stat.next + blocks * STAT_FIELDS <= self.stat.parts.len()
    }

    /// Reduces every pending cast's partials into its record, one block each, in one launch; the
    /// arena is free again after (for the casts queued behind it on the stream).
    pub(super) fn flush_stats(&mut self) -> Result<(), CudaError> {
        let jobs = std::mem::take(&mut self.stat.pending);
        self.stat.next = 0;
        if jobs.is_empty() {
            return Ok(());
        }
        let words: Vec<u64> = jobs.iter().flat_map(|j| j.words()).collect();
        let stream = self.stream.clone();
        let t = self.stat.tables.upload_next(&stream, words, jobs.len(), jobs.len())?;
        self.span("gemm.cast.stat_reduce", |me| launch!(me, "cast_stats_reduce", cfg((t.blocks, 1, 1), CAST_THREADS), t.table))
    }
}

#[cfg(test)]
mod tests {
    use super::super::kernels::Family;
    use super::{JOB_WORDS, STAT_FIELDS, StatJob};

    #[test]
    fn the_jobs_and_the_block_size_match_the_kernel() {
        assert_eq!(Family::Cast.define("STAT_JOB_WORDS"), JOB_WORDS);
        assert_eq!(Family::Cast.define("STAT_FIELDS"), STAT_FIELDS);
        assert_eq!(Family::Cast.define("CAST_THREADS"), super::CAST_THREADS as usize);
        let j = StatJob { parts: 0x1000, record: 0x2000, blocks: 396, level: 2 };
        assert_eq!(j.words(), [0x1000, 0x2000, 396 | (2 << 32)]);
    }
}
