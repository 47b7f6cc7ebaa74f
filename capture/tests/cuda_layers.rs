//! The CUDA backend against the CPU reference, on the GPU (skipped, visibly, without one):
//! - FP8 casts: the GPU's bytes equal the CPU emulation's, bit for bit, for E4M3 and E5M2, over
//!   every code point, the ties between them, saturation, subnormals, zeros, Inf and NaN, at
//!   several scales, transposed or not; and the cast statistics agree; the tiled casts' FP8 path
//!   that takes four plain values at once, on every kind of value shuffled among plain ones, with
//!   and without overflow to NaN / Inf;
//! - per-channel statistics of operand casts (amax channel exactly, the top channels' share of Σx²
//!   to f64 summation order) and the moments of the tiled casts, on tensors with a planted
//!   outlier channel, ties and non-finite values;
//! - every layer's forward and backward (the GPT family's and the Llama family's: RMSNorm,
//!   SwiGLU, RoPE, grouped-query attention): one test body runs on both backends, and each output
//!   is compared by relative L2 error against a bound whose reason is given in [`TOLERANCES`];
//! - determinism: the same body run twice on the GPU gives bit-identical outputs;
//! - the cross-entropy's row kernels (in shared memory; split between registers and shared memory)
//!   are the rereading kernel's, bit for bit;
//! - the step's multi-tensor launches (AdamW, the gradient norm, the zeroing, the weights' FP8
//!   casts) give the bits of one launch a buffer;
//! - each GEMM's reported count of non-finite outputs equals a count of its output, with and
//!   without non-finite or huge operands and biases;
//! - BF16 GEMMs that read a kept cast transposed agree with the TN layout (the bias gradient and
//!   the fprop bit for bit);
//! - GEMM operands computed in the cast (the activation function and its backward, RMSNorm and
//!   LayerNorm) are bit-identical to the unfused pair of kernels, outputs and reports; GEMM
//!   operands held in BF16 buffers give the bits of their f32 copies;
//! - errors: a failing primitive keeps its error for `Backend::take_error` instead of panicking,
//!   and the backend skips the device work of the primitives after it.

mod cuda_common;

use fp8_capture::backend::cpu::CpuBackend;
use fp8_capture::backend::cpu::cast::cast_operand;
use fp8_capture::backend::{Activation, AdamW, Backend, GemmCall, GemmId, GemmReport, LinearDims, OperandCast, OperandFault, ScaleSource, StatsLevel};
use fp8_capture::fp8::{self, Fp8Format};
use fp8scope_schemas::names::{Gemm, Module};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};
use rand_pcg::Pcg64;

fn fp8_test_values(format: Fp8Format) -> Vec<f32> {
    let mut v = Vec::new();
    let mut codes: Vec<f32> = (0u16..256).map(|c| fp8::decode(format, c as u8)).filter(|x| x.is_finite()).collect();
    codes.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    codes.dedup();
    for w in codes.windows(2) {
        let mid = 0.5 * (w[0] + w[1]);
        v.extend([w[0], mid, f32::from_bits(mid.to_bits() + 1), f32::from_bits(mid.to_bits().wrapping_sub(1))]);
    }
    let max = format.max();
    v.extend([
        0.0,
        -0.0,
        max,
        -max,
        max * 1.01,
        -max * 1.5,
        max * 1e6,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e-30,
        -1e-30,
        f32::MIN_POSITIVE,
    ]);
    let mut rng = Pcg64::seed_from_u64(7);
    for _ in 0..20000 {
        let e: f32 = rng.random_range(-30.0..20.0);
        let s = if rng.random_bool(0.5) { -1.0 } else { 1.0 };
        v.push(s * 2f32.powf(e) * rng.random_range(1.0..2.0));
    }
    v
}

#[test]
fn fp8_casts_match_the_cpu_emulation_bit_for_bit() {
    let Some(mut gpu) = cuda_common::gpu("fp8 casts") else { return };
    for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
        let x = fp8_test_values(format);
        let n = x.len();
        let xd = gpu.upload(&x);
        for scale in [1.0f32, 0.25, 8.0, 448.0 / 3.7, 1.0 / 57.3, 2f32.powi(-20)] {
            let how = OperandCast::Fp8Tensor {
                format,
                scale: ScaleSource::Given { scale, amax_used: 1.0 },
            };
            let (bytes, rep) = gpu.cast_for_test(&xd, 1, n, false, how, OperandFault::NONE, StatsLevel::Full).expect("cast");
            let want: Vec<u8> = x.iter().map(|&v| fp8::cast(format, v, scale)).collect();
            let bad: Vec<String> = (0..n)
                .filter(|&i| bytes[i] != want[i])
                .take(5)
                .map(|i| format!("x={:e} gpu={:#04x} cpu={:#04x}", x[i], bytes[i], want[i]))
                .collect();
            let mism = (0..n).filter(|&i| bytes[i] != want[i]).count();
            println!("{} scale {scale:e}: {n} values, {mism} byte mismatches {bad:?}", format.name());
            assert_eq!(mism, 0, "{}: GPU and CPU FP8 bytes differ", format.name());
            let cpu = cast_operand(&x, 1, n, how, OperandFault::NONE, StatsLevel::Full, false).report;
            assert_eq!(
                (rep.amax.to_bits(), rep.underflow, rep.saturated, rep.nan, rep.inf, rep.zeros),
                (cpu.amax.to_bits(), cpu.underflow, cpu.saturated, cpu.nan, cpu.inf, cpu.zeros),
                "{}: cast counts",
                format.name()
            );
            assert_eq!(rep.scale, cpu.scale);
            let (gm, cm) = (rep.moments.expect("moments"), cpu.moments.expect("moments"));
            assert_eq!((gm.min, gm.max), (cm.min, cm.max));
            assert!(
                (gm.mean - cm.mean).abs() <= 1e-9 * cm.mean.abs().max(1e-30) + 1e-300,
                "mean {} vs {}",
                gm.mean,
                cm.mean
            );
            let (gq, cq) = (rep.quant_error.expect("qe"), cpu.quant_error.expect("qe"));
            assert!(
                (gq.0 - cq.0).abs() <= 1e-6 * cq.0.abs() + 1e-300 && (gq.1 - cq.1).abs() <= 1e-9,
                "quant error {gq:?} vs {cq:?}"
            );
        }
        // Current scaling: the scale is computed on the device from the amax.
        let finite: Vec<f32> = x.iter().copied().filter(|v| v.is_finite() && v.abs() < 1e4).collect();
        let fd = gpu.upload(&finite);
        let how = OperandCast::Fp8Tensor {
            format,
            scale: ScaleSource::Current { margin: 1 },
        };
        let (bytes, rep) = gpu
            .cast_for_test(&fd, 1, finite.len(), false, how, OperandFault::NONE, StatsLevel::Amax)
            .expect("cast");
        let cpu = cast_operand(&finite, 1, finite.len(), how, OperandFault::NONE, StatsLevel::Amax, true).report;
        assert_eq!(rep.scale.to_bits(), cpu.scale.to_bits(), "current scale");
        assert_eq!(Some(bytes), cpu.quantized, "{}: current-scaled bytes", format.name());
    }
    // Planted faults and the non-saturating mode: a mis-scale (cast with scale × 16, dequantised
    // with the true scale), outliers, and overflow to NaN / Inf instead of saturation.
    for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
        let mut rng = Pcg64::seed_from_u64(5);
        let x: Vec<f32> = (0..64 * 96).map(|_| rng.random_range(-4.0..4.0)).collect();
        let xd = gpu.upload(&x);
        let fault = OperandFault { scale_mult: 16.0, outlier_factor: 1e4, overflow_nan: true };
        for how in [
            OperandCast::Fp8Tensor { format, scale: ScaleSource::Given { scale: format.max() / 8.0, amax_used: 4.0 } },
            OperandCast::Fp8Tensor { format, scale: ScaleSource::Current { margin: 0 } },
        ] {
            let (bytes, rep) = gpu.cast_for_test(&xd, 64, 96, false, how, fault, StatsLevel::Full).expect("cast");
            let cpu = cast_operand(&x, 64, 96, how, fault, StatsLevel::Full, true).report;
            assert_eq!(Some(bytes), cpu.quantized, "{}: faulted bytes", format.name());
            assert_eq!((rep.scale.to_bits(), rep.amax.to_bits(), rep.underflow, rep.saturated, rep.nan, rep.inf), (cpu.scale.to_bits(), cpu.amax.to_bits(), cpu.underflow, cpu.saturated, cpu.nan, cpu.inf), "{}: faulted counts", format.name());
            let (gq, cq) = (rep.quant_error.expect("qe"), cpu.quant_error.expect("qe"));
            assert!((gq.0 - cq.0).abs() <= 1e-6 * cq.0.abs() && (gq.1 - cq.1).abs() <= 1e-9, "faulted quant error {gq:?} vs {cq:?}");
            same_channels(&rep, &cpu, "faulted cast (planted outliers)");
        }
    }
    // Transposed casts (dgrad / wgrad operands) hold the same bytes, transposed.
    let (rows, cols) = (96, 160);
    let mut rng = Pcg64::seed_from_u64(3);
    let x: Vec<f32> = (0..rows * cols).map(|_| rng.random_range(-3.0..3.0)).collect();
    let xd = gpu.upload(&x);
    let how = OperandCast::Fp8Tensor {
        format: Fp8Format::E5M2,
        scale: ScaleSource::Given { scale: 100.0, amax_used: 3.0 },
    };
    let (t, _) = gpu
        .cast_for_test(&xd, rows, cols, true, how, OperandFault::NONE, StatsLevel::Amax)
        .expect("cast");
    for r in 0..rows {
        for c in 0..cols {
            assert_eq!(t[c * rows + r], fp8::cast(Fp8Format::E5M2, x[r * cols + c], 100.0));
        }
    }
    // BF16 operands: the bits of round-to-nearest-even.
    let (b, _) = gpu
        .cast_for_test(&xd, rows, cols, false, OperandCast::Bf16, OperandFault::NONE, StatsLevel::Amax)
        .expect("cast");
    for (i, &v) in x.iter().enumerate() {
        assert_eq!(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]), half::bf16::from_f32(v).to_bits());
    }
}

