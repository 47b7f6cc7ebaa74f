//! Collectives: how the ranks of a job exchange what a training step must agree on (the gradients'
//! sum, the amaxes' maximum, the per-token losses). The step calls one [`Collective`]; which
//! implementation answers decides where the ranks live:
//!
//! - [`one_rank::OneRank`]: a job of one rank; every call returns at once and changes nothing, so
//!   the one-rank step does no extra work;
//! - [`threads::ThreadGroup`]: N ranks as threads of one process (CPU), each reduction made in rank
//!   order, so a run reduces to the same bits every time;
//! - NCCL (not yet): ranks as processes, one GPU each.
//!
//! A rank of a dp × tp mesh holds one handle per group it belongs to ([`groups::RankGroups`]).
//!
//! A rank that fails calls [`Collective::abort`] (or drops its handle without [`Collective::close`]):
//! every collective of the other ranks then returns [`CollectiveError::Aborted`] naming it, instead
//! of waiting for a rank that will never come.

pub mod groups;
pub mod one_rank;
pub mod threads;

pub use groups::RankGroups;
pub use one_rank::OneRank;
pub use threads::ThreadGroup;

/// Why a collective did not complete.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CollectiveError {
    /// A rank of the group failed or stopped; the group can do no more collectives.
    #[error("rank {rank} aborted the collectives: {reason}")]
    Aborted { rank: u32, reason: String },
    /// The ranks called different collectives, or with buffers of different lengths, at the same
    /// point: a bug in the caller, reported instead of mixing the buffers.
    #[error("rank {rank} called {op} with {len} values where rank {first_rank} called {first_op} with {first_len}")]
    Mismatch { rank: u32, op: &'static str, len: usize, first_rank: u32, first_op: &'static str, first_len: usize },
}

/// The operations a training step needs from its group of ranks. Every rank of the group must call
/// the same operations in the same order; each returns once every rank has called it.
pub trait Collective: Send {
    /// This rank, 0-based.
    fn rank(&self) -> u32;
    /// Ranks in the group.
    fn world_size(&self) -> u32;
    /// `buf` ← the element-wise sum of every rank's `buf`, added in rank order (rank 0's first).
    fn all_reduce_sum_f32(&mut self, buf: &mut [f32]) -> Result<(), CollectiveError>;
    /// `buf` ← the element-wise maximum of every rank's `buf` (NaN wins, as a NaN amax must).
    fn all_reduce_max_f32(&mut self, buf: &mut [f32]) -> Result<(), CollectiveError>;
    /// Every rank's `local`, concatenated in rank order.
    fn all_gather_f32(&mut self, local: &[f32]) -> Result<Vec<f32>, CollectiveError>;
    /// Returns once every rank has called it.
    fn barrier(&mut self) -> Result<(), CollectiveError>;
    /// This rank failed: every collective of every rank, pending or later, returns an error naming
    /// it and `reason`.
    fn abort(&mut self, reason: &str);
    /// This rank is done and leaves cleanly. A rank that goes away without closing (its thread
    /// stopped, its handle dropped) aborts the group.
    fn close(&mut self);
}

/// The element-wise maximum that lets a NaN through (f32::max would drop it).
pub fn max_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() { f32::NAN } else { a.max(b) }
}
