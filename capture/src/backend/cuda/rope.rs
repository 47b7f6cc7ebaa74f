//! Rotary embeddings on the GPU: the launchers of `rope_fwd` / `rope_bwd` in
//! `kernels/attention.cu` (the CPU reference is `layers/rope.rs`). The cos/sin table is the CPU
//! reference's own (`layers::rope::rope_table`, f64 angles rounded once to f32), computed on the
//! host and uploaded once per (T, HD, theta); with the kernels' uncontracted f32 arithmetic the
//! rotation matches the CPU bit for bit. One thread per (token, pair index) rotates that pair in
//! every q and k head of the token and copies it in every v head.

use super::{CudaBackend, CudaError, DevBuf, grid_for};
use cudarc::driver::PushKernelArg;

/// Threads per block of both kernels.
const THREADS: u32 = 256;

/// Which way a RoPE pass rotates: forward (`rope_fwd`, the rotation) or backward (`rope_bwd`, its
/// transpose, for the gradient). The kernels take different arguments: only the forward one may
/// write BF16.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum RopeDir {
    Fwd,
    Bwd,
}

impl RopeDir {
    /// The kernel's name in `kernels/attention.cu`.
    fn kernel(self) -> &'static str {
        match self {
            RopeDir::Fwd => "rope_fwd",
            RopeDir::Bwd => "rope_bwd",
        }
    }
}

impl CudaBackend {
    /// The device copy of the RoPE table for (t, hd, theta): uploaded on the first call with
    /// these dimensions, kept until one with others. Returns its device pointer.
    pub(super) fn rope_table_ptr(&mut self, t: usize, hd: usize, theta: f32) -> Result<u64, CudaError> {
        let key = (t, hd, theta.to_bits());
        if self.rope_tab.as_ref().is_none_or(|(k, _)| *k != key) {
            let host = crate::layers::rope::rope_table(t, hd, theta);
            self.rope_tab = Some((key, self.stream.clone_htod(&host)?));
        }
        match &self.rope_tab {
            Some((_, tab)) => Ok(self.ptr(tab)),
            None => Err(CudaError::Unsupported("the RoPE table was not uploaded".into())),
        }
    }

    /// RoPE `dir` (`rope_fwd` or `rope_bwd`) from `src` (f32 or BF16 storage) into `dst`, both
    /// (B, T, (NH + 2·KVH)·HD). `rope_fwd` may write a BF16 `dst` (rounding each value, for a reader
    /// that rounds it so: the attention, unfused, in `rope_attention_fwd_impl`); `rope_bwd` writes f32.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rope_impl(
        &mut self,
        dir: RopeDir,
        dst: &mut DevBuf,
        src: &DevBuf,
        b: usize,
        t: usize,
        nh: usize,
        kvh: usize,
        hd: usize,
        theta: f32,
    ) -> Result<(), CudaError> {
        let kernel = dir.kernel();
        if hd == 0 || !hd.is_multiple_of(2) || nh == 0 || kvh == 0 {
            return Err(CudaError::Unsupported(format!("{kernel} with HD = {hd}, NH = {nh}, KVH = {kvh} (HD must be even, the head counts positive)")));
        }
        let rows = b * t;
        let want = rows * (nh + 2 * kvh) * hd;
        if src.len() < want || dst.len() < want {
            return Err(CudaError::Unsupported(format!("{kernel}: buffers of {} and {} values, (B, T, (NH + 2·KVH)·HD) needs {want}", src.len(), dst.len())));
        }
        if rows == 0 {
            return Ok(());
        }
        let tab = self.rope_table_ptr(t, hd, theta)?;
        let grid = grid_for(rows * hd / 2, THREADS);
        let (s, s16, rows, ti, nhi, kvhi, hdi) = (self.ptr(src.raw()), src.is_bf16() as i32, rows as u64, t as i32, nh as i32, kvh as i32, hd as i32);
        match dir {
            RopeDir::Fwd => {
                let (d, d16) = (self.ptr(dst.raw()), dst.is_bf16() as i32);
                launch!(self, kernel, grid, d, d16, s, s16, tab, rows, ti, nhi, kvhi, hdi)
            }
            RopeDir::Bwd => {
                let d = self.ptr(&**dst);
                launch!(self, kernel, grid, d, s, s16, tab, rows, ti, nhi, kvhi, hdi)
            }
        }
    }
}