/// The tiled casts (transposed, the dual cast's kernel) take rows of 4 plain values (finite, not
/// zero, not underflowing, not past the format's max) four at a time, and leave every other row of
/// 4 to the element-wise cast. Every kind of value, shuffled so that the rare ones fall into rows
/// of common ones, in a tensor of several tiles with partial tiles at both edges: the bytes and
/// the counts equal the CPU's at each level, with and without overflow to NaN / Inf, and the
/// moments (from the cheap level on) and channels (at their level only) agree.
#[test]
fn tiled_fp8_casts_match_the_cpu_for_every_kind_of_value() {
    let Some(mut gpu) = cuda_common::gpu("tiled fp8 casts") else { return };
    for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
        let mut x = fp8_test_values(format);
        x.shuffle(&mut Pcg64::seed_from_u64(11));
        let cols = 100;
        let rows = x.len() / cols;
        x.truncate(rows * cols);
        assert!(rows > 3 * 64 && rows % 64 != 0, "several row tiles, the last one partial");
        let finite: Vec<f64> = x.iter().filter(|v| v.is_finite()).map(|&v| v.abs() as f64).collect();
        let mean_abs = finite.iter().sum::<f64>() / finite.len() as f64;
        let xd = gpu.upload(&x);
        for scale in [1.0f32, format.max() / 3.7, 2f32.powi(-20)] {
            for overflow_nan in [false, true] {
                for level in [StatsLevel::Amax, StatsLevel::Cheap, StatsLevel::Channels] {
                    let how = OperandCast::Fp8Tensor { format, scale: ScaleSource::Given { scale, amax_used: 1.0 } };
                    let fault = OperandFault { overflow_nan, ..OperandFault::NONE };
                    let what = format!("{} scale {scale:e} overflow_nan {overflow_nan} {level:?}", format.name());
                    let (t, rep) = gpu.cast_for_test(&xd, rows, cols, true, how, fault, level).expect("cast");
                    let cpu = cast_operand(&x, rows, cols, how, fault, level, true).report;
                    let want = cpu.quantized.as_ref().expect("CPU bytes");
                    let bad = (0..rows * cols).filter(|&i| t[(i % cols) * rows + i / cols] != want[i]).count();
                    assert_eq!(bad, 0, "{what}: transposed bytes differ from the CPU's");
                    assert_eq!(
                        (rep.amax.to_bits(), rep.underflow, rep.saturated, rep.nan, rep.inf, rep.zeros),
                        (cpu.amax.to_bits(), cpu.underflow, cpu.saturated, cpu.nan, cpu.inf, cpu.zeros),
                        "{what}: counts"
                    );
                    if level >= StatsLevel::Cheap {
                        same_moments(&rep, &cpu, mean_abs, &what);
                    }
                    if level == StatsLevel::Channels {
                        same_channels(&rep, &cpu, &what);
                    } else {
                        assert_eq!(rep.channels, None, "{what}: no channel statistics below their level");
                    }
                    println!("{what}: {rows} × {cols}, saturated {}, underflow {}, NaN {}, Inf {}, zeros {}", rep.saturated, rep.underflow, rep.nan, rep.inf, rep.zeros);
                }
            }
        }
    }
}

/// The channel statistics of a GPU cast report against the CPU's: the amax channel exactly, the
/// share to 1e-12 (f64 sums of the same squares in different orders).
fn same_channels(gpu: &fp8_capture::backend::CastReport, cpu: &fp8_capture::backend::CastReport, what: &str) {
    let (g, c) = (gpu.channels.expect("GPU channel statistics"), cpu.channels.expect("CPU channel statistics"));
    assert_eq!(g.amax_channel, c.amax_channel, "{what}: amax channel");
    match (g.top_channel_sq_frac, c.top_channel_sq_frac) {
        (Some(a), Some(b)) => assert!((a - b).abs() <= 1e-12 * b, "{what}: top channels' share {a} vs {b}"),
        (a, b) => assert_eq!(a, b, "{what}: top channels' share"),
    }
}

/// The moments of a GPU cast report against the CPU's: min / max exactly; the mean to 1e-9 of the
/// mean |x| over finite values (`mean_abs`) and the standard deviation to 1e-9 relative (f64 sums
/// in different orders: the tiled casts sum per thread and tile, then over blocks).
fn same_moments(gpu: &fp8_capture::backend::CastReport, cpu: &fp8_capture::backend::CastReport, mean_abs: f64, what: &str) {
    let (g, c) = (gpu.moments.expect("GPU moments"), cpu.moments.expect("CPU moments"));
    assert_eq!((g.min, g.max), (c.min, c.max), "{what}: min / max");
    assert!((g.mean - c.mean).abs() <= 1e-9 * mean_abs, "{what}: mean {} vs {}", g.mean, c.mean);
    assert!((g.std - c.std).abs() <= 1e-9 * c.std, "{what}: std {} vs {}", g.std, c.std);
}

