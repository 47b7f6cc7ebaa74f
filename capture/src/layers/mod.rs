//! CPU reference layers of the model the capture trains (see DESIGN.md, "The model the capture
//! trains"): one file per layer family, forward and backward side by side, llm.c conventions.
//!
//! Conventions shared by every file here:
//! - All tensors are `f32`, row-major, in flat slices; shapes are written in comments as
//!   `(N, C)` with the dimension names B, T, C, NH, KVH (kv heads), HD (head size), V, F and
//!   N = B·T (tokens).
//! - Every function checks its slice lengths against the dimensions it is given and panics
//!   with the layer and tensor name on a mismatch: a mismatch is a bug in the caller, not
//!   bad user input. Token ids are the one user-derived input; the data loader validates them
//!   against V, and the layers panic (naming the position) if one slips through.
//! - Gradients start with `d`. Each header says which gradients are overwritten (`=`) and
//!   which are accumulated (`+=`), as llm.c does.
//! - Parallelism is rayon over rows, tokens, heads or channels, and every output element is
//!   computed by one task in a fixed order, so results are bit-identical from run to run and
//!   for any thread count. No float reduction is split across tasks.
//!   The GEMMs use `matrixmultiply`, which splits only over output tiles and accumulates the
//!   inner dimension serially, so they are deterministic too (on a given CPU: the chosen SIMD
//!   kernel, FMA or not, depends on the instruction set).
// The layer functions keep llm.c's flat signatures (buffers then dimensions) on purpose, so
// the CPU reference, the CUDA launchers and the kernels read alike.
#![allow(clippy::too_many_arguments)]

pub mod adamw;
pub mod attention;
pub mod embedding;
pub mod gelu;
pub mod layernorm;
pub mod loss;
pub mod matmul;
pub mod residual;
pub mod rmsnorm;
pub mod rope;
pub mod swiglu;

#[cfg(test)]
mod testutil;

pub use adamw::adamw_update;
pub use attention::{attention_bwd, attention_fwd};
pub use embedding::{embedding_bwd, embedding_fwd};
pub use gelu::{gelu_bwd, gelu_fwd};
pub use layernorm::{LN_EPS, layernorm_bwd, layernorm_fwd};
pub use loss::{IGNORE_TARGET, crossentropy_fwd_bwd, mean_loss};
pub use matmul::{matmul_dgrad, matmul_fwd, matmul_wgrad};
pub use residual::{add_inplace, residual_fwd};
pub use rmsnorm::{rmsnorm_bwd, rmsnorm_fwd};
pub use rope::{rope_bwd, rope_fwd, rope_table};
pub use swiglu::{swiglu_bwd, swiglu_fwd};

/// About how many scalar operations one rayon task should own: below this the scheduling
/// overhead (about a microsecond per task) is comparable to the work.
const MIN_TASK_ELEMS: usize = 8192;

/// The smallest number of rows of `row_len` elements that one rayon task takes (for
/// `with_min_len`). Only the scheduling depends on it, never the result.
pub(crate) fn rows_per_task(row_len: usize) -> usize {
    (MIN_TASK_ELEMS / row_len.max(1)).max(1)
}

/// Panics with the layer and tensor name unless `got == want`.
#[track_caller]
pub(crate) fn check_len(layer: &str, tensor: &str, got: usize, want: usize) {
    assert!(got == want, "{layer}: {tensor} has {got} elements, expected {want}");
}

/// Number of rows of a `(rows, cols)` tensor of `len` elements; panics unless `cols > 0`
/// divides `len`.
#[track_caller]
pub(crate) fn rows_of(layer: &str, tensor: &str, len: usize, cols: usize) -> usize {
    assert!(cols > 0, "{layer}: the row length of {tensor} must be positive");
    assert!(len.is_multiple_of(cols), "{layer}: {tensor} has {len} elements, not a whole number of rows of {cols}");
    len / cols
}
