//! AdamW on the GPU: the launchers of `adamw_fwd` (one tensor) and `adamw_multi` (every parameter
//! of the model in one launch, [`super::multi_tensor`]) in `kernels/adamw.cu` (the CPU reference is
//! `layers/adamw.rs`). The bias corrections are computed on the host in f64, as the CPU reference
//! does, and passed to the kernel, which updates every element of p, m and v in place.

use super::multi_tensor::Entry;
use super::{CudaBackend, CudaError, DevBuf, cfg, grid_for};
use crate::backend::AdamW;
use cudarc::driver::{CudaSlice, PushKernelArg};

/// Threads per block.
const THREADS: u32 = 256;

/// The scalars every value's update takes: (decay, step_size, bc2_sqrt), the bias corrections in
/// f64 on the host as the CPU reference computes them.
fn coefficients(h: &AdamW) -> (f32, f32, f32) {
    let t = f64::from(h.t);
    let step_size = (f64::from(h.lr) / (1.0 - f64::from(h.beta1).powf(t))) as f32;
    let bc2_sqrt = (1.0 - f64::from(h.beta2).powf(t)).sqrt() as f32;
    (1.0 - h.lr * h.weight_decay, step_size, bc2_sqrt)
}

impl CudaBackend {
    /// One AdamW step of p with the gradient g (times `h.grad_scale`; f32 or BF16 storage) and the
    /// moments m, v.
    pub(super) fn adamw_fwd_impl(
        &mut self,
        p: &mut CudaSlice<f32>,
        g: &DevBuf,
        m: &mut CudaSlice<f32>,
        v: &mut CudaSlice<f32>,
        h: &AdamW,
    ) -> Result<(), CudaError> {
        let n = p.len();
        let (decay, step_size, bc2_sqrt) = coefficients(h);
        if g.len() != n {
            return Err(CudaError::Unsupported(format!("adamw: {} gradient values for {n} parameters", g.len())));
        }
        let (pp, gp, mp, vp) = (self.ptr(p), self.ptr(g.raw()), self.ptr(m), self.ptr(v));
        launch!(
            self,
            "adamw_fwd",
            grid_for(n, THREADS),
            pp,
            gp,
            g.is_bf16() as i32,
            mp,
            vp,
            n as u64,
            h.beta1,
            h.beta2,
            h.eps,
            decay,
            step_size,
            bc2_sqrt,
            h.grad_scale
        )
    }

    /// One AdamW step of every parameter `ps[i]` with its gradient `gs[i]` and moments `ms[i]`,
    /// `vs[i]`, in one launch of `adamw_multi`: each tensor gets the blocks `adamw_fwd` would give
    /// it, and every value the same operations, so the bits are those of one launch a tensor.
    pub(super) fn adamw_all_impl(&mut self, ps: &mut [DevBuf], gs: &[DevBuf], ms: &mut [DevBuf], vs: &mut [DevBuf], h: &AdamW) -> Result<(), CudaError> {
        let count = ps.len();
        if gs.len() != count || ms.len() != count || vs.len() != count {
            return Err(CudaError::Unsupported(format!("adamw over {count} parameters with {} gradients and {} / {} moments", gs.len(), ms.len(), vs.len())));
        }
        if count == 0 {
            return Ok(());
        }
        let mut entries = Vec::with_capacity(count);
        for i in 0..count {
            let n = ps[i].len();
            if ps[i].is_bf16() || ms[i].is_bf16() || vs[i].is_bf16() {
                return Err(CudaError::Unsupported(format!("adamw: parameter {i} or its moments held in BF16 (AdamW writes f32)")));
            }
            if gs[i].len() != n || ms[i].len() != n || vs[i].len() != n {
                return Err(CudaError::Unsupported(format!(
                    "adamw: parameter {i} has {n} values, its gradient {} and moments {} / {}",
                    gs[i].len(),
                    ms[i].len(),
                    vs[i].len()
                )));
            }
            let blocks = grid_for(n, THREADS).grid_dim.0 as usize;
            let ptrs = [self.ptr(ps[i].raw()), self.ptr(gs[i].raw()), self.ptr(ms[i].raw()), self.ptr(vs[i].raw())];
            entries.push(Entry { blocks, n, bf16: gs[i].is_bf16(), ptrs });
        }
        let (decay, step_size, bc2_sqrt) = coefficients(h);
        let t = self.mt_adamw.upload(&self.stream, &entries)?;
        launch!(self, "adamw_multi", cfg((t.blocks, 1, 1), THREADS), t.table, t.count, h.beta1, h.beta2, h.eps, decay, step_size, bc2_sqrt, h.grad_scale)
    }
}