#[test]
fn channel_statistics_match_the_cpu_reference() {
    let Some(mut gpu) = cuda_common::gpu("channel statistics") else { return };
    // An activation-like tensor (2048 tokens × 1024 features) with an outlier channel, a second
    // channel holding a value of the same magnitude further right (a tie: the lower channel wins),
    // and NaN / Inf, which are skipped.
    let (rows, cols) = (2048, 1024);
    let mut rng = Pcg64::seed_from_u64(17);
    let normal = Normal::new(0.0f32, 1.0).expect("normal");
    let mut x: Vec<f32> = (0..rows * cols).map(|_| normal.sample(&mut rng)).collect();
    for r in 0..rows {
        x[r * cols + 733] *= 30.0;
    }
    let peak = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    x[1000 * cols + 901] = -peak;
    let finite: Vec<f64> = x.iter().filter(|v| v.is_finite()).map(|&v| v.abs() as f64).collect();
    let mean_abs = finite.iter().sum::<f64>() / finite.len() as f64;
    x[5 * cols + 2] = f32::NAN;
    x[6 * cols + 3] = f32::INFINITY;
    let xd = gpu.upload(&x);
    let e4 = OperandCast::Fp8Tensor { format: Fp8Format::E4M3, scale: ScaleSource::Given { scale: 448.0 / peak, amax_used: peak } };
    let cur = OperandCast::Fp8Tensor { format: Fp8Format::E5M2, scale: ScaleSource::Current { margin: 0 } };
    for (how, transpose, level) in [
        (OperandCast::Bf16, false, StatsLevel::Channels),
        (e4, false, StatsLevel::Channels),
        (e4, true, StatsLevel::Full),
        (cur, true, StatsLevel::Channels),
    ] {
        let (_, rep) = gpu.cast_for_test(&xd, rows, cols, transpose, how, OperandFault::NONE, level).expect("cast");
        let cpu = cast_operand(&x, rows, cols, how, OperandFault::NONE, level, false).report;
        let what = format!("{how:?} transposed {transpose} {level:?}");
        same_channels(&rep, &cpu, &what);
        same_moments(&rep, &cpu, mean_abs, &what);
        let c = rep.channels.expect("channels");
        assert_eq!(c.amax_channel, Some(733), "{what}: the outlier channel holds the amax, before its tie at 901");
        let share = c.top_channel_sq_frac.expect("share");
        println!("{what}: amax channel {:?}, top 10 of 1024 channels hold {:.4} of Σx²", c.amax_channel, share);
        // 900 / (900 + 1023) of Σx² in channel 733, give or take the noise; K = 10.
        assert!(share > 0.45 && share < 0.5, "{what}: share {share}");
    }
    // The tiled cast over other grids (16 column tiles, 32 row tiles): with 1, 7 or 100 blocks
    // each tile's channel partials leave on their own; with a multiple of 16 each block strides
    // down one column tile and sums its tiles' partials before they leave (16: 32 tiles a block,
    // 48: 10 or 11, 384: 1 or 2, 512: one).
    let cpu = cast_operand(&x, rows, cols, e4, OperandFault::NONE, StatsLevel::Channels, false).report;
    for grid in [1, 7, 16, 48, 100, 384, 512] {
        gpu.set_cast_grid(grid);
        let (_, rep) = gpu.cast_for_test(&xd, rows, cols, true, e4, OperandFault::NONE, StatsLevel::Channels).expect("cast");
        let what = format!("transposed over {grid} blocks");
        same_channels(&rep, &cpu, &what);
        same_moments(&rep, &cpu, mean_abs, &what);
        // The cheap level: the same kernel with its channel partials left out, Σx² per value.
        let (_, rep) = gpu.cast_for_test(&xd, rows, cols, true, e4, OperandFault::NONE, StatsLevel::Cheap).expect("cast");
        same_moments(&rep, &cpu, mean_abs, &format!("{what}, cheap level"));
        assert_eq!(rep.channels, None, "{what}, cheap level: no channel statistics");
    }
    gpu.set_cast_grid(0);
    // At the amax level nothing is measured; one row of many channels and many rows of one.
    let (_, rep) = gpu.cast_for_test(&xd, rows, cols, false, e4, OperandFault::NONE, StatsLevel::Amax).expect("cast");
    assert_eq!(rep.channels, None);
    for (r, c) in [(1, rows * cols), (rows * cols, 1), (3, 5)] {
        let n = r * c;
        let (_, rep) = gpu.cast_for_test(&xd, r, c, false, OperandCast::Bf16, OperandFault::NONE, StatsLevel::Channels).expect("cast");
        let cpu = cast_operand(&x[..n], r, c, OperandCast::Bf16, OperandFault::NONE, StatsLevel::Channels, false).report;
        same_channels(&rep, &cpu, &format!("{r} × {c}"));
    }
}

#[test]
fn channel_statistics_of_a_step_are_reduced_together_as_the_records_grow() {
    let Some(mut gpu) = cuda_common::gpu("batched channel statistics") else { return };
    // Three casts queued before one download hold 36,000 channels: the step's record columns
    // (16,384 to start with) grow while their reductions wait for the batch.
    let (rows, cols) = (64, 12_000);
    let mut rng = Pcg64::seed_from_u64(23);
    let normal = Normal::new(0.0f32, 1.0).expect("normal");
    let xs: Vec<Vec<f32>> = (0..3)
        .map(|i| {
            let mut x: Vec<f32> = (0..rows * cols).map(|_| normal.sample(&mut rng)).collect();
            for r in 0..rows {
                x[r * cols + 1000 * (i + 1)] *= 20.0;
            }
            x
        })
        .collect();
    let bufs: Vec<_> = xs.iter().map(|x| gpu.upload(x)).collect();
    let shapes: Vec<_> = bufs.iter().map(|b| (&**b, rows, cols)).collect();
    let e4 = OperandCast::Fp8Tensor { format: Fp8Format::E4M3, scale: ScaleSource::Given { scale: 4.0, amax_used: 100.0 } };
    // Straight (a channel pass of its own) and transposed (the tiled kernel's partials); the
    // records taken after the step, copied to the host after its last cast (`gemms_done`), and
    // copied after its second cast (the third cast's columns then come after the copy).
    for transpose in [false, true] {
        for prefetch in [None, Some(3), Some(2)] {
            let reps = gpu.casts_for_test(&shapes, transpose, e4, StatsLevel::Channels, prefetch).expect("casts");
            assert_eq!(reps.len(), 3);
            for (i, (rep, x)) in reps.iter().zip(&xs).enumerate() {
                let cpu = cast_operand(x, rows, cols, e4, OperandFault::NONE, StatsLevel::Channels, false).report;
                same_channels(rep, &cpu, &format!("cast {i} of 3, transposed {transpose}, prefetched after {prefetch:?} casts"));
                assert_eq!(rep.channels.expect("channels").amax_channel, Some(1000 * (i as u32 + 1)), "cast {i}: its outlier channel");
            }
        }
    }
}

