//! GEMM operands computed in the cast (the activation function and its backward, RMSNorm and
//! LayerNorm) against the unfused pair of kernels: outputs and reports bit-identical.

use super::*;

/// The statistics level of the fused-against-unfused tests for a cast named `cast_name`: the cheap
/// level (no channel partials) for the FP8 casts "e4m3" and "current", whose operands take the dual
/// kernel either way, the channels level for the others; both levels are covered without running
/// each test twice.
fn fp8_level(cast_name: &str) -> StatsLevel {
    if matches!(cast_name, "e4m3" | "current") { StatsLevel::Cheap } else { StatsLevel::Channels }
}

/// fc2's fprop and fc1's dgrad with their operand computed as it is cast (the activation function
/// and its backward, `Backend::gemm_of_activation(_grad)`) against the unfused pair (the
/// activation kernel writes the operand, the GEMM casts it), followed by each site's wgrad, which
/// takes the kept cast of the operand the fused GEMM never wrote: for SwiGLU and GELU, in BF16,
/// E4M3, and E4M3 with gradients in E5M2 (the FP8 operands cast by the dual kernel, both layouts
/// from one computation), every output and every cast report (codes, amax, counts, moments,
/// channel statistics at the channels level, none at the cheap level: `fp8_level`) is
/// bit-identical; under current scaling too, whose amax pass is then the computed source's own
/// kernel. BF16 operands with F = 37 (rows the kernels cannot load 4 at a time) take the unfused
/// pair, and the backend says so (the activation comes back written). SwiGLU's backward is cast
/// by pairs of tiles both ways: its channel partials one tile a run, and over runs of tiles
/// (`set_pair_runs`, also on a grid of 4 blocks), where only the f64 sums may round differently.
#[test]
fn activation_operands_computed_in_the_cast_are_bit_identical_to_the_unfused_pair() {
    let Some(mut gpu) = cuda_common::gpu("activation operands computed in the cast") else { return };
    let (n, c) = (128usize, 128usize);
    let mut rng = Pcg64::seed_from_u64(31);
    let normal = Normal::new(0.0f32, 1.0).expect("normal");
    let mut draw = |len: usize, s: f32| -> Vec<f32> { (0..len).map(|_| normal.sample(&mut rng) * s).collect() };
    let given = |format, scale| OperandCast::Fp8Tensor { format, scale: ScaleSource::Given { scale, amax_used: 0.0 } };
    let current = |format| OperandCast::Fp8Tensor { format, scale: ScaleSource::Current { margin: 0 } };
    let mut checked = 0;
    // SwiGLU's backward by pairs of tiles, its channel partials one tile a run (the default) and
    // over runs of tiles (FP8SCOPE_PAIR_RUNS=1), the latter also on a grid of 4 blocks, where
    // each block's run is two row tiles of one column pair.
    for (pair_runs, most) in [(false, 0usize), (true, 0), (true, 4)] {
        gpu.set_pair_runs(pair_runs);
        gpu.set_cast_grid(most);
        println!("== pair runs {pair_runs}, cast grid {most}");
        for (label, kind, f) in [
            ("swiglu", Activation::Swiglu { f: 256 }, 256usize),
            ("swiglu_f80", Activation::Swiglu { f: 80 }, 80),
            ("swiglu_f37", Activation::Swiglu { f: 37 }, 37),
            ("gelu", Activation::Gelu, 256),
        ] {
            let f1 = if matches!(kind, Activation::Gelu) { f } else { 2 * f };
            // fc1's output and fc2's dgrad output are GEMM outputs, held in 16 bits as the model holds them.
            let h = bf16_buffer(&mut gpu, &draw(n * f1, 1.5), n, f1);
            let dact = bf16_buffer(&mut gpu, &draw(n * f, 0.1), n, f);
            let (w2, b2, w1) = (gpu.upload(&draw(c * f, 0.05)), gpu.upload(&draw(c, 0.1)), gpu.upload(&draw(f1 * c, 0.05)));
            let (dy2, x1) = (gpu.upload(&draw(n * c, 0.01)), gpu.upload(&draw(n * c, 1.0)));
            let casts = [
                ("bf16", OperandCast::Bf16, OperandCast::Bf16),
                ("e4m3", given(Fp8Format::E4M3, 16.0), given(Fp8Format::E4M3, 1024.0)),
                ("hybrid", given(Fp8Format::E4M3, 16.0), given(Fp8Format::E5M2, 4096.0)),
                ("current", current(Fp8Format::E4M3), current(Fp8Format::E5M2)),
            ];
            // cuBLASLt's FP8 GEMMs need dimensions of multiples of 16: F = 37 runs in BF16 only.
            for (cast_name, act_cast, grad_cast) in casts.into_iter().take(if f % 16 == 0 { 4 } else { 1 }) {
                // Current scaling included: its amax pass is the computed source's own kernel.
                let computable = f % 4 == 0;
                // Operand a is the gradient in dgrad and wgrad, the activation in fprop; b is a weight
                // or an activation.
                let call = |module, gemm, dims| GemmCall {
                    id: GemmId { layer: 2, module, gemm },
                    dims,
                    cast_a: if gemm == Gemm::Fprop { act_cast } else { grad_cast },
                    cast_b: act_cast,
                    fault_a: OperandFault::NONE,
                    fault_b: OperandFault::NONE,
                    nan_output: false,
                    stats: fp8_level(cast_name),
                    keep_quantized: [true; 2],
                    shadow: false,
                    fast_accumulation: false,
                    a_column_sums: false,
                };
                let (d2, d1) = (LinearDims { n, k: f, m: c }, LinearDims { n, k: c, m: f1 });
                // Per run: what must be bit-identical (outputs' bits, reports without their f64 sums),
                // and each report's f64 sums.
                let mut run = |fused: bool| -> (Vec<(String, String)>, Vec<(String, Vec<f64>)>) {
                    let (mut act, mut dh) = (gpu.zeros(n * f), gpu.zeros(n * f1));
                    let (mut y, mut dw2, mut dln, mut dw1) = (gpu.zeros(n * c), gpu.zeros(c * f), gpu.zeros(n * c), gpu.zeros(f1 * c));
                    let fprop = call(Module::Fc2, Gemm::Fprop, d2);
                    if fused {
                        let written = gpu.gemm_of_activation(&fprop, &mut y, &mut act, &h, kind, &w2, Some(&b2));
                        assert_eq!(written, !computable, "{label} {cast_name}: whether the activation was written");
                    } else {
                        gpu.activation_fwd(&mut act, &h, kind);
                        gpu.gemm(&fprop, &mut y, &act, &w2, Some(&b2), None);
                    }
                    let wgrad2 = call(Module::Fc2, Gemm::Wgrad, d2);
                    assert!(gpu.reuses_kept_cast(&wgrad2, 1, &act), "{label} {cast_name}: fc2's wgrad does not take the kept activation");
                    gpu.gemm(&wgrad2, &mut dw2, &dy2, &act, None, None);
                    let dgrad1 = call(Module::Fc1, Gemm::Dgrad, d1);
                    if fused {
                        let written = gpu.gemm_of_activation_grad(&dgrad1, &mut dln, &mut dh, &h, &dact, kind, &w1);
                        assert_eq!(written, !computable, "{label} {cast_name}: whether the gradient was written");
                    } else {
                        gpu.activation_bwd(&mut dh, &h, &dact, kind);
                        gpu.gemm(&dgrad1, &mut dln, &dh, &w1, None, None);
                    }
                    let wgrad1 = call(Module::Fc1, Gemm::Wgrad, d1);
                    assert!(gpu.reuses_kept_cast(&wgrad1, 0, &dh), "{label} {cast_name}: fc1's wgrad does not take the kept gradient");
                    gpu.gemm(&wgrad1, &mut dw1, &dh, &x1, None, None);
                    let mut out = named_bits(&mut gpu, &[("fc2.fprop", &y), ("fc2.wgrad", &dw2), ("fc1.dgrad", &dln), ("fc1.wgrad", &dw1)]);
                    let mut sums = Vec::new();
                    for r in gpu.take_reports() {
                        out.push((format!("report {:?}", r.id), format!("{:?}", without_sums(&r))));
                        sums.push((format!("report {:?} sums", r.id), report_sums(&r)));
                    }
                    assert_eq!(gpu.take_error(), None, "{label} {cast_name}");
                    (out, sums)
                };
                let ((want, want_sums), (got, got_sums)) = (run(false), run(true));
                assert_eq!((want.len(), want_sums.len()), (got.len(), got_sums.len()));
                for ((name, w), (_, g)) in want.iter().zip(&got) {
                    assert!(w == g, "{label} {cast_name}: {name} differs between the unfused pair and the computed operand");
                    checked += 1;
                }
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<u64>>();
                for ((name, w), (_, g)) in want_sums.iter().zip(&got_sums) {
                    if bits(w) != bits(g) {
                        // SwiGLU's backward by pairs of tiles (halves a whole number of tiles) folds a
                        // block's two tiles into one partial: its f64 sums may round differently.
                        let close = w.iter().zip(g).all(|(x, y)| (x - y).abs() <= 1e-12 * x.abs().max(y.abs()));
                        assert!(
                            close && label == "swiglu",
                            "{label} {cast_name}: {name} differs between the unfused pair and the computed operand: {w:?} against {g:?}"
                        );
                        println!("{label} {cast_name}: {name} within f64 rounding ({w:?} against {g:?})");
                    }
                    checked += 1;
                }
                println!(
                    "{label} {cast_name}: {} outputs and reports bit-identical{}",
                    want.len() + want_sums.len(),
                    if computable { "" } else { " (the unfused pair both times)" }
                );
            }
        }
    }
    gpu.set_pair_runs(false);
    gpu.set_cast_grid(0);
    assert_eq!(checked, 3 * 13 * 12);
}

