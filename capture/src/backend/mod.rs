//! The `Backend` trait: the primitives the model is written over, once, for both devices.
//!
//! The model (`model.rs`) owns the order of operations, the tensor names, the recipes' scaling state
//! and the routing; a backend supplies buffers and the numeric primitives: LayerNorm, attention,
//! GELU, and for the Llama family RMSNorm, SwiGLU and rotary embeddings, residual adds, embedding,
//! cross-entropy, AdamW, reductions, and — the one that matters —
//! [`Backend::gemm`], a linear-layer GEMM whose operands are cast to FP8 (or rounded to BF16) as the
//! call says, with the cast statistics the recorder needs.
//!
//! The CPU backend (`cpu/`) is the reference: exact FP8 emulation, BF16 rounding emulated with
//! `half`, FP32 accumulation. Other backends must agree with it (bit-exact casts,
//! tolerance-bounded layers).
//!
//! Reports of casts and shadow GEMMs are queued inside the backend and collected once per step
//! ([`Backend::take_reports`]), so a device backend needs no host synchronisation per GEMM.
//! Errors are collected the same way: a primitive returns no `Result`; a device backend keeps its
//! first error and the caller asks for it ([`Backend::take_error`]) once per step.

pub mod cpu;
pub mod cuda;
pub mod operands;

pub use crate::channel_stats::ChannelStats;
use crate::fp8::Fp8Format;
pub use crate::tensor_stats::Moments;
use fp8scope_schemas::names::{Gemm, Module, Role};
use fp8scope_schemas::quant::E8m0Rounding;

/// Identifies one GEMM of the model: `layers.{layer}.{module}.{gemm}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GemmId {
    pub layer: u32,
    pub module: Module,
    pub gemm: Gemm,
}

impl std::fmt::Display for GemmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "layers.{}.{}.{}", self.layer, self.module, self.gemm)
    }
}

/// How one GEMM operand is represented before the multiply.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OperandCast {
    /// Rounded to BF16 (round to nearest even).
    Bf16,
    /// Cast to FP8 with one scale for the whole tensor.
    Fp8Tensor { format: Fp8Format, scale: ScaleSource },
    /// Cast to FP8 with one scale per tile of `tile_rows × tile_cols` elements of the operand's
    /// row-major layout, each from the tile's own amax.
    Fp8Block { format: Fp8Format, tile_rows: usize, tile_cols: usize, margin: i32 },
    /// Cast to MXFP8 (`crate::micro::mxfp8`): `format` elements in `tile_rows × tile_cols` blocks,
    /// each with an E8M0 scale from its amax under `rounding`.
    Mxfp8 { format: Fp8Format, rounding: E8m0Rounding, tile_rows: usize, tile_cols: usize },
    /// Cast to NVFP4 (`crate::micro::nvfp4`): E2M1 elements in `tile_rows × tile_cols` blocks with
    /// E4M3 scales under an FP32 tensor scale, after the random Hadamard transform when `rht`,
    /// rounded stochastically with the seed when there is one.
    Nvfp4 { tile_rows: usize, tile_cols: usize, rht: bool, stochastic_seed: Option<u64> },
}

/// Where a per-tensor scale comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ScaleSource {
    /// A scale the host computed (delayed scaling), with the amax it came from.
    Given { scale: f32, amax_used: f32 },
    /// From the operand's own amax just before the cast (current scaling).
    Current { margin: i32 },
}

/// A planted defect in one operand's cast (see `--inject`); absent in healthy runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OperandFault {
    /// A mis-scale: the cast uses scale × this, the dequantization the true scale, as a stale or
    /// corrupted scale would (2^k: k > 0 inflates and saturates, k < 0 shrinks and underflows).
    pub scale_mult: f32,
    /// Multiplies a few elements of the high-precision operand before the cast (1.0: none).
    pub outlier_factor: f32,
    /// Not a fault but a recipe setting carried with the cast: values past the format's range
    /// become NaN (E4M3) or ±Inf (E5M2) instead of saturating (`--overflow nan`).
    pub overflow_nan: bool,
}

impl Default for OperandFault {
    fn default() -> Self {
        OperandFault::NONE
    }
}