/// (output name prefix, bound on ‖gpu − cpu‖ / ‖cpu‖, why).
const TOLERANCES: &[(&str, f64, &str)] = &[
    ("embedding_fwd", 0.0, "a copy: exact"),
    ("embedding_bwd", 0.0, "the same f32 additions in position order on both: exact"),
    ("residual", 0.0, "one f32 add: exact"),
    ("add_inplace", 0.0, "one f32 add: exact"),
    ("round_bf16", 0.0, "round to nearest even on both: exact"),
    ("gelu", 1e-6, "the same sigmoid form on both; expf of CUDA's libm vs Rust's exp differ by an ulp"),
    ("layernorm_fwd", 1e-5, "f32 mean/variance, warp-tree vs sequential summation order"),
    ("layernorm_bwd", 1e-5, "f32 row and column sums in different orders"),
    ("rmsnorm_fwd", 1e-5, "f32 mean square, warp-tree vs sequential summation order (and FMA contraction on the GPU)"),
    ("rmsnorm_bwd", 1e-5, "f32 row and column sums in different orders"),
    ("swiglu", 1e-6, "the same sigmoid form on both; expf of CUDA's libm vs Rust's exp differ by an ulp, and the GPU may contract σ + g·σ·(1−σ) into an FMA"),
    ("rope", 0.0, "the CPU's own cos/sin table, uploaded, and the same f32 products and sums without FMA contraction (__fmul_rn, __fadd_rn): exact"),
    ("crossentropy", 1e-6, "f64 sum of f32 exps in tree vs sequential order; expf ulps"),
    ("adamw", 1e-7, "the same f32 operation sequence with host-computed bias corrections; only FMA contraction by the CUDA compiler can differ"),
    ("sumsq", 1e-12, "f64 sums of f32 squares in different orders"),
    ("channel_share", 1e-7, "f64 per-channel sums of squares in different orders (rows chunked differently), within 1e-15, then kept here as f32: at most an f32 rounding apart"),
    ("attention_gqa", 2e-2, "as attention (BF16 operands on the GPU, f32 on the CPU); a kv head's dk and dv sum over its query heads inside the GPU's GEMM, in head-then-query order on the CPU"),
    ("attention", 2e-2, "the GPU's products take BF16 operands (q, k, v, dout, the probabilities and the score gradients rounded: 2^-9 relative each), the CPU's f32; the fused kernels normalise the probabilities after their product with v, the CPU before; both round the outputs to BF16"),
    (
        "matmul_bf16",
        1e-2,
        "BF16 operands and outputs; accumulation order differs, so outputs near a BF16 rounding boundary flip by one BF16 ulp (2^-8)",
    ),
    (
        "gemm",
        1e-2,
        "identical FP8/BF16 operand bytes; FP32 accumulation order and the dequantisation (cuBLASLt multiplies by 1/scale after the sum, the CPU divides each operand) differ, then BF16 rounding of the output",
    ),
];

fn tolerance(name: &str) -> (f64, &'static str) {
    TOLERANCES
        .iter()
        .find(|(p, _, _)| name.starts_with(p))
        .map(|(_, b, r)| (*b, *r))
        .unwrap_or((0.0, "no bound given: must be exact"))
}

/// The head-size-64 attention case: C, T and kv heads (4 query heads of 64).
const HS64_C: usize = 256;
const HS64_T: usize = 200;
const HS64_KVH: usize = 2;
fn hs64_width() -> usize {
    HS64_C + 2 * HS64_KVH * 64
}

struct Inputs {
    v: usize,
    c: usize,
    f: usize,
    nh: usize,
    /// The kv heads of the grouped-query layouts (RoPE and attention_gqa{KVH}); NH = 4 of them
    /// share 1 (multi-query) in the other attention_gqa case.
    kvh: usize,
    b: usize,
    t: usize,
    tokens: Vec<u32>,
    targets: Vec<u32>,
    mats: std::collections::HashMap<&'static str, Vec<f32>>,
}

fn inputs() -> Inputs {
    let (v, c, f, nh, b, t) = (512, 128, 256, 4, 2, 64);
    let n = b * t;
    let mut rng = Pcg64::seed_from_u64(11);
    let normal = Normal::new(0.0f32, 1.0).expect("normal");
    let mut draw = |len: usize, s: f32| -> Vec<f32> { (0..len).map(|_| normal.sample(&mut rng) * s).collect() };
    let mut mats = std::collections::HashMap::new();
    for (name, len, s) in [
        ("wte", v * c, 0.5),
        ("dwte0", v * c, 0.1),
        ("x", n * c, 1.0),
        ("dout_c", n * c, 0.1),
        ("ln_w", c, 1.0),
        ("ln_b", c, 0.1),
        ("dinp0", n * c, 0.1),
        ("dw0", c, 0.1),
        ("db0", c, 0.1),
        ("qkv", n * 3 * c, 1.0),
        ("h", n * f, 1.5),
        ("dout_f", n * f, 0.1),
        ("logits", n * v, 2.0),
        ("head_w", v * c, 0.05),
        ("dlogits", n * v, 0.01),
        ("p", 4099, 1.0),
        ("g", 4099, 0.1),
        ("m", 4099, 0.01),
        ("vv", 4099, 0.01),
        ("w_fc1", f * c, 0.05),
        ("bias_f", f, 0.1),
        ("dy_f", n * f, 0.01),
        // The Llama family's inputs, drawn after the others so those stay as they were.
        ("rms_w", c, 1.0),
        ("gate_up", n * 2 * f, 1.5),
        ("qkv_gqa2", n * (c + 2 * 2 * (c / nh)), 1.0),
        ("dqkv_gqa2", n * (c + 2 * 2 * (c / nh)), 0.1),
        ("qkv_gqa1", n * (c + 2 * (c / nh)), 1.0),
        // Head size 64 over T = 200 (the fused attention's other tiles), drawn last.
        ("qkv_hs64", b * HS64_T * hs64_width(), 1.0),
        ("dout_hs64", b * HS64_T * HS64_C, 0.1),
        // SwiGLU with F = 37 (not a multiple of the kernels' 4-wide loads), drawn last.
        ("gate_up_f37", n * 2 * 37, 1.5),
        ("dout_f37", n * 37, 0.1),
    ] {
        mats.insert(name, draw(len, s));
    }
    mats.get_mut("vv").map(|x| x.iter_mut().for_each(|e| *e = e.abs()));
    let mut r2 = Pcg64::seed_from_u64(12);
    let tokens = (0..n).map(|_| r2.random_range(0..v as u32)).collect();
    let targets = (0..n).map(|_| r2.random_range(0..v as u32)).collect();
    Inputs {
        v,
        c,
        f,
        nh,
        kvh: 2,
        b,
        t,
        tokens,
        targets,
        mats,
    }
}

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
    let hyp = AdamW {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
        t: 7,
        grad_scale: 0.5,
    };
    be.adamw(&mut p, &gg, &mut am, &mut av, &hyp);
    get(be, "adamw.p", &p);
    get(be, "adamw.m", &am);
    get(be, "adamw.v", &av);
    // The linear-layer GEMMs of fc1 (k = C, m = F) under each cast.
    let dims = LinearDims { n, k: c, m: f };
    let (w, bias, dy) = (be.upload(m("w_fc1")), be.upload(m("bias_f")), be.upload(m("dy_f")));
    let e4 = |scale: f32| OperandCast::Fp8Tensor {
        format: Fp8Format::E4M3,
        scale: ScaleSource::Given { scale, amax_used: 0.0 },
    };
    let e5 = |scale: f32| OperandCast::Fp8Tensor {
        format: Fp8Format::E5M2,
        scale: ScaleSource::Given { scale, amax_used: 0.0 },
    };
    let cur = OperandCast::Fp8Tensor {
        format: Fp8Format::E4M3,
        scale: ScaleSource::Current { margin: 0 },
    };
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
                id: GemmId {
                    layer: 0,
                    module: Module::Fc1,
                    gemm,
                },
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

