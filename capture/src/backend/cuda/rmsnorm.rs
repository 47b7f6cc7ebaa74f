//! RMSNorm on the GPU: the launchers of `kernels/rmsnorm.cu` (the CPU reference is
//! `layers/rmsnorm.rs`). The forward and the `dinp` backward take one warp per row; the weight
//! gradient is reduced over rows in two fixed-order passes (per-chunk column sums, then the chunks
//! in order), so reruns are bit-identical.

use super::{CudaBackend, CudaError, DevBuf, cfg, grow};
use cudarc::driver::{CudaSlice, PushKernelArg};

/// Rows per block of the one-warp-per-row kernels (256 threads).
const ROWS_PER_BLOCK: usize = 8;
/// Rows each block of `rmsnorm_bwd_partial` sums (a column per thread).
const ROWS_PER_CHUNK: usize = 32;
/// Columns per block of the weight-gradient kernels.
const COLS_PER_BLOCK: u32 = 128;

/// Rows of a (rows, c) buffer, or an error naming the layer when `c` does not divide its length.
fn rows(layer: &str, len: usize, c: usize) -> Result<usize, CudaError> {
    if c == 0 || len % c != 0 {
        return Err(CudaError::Unsupported(format!("{layer}: {len} values are not rows of C = {c}")));
    }
    Ok(len / c)
}

impl CudaBackend {
    /// out (N, C) `=` inp·rstd·w, rstd (N) `=` 1/√(mean(inp²) + eps).
    pub(super) fn rmsnorm_fwd_impl(
        &mut self,
        out: &mut CudaSlice<f32>,
        rstd: &mut CudaSlice<f32>,
        inp: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        c: usize,
        eps: f32,
    ) -> Result<(), CudaError> {
        let n = rows("rmsnorm_fwd", inp.len(), c)?;
        if n == 0 {
            return Ok(());
        }
        let (o, r, x, wp) = (self.ptr(out), self.ptr(rstd), self.ptr(inp), self.ptr(w));
        let blocks = n.div_ceil(ROWS_PER_BLOCK) as u32;
        launch!(self, "rmsnorm_fwd", cfg((blocks, 1, 1), 32 * ROWS_PER_BLOCK as u32), o, r, x, wp, n as i32, c as i32, eps)
    }

    /// dinp (N, C) `+=`, dw (C) `+=` (dout in f32 or BF16 storage).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rmsnorm_bwd_impl(
        &mut self,
        dinp: &mut CudaSlice<f32>,
        dw: &mut CudaSlice<f32>,
        dout: &DevBuf,
        inp: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        rstd: &CudaSlice<f32>,
        c: usize,
    ) -> Result<(), CudaError> {
        let n = rows("rmsnorm_bwd", inp.len(), c)?;
        if n == 0 {
            return Ok(());
        }
        let chunks = n.div_ceil(ROWS_PER_CHUNK);
        // Shared with LayerNorm's backward: the stream runs one kernel after the other.
        grow(&self.stream, &mut self.ln_partial, chunks * c)?;
        let (di, dwp, g, x, wp, r, part) = (
            self.ptr(dinp),
            self.ptr(dw),
            self.ptr(dout.raw()),
            self.ptr(inp),
            self.ptr(w),
            self.ptr(rstd),
            self.ptr(&self.ln_partial),
        );
        let blocks = n.div_ceil(ROWS_PER_BLOCK) as u32;
        let g16 = dout.is_bf16() as i32;
        launch!(self, "rmsnorm_bwd", cfg((blocks, 1, 1), 32 * ROWS_PER_BLOCK as u32), di, g, g16, x, wp, r, n as i32, c as i32)?;
        let col_blocks = (c as u32).div_ceil(COLS_PER_BLOCK);
        launch!(
            self,
            "rmsnorm_bwd_partial",
            cfg((col_blocks, chunks as u32, 1), COLS_PER_BLOCK),
            part,
            g,
            g16,
            x,
            r,
            n as i32,
            c as i32,
            ROWS_PER_CHUNK as i32
        )?;
        launch!(self, "rmsnorm_bwd_reduce", cfg((col_blocks, 1, 1), COLS_PER_BLOCK), dwp, part, c as i32, chunks as i32)
    }
}
