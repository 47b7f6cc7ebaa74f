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
//!
//! One module a kind (casts, layers, bf16_operands, gemms, computed_casts, step_launches, errors);
//! this file holds what they share: the layers' inputs and tolerances, and helpers.

#[path = "../cuda_common/mod.rs"]
mod cuda_common;

mod accumulator;
mod bf16_operands;
mod casts;
mod computed_casts;
mod errors;
mod gemms;
mod layers;
mod step_launches;

use fp8_capture::backend::cpu::CpuBackend;
use fp8_capture::backend::cpu::cast::cast_operand;
use fp8_capture::backend::{Activation, AdamW, Backend, GemmCall, GemmId, GemmReport, LinearDims, OperandCast, OperandFault, ScaleSource, StatsLevel};
use fp8_capture::fp8::{self, Fp8Format};
use fp8scope_schemas::names::{Gemm, Module};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};
use rand_pcg::Pcg64;

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
    (
        "channel_share",
        1e-7,
        "f64 per-channel sums of squares in different orders (rows chunked differently), within 1e-15, then kept here as f32: at most an f32 rounding apart",
    ),
    (
        "attention_gqa",
        2e-2,
        "as attention (BF16 operands on the GPU, f32 on the CPU); a kv head's dk and dv sum over its query heads inside the GPU's GEMM, in head-then-query order on the CPU",
    ),
    (
        "attention",
        2e-2,
        "the GPU's products take BF16 operands (q, k, v, dout, the probabilities and the score gradients rounded: 2^-9 relative each), the CPU's f32; the fused kernels normalise the probabilities after their product with v, the CPU before; both round the outputs to BF16",
    ),
    ("matmul_bf16", 1e-2, "BF16 operands and outputs; accumulation order differs, so outputs near a BF16 rounding boundary flip by one BF16 ulp (2^-8)"),
    (
        "gemm",
        1e-2,
        "identical FP8/BF16 operand bytes; FP32 accumulation order and the dequantisation (cuBLASLt multiplies by 1/scale after the sum, the CPU divides each operand) differ, then BF16 rounding of the output",
    ),
];

fn tolerance(name: &str) -> (f64, &'static str) {
    TOLERANCES.iter().find(|(p, _, _)| name.starts_with(p)).map(|(_, b, r)| (*b, *r)).unwrap_or((0.0, "no bound given: must be exact"))
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
    if let Some(x) = mats.get_mut("vv") {
        x.iter_mut().for_each(|e| *e = e.abs())
    }
    let mut r2 = Pcg64::seed_from_u64(12);
    let tokens = (0..n).map(|_| r2.random_range(0..v as u32)).collect();
    let targets = (0..n).map(|_| r2.random_range(0..v as u32)).collect();
    Inputs { v, c, f, nh, kvh: 2, b, t, tokens, targets, mats }
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
fn bf16_site<B: Backend>(
    be: &mut B,
    x: &B::Buf,
    w: &B::Buf,
    bias: &B::Buf,
    dy: &B::Buf,
    db0: &[f32],
    dims: LinearDims,
    back_to_back: bool,
    column_sums: bool,
    stats: StatsLevel,
) -> Vec<(String, Vec<f32>)> {
    let (n, c, f) = (dims.n, dims.k, dims.m);
    let call =
        |gemm| GemmCall { stats, a_column_sums: column_sums && gemm == Gemm::Dgrad, ..GemmCall::bf16(GemmId { layer: 3, module: Module::Fc1, gemm }, dims) };
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

/// The channel statistics of a GPU cast report against the CPU's: the amax channel exactly, the
/// share to 1e-12 (f64 sums of the same squares in different orders).
pub(crate) fn same_channels(gpu: &fp8_capture::backend::CastReport, cpu: &fp8_capture::backend::CastReport, what: &str) {
    let (g, c) = (gpu.channels.expect("GPU channel statistics"), cpu.channels.expect("CPU channel statistics"));
    assert_eq!(g.amax_channel, c.amax_channel, "{what}: amax channel");
    match (g.top_channel_sq_frac, c.top_channel_sq_frac) {
        (Some(a), Some(b)) => assert!((a - b).abs() <= 1e-12 * b, "{what}: top channels' share {a} vs {b}"),
        (a, b) => assert_eq!(a, b, "{what}: top channels' share"),
    }
}
