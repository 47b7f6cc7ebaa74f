//! The GPT-2-style step: pre-LN LayerNorm (with bias), multi-head attention, GELU MLP, biases on
//! every linear layer. Forward then backward, in the order the recorded tables assume.

use super::{DumpCapture, Layout, Model, StepPlan, TpLink, two_mut};
use crate::backend::{Activation, Backend, GemmCall, NormFwd, NormStats};
use fp8scope_schemas::names::{Gemm, Module};

impl<B: Backend> Model<B> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gpt_step(
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
        let bias = |i: Option<usize>| i.expect("gpt linears and norms have biases");
        // A row-parallel layer's bias is added once over the tensor-parallel group: by its rank 0.
        let row_bias = tp.rank() == 0;
        // ---- forward
        let fprops = self.fprop_calls(plan);
        self.cast_weights(be, &fprops);
        {
            let s = &mut self.state;
            be.embedding_fwd(&mut s.res[0], inputs, &s.params[super::WTE], d.c);
        }
        // Whether the residual add before a layer's first norm computed its statistics (none before
        // the first).
        let mut ln1_ready = false;
        for l in 0..d.l {
            let calls = &fprops[l * Module::ALL.len()..(l + 1) * Module::ALL.len()];
            let s = &mut self.state;
            let (before, after) = s.res.split_at_mut(l + 1);
            let (res_in, res_out) = (&before[l], &mut after[0]);
            let (this, next) = s.layers.split_at_mut(l + 1);
            let a = &mut this[l];
            let p = &s.params;
            let linear = |m: Module| lay.linear(l, m);
            let (n1w, n1b) = lay.norm(l, true);
            let (n2w, n2b) = lay.norm(l, false);
            let norm = NormFwd::Layer { inp: res_in, w: &p[n1w], b: &p[bias(n1b)], mean: &mut a.ln1_mean, rstd: &mut a.ln1_rstd, c: d.c, ready: ln1_ready };
            let (w, bi) = linear(Module::Qkv);
            Self::linear_of_norm(be, &calls[0], plan, dumps, &mut a.qkv, &mut s.ln, norm, &p[w], Some(&p[bias(bi)]));
            be.attention_fwd(&mut a.atty, &mut a.att, &a.qkv, d.b, d.t, d.q_width(), d.nh, d.nh, d.causal);
            let (w, bi) = linear(Module::Proj);
            Self::linear(be, &calls[1], plan, dumps, &mut s.proj, &a.atty, &p[w], row_bias.then(|| &p[bias(bi)]), None);
            tp.all_reduce_bf16(be, &mut s.proj);
            let ready = be.add_with_norm_stats(&mut a.res2, res_in, &s.proj, NormStats::Layer { mean: &mut a.ln2_mean, rstd: &mut a.ln2_rstd, c: d.c });
            let norm = NormFwd::Layer { inp: &a.res2, w: &p[n2w], b: &p[bias(n2b)], mean: &mut a.ln2_mean, rstd: &mut a.ln2_rstd, c: d.c, ready };
            let (w, bi) = linear(Module::Fc1);
            Self::linear_of_norm(be, &calls[2], plan, dumps, &mut a.fc1, &mut s.ln, norm, &p[w], Some(&p[bias(bi)]));
            let (w, bi) = linear(Module::Fc2);
            Self::linear_of_activation(be, &calls[3], plan, dumps, &mut s.fc2, &mut s.act, &a.fc1, Activation::Gelu, &p[w], row_bias.then(|| &p[bias(bi)]));
            tp.all_reduce_bf16(be, &mut s.fc2);
            // The next layer's first norm, or the final norm (which computes its own: it writes lnf).
            ln1_ready = match next.first_mut() {
                Some(n) => be.add_with_norm_stats(res_out, &a.res2, &s.fc2, NormStats::Layer { mean: &mut n.ln1_mean, rstd: &mut n.ln1_rstd, c: d.c }),
                None => {
                    be.add(res_out, &a.res2, &s.fc2);
                    false
                }
            };
        }
        let (fw, fb) = lay.final_norm();
        {
            let s = &mut self.state;
            be.layernorm_fwd(&mut s.lnf, &mut s.lnf_mean, &mut s.lnf_rstd, &s.res[d.l], &s.params[fw], &s.params[bias(fb)], d.c);
        }
        self.head(be, targets, supervised);

        // ---- backward
        {
            let s = &mut self.state;
            be.fill_zero(&mut s.dres);
            let (g_lnf_w, g_lnf_b) = two_mut(&mut s.grads, fw, bias(fb));
            be.layernorm_bwd(&mut s.dres, g_lnf_w, g_lnf_b, &s.dlnf, &s.res[d.l], &s.params[fw], &s.lnf_mean, &s.lnf_rstd, d.c);
        }
        for l in (0..d.l).rev() {
            let dgrad: Vec<GemmCall> = Module::ALL.iter().map(|&m| self.call(plan, l, m, Gemm::Dgrad)).collect();
            let wgrad: Vec<GemmCall> = Module::ALL.iter().map(|&m| self.call(plan, l, m, Gemm::Wgrad)).collect();
            let s = &mut self.state;
            let a = &s.layers[l];
            let p = &s.params;
            let linear = |m: Module| {
                let (w, b) = lay.linear(l, m);
                (w, bias(b))
            };
            let (n1w, n1b) = lay.norm(l, true);
            let (n2w, n2b) = lay.norm(l, false);
            // fc2
            let (w, bi) = linear(Module::Fc2);
            Self::linear(be, &dgrad[3], plan, dumps, &mut s.dact, &s.dres, &p[w], None, None);
            if !be.reuses_kept_cast(&wgrad[3], 1, &s.act) {
                be.activation_fwd(&mut s.act, &a.fc1, Activation::Gelu);
            }
            let (gw, gb) = two_mut(&mut s.grads, w, bi);
            Self::linear(be, &wgrad[3], plan, dumps, gw, &s.dres, &s.act, None, Some(gb));
            // fc1 (its dgrad's operand, the GELU backward, may be computed as it is cast)
            let (w, bi) = linear(Module::Fc1);
            let written = Self::linear_of_activation_grad(be, &dgrad[2], plan, dumps, &mut s.dln, &mut s.dfc1, &a.fc1, &s.dact, Activation::Gelu, &p[w]);
            tp.all_reduce_bf16(be, &mut s.dln);
            if !written && !be.reuses_kept_cast(&wgrad[2], 0, &s.dfc1) {
                be.activation_bwd(&mut s.dfc1, &a.fc1, &s.dact, Activation::Gelu);
            }
            if !be.reuses_kept_cast(&wgrad[2], 1, &s.ln) {
                be.layernorm_fwd(&mut s.ln, &mut s.norm_mean, &mut s.norm_rstd, &a.res2, &p[n2w], &p[bias(n2b)], d.c);
            }
            let (gw, gb) = two_mut(&mut s.grads, w, bi);
            Self::linear(be, &wgrad[2], plan, dumps, gw, &s.dfc1, &s.ln, None, Some(gb));
            let (gw, gb) = two_mut(&mut s.grads, n2w, bias(n2b));
            be.layernorm_bwd(&mut s.dres, gw, gb, &s.dln, &a.res2, &p[n2w], &a.ln2_mean, &a.ln2_rstd, d.c);
            // proj
            let (w, bi) = linear(Module::Proj);
            Self::linear(be, &dgrad[1], plan, dumps, &mut s.datty, &s.dres, &p[w], None, None);
            let (gw, gb) = two_mut(&mut s.grads, w, bi);
            Self::linear(be, &wgrad[1], plan, dumps, gw, &s.dres, &a.atty, None, Some(gb));
            be.attention_bwd(&mut s.dqkv, &mut s.datt, &s.datty, &a.atty, &a.qkv, &a.att, d.b, d.t, d.q_width(), d.nh, d.nh, d.causal);
            // qkv
            let (w, bi) = linear(Module::Qkv);
            Self::linear(be, &dgrad[0], plan, dumps, &mut s.dln, &s.dqkv, &p[w], None, None);
            tp.all_reduce_bf16(be, &mut s.dln);
            if !be.reuses_kept_cast(&wgrad[0], 1, &s.ln) {
                be.layernorm_fwd(&mut s.ln, &mut s.norm_mean, &mut s.norm_rstd, &s.res[l], &p[n1w], &p[bias(n1b)], d.c);
            }
            let (gw, gb) = two_mut(&mut s.grads, w, bi);
            Self::linear(be, &wgrad[0], plan, dumps, gw, &s.dqkv, &s.ln, None, Some(gb));
            let (gw, gb) = two_mut(&mut s.grads, n1w, bias(n1b));
            be.layernorm_bwd(&mut s.dres, gw, gb, &s.dln, &s.res[l], &p[n1w], &a.ln1_mean, &a.ln1_rstd, d.c);
        }
        let s = &mut self.state;
        be.embedding_bwd(&mut s.grads[super::WTE], &s.dres, inputs, d.c);
    }
}
