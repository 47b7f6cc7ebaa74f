//! FP8 and BF16 operand casts against the CPU emulation: every code point, the tiled casts' plain
//! rows, the per-channel statistics and the moments; and the casts' throughput (ignored: a measurement).

use super::*;

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
    v.extend([0.0, -0.0, max, -max, max * 1.01, -max * 1.5, max * 1e6, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-30, -1e-30, f32::MIN_POSITIVE]);
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
            let how = OperandCast::Fp8Tensor { format, scale: ScaleSource::Given { scale, amax_used: 1.0 } };
            let (bytes, rep) = gpu.cast_for_test(&xd, 1, n, false, how, OperandFault::NONE, StatsLevel::Full).expect("cast");
            let want: Vec<u8> = x.iter().map(|&v| fp8::cast(format, v, scale)).collect();
            let bad: Vec<String> =
                (0..n).filter(|&i| bytes[i] != want[i]).take(5).map(|i| format!("x={:e} gpu={:#04x} cpu={:#04x}", x[i], bytes[i], want[i])).collect();
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
            assert!((gm.mean - cm.mean).abs() <= 1e-9 * cm.mean.abs().max(1e-30) + 1e-300, "mean {} vs {}", gm.mean, cm.mean);
            let (gq, cq) = (rep.quant_error.expect("qe"), cpu.quant_error.expect("qe"));
            assert!(
                (gq.mse - cq.mse).abs() <= 1e-6 * cq.mse.abs() + 1e-300 && (gq.cos - cq.cos).abs() <= 1e-9 && (gq.bias - cq.bias).abs() <= 1e-9,
                "quant error {gq:?} vs {cq:?}"
            );
        }
        // Current scaling: the scale is computed on the device from the amax.
        let finite: Vec<f32> = x.iter().copied().filter(|v| v.is_finite() && v.abs() < 1e4).collect();
        let fd = gpu.upload(&finite);
        let how = OperandCast::Fp8Tensor { format, scale: ScaleSource::Current { margin: 1 } };
        let (bytes, rep) = gpu.cast_for_test(&fd, 1, finite.len(), false, how, OperandFault::NONE, StatsLevel::Amax).expect("cast");
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
            assert_eq!(
                (rep.scale.to_bits(), rep.amax.to_bits(), rep.underflow, rep.saturated, rep.nan, rep.inf),
                (cpu.scale.to_bits(), cpu.amax.to_bits(), cpu.underflow, cpu.saturated, cpu.nan, cpu.inf),
                "{}: faulted counts",
                format.name()
            );
            let (gq, cq) = (rep.quant_error.expect("qe"), cpu.quant_error.expect("qe"));
            assert!(
                (gq.mse - cq.mse).abs() <= 1e-6 * cq.mse.abs() && (gq.cos - cq.cos).abs() <= 1e-9 && (gq.bias - cq.bias).abs() <= 1e-9,
                "faulted quant error {gq:?} vs {cq:?}"
            );
            same_channels(&rep, &cpu, "faulted cast (planted outliers)");
        }
    }
    // Transposed casts (dgrad / wgrad operands) hold the same bytes, transposed.
    let (rows, cols) = (96, 160);
    let mut rng = Pcg64::seed_from_u64(3);
    let x: Vec<f32> = (0..rows * cols).map(|_| rng.random_range(-3.0..3.0)).collect();
    let xd = gpu.upload(&x);
    let how = OperandCast::Fp8Tensor { format: Fp8Format::E5M2, scale: ScaleSource::Given { scale: 100.0, amax_used: 3.0 } };
    let (t, _) = gpu.cast_for_test(&xd, rows, cols, true, how, OperandFault::NONE, StatsLevel::Amax).expect("cast");
    for r in 0..rows {
        for c in 0..cols {
            assert_eq!(t[c * rows + r], fp8::cast(Fp8Format::E5M2, x[r * cols + c], 100.0));
        }
    }
    // BF16 operands: the bits of round-to-nearest-even.
    let (b, _) = gpu.cast_for_test(&xd, rows, cols, false, OperandCast::Bf16, OperandFault::NONE, StatsLevel::Amax).expect("cast");
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
        assert!(rows > 3 * 64 && !rows.is_multiple_of(64), "several row tiles, the last one partial");
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
                    println!(
                        "{what}: {rows} × {cols}, saturated {}, underflow {}, NaN {}, Inf {}, zeros {}",
                        rep.saturated, rep.underflow, rep.nan, rep.inf, rep.zeros
                    );
                }
            }
        }
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
    for (how, transpose, level) in
        [(OperandCast::Bf16, false, StatsLevel::Channels), (e4, false, StatsLevel::Channels), (e4, true, StatsLevel::Full), (cur, true, StatsLevel::Channels)]
    {
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

/// Three casts queued before one download hold 36,000 channels: the step's record columns (16,384
/// to start with) grow while their reductions wait for the batch. Each round plants its outliers
/// in other channels, and a large cast ahead keeps the stream busy, so that summaries read before
/// the host copy lands (the previous round's columns) fail: cudarc's events are not recorded with
/// event tracking off, so the copy's own stream must be waited for.
#[test]
fn channel_statistics_of_a_step_are_reduced_together_as_the_records_grow() {
    let Some(mut gpu) = cuda_common::gpu("batched channel statistics") else { return };
    let (rows, cols) = (64, 12_000);
    let mut rng = Pcg64::seed_from_u64(23);
    let normal = Normal::new(0.0f32, 1.0).expect("normal");
    let e4 = OperandCast::Fp8Tensor { format: Fp8Format::E4M3, scale: ScaleSource::Given { scale: 4.0, amax_used: 100.0 } };
    // 4096 × 12,000 values: about 0.2 ms of casting on an H100, far longer than the host takes
    // from the copy's start to the summaries.
    let big_rows = 4096;
    let big = gpu.upload(&(0..big_rows * cols).map(|i| ((i % 977) as f32 - 488.0) * 0.01).collect::<Vec<f32>>());
    // Straight (a channel pass of its own) and transposed (the tiled kernel's partials); the
    // records taken after the step, copied to the host after its last cast (`gemms_done`), and
    // copied after its second cast (the third cast's columns then come after the copy).
    let mut round = 0;
    for transpose in [false, true] {
        for prefetch in [None, Some(4), Some(3)] {
            round += 1;
            let outlier = |i: usize| 1000 * (i + 1) + round;
            let xs: Vec<Vec<f32>> = (0..3)
                .map(|i| {
                    let mut x: Vec<f32> = (0..rows * cols).map(|_| normal.sample(&mut rng)).collect();
                    for r in 0..rows {
                        x[r * cols + outlier(i)] *= 20.0;
                    }
                    x
                })
                .collect();
            let bufs: Vec<_> = xs.iter().map(|x| gpu.upload(x)).collect();
            let shapes: Vec<_> = std::iter::once((&*big, big_rows, cols)).chain(bufs.iter().map(|b| (&**b, rows, cols))).collect();
            let reps = gpu.casts_for_test(&shapes, transpose, e4, StatsLevel::Channels, prefetch).expect("casts");
            assert_eq!(reps.len(), 4);
            for (i, (rep, x)) in reps[1..].iter().zip(&xs).enumerate() {
                let cpu = cast_operand(x, rows, cols, e4, OperandFault::NONE, StatsLevel::Channels, false).report;
                same_channels(rep, &cpu, &format!("cast {i} of 3, transposed {transpose}, prefetched after {prefetch:?} casts"));
                assert_eq!(rep.channels.expect("channels").amax_channel, Some(outlier(i) as u32), "cast {i}: its outlier channel");
            }
        }
    }
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