/// The fprop, dgrad and wgrad of one linear site (fc1's shape, with a bias) in BF16, the reports
/// taken after the three (`back_to_back`, as the model runs a step: the wgrad then takes the casts
/// the fprop kept of X and the dgrad kept of dY — on the GPU BF16 values in the operands' own
/// layouts, which cuBLASLt reads transposed, and the bias gradient is summed down dY's columns) or
/// after each (every cast its own, in the TN layout). With `column_sums` the dgrad's call says
/// that the wgrad takes the bias gradient next (`GemmCall::a_column_sums`, as the model says it):
/// on the GPU, back to back, dY's cast then sums its columns as it casts them. Statistics at
/// `stats`. Returns the outputs, named `gemm.bf16_site.*`.
#[allow(clippy::too_many_arguments)]
fn bf16_site<B: Backend>(be: &mut B, x: &B::Buf, w: &B::Buf, bias: &B::Buf, dy: &B::Buf, db0: &[f32], dims: LinearDims, back_to_back: bool, column_sums: bool, stats: StatsLevel) -> Vec<(String, Vec<f32>)> {
    let (n, c, f) = (dims.n, dims.k, dims.m);
    let call = |gemm| GemmCall { stats, a_column_sums: column_sums && gemm == Gemm::Dgrad, ..GemmCall::bf16(GemmId { layer: 3, module: Module::Fc1, gemm }, dims) };
    let (mut y, mut dx, mut dw, mut db) = (be.zeros(n * f), be.zeros(n * c), be.zeros(f * c), be.upload(db0));
    let mut reports = 0;
    be.gemm(&call(Gemm::Fprop), &mut y, x, w, Some(bias), None);
    if !back_to_back {
        reports += be.take_reports().len();
    }
    be.gemm(&call(Gemm::Dgrad), &mut dx, dy, w, None, None);
    if !back_to_back {
        reports += be.take_reports().len();
    }
    be.gemm(&call(Gemm::Wgrad), &mut dw, dy, x, None, Some(&mut db));
    reports += be.take_reports().len();
    assert_eq!(reports, 3, "one report per GEMM");
    let mut out = Vec::new();
    for (name, buf) in [("fprop", &y), ("dgrad", &dx), ("wgrad", &dw), ("wgrad.dbias", &db)] {
        let len = be.len(buf);
        out.push((format!("gemm.bf16_site.{name}"), be.download(buf, 0, len, 1)));
    }
    out
}

fn rel_l2(got: &[f32], want: &[f32]) -> (f64, f64) {
    let (mut d2, mut r2, mut maxabs) = (0f64, 0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        let d = g as f64 - w as f64;
        d2 += d * d;
        r2 += (w as f64) * (w as f64);
        maxabs = maxabs.max(d.abs());
    }
    if got.iter().chain(want).any(|v| v.is_nan()) {
        return (f64::NAN, f64::NAN);
    }
    (if r2 == 0.0 { d2.sqrt() } else { (d2 / r2).sqrt() }, maxabs)
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
        println!(
            "{name:<34} {rel:>10.2e} {maxabs:>10.2e} {bound:>10.1e}  {}{reason}",
            if pass { "" } else { "FAIL: " }
        );
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
    for (label, cast, with_bias, nan) in [("bf16", OperandCast::Bf16, false, false), ("fp8", fp8, false, false), ("fp8+bias", fp8, true, false), ("bf16+nan", OperandCast::Bf16, false, true)] {
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
                assert_eq!(bits(gpu.download(a, 0, gpu.len(a), 1)), bits(gpu.download(b, 0, gpu.len(b), 1)), "{label}: matmul_bf16_bwd {what}, BF16 dout held against f32 dout cast");
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
        let (wn, stat) = (gpu.upload(&(0..m).map(|j| 0.5 + (j % 7) as f32 / 8.0).collect::<Vec<f32>>()), gpu.upload(&(0..n).map(|j| 0.25 + (j % 5) as f32 / 4.0).collect::<Vec<f32>>()));
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
                let mut out = named_bits(&mut gpu, &[("proj.fprop", &y), ("proj.wgrad", &dwp), ("proj.dbias", &dbp), ("qkv.dgrad", &dln), ("qkv.wgrad", &dwq), ("qkv.dbias", &dbq)]);
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
                    let call = GemmCall { cast_a: cast, cast_b: cast, stats: StatsLevel::Channels, ..GemmCall::bf16(GemmId { layer: 0, module: Module::Fc1, gemm }, dims) };
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
                        let what = format!("{case}, {label}, {gemm:?}{}, {} output", if with_bias { " + bias" } else { "" }, if out_bf16 { "BF16" } else { "f32" });
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
/// pair, and the backend says so (the activation comes back written).
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
                    assert!(close && label == "swiglu", "{label} {cast_name}: {name} differs between the unfused pair and the computed operand: {w:?} against {g:?}");
                    println!("{label} {cast_name}: {name} within f64 rounding ({w:?} against {g:?})");
                }
                checked += 1;
            }
            println!("{label} {cast_name}: {} outputs and reports bit-identical{}", want.len() + want_sums.len(), if computable { "" } else { " (the unfused pair both times)" });
        }
    }
    assert_eq!(checked, 13 * 12);
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
        ("current", OperandCast::Fp8Tensor { format: Fp8Format::E4M3, scale: ScaleSource::Current { margin: 0 } }, OperandCast::Fp8Tensor { format: Fp8Format::E5M2, scale: ScaleSource::Current { margin: 0 } }),
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

