//! BF16 buffers hold exactly what f32 buffers hold, for every primitive that reads or writes them,
//! and GEMM operands held in them give the bits of their f32 copies.

use super::*;

/// A GEMM output kept in 16 bits (`Backend::zeros_bf16`, fc1's storage in the model) holds exactly
/// the values an f32 buffer gets, through every path that writes one (BF16 and FP8 operands,
/// cuBLASLt's BF16 output straight into the buffer, or f32 output with a bias through the
/// epilogue, a planted NaN) and every primitive that reads one (download at any offset and stride,
/// SwiGLU and GELU forward and backward as their input, SwiGLU, GELU, RMSNorm and LayerNorm
/// backward as their gradient, AdamW as its gradient, the residual add as its branch, RoPE as
/// its input, attention (fused, which reads BF16 rows in place, and unfused) as its qkv and its
/// dout, the sums of squares and non-finite counts).
#[test]
fn bf16_buffers_hold_exactly_what_f32_buffers_hold() {
    let Some(mut gpu) = cuda_common::gpu("BF16 buffers") else { return };
    let mut rng = Pcg64::seed_from_u64(11);
    let normal = Normal::new(0.0f32, 1.0).unwrap();
    let dims = LinearDims { n: 64, k: 128, m: 96 };
    let (n, k, m) = (dims.n, dims.k, dims.m);
    let mut draw = |len: usize| -> Vec<f32> { (0..len).map(|_| normal.sample(&mut rng)).collect() };
    let (x, w, bias, dy) = (gpu.upload(&draw(n * k)), gpu.upload(&draw(m * k)), gpu.upload(&draw(m)), gpu.upload(&draw(n * m / 2)));
    let fp8 = OperandCast::Fp8Tensor { format: Fp8Format::E4M3, scale: ScaleSource::Current { margin: 0 } };
    let mut checked = 0;
    for (label, cast, with_bias, nan) in
        [("bf16", OperandCast::Bf16, false, false), ("fp8", fp8, false, false), ("fp8+bias", fp8, true, false), ("bf16+nan", OperandCast::Bf16, false, true)]
    {
        let call = GemmCall {
            cast_a: cast,
            cast_b: cast,
            nan_output: nan,
            stats: StatsLevel::Channels,
            ..GemmCall::bf16(GemmId { layer: 0, module: Module::Fc1, gemm: Gemm::Fprop }, dims)
        };
        let run = |gpu: &mut fp8_capture::backend::cuda::CudaBackend, out: &mut fp8_capture::backend::cuda::DevBuf| {
            gpu.gemm(&call, out, &x, &w, with_bias.then_some(&bias), None);
            let r = gpu.take_reports();
            r[0].output_nonfinite
        };
        let (mut of, mut ob) = (gpu.zeros(n * m), gpu.zeros_bf16(n * m));
        let (nf_f, nf_b) = (run(&mut gpu, &mut of), run(&mut gpu, &mut ob));
        assert!(ob.is_bf16() && gpu.len(&ob) == n * m, "{label}: zeros_bf16 gave no BF16 buffer of {} values", n * m);
        assert_eq!((nf_f, nf_b), (nan as u64, nan as u64), "{label}: non-finite outputs counted");
        assert_eq!(gpu.download(&ob, 0, 1, 1)[0].is_nan(), nan, "{label}: the planted NaN");
        // Bit for bit, every NaN alike (a planted NaN's payload is not kept in 16 bits).
        let bits = |v: Vec<f32>| v.into_iter().map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() }).collect::<Vec<u32>>();
        for (offset, len, stride) in [(0, n * m, 1), (1, 100, 3), (7, 1, 1), (n * m - 1, 1, 1), (5, 40, 0)] {
            let (a, b) = (gpu.download(&of, offset, len, stride), gpu.download(&ob, offset, len, stride));
            assert_eq!(bits(a), bits(b), "{label}: download({offset}, {len}, {stride}) differs");
            checked += 1;
        }
        // The lm_head's backward with the gradient held in BF16 (taken as the operand as it is)
        // and in f32 (cast, then kept for the wgrad).
        {
            let head = LinearDims { n, k, m };
            let (mut dxf, mut dwf, mut dxb, mut dwb) = (gpu.zeros(n * k), gpu.zeros(m * k), gpu.zeros(n * k), gpu.zeros(m * k));
            gpu.matmul_bf16_bwd(&mut dxf, &mut dwf, &of, &x, &w, head);
            gpu.matmul_bf16_bwd(&mut dxb, &mut dwb, &ob, &x, &w, head);
            assert_eq!(gpu.take_error(), None, "{label}: matmul_bf16_bwd");
            for (what, a, b) in [("dinp", &dxf, &dxb), ("dw", &dwf, &dwb)] {
                assert_eq!(
                    bits(gpu.download(a, 0, gpu.len(a), 1)),
                    bits(gpu.download(b, 0, gpu.len(b), 1)),
                    "{label}: matmul_bf16_bwd {what}, BF16 dout held against f32 dout cast"
                );
                checked += 1;
            }
        }
        let (sf, sb) = (gpu.sumsq(&of), gpu.sumsq(&ob));
        assert!(sf.to_bits() == sb.to_bits() || (sf.is_nan() && sb.is_nan()), "{label}: sumsq {sf} vs {sb}");
        assert_eq!(gpu.sumsq_all(std::slice::from_ref(&ob)).to_bits(), sb.to_bits(), "{label}: sumsq_all");
        assert_eq!(gpu.count_nonfinite(&of), gpu.count_nonfinite(&ob), "{label}: count_nonfinite");
        if nan {
            continue;
        }
        // AdamW with the buffer as its gradient, clipped and not.
        for grad_scale in [1.0f32, 0.5] {
            let h = AdamW { lr: 1e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, t: 3, grad_scale };
            let start: Vec<f32> = (0..n * m).map(|j| ((j % 13) as f32 - 6.0) / 7.0).collect();
            let state = |gpu: &mut fp8_capture::backend::cuda::CudaBackend| (gpu.upload(&start), gpu.upload(&start), gpu.upload(&vec![0.01f32; n * m]));
            let (mut pf, mut mf, mut vf) = state(&mut gpu);
            let (mut pb, mut mb, mut vb) = state(&mut gpu);
            gpu.adamw(&mut pf, &of, &mut mf, &mut vf, &h);
            gpu.adamw(&mut pb, &ob, &mut mb, &mut vb, &h);
            for (what, a, b) in [("p", &pf, &pb), ("m", &mf, &mb), ("v", &vf, &vb)] {
                assert_eq!(bits(gpu.download(a, 0, n * m, 1)), bits(gpu.download(b, 0, n * m, 1)), "{label}: adamw {what} (grad_scale {grad_scale})");
                checked += 1;
            }
        }
        let f = m / 2;
        let (mut af, mut ab) = (gpu.zeros(n * f), gpu.zeros(n * f));
        gpu.swiglu_fwd(&mut af, &of, f);
        gpu.swiglu_fwd(&mut ab, &ob, f);
        let (mut df, mut db) = (gpu.zeros(n * m), gpu.zeros(n * m));
        gpu.swiglu_bwd(&mut df, &of, &dy, f);
        gpu.swiglu_bwd(&mut db, &ob, &dy, f);
        let (mut gf, mut gb) = (gpu.zeros(n * m), gpu.zeros(n * m));
        gpu.gelu_fwd(&mut gf, &of);
        gpu.gelu_fwd(&mut gb, &ob);
        let dy2 = gpu.upload(&vec![0.5f32; n * m]);
        let (mut hf, mut hb) = (gpu.zeros(n * m), gpu.zeros(n * m));
        gpu.gelu_bwd(&mut hf, &of, &dy2);
        gpu.gelu_bwd(&mut hb, &ob, &dy2);
        // The same buffers as the gradient a backward reads (dout).
        let xs: Vec<f32> = (0..n * 2 * m).map(|j| ((j % 97) as f32 - 48.0) / 17.0).collect();
        let (xin, half) = (gpu.upload(&xs), gpu.upload(&xs[..n * m]));
        let (wn, stat) = (
            gpu.upload(&(0..m).map(|j| 0.5 + (j % 7) as f32 / 8.0).collect::<Vec<f32>>()),
            gpu.upload(&(0..n).map(|j| 0.25 + (j % 5) as f32 / 4.0).collect::<Vec<f32>>()),
        );
        let (mut sf, mut sb) = (gpu.zeros(n * 2 * m), gpu.zeros(n * 2 * m));
        gpu.swiglu_bwd(&mut sf, &xin, &of, m);
        gpu.swiglu_bwd(&mut sb, &xin, &ob, m);
        let (mut ef, mut eb) = (gpu.zeros(n * m), gpu.zeros(n * m));
        gpu.gelu_bwd(&mut ef, &half, &of);
        gpu.gelu_bwd(&mut eb, &half, &ob);
        let (mut rf, mut rb, mut rwf, mut rwb) = (gpu.zeros(n * m), gpu.zeros(n * m), gpu.zeros(m), gpu.zeros(m));
        gpu.rmsnorm_bwd(&mut rf, &mut rwf, &of, &half, &wn, &stat, m);
        gpu.rmsnorm_bwd(&mut rb, &mut rwb, &ob, &half, &wn, &stat, m);
        let (mut lf, mut lb, mut lwf, mut lwb, mut lbf, mut lbb) = (gpu.zeros(n * m), gpu.zeros(n * m), gpu.zeros(m), gpu.zeros(m), gpu.zeros(m), gpu.zeros(m));
        gpu.layernorm_bwd(&mut lf, &mut lwf, &mut lbf, &of, &half, &wn, &stat, &stat, m);
        gpu.layernorm_bwd(&mut lb, &mut lwb, &mut lbb, &ob, &half, &wn, &stat, &stat, m);
        // The residual add (as its branch) and RoPE (as its input: B 1, T 64, NH 2, KVH 1, HD 24).
        let (mut uf, mut ub) = (gpu.zeros(n * m), gpu.zeros(n * m));
        gpu.add(&mut uf, &half, &of);
        gpu.add(&mut ub, &half, &ob);
        let (mut qf, mut qb, mut tf, mut tb) = (gpu.zeros(n * m), gpu.zeros(n * m), gpu.zeros(n * m), gpu.zeros(n * m));
        gpu.rope_fwd(&mut qf, &of, 1, n, 2, 1, m / 4, 10000.0);
        gpu.rope_fwd(&mut qb, &ob, 1, n, 2, 1, m / 4, 10000.0);
        gpu.rope_bwd(&mut tf, &of, 1, n, 2, 1, m / 4, 10000.0);
        gpu.rope_bwd(&mut tb, &ob, 1, n, 2, 1, m / 4, 10000.0);
        #[rustfmt::skip]
        let pairs = [("add", &uf, &ub), ("rope_fwd", &qf, &qb), ("rope_bwd", &tf, &tb), ("swiglu_fwd", &af, &ab), ("swiglu_bwd", &df, &db), ("gelu_fwd", &gf, &gb), ("gelu_bwd", &hf, &hb),
            ("swiglu_bwd dout", &sf, &sb), ("gelu_bwd dout", &ef, &eb), ("rmsnorm_bwd dinp", &rf, &rb), ("rmsnorm_bwd dw", &rwf, &rwb),
            ("layernorm_bwd dinp", &lf, &lb), ("layernorm_bwd dw", &lwf, &lwb), ("layernorm_bwd db", &lbf, &lbb)];
        for (what, a, b) in pairs {
            let len = gpu.len(a);
            assert_eq!(bits(gpu.download(a, 0, len, 1)), bits(gpu.download(b, 0, len, 1)), "{label}: {what} reads the BF16 buffer differently");
            checked += 1;
        }
    }
    // Attention reads GPT's qkv (a GEMM's output) and proj's dgrad (its dout) in either storage, on
    // the fused path (BF16 rows read in place, f32 rows split into heads first) and the unfused:
    // B 2, T 32, NH 4 over KVH 2, HS 16 (qkv width 128, C 64).
    let (bsz, nh, kvh, hs) = (2usize, 4usize, 2usize, 16usize);
    let (t, c, wq) = (n / bsz, nh * hs, (nh + 2 * kvh) * hs);
    let gemm_pair = |gpu: &mut fp8_capture::backend::cuda::CudaBackend, m_out: usize| {
        let d = LinearDims { n, k, m: m_out };
        let w = gpu.upload(&(0..m_out * k).map(|j| ((j % 29) as f32 - 14.0) / 40.0).collect::<Vec<f32>>());
        let call = GemmCall::bf16(GemmId { layer: 0, module: Module::Qkv, gemm: Gemm::Fprop }, d);
        let (mut f, mut b) = (gpu.zeros(n * m_out), gpu.zeros_bf16(n * m_out));
        gpu.gemm(&call, &mut f, &x, &w, None, None);
        gpu.gemm(&call, &mut b, &x, &w, None, None);
        gpu.take_reports();
        (f, b)
    };
    let (qkv_f, qkv_b) = gemm_pair(&mut gpu, wq);
    let (dy_f, dy_b) = gemm_pair(&mut gpu, c);
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<u32>>();
    for fused in [true, false] {
        gpu.set_fused_attention(fused);
        let saved = gpu.attention_saved_len(bsz, t, c, nh);
        let (mut outs, mut in_place) = (Vec::new(), Vec::new());
        // Inputs in f32 or BF16, and the outputs (out, and dqkv, which the backward also reads
        // out from) in f32 or BF16.
        for (qkv, dy, out16) in [(&qkv_f, &dy_f, false), (&qkv_b, &dy_b, false), (&qkv_b, &dy_b, true)] {
            let before = gpu.attention_reads_in_place();
            let zeros = |gpu: &mut fp8_capture::backend::cuda::CudaBackend, len: usize| if out16 { gpu.zeros_bf16(len) } else { gpu.zeros(len) };
            let (mut out, mut att) = (zeros(&mut gpu, n * c), gpu.zeros(saved));
            gpu.attention_fwd(&mut out, &mut att, qkv, bsz, t, c, nh, kvh, true);
            let (mut dqkv, mut datt) = (zeros(&mut gpu, n * wq), gpu.zeros(saved));
            gpu.attention_bwd(&mut dqkv, &mut datt, dy, &out, qkv, &att, bsz, t, c, nh, kvh, true);
            assert_eq!((out.is_bf16(), dqkv.is_bf16()), (out16, out16));
            in_place.push(gpu.attention_reads_in_place() - before);
            outs.push((bits(gpu.download(&out, 0, n * c, 1)), bits(gpu.download(&dqkv, 0, n * wq, 1))));
        }
        // The fused kernels read BF16 q, k, v (forward and backward) and dout where they lie, and
        // split f32 rows; the unfused path splits both.
        assert_eq!(in_place, if fused { vec![0, 7, 7] } else { vec![0, 0, 0] }, "tensors read in place (fused {fused}): f32 rows, BF16 rows");
        for (i, what) in [(1, "reads BF16 qkv / dout"), (2, "writes (and reads) BF16 out / dqkv")] {
            assert!(outs[0].0 == outs[i].0, "attention_fwd (fused {fused}) {what} differently");
            assert!(outs[0].1 == outs[i].1, "attention_bwd (fused {fused}) {what} differently");
            checked += 2;
        }
    }
    assert_eq!(gpu.take_error(), None);
    println!("{checked} outputs of BF16 and f32 buffers compared bit for bit: equal");
}