impl OperandFault {
    pub const NONE: OperandFault = OperandFault { scale_mult: 1.0, outlier_factor: 1.0, overflow_nan: false };
    pub fn is_none(&self) -> bool {
        self.scale_mult == 1.0 && self.outlier_factor == 1.0 && !self.overflow_nan
    }
}

/// How much the backend measures about each operand cast.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum StatsLevel {
    /// Only the amax (the recipes need it every step).
    Amax,
    /// Every cheap column of the tensor: counts, min/max, mean/std, dynamic range.
    Cheap,
    /// Cheap plus the per-channel statistics (amax channel, top channels' share of Σx²).
    Channels,
    /// Channels plus the quantization error (x vs dequant(cast(x))).
    Full,
}

/// Layout of a linear layer's operands. `n` tokens, `k` input features, `m` output features.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearDims {
    pub n: usize,
    pub k: usize,
    pub m: usize,
}

/// One GEMM call. Operand A and B are, by `id.gemm`:
/// fprop: A = X (n×k), B = W (m×k) → out Y (n×m) = X·Wᵀ (+bias)
/// dgrad: A = dY (n×m), B = W (m×k) → out dX (n×k) = dY·W
/// wgrad: A = dY (n×m), B = X (n×k) → out dW (m×k) = dYᵀ·X (and dbias = column sums of dY)
#[derive(Clone, Debug)]
pub struct GemmCall {
    pub id: GemmId,
    pub dims: LinearDims,
    pub cast_a: OperandCast,
    pub cast_b: OperandCast,
    pub fault_a: OperandFault,
    pub fault_b: OperandFault,
    /// Replace the output with NaN at one element (a planted NaN).
    pub nan_output: bool,
    pub stats: StatsLevel,
    /// Keep operand a's / b's FP8 bytes (nothing for BF16) in the report, for tensor dumps: only
    /// the operands whose bytes a dump will take (see `record::rows::byte_sources`), since on the
    /// GPU keeping them costs a download (and, for a transposed operand, a transpose back).
    pub keep_quantized: [bool; 2],
    /// Also run the GEMM in BF16 on the same high-precision inputs and report the output error.
    pub shadow: bool,
    /// With FP8 operands, accumulate in the tensor cores' reduced precision (cuBLASLt's fast
    /// accumulation; `RecipeConfig::accumulation`). The CPU accumulates in FP32 unless told to
    /// emulate Hopper's tensor cores (`CpuBackend::set_accumulator`), which follow this flag.
    pub fast_accumulation: bool,
    /// Operand a is the gradient dY of a layer with a bias, whose gradient (the sums of dY's
    /// columns) the site's wgrad takes next from the same cast (set on dgrads): a backend may sum
    /// the columns as it casts a, instead of reading the cast again for them. The CUDA backend's
    /// BF16 casts do; the result is the same either way.
    pub a_column_sums: bool,
}

impl GemmCall {
    /// `id`'s GEMM with BF16 operands, no fault, amax-only statistics, nothing dumped or shadowed.
    pub fn bf16(id: GemmId, dims: LinearDims) -> GemmCall {
        GemmCall {
            id,
            dims,
            cast_a: OperandCast::Bf16,
            cast_b: OperandCast::Bf16,
            fault_a: OperandFault::NONE,
            fault_b: OperandFault::NONE,
            nan_output: false,
            stats: StatsLevel::Amax,
            keep_quantized: [false; 2],
            shadow: false,
            fast_accumulation: false,
            a_column_sums: false,
        }
    }
}

