//! Every layer's forward and backward on both backends within its tolerance, the fused attention
//! against the unfused path, RoPE fused into it, and bit-identical reruns.

use super::*;

/// Runs every primitive once on `be` and returns each output, by name.
fn run_layers<B: Backend>(be: &mut B, i: &Inputs) -> Vec<(String, Vec<f32>)> {
    let (v, c, f, nh, b, t) = (i.v, i.c, i.f, i.nh, i.b, i.t);
    let n = b * t;
    let m = |k: &str| i.mats[k].as_slice();
    let out = std::cell::RefCell::new(Vec::<(String, Vec<f32>)>::new());
    let get = |be: &mut B, name: &str, buf: &B::Buf| {
        let len = be.len(buf);
        out.borrow_mut().push((name.to_string(), be.download(buf, 0, len, 1)));
    };
    let tokens = be.upload_tokens(&i.tokens);
    let targets = be.upload_tokens(&i.targets);
    // embedding
    let wte = be.upload(m("wte"));
    let mut emb = be.zeros(n * c);
    be.embedding_fwd(&mut emb, &tokens, &wte, c);
    get(be, "embedding_fwd.out", &emb);
    let mut dwte = be.upload(m("dwte0"));
    let dout_c = be.upload(m("dout_c"));
    be.embedding_bwd(&mut dwte, &dout_c, &tokens, c);
    get(be, "embedding_bwd.dwte", &dwte);
    // layernorm
    let x = be.upload(m("x"));
    let (lw, lb) = (be.upload(m("ln_w")), be.upload(m("ln_b")));
    let (mut ln, mut mean, mut rstd) = (be.zeros(n * c), be.zeros(n), be.zeros(n));
    be.layernorm_fwd(&mut ln, &mut mean, &mut rstd, &x, &lw, &lb, c);
    get(be, "layernorm_fwd.out", &ln);
    get(be, "layernorm_fwd.mean", &mean);
    get(be, "layernorm_fwd.rstd", &rstd);
    let (mut dinp, mut dw, mut db) = (be.upload(m("dinp0")), be.upload(m("dw0")), be.upload(m("db0")));
    be.layernorm_bwd(&mut dinp, &mut dw, &mut db, &dout_c, &x, &lw, &mean, &rstd, c);
    get(be, "layernorm_bwd.dinp", &dinp);
    get(be, "layernorm_bwd.dw", &dw);
    get(be, "layernorm_bwd.db", &db);
    // attention
    let qkv = be.upload(m("qkv"));
    let saved = be.attention_saved_len(b, t, c, nh);
    let (mut ao, mut att) = (be.zeros(n * c), be.zeros(saved));
    be.attention_fwd(&mut ao, &mut att, &qkv, b, t, c, nh, nh, true);
    get(be, "attention_fwd.out", &ao);
    let (mut dqkv, mut datt) = (be.zeros(n * 3 * c), be.zeros(saved));
    be.attention_bwd(&mut dqkv, &mut datt, &dout_c, &ao, &qkv, &att, b, t, c, nh, nh, true);
    get(be, "attention_bwd.dqkv", &dqkv);
    // The Llama family: RMSNorm, SwiGLU, RoPE and grouped-query attention.
    let rw = be.upload(m("rms_w"));
    let (mut rn, mut rrstd) = (be.zeros(n * c), be.zeros(n));
    be.rmsnorm_fwd(&mut rn, &mut rrstd, &x, &rw, c, 1e-5);
    get(be, "rmsnorm_fwd.out", &rn);
    get(be, "rmsnorm_fwd.rstd", &rrstd);
    let (mut rdinp, mut rdw) = (be.upload(m("dinp0")), be.upload(m("dw0")));
    be.rmsnorm_bwd(&mut rdinp, &mut rdw, &dout_c, &x, &rw, &rrstd, c);
    get(be, "rmsnorm_bwd.dinp", &rdinp);
    get(be, "rmsnorm_bwd.dw", &rdw);
    let gu = be.upload(m("gate_up"));
    let mut sw = be.zeros(n * f);
    be.swiglu_fwd(&mut sw, &gu, f);
    get(be, "swiglu_fwd.out", &sw);
    let dsw_out = be.upload(m("dout_f"));
    let mut dgu = be.zeros(n * 2 * f);
    be.swiglu_bwd(&mut dgu, &gu, &dsw_out, f);
    get(be, "swiglu_bwd.dinp", &dgu);
    // F = 37: rows that break the 4-wide loads' alignment (element by element).
    let (gu37, dout37) = (be.upload(m("gate_up_f37")), be.upload(m("dout_f37")));
    let (mut sw37, mut dgu37) = (be.zeros(n * 37), be.zeros(n * 2 * 37));
    be.swiglu_fwd(&mut sw37, &gu37, 37);
    get(be, "swiglu_fwd_f37.out", &sw37);
    be.swiglu_bwd(&mut dgu37, &gu37, &dout37, 37);
    get(be, "swiglu_bwd_f37.dinp", &dgu37);
    let (kvh, hd) = (i.kvh, c / nh);
    let qg = be.upload(m("qkv_gqa2"));
    let mut rot = be.zeros(n * (c + 2 * kvh * hd));
    be.rope_fwd(&mut rot, &qg, b, t, nh, kvh, hd, 10000.0);
    get(be, "rope_fwd.out", &rot);
    let drot = be.upload(m("dqkv_gqa2"));
    let mut dq_rot = be.zeros(n * (c + 2 * kvh * hd));
    be.rope_bwd(&mut dq_rot, &drot, b, t, nh, kvh, hd, 10000.0);
    get(be, "rope_bwd.dqkv", &dq_rot);
    // A second table (another T and theta, as Llama 3's 500000): the cached one must be replaced.
    let mut rot2 = be.zeros(n * (c + 2 * kvh * hd));
    be.rope_fwd(&mut rot2, &qg, 2 * b, t / 2, nh, kvh, hd, 500000.0);
    get(be, "rope_fwd_theta5e5.out", &rot2);
    for (kv, name) in [(kvh, "qkv_gqa2"), (1, "qkv_gqa1")] {
        let qkv = be.upload(m(name));
        let (mut ao, mut att) = (be.zeros(n * c), be.zeros(saved));
        be.attention_fwd(&mut ao, &mut att, &qkv, b, t, c, nh, kv, true);
        get(be, &format!("attention_gqa{kv}_fwd.out"), &ao);
        let (mut dqkv, mut datt) = (be.zeros(n * (c + 2 * kv * hd)), be.zeros(saved));
        be.attention_bwd(&mut dqkv, &mut datt, &dout_c, &ao, &qkv, &att, b, t, c, nh, kv, true);
        get(be, &format!("attention_gqa{kv}_bwd.dqkv"), &dqkv);
    }
    // Head size 64 (the seed and llama-1b presets' heads), T = 200 (not a multiple of the fused
    // kernels' 64-row tile), two kv heads for four query heads, causal and not.
    {
        let (c2, nh2, t2) = (HS64_C, HS64_C / 64, HS64_T);
        let n2 = b * t2;
        let qkv = be.upload(m("qkv_hs64"));
        let dout = be.upload(m("dout_hs64"));
        let saved = be.attention_saved_len(b, t2, c2, nh2);
        for causal in [true, false] {
            let name = if causal { "attention_hs64_causal" } else { "attention_hs64_full" };
            let (mut ao, mut att) = (be.zeros(n2 * c2), be.zeros(saved));
            be.attention_fwd(&mut ao, &mut att, &qkv, b, t2, c2, nh2, HS64_KVH, causal);
            get(be, &format!("{name}_fwd.out"), &ao);
            let (mut dqkv, mut datt) = (be.zeros(n2 * hs64_width()), be.zeros(saved));
            be.attention_bwd(&mut dqkv, &mut datt, &dout, &ao, &qkv, &att, b, t2, c2, nh2, HS64_KVH, causal);
            get(be, &format!("{name}_bwd.dqkv"), &dqkv);
        }
        // RoPE fused with the attention (the Llama step's call): the GPU keeps q, k, v head-major
        // in a BF16 `saved`; the CPU, the rotated rows.
        let w2 = hs64_width();
        let (mut ao, mut att, mut rot_saved) = (be.zeros(n2 * c2), be.zeros(saved), be.zeros_bf16(n2 * w2));
        be.rope_attention_fwd(&mut ao, &mut att, &mut rot_saved, &qkv, b, t2, nh2, HS64_KVH, 64, 10000.0, true);
        get(be, "attention_rope_hs64_fwd.out", &ao);
        let (mut dqkv, mut dqkv_rot, mut datt) = (be.zeros(n2 * w2), be.zeros(n2 * w2), be.zeros(saved));
        be.rope_attention_bwd(&mut dqkv, &mut dqkv_rot, &mut datt, &dout, &ao, &rot_saved, &att, b, t2, nh2, HS64_KVH, 64, 10000.0, true);
        get(be, "attention_rope_hs64_bwd.dqkv", &dqkv);
    }
    // gelu, residual, rounding
    let h = be.upload(m("h"));
    let mut g = be.zeros(n * f);
    be.gelu_fwd(&mut g, &h);
    get(be, "gelu_fwd.out", &g);
    let dout_f = be.upload(m("dout_f"));
    let mut dh = be.zeros(n * f);
    be.gelu_bwd(&mut dh, &h, &dout_f);
    get(be, "gelu_bwd.dinp", &dh);
    let mut r = be.zeros(n * c);
    be.add(&mut r, &x, &dout_c);
    get(be, "residual_fwd.out", &r);
    be.add_inplace(&mut r, &x);
    get(be, "add_inplace.acc", &r);
    let mut rb = be.upload(m("x"));
    be.round_bf16(&mut rb);
    get(be, "round_bf16.x", &rb);
    // lm_head (BF16) and the loss
    let head = LinearDims { n, k: c, m: v };
    let hw = be.upload(m("head_w"));
    let mut logits = be.zeros(n * v);
    be.matmul_bf16_fwd(&mut logits, &x, &hw, head);
    get(be, "matmul_bf16_fwd.out", &logits);
    let dl = be.upload(m("dlogits"));
    let (mut dx, mut dhw) = (be.zeros(n * c), be.upload(m("head_w")));
    be.matmul_bf16_bwd(&mut dx, &mut dhw, &dl, &x, &hw, head);
    get(be, "matmul_bf16_bwd.dinp", &dx);
    get(be, "matmul_bf16_bwd.dw", &dhw);
    let lg = be.upload(m("logits"));
    let (mut losses, mut dlg) = (be.zeros(n), be.upload(m("logits")));
    be.crossentropy(&mut losses, &mut dlg, &targets, v, 1.0 / n as f32);
    get(be, "crossentropy.losses", &losses);
    get(be, "crossentropy.dlogits", &dlg);
    // A loss mask: every third target ignored (zero loss and gradient rows), the mean over the rest.
    let masked: Vec<u32> = i.targets.iter().enumerate().map(|(j, &t)| if j % 3 == 0 { fp8_capture::layers::IGNORE_TARGET } else { t }).collect();
    let masked = be.upload_tokens(&masked);
    let (mut losses, mut dlg) = (be.zeros(n), be.upload(m("logits")));
    be.crossentropy(&mut losses, &mut dlg, &masked, v, 1.0 / (n - n.div_ceil(3)) as f32);
    get(be, "crossentropy_masked.losses", &losses);
    get(be, "crossentropy_masked.dlogits", &dlg);
    let s = be.sumsq(&lg);
    out.borrow_mut().push(("sumsq".into(), vec![s as f32]));
    // AdamW
    let (mut p, gg, mut am, mut av) = (be.upload(m("p")), be.upload(m("g")), be.upload(m("m")), be.upload(m("vv")));
    let hyp = AdamW { lr: 1e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, t: 7, grad_scale: 0.5 };
    be.adamw(&mut p, &gg, &mut am, &mut av, &hyp);
    get(be, "adamw.p", &p);
    get(be, "adamw.m", &am);
    get(be, "adamw.v", &av);
    // The linear-layer GEMMs of fc1 (k = C, m = F) under each cast.
    let dims = LinearDims { n, k: c, m: f };
    let (w, bias, dy) = (be.upload(m("w_fc1")), be.upload(m("bias_f")), be.upload(m("dy_f")));
    let e4 = |scale: f32| OperandCast::Fp8Tensor { format: Fp8Format::E4M3, scale: ScaleSource::Given { scale, amax_used: 0.0 } };
    let e5 = |scale: f32| OperandCast::Fp8Tensor { format: Fp8Format::E5M2, scale: ScaleSource::Given { scale, amax_used: 0.0 } };
    let cur = OperandCast::Fp8Tensor { format: Fp8Format::E4M3, scale: ScaleSource::Current { margin: 0 } };
    // The last: every FP8 GEMM with cuBLASLt's fast accumulation (`--accumulation fast`), against
    // the CPU's FP32 accumulation under the same bound.
    for (label, ca_f, cb_f, ca_b, cb_b, fast_accumulation) in [
        ("bf16", OperandCast::Bf16, OperandCast::Bf16, OperandCast::Bf16, OperandCast::Bf16, false),
        ("e4m3", e4(64.0), e4(2048.0), e4(8192.0), e4(2048.0), false),
        ("current", cur, cur, cur, cur, false),
        ("hybrid", e4(64.0), e4(2048.0), e5(4096.0), e4(64.0), false),
        ("hybrid_fast", e4(64.0), e4(2048.0), e5(4096.0), e4(64.0), true),
    ] {
        for gemm in Gemm::ALL {
            let (cast_a, cast_b) = if gemm == Gemm::Fprop { (ca_f, cb_f) } else { (ca_b, cb_b) };
            let call = GemmCall {
                id: GemmId { layer: 0, module: Module::Fc1, gemm },
                dims,
                cast_a,
                cast_b,
                fault_a: OperandFault::NONE,
                fault_b: OperandFault::NONE,
                nan_output: false,
                stats: StatsLevel::Full,
                keep_quantized: [true; 2],
                shadow: false,
                fast_accumulation,
                a_column_sums: false,
            };
            let name = format!("gemm.{label}.{gemm}");
            match gemm {
                Gemm::Fprop => {
                    let mut y = be.zeros(n * f);
                    be.gemm(&call, &mut y, &x, &w, Some(&bias), None);
                    get(be, &name, &y);
                }
                Gemm::Dgrad => {
                    let mut dxx = be.zeros(n * c);
                    be.gemm(&call, &mut dxx, &dy, &w, None, None);
                    get(be, &name, &dxx);
                }
                Gemm::Wgrad => {
                    let (mut dww, mut dbb) = (be.zeros(f * c), be.upload(m("bias_f")));
                    be.gemm(&call, &mut dww, &dy, &x, None, Some(&mut dbb));
                    get(be, &name, &dww);
                    get(be, &format!("{name}.dbias"), &dbb);
                }
            }
            for rep in be.take_reports() {
                for (side, r) in [("a", &rep.a), ("b", &rep.b)] {
                    let q = r.quantized.as_ref().map(|q| q.iter().map(|&b| b as f32).collect()).unwrap_or_default();
                    out.borrow_mut().push((format!("report.{name}.{side}.bytes"), q));
                    out.borrow_mut().push((
                        format!("report.{name}.{side}.counts"),
                        vec![r.amax, r.scale, r.underflow as f32, r.saturated as f32, r.zeros as f32, r.nan as f32],
                    ));
                    let ch = r.channels.expect("channel statistics at the full level");
                    out.borrow_mut().push((format!("report.{name}.{side}.amax_channel"), vec![ch.amax_channel.map_or(-1.0, |c| c as f32)]));
                    out.borrow_mut().push((format!("channel_share.{name}.{side}"), vec![ch.top_channel_sq_frac.map_or(-1.0, |f| f as f32)]));
                }
            }
        }
    }
    // One site's three BF16 GEMMs back to back, as the model runs them (see `bf16_site`).
    let db0 = m("bias_f");
    for (name, v) in bf16_site(be, &x, &w, &bias, &dy, db0, dims, true, true, StatsLevel::Channels) {
        out.borrow_mut().push((name, v));
    }
    if let Some(e) = be.take_error() {
        panic!("{} backend: {e}", be.kind());
    }
    out.into_inner()
}

