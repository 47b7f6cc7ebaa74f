//! RMSNorm on the GPU: the launchers of `kernels/rmsnorm.cu` (the CPU reference is
//! `layers/rmsnorm.rs`). The forward takes one warp per row. The backward takes a chunk of rows per
//! block, which writes their `dinp` and the chunk's column sums of the weight gradient from one
//! read of `dout` and `x`; the chunks are then added in order, so reruns are bit-identical.

use super::{CudaBackend, CudaError, DevBuf, cfg, grow};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

/// Rows per block of the forward, a warp each (256 threads).
const ROWS_PER_BLOCK: usize = 8;
/// Rows per block of the backward, a warp each (kernels/rmsnorm.cu: RMS_CHUNK): the chunk whose
/// column sums of the weight gradient the block writes.
const RMS_CHUNK: usize = 32;
/// Warps per block of the chunks' reduction, each adding every NORM_REDUCE_WARPS-th chunk of its
/// block's 32 columns (kernels/norms.cuh: NORM_REDUCE_WARPS).
const NORM_REDUCE_WARPS: u32 = 16;

/// The launch of `rmsnorm_bwd_reduce` or `layernorm_bwd_reduce` over C columns: 32 a block, a lane
/// each, with NORM_REDUCE_WARPS warps down the chunks.
pub(super) fn norm_reduce_cfg(c: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: ((c as u32).div_ceil(32), 1, 1), block_dim: (32, NORM_REDUCE_WARPS, 1), shared_mem_bytes: 0 }
}

/// Rows of a (rows, c) buffer, or an error naming the layer when `c` does not divide its length.
fn rows(layer: &str, len: usize, c: usize) -> Result<usize, CudaError> {
    if c == 0 || !len.is_multiple_of(c) {
        return Err(CudaError::Unsupported(format!("{layer}: {len} values are not rows of C = {c}")));
    }
    Ok(len / c)
}

impl CudaBackend {
    /// out (N, C) `=` inp·rstd·w, rstd (N) `=` 1/√(mean(inp²) + eps); without `out`, rstd only
    /// (for a cast that computes out as it reads inp: `norm_gemm.rs`).
    pub(super) fn rmsnorm_fwd_impl(
        &mut self,
        out: Option<&mut CudaSlice<f32>>,
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
        let o = out.map(|o| self.ptr(o)).unwrap_or(0);
        let (r, x, wp) = (self.ptr(rstd), self.ptr(inp), self.ptr(w));
        let blocks = n.div_ceil(ROWS_PER_BLOCK) as u32;
        launch!(self, "rmsnorm_fwd", cfg((blocks, 1, 1), 32 * ROWS_PER_BLOCK as u32), o, r, x, wp, n as i32, c as i32, eps)
    }

    /// out (N, C) `=` a + b (b in f32 or BF16 storage) and rstd (N) of out, in one pass
    /// (`rmsnorm_add_stats`: the residual add and the statistics `rmsnorm_fwd` would compute).
    pub(super) fn rmsnorm_add_stats_impl(
        &mut self,
        out: &mut CudaSlice<f32>,
        rstd: &mut CudaSlice<f32>,
        a: &CudaSlice<f32>,
        b: &DevBuf,
        c: usize,
        eps: f32,
    ) -> Result<(), CudaError> {
        let n = rows("rmsnorm_add_stats", a.len(), c)?;
        if b.len() != a.len() || out.len() != a.len() || rstd.len() < n {
            return Err(CudaError::Unsupported(format!(
                "rmsnorm_add_stats: {} + {} values into {}, {} rows' rstd into {}",
                a.len(),
                b.len(),
                out.len(),
                n,
                rstd.len()
            )));
        }
        if n == 0 {
            return Ok(());
        }
        let (o, r, ap, bp) = (self.ptr(out), self.ptr(rstd), self.ptr(a), self.ptr(b.raw()));
        let blocks = n.div_ceil(ROWS_PER_BLOCK) as u32;
        launch!(self, "rmsnorm_add_stats", cfg((blocks, 1, 1), 32 * ROWS_PER_BLOCK as u32), o, r, ap, bp, b.is_bf16() as i32, n as i32, c as i32, eps)
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
        let chunks = n.div_ceil(RMS_CHUNK);
        // Shared with LayerNorm's backward: the stream runs one kernel after the other.
        grow(&self.stream, &mut self.ln_partial, chunks * c)?;
        let (di, dwp, g, x, wp, r, part) =
            (self.ptr(dinp), self.ptr(dw), self.ptr(dout.raw()), self.ptr(inp), self.ptr(w), self.ptr(rstd), self.ptr(&self.ln_partial));
        let g16 = dout.is_bf16() as i32;
        #[rustfmt::skip]
        launch!(self, "rmsnorm_bwd", cfg((chunks as u32, 1, 1), 32 * RMS_CHUNK as u32), di, part, g, g16, x, wp, r, n as i32, c as i32)?;
        launch!(self, "rmsnorm_bwd_reduce", norm_reduce_cfg(c), dwp, part, c as i32, chunks as i32)
    }
}

#[cfg(test)]
mod tests {
    use super::super::kernels::Family;

    /// The backward's grid and the chunks its reduction adds follow the kernel's chunk of rows.
    #[test]
    fn the_chunk_of_rows_matches_the_kernel() {
        assert_eq!(Family::RmsNorm.define("RMS_CHUNK"), super::RMS_CHUNK);
    }

    /// The reduction's launch has the warps the kernel's shared memory is sized for.
    #[test]
    fn the_reduction_launch_matches_the_kernel() {
        let norms = include_str!("../../../../kernels/norms.cuh");
        assert!(
            norms.lines().any(|l| l == format!("#define NORM_REDUCE_WARPS {}", super::NORM_REDUCE_WARPS)),
            "kernels/norms.cuh: #define NORM_REDUCE_WARPS {}",
            super::NORM_REDUCE_WARPS
        );
        let cfg = super::norm_reduce_cfg(1000);
        assert_eq!((cfg.grid_dim.0, cfg.block_dim), (32, (32, super::NORM_REDUCE_WARPS, 1)));
    }
}