/// What a backend measured about one operand cast.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CastReport {
    /// The operand's role.
    pub role: Option<Role>,
    /// The element format: `e4m3`, `e5m2`, `e2m1` or `bf16`.
    pub format: &'static str,
    /// The scale used (per-tensor), or the smallest tile scale (block scaling, MXFP8: the smallest
    /// 2^(127 − code)), the tensor scale S_enc (NVFP4), 1.0 for BF16.
    pub scale: f32,
    /// max |x| over finite values of the operand as cast (faults included).
    pub amax: f32,
    /// The amax the scale was computed from.
    pub amax_used: f32,
    pub numel: u64,
    pub underflow: u64,
    pub saturated: u64,
    pub nan: u64,
    pub inf: u64,
    pub zeros: u64,
    /// Filled from `StatsLevel::Cheap` on.
    pub moments: Option<Moments>,
    /// Filled from `StatsLevel::Channels` on: where the amax sits and how much of Σx² the top channels
    /// (columns of the operand's row-major layout) hold ([`crate::channel_stats`]).
    pub channels: Option<ChannelStats>,
    /// Filled at `StatsLevel::Full`: MSE, cosine and bias of dequant(cast(x)) against x.
    pub quant_error: Option<crate::tensor_stats::QuantError>,
    /// The fprop weight's motion since the previous recorded step (CPU backend, per-tensor FP8
    /// casts): [`crate::weight_motion`].
    pub weight_motion: Option<crate::weight_motion::WeightMotion>,
    /// With `keep_quantized`: the FP8 bytes, row-major in the operand's layout.
    pub quantized: Option<Vec<u8>>,
    /// Block-scaled casts (`block`, MXFP8, NVFP4), from `StatsLevel::Cheap` on: how the block
    /// scales spread and how many leave their format's range ([`crate::block_stats`]).
    pub blocks: Option<crate::block_stats::BlockStats>,
    /// With `keep_quantized` and block scaling: tile scales, row-major over tiles, and the tile.
    pub block_scales: Option<(Vec<f32>, usize, usize)>,
}

/// Output error of an FP8 GEMM against the BF16 GEMM on the same inputs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ShadowError {
    pub numel: u64,
    pub cosine: f64,
    pub mse: f64,
    pub rel_l2: f64,
    pub max_abs_diff: f64,
    /// ⟨δ, dual⟩ and ‖dual‖ (`tables::ShadowRow::dual_inner`): for a gradient GEMM the dual is its
    /// BF16 result; for an fprop the loss gradient dY of its output, which the backend pairs with
    /// δY when the step's backward reaches the GEMM's site. None where not computed.
    pub dual_inner: Option<f64>,
    pub dual_norm: Option<f64>,
}

/// Everything measured about one GEMM.
#[derive(Clone, Debug)]
pub struct GemmReport {
    pub id: GemmId,
    pub a: CastReport,
    pub b: CastReport,
    pub shadow: Option<ShadowError>,
    /// Non-finite values in the GEMM's output.
    pub output_nonfinite: u64,
}

/// The activation function between a block's fc1 and fc2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// GPT's GELU (tanh approximation): act = gelu(h), h and act of one shape.
    Gelu,
    /// Llama's SwiGLU: each row of h (N, 2F) is [gate | up]; act (N, F) = silu(gate) · up.
    Swiglu { f: usize },
}