/// qkv's and fc1's fprop with the normalization computed in the cast (`gemm_of_norm`: the norm's
/// kernel writes only its row statistics, the cast reads x and normalizes it) against the unfused
/// pair (the norm's kernel writes ln, the cast reads it): for RMSNorm and LayerNorm (with the
/// GEMM's bias), BF16 and FP8 operands, on a shape of partial tiles, the saved row statistics, the
/// fprop's output, the wgrad that takes the kept cast of the unwritten ln, and every report (f64
/// sums included: the tiles are cast in the same order) are bit-identical, at the channels level
/// or, for the FP8 casts e4m3 and current, the cheap level (`fp8_level`). Under current scaling
/// the amax pass before the cast is the computed source's own kernel too. With the residual add
/// before the norm (x = a + b, b a BF16 GEMM output), the fused side takes the statistics that
/// `add_with_norm_stats` computed in the add's pass (`ready`); the unfused side adds, then runs
/// the norm: x itself and everything above are bit-identical too.
#[test]
fn normalizations_computed_in_the_cast_are_bit_identical_to_the_unfused_pair() {
    use fp8_capture::backend::{NormFwd, NormStats};
    let Some(mut gpu) = cuda_common::gpu("normalizations computed in the cast") else { return };
    // Rows and columns of partial 64 x 64 tiles, multiples of 16 for cuBLASLt's FP8 GEMMs.
    let (n, c, m) = (144usize, 208usize, 96usize);
    let mut rng = Pcg64::seed_from_u64(43);
    let normal = Normal::new(0.0f32, 1.0).expect("normal");
    let mut draw = |len: usize, s: f32, mu: f32| -> Vec<f32> { (0..len).map(|_| mu + normal.sample(&mut rng) * s).collect() };
    let (x0, gain, shift) = (gpu.upload(&draw(n * c, 2.0, 0.5)), gpu.upload(&draw(c, 0.3, 1.0)), gpu.upload(&draw(c, 0.1, 0.0)));
    let branch = draw(n * c, 1.0, 0.0);
    let branch = bf16_buffer(&mut gpu, &branch, n, c);
    let (w, bias, dy) = (gpu.upload(&draw(m * c, 0.05, 0.0)), gpu.upload(&draw(m, 0.1, 0.0)), gpu.upload(&draw(n * m, 0.01, 0.0)));
    let given = |format, scale| OperandCast::Fp8Tensor { format, scale: ScaleSource::Given { scale, amax_used: 0.0 } };
    let casts = [
        ("bf16", OperandCast::Bf16, OperandCast::Bf16),
        ("e4m3", given(Fp8Format::E4M3, 16.0), given(Fp8Format::E4M3, 1024.0)),
        ("hybrid", given(Fp8Format::E4M3, 8.0), given(Fp8Format::E5M2, 4096.0)),
        (
            "current",
            OperandCast::Fp8Tensor { format: Fp8Format::E4M3, scale: ScaleSource::Current { margin: 0 } },
            OperandCast::Fp8Tensor { format: Fp8Format::E5M2, scale: ScaleSource::Current { margin: 0 } },
        ),
    ];
    let mut checked = 0;
    for (layer, after_add) in [(false, false), (true, false), (false, true), (true, true)] {
        for (cast_name, act_cast, grad_cast) in casts {
            let label = format!("{}{} {cast_name}", if layer { "layernorm" } else { "rmsnorm" }, if after_add { " after the residual add" } else { "" });
            let dims = LinearDims { n, k: c, m };
            let call = |gemm, cast_a, cast_b| GemmCall {
                id: GemmId { layer: 1, module: Module::Fc1, gemm },
                dims,
                cast_a,
                cast_b,
                fault_a: OperandFault::NONE,
                fault_b: OperandFault::NONE,
                nan_output: false,
                stats: fp8_level(cast_name),
                keep_quantized: [true; 2],
                shadow: false,
                fast_accumulation: false,
                a_column_sums: false,
            };
            let (fprop, wgrad) = (call(Gemm::Fprop, act_cast, act_cast), call(Gemm::Wgrad, grad_cast, act_cast));
            let mut run = |fused: bool| -> Vec<(String, String)> {
                let (mut ln, mut mean, mut rstd) = (gpu.zeros(n * c), gpu.zeros(n), gpu.zeros(n));
                let (mut y, mut dw, mut sum) = (gpu.zeros(n * m), gpu.zeros(m * c), gpu.zeros(n * c));
                let b = layer.then_some(&bias);
                let mut ready = false;
                if after_add && fused {
                    let stats = if layer { NormStats::Layer { mean: &mut mean, rstd: &mut rstd, c } } else { NormStats::Rms { rstd: &mut rstd, c, eps: 1e-5 } };
                    ready = gpu.add_with_norm_stats(&mut sum, &x0, &branch, stats);
                    assert!(ready, "{label}: the CUDA backend computes the statistics in the add");
                } else if after_add {
                    gpu.add(&mut sum, &x0, &branch);
                }
                let x = if after_add { &sum } else { &x0 };
                let norm = if layer {
                    NormFwd::Layer { inp: x, w: &gain, b: &shift, mean: &mut mean, rstd: &mut rstd, c, ready }
                } else {
                    NormFwd::Rms { inp: x, w: &gain, rstd: &mut rstd, c, eps: 1e-5, ready }
                };
                if fused {
                    let written = gpu.gemm_of_norm(&fprop, &mut y, &mut ln, norm, &w, b);
                    assert!(!written, "{label}: ln was written (the cast should have computed it)");
                } else {
                    gpu.norm_fwd(&mut ln, norm);
                    gpu.gemm(&fprop, &mut y, &ln, &w, b, None);
                }
                assert!(gpu.reuses_kept_cast(&wgrad, 1, &ln), "{label}: the wgrad does not take the kept cast of ln");
                gpu.gemm(&wgrad, &mut dw, &dy, &ln, None, None);
                let mut out = named_bits(&mut gpu, &[("x", x), ("mean", &mean), ("rstd", &rstd), ("fprop", &y), ("wgrad", &dw)]);
                for r in gpu.take_reports() {
                    out.push((format!("report {:?}", r.id), format!("{r:?}")));
                }
                assert_eq!(gpu.take_error(), None, "{label}");
                out
            };
            let (want, got) = (run(false), run(true));
            assert_eq!(want.len(), got.len(), "{label}: reports");
            for ((name, w), (_, g)) in want.iter().zip(&got) {
                assert!(w == g, "{label}: {name} differs between the unfused pair and the normalization computed in the cast");
                checked += 1;
            }
            println!("{label}: {} outputs and reports bit-identical", want.len());
        }
    }
    assert_eq!(checked, 4 * 4 * 7);
}
