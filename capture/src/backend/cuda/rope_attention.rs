//! RoPE fused with the attention on the GPU (`Backend::rope_attention_fwd` / `_bwd`): the launcher
//! of `rope_split_fwd` in `kernels/attention.cu`, around the fused attention kernels of
//! `attention.rs`. The CPU reference is the trait's default: `layers/rope.rs`, then
//! `layers/attention.rs`.
//!
//! The forward rotates q and k and splits q, k, v into the BF16 head-major matrices the fused
//! kernels read, in one pass from the qkv rows, straight into `saved` (a BF16 buffer of qkv's
//! size): no rotated f32 rows are written, and the backward reads q, k, v from `saved` instead of
//! splitting the rows again. Every value is the one `rope_fwd` then `attention_split_fwd` produce,
//! bit for bit (the same uncontracted f32 rotation, then one rounding to BF16). The backward rotates
//! dq and dk back as the attention's kernels store them (`fa_store` with the RoPE table): the
//! gradient before the rotation with no `rope_bwd` pass, the same values bit for bit.
//!
//! `saved` holds the head-major form when it is stored in BF16, the attention runs fused and the
//! head size is a multiple of 8 ([`CudaBackend::rope_saves_heads`]); otherwise it holds the rotated
//! rows (`rope_fwd`, rounded to BF16 when `saved` is stored so: the attention rounds them so
//! anyway). The backward takes the same branch as its forward, so the attention path
//! (`set_fused_attention`) must not change between the two.

use super::attention::{AttentionShape, Heads, split_grid};
use super::rope::RopeDir;
use super::{CudaBackend, CudaError, DevBuf};
use cudarc::driver::{CudaSlice, PushKernelArg};

impl CudaBackend {
    /// Whether `rope_attention_fwd` keeps q, k, v head-major in `saved` (see the module's doc).
    fn rope_saves_heads(&self, saved: &DevBuf, shape: &AttentionShape) -> bool {
        saved.is_bf16() && self.attention_fused(shape.c, shape.nh) && (shape.c / shape.nh).is_multiple_of(8)
    }

    /// The device pointers of q (B,NH,T,HS), k and v (B,KVH,T,HS), one after the other in a BF16
    /// `saved` buffer, after checking it holds them.
    fn saved_heads(&self, saved: &DevBuf, shape: &AttentionShape, hs: usize) -> Result<(u64, u64, u64), CudaError> {
        let AttentionShape { b, t, nh, kvh, .. } = *shape;
        let need = b * t * (nh + 2 * kvh) * hs;
        if saved.len() < need {
            return Err(CudaError::Unsupported(format!("the saved q, k, v hold {} values; (B, T, (NH + 2·KVH)·HD) needs {need}", saved.len())));
        }
        let q = self.ptr(saved.raw());
        let k = q + (2 * b * nh * t * hs) as u64;
        let v = k + (2 * b * kvh * t * hs) as u64;
        Ok((q, k, v))
    }

    pub(super) fn rope_attention_fwd_impl(
        &mut self,
        out: &mut DevBuf,
        att: &mut CudaSlice<f32>,
        saved: &mut DevBuf,
        qkv: &DevBuf,
        shape: AttentionShape,
        theta: f32,
    ) -> Result<(), CudaError> {
        let AttentionShape { b, t, c, nh, kvh, .. } = shape;
        let (hs, _) = Self::attention_heads(c, nh, kvh)?;
        if !self.rope_saves_heads(saved, &shape) {
            self.rope_impl(RopeDir::Fwd, saved, qkv, b, t, nh, kvh, hs, theta)?;
            return self.attention_fwd_impl(out, att, saved, shape);
        }
        let w = (nh + 2 * kvh) * hs;
        if qkv.len() < b * t * w {
            return Err(CudaError::Unsupported(format!("qkv holds {} values; (B, T, (NH + 2·KVH)·HD) needs {}", qkv.len(), b * t * w)));
        }
        let heads = self.saved_heads(saved, &shape, hs)?;
        let tab = self.rope_table_ptr(t, hs, theta)?;
        let (q, k, v) = heads;
        let (qkvp, qkv16) = (self.ptr(qkv.raw()), qkv.is_bf16() as i32);
        let (bi, ti, nhi, kvhi, hsi) = (b as i32, t as i32, nh as i32, kvh as i32, hs as i32);
        launch!(self, "rope_split_fwd", split_grid(b * t, w, hs), q, k, v, qkvp, qkv16, tab, bi, ti, nhi, kvhi, hsi)?;
        self.flash_fwd(out, att, Heads::head_major(heads, &shape)?, shape)
    }

    /// dqkv (before the rotation) from q, k, v as the forward saved them. The fused path rotates
    /// dq and dk back as the attention's kernels store them (`dqkv_rot` unused); the other runs
    /// the attention into `dqkv_rot`, then `rope_bwd`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rope_attention_bwd_impl(
        &mut self,
        dqkv: &mut DevBuf,
        dqkv_rot: &mut DevBuf,
        datt: &mut CudaSlice<f32>,
        dout: &DevBuf,
        out: &DevBuf,
        saved: &DevBuf,
        att: &CudaSlice<f32>,
        shape: AttentionShape,
        theta: f32,
    ) -> Result<(), CudaError> {
        let AttentionShape { b, t, c, nh, kvh, .. } = shape;
        let (hs, _) = Self::attention_heads(c, nh, kvh)?;
        if !self.rope_saves_heads(saved, &shape) {
            self.attention_bwd_impl(dqkv_rot, datt, dout, out, saved, att, shape)?;
            return self.rope_impl(RopeDir::Bwd, dqkv, dqkv_rot, b, t, nh, kvh, hs, theta);
        }
        let heads = Heads::head_major(self.saved_heads(saved, &shape, hs)?, &shape)?;
        let tab = self.rope_table_ptr(t, hs, theta)?;
        self.flash_bwd(dqkv, datt, dout, out, att, heads, shape, tab)
    }
}
