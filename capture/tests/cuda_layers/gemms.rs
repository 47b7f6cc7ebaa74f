//! The GEMMs' outputs: kept BF16 casts read transposed against the TN layout, the bias gradients
//! against an f64 sum, and the reported non-finite counts against a count of the output.

use super::*;

/// A BF16 GEMM that reads a kept cast held in the operand's own layout (cuBLASLt takes it
/// transposed) against the same GEMM given its operand transposed in memory: the fprop is
/// bit-identical (same layout), the dgrad and wgrad agree to BF16 rounding of one product (cuBLASLt
/// may accumulate the two layouts in another order), and the bias gradient, summed down dY's
/// columns instead of along dYᵀ's rows (both in f64), is bit-identical.
#[test]
fn bf16_gemms_reading_kept_casts_transposed_agree_with_the_tn_layout() {
    let Some(mut gpu) = cuda_common::gpu("BF16 operands held transposed") else { return };
    let i = inputs();
    let m = |k: &str| i.mats[k].as_slice();
    let dims = LinearDims { n: i.b * i.t, k: i.c, m: i.f };
    let (x, w, bias, dy) = (gpu.upload(m("x")), gpu.upload(m("w_fc1")), gpu.upload(m("bias_f")), gpu.upload(m("dy_f")));
    let tn = bf16_site(&mut gpu, &x, &w, &bias, &dy, m("bias_f"), dims, false, false, StatsLevel::Channels);
    let kept = bf16_site(&mut gpu, &x, &w, &bias, &dy, m("bias_f"), dims, true, false, StatsLevel::Channels);
    assert_eq!(gpu.take_error(), None);
    let mut failed = Vec::new();
    for ((name, a), (_, b)) in tn.iter().zip(&kept) {
        let differ = a.iter().zip(b).filter(|(p, q)| p.to_bits() != q.to_bits()).count();
        let (rel, maxabs) = rel_l2(b, a);
        let exact = name.ends_with("fprop") || name.ends_with("dbias");
        println!("{name:<28} {differ:>6} of {:>6} values differ, rel L2 {rel:.2e}, max |d| {maxabs:.2e}{}", a.len(), if exact { " (must be 0)" } else { "" });
        if (exact && differ > 0) || !(rel <= 2e-3) {
            failed.push(format!("{name}: {differ} values differ, rel L2 {rel:.3e}"));
        }
    }
    assert!(failed.is_empty(), "kept BF16 casts read transposed disagree with the TN layout:\n{}", failed.join("\n"));
}

