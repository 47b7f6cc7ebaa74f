//! The [`Backend`] trait for [`CudaBackend`]: each primitive is a profiler span around its
//! family's launcher (`*_impl`, in the file of its kernel family: see `mod.rs`) and the error
//! handling: the first error is kept for [`Backend::take_error`], the primitive returns a harmless
//! value in place of its result (an empty buffer, NaN values, NaN sums, every value counted as
//! non-finite, no reports), and while an error is kept no primitive touches the device.

use super::attention::AttentionShape;
use super::rope::RopeDir;
use super::*;
use crate::backend::{Activation, NormFwd, NormStats};

impl Backend for CudaBackend {
    type Buf = DevBuf;
    type Tokens = CudaTokens;

    fn kind(&self) -> &'static str {
        "cuda"
    }

    fn device_info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn zeros(&mut self, n: usize) -> DevBuf {
        let r = self.guarded("zeros", |me| Ok(me.stream.alloc_zeros::<f32>(n.max(1))?));
        DevBuf::f32(r.unwrap_or_else(|| self.placeholder()))
    }

    fn zeros_bf16(&mut self, n: usize) -> DevBuf {
        let r = self.guarded("zeros", |me| Ok(me.stream.alloc_zeros::<f32>(n.div_ceil(2).max(1))?));
        match r {
            Some(mem) => DevBuf::bf16(mem, n),
            None => DevBuf::f32(self.placeholder()),
        }
    }

    fn upload(&mut self, data: &[f32]) -> DevBuf {
        if data.is_empty() {
            return self.zeros(1);
        }
        let r = self.guarded("upload", |me| Ok(me.stream.clone_htod(data)?));
        DevBuf::f32(r.unwrap_or_else(|| self.placeholder()))
    }

    fn upload_tokens(&mut self, tokens: &[u32]) -> CudaTokens {
        let r = self.spanned("upload_tokens", |me| me.upload_tokens_impl(tokens));
        r.unwrap_or_else(|| CudaTokens {
            ids: self.placeholder(),
            uniq: self.placeholder(),
            offsets: self.placeholder(),
            positions: self.placeholder(),
            n_uniq: 0,
        })
    }

    fn download(&mut self, buf: &DevBuf, offset: usize, len: usize, stride: usize) -> Vec<f32> {
        self.spanned("download", |me| me.download_impl(buf, offset, len, stride)).unwrap_or_else(|| vec![f32::NAN; len])
    }

    fn len(&self, buf: &DevBuf) -> usize {
        buf.len()
    }

    fn fill_zero(&mut self, buf: &mut DevBuf) {
        self.spanned("fill_zero", |me| {
            let raw = buf.raw_mut();
            let (ptr, bytes) = (me.ptr(raw), raw.len() * std::mem::size_of::<f32>());
            if !me.record_op(|| step_graph::Op::Zero { ptr, bytes })? {
                me.stream.memset_zeros(raw)?;
            }
            Ok(())
        });
    }

    fn fill_zero_all(&mut self, bufs: &mut [&mut DevBuf]) {
        self.spanned("fill_zero", |me| me.zero_all_impl(bufs));
    }

    fn embedding_fwd(&mut self, out: &mut DevBuf, tokens: &CudaTokens, wte: &DevBuf, c: usize) {
        self.spanned("embedding_fwd", |me| me.embedding_fwd_impl(out, tokens, wte, c));
    }

    fn embedding_bwd(&mut self, dwte: &mut DevBuf, dout: &DevBuf, tokens: &CudaTokens, c: usize) {
        self.spanned("embedding_bwd", |me| me.embedding_bwd_impl(dwte, dout, tokens, c));
    }

    fn layernorm_fwd(&mut self, out: &mut DevBuf, mean: &mut DevBuf, rstd: &mut DevBuf, inp: &DevBuf, w: &DevBuf, b: &DevBuf, c: usize) {
        self.spanned("layernorm_fwd", |me| me.layernorm_fwd_impl(Some(out), mean, rstd, inp, w, b, c));
    }

    fn layernorm_bwd(
        &mut self,
        dinp: &mut DevBuf,
        dw: &mut DevBuf,
        db: &mut DevBuf,
        dout: &DevBuf,
        inp: &DevBuf,
        w: &DevBuf,
        mean: &DevBuf,
        rstd: &DevBuf,
        c: usize,
    ) {
        self.spanned("layernorm_bwd", |me| me.layernorm_bwd_impl(dinp, dw, db, dout, inp, w, mean, rstd, c));
    }

    fn rmsnorm_fwd(&mut self, out: &mut DevBuf, rstd: &mut DevBuf, inp: &DevBuf, w: &DevBuf, c: usize, eps: f32) {
        self.spanned("rmsnorm_fwd", |me| me.rmsnorm_fwd_impl(Some(out), rstd, inp, w, c, eps));
    }

    fn rmsnorm_bwd(&mut self, dinp: &mut DevBuf, dw: &mut DevBuf, dout: &DevBuf, inp: &DevBuf, w: &DevBuf, rstd: &DevBuf, c: usize) {
        self.spanned("rmsnorm_bwd", |me| me.rmsnorm_bwd_impl(dinp, dw, dout, inp, w, rstd, c));
    }

    fn swiglu_fwd(&mut self, out: &mut DevBuf, inp: &DevBuf, f: usize) {
        self.spanned("swiglu_fwd", |me| me.swiglu_fwd_impl(out, inp, f));
    }

    fn swiglu_bwd(&mut self, dinp: &mut DevBuf, inp: &DevBuf, dout: &DevBuf, f: usize) {
        self.spanned("swiglu_bwd", |me| me.swiglu_bwd_impl(dinp, inp, dout, f));
    }

    fn rope_fwd(&mut self, out: &mut DevBuf, qkv: &DevBuf, b: usize, t: usize, nh: usize, kvh: usize, hd: usize, theta: f32) {
        self.spanned("rope_fwd", |me| me.rope_impl(RopeDir::Fwd, out, qkv, b, t, nh, kvh, hd, theta));
    }

    fn rope_bwd(&mut self, dqkv: &mut DevBuf, dout: &DevBuf, b: usize, t: usize, nh: usize, kvh: usize, hd: usize, theta: f32) {
        self.spanned("rope_bwd", |me| me.rope_impl(RopeDir::Bwd, dqkv, dout, b, t, nh, kvh, hd, theta));
    }

    fn attention_saved_len(&self, b: usize, t: usize, c: usize, nh: usize) -> usize {
        self.attention_saved(b, t, c, nh)
    }

    fn attention_fwd(&mut self, out: &mut DevBuf, att: &mut DevBuf, qkv: &DevBuf, b: usize, t: usize, c: usize, nh: usize, kvh: usize, causal: bool) {
        self.spanned("attention_fwd", |me| me.attention_fwd_impl(out, att, qkv, AttentionShape { b, t, c, nh, kvh, causal }));
    }

    fn attention_bwd(
        &mut self,
        dqkv: &mut DevBuf,
        datt: &mut DevBuf,
        dout: &DevBuf,
        out: &DevBuf,
        qkv: &DevBuf,
        att: &DevBuf,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
        kvh: usize,
        causal: bool,
    ) {
        self.spanned("attention_bwd", |me| me.attention_bwd_impl(dqkv, datt, dout, out, qkv, att, AttentionShape { b, t, c, nh, kvh, causal }));
    }

    fn rope_attention_fwd(
        &mut self,
        out: &mut DevBuf,
        att: &mut DevBuf,
        saved: &mut DevBuf,
        qkv: &DevBuf,
        b: usize,
        t: usize,
        nh: usize,
        kvh: usize,
        hd: usize,
        theta: f32,
        causal: bool,
    ) {
        let shape = AttentionShape { b, t, c: nh * hd, nh, kvh, causal };
        self.spanned("attention_fwd", |me| me.rope_attention_fwd_impl(out, att, saved, qkv, shape, theta));
    }

    fn rope_attention_bwd(
        &mut self,
        dqkv: &mut DevBuf,
        dqkv_rot: &mut DevBuf,
        datt: &mut DevBuf,
        dout: &DevBuf,
        out: &DevBuf,
        saved: &DevBuf,
        att: &DevBuf,
        b: usize,
        t: usize,
        nh: usize,
        kvh: usize,
        hd: usize,
        theta: f32,
        causal: bool,
    ) {
        let shape = AttentionShape { b, t, c: nh * hd, nh, kvh, causal };
        self.spanned("attention_bwd", |me| me.rope_attention_bwd_impl(dqkv, dqkv_rot, datt, dout, out, saved, att, shape, theta));
    }

    fn gelu_fwd(&mut self, out: &mut DevBuf, inp: &DevBuf) {
        self.spanned("gelu_fwd", |me| me.gelu_fwd_impl(out, inp));
    }

    fn gelu_bwd(&mut self, dinp: &mut DevBuf, inp: &DevBuf, dout: &DevBuf) {
        self.spanned("gelu_bwd", |me| me.gelu_bwd_impl(dinp, inp, dout));
    }

    fn add(&mut self, out: &mut DevBuf, a: &DevBuf, b: &DevBuf) {
        self.spanned("add", |me| me.residual_fwd_impl(out, a, b));
    }

    fn add_inplace(&mut self, acc: &mut DevBuf, x: &DevBuf) {
        self.spanned("add_inplace", |me| me.residual_bwd_impl(acc, x));
    }

    fn round_bf16(&mut self, x: &mut DevBuf) {
        self.spanned("round_bf16", |me| me.round_bf16_fwd_impl(x));
    }

    fn matmul_bf16_fwd(&mut self, out: &mut DevBuf, inp: &DevBuf, w: &DevBuf, dims: LinearDims) {
        self.spanned("matmul_bf16_fwd", |me| me.matmul_bf16_fwd_impl(out, inp, w, dims));
    }

    fn matmul_bf16_bwd(&mut self, dinp: &mut DevBuf, dw: &mut DevBuf, dout: &DevBuf, inp: &DevBuf, w: &DevBuf, dims: LinearDims) {
        self.spanned("matmul_bf16_bwd", |me| me.matmul_bf16_bwd_impl(dinp, dw, dout, inp, w, dims));
    }

    fn crossentropy(&mut self, losses: &mut DevBuf, logits: &mut DevBuf, targets: &CudaTokens, v: usize, dloss: f32) {
        self.spanned("crossentropy", |me| me.crossentropy_fwd_impl(losses, logits, targets, v, dloss));
    }

    fn sumsq(&mut self, x: &DevBuf) -> f64 {
        self.guarded("sumsq", |me| me.sumsq_impl(&[x])).unwrap_or(f64::NAN)
    }

    fn sumsq_all(&mut self, xs: &[DevBuf]) -> f64 {
        let refs: Vec<&DevBuf> = xs.iter().collect();
        self.spanned("sumsq_all", |me| me.sumsq_impl(&refs)).unwrap_or(f64::NAN)
    }

    fn count_nonfinite(&mut self, x: &DevBuf) -> u64 {
        // Unknown counts as non-finite: a check that failed must not pass for a clean buffer.
        self.guarded("count_nonfinite", |me| me.count_nonfinite_impl(x)).unwrap_or(x.len() as u64)
    }

    fn adamw(&mut self, p: &mut DevBuf, g: &DevBuf, m: &mut DevBuf, v: &mut DevBuf, h: &AdamW) {
        self.spanned("adamw", |me| me.adamw_fwd_impl(p, g, m, v, h));
    }

    fn adamw_all(&mut self, ps: &mut [DevBuf], gs: &[DevBuf], ms: &mut [DevBuf], vs: &mut [DevBuf], h: &AdamW) {
        self.spanned("adamw", |me| me.adamw_all_impl(ps, gs, ms, vs, h));
    }

    fn cast_weights(&mut self, calls: &[(GemmCall, &DevBuf)]) {
        // The step's first primitive: the FP8SCOPE_LEAD_US hold goes first.
        if self.settings.lead_ns > 0 {
            self.spanned("lead", |me| me.lead());
        }
        if self.weights.batched {
            self.spanned("cast_weights", |me| me.cast_weights_impl(calls));
        }
    }

    fn gemm(&mut self, call: &GemmCall, out: &mut DevBuf, a: &DevBuf, b: &DevBuf, bias: Option<&DevBuf>, dbias: Option<&mut DevBuf>) {
        let (bias, dbias) = (bias.map(|b| &**b), dbias.map(|d| &mut **d));
        self.spanned("gemm", |me| me.gemm_of_buffers(call, out, a, b, bias, dbias));
    }

    fn gemm_of_activation(
        &mut self,
        call: &GemmCall,
        out: &mut DevBuf,
        act: &mut DevBuf,
        h: &DevBuf,
        kind: Activation,
        w: &DevBuf,
        bias: Option<&DevBuf>,
    ) -> bool {
        self.gemm_of_activation_impl(call, out, act, h, kind, w, bias)
    }

    fn gemm_of_activation_grad(&mut self, call: &GemmCall, out: &mut DevBuf, dh: &mut DevBuf, h: &DevBuf, dact: &DevBuf, kind: Activation, w: &DevBuf) -> bool {
        self.gemm_of_activation_grad_impl(call, out, dh, h, dact, kind, w)
    }

    fn add_with_norm_stats(&mut self, out: &mut DevBuf, a: &DevBuf, b: &DevBuf, stats: NormStats<'_, DevBuf>) -> bool {
        self.add_with_norm_stats_impl(out, a, b, stats)
    }

    fn gemm_of_norm(&mut self, call: &GemmCall, out: &mut DevBuf, ln: &mut DevBuf, norm: NormFwd<'_, DevBuf>, w: &DevBuf, bias: Option<&DevBuf>) -> bool {
        self.gemm_of_norm_impl(call, out, ln, norm, w, bias)
    }

    fn reuses_kept_cast(&self, call: &GemmCall, operand: usize, x: &DevBuf) -> bool {
        self.reuses_kept_cast_impl(call, operand, x)
    }

    fn begin_step_work(&mut self, signature: Option<u64>) {
        self.host_gap.launching();
        self.begin_step_work_impl(signature);
    }

    fn end_step_work(&mut self) {
        self.end_step_work_impl();
    }

    fn gemms_done(&mut self) {
        self.guarded("gemms_done", |me| me.prefetch_channels());
    }

    fn take_reports(&mut self) -> Vec<GemmReport> {
        self.guarded("take_reports", |me| me.download_all()).unwrap_or_else(|| {
            self.forget_step();
            Vec::new()
        })
    }

    fn take_error(&mut self) -> Option<String> {
        self.error.take()
    }
}
