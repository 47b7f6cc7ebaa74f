//! Cross-entropy on the GPU: the launchers of `kernels/loss.cu` (the CPU reference is
//! `layers/loss.rs`). One block per token computes its loss and overwrites its row of logits with
//! the dlogits in the same pass (forward and backward fused, as on the CPU), in the logits' own
//! storage: f32, or BF16 (the lm_head writes its logits so, and its backward takes the BF16
//! dlogits as its operand). Three kernels give the same bits: `crossentropy_split_fwd` where the row's part past its first [`SPLIT_SPAN`] logits
//! (which it holds in registers) fits in [`SPLIT_SMEM_MAX`] of shared memory, two blocks an SM
//! (V up to 36,352); else `crossentropy_smem_fwd` where the whole row fits in a block's shared
//! memory (one block an SM; both read the logits once); `crossentropy_fwd` (three reads)
//! otherwise.

use super::{CudaBackend, CudaError, CudaTokens, DevBuf, cfg};
use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaFunction, CudaSlice, PushKernelArg};
use std::collections::HashMap;

/// Threads per block (kernels/loss.cu: LOSS_THREADS).
const THREADS: u32 = 512;
/// The dynamic shared memory `crossentropy_smem_fwd` asks to be allowed: the most a block may
/// take on an H100 or H200 (227 KiB), less 1 KiB for the kernel's static reductions. A row of V
/// logits takes 4 V bytes: up to V = 57,856.
const ROW_SMEM_MAX: usize = 226 * 1024;
/// Logits of a row `crossentropy_split_fwd` holds in registers (kernels/loss.cu: LOSS_REG_SPAN =
/// LOSS_REG × LOSS_THREADS).
const SPLIT_SPAN: usize = 16 * THREADS as usize;
/// The dynamic shared memory `crossentropy_split_fwd` may take: two blocks an SM (each with its 1
/// KiB of static reductions) within an H100's or H200's 228 KiB.
const SPLIT_SMEM_MAX: usize = 110 * 1024;

/// The dynamic shared memory the row kernels may take: (`crossentropy_smem_fwd`'s, up to
/// [`ROW_SMEM_MAX`]; `crossentropy_split_fwd`'s, up to [`SPLIT_SMEM_MAX`]), each 0 where the GPU
/// refuses (rows then take the next kernel in [`CudaBackend::crossentropy_fwd_impl`]'s order).
pub(super) fn configure(funcs: &HashMap<&'static str, CudaFunction>) -> Result<(usize, usize), CudaError> {
    for k in ["crossentropy_smem_fwd", "crossentropy_split_fwd"] {
        funcs.get(k).ok_or(CudaError::MissingKernel(k))?;
    }
    Ok((smem_granted(funcs, "crossentropy_smem_fwd", ROW_SMEM_MAX), smem_granted(funcs, "crossentropy_split_fwd", SPLIT_SMEM_MAX)))
}

/// `bytes` where kernel `name` may take that much dynamic shared memory (set now), else 0.
fn smem_granted(funcs: &HashMap<&'static str, CudaFunction>, name: &str, bytes: usize) -> usize {
    let Some(f) = funcs.get(name) else { return 0 };
    f.set_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes as i32).map(|_| bytes).unwrap_or(0)
}

impl CudaBackend {
    /// Which row kernels may run, for the test that holds the three to the same bits:
    /// `crossentropy_smem_fwd` with `shared`, `crossentropy_split_fwd` with `split` (both by
    /// default where the GPU allows them), `crossentropy_fwd` where neither applies. Returns
    /// whether each asked for is now in use.
    pub fn set_loss_row_kernels(&mut self, shared: bool, split: bool) -> (bool, bool) {
        self.loss_row_smem = if shared { smem_granted(&self.funcs, "crossentropy_smem_fwd", ROW_SMEM_MAX) } else { 0 };
        self.loss_split_smem = if split { smem_granted(&self.funcs, "crossentropy_split_fwd", SPLIT_SMEM_MAX) } else { 0 };
        (self.loss_row_smem > 0, self.loss_split_smem > 0)
    }

    /// losses (N) `=` −log softmax(logits)[target]; `logits` (N, V) is then overwritten with the
    /// dlogits (softmax − onehot)·dloss, in the logits' storage: f32, or BF16 (rounded to nearest
    /// even, the operand the lm_head's backward takes as it is).
    pub(super) fn crossentropy_fwd_impl(
        &mut self,
        losses: &mut CudaSlice<f32>,
        logits: &mut DevBuf,
        targets: &CudaTokens,
        v: usize,
        dloss: f32,
    ) -> Result<(), CudaError> {
        let n = logits.len().checked_div(v).ok_or_else(|| CudaError::Unsupported("crossentropy_fwd with V = 0".into()))?;
        let (l, x, t, bf16) = (self.ptr(losses), self.ptr(logits.raw()), self.ptr(&targets.ids), logits.is_bf16() as i32);
        let row_bytes = 4 * v;
        let rest_bytes = 4 * v.saturating_sub(SPLIT_SPAN);
        if self.loss_split_smem > 0 && rest_bytes <= self.loss_split_smem {
            let mut lc = cfg((n as u32, 1, 1), THREADS);
            lc.shared_mem_bytes = rest_bytes as u32;
            launch!(self, "crossentropy_split_fwd", lc, l, x, bf16, t, v as i32, dloss)
        } else if row_bytes <= self.loss_row_smem {
            let mut lc = cfg((n as u32, 1, 1), THREADS);
            lc.shared_mem_bytes = row_bytes as u32;
            launch!(self, "crossentropy_smem_fwd", lc, l, x, bf16, t, v as i32, dloss)
        } else {
            launch!(self, "crossentropy_fwd", cfg((n as u32, 1, 1), THREADS), l, x, bf16, t, v as i32, dloss)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::kernels::Family;
    use super::*;

    #[test]
    fn the_host_knows_the_kernels_row_split() {
        assert_eq!(Family::Loss.define("LOSS_THREADS"), THREADS as usize);
        assert_eq!(Family::Loss.define("LOSS_REG") * Family::Loss.define("LOSS_THREADS"), SPLIT_SPAN);
        // Two blocks an SM: their dynamic and static shared memory within 228 KiB.
        const { assert!(2 * (SPLIT_SMEM_MAX + 1024) <= 228 * 1024) };
        assert_eq!(SPLIT_SPAN + SPLIT_SMEM_MAX / 4, 36_352);
    }
}