/// The bias gradient equals, bit for bit, an f64 sum of the values the wgrad GEMM multiplies,
/// rounded to f32 once and added to the gradient it started from: round_bf16(dY) for BF16 (summed
/// along dYᵀ's rows in the TN layout, down dY's columns when the wgrad reads the dgrad's kept
/// cast, or from the column sums that cast took as it cast dY, at the amax level and the cheap),
/// the FP8 codes times the inverse scale for FP8 (dY in E4M3 and in E5M2). Token counts whose rows
/// all take 16-byte loads (128: BF16 and FP8), half of them (72) and none (50) are each checked
/// (BF16 only: an FP8 GEMM takes a multiple of 16 tokens, so its rows always take them), and
/// 70,400, whose 1,100 row tiles outnumber the cast's blocks, so that a block sums runs of tiles.
#[test]
fn bias_gradients_equal_an_f64_sum_of_the_operand_the_wgrad_gemm_read() {
    let Some(mut gpu) = cuda_common::gpu("bias gradients") else { return };
    let mut rng = Pcg64::seed_from_u64(29);
    let normal = Normal::new(0.0f32, 1.0).unwrap();
    let mut checked = 0;
    for n in [128usize, 72, 50, 70_400] {
        let (c, f) = (24usize, 40usize);
        let dims = LinearDims { n, k: c, m: f };
        let mut draw = |len: usize, s: f32| -> Vec<f32> { (0..len).map(|_| normal.sample(&mut rng) * s).collect() };
        let (xh, wh, bh, dyh, db0) = (draw(n * c, 1.0), draw(f * c, 0.1), draw(f, 0.1), draw(n * f, 0.01), draw(f, 0.1));
        let (x, w, bias, dy) = (gpu.upload(&xh), gpu.upload(&wh), gpu.upload(&bh), gpu.upload(&dyh));
        let sum_down = |v: &dyn Fn(usize) -> f32| -> Vec<f32> { (0..f).map(|j| db0[j] + (0..n).map(|i| v(i * f + j) as f64).sum::<f64>() as f32).collect() };
        let mut check = |what: String, got: &[f32], want: &[f32]| {
            let differ = got.iter().zip(want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            println!("{what:<32} {differ} of {f} differ");
            assert_eq!(differ, 0, "{what}: the bias gradient differs from the f64 sum: got {got:?}, want {want:?}");
            checked += 1;
        };
        let want_bf16 = sum_down(&|i| half::bf16::from_f32(dyh[i]).to_f32());
        let runs = [
            (false, false, StatsLevel::Channels, ""),
            (true, false, StatsLevel::Channels, " (kept cast)"),
            (true, true, StatsLevel::Channels, " (cast's column sums)"),
            (true, true, StatsLevel::Amax, " (column sums, amax)"),
        ];
        for (back_to_back, column_sums, stats, label) in runs {
            let fused_before = gpu.bias_grads_from_column_sums();
            let out = bf16_site(&mut gpu, &x, &w, &bias, &dy, &db0, dims, back_to_back, column_sums, stats);
            let fused = gpu.bias_grads_from_column_sums() - fused_before;
            assert_eq!(fused, u64::from(column_sums), "n {n}{label}: the bias gradient came from the cast's column sums {fused} times");
            let got = &out.iter().find(|(k, _)| k.ends_with("wgrad.dbias")).expect("dbias").1;
            check(format!("n {n} bf16{label}"), got, &want_bf16);
        }
        // cuBLASLt's FP8 GEMMs take k (here the tokens) in multiples of 16 only, and not E5M2
        // against E5M2: dY in either format, X in E4M3 (the hybrid recipe's pairing).
        let formats: &[Fp8Format] = if n % 16 == 0 { &[Fp8Format::E4M3, Fp8Format::E5M2] } else { &[] };
        for &format in formats {
            let cast = |format| OperandCast::Fp8Tensor { format, scale: ScaleSource::Current { margin: 0 } };
            let call = GemmCall {
                cast_a: cast(format),
                cast_b: cast(Fp8Format::E4M3),
                keep_quantized: [true, false],
                stats: StatsLevel::Full,
                ..GemmCall::bf16(GemmId { layer: 0, module: Module::Fc1, gemm: Gemm::Wgrad }, dims)
            };
            let (mut dw, mut db) = (gpu.zeros(f * c), gpu.upload(&db0));
            gpu.gemm(&call, &mut dw, &dy, &x, None, Some(&mut db));
            let rep = gpu.take_reports().pop().expect("the wgrad's report");
            let codes = rep.a.quantized.expect("dY's FP8 codes");
            assert_eq!(codes.len(), n * f);
            let inv = 1.0f32 / rep.a.scale;
            let want = sum_down(&|i| fp8::decode(format, codes[i]) * inv);
            check(format!("n {n} {}", format.name()), &gpu.download(&db, 0, f, 1), &want);
        }
    }
    assert_eq!(gpu.take_error(), None);
    assert_eq!(checked, 20);
    println!("{checked} bias gradients equal their f64 sums");
}

/// Each GEMM's reported count of non-finite outputs equals a count of the output it wrote,
/// whether the GEMM could have produced a non-finite value or not (the count reads the output only
/// when an operand's cast met a non-finite or huge value, or the bias holds one: otherwise it is
/// exactly 0 without reading): finite operands, a NaN in the activation, an Inf in the weight,
/// activations near BF16's largest value, a NaN in the bias; BF16 and FP8 operands (current and
/// delayed scaling), with and without a bias (added in cuBLASLt's epilogue), into BF16 and f32
/// outputs; every GEMM kind, each operand in the layout its kind casts.
#[test]
fn gemm_nonfinite_counts_match_a_count_of_the_output() {
    let Some(mut gpu) = cuda_common::gpu("GEMM non-finite counts") else { return };
    let mut rng = Pcg64::seed_from_u64(23);
    let normal = Normal::new(0.0f32, 1.0).unwrap();
    let dims = LinearDims { n: 64, k: 128, m: 96 };
    let (n, k, m) = (dims.n, dims.k, dims.m);
    let mut draw = |len: usize| -> Vec<f32> { (0..len).map(|_| normal.sample(&mut rng)).collect() };
    let (x0, w0, dy0, b0) = (draw(n * k), draw(m * k), draw(n * m), draw(m));
    let fp8_current = OperandCast::Fp8Tensor { format: Fp8Format::E4M3, scale: ScaleSource::Current { margin: 0 } };
    let fp8_delayed = OperandCast::Fp8Tensor { format: Fp8Format::E4M3, scale: ScaleSource::Given { scale: 8.0, amax_used: 56.0 } };
    let mut checked = 0;
    for (case, plant) in [("finite", 0), ("NaN in x and dY", 1), ("Inf in W", 2), ("x and dY near BF16's max", 3), ("NaN in the bias", 4)] {
        let (mut x, mut w, mut dy, mut b) = (x0.clone(), w0.clone(), dy0.clone(), b0.clone());
        match plant {
            1 => (x[5 * k + 3], dy[6 * m + 2]) = (f32::NAN, f32::NAN),
            2 => w[7 * k + 1] = f32::INFINITY,
            3 => {
                x[2 * k..3 * k].iter_mut().for_each(|v| *v *= 1e38);
                dy[4 * m..5 * m].iter_mut().for_each(|v| *v *= 1e38);
            }
            4 => b[3] = f32::NAN,
            _ => {}
        }
        let (xb, wb, dyb, bb) = (gpu.upload(&x), gpu.upload(&w), gpu.upload(&dy), gpu.upload(&b));
        for (label, cast) in [("bf16", OperandCast::Bf16), ("fp8 current", fp8_current), ("fp8 delayed", fp8_delayed)] {
            for with_bias in [false, true] {
                for gemm in [Gemm::Fprop, Gemm::Dgrad, Gemm::Wgrad] {
                    if (with_bias && gemm != Gemm::Fprop) || (plant == 4 && !with_bias) {
                        continue;
                    }
                    let call = GemmCall {
                        cast_a: cast,
                        cast_b: cast,
                        stats: StatsLevel::Channels,
                        ..GemmCall::bf16(GemmId { layer: 0, module: Module::Fc1, gemm }, dims)
                    };
                    // Fprop X·Wᵀ (n × m), dgrad dY·W (n × k), wgrad dYᵀ·X (m × k).
                    let (a, bop, len) = match gemm {
                        Gemm::Fprop => (&xb, &wb, n * m),
                        Gemm::Dgrad => (&dyb, &wb, n * k),
                        Gemm::Wgrad => (&dyb, &xb, m * k),
                    };
                    for out_bf16 in [false, true] {
                        let mut out = if out_bf16 { gpu.zeros_bf16(len) } else { gpu.zeros(len) };
                        let bias = with_bias.then_some(&bb);
                        gpu.gemm(&call, &mut out, a, bop, bias, None);
                        let reported = gpu.take_reports()[0].output_nonfinite;
                        let counted = gpu.count_nonfinite(&out);
                        let what =
                            format!("{case}, {label}, {gemm:?}{}, {} output", if with_bias { " + bias" } else { "" }, if out_bf16 { "BF16" } else { "f32" });
                        assert_eq!(gpu.take_error(), None, "{what}");
                        assert_eq!(reported, counted, "{what}: the reported non-finite count against a count of the output");
                        if plant == 0 {
                            assert_eq!(counted, 0, "{what}: finite operands gave a non-finite output");
                        }
                        if plant == 1 || plant == 4 || (plant == 3 && label == "bf16") {
                            assert!(counted > 0, "{what}: the planted value reached no output");
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    println!("{checked} GEMMs' non-finite counts checked");
}

/// The shadow GEMM's error summed on the device (`output_error_partial`) against the CPU's
/// `output_error` of the same two outputs downloaded: every metric to 1e-9 relative (f64 sums in
/// another order), NaN when the FP8 result holds a non-finite value, and the error paired with the
/// reference (a gradient GEMM's dual) against `error_inner`; at odd lengths, one long enough for
/// blocks that loop, f32 and BF16 results. Then through GEMMs: the report of an FP8 fprop and of an
/// FP8 dgrad with their shadows equals the error of their outputs against the BF16 GEMMs' on the
/// same operands; the dgrad's paired with its BF16 result, the fprop's left null.
#[test]
fn shadow_errors_summed_on_the_device_match_the_cpu_on_the_outputs() {
    let Some(mut gpu) = cuda_common::gpu("shadow errors on the device") else { return };
    let mut rng = Pcg64::seed_from_u64(29);
    let normal = Normal::new(0.0f32, 1.0).unwrap();
    let close = |got: (f64, f64, f64, f64), want: (f64, f64, f64, f64), what: &str| {
        for (g, w, name) in [(got.0, want.0, "cosine"), (got.1, want.1, "mse"), (got.2, want.2, "rel_l2"), (got.3, want.3, "max_abs_diff")] {
            assert!(g.is_nan() == w.is_nan() && (w.is_nan() || (g - w).abs() <= 1e-9 * w.abs().max(1e-30)), "{what}: {name} {g} against the CPU's {w}");
        }
    };
    for n in [1usize, 1000, 4097, 3_000_001] {
        let r: Vec<f32> = (0..n).map(|_| normal.sample(&mut rng)).collect();
        let mut t: Vec<f32> = r.iter().map(|v| v + 0.05 * normal.sample(&mut rng)).collect();
        for plant in ["finite", "NaN in the result", "Inf in the reference"] {
            let mut reference = r.clone();
            match plant {
                "NaN in the result" => t[n / 2] = f32::NAN,
                "Inf in the reference" => reference[n / 3] = f32::INFINITY,
                _ => {}
            }
            let rb = gpu.upload(&reference);
            for bf16 in [false, true] {
                let tb = if bf16 { gpu.upload_bf16(&t).expect("upload_bf16") } else { gpu.upload(&t) };
                let host_t = gpu.download(&tb, 0, n, 1);
                let e = gpu.output_error_for_test(&tb, &rb).expect("output_error");
                let what = format!("{n} values, {plant}, BF16 result {bf16}");
                close((e.cosine, e.mse, e.rel_l2, e.max_abs_diff), fp8_capture::tensor_stats::output_error(&host_t, &reference), &what);
                let (inner, norm) = fp8_capture::tensor_stats::error_inner(&host_t, &reference, &reference);
                close((e.inner_with_reference, e.reference_norm, 0.0, 0.0), (inner, norm, 0.0, 0.0), &format!("{what}, paired with the reference"));
            }
            if plant == "NaN in the result" {
                t[n / 2] = r[n / 2];
            }
        }
    }
    // Through GEMMs: an FP8 fprop (X·Wᵀ) and dgrad (dY·W) with their shadows, against the BF16
    // GEMMs' outputs (written in f32, as the shadow's reference is).
    let dims = LinearDims { n: 96, k: 256, m: 160 };
    let mut draw = |len: usize| -> Vec<f32> { (0..len).map(|_| normal.sample(&mut rng)).collect() };
    let (x, w, dy) = (gpu.upload(&draw(dims.n * dims.k)), gpu.upload(&draw(dims.m * dims.k)), gpu.upload(&draw(dims.n * dims.m)));
    let fp8 = OperandCast::Fp8Tensor { format: Fp8Format::E4M3, scale: ScaleSource::Given { scale: 64.0, amax_used: 7.0 } };
    for (gemm, a, len) in [(Gemm::Fprop, &x, dims.n * dims.m), (Gemm::Dgrad, &dy, dims.n * dims.k)] {
        let id = GemmId { layer: 0, module: Module::Fc1, gemm };
        let call = GemmCall { cast_a: fp8, cast_b: fp8, shadow: true, ..GemmCall::bf16(id, dims) };
        let (mut y8, mut y16) = (gpu.zeros_bf16(len), gpu.zeros(len));
        gpu.gemm(&call, &mut y8, a, &w, None, None);
        let shadow = gpu.take_reports()[0].shadow.expect("an FP8 GEMM with its shadow reports its error");
        gpu.gemm(&GemmCall::bf16(id, dims), &mut y16, a, &w, None, None);
        gpu.take_reports();
        assert_eq!(gpu.take_error(), None);
        let (t, r) = (gpu.download(&y8, 0, len, 1), gpu.download(&y16, 0, len, 1));
        close(
            (shadow.cosine, shadow.mse, shadow.rel_l2, shadow.max_abs_diff),
            fp8_capture::tensor_stats::output_error(&t, &r),
            &format!("an FP8 {gemm:?}'s shadow"),
        );
        assert!(shadow.cosine > 0.99 && shadow.cosine < 1.0 && shadow.numel == len as u64, "{gemm:?}: {shadow:?}");
        match gemm {
            Gemm::Fprop => assert_eq!((shadow.dual_inner, shadow.dual_norm), (None, None), "the fprop's dual comes with the backward"),
            _ => {
                let (inner, norm) = fp8_capture::tensor_stats::error_inner(&t, &r, &r);
                let (gi, gn) = (shadow.dual_inner.expect("a gradient GEMM's dual"), shadow.dual_norm.expect("its norm"));
                close((gi, gn, 0.0, 0.0), (inner, norm, 0.0, 0.0), &format!("an FP8 {gemm:?}'s error paired with its BF16 result"));
            }
        }
    }
    println!("shadow errors on the device: 4 lengths × 3 plants × 2 result storages, and an FP8 fprop's and dgrad's shadows");
}
