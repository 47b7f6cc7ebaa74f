//! The [`Backend`] trait for [`CudaBackend`]: each primitive as a launch of its kernel from
//! `kernels/` (or a cuBLAS / cuBLASLt call), in the order and with the numerics of the CPU
//! reference. The cast-and-GEMM pipeline these call into lives in `mod.rs`.

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
        self.span("upload_tokens", |me| {
            // Group positions by token (counting sort), in position order within a token.
            let mut order: Vec<u32> = (0..tokens.len() as u32).collect();
            order.sort_by_key(|&i| (tokens[i as usize], i));
            let mut uniq = Vec::new();
            let mut offsets = Vec::new();
            for (j, &i) in order.iter().enumerate() {
                let t = tokens[i as usize];
                if uniq.last() != Some(&t) {
                    uniq.push(t);
                    offsets.push(j as u32);
                }
            }
            offsets.push(order.len() as u32);
            let s = &me.stream;
            let up = |v: &[u32]| -> CudaSlice<u32> { ok(if v.is_empty() { s.alloc_zeros::<u32>(1) } else { s.clone_htod(v) }.map_err(CudaError::from)) };
            CudaTokens {
                ids: up(tokens),
                n_uniq: uniq.len(),
                uniq: up(&uniq),
                offsets: up(&offsets),
                positions: up(&order),
            }
        })
    }

    fn download(&mut self, buf: &CudaSlice<f32>, offset: usize, len: usize, stride: usize) -> Vec<f32> {
        self.span("download", |me| {
            if len == 0 {
                return Vec::new();
            }
            let end = offset + (len - 1) * stride + 1;
            let v = ok(me.stream.clone_dtoh(&buf.slice(offset..end)).map_err(CudaError::from));
            if stride == 1 { v } else { v.into_iter().step_by(stride).collect() }
        })
    }

    fn len(&self, buf: &CudaSlice<f32>) -> usize {
        buf.len()
    }

    fn fill_zero(&mut self, buf: &mut CudaSlice<f32>) {
        self.span("fill_zero", |me| ok(me.stream.memset_zeros(buf).map_err(CudaError::from)))
    }

    fn embedding_fwd(&mut self, out: &mut CudaSlice<f32>, tokens: &CudaTokens, wte: &CudaSlice<f32>, c: usize) {
        self.span("embedding_fwd", |me| {
            let n = out.len() / c;
            let (o, t, w) = (me.ptr(out), me.ptr(&tokens.ids), me.ptr(wte));
            ok(launch!(me, "embedding_fwd", grid_for(n * c, 256), o, t, w, n as u64, c as i32))
        })
    }

    fn embedding_bwd(&mut self, dwte: &mut CudaSlice<f32>, dout: &CudaSlice<f32>, tokens: &CudaTokens, c: usize) {
        self.span("embedding_bwd", |me| {
            if tokens.n_uniq == 0 {
                return;
            }
            let (d, g, u, o, p) = (
                me.ptr(dwte),
                me.ptr(dout),
                me.ptr(&tokens.uniq),
                me.ptr(&tokens.offsets),
                me.ptr(&tokens.positions),
            );
            ok(launch!(
                me,
                "embedding_bwd",
                cfg((tokens.n_uniq as u32, (c as u32).div_ceil(256), 1), 256),
                d,
                g,
                u,
                o,
                p,
                c as i32
            ))
        })
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
        self.span("layernorm_fwd", |me| {
            let n = inp.len() / c;
            let (o, m, r, x, wp, bp) = (me.ptr(out), me.ptr(mean), me.ptr(rstd), me.ptr(inp), me.ptr(w), me.ptr(b));
            ok(launch!(
                me,
                "layernorm_fwd",
                cfg(((n as u32).div_ceil(8), 1, 1), 256),
                o,
                m,
                r,
                x,
                wp,
                bp,
                n as i32,
                c as i32
            ))
        })
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
        self.span("layernorm_bwd", |me| {
            let n = inp.len() / c;
            let rows_per_chunk = 32usize;
            let chunks = n.div_ceil(rows_per_chunk);
            ok(grow(&me.stream, &mut me.ln_partial, chunks * 2 * c));
            let (di, dwp, dbp, g, x, wp, m, r, part) = (
                me.ptr(dinp),
                me.ptr(dw),
                me.ptr(db),
                me.ptr(dout),
                me.ptr(inp),
                me.ptr(w),
                me.ptr(mean),
                me.ptr(rstd),
                me.ptr(&me.ln_partial),
            );
            ok(launch!(
                me,
                "layernorm_bwd",
                cfg(((n as u32).div_ceil(8), 1, 1), 256),
                di,
                g,
                x,
                wp,
                m,
                r,
                n as i32,
                c as i32
            ));
            ok(launch!(
                me,
                "layernorm_bwd_partial",
                cfg(((c as u32).div_ceil(128), chunks as u32, 1), 128),
                part,
                g,
                x,
                m,
                r,
                n as i32,
                c as i32,
                rows_per_chunk as i32
            ));
            ok(launch!(
                me,
                "layernorm_bwd_reduce",
                cfg(((c as u32).div_ceil(128), 1, 1), 128),
                dwp,
                dbp,
                part,
                c as i32,
                chunks as i32
            ));
        })
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
        self.span("gelu_fwd", |me| {
            let n = inp.len();
            let (o, x) = (me.ptr(out), me.ptr(inp));
            ok(launch!(me, "gelu_fwd", grid_for(n, 256), o, x, n as u64))
        })
    }

    fn gelu_bwd(&mut self, dinp: &mut CudaSlice<f32>, inp: &CudaSlice<f32>, dout: &CudaSlice<f32>) {
        self.span("gelu_bwd", |me| {
            let n = inp.len();
            let (d, x, g) = (me.ptr(dinp), me.ptr(inp), me.ptr(dout));
            ok(launch!(me, "gelu_bwd", grid_for(n, 256), d, x, g, n as u64))
        })
    }

    fn add(&mut self, out: &mut CudaSlice<f32>, a: &CudaSlice<f32>, b: &CudaSlice<f32>) {
        self.span("add", |me| {
            let n = a.len();
            let (o, ap, bp) = (me.ptr(out), me.ptr(a), me.ptr(b));
            ok(launch!(me, "residual_fwd", grid_for(n, 256), o, ap, bp, n as u64))
        })
    }

    fn add_inplace(&mut self, acc: &mut CudaSlice<f32>, x: &CudaSlice<f32>) {
        self.span("add_inplace", |me| {
            let n = x.len();
            let (a, xp) = (me.ptr(acc), me.ptr(x));
            ok(launch!(me, "residual_bwd", grid_for(n, 256), a, xp, n as u64))
        })
    }

    fn round_bf16(&mut self, x: &mut CudaSlice<f32>) {
        self.span("round_bf16", |me| {
            let n = x.len();
            let p = me.ptr(x);
            ok(launch!(me, "round_bf16_fwd", grid_for(n, 256), p, n as u64))
        })
    }

    fn matmul_bf16_fwd(&mut self, out: &mut CudaSlice<f32>, inp: &CudaSlice<f32>, w: &CudaSlice<f32>, dims: LinearDims) {
        self.span("matmul_bf16_fwd", |me| {
            let call = plain_call(Gemm::Fprop, dims);
            ok(me.linear(&call, out, inp, w, None, None, false, false, true))
        })
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
        self.span("matmul_bf16_bwd", |me| {
            ok(me.linear(&plain_call(Gemm::Dgrad, dims), dinp, dout, w, None, None, false, false, true));
            ok(me.linear(&plain_call(Gemm::Wgrad, dims), dw, dout, inp, None, None, true, false, true));
        })
    }

    fn crossentropy(&mut self, losses: &mut CudaSlice<f32>, dlogits: &mut CudaSlice<f32>, logits: &CudaSlice<f32>, targets: &CudaTokens, v: usize, dloss: f32) {
        self.span("crossentropy", |me| {
            let n = logits.len() / v;
            let (l, d, x, t) = (me.ptr(losses), me.ptr(dlogits), me.ptr(logits), me.ptr(&targets.ids));
            ok(launch!(me, "crossentropy_fwd", cfg((n as u32, 1, 1), 512), l, d, x, t, v as i32, dloss))
        })
    }

    fn sumsq(&mut self, x: &CudaSlice<f32>) -> f64 {
        ok(self.sumsq_many(&[x]))
    }

    fn sumsq_all(&mut self, xs: &[CudaSlice<f32>]) -> f64 {
        self.span("sumsq_all", |me| {
            let refs: Vec<&CudaSlice<f32>> = xs.iter().collect();
            ok(me.sumsq_many(&refs))
        })
    }

    fn count_nonfinite(&mut self, x: &CudaSlice<f32>) -> u64 {
        let n = x.len();
        let r = (|| -> Result<u64, CudaError> {
            self.stream.memset_zeros(&mut self.counter)?;
            let (xp, cp) = (self.ptr(x), self.ptr(&self.counter));
            launch!(self, "count_nonfinite", grid_for(n, 256), xp, n as u64, cp)?;
            Ok(self.stream.clone_dtoh(&self.counter)?[0])
        })();
        ok(r)
    }

    fn adamw(&mut self, p: &mut CudaSlice<f32>, g: &CudaSlice<f32>, m: &mut CudaSlice<f32>, v: &mut CudaSlice<f32>, h: &AdamW) {
        let n = p.len();
        // The CPU reference's bias corrections, in f64 on the host.
        let t = f64::from(h.t);
        let step_size = (f64::from(h.lr) / (1.0 - f64::from(h.beta1).powf(t))) as f32;
        let bc2_sqrt = (1.0 - f64::from(h.beta2).powf(t)).sqrt() as f32;
        let decay = 1.0 - h.lr * h.weight_decay;
        self.span("adamw", |me| {
            let (pp, gp, mp, vp) = (me.ptr(p), me.ptr(g), me.ptr(m), me.ptr(v));
            ok(launch!(me, "adamw_fwd", grid_for(n, 256), pp, gp, mp, vp, n as u64, h.beta1, h.beta2, h.eps, decay, step_size, bc2_sqrt, h.grad_scale))
        })
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