/// GEMM operands held in BF16 buffers (the attention's output, GPT's dqkv:
/// `capture/src/backend/cuda/bf16_operands.rs`) against the same values in f32 buffers: proj's
/// fprop and wgrad (X held: cast once, kept for the wgrad), and qkv's dgrad and wgrad (dY held: its
/// bias gradient from the cast's column sums in BF16), for BF16 operands (which the GEMMs read
/// from the buffer as it is, the kernel computing only the statistics and the column sums), FP8 of
/// given scales and current scaling, at the amax and cheap statistics levels (the computed-source
/// kernel reads the BF16 buffer) and the full level (the values are widened into f32 scratch
/// first): every output and every report (its f64 sums to their rounding) is bit-identical, and
/// the backend's count of widened operands says which way each ran.
#[test]
fn gemm_operands_held_in_bf16_give_the_bits_of_their_f32_copies() {
    let Some(mut gpu) = cuda_common::gpu("GEMM operands held in BF16") else { return };
    let (n, c, q) = (128usize, 64usize, 192usize);
    let mut rng = Pcg64::seed_from_u64(41);
    let normal = Normal::new(0.0f32, 1.0).expect("normal");
    let mut draw = |len: usize, s: f32| -> Vec<f32> { (0..len).map(|_| normal.sample(&mut rng) * s).collect() };
    // BF16 buffers (GEMM outputs), and f32 copies of their values.
    let (xv, dyv) = (draw(n * c, 1.0), draw(n * q, 0.01));
    let (x16, dy16) = (bf16_buffer(&mut gpu, &xv, n, c), bf16_buffer(&mut gpu, &dyv, n, q));
    let (xv, dyv) = (gpu.download(&x16, 0, n * c, 1), gpu.download(&dy16, 0, n * q, 1));
    let (x32, dy32) = (gpu.upload(&xv), gpu.upload(&dyv));
    let (w_proj, b_proj, w_qkv) = (gpu.upload(&draw(c * c, 0.05)), gpu.upload(&draw(c, 0.1)), gpu.upload(&draw(q * c, 0.05)));
    let (ln, dres) = (gpu.upload(&draw(n * c, 1.0)), gpu.upload(&draw(n * c, 0.01)));
    let given = |format, scale| OperandCast::Fp8Tensor { format, scale: ScaleSource::Given { scale, amax_used: 0.0 } };
    let current = |format| OperandCast::Fp8Tensor { format, scale: ScaleSource::Current { margin: 0 } };
    let casts = [
        ("bf16", OperandCast::Bf16, OperandCast::Bf16),
        ("e4m3 / e5m2", given(Fp8Format::E4M3, 16.0), given(Fp8Format::E5M2, 4096.0)),
        ("current", current(Fp8Format::E4M3), current(Fp8Format::E5M2)),
    ];
    let mut checked = 0;
    for (cast_name, act_cast, grad_cast) in casts {
        for stats in [StatsLevel::Amax, StatsLevel::Channels, StatsLevel::Full] {
            let label = format!("{cast_name}, statistics {stats:?}");
            let call = |module, gemm, m, column_sums| GemmCall {
                id: GemmId { layer: 1, module, gemm },
                dims: LinearDims { n, k: c, m },
                cast_a: if gemm == Gemm::Fprop { act_cast } else { grad_cast },
                cast_b: act_cast,
                fault_a: OperandFault::NONE,
                fault_b: OperandFault::NONE,
                nan_output: false,
                stats,
                keep_quantized: [true; 2],
                shadow: false,
                fast_accumulation: false,
                a_column_sums: column_sums,
            };
            let mut run = |held: bool| -> (Vec<(String, String)>, Vec<(String, Vec<f64>)>, u64) {
                let (x, dy) = if held { (&x16, &dy16) } else { (&x32, &dy32) };
                let widened = gpu.bf16_operands_widened();
                let (mut y, mut dwp, mut dbp) = (gpu.zeros_bf16(n * c), gpu.zeros(c * c), gpu.zeros(c));
                let (mut dln, mut dwq, mut dbq) = (gpu.zeros_bf16(n * c), gpu.zeros(q * c), gpu.zeros(q));
                gpu.gemm(&call(Module::Proj, Gemm::Fprop, c, false), &mut y, x, &w_proj, Some(&b_proj), None);
                let wgrad = call(Module::Proj, Gemm::Wgrad, c, false);
                if stats != StatsLevel::Full {
                    assert!(gpu.reuses_kept_cast(&wgrad, 1, x), "{label}: proj's wgrad does not take the kept cast of X (held {held})");
                }
                gpu.gemm(&wgrad, &mut dwp, &dres, x, None, Some(&mut dbp));
                gpu.gemm(&call(Module::Qkv, Gemm::Dgrad, q, true), &mut dln, dy, &w_qkv, None, None);
                gpu.gemm(&call(Module::Qkv, Gemm::Wgrad, q, false), &mut dwq, dy, &ln, None, Some(&mut dbq));
                let mut out = named_bits(
                    &mut gpu,
                    &[("proj.fprop", &y), ("proj.wgrad", &dwp), ("proj.dbias", &dbp), ("qkv.dgrad", &dln), ("qkv.wgrad", &dwq), ("qkv.dbias", &dbq)],
                );
                let mut sums = Vec::new();
                for r in gpu.take_reports() {
                    out.push((format!("report {:?}", r.id), format!("{:?}", without_sums(&r))));
                    sums.push((format!("report {:?} sums", r.id), report_sums(&r)));
                }
                assert_eq!(gpu.take_error(), None, "{label} (held {held})");
                (out, sums, gpu.bf16_operands_widened() - widened)
            };
            let ((want, want_sums, w0), (got, got_sums, w1)) = (run(false), run(true));
            // Held at the full level: proj's X in its fprop and wgrad, qkv's dY in its dgrad and wgrad.
            assert_eq!((w0, w1), (0, if stats == StatsLevel::Full { 4 } else { 0 }), "{label}: operands widened (f32, held)");
            assert_eq!((want.len(), want_sums.len()), (got.len(), got_sums.len()));
            for ((name, w), (_, g)) in want.iter().zip(&got) {
                assert!(w == g, "{label}: {name} differs between the f32 operands and those held in BF16");
                checked += 1;
            }
            for ((name, w), (_, g)) in want_sums.iter().zip(&got_sums) {
                let close = w.iter().zip(g).all(|(x, y)| (x - y).abs() <= 1e-12 * x.abs().max(y.abs()));
                assert!(close, "{label}: {name}: {w:?} against {g:?}");
                if w != g {
                    println!("{label}: {name} within f64 rounding ({w:?} against {g:?})");
                }
                checked += 1;
            }
            println!("{label}: {} outputs and reports equal", want.len() + want_sums.len());
        }
    }
    assert_eq!(checked, 9 * (6 + 2 * 4));
}
