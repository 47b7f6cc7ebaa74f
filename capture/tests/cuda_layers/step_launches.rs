//! The step's launches that replace several: the cross-entropy's row kernels, the multi-tensor
//! launches (AdamW, the gradient norm, the zeroing) and the weights' FP8 casts in one launch, each
//! bit-identical to what it replaces.

use super::*;

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
        let start: Vec<[Vec<f32>; 3]> =
            host.iter().map(|g| [draw(g.len(), 1.0), draw(g.len(), 0.1), draw(g.len(), 0.1).iter().map(|x| x * x).collect()]).collect();
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
                assert!(
                    buffer_bits(&mut gpu, a) == buffer_bits(&mut gpu, b),
                    "adamw_all: {what} of parameter {i} ({} values, grad_scale {grad_scale}) differs from adamw's",
                    host[i].len()
                );
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
    let host: Vec<[Vec<f32>; 3]> =
        shapes.iter().enumerate().map(|(i, &(m, k))| [draw(m * k, 0.05 * (1 + i % 4) as f32), draw(n * k, 1.0), draw(n * m, 1e-3)]).collect();
    let bufs: Vec<[Buf; 3]> = host.iter().map(|h| [gpu.upload(&h[0]), gpu.upload(&h[1]), gpu.upload(&h[2])]).collect();
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
            let told: Vec<(GemmCall, &Buf)> =
                (0..70).map(|i| (call(i, Gemm::Fprop, if i == changed { given(1.0) } else { weight_cast(i) }), &bufs[i][0])).collect();
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
        // Both ways against the CPU reference's channel statistics of each fprop's operands, so
        // that a difference says which way is wrong.
        if level >= StatsLevel::Channels {
            for (way, reps) in [("in one launch", reports), ("each at its GEMM", want_reports)] {
                for r in reps.iter().filter(|r| r.id.gemm == Gemm::Fprop) {
                    let i = r.id.layer as usize * 4 + Module::ALL.iter().position(|&m| m == r.id.module).expect("a module of ALL");
                    let ((m, k), cast_b) = (shapes[i], weight_cast(i));
                    let cast_a = if matches!(cast_b, OperandCast::Bf16) { OperandCast::Bf16 } else { given(16.0) };
                    let cpu_a = cast_operand(&host[i][1], n, k, cast_a, OperandFault::NONE, level, false).report;
                    let cpu_b = cast_operand(&host[i][0], m, k, cast_b, OperandFault::NONE, level, false).report;
                    same_channels(&r.a, &cpu_a, &format!("{level:?}, weights cast {way}: weight {i}'s fprop activation"));
                    same_channels(&r.b, &cpu_b, &format!("{level:?}, weights cast {way}: weight {i}'s fprop weight"));
                }
            }
        }
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