#[test]
fn every_layer_matches_the_cpu_reference_within_its_tolerance() {
    let Some(mut gpu) = cuda_common::gpu("layer parity") else { return };
    let i = inputs();
    let mut cpu = CpuBackend::new();
    let want = run_layers(&mut cpu, &i);
    let mut failed = Vec::new();
    // Both attention paths: the fused kernels (the default) and the unfused fallback.
    for fused in [true, false] {
        gpu.set_fused_attention(fused);
        println!("GPU attention path: {}", if fused { "fused" } else { "unfused" });
        let got = run_layers(&mut gpu, &i);
        compare_outputs(&want, &got, if fused { "" } else { "unfused attention: " }, &mut failed);
    }
    gpu.set_fused_attention(true);
    assert!(failed.is_empty(), "outside tolerance:\n{}", failed.join("\n"));
}

/// Compares each GPU output with the CPU's under its tolerance; prints a table, collects failures.
fn compare_outputs(want: &[(String, Vec<f32>)], got: &[(String, Vec<f32>)], tag: &str, failed: &mut Vec<String>) {
    assert_eq!(want.len(), got.len());
    println!("{:<34} {:>10} {:>10} {:>10}  reason", "output", "rel L2", "max |d|", "bound");
    for ((name, w), (gname, g)) in want.iter().zip(got) {
        assert_eq!(name, gname);
        assert_eq!(w.len(), g.len(), "{name}: lengths");
        let (bound, reason) = tolerance(name);
        let (rel, maxabs) = rel_l2(g, w);
        let pass = rel <= bound;
        println!("{name:<34} {rel:>10.2e} {maxabs:>10.2e} {bound:>10.1e}  {}{reason}", if pass { "" } else { "FAIL: " });
        if !pass {
            let worst: Vec<String> = {
                let mut idx: Vec<usize> = (0..w.len()).collect();
                idx.sort_by(|&a, &b| ((g[b] - w[b]).abs()).partial_cmp(&(g[a] - w[a]).abs()).unwrap_or(std::cmp::Ordering::Equal));
                idx.iter().take(3).map(|&k| format!("[{k}] gpu {} cpu {}", g[k], w[k])).collect()
            };
            failed.push(format!("{tag}{name}: rel {rel:.3e} > {bound:e}; worst {worst:?}"));
        }
    }
}

