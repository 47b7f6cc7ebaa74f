//! The Llama-style step: RMSNorm with a learned gain, rotary embeddings on q and k, grouped-query
//! attention, SwiGLU MLP (fc1 computes gate and up in one GEMM of width 2F), no biases, an lm_head
//! of its own or tied to the embedding. Forward then backward.

use super::{DumpCapture, Layout, Model, StepPlan, TpLink};
use crate::backend::{Activation, Backend, GemmCall, NormFwd, NormStats};
use fp8scope_schemas::names::{Gemm, Module};

impl<B: Backend> Model<B> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn llama_step(
        &mut self,
        be: &mut B,
        inputs: &B::Tokens,
        targets: &B::Tokens,
        supervised: usize,
        plan: &StepPlan,
        dumps: &mut Vec<DumpCapture>,
        tp: &mut TpLink<'_>,
    ) {
        let d = self.dims;
        let lay = Layout::of(&d);
        // ---- forward
        let fprops = self.fprop_calls(plan);
        self.cast_weights(be, &fprops);
        {
            let s = &mut self.state;
            be.embedding_fwd(&mut s.res[0], inputs, &s.params[super::WTE], d.c);
        }
        // Whether the residual add before a layer's first norm computed its rstd (none before the first).
        let mut ln1_ready = false;
        for l in 0..d.l {
            let calls = &fprops[l * Module::ALL.len()..(l + 1) * Module::ALL.len()];
            let s = &mut self.state;
            let (before, after) = s.res.split_at_mut(l + 1);
            let (res_in, res_out) = (&before[l], &mut after[0]);
            let (this, next) = s.layers.split_at_mut(l + 1);
            let a = &mut this[l];
            let p = &s.params;
            let w = |m: Module| &p[lay.linear(l, m).0];
            let norm = NormFwd::Rms { inp: res_in, w: &p[lay.norm(l, true).0], rstd: &mut a.ln1_rstd, c: d.c, eps: d.eps, ready: ln1_ready };
            Self::linear_of_norm(be, &calls[0], plan, dumps, &mut s.qkv_pre, &mut s.ln, norm, w(Module::Qkv), None);
            be.rope_attention_fwd(&mut a.atty, &mut a.att, &mut a.qkv_rot, &s.qkv_pre, d.b, d.t, d.nh, d.kvh, d.hd, d.rope_theta, d.causal);
            Self::linear(be, &calls[1], plan, dumps, &mut s.proj, &a.atty, w(Module::Proj), None, None);
            tp.all_reduce_bf16(be, &mut s.proj);
            let ready = be.add_with_norm_stats(&mut a.res2, res_in, &s.proj, NormStats::Rms { rstd: &mut a.ln2_rstd, c: d.c, eps: d.eps });
            let norm = NormFwd::Rms { inp: &a.res2, w: &p[lay.norm(l, false).0], rstd: &mut a.ln2_rstd, c: d.c, eps: d.eps, ready };
            Self::linear_of_norm(be, &calls[2], plan, dumps, &mut a.fc1, &mut s.ln, norm, w(Module::Fc1), None);
            Self::linear_of_activation(be, &calls[3], plan, dumps, &mut s.fc2, &mut s.act, &a.fc1, Activation::Swiglu { f: d.f }, w(Module::Fc2), None);
            tp.all_reduce_bf16(be, &mut s.fc2);
            // The next layer's first norm, or the final norm (which computes its own: it writes lnf).
            ln1_ready = match next.first_mut() {
                Some(n) => be.add_with_norm_stats(res_out, &a.res2, &s.fc2, NormStats::Rms { rstd: &mut n.ln1_rstd, c: d.c, eps: d.eps }),
                None => {
                    be.add(res_out, &a.res2, &s.fc2);
                    false
                }
            };
        }
        let (fw, _) = lay.final_norm();
        {
            let s = &mut self.state;
            be.rmsnorm_fwd(&mut s.lnf, &mut s.lnf_rstd, &s.res[d.l], &s.params[fw], d.c, d.eps);
        }
        self.head(be, targets, supervised);

        // ---- backward
        {
            let s = &mut self.state;
            be.fill_zero(&mut s.dres);
            be.rmsnorm_bwd(&mut s.dres, &mut s.grads[fw], &s.dlnf, &s.res[d.l], &s.params[fw], &s.lnf_rstd, d.c);
        }
        for l in (0..d.l).rev() {
            let dgrad: Vec<GemmCall> = Module::ALL.iter().map(|&m| self.call(plan, l, m, Gemm::Dgrad)).collect();
            let wgrad: Vec<GemmCall> = Module::ALL.iter().map(|&m| self.call(plan, l, m, Gemm::Wgrad)).collect();
            let s = &mut self.state;
            let a = &s.layers[l];
            let p = &s.params;
            let w = |m: Module| lay.linear(l, m).0;
            let (n1, n2) = (lay.norm(l, true).0, lay.norm(l, false).0);
            // fc2
            Self::linear(be, &dgrad[3], plan, dumps, &mut s.dact, &s.dres, &p[w(Module::Fc2)], None, None);
            let kind = Activation::Swiglu { f: d.f };
            if !be.reuses_kept_cast(&wgrad[3], 1, &s.act) {
                be.activation_fwd(&mut s.act, &a.fc1, kind);
            }
            Self::linear(be, &wgrad[3], plan, dumps, &mut s.grads[w(Module::Fc2)], &s.dres, &s.act, None, None);
            // fc1 (its dgrad's operand, the SwiGLU backward, may be computed as it is cast)
            let written = Self::linear_of_activation_grad(be, &dgrad[2], plan, dumps, &mut s.dln, &mut s.dfc1, &a.fc1, &s.dact, kind, &p[w(Module::Fc1)]);
            tp.all_reduce_bf16(be, &mut s.dln);
            if !written && !be.reuses_kept_cast(&wgrad[2], 0, &s.dfc1) {
                be.activation_bwd(&mut s.dfc1, &a.fc1, &s.dact, kind);
            }
            if !be.reuses_kept_cast(&wgrad[2], 1, &s.ln) {
                be.rmsnorm_fwd(&mut s.ln, &mut s.norm_rstd, &a.res2, &p[n2], d.c, d.eps);
            }
            Self::linear(be, &wgrad[2], plan, dumps, &mut s.grads[w(Module::Fc1)], &s.dfc1, &s.ln, None, None);
            be.rmsnorm_bwd(&mut s.dres, &mut s.grads[n2], &s.dln, &a.res2, &p[n2], &a.ln2_rstd, d.c);
            // proj
            Self::linear(be, &dgrad[1], plan, dumps, &mut s.datty, &s.dres, &p[w(Module::Proj)], None, None);
            Self::linear(be, &wgrad[1], plan, dumps, &mut s.grads[w(Module::Proj)], &s.dres, &a.atty, None, None);
            be.rope_attention_bwd(
                &mut s.dqkv,
                &mut s.dqkv_rot,
                &mut s.datt,
                &s.datty,
                &a.atty,
                &a.qkv_rot,
                &a.att,
                d.b,
                d.t,
                d.nh,
                d.kvh,
                d.hd,
                d.rope_theta,
                d.causal,
            );
            // qkv
            Self::linear(be, &dgrad[0], plan, dumps, &mut s.dln, &s.dqkv, &p[w(Module::Qkv)], None, None);
            tp.all_reduce_bf16(be, &mut s.dln);
            if !be.reuses_kept_cast(&wgrad[0], 1, &s.ln) {
                be.rmsnorm_fwd(&mut s.ln, &mut s.norm_rstd, &s.res[l], &p[n1], d.c, d.eps);
            }
            Self::linear(be, &wgrad[0], plan, dumps, &mut s.grads[w(Module::Qkv)], &s.dqkv, &s.ln, None, None);
            be.rmsnorm_bwd(&mut s.dres, &mut s.grads[n1], &s.dln, &s.res[l], &p[n1], &a.ln1_rstd, d.c);
        }
        let s = &mut self.state;
        be.embedding_bwd(&mut s.grads[super::WTE], &s.dres, inputs, d.c);
    }
}
