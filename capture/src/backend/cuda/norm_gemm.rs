//! GEMMs whose operand is a normalization's output, computed as the operand is cast
//! (`Backend::gemm_of_norm`): qkv's and fc1's fprop read ln = RMSNorm(x) (Llama) or LayerNorm(x)
//! (GPT). Unfused, `kernels/rmsnorm.cu` or `layernorm.cu` writes ln in f32 and the cast reads it
//! back; fused, the norm's kernel writes only its row statistics (rstd, and the mean) and the cast
//! kernel of a normalization source (`kernels/cast_src.cuh`: SRC_RMSNORM, SRC_LAYERNORM) reads x and
//! computes each value with the same element math (`kernels/norms.cuh`), so the codes and
//! statistics are bit-identical and ln is neither written nor read again. The cast is kept for the
//! site's wgrad under ln's address, as the activations' are (`activation_gemm.rs`).

use super::cast::{CastInput, NormSrc};
use super::{CudaBackend, DevBuf};
use crate::backend::{Backend, GemmCall, NormFwd, NormStats};

/// Whether the cast kernels take `n` for rows of `c` values: f32 buffers ([`NormSrc::computable`])
/// of whole rows, a gain per column and a statistic per row.
fn computable(n: &NormSrc, c: usize) -> bool {
    let rows = n.x.len().checked_div(c).filter(|r| r * c == n.x.len());
    rows.is_some_and(|rows| n.gain.len() == c && n.rstd.len() == rows && n.mean.is_none_or(|m| m.len() == rows) && n.shift.is_none_or(|b| b.len() == c))
        && n.computable()
}

impl CudaBackend {
    /// See [`Backend::add_with_norm_stats`]: one pass (`rmsnorm_add_stats`, `layernorm_add_stats`).
    pub(super) fn add_with_norm_stats_impl(&mut self, out: &mut DevBuf, a: &DevBuf, b: &DevBuf, stats: NormStats<'_, DevBuf>) -> bool {
        match stats {
            NormStats::Rms { rstd, c, eps } => self.spanned("add", |me| me.rmsnorm_add_stats_impl(out, rstd, a, b, c, eps)),
            NormStats::Layer { mean, rstd, c } => self.spanned("add", |me| me.layernorm_add_stats_impl(out, mean, rstd, a, b, c)),
        };
        self.error.is_none()
    }

    /// See [`Backend::gemm_of_norm`].
    pub(super) fn gemm_of_norm_impl(
        &mut self,
        call: &GemmCall,
        out: &mut DevBuf,
        ln: &mut DevBuf,
        norm: NormFwd<'_, DevBuf>,
        w: &DevBuf,
        bias: Option<&DevBuf>,
    ) -> bool {
        let (inp, gain, shift) = match &norm {
            NormFwd::Rms { inp, w, .. } => (*inp, *w, None),
            NormFwd::Layer { inp, w, b, .. } => (*inp, *w, Some(*b)),
        };
        let inputs_ok = match &norm {
            NormFwd::Rms { rstd, c, .. } => computable(&NormSrc { x: inp, gain, shift, rstd, mean: None, like: ln }, *c),
            NormFwd::Layer { mean, rstd, c, .. } => computable(&NormSrc { x: inp, gain, shift, rstd, mean: Some(mean), like: ln }, *c),
        };
        if !self.computes_operand(call, inputs_ok) {
            self.norm_fwd(ln, norm);
            self.gemm(call, out, ln, w, bias, None);
            return true;
        }
        // The row statistics (unless the residual add before computed them), not ln.
        let (rstd, mean): (&DevBuf, Option<&DevBuf>) = match norm {
            NormFwd::Rms { inp, w, rstd, c, eps, ready } => {
                if !ready {
                    self.spanned("rmsnorm_fwd", |me| me.rmsnorm_fwd_impl(None, rstd, inp, w, c, eps));
                }
                (rstd, None)
            }
            NormFwd::Layer { inp, w, b, mean, rstd, c, ready } => {
                if !ready {
                    self.spanned("layernorm_fwd", |me| me.layernorm_fwd_impl(None, mean, rstd, inp, w, b, c));
                }
                (rstd, Some(mean))
            }
        };
        let a = CastInput::Normed(NormSrc { x: inp, gain, shift, rstd, mean, like: ln });
        self.spanned("gemm", |me| me.linear(call, out, a, CastInput::Buf(w), bias.map(|b| &**b), None, false, true, true));
        false
    }
}