/// The fused attention against the unfused path at the shapes of the `seed` preset's layer (B 4,
/// T 512, 16 heads of 64) and `llama-1b`'s (B 4, T 2048, 32 heads of 64 over 8 kv heads): the two
/// agree within BF16 rounding, and the GPU time of a forward and backward of each is printed side
/// by side (the fused path must not be slower).
#[test]
fn fused_attention_agrees_with_the_unfused_path_and_is_not_slower() {
    let Some(mut gpu) = cuda_common::gpu("fused attention") else { return };
    for (label, b, t, nh, kvh) in [("seed", 4usize, 512usize, 16usize, 16usize), ("llama-1b", 4, 2048, 32, 8)] {
        let (hd, causal) = (64, true);
        let c = nh * hd;
        let w = c + 2 * kvh * hd;
        let mut rng = Pcg64::seed_from_u64(21);
        let normal = Normal::new(0.0f32, 1.0).expect("normal");
        let qkv_h: Vec<f32> = (0..b * t * w).map(|_| normal.sample(&mut rng)).collect();
        let dout_h: Vec<f32> = (0..b * t * c).map(|_| normal.sample(&mut rng) * 0.1).collect();
        let (qkv, dout) = (gpu.upload(&qkv_h), gpu.upload(&dout_h));
        let mut results = Vec::new();
        for fused in [true, false] {
            gpu.set_fused_attention(fused);
            let saved = gpu.attention_saved_len(b, t, c, nh);
            let (mut out, mut att) = (gpu.zeros(b * t * c), gpu.zeros(saved));
            let (mut dqkv, mut datt) = (gpu.zeros(b * t * w), gpu.zeros(saved));
            let mut run = |gpu: &mut fp8_capture::backend::cuda::CudaBackend| {
                gpu.attention_fwd(&mut out, &mut att, &qkv, b, t, c, nh, kvh, causal);
                gpu.attention_bwd(&mut dqkv, &mut datt, &dout, &out, &qkv, &att, b, t, c, nh, kvh, causal);
                gpu.download(&dqkv, 0, 1, 1);
            };
            run(&mut gpu);
            let reps = 5;
            let t0 = std::time::Instant::now();
            for _ in 0..reps {
                run(&mut gpu);
            }
            let ms = t0.elapsed().as_secs_f64() * 1e3 / reps as f64;
            let (o, d) = (gpu.download(&out, 0, b * t * c, 1), gpu.download(&dqkv, 0, b * t * w, 1));
            println!("{label}: {} attention forward + backward {ms:.3} ms", if fused { "fused  " } else { "unfused" });
            results.push((ms, o, d));
            drop((att, datt));
        }
        gpu.set_fused_attention(true);
        assert_eq!(gpu.take_error(), None, "{label}: the backend failed");
        let (ro, _) = rel_l2(&results[0].1, &results[1].1);
        let (rd, _) = rel_l2(&results[0].2, &results[1].2);
        println!("{label}: fused vs unfused rel L2: out {ro:.2e}, dqkv {rd:.2e}; speed-up {:.2}x", results[1].0 / results[0].0);
        assert!(ro < 1e-2 && rd < 1e-2, "{label}: fused and unfused attention differ: out {ro:.2e}, dqkv {rd:.2e}");
        assert!(results[0].0 <= results[1].0 * 1.05, "{label}: fused attention is slower than the unfused path");
    }
}