/// The cross-entropy with the row held in shared memory (`crossentropy_smem_fwd`, one read of the
/// logits) against the kernel that reads them three times (`crossentropy_fwd`): losses and dlogits
/// bit-identical, at a vocabulary of whole float4 rows, a ragged one and llama's 32000, with
/// ignored targets among the rows and logits of a wide range.
#[test]
fn the_cross_entropy_row_kernels_are_bit_identical() {
    let Some(mut gpu) = cuda_common::gpu("cross-entropy row kernels") else { return };
    let mut rng = Pcg64::seed_from_u64(47);
    let normal = Normal::new(0.0f32, 3.0).expect("normal");
    // Rows within the registers of the split kernel (up to 8192 logits), one logit past them, past
    // them with ragged tails, its longest (36,352), and too long for it (the shared-memory kernel's).
    for (n, v) in [(37usize, 1000usize), (29, 4001), (16, 8193), (16, 16_385), (16, 32000), (13, 36_352), (13, 44_544), (11, 50_003)] {
        let logits: Vec<f32> = (0..n * v).map(|_| normal.sample(&mut rng)).collect();
        let targets: Vec<u32> = (0..n).map(|i| if i % 5 == 3 { u32::MAX } else { rng.random_range(0..v as u32) }).collect();
        let tg = gpu.upload_tokens(&targets);
        let mut run = |shared: bool, split: bool| -> (Vec<u32>, Vec<u32>) {
            assert_eq!(gpu.set_loss_row_kernels(shared, split), (shared, split), "an H100 or H200 grants both row kernels their shared memory");
            let (mut losses, mut x) = (gpu.zeros(n), gpu.upload(&logits));
            gpu.crossentropy(&mut losses, &mut x, &tg, v, 0.25);
            assert_eq!(gpu.take_error(), None);
            (buffer_bits(&mut gpu, &losses), buffer_bits(&mut gpu, &x))
        };
        let want = run(false, false);
        for (name, shared, split) in [("in shared memory", true, false), ("split between registers and shared memory", false, true)] {
            let got = run(shared, split);
            assert!(want.0 == got.0, "V {v}: the losses of the row {name} differ from the rereading kernel's");
            assert!(want.1 == got.1, "V {v}: the dlogits of the row {name} differ from the rereading kernel's");
        }
        // Logits held in BF16 (as the lm_head writes them): the same losses as from their f32
        // values, and the dlogits rounded to BF16 (to nearest even), in every kernel.
        let as_bf16 = |x: f32| half::bf16::from_f32(x).to_f32();
        let logits16: Vec<f32> = logits.iter().map(|&x| as_bf16(x)).collect();
        let mut run16 = |shared: bool, split: bool, bf16: bool| -> (Vec<u32>, Vec<u32>) {
            gpu.set_loss_row_kernels(shared, split);
            let mut losses = gpu.zeros(n);
            let mut x = if bf16 { gpu.upload_bf16(&logits16).expect("upload_bf16") } else { gpu.upload(&logits16) };
            gpu.crossentropy(&mut losses, &mut x, &tg, v, 0.25);
            assert_eq!(gpu.take_error(), None);
            let d: Vec<u32> = gpu.download(&x, 0, n * v, 1).iter().map(|&g| if bf16 { g.to_bits() } else { as_bf16(g).to_bits() }).collect();
            (buffer_bits(&mut gpu, &losses), d)
        };
        let want16 = run16(false, false, false);
        for (shared, split) in [(false, false), (true, false), (false, true)] {
            let got = run16(shared, split, true);
            assert!(want16.0 == got.0, "V {v}: BF16 logits (shared {shared}, split {split}) give other losses than their f32 values");
            assert!(want16.1 == got.1, "V {v}: BF16 dlogits (shared {shared}, split {split}) are not the f32 dlogits rounded to BF16");
        }
        println!("V {v}: {n} losses and dlogits bit-identical across the three row kernels, f32 and BF16");
    }
    gpu.set_loss_row_kernels(true, true);
}

/// The step's multi-tensor launches give the bits of one launch a buffer: AdamW (`adamw_all`
/// against `adamw` per parameter, clipped and not, and within the CPU reference's tolerance), the
/// gradient norm (`sumsq_all` against one `sumsq_partial` launch a buffer, and the CPU's f64 sum),
/// and the zeroing (`fill_zero_all` clears every listed buffer and nothing else). Buffers of one
/// value, odd lengths, one past a block's share, one large enough for blocks that loop, and a BF16
/// gradient.
#[test]
fn multi_tensor_launches_give_the_bits_of_one_launch_a_buffer() {
    type Buf = fp8_capture::backend::cuda::DevBuf;
    let Some(mut gpu) = cuda_common::gpu("multi-tensor launches") else { return };
    let mut rng = Pcg64::seed_from_u64(53);
    let normal = Normal::new(0.0f32, 1.0).expect("normal");
    let mut draw = |len: usize, scale: f32| -> Vec<f32> { (0..len).map(|_| scale * normal.sample(&mut rng)).collect() };
    let sizes = [1usize, 3, 1000, 4097, 65_541, 5_000_003];
    let mut host: Vec<Vec<f32>> = sizes.iter().map(|&n| draw(n, 1.0)).collect();
    let mut grads: Vec<Buf> = host.iter().map(|g| gpu.upload(g)).collect();
    let g16 = bf16_buffer(&mut gpu, &draw(64 * 200, 1.0), 64, 200);
    host.push(gpu.download(&g16, 0, 64 * 200, 1));
    grads.push(g16);

    let one = gpu.sumsq_all(&grads);
    let per = gpu.sumsq_all_launch_a_buffer(&grads);
    assert_eq!(one.to_bits(), per.to_bits(), "sumsq_all: {one} in one launch, {per} in one a buffer");
    let cpu: f64 = host.iter().flatten().map(|&x| f64::from(x) * f64::from(x)).sum();
    assert!((one - cpu).abs() <= 1e-12 * cpu, "sumsq_all {one} against the CPU's {cpu}");

    for grad_scale in [1.0f32, 0.37] {
        let h = AdamW { lr: 3e-4, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, t: 5, grad_scale };
        let start: Vec<[Vec<f32>; 3]> = host.iter().map(|g| [draw(g.len(), 1.0), draw(g.len(), 0.1), draw(g.len(), 0.1).iter().map(|x| x * x).collect()]).collect();
        let upload = |gpu: &mut fp8_capture::backend::cuda::CudaBackend, k: usize| -> Vec<Buf> { start.iter().map(|s| gpu.upload(&s[k])).collect() };
        let (mut p1, mut m1, mut v1) = (upload(&mut gpu, 0), upload(&mut gpu, 1), upload(&mut gpu, 2));
        let (mut p2, mut m2, mut v2) = (upload(&mut gpu, 0), upload(&mut gpu, 1), upload(&mut gpu, 2));
        gpu.adamw_all(&mut p1, &grads, &mut m1, &mut v1, &h);
        for i in 0..grads.len() {
            gpu.adamw(&mut p2[i], &grads[i], &mut m2[i], &mut v2[i], &h);
        }
        assert_eq!(gpu.take_error(), None);
        let mut cpu = CpuBackend::new();
        for i in 0..grads.len() {
            for (what, a, b) in [("p", &p1[i], &p2[i]), ("m", &m1[i], &m2[i]), ("v", &v1[i], &v2[i])] {
                assert!(buffer_bits(&mut gpu, a) == buffer_bits(&mut gpu, b), "adamw_all: {what} of parameter {i} ({} values, grad_scale {grad_scale}) differs from adamw's", host[i].len());
            }
            let [mut p, mut m, mut v] = start[i].clone();
            cpu.adamw(&mut p, &host[i], &mut m, &mut v, &h);
            let got = gpu.download(&p1[i], 0, p.len(), 1);
            let (rel, _) = rel_l2(&got, &p);
            assert!(rel <= 1e-6, "adamw_all: parameter {i} at {rel:e} (relative L2) from the CPU reference");
        }
    }

    let mut zs: Vec<Buf> = sizes.iter().map(|&n| gpu.upload(&vec![1.5f32; n])).collect();
    zs.push(bf16_buffer(&mut gpu, &vec![1.5f32; 64 * 200], 64, 200));
    let untouched = gpu.upload(&vec![2.5f32; 1000]);
    {
        let mut refs: Vec<&mut Buf> = zs.iter_mut().collect();
        gpu.fill_zero_all(&mut refs);
    }
    assert_eq!(gpu.take_error(), None);
    for (i, z) in zs.iter().enumerate() {
        assert!(buffer_bits(&mut gpu, z).iter().all(|&b| b == 0), "fill_zero_all left buffer {i} ({} values) not all zero", gpu.len(z));
    }
    assert!(gpu.download(&untouched, 0, 1000, 1).iter().all(|&x| x == 2.5), "fill_zero_all wrote into a buffer it was not given");
    println!("{} buffers: sumsq_all, adamw_all (2 gradient scales) and fill_zero_all as one launch a buffer", grads.len());
}

