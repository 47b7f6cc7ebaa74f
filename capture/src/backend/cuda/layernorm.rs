//! LayerNorm on the GPU: the launchers of `kernels/layernorm.cu` (the CPU reference is
//! `layers/layernorm.rs`). The forward takes one warp per row. The backward takes a chunk of rows
//! per block, which writes their `dinp` and the chunk's column sums of the weight and bias
//! gradients from one read of `dout` and `x` (the kernel RMSNorm's backward shares:
//! `kernels/norms.cuh`); the chunks are then added in order, so reruns are bit-identical.

use super::{CudaBackend, CudaError, DevBuf, cfg, grow};
use cudarc::driver::{CudaSlice, PushKernelArg};

/// Rows per block of the one-warp-per-row kernels (256 threads).
const ROWS_PER_BLOCK: u32 = 8;
/// Rows per block of the backward, a warp each (kernels/layernorm.cu: LN_CHUNK): the chunk whose
/// column sums of the weight and bias gradients the block writes.
const LN_CHUNK: usize = 32;

/// Rows of a (rows, c) buffer of `len` values, or an error naming the kernel when c is 0.
fn rows(kernel: &str, len: usize, c: usize) -> Result<usize, CudaError> {
    len.checked_div(c).ok_or_else(|| CudaError::Unsupported(format!("{kernel} with C = 0")))
}

impl CudaBackend {
    /// out (N, C) `=`, mean (N) `=`, rstd (N) `=` from inp (N, C), w (C), b (C); without `out`,
    /// mean and rstd only (for a cast that computes out as it reads inp: `norm_gemm.rs`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn layernorm_fwd_impl(
        &mut self,
        out: Option<&mut CudaSlice<f32>>,
        mean: &mut CudaSlice<f32>,
        rstd: &mut CudaSlice<f32>,
        inp: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        b: &CudaSlice<f32>,
        c: usize,
    ) -> Result<(), CudaError> {
        let n = rows("layernorm_fwd", inp.len(), c)?;
        let o = out.map(|o| self.ptr(o)).unwrap_or(0);
        let (m, r, x, wp, bp) = (self.ptr(mean), self.ptr(rstd), self.ptr(inp), self.ptr(w), self.ptr(b));
        launch!(self, "layernorm_fwd", cfg(((n as u32).div_ceil(ROWS_PER_BLOCK), 1, 1), 32 * ROWS_PER_BLOCK), o, m, r, x, wp, bp, n as i32, c as i32)
    }

    /// out (N, C) `=` a + b (b in f32 or BF16 storage) and mean (N), rstd (N) of out, in one
    /// pass (`layernorm_add_stats`: the residual add and the statistics `layernorm_fwd` would compute).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn layernorm_add_stats_impl(
        &mut self,
        out: &mut CudaSlice<f32>,
        mean: &mut CudaSlice<f32>,
        rstd: &mut CudaSlice<f32>,
        a: &CudaSlice<f32>,
        b: &DevBuf,
        c: usize,
    ) -> Result<(), CudaError> {
        let n = rows("layernorm_add_stats", a.len(), c)?;
        if b.len() != a.len() || out.len() != a.len() || mean.len() < n || rstd.len() < n {
            return Err(CudaError::Unsupported(format!("layernorm_add_stats: {} + {} values into {}, {} rows' statistics", a.len(), b.len(), out.len(), n)));
        }
        if n == 0 {
            return Ok(());
        }
        let (o, m, r, ap, bp) = (self.ptr(out), self.ptr(mean), self.ptr(rstd), self.ptr(a), self.ptr(b.raw()));
        launch!(
            self,
            "layernorm_add_stats",
            cfg(((n as u32).div_ceil(ROWS_PER_BLOCK), 1, 1), 32 * ROWS_PER_BLOCK),
            o,
            m,
            r,
            ap,
            bp,
            b.is_bf16() as i32,
            n as i32,
            c as i32
        )
    }

    /// dinp (N, C) `+=`, dw (C) `+=` and db (C) `+=` (`layernorm_bwd`, then `layernorm_bwd_reduce`);
    /// dout in f32 or BF16 storage.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn layernorm_bwd_impl(
        &mut self,
        dinp: &mut CudaSlice<f32>,
        dw: &mut CudaSlice<f32>,
        db: &mut CudaSlice<f32>,
        dout: &DevBuf,
        inp: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        mean: &CudaSlice<f32>,
        rstd: &CudaSlice<f32>,
        c: usize,
    ) -> Result<(), CudaError> {
        let n = rows("layernorm_bwd", inp.len(), c)?;
        if n == 0 {
            return Ok(());
        }
        let chunks = n.div_ceil(LN_CHUNK);
        // Shared with RMSNorm's backward: the stream runs one kernel after the other.
        grow(&self.stream, &mut self.ln_partial, chunks * 2 * c)?;
        let (di, dwp, dbp, g, x, wp, m, r, part) = (
            self.ptr(dinp),
            self.ptr(dw),
            self.ptr(db),
            self.ptr(dout.raw()),
            self.ptr(inp),
            self.ptr(w),
            self.ptr(mean),
            self.ptr(rstd),
            self.ptr(&self.ln_partial),
        );
        let g16 = dout.is_bf16() as i32;
        #[rustfmt::skip]
        launch!(self, "layernorm_bwd", cfg((chunks as u32, 1, 1), 32 * LN_CHUNK as u32), di, part, g, g16, x, wp, m, r, n as i32, c as i32)?;
        launch!(self, "layernorm_bwd_reduce", super::rmsnorm::norm_reduce_cfg(c), dwp, dbp, part, c as i32, chunks as i32)
    }
}

#[cfg(test)]
mod tests {
    use super::super::kernels::Family;

    /// The backward's grid and the chunks its reduction adds follow the kernel's chunk of rows.
    #[test]
    fn the_chunk_of_rows_matches_the_kernel() {
        assert_eq!(Family::LayerNorm.define("LN_CHUNK"), super::LN_CHUNK);
    }
}