#[test]
fn every_layer_reruns_bit_identically_on_the_gpu() {
    let Some(mut gpu) = cuda_common::gpu("layer reruns") else { return };
    let i = inputs();
    let first = run_layers(&mut gpu, &i);
    let second = run_layers(&mut gpu, &i);
    assert_eq!(first.len(), second.len());
    let differ: Vec<String> = first
        .iter()
        .zip(&second)
        .filter_map(|((name, a), (_, b))| {
            let n = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
            (n > 0 || a.len() != b.len()).then(|| format!("{name}: {n} of {} values differ", a.len()))
        })
        .collect();
    println!("{} outputs compared bit for bit across two runs, {} differ", first.len(), differ.len());
    assert!(differ.is_empty(), "not bit-identical on a rerun:\n{}", differ.join("\n"));
}

/// RoPE fused into the attention (`rope_attention_fwd` / `_bwd`, the Llama step's calls: q, k, v
/// rotated and split head-major in one pass, kept in a BF16 buffer for the backward) against
/// `rope_fwd`, `attention_fwd`, `attention_bwd`, `rope_bwd` one after the other on the GPU: the
/// output, the log-sum-exp and dqkv are bit-identical. qkv is BF16 as the model's is (a GEMM's
/// output) and f32; head sizes 64 (T not a multiple of the tiles) and 16; the GPU time of each path
/// is printed side by side.
#[test]
fn rope_fused_into_the_attention_is_bit_identical_to_rope_then_attention() {
    let Some(mut gpu) = cuda_common::gpu("RoPE fused into the attention") else { return };
    for (b, t, nh, kvh, hd) in [(2usize, 300usize, 8usize, 2usize, 64usize), (2, 130, 4, 4, 16)] {
        let (c, w) = (nh * hd, (nh + 2 * kvh) * hd);
        let mut rng = Pcg64::seed_from_u64(33);
        let normal = Normal::new(0.0f32, 1.0).expect("normal");
        let qkv_h: Vec<f32> = (0..b * t * w).map(|_| normal.sample(&mut rng)).collect();
        let dout_h: Vec<f32> = (0..b * t * c).map(|_| normal.sample(&mut rng) * 0.1).collect();
        let dout = gpu.upload(&dout_h);
        for bf16_in in [true, false] {
            let label = format!("B {b} T {t} NH {nh} KVH {kvh} HD {hd}, qkv {}", if bf16_in { "BF16" } else { "f32" });
            let qkv = if bf16_in { bf16_buffer(&mut gpu, &qkv_h, b * t, w) } else { gpu.upload(&qkv_h) };
            let saved_len = gpu.attention_saved_len(b, t, c, nh);
            let mut results = Vec::new();
            for fused in [false, true] {
                let (mut out, mut att, mut datt) = (gpu.zeros(b * t * c), gpu.zeros(saved_len), gpu.zeros(saved_len));
                let (mut dqkv, mut dqkv_rot) = (gpu.zeros(b * t * w), gpu.zeros(b * t * w));
                let mut rot = if fused { gpu.zeros_bf16(b * t * w) } else { gpu.zeros(b * t * w) };
                let t0 = std::time::Instant::now();
                if fused {
                    gpu.rope_attention_fwd(&mut out, &mut att, &mut rot, &qkv, b, t, nh, kvh, hd, 10000.0, true);
                    gpu.rope_attention_bwd(&mut dqkv, &mut dqkv_rot, &mut datt, &dout, &out, &rot, &att, b, t, nh, kvh, hd, 10000.0, true);
                } else {
                    gpu.rope_fwd(&mut rot, &qkv, b, t, nh, kvh, hd, 10000.0);
                    gpu.attention_fwd(&mut out, &mut att, &rot, b, t, c, nh, kvh, true);
                    gpu.attention_bwd(&mut dqkv_rot, &mut datt, &dout, &out, &rot, &att, b, t, c, nh, kvh, true);
                    gpu.rope_bwd(&mut dqkv, &dqkv_rot, b, t, nh, kvh, hd, 10000.0);
                }
                let got = (gpu.download(&out, 0, b * t * c, 1), gpu.download(&att, 0, b * nh * t, 1), gpu.download(&dqkv, 0, b * t * w, 1));
                let ms = t0.elapsed().as_secs_f64() * 1e3;
                println!("{label}: {} {ms:.3} ms (first call, with the downloads)", if fused { "fused RoPE + attention" } else { "RoPE, then attention  " });
                results.push(got);
            }
            assert_eq!(gpu.take_error(), None, "{label}: the backend failed");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            for (k, what) in ["out", "log-sum-exp", "dqkv"].iter().enumerate() {
                let (a, f) = match k {
                    0 => (&results[0].0, &results[1].0),
                    1 => (&results[0].1, &results[1].1),
                    _ => (&results[0].2, &results[1].2),
                };
                assert!(a.iter().any(|&x| x != 0.0), "{label}: {what} is all zeros");
                assert_eq!(bits(a), bits(f), "{label}: the fused path's {what} differs from RoPE then attention");
            }
            println!("{label}: out, log-sum-exp and dqkv bit-identical");
        }
    }
}