/// The weights' FP8 casts of a step in one launch (`Backend::cast_weights`, the CUDA backend's
/// `weight_casts.rs`) against each weight cast at its fprop: 70 weights of assorted shapes (more
/// than one batch of statistics or channel reductions holds, so the launch is split), at every
/// statistics level. Every fprop's and dgrad's output (the dgrad reads the kept Wᵀ) and every
/// report (codes' counts, scales, moments, channels, quantisation error) are bit-identical. The
/// weights of another kind (BF16, current scaling) and one whose scale changed after
/// `cast_weights` are cast at their GEMM, as the count of taken casts shows.
#[test]
fn weights_cast_in_one_launch_give_the_bits_of_casting_each_at_its_gemm() {
    type Buf = fp8_capture::backend::cuda::DevBuf;
    let Some(mut gpu) = cuda_common::gpu("weights cast in one launch") else { return };
    let mut rng = Pcg64::seed_from_u64(71);
    let normal = Normal::new(0.0f32, 1.0).expect("normal");
    let n = 96;
    // (m, k) of W; rows and columns that are not whole 64 × 64 tiles among them.
    let shapes: Vec<(usize, usize)> = (0..70).map(|i| [(64, 64), (96, 128), (224, 64), (160, 256), (64, 96)][i % 5]).collect();
    let mut draw = |len: usize, scale: f32| -> Vec<f32> { (0..len).map(|_| scale * normal.sample(&mut rng)).collect() };
    let bufs: Vec<[Buf; 3]> = shapes.iter().enumerate().map(|(i, &(m, k))| [gpu.upload(&draw(m * k, 0.05 * (1 + i % 4) as f32)), gpu.upload(&draw(n * k, 1.0)), gpu.upload(&draw(n * m, 1e-3))]).collect();
    let given = |scale: f32| OperandCast::Fp8Tensor { format: Fp8Format::E4M3, scale: ScaleSource::Given { scale, amax_used: 448.0 / scale } };
    let grad = OperandCast::Fp8Tensor { format: Fp8Format::E5M2, scale: ScaleSource::Given { scale: 4096.0, amax_used: 14.0 } };
    // Weight i's cast: BF16 and current scaling for some (cast at their GEMM), a given scale else.
    let weight_cast = |i: usize| match i % 10 {
        3 => OperandCast::Bf16,
        7 => OperandCast::Fp8Tensor { format: Fp8Format::E4M3, scale: ScaleSource::Current { margin: 0 } },
        _ => given([64.0, 512.0, 2048.0][i % 3]),
    };
    let changed = 11; // its fprop casts with another scale than cast_weights was told
    let taken_each_step = (0..70).filter(|&i| !matches!(i % 10, 3 | 7) && i != changed).count() as u64;
    for level in [StatsLevel::Amax, StatsLevel::Cheap, StatsLevel::Channels, StatsLevel::Full] {
        let mut runs = Vec::new();
        for batched in [true, false] {
            gpu.set_weight_casts_batched(batched);
            let taken = gpu.weight_casts_taken();
            let call = |i: usize, gemm: Gemm, cast_b: OperandCast| {
                let (m, k) = shapes[i];
                let id = GemmId { layer: (i / 4) as u32, module: Module::ALL[i % 4], gemm };
                // A BF16 weight's GEMMs are BF16 on both sides, as the model issues them.
                let cast_a = match cast_b {
                    OperandCast::Bf16 => OperandCast::Bf16,
                    _ if gemm == Gemm::Fprop => given(16.0),
                    _ => grad,
                };
                GemmCall { cast_a, cast_b, stats: level, ..GemmCall::bf16(id, LinearDims { n, k, m }) }
            };
            let told: Vec<(GemmCall, &Buf)> = (0..70).map(|i| (call(i, Gemm::Fprop, if i == changed { given(1.0) } else { weight_cast(i) }), &bufs[i][0])).collect();
            gpu.cast_weights(&told);
            let mut outs = Vec::new();
            for (i, &(m, k)) in shapes.iter().enumerate() {
                let [w, x, dy] = &bufs[i];
                let (mut y, mut dx) = (gpu.zeros(n * m), gpu.zeros(n * k));
                gpu.gemm(&call(i, Gemm::Fprop, weight_cast(i)), &mut y, x, w, None, None);
                gpu.gemm(&call(i, Gemm::Dgrad, weight_cast(i)), &mut dx, dy, w, None, None);
                outs.push((buffer_bits(&mut gpu, &y), buffer_bits(&mut gpu, &dx)));
            }
            gpu.gemms_done();
            let reports = gpu.take_reports();
            assert_eq!(gpu.take_error(), None, "{level:?}, batched {batched}");
            assert_eq!(reports.len(), 140, "{level:?}, batched {batched}");
            let want_taken = if batched { taken_each_step } else { 0 };
            assert_eq!(gpu.weight_casts_taken() - taken, want_taken, "{level:?}, batched {batched}: fprops that took their weight's cast from the launch");
            runs.push((outs, reports));
        }
        let ((outs, reports), (want_outs, want_reports)) = (&runs[0], &runs[1]);
        for i in 0..70 {
            assert!(outs[i].0 == want_outs[i].0, "{level:?}: weight {i} {:?}: the fprop's output differs with the weights cast in one launch", shapes[i]);
            assert!(outs[i].1 == want_outs[i].1, "{level:?}: weight {i} {:?}: the dgrad's output (from the kept Wᵀ) differs", shapes[i]);
        }
        for (r, want) in reports.iter().zip(want_reports) {
            assert_eq!(format!("{r:?}"), format!("{want:?}"), "{level:?}: the report of {:?}", want.id);
        }
    }
    gpu.set_weight_casts_batched(true);
    println!("70 weights ({taken_each_step} cast in one launch), 4 statistics levels: outputs and reports bit-identical to one cast a weight at its GEMM");
}

/// The bits of every value of a GPU buffer.
fn buffer_bits(gpu: &mut fp8_capture::backend::cuda::CudaBackend, b: &fp8_capture::backend::cuda::DevBuf) -> Vec<u32> {
    let len = gpu.len(b);
    gpu.download(b, 0, len, 1).iter().map(|v| v.to_bits()).collect()
}

/// Each named buffer's bits, printed (compared as strings beside the reports).
fn named_bits(gpu: &mut fp8_capture::backend::cuda::CudaBackend, bufs: &[(&str, &fp8_capture::backend::cuda::DevBuf)]) -> Vec<(String, String)> {
    bufs.iter().map(|(name, b)| (name.to_string(), format!("{:?}", buffer_bits(gpu, b)))).collect()
}

/// A report without its f64 sums (moments' mean and std, channels' share of Σx²): compared bit for
/// bit.
fn without_sums(r: &GemmReport) -> GemmReport {
    let mut r = r.clone();
    for c in [&mut r.a, &mut r.b] {
        if let Some(m) = c.moments.as_mut() {
            (m.mean, m.std) = (0.0, 0.0);
        }
        if let Some(ch) = c.channels.as_mut() {
            ch.top_channel_sq_frac = None;
        }
    }
    r
}