/// A normalization's forward in front of a GEMM ([`Backend::gemm_of_norm`]): its input (N, C),
/// its gain (and LayerNorm's bias) per column, and the row statistics it saves for its backward,
/// which hold the input's already when `ready` ([`Backend::add_with_norm_stats`] said so).
pub enum NormFwd<'a, B> {
    /// Llama's RMSNorm ([`Backend::rmsnorm_fwd`]).
    Rms { inp: &'a B, w: &'a B, rstd: &'a mut B, c: usize, eps: f32, ready: bool },
    /// GPT's LayerNorm ([`Backend::layernorm_fwd`]).
    Layer { inp: &'a B, w: &'a B, b: &'a B, mean: &'a mut B, rstd: &'a mut B, c: usize, ready: bool },
}

/// The row statistics of the normalization after a residual add ([`Backend::add_with_norm_stats`]):
/// RMSNorm's rstd, or LayerNorm's mean and rstd, of rows of `c` values.
pub enum NormStats<'a, B> {
    Rms { rstd: &'a mut B, c: usize, eps: f32 },
    Layer { mean: &'a mut B, rstd: &'a mut B, c: usize },
}

/// AdamW hyper-parameters for one update.
#[derive(Clone, Copy, Debug)]
pub struct AdamW {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// 1-based step.
    pub t: u32,
    /// Multiplies the gradients first (global-norm clipping).
    pub grad_scale: f32,
}

/// The primitives of one device. Buffers hold f32 values; tokens are u32.
pub trait Backend {
    type Buf;
    type Tokens;

    /// `cpu` or `cuda`.
    fn kind(&self) -> &'static str;
    fn device_info(&self) -> fp8scope_schemas::manifest::DeviceInfo;

    fn zeros(&mut self, n: usize) -> Self::Buf;
    /// Zeros, for a tensor whose every value will be a BF16 number (a GEMM's output, which the
    /// GEMM rounds to BF16, or the attention's, which it rounds alike): a backend may store it in
    /// 16 bits, losing nothing. Only these primitives take such a buffer: `gemm` (as its output,
    /// and as `a` or `b`), `swiglu_*` and `gelu_*` (as `inp`),
    /// `swiglu_bwd`, `gelu_bwd`, `rmsnorm_bwd` and `layernorm_bwd` (as `dout`), `adamw` (as `g`),
    /// `add` (as `b`), `rope_fwd` (as `qkv`) and `rope_bwd` (as `dout`), `attention_fwd` and
    /// `attention_bwd` (as `qkv`; the forward also as `out`, the backward as `dout`, `out` and
    /// `dqkv`), `rope_attention_fwd` (as `qkv`, `out` and `saved`: see there) and
    /// `rope_attention_bwd` (as `dout`, `out` and `saved`),
    /// `sumsq`, `sumsq_all`, `count_nonfinite`, `download`, `len`, `fill_zero`. Default:
    /// [`Backend::zeros`].
    fn zeros_bf16(&mut self, n: usize) -> Self::Buf {
        self.zeros(n)
    }
    fn upload(&mut self, data: &[f32]) -> Self::Buf;
    fn upload_tokens(&mut self, tokens: &[u32]) -> Self::Tokens;
    /// Copies `len` values from `offset` on, with `stride` between them, to the host.
    fn download(&mut self, buf: &Self::Buf, offset: usize, len: usize, stride: usize) -> Vec<f32>;
    fn len(&self, buf: &Self::Buf) -> usize;
    /// `buf` ← `data` (the same length): a reduced gradient written back. The default uploads a
    /// new f32 buffer in its place; a backend that keeps some buffers in 16 bits overrides it.
    fn overwrite(&mut self, buf: &mut Self::Buf, data: &[f32]) {
        *buf = self.upload(data);
    }
    fn fill_zero(&mut self, buf: &mut Self::Buf);
    /// [`Backend::fill_zero`] of every buffer of `bufs`: one call, so that a device backend may
    /// clear them all in one launch.
    fn fill_zero_all(&mut self, bufs: &mut [&mut Self::Buf]) {
        for b in bufs.iter_mut() {
            self.fill_zero(b);
        }
    }

    /// out (N,C) = wte[tokens].
    fn embedding_fwd(&mut self, out: &mut Self::Buf, tokens: &Self::Tokens, wte: &Self::Buf, c: usize);
    /// dwte += scatter of dout by token.
    fn embedding_bwd(&mut self, dwte: &mut Self::Buf, dout: &Self::Buf, tokens: &Self::Tokens, c: usize);
    #[allow(clippy::too_many_arguments)]
    fn layernorm_fwd(&mut self, out: &mut Self::Buf, mean: &mut Self::Buf, rstd: &mut Self::Buf, inp: &Self::Buf, w: &Self::Buf, b: &Self::Buf, c: usize);
    /// dinp, dw, db are accumulated (`+=`).
    #[allow(clippy::too_many_arguments)]
    fn layernorm_bwd(
        &mut self,
        dinp: &mut Self::Buf,
        dw: &mut Self::Buf,
        db: &mut Self::Buf,
        dout: &Self::Buf,
        inp: &Self::Buf,
        w: &Self::Buf,
        mean: &Self::Buf,
        rstd: &Self::Buf,
        c: usize,
    );
    /// RMSNorm: out = inp · rstd · w with rstd = 1/√(mean(inp²) + eps) per row of c; saves rstd (N).
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_fwd(&mut self, out: &mut Self::Buf, rstd: &mut Self::Buf, inp: &Self::Buf, w: &Self::Buf, c: usize, eps: f32);
    /// dinp and dw are accumulated (+=).
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_bwd(&mut self, dinp: &mut Self::Buf, dw: &mut Self::Buf, dout: &Self::Buf, inp: &Self::Buf, w: &Self::Buf, rstd: &Self::Buf, c: usize);
    /// SwiGLU: each row of inp (N, 2F) is [gate (F) | up (F)]; out (N, F) = silu(gate) · up.
    fn swiglu_fwd(&mut self, out: &mut Self::Buf, inp: &Self::Buf, f: usize);
    /// dinp (N, 2F) (=) from dout (N, F).
    fn swiglu_bwd(&mut self, dinp: &mut Self::Buf, inp: &Self::Buf, dout: &Self::Buf, f: usize);
    /// Rotary embeddings on the q and k heads of qkv (B, T, (NH + 2·KVH)·HD), each row laid out
    /// [q (NH·HD) | k (KVH·HD) | v (KVH·HD)]; out = rotated copy (v copied unchanged). Hugging Face's
    /// rotate_half convention (pairs i and i + HD/2, inv_freq_i = theta^(−2i/HD)), position = t.
    #[allow(clippy::too_many_arguments)]
    fn rope_fwd(&mut self, out: &mut Self::Buf, qkv: &Self::Buf, b: usize, t: usize, nh: usize, kvh: usize, hd: usize, theta: f32);
    /// dqkv (=) from dout: the inverse rotation on q and k, v copied.
    #[allow(clippy::too_many_arguments)]
    fn rope_bwd(&mut self, dqkv: &mut Self::Buf, dout: &Self::Buf, b: usize, t: usize, nh: usize, kvh: usize, hd: usize, theta: f32);
    /// Floats of the buffer attention saves for its backward (`att`), and of the backward's
    /// scratch (`datt`): the (B,NH,T,T) probabilities on the CPU; on the GPU's fused attention, one
    /// log-sum-exp (forward) or correction term (backward) per query row, (B,NH,T).
    fn attention_saved_len(&self, b: usize, t: usize, _c: usize, nh: usize) -> usize {
        b * nh * t * t
    }
    /// out (B,T,C), and `att` ([`Backend::attention_saved_len`]) saved for the backward, from qkv (B,T,C + 2·KVH·HD) with rows
    /// [q (C = NH·HD) | k (KVH·HD) | v (KVH·HD)]; query head h uses kv head h / (NH/KVH)
    /// (grouped-query attention; kvh = nh is multi-head attention). BF16 operands.
    #[allow(clippy::too_many_arguments)]
    fn attention_fwd(&mut self, out: &mut Self::Buf, att: &mut Self::Buf, qkv: &Self::Buf, b: usize, t: usize, c: usize, nh: usize, kvh: usize, causal: bool);
    /// dqkv (=) from dout; `out` is the forward's output, `datt` scratch of att's size. The dk/dv
    /// of a shared kv head accumulate over its query heads in a fixed order.
    #[allow(clippy::too_many_arguments)]
    fn attention_bwd(
        &mut self,
        dqkv: &mut Self::Buf,
        datt: &mut Self::Buf,
        dout: &Self::Buf,
        out: &Self::Buf,
        qkv: &Self::Buf,
        att: &Self::Buf,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
        kvh: usize,
        causal: bool,
    );
    /// RoPE on q and k, then attention (the Llama family's order): `out` and `att` as
    /// [`Backend::attention_fwd`]'s, from qkv (B,T,(NH + 2·KVH)·HD) before the rotation; `saved`
    /// (as many values as qkv) keeps what [`Backend::rope_attention_bwd`] needs. Default: the
    /// rotated rows, `rope_fwd` then `attention_fwd`. A backend may keep them in its own form (the
    /// GPU's: q, k and v head-major in BF16, the operands its attention takes, written in one pass
    /// from qkv); `saved` may then be a [`Backend::zeros_bf16`] buffer.
    #[allow(clippy::too_many_arguments)]
    fn rope_attention_fwd(
        &mut self,
        out: &mut Self::Buf,
        att: &mut Self::Buf,
        saved: &mut Self::Buf,
        qkv: &Self::Buf,
        b: usize,
        t: usize,
        nh: usize,
        kvh: usize,
        hd: usize,
        theta: f32,
        causal: bool,
    ) {
        self.rope_fwd(saved, qkv, b, t, nh, kvh, hd, theta);
        self.attention_fwd(out, att, saved, b, t, nh * hd, nh, kvh, causal);
    }
    /// The backward of [`Backend::rope_attention_fwd`]: dqkv (=, before the rotation) from dout;
    /// `dqkv_rot` is scratch of dqkv's size (the gradient after the rotation), `datt` as
    /// [`Backend::attention_bwd`]'s. Default: `attention_bwd` then `rope_bwd`.
    #[allow(clippy::too_many_arguments)]
    fn rope_attention_bwd(
        &mut self,
        dqkv: &mut Self::Buf,
        dqkv_rot: &mut Self::Buf,
        datt: &mut Self::Buf,
        dout: &Self::Buf,
        out: &Self::Buf,
        saved: &Self::Buf,
        att: &Self::Buf,
        b: usize,
        t: usize,
        nh: usize,
        kvh: usize,
        hd: usize,
        theta: f32,
        causal: bool,
    ) {
        self.attention_bwd(dqkv_rot, datt, dout, out, saved, att, b, t, nh * hd, nh, kvh, causal);
        self.rope_bwd(dqkv, dqkv_rot, b, t, nh, kvh, hd, theta);
    }
    fn gelu_fwd(&mut self, out: &mut Self::Buf, inp: &Self::Buf);
    /// dinp (=) = gelu'(inp) · dout.
    fn gelu_bwd(&mut self, dinp: &mut Self::Buf, inp: &Self::Buf, dout: &Self::Buf);
    /// out = a + b.
    fn add(&mut self, out: &mut Self::Buf, a: &Self::Buf, b: &Self::Buf);
    /// acc += x.
    fn add_inplace(&mut self, acc: &mut Self::Buf, x: &Self::Buf);
    /// Rounds every element to BF16 in place (emulates a BF16 activation).
    fn round_bf16(&mut self, x: &mut Self::Buf);
    /// Plain BF16 GEMM out (n,m) = inp (n,k) · w (m,k)ᵀ, for the lm_head. BF16 operands and output.
    fn matmul_bf16_fwd(&mut self, out: &mut Self::Buf, inp: &Self::Buf, w: &Self::Buf, dims: LinearDims);
    /// dinp (=) = dout·w and dw (+=) = doutᵀ·inp, BF16 operands, for the lm_head.
    fn matmul_bf16_bwd(&mut self, dinp: &mut Self::Buf, dw: &mut Self::Buf, dout: &Self::Buf, inp: &Self::Buf, w: &Self::Buf, dims: LinearDims);
    /// Per-token losses (=) from `logits` (N,V), whose values are then replaced by the dlogits
    /// (softmax − onehot)·dloss: the logits are not needed after the loss, and at a large
    /// vocabulary a second (N,V) buffer is a gigabyte.
    fn crossentropy(&mut self, losses: &mut Self::Buf, logits: &mut Self::Buf, targets: &Self::Tokens, v: usize, dloss: f32);
    /// Σ x² in f64 (non-finite values propagate).
    fn sumsq(&mut self, x: &Self::Buf) -> f64;
    /// Σ x² over every buffer, in f64: the squared global gradient norm. One call instead of one
    /// `sumsq` per buffer, so that a device backend synchronises once, not once per parameter.
    fn sumsq_all(&mut self, xs: &[Self::Buf]) -> f64 {
        xs.iter().map(|x| self.sumsq(x)).sum()
    }
    /// Number of non-finite values.
    fn count_nonfinite(&mut self, x: &Self::Buf) -> u64;
    fn adamw(&mut self, p: &mut Self::Buf, g: &Self::Buf, m: &mut Self::Buf, v: &mut Self::Buf, h: &AdamW);
    /// [`Backend::adamw`] of every parameter `ps[i]` with its gradient `gs[i]` and moments `ms[i]`,
    /// `vs[i]`: the optimizer's step. One call instead of one a parameter, so that a device
    /// backend may update them all in one launch (same results).
    fn adamw_all(&mut self, ps: &mut [Self::Buf], gs: &[Self::Buf], ms: &mut [Self::Buf], vs: &mut [Self::Buf], h: &AdamW) {
        for (((p, g), m), v) in ps.iter_mut().zip(gs).zip(ms.iter_mut()).zip(vs.iter_mut()) {
            self.adamw(p, g, m, v, h);
        }
    }

    /// The forward's linear-layer fprops, each `call` with its weight W (operand b), before the
    /// first of them runs: a backend may cast the weights here, all in one pass, for `gemm` to
    /// take; each `gemm` then gets the codes and statistics it would have cast itself, and casts
    /// the weight itself whenever its call is not one given here. Default: nothing (each `gemm`
    /// casts its weight).
    fn cast_weights(&mut self, calls: &[(GemmCall, &Self::Buf)]) {
        let _ = calls;
    }

    /// A linear layer's GEMM as `call` says (see [`GemmCall`] for the operands' layout). `a`, `b`
    /// are the high-precision operands; `out` receives the result (`=`), rounded to BF16; for
    /// wgrad, `dbias` (if given) accumulates the column sums of dY. For fprop, `bias` is added.
    #[allow(clippy::too_many_arguments)]
    fn gemm(&mut self, call: &GemmCall, out: &mut Self::Buf, a: &Self::Buf, b: &Self::Buf, bias: Option<&Self::Buf>, dbias: Option<&mut Self::Buf>);

    /// Whether `gemm(call, ..)` would take operand `operand` (0: `a`, 1: `b`) from a cast kept
    /// since the site's earlier GEMM (see the CUDA backend's `cast.rs`) instead of reading `x`.
    /// When it would, `x` need not hold the operand any more: the model reuses one buffer for the
    /// activations of every layer and recomputes a layer's only when this says no. Default: no.
    fn reuses_kept_cast(&self, _call: &GemmCall, _operand: usize, _x: &Self::Buf) -> bool {
        false
    }

    /// act = the activation function `kind` of h (`gelu_fwd` or `swiglu_fwd`).
    fn activation_fwd(&mut self, act: &mut Self::Buf, h: &Self::Buf, kind: Activation) {
        match kind {
            Activation::Gelu => self.gelu_fwd(act, h),
            Activation::Swiglu { f } => self.swiglu_fwd(act, h, f),
        }
    }

    /// dh (=) = the backward of the activation function `kind` at h, from dact (`gelu_bwd` or
    /// `swiglu_bwd`).
    fn activation_bwd(&mut self, dh: &mut Self::Buf, h: &Self::Buf, dact: &Self::Buf, kind: Activation) {
        match kind {
            Activation::Gelu => self.gelu_bwd(dh, h, dact),
            Activation::Swiglu { f } => self.swiglu_bwd(dh, h, dact, f),
        }
    }

    /// fc2's fprop `call` (see [`Backend::gemm`]), whose operand a is act = the activation
    /// function of fc1's output h. Returns whether `act` was written: a backend may instead
    /// compute the activation as it casts the operand (the CUDA backend), leaving `act` as it was;
    /// the cast it keeps for the site's wgrad is then keyed by `act` (see
    /// [`Backend::reuses_kept_cast`]), so the model writes `act` for the wgrad only where that says
    /// no. Default: [`Backend::activation_fwd`], then `gemm`.
    #[allow(clippy::too_many_arguments)]
    fn gemm_of_activation(
        &mut self,
        call: &GemmCall,
        out: &mut Self::Buf,
        act: &mut Self::Buf,
        h: &Self::Buf,
        kind: Activation,
        w: &Self::Buf,
        bias: Option<&Self::Buf>,
    ) -> bool {
        self.activation_fwd(act, h, kind);
        self.gemm(call, out, act, w, bias, None);
        true
    }

    /// fc1's dgrad `call`, whose operand a is dh = the activation function's backward at h from
    /// dact; as [`Backend::gemm_of_activation`] (returns whether `dh` was written). Default:
    /// [`Backend::activation_bwd`], then `gemm`.
    #[allow(clippy::too_many_arguments)]
    fn gemm_of_activation_grad(
        &mut self,
        call: &GemmCall,
        out: &mut Self::Buf,
        dh: &mut Self::Buf,
        h: &Self::Buf,
        dact: &Self::Buf,
        kind: Activation,
        w: &Self::Buf,
    ) -> bool {
        self.activation_bwd(dh, h, dact, kind);
        self.gemm(call, out, dh, w, None, None);
        true
    }

    /// A GEMM `call` whose operand a is the output `ln` of the normalization `norm` (qkv's and
    /// fc1's fprop); as [`Backend::gemm_of_activation`], returns whether `ln` was written: a
    /// backend may instead compute the normalization as it casts the operand, writing only its
    /// row statistics, and key the kept cast by `ln` (see [`Backend::reuses_kept_cast`]).
    /// Default: [`Backend::norm_fwd`], then `gemm`.
    fn gemm_of_norm(
        &mut self,
        call: &GemmCall,
        out: &mut Self::Buf,
        ln: &mut Self::Buf,
        norm: NormFwd<'_, Self::Buf>,
        w: &Self::Buf,
        bias: Option<&Self::Buf>,
    ) -> bool {
        self.norm_fwd(ln, norm);
        self.gemm(call, out, ln, w, bias, None);
        true
    }

    /// Runs `norm` into `out` ([`Backend::rmsnorm_fwd`] or [`Backend::layernorm_fwd`]; statistics
    /// that are `ready` are computed again, to the same bits).
    fn norm_fwd(&mut self, out: &mut Self::Buf, norm: NormFwd<'_, Self::Buf>) {
        match norm {
            NormFwd::Rms { inp, w, rstd, c, eps, .. } => self.rmsnorm_fwd(out, rstd, inp, w, c, eps),
            NormFwd::Layer { inp, w, b, mean, rstd, c, .. } => self.layernorm_fwd(out, mean, rstd, inp, w, b, c),
        }
    }

    /// out = a + b ([`Backend::add`]), the residual add in front of a normalization whose row
    /// statistics `stats` names. A backend may compute them of out in the same pass, bit for bit
    /// as the normalization would, and then returns true: the normalization may take them as
    /// `ready` ([`NormFwd`]) instead of reading out again. Default: `add`, false.
    fn add_with_norm_stats(&mut self, out: &mut Self::Buf, a: &Self::Buf, b: &Self::Buf, stats: NormStats<'_, Self::Buf>) -> bool {
        let _ = stats;
        self.add(out, a, b);
        false
    }

    /// The step's forward and backward start (`signature`: the kind of step,
    /// [`crate::model::StepPlan::graph_signature`]); they end at [`Backend::end_step_work`]. A
    /// device backend may record the device work in between and launch it as graphs of an
    /// earlier step of the same kind, with the same results. Default: nothing.
    fn begin_step_work(&mut self, _signature: Option<u64>) {}
    /// The step's forward and backward are all called (see [`Backend::begin_step_work`]).
    fn end_step_work(&mut self) {}
    /// A hint that the step's GEMMs are all queued (the optimizer comes next): a device backend
    /// may start bringing their statistics to the host while the optimizer runs. `take_reports`
    /// is complete with or without it, and a GEMM after it is still reported.
    fn gemms_done(&mut self) {}

    /// The reports of every `gemm` since the last call, in call order.
    fn take_reports(&mut self) -> Vec<GemmReport>;

    /// The step just launched (its reports taken) will be launched again on the same weights (the
    /// anomaly replay of `train.rs`, with more statistics): whatever the backend carries from one
    /// step to the next and the launch changed is put back as it was before it. Default: nothing
    /// carried.
    fn repeat_step(&mut self) {}

    /// The first error of a primitive since the last call, in one line, and forgets it. A device
    /// backend whose primitive fails (a launch, an allocation, a copy) keeps the error, returns a
    /// harmless value in place of the result and skips the device work of every later primitive
    /// until this is called; the caller must then treat everything since the previous call as
    /// lost. The CPU backend never fails: None.
    fn take_error(&mut self) -> Option<String> {
        None
    }
}
