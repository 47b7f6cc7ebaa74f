//! A linear layer's bias gradient on the GPU, from the operand its wgrad GEMM read (the kernels:
//! `kernels/bias_grad.cu`; the CPU reference: `layers/linear.rs`): the row sums of dYᵀ's cast
//! (`rowsum_dequant`), the column sums of a BF16 dY held in its own layout (`colsum_bf16_partial`
//! and `colsum_bf16_reduce`), or the column sums dY's cast took as it cast it, added in order
//! (`colsum_bf16_reduce` alone). Every value is added in f64, so the three give the same bits.

use super::blas::Operand;
use super::{CudaBackend, CudaError, cfg, fmt_code, grow};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

impl CudaBackend {
    /// dbias += the row sums of dequant(P), P being wgrad's dYᵀ (rows = m × k = n): summed along
    /// P's rows, or down the columns of dY when the BF16 operand lies in dY's own layout; or, when
    /// dY's cast summed its columns as it cast them (`column_slots` of them, in `column_sums`),
    /// those slots added in order: the same sums (kernels/cast_tile.cuh: tile_column_sums).
    pub(super) fn bias_grad(&mut self, pa: Operand, rows: usize, k: usize, db: &mut CudaSlice<f32>, column_slots: Option<usize>) -> Result<(), CudaError> {
        let dbp = self.ptr(db);
        if !pa.transposed {
            return launch!(self, "rowsum_dequant", cfg((rows as u32, 1, 1), 256), pa.ptr, fmt_code(pa.ty), pa.slot, rows as i32, k as i32, dbp);
        }
        let reduce = LaunchConfig { grid_dim: (rows.div_ceil(32) as u32, 1, 1), block_dim: (32, 8, 1), shared_mem_bytes: 0 };
        if let Some(slots) = column_slots {
            self.fused_bias_grads += 1;
            let part = self.ptr(&self.column_sums);
            return launch!(self, "colsum_bf16_reduce", reduce, part, rows as i32, slots as i32, dbp);
        }
        // dY is k × rows, row-major: column sums, in chunks of COLSUM_ROWS rows, then the chunks in
        // order. A block sums 256 columns of a chunk, so chunks are short enough for the grid to
        // fill the GPU at seed's C = 1024 (4 blocks across, 256 chunks down at 16,384 tokens).
        const COLSUM_ROWS: usize = 64;
        let chunks = k.div_ceil(COLSUM_ROWS).max(1);
        grow(&self.stream, &mut self.colsum_partial, chunks * rows)?;
        let part = self.ptr(&self.colsum_partial);
        let grid = (rows.div_ceil(256) as u32, chunks as u32, 1);
        launch!(
            self,
            "colsum_bf16_partial",
            LaunchConfig { grid_dim: grid, block_dim: (32, 8, 1), shared_mem_bytes: 0 },
            pa.ptr,
            k as i32,
            rows as i32,
            COLSUM_ROWS as i32,
            part
        )?;
        launch!(self, "colsum_bf16_reduce", reduce, part, rows as i32, chunks as i32, dbp)
    }

    /// How many bias gradients came from the column sums a cast of dY took as it cast it (the
    /// rest read the cast again): for the tests that hold both ways to the same bits.
    pub fn bias_grads_from_column_sums(&self) -> u64 {
        self.fused_bias_grads
    }
}
