//! AdamW on the GPU: the launcher of `adamw_fwd` in `kernels/adamw.cu` (the CPU reference is
//! `layers/adamw.rs`). The bias corrections are computed on the host in f64, as the CPU reference
//! does, and passed to the kernel, which updates every element of p, m and v in place.

use super::{CudaBackend, CudaError, DevBuf, grid_for};
use crate::backend::AdamW;
use cudarc::driver::{CudaSlice, PushKernelArg};

/// Threads per block.
const THREADS: u32 = 256;

impl CudaBackend {
    /// One AdamW step of p with the gradient g (times `h.grad_scale`; f32 or BF16 storage) and the
    /// moments m, v.
    pub(super) fn adamw_fwd_impl(&mut self, p: &mut CudaSlice<f32>, g: &DevBuf, m: &mut CudaSlice<f32>, v: &mut CudaSlice<f32>, h: &AdamW) -> Result<(), CudaError> {
        let n = p.len();
        // The CPU reference's bias corrections, in f64 on the host.
        let t = f64::from(h.t);
        let step_size = (f64::from(h.lr) / (1.0 - f64::from(h.beta1).powf(t))) as f32;
        let bc2_sqrt = (1.0 - f64::from(h.beta2).powf(t)).sqrt() as f32;
        let decay = 1.0 - h.lr * h.weight_decay;
        if g.len() != n {
            return Err(CudaError::Unsupported(format!("adamw: {} gradient values for {n} parameters", g.len())));
        }
        let (pp, gp, mp, vp) = (self.ptr(p), self.ptr(g.raw()), self.ptr(m), self.ptr(v));
        launch!(self, "adamw_fwd", grid_for(n, THREADS), pp, gp, g.is_bf16() as i32, mp, vp, n as u64, h.beta1, h.beta2, h.eps, decay, step_size, bc2_sqrt, h.grad_scale)
    }
}
