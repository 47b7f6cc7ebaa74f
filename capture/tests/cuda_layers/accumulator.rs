//! The accumulator: cuBLASLt's FP8 GEMM outputs against the CPU's, in split and in fast
//! accumulation, with the CPU accumulating in FP32 (its default) and emulating Hopper's tensor
//! cores (`--cpu-accumulator hopper`, `fp8_capture::accumulator`), on the linear layers' shapes
//! of the presets: how many BF16 outputs differ in their bits, and by how many BF16 ulps.

use super::*;
use fp8_capture::backend::cpu::CpuAccumulator;

/// (preset, tokens, C, F): the linear layers' shapes (the tokens of `seed` cut to 256, so that the
/// CPU's emulation, an integer sum per product, takes seconds).
const SHAPES: &[(&str, usize, usize, usize)] =
    &[("tiny", 512, 64, 256), ("small", 1024, 256, 1024), ("llama-small", 1024, 256, 704), ("seed/256 tokens", 256, 1024, 4096)];

/// A BF16 value (in an f32) as a position on the number line in BF16 ulps: the sign-magnitude
/// bits made monotonic, so that the difference of two positions counts the BF16 values between
/// them, across zero too.
fn ordinal(x: f32) -> i64 {
    let b = i64::from(x.to_bits() >> 16);
    if b & 0x8000 != 0 { -(b & 0x7FFF) } else { b }
}

/// (values whose bits differ, the largest difference in BF16 ulps).
fn bit_gap(a: &[f32], b: &[f32]) -> (usize, u64) {
    let mut differ = 0;
    let mut ulps = 0;
    for (x, y) in a.iter().zip(b) {
        if x.to_bits() != y.to_bits() {
            differ += 1;
            ulps = ulps.max((ordinal(*x) - ordinal(*y)).unsigned_abs());
        }
    }
    (differ, ulps)
}

/// Every FP8 GEMM of a site (E4M3 activations and weights, E5M2 gradients, each cast with a scale
/// from its amax) on the GPU, with cuBLASLt's split and fast accumulation, against the CPU in FP32
/// and under the Hopper emulation; the shares are printed as the measurement. On a Hopper GPU
/// (compute capability 9.x) the emulation must give every output's bits (measured on an H100:
/// 0 of 16.8 million outputs differ, where FP32 accumulation differs in 4.5% to 14.4% of them);
/// elsewhere (another accumulator) it must at least differ in fewer outputs than FP32 does.
#[test]
fn the_hopper_accumulator_emulation_matches_more_gpu_bits_than_fp32() {
    let Some(mut gpu) = cuda_common::gpu("accumulator emulation") else { return };
    let hopper_gpu = gpu.device_info().compute_capability.is_some_and(|c| c.starts_with("9."));
    let mut exact = CpuBackend::new();
    let mut hopper = CpuBackend::new();
    hopper.set_accumulator(CpuAccumulator::Hopper);
    let mut rng = Pcg64::seed_from_u64(41);
    let normal = Normal::new(0.0f32, 1.0).unwrap();
    let mut failed = Vec::new();
    let mut totals: std::collections::BTreeMap<(String, bool), [usize; 3]> = Default::default();
    println!("{:<16} {:<6} {:<5} {:>9} {:>22} {:>22}", "shape", "gemm", "accum", "outputs", "FP32: differ (ulps)", "Hopper: differ (ulps)");
    for &(shape, n, c, f) in SHAPES {
        let mut draw = |len: usize, s: f32| -> Vec<f32> { (0..len).map(|_| normal.sample(&mut rng) * s).collect() };
        let (xh, wh, bh, dyh) = (draw(n * c, 1.0), draw(f * c, 0.02), draw(f, 0.1), draw(n * f, 1e-4));
        let given = |format: Fp8Format, v: &[f32]| {
            let amax = fp8::amax(v);
            OperandCast::Fp8Tensor { format, scale: ScaleSource::Given { scale: fp8::scale_for_amax(format, amax, 0), amax_used: amax } }
        };
        let dims = LinearDims { n, k: c, m: f };
        for gemm in Gemm::ALL {
            let (a, b, cast_a, cast_b, len) = match gemm {
                Gemm::Fprop => (&xh, &wh, given(Fp8Format::E4M3, &xh), given(Fp8Format::E4M3, &wh), n * f),
                Gemm::Dgrad => (&dyh, &wh, given(Fp8Format::E5M2, &dyh), given(Fp8Format::E4M3, &wh), n * c),
                Gemm::Wgrad => (&dyh, &xh, given(Fp8Format::E5M2, &dyh), given(Fp8Format::E4M3, &xh), f * c),
            };
            let bias = (gemm == Gemm::Fprop).then_some(&bh);
            for fast_accumulation in [false, true] {
                let call = GemmCall { cast_a, cast_b, fast_accumulation, ..GemmCall::bf16(GemmId { layer: 0, module: Module::Fc1, gemm }, dims) };
                let on_gpu = {
                    let (ga, gb) = (gpu.upload(a), gpu.upload(b));
                    let gbias = bias.map(|v| gpu.upload(v));
                    let mut out = gpu.zeros(len);
                    gpu.gemm(&call, &mut out, &ga, &gb, gbias.as_ref(), None);
                    gpu.download(&out, 0, len, 1)
                };
                let on_cpu = |be: &mut CpuBackend| {
                    let mut out = vec![0f32; len];
                    be.gemm(&call, &mut out, a, b, bias, None);
                    be.take_reports();
                    out
                };
                let (fp32, emulated) = (on_cpu(&mut exact), on_cpu(&mut hopper));
                let ((d32, u32_), (dh, uh)) = (bit_gap(&fp32, &on_gpu), bit_gap(&emulated, &on_gpu));
                let mode = if fast_accumulation { "fast" } else { "split" };
                println!(
                    "{shape:<16} {gemm:<6} {mode:<5} {len:>9} {:>14.4}% ({u32_:>3}) {:>14.4}% ({uh:>3})",
                    100.0 * d32 as f64 / len as f64,
                    100.0 * dh as f64 / len as f64
                );
                let t = totals.entry((gemm.to_string(), fast_accumulation)).or_default();
                t[0] += len;
                t[1] += d32;
                t[2] += dh;
            }
        }
    }
    if let Some(e) = gpu.take_error() {
        panic!("GPU: {e}");
    }
    println!("all shapes:");
    for ((gemm, fast), [len, d32, dh]) in &totals {
        let mode = if *fast { "fast" } else { "split" };
        println!(
            "  {gemm:<6} {mode:<5} FP32 {:.4}% of outputs differ, Hopper emulation {:.4}%",
            100.0 * *d32 as f64 / *len as f64,
            100.0 * *dh as f64 / *len as f64
        );
        if (hopper_gpu && *dh > 0) || (dh >= d32 && *d32 > 0) {
            failed.push(format!("{gemm} {mode}: the emulation differs from the GPU in {dh} outputs, FP32 in {d32}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