/// A report's f64 sums, operand a's then b's: mean, std and the top channels' share of Σx².
fn report_sums(r: &GemmReport) -> Vec<f64> {
    let mut v = Vec::new();
    for c in [&r.a, &r.b] {
        let m = c.moments.as_ref().map(|m| (m.mean, m.std)).unwrap_or((0.0, 0.0));
        v.extend([m.0, m.1, c.channels.as_ref().and_then(|ch| ch.top_channel_sq_frac).unwrap_or(0.0)]);
    }
    v
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

/// A 16-bit buffer (`zeros_bf16`) holding `values` (rows × cols) rounded to BF16, written as GEMM
/// outputs are: by a BF16 GEMM with the identity (every product exact, one term per sum).
fn bf16_buffer(gpu: &mut fp8_capture::backend::cuda::CudaBackend, values: &[f32], rows: usize, cols: usize) -> fp8_capture::backend::cuda::DevBuf {
    let x = gpu.upload(values);
    let eye: Vec<f32> = (0..cols * cols).map(|i| if i / cols == i % cols { 1.0 } else { 0.0 }).collect();
    let w = gpu.upload(&eye);
    let mut out = gpu.zeros_bf16(rows * cols);
    let call = GemmCall::bf16(GemmId { layer: 9, module: Module::Qkv, gemm: Gemm::Fprop }, LinearDims { n: rows, k: cols, m: cols });
    gpu.gemm(&call, &mut out, &x, &w, None, None);
    gpu.take_reports();
    assert!(out.is_bf16());
    out
}

/// A primitive that fails (here the fused attention forward, given a saved buffer one float short)
/// keeps its error for `take_error` instead of panicking; every later primitive skips its device
/// work and returns a harmless value until the error is taken, and then the backend works again.
#[test]
fn a_failing_primitive_keeps_its_error_and_later_primitives_are_skipped() {
    let Some(mut gpu) = cuda_common::gpu("backend errors") else { return };
    let (b, t, nh, kvh, hd) = (1usize, 8usize, 2usize, 2usize, 64usize);
    let (c, w) = (nh * hd, (nh + 2 * kvh) * hd);
    gpu.set_fused_attention(true);
    let saved = gpu.attention_saved_len(b, t, c, nh);
    assert_eq!(gpu.take_error(), None, "a fresh backend keeps no error");
    let qkv = gpu.upload(&vec![0.5f32; b * t * w]);
    let mut out = gpu.zeros(b * t * c);
    let mut att = gpu.zeros(saved - 1);
    let mut kept = gpu.upload(&[7.0, 8.0]);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        gpu.attention_fwd(&mut out, &mut att, &qkv, b, t, c, nh, kvh, true);
        // Skipped from here on: no allocation, no copy, no launch.
        let later = gpu.upload(&[1.0, 2.0, 3.0]);
        gpu.fill_zero(&mut kept);
        let sum = gpu.sumsq(&qkv);
        let nonfinite = gpu.count_nonfinite(&qkv);
        let back = gpu.download(&qkv, 0, 4, 1);
        let reports = gpu.take_reports().len();
        (later, sum, nonfinite, back, reports)
    }));
    let (later, sum, nonfinite, back, reports) = r.expect("the backend panicked instead of keeping its error");
    let e = gpu.take_error().expect("the failed attention_fwd kept no error");
    println!("kept: {e}");
    assert!(e.starts_with("attention_fwd: ") && e.contains("saved log-sum-exp") && e.contains(&format!("holds {} floats; {saved} are needed", saved - 1)), "unexpected error: {e}");
    assert!(!e.contains('\n'), "not one line: {e}");
    assert_eq!(gpu.len(&later), 0, "upload allocated after the error");
    assert!(sum.is_nan(), "sumsq after the error: {sum}");
    assert_eq!(nonfinite, (b * t * w) as u64, "count_nonfinite after the error counts every value");
    assert!(back.len() == 4 && back.iter().all(|v| v.is_nan()), "download after the error: {back:?}");
    assert_eq!(reports, 0);
    // Taken: the error is gone, the skipped fill_zero left `kept` as it was, and the backend runs
    // again (also after dropping the empty buffer it returned).
    assert_eq!(gpu.take_error(), None, "take_error did not forget the error");
    drop(later);
    assert_eq!(gpu.download(&kept, 0, 2, 1), vec![7.0, 8.0], "fill_zero ran after the error");
    let x = gpu.upload(&[1.0, 2.0, 3.0]);
    assert_eq!(gpu.download(&x, 0, 3, 1), vec![1.0, 2.0, 3.0]);
    assert_eq!(gpu.sumsq(&x), 14.0);
    assert_eq!(gpu.take_error(), None, "the backend failed after the error was taken");
}

/// The cast kernels' speed on their own (run it on the GPU machine with
/// `cuda_layers --ignored --nocapture cast_throughput`): GPU µs per cast and the bandwidth it
/// reaches (f32 read + codes written; out: N the operand's layout, T its transpose, both the dual
/// cast), next to a plain read-and-write pass over the same values. It fails when a large straight
/// cast with the default grid and amax-only or cheap statistics falls under 40% of the copy's
/// bandwidth (75% measured on an H200).
#[test]
#[ignore]
fn cast_throughput() {
    let Some(mut gpu) = cuda_common::gpu("cast throughput") else { return };
    // A small operand that stays in L2, then llama-1b's (8192 tokens): x of qkv / o / fc1, x of
    // fc2 (8192 wide), dY of fc1 (16384 wide); and a 16384 × 4096 one.
    let shapes = [(2048usize, 4096usize), (8192, 2048), (8192, 8192), (8192, 16384), (16384, 4096)];
    let given = ScaleSource::Given { scale: 4.0, amax_used: 100.0 };
    let e4m3 = OperandCast::Fp8Tensor { format: Fp8Format::E4M3, scale: given };
    let e5m2 = OperandCast::Fp8Tensor { format: Fp8Format::E5M2, scale: given };
    println!("{:<12} {:<5} {:<4} {:>5} | µs and GB/s with at most 264, 396, 528, 1056 blocks, and the default | copy GB/s", "shape", "fmt", "out", "level");
    for (rows, cols) in shapes {
        let n = rows * cols;
        let host: Vec<f32> = (0..n).map(|i| ((i as f32 * 0.618).fract() - 0.5) * 8.0).collect();
        let mut x = gpu.upload(&host);
        let copy_gbs = (n * 8) as f64 / gpu.time_copy(&mut x, 20).unwrap() / 1e3;
        let x = gpu.upload(&host);
        for (name, how, out_bytes) in [("e4m3", e4m3, 1usize), ("e5m2", e5m2, 1), ("bf16", OperandCast::Bf16, 2)] {
            for (transpose, dual, layout) in [(false, false, "N"), (true, false, "T"), (false, true, "both")] {
                for level in [StatsLevel::Amax, StatsLevel::Cheap, StatsLevel::Channels, StatsLevel::Full] {
                    if name != "e4m3" && level != StatsLevel::Channels {
                        continue;
                    }
                    let mut cells = String::new();
                    let mut default_gbs = 0.0;
                    for most in [264, 396, 528, 1056, 0] {
                        gpu.set_cast_grid(most);
                        let us = gpu.time_cast(&x, rows, cols, transpose, dual, how, level, 20).unwrap();
                        let gbs = (n * (4 + out_bytes * (1 + dual as usize))) as f64 / us / 1e3;
                        cells += &format!(" {us:>8.1} {gbs:>6.0}");
                        default_gbs = gbs;
                    }
                    println!("{:<12} {:<5} {:<4} {:>8?}{cells} {:>10.0}", format!("{rows}x{cols}"), name, layout, level, copy_gbs);
                    // A large straight cast is bandwidth-bound: with the default grid it must move
                    // its bytes at least at 40% of a plain copy's rate (75% measured on an H200).
                    if n >= 1 << 26 && !transpose && !dual && level != StatsLevel::Full {
                        assert!(default_gbs >= 0.4 * copy_gbs, "{rows}x{cols} {name} {level:?}: {default_gbs:.0} GB/s against a copy's {copy_gbs:.0}");
                    }
                }
            }
        }
    }
}
