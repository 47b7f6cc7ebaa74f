//! The [`Backend`] trait for [`CudaBackend`]: each primitive is a profiler span around its
//! family's launcher (`*_impl`, in the file of its kernel family: see `mod.rs`).

use super::*;

impl Backend for CudaBackend {
    type Buf = CudaSlice<f32>;
    type Tokens = CudaTokens;

    fn kind(&self) -> &'static str {
        "cuda"
    }

    fn device_info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn zeros(&mut self, n: usize) -> CudaSlice<f32> {
        ok(self.stream.alloc_zeros::<f32>(n.max(1)).map_err(CudaError::from))
    }

    fn upload(&mut self, data: &[f32]) -> CudaSlice<f32> {
        if data.is_empty() {
            return self.zeros(1);
        }
        ok(self.stream.clone_htod(data).map_err(CudaError::from))
    }

    fn upload_tokens(&mut self, tokens: &[u32]) -> CudaTokens {
        self.span("upload_tokens", |me| ok(me.upload_tokens_impl(tokens)))
    }

    fn download(&mut self, buf: &CudaSlice<f32>, offset: usize, len: usize, stride: usize) -> Vec<f32> {
        self.span("download", |me| ok(me.download_impl(buf, offset, len, stride)))
    }

    fn len(&self, buf: &CudaSlice<f32>) -> usize {
        buf.len()
    }

    fn fill_zero(&mut self, buf: &mut CudaSlice<f32>) {
        self.span("fill_zero", |me| ok(me.stream.memset_zeros(buf).map_err(CudaError::from)))
    }

    fn embedding_fwd(&mut self, out: &mut CudaSlice<f32>, tokens: &CudaTokens, wte: &CudaSlice<f32>, c: usize) {
        self.span("embedding_fwd", |me| ok(me.embedding_fwd_impl(out, tokens, wte, c)))
    }

    fn embedding_bwd(&mut self, dwte: &mut CudaSlice<f32>, dout: &CudaSlice<f32>, tokens: &CudaTokens, c: usize) {
        self.span("embedding_bwd", |me| ok(me.embedding_bwd_impl(dwte, dout, tokens, c)))
    }

    fn layernorm_fwd(
        &mut self,
        out: &mut CudaSlice<f32>,
        mean: &mut CudaSlice<f32>,
        rstd: &mut CudaSlice<f32>,
        inp: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        b: &CudaSlice<f32>,
        c: usize,
    ) {
        self.span("layernorm_fwd", |me| ok(me.layernorm_fwd_impl(out, mean, rstd, inp, w, b, c)))
    }

    fn layernorm_bwd(
        &mut self,
        dinp: &mut CudaSlice<f32>,
        dw: &mut CudaSlice<f32>,
        db: &mut CudaSlice<f32>,
        dout: &CudaSlice<f32>,
        inp: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        mean: &CudaSlice<f32>,
        rstd: &CudaSlice<f32>,
        c: usize,
    ) {
        self.span("layernorm_bwd", |me| ok(me.layernorm_bwd_impl(dinp, dw, db, dout, inp, w, mean, rstd, c)))
    }

    fn rmsnorm_fwd(&mut self, out: &mut CudaSlice<f32>, rstd: &mut CudaSlice<f32>, inp: &CudaSlice<f32>, w: &CudaSlice<f32>, c: usize, eps: f32) {
        self.span("rmsnorm_fwd", |me| ok(me.rmsnorm_fwd_impl(out, rstd, inp, w, c, eps)))
    }

    fn rmsnorm_bwd(
        &mut self,
        dinp: &mut CudaSlice<f32>,
        dw: &mut CudaSlice<f32>,
        dout: &CudaSlice<f32>,
        inp: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        rstd: &CudaSlice<f32>,
        c: usize,
    ) {
        self.span("rmsnorm_bwd", |me| ok(me.rmsnorm_bwd_impl(dinp, dw, dout, inp, w, rstd, c)))
    }

    fn swiglu_fwd(&mut self, out: &mut CudaSlice<f32>, inp: &CudaSlice<f32>, f: usize) {
        self.span("swiglu_fwd", |me| ok(me.swiglu_fwd_impl(out, inp, f)))
    }

    fn swiglu_bwd(&mut self, dinp: &mut CudaSlice<f32>, inp: &CudaSlice<f32>, dout: &CudaSlice<f32>, f: usize) {
        self.span("swiglu_bwd", |me| ok(me.swiglu_bwd_impl(dinp, inp, dout, f)))
    }

    fn rope_fwd(&mut self, out: &mut CudaSlice<f32>, qkv: &CudaSlice<f32>, b: usize, t: usize, nh: usize, kvh: usize, hd: usize, theta: f32) {
        self.span("rope_fwd", |me| ok(me.rope_impl("rope_fwd", out, qkv, b, t, nh, kvh, hd, theta)))
    }

    fn rope_bwd(&mut self, dqkv: &mut CudaSlice<f32>, dout: &CudaSlice<f32>, b: usize, t: usize, nh: usize, kvh: usize, hd: usize, theta: f32) {
        self.span("rope_bwd", |me| ok(me.rope_impl("rope_bwd", dqkv, dout, b, t, nh, kvh, hd, theta)))
    }

    fn attention_saved_len(&self, b: usize, t: usize, c: usize, nh: usize) -> usize {
        self.attention_saved(b, t, c, nh)
    }

    fn attention_fwd(
        &mut self,
        out: &mut CudaSlice<f32>,
        att: &mut CudaSlice<f32>,
        qkv: &CudaSlice<f32>,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
        kvh: usize,
        causal: bool,
    ) {
        self.span("attention_fwd", |me| ok(me.attention_fwd_impl(out, att, qkv, b, t, c, nh, kvh, causal)))
    }

    fn attention_bwd(
        &mut self,
        dqkv: &mut CudaSlice<f32>,
        datt: &mut CudaSlice<f32>,
        dout: &CudaSlice<f32>,
        out: &CudaSlice<f32>,
        qkv: &CudaSlice<f32>,
        att: &CudaSlice<f32>,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
        kvh: usize,
        causal: bool,
    ) {
        self.span("attention_bwd", |me| ok(me.attention_bwd_impl(dqkv, datt, dout, out, qkv, att, b, t, c, nh, kvh, causal)))
    }

    fn gelu_fwd(&mut self, out: &mut CudaSlice<f32>, inp: &CudaSlice<f32>) {
        self.span("gelu_fwd", |me| ok(me.gelu_fwd_impl(out, inp)))
    }

    fn gelu_bwd(&mut self, dinp: &mut CudaSlice<f32>, inp: &CudaSlice<f32>, dout: &CudaSlice<f32>) {
        self.span("gelu_bwd", |me| ok(me.gelu_bwd_impl(dinp, inp, dout)))
    }

    fn add(&mut self, out: &mut CudaSlice<f32>, a: &CudaSlice<f32>, b: &CudaSlice<f32>) {
        self.span("add", |me| ok(me.residual_fwd_impl(out, a, b)))
    }

    fn add_inplace(&mut self, acc: &mut CudaSlice<f32>, x: &CudaSlice<f32>) {
        self.span("add_inplace", |me| ok(me.residual_bwd_impl(acc, x)))
    }

    fn round_bf16(&mut self, x: &mut CudaSlice<f32>) {
        self.span("round_bf16", |me| ok(me.round_bf16_fwd_impl(x)))
    }

    fn matmul_bf16_fwd(&mut self, out: &mut CudaSlice<f32>, inp: &CudaSlice<f32>, w: &CudaSlice<f32>, dims: LinearDims) {
        self.span("matmul_bf16_fwd", |me| ok(me.matmul_bf16_fwd_impl(out, inp, w, dims)))
    }

    fn matmul_bf16_bwd(
        &mut self,
        dinp: &mut CudaSlice<f32>,
        dw: &mut CudaSlice<f32>,
        dout: &CudaSlice<f32>,
        inp: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        dims: LinearDims,
    ) {
        self.span("matmul_bf16_bwd", |me| ok(me.matmul_bf16_bwd_impl(dinp, dw, dout, inp, w, dims)))
    }

    fn crossentropy(&mut self, losses: &mut CudaSlice<f32>, dlogits: &mut CudaSlice<f32>, logits: &CudaSlice<f32>, targets: &CudaTokens, v: usize, dloss: f32) {
        self.span("crossentropy", |me| ok(me.crossentropy_fwd_impl(losses, dlogits, logits, targets, v, dloss)))
    }

    fn sumsq(&mut self, x: &CudaSlice<f32>) -> f64 {
        ok(self.sumsq_impl(&[x]))
    }

    fn sumsq_all(&mut self, xs: &[CudaSlice<f32>]) -> f64 {
        let refs: Vec<&CudaSlice<f32>> = xs.iter().collect();
        self.span("sumsq_all", |me| ok(me.sumsq_impl(&refs)))
    }

    fn count_nonfinite(&mut self, x: &CudaSlice<f32>) -> u64 {
        ok(self.count_nonfinite_impl(x))
    }

    fn adamw(&mut self, p: &mut CudaSlice<f32>, g: &CudaSlice<f32>, m: &mut CudaSlice<f32>, v: &mut CudaSlice<f32>, h: &AdamW) {
        self.span("adamw", |me| ok(me.adamw_fwd_impl(p, g, m, v, h)))
    }

    fn gemm(
        &mut self,
        call: &GemmCall,
        out: &mut CudaSlice<f32>,
        a: &CudaSlice<f32>,
        b: &CudaSlice<f32>,
        bias: Option<&CudaSlice<f32>>,
        dbias: Option<&mut CudaSlice<f32>>,
    ) {
        self.span("gemm", |me| ok(me.linear(call, out, a, b, bias, dbias, false, true, true)))
    }

    fn take_reports(&mut self) -> Vec<GemmReport> {
        ok(self.download_all())
    }
}
