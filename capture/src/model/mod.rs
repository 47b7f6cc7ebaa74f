//! The transformer, written once per architecture over the [`Backend`] trait: its parameters
//! (`params.rs`), activations, and the forward and backward order (`gpt.rs`, `llama.rs`). The
//! plan of a step ([`StepPlan`]) says how each GEMM casts its operands, which faults are active,
//! what to measure and which tensors to dump; the model only follows it.
//!
//! Both architectures share the four FP8 GEMM sites of a layer (qkv, proj, fc1, fc2) and a BF16
//! lm_head:
//! - gpt: embedding (V,C) → L × [LN → qkv (C→3C) → attention → proj (C→C) → residual; LN → fc1
//!   (C→F) → GELU → fc2 (F→C) → residual] → LN → lm_head (C→V) → cross-entropy.
//! - llama: embedding → L × [RMSNorm → qkv (C → C + 2·KVH·HD) → RoPE on q, k → grouped-query
//!   attention → proj → residual; RMSNorm → fc1 (C → 2F: gate | up) → SwiGLU → fc2 (F→C) →
//!   residual] → RMSNorm → lm_head → cross-entropy. No biases.

mod gpt;
mod llama;
pub mod params;
pub mod tp;

use crate::backend::OperandFault;
use crate::backend::{Activation, Backend, GemmCall, GemmId, LinearDims, NormFwd, OperandCast, StatsLevel};
use fp8scope_schemas::config::{Accumulation, Arch, AttnMask, ModelDims};
use fp8scope_schemas::names::{Gemm, Module, Role, Site};
use std::collections::{HashMap, HashSet};

pub use params::{INIT_JITTER_REL, Layout, WTE, init_params, jitter_params, param_names, param_sizes};
pub use tp::TpLink;

/// Model dimensions as plain sizes (N = B·T tokens per step).
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub arch: Arch,
    pub v: usize,
    pub c: usize,
    pub f: usize,
    pub nh: usize,
    /// Key/value heads (= nh without grouped-query attention).
    pub kvh: usize,
    /// Head width C / NH.
    pub hd: usize,
    pub l: usize,
    pub b: usize,
    pub t: usize,
    pub n: usize,
    pub causal: bool,
    /// The lm_head is the token embedding.
    pub tied: bool,
    /// Rotary base (llama).
    pub rope_theta: f32,
    /// Norm epsilon (llama's RMSNorm; gpt's LayerNorm uses its own constant).
    pub eps: f32,
    /// Tensor-parallel ranks this layer stack is split over, and this one's index (1 and 0: the
    /// whole model). With tp > 1, `nh`, `kvh` and `f` are this rank's share (see [`tp`]).
    pub tp: usize,
    pub tp_rank: usize,
}

impl Dims {
    pub fn from_model(m: &ModelDims) -> Dims {
        let (b, t) = (m.batch as usize, m.seq as usize);
        Dims {
            arch: m.arch,
            v: m.vocab as usize,
            c: m.channels as usize,
            f: m.ffn as usize,
            nh: m.heads as usize,
            kvh: m.kv_heads() as usize,
            hd: m.head_dim() as usize,
            l: m.layers as usize,
            b,
            t,
            n: b * t,
            causal: m.attn_mask == AttnMask::Causal,
            tied: m.tie_embeddings,
            rope_theta: m.rope_theta.unwrap_or(crate::config::LLAMA_ROPE_THETA) as f32,
            eps: m.norm_eps.unwrap_or(crate::config::LLAMA_NORM_EPS) as f32,
            tp: 1,
            tp_rank: 0,
        }
    }

    /// Width of the attention's queries and output: NH·HD (= C on the whole model; this rank's
    /// heads under tensor parallelism).
    pub fn q_width(&self) -> usize {
        self.nh * self.hd
    }

    /// Width of a qkv row: NH·HD + 2·KVH·HD (C + 2·KVH·HD on the whole model).
    pub fn qkv_width(&self) -> usize {
        self.q_width() + 2 * self.kvh * self.hd
    }

    /// Width of fc1's output: F (GELU) or 2F (SwiGLU's gate and up).
    pub fn fc1_width(&self) -> usize {
        match self.arch {
            Arch::Gpt => self.f,
            Arch::Llama => 2 * self.f,
        }
    }

    /// The linear layer dims of `module` (n tokens, k in, m out).
    pub fn linear(&self, module: Module) -> LinearDims {
        let (k, m) = match module {
            Module::Qkv => (self.c, self.qkv_width()),
            Module::Proj => (self.q_width(), self.c),
            Module::Fc1 => (self.c, self.fc1_width()),
            Module::Fc2 => (self.f, self.c),
        };
        LinearDims { n: self.n, k, m }
    }
}

/// Activations of one layer saved for backward. Shapes in comments; N = B·T, Q = qkv width,
/// F1 = fc1 width. Buffers an architecture does not use are empty. "BF16" marks a GEMM's output,
/// allocated with [`Backend::zeros_bf16`].
///
/// The norms' outputs and the activation function's output are not saved per layer: they are
/// GEMM operands, which a backend that keeps its operand casts (the CUDA backend) never reads
/// again, so every layer writes them to one buffer ([`State::ln`], [`State::act`]) and the
/// backward recomputes a layer's from the saved inputs only where the backend says it will read
/// them ([`Backend::reuses_kept_cast`]). At llama-1b that is 6 GB less memory.
pub struct LayerActs<T> {
    pub ln1_mean: T, // (N) gpt
    pub ln1_rstd: T, // (N)
    pub qkv: T,      // (N, Q) gpt, BF16 (llama keeps only the rotated copy)
    pub qkv_rot: T,  // (N, Q) llama: what rope_attention_fwd saves (q and k rotated; on the GPU BF16, head-major)
    pub att: T,      // Backend::attention_saved_len
    pub atty: T,     // (N, NH·HD) BF16 (= C but for a tensor-parallel shard)
    pub res2: T,     // (N, C) residual after attention
    pub ln2_mean: T, // (N) gpt
    pub ln2_rstd: T, // (N)
    pub fc1: T,      // (N, F1) BF16
}

/// Everything the model keeps on the device.
pub struct State<T> {
    pub params: Vec<T>,
    /// BF16 where [`assigned_by_gemm`] (a linear weight's, assigned by its wgrad GEMM).
    pub grads: Vec<T>,
    pub adam_m: Vec<T>,
    pub adam_v: Vec<T>,
    /// res[0] = embedding, res[l+1] = output of layer l. (L+1) × (N, C).
    pub res: Vec<T>,
    pub layers: Vec<LayerActs<T>>,
    pub lnf: T,      // (N, C)
    pub lnf_mean: T, // (N) gpt
    pub lnf_rstd: T, // (N)
    pub logits: T,   // (N, V), a GEMM output (BF16 storage on a device); after the loss, its gradient
    pub losses: T,   // (N)
    // one buffer for every layer: GEMM operands recomputed in the backward where needed
    pub ln: T,        // (N, C) a norm's output: ln1, then ln2
    pub act: T,       // (N, F) GELU or SwiGLU output
    pub norm_mean: T, // (N) gpt: the recomputing LayerNorm's statistics (the saved ones stay)
    pub norm_rstd: T, // (N)
    // forward scratch: outputs no backward reads, one buffer for every layer
    pub qkv_pre: T, // (N, Q) llama: qkv before RoPE, BF16
    pub proj: T,    // (N, C) BF16
    pub fc2: T,     // (N, C) BF16
    // backward scratch
    pub dres: T,     // (N, C)
    pub dln: T,      // (N, C) BF16
    pub dlnf: T,     // (N, C)
    pub datty: T,    // (N, NH·HD) BF16
    pub dqkv: T,     // (N, Q) BF16 for gpt
    pub dqkv_rot: T, // (N, Q) llama
    pub datt: T,     // Backend::attention_saved_len
    pub dact: T,     // (N, F) BF16
    pub dfc1: T,     // (N, F1)
}

/// How every GEMM of one step runs and what the step records.
pub struct StepPlan {
    pub casts: HashMap<GemmId, (OperandCast, OperandCast)>,
    pub faults: HashMap<GemmId, (OperandFault, OperandFault, bool)>,
    pub stats: StatsLevel,
    /// Sites whose tensors are dumped this step, with the roles wanted.
    pub dump_sites: HashSet<Site>,
    pub dump_roles: Vec<Role>,
    pub dump_max_elems: usize,
    pub dump_strided: bool,
    pub shadow: bool,
    /// Which FP8 GEMMs accumulate fast (`RecipeConfig::accumulation`).
    pub accumulation: Accumulation,
}

impl StepPlan {
    /// Whether this step dumps `role`'s tensor at `site`.
    pub fn dumps(&self, site: Site, role: Role) -> bool {
        self.dump_sites.contains(&site) && self.dump_roles.contains(&role)
    }

    /// The kind of step this is, for a backend that replays a step's device work from a graph of
    /// an earlier one (the CUDA backend's `FP8SCOPE_GRAPH`): steps of one kind launch the same
    /// kernels in the same order but for their arguments (the delayed scales). The statistics
    /// level and the planted faults decide it; None for a step that dumps tensors or computes
    /// shadow GEMMs, which reads the device mid-step. The casts' kinds are the run's, the same
    /// every step.
    pub fn graph_signature(&self) -> Option<u64> {
        use std::hash::{Hash, Hasher};
        if !self.dump_sites.is_empty() {
            return None;
        }
        let bits = |f: &OperandFault| (f.scale_mult.to_bits(), f.outlier_factor.to_bits(), f.overflow_nan);
        let mut faults: Vec<_> = self.faults.iter().map(|(id, (fa, fb, nan))| (*id, bits(fa), bits(fb), *nan)).collect();
        faults.sort_by_key(|f| f.0);
        let mut h = std::hash::DefaultHasher::new();
        (self.stats as u8, self.shadow, self.accumulation).hash(&mut h);
        faults.hash(&mut h);
        Some(h.finish())
    }
}

/// Values of one tensor sampled at a dump step.
#[derive(Clone, Debug)]
pub struct DumpCapture {
    pub site: Site,
    pub role: Role,
    pub shape: (usize, usize),
    pub offset: usize,
    pub stride: usize,
    pub values: Vec<f32>,
}

/// Which elements a dump takes: (offset, len, stride). Leading whole rows (or the first
/// `max_elems` of the first row if a row is longer), or `max_elems` spread evenly.
pub fn dump_window(rows: usize, cols: usize, max_elems: usize, strided: bool) -> (usize, usize, usize) {
    let numel = rows * cols;
    let max = max_elems.max(1);
    if numel <= max {
        return (0, numel, 1);
    }
    if strided {
        let stride = numel.div_ceil(max);
        (0, numel.div_ceil(stride), stride)
    } else if cols <= max {
        (0, (max / cols) * cols, 1)
    } else {
        (0, max, 1)
    }
}

pub struct Model<B: Backend> {
    pub dims: Dims,
    pub state: State<B::Buf>,
}

/// Per parameter (in [`param_names`]' order): whether its gradient is assigned (`=`) by a GEMM
/// each step — a linear layer's weight, by its wgrad — rather than accumulated (the embedding, the
/// lm_head, norms and biases), so that it needs no zeroing before the step and holds BF16 values.
/// At llama-1b these are 88% of the parameters (3.9 GB of f32 gradients).
pub fn assigned_by_gemm(dims: &Dims) -> Vec<bool> {
    let lay = Layout::of(dims);
    let mut assigned = vec![false; param_sizes(dims).len()];
    for l in 0..dims.l {
        for m in Module::ALL {
            assigned[lay.linear(l, m).0] = true;
        }
    }
    assigned
}

pub(crate) fn two_mut<T>(v: &mut [T], i: usize, j: usize) -> (&mut T, &mut T) {
    assert!(i < j);
    let (a, b) = v.split_at_mut(j);
    (&mut a[i], &mut b[0])
}

impl<B: Backend> Model<B> {
    /// A model with [`init_params`] of `seed`, jittered by [`jitter_params`] when `jitter` is set.
    /// Under tensor parallelism (`dims.tp` > 1) the whole model's parameters are drawn and this
    /// rank keeps its shard of each ([`tp::shard_params`]), so that the ranks together hold the
    /// one-rank model of the seed.
    pub fn new(be: &mut B, dims: Dims, seed: u64, jitter: Option<u64>) -> Model<B> {
        let whole = dims.unsharded();
        let mut host = init_params(&whole, seed);
        if let Some(j) = jitter {
            jitter_params(&mut host, j);
        }
        if dims.tp > 1 {
            host = tp::shard_params(host, &whole, &dims);
        }
        let params: Vec<B::Buf> = host.iter().map(|p| be.upload(p)).collect();
        let sizes = param_sizes(&dims);
        let saved = be.attention_saved_len(dims.b, dims.t, dims.q_width(), dims.nh);
        // `alloc(n, true)` for a GEMM's output, BF16 by construction, which a backend may keep in 16
        // bits (Backend::zeros_bf16): fc1's and gpt's qkv (saved for the backward), the scratch
        // outputs that only one kernel reads, and the weight gradients a wgrad GEMM assigns;
        // llama's saved rotated qkv, which the GPU keeps as its attention's BF16 operands
        // (Backend::rope_attention_fwd); and the attention's outputs, which it rounds to BF16 as a
        // GEMM does: atty, and gpt's dqkv (llama's is rotated back after the rounding).
        let mut alloc = |n: usize, bf16: bool| if bf16 { be.zeros_bf16(n) } else { be.zeros(n) };
        let grads = sizes.iter().zip(assigned_by_gemm(&dims)).map(|(&s, bf16)| alloc(s, bf16)).collect();
        let adam_m = sizes.iter().map(|&s| alloc(s, false)).collect();
        let adam_v = sizes.iter().map(|&s| alloc(s, false)).collect();
        let Dims { v, c, f, l, n, .. } = dims;
        let (q, f1, qw) = (dims.qkv_width(), dims.fc1_width(), dims.q_width());
        let gpt = dims.arch == Arch::Gpt;
        // Buffers only one architecture uses.
        let only = |yes: bool, size: usize| if yes { size } else { 0 };
        let res = (0..=l).map(|_| alloc(n * c, false)).collect();
        let layers = (0..l)
            .map(|_| LayerActs {
                ln1_mean: alloc(only(gpt, n), false),
                ln1_rstd: alloc(n, false),
                qkv: alloc(only(gpt, n * q), true),
                qkv_rot: alloc(only(!gpt, n * q), true),
                att: alloc(saved, false),
                atty: alloc(n * qw, true),
                res2: alloc(n * c, false),
                ln2_mean: alloc(only(gpt, n), false),
                ln2_rstd: alloc(n, false),
                fc1: alloc(n * f1, true),
            })
            .collect();
        let state = State {
            params,
            grads,
            adam_m,
            adam_v,
            res,
            layers,
            lnf: alloc(n * c, false),
            lnf_mean: alloc(only(gpt, n), false),
            lnf_rstd: alloc(n, false),
            logits: alloc(n * v, true),
            losses: alloc(n, false),
            ln: alloc(n * c, false),
            act: alloc(n * f, false),
            norm_mean: alloc(only(gpt, n), false),
            norm_rstd: alloc(n, false),
            qkv_pre: alloc(only(!gpt, n * q), true),
            proj: alloc(n * c, true),
            fc2: alloc(n * c, true),
            dres: alloc(n * c, false),
            dln: alloc(n * c, true),
            dlnf: alloc(n * c, false),
            datty: alloc(n * qw, true),
            dqkv: alloc(n * q, gpt),
            dqkv_rot: alloc(only(!gpt, n * q), false),
            datt: alloc(saved, false),
            dact: alloc(n * f, true),
            dfc1: alloc(n * f1, false),
        };
        Model { dims, state }
    }

    fn call(&self, plan: &StepPlan, layer: usize, module: Module, gemm: Gemm) -> GemmCall {
        let id = GemmId { layer: layer as u32, module, gemm };
        let casts = |id: &GemmId| plan.casts.get(id).copied().unwrap_or((OperandCast::Bf16, OperandCast::Bf16));
        let (cast_a, cast_b) = casts(&id);
        let (fault_a, fault_b, nan_output) = plan.faults.get(&id).copied().unwrap_or_default();
        let dumped = plan.dump_sites.contains(&Site::new(layer as u32, module));
        // The operands whose FP8 bytes a dump takes: per quantized role, the first GEMM of the site
        // that casts it to FP8 (in `Role::operand_slots`' order, as `record::rows` reads them).
        let mut keep_quantized = [false; 2];
        if dumped {
            for role in [Role::Activation, Role::Weight, Role::Gradient] {
                let is_fp8 = |&&(g, i): &&(Gemm, usize)| {
                    let c = casts(&GemmId { layer: layer as u32, module, gemm: g });
                    !matches!(if i == 0 { c.0 } else { c.1 }, OperandCast::Bf16)
                };
                if let Some(&(g, i)) = role.operand_slots().iter().find(is_fp8)
                    && g == gemm
                {
                    keep_quantized[i] = true;
                }
            }
        }
        GemmCall {
            id,
            dims: self.dims.linear(module),
            cast_a,
            cast_b,
            fault_a,
            fault_b,
            nan_output,
            stats: plan.stats,
            keep_quantized,
            shadow: plan.shadow && dumped,
            fast_accumulation: plan.accumulation.is_fast(gemm),
            a_column_sums: gemm == Gemm::Dgrad && Layout::of(&self.dims).linear(layer, module).1.is_some(),
        }
    }

    /// Every layer's fprop calls, layer by layer in [`Module::ALL`]'s order: the calls the
    /// forward makes, and hands to [`Backend::cast_weights`] before it (one list for both, so that
    /// the weights a backend casts ahead are those of the calls that follow).
    fn fprop_calls(&self, plan: &StepPlan) -> Vec<GemmCall> {
        (0..self.dims.l).flat_map(|l| Module::ALL.iter().map(move |&m| (l, m))).map(|(l, m)| self.call(plan, l, m, Gemm::Fprop)).collect()
    }

    /// `calls` (the step's [`Self::fprop_calls`]) with their weights, handed to
    /// [`Backend::cast_weights`] before the forward (a backend may cast all the weights at once).
    fn cast_weights(&self, be: &mut B, calls: &[GemmCall]) {
        let lay = Layout::of(&self.dims);
        let weights: Vec<(GemmCall, &B::Buf)> = calls.iter().map(|c| (c.clone(), &self.state.params[lay.linear(c.id.layer as usize, c.id.module).0])).collect();
        be.cast_weights(&weights);
    }

    /// Samples `buf` (rows × cols) into `dumps` if the plan dumps `role` of this site.
    #[allow(clippy::too_many_arguments)]
    fn capture(be: &mut B, plan: &StepPlan, dumps: &mut Vec<DumpCapture>, layer: usize, module: Module, role: Role, buf: &B::Buf, rows: usize, cols: usize) {
        let site = Site::new(layer as u32, module);
        if !plan.dumps(site, role) {
            return;
        }
        let (offset, len, stride) = dump_window(rows, cols, plan.dump_max_elems, plan.dump_strided);
        let values = be.download(buf, offset, len, stride);
        dumps.push(DumpCapture { site, role, shape: (rows, cols), offset, stride, values });
    }

    /// One linear layer's GEMM plus the dumps of its operands and result.
    #[allow(clippy::too_many_arguments)]
    fn linear(
        be: &mut B,
        call: &GemmCall,
        plan: &StepPlan,
        dumps: &mut Vec<DumpCapture>,
        out: &mut B::Buf,
        a: &B::Buf,
        b: &B::Buf,
        bias: Option<&B::Buf>,
        dbias: Option<&mut B::Buf>,
    ) {
        be.gemm(call, out, a, b, bias, dbias);
        Self::captures(be, call, plan, dumps, out, a, b);
    }

    /// fc2's fprop, whose operand is the activation function `kind` of fc1's output `h`: the
    /// backend may compute it as it casts the operand ([`Backend::gemm_of_activation`]) unless this
    /// step dumps the activation or runs a shadow GEMM beside it (both read `act`). Returns whether
    /// `act` was written.
    #[allow(clippy::too_many_arguments)]
    fn linear_of_activation(
        be: &mut B,
        call: &GemmCall,
        plan: &StepPlan,
        dumps: &mut Vec<DumpCapture>,
        out: &mut B::Buf,
        act: &mut B::Buf,
        h: &B::Buf,
        kind: Activation,
        w: &B::Buf,
        bias: Option<&B::Buf>,
    ) -> bool {
        let written = if call.shadow || plan.dumps(Site::new(call.id.layer, call.id.module), Role::Activation) {
            be.activation_fwd(act, h, kind);
            be.gemm(call, out, act, w, bias, None);
            true
        } else {
            be.gemm_of_activation(call, out, act, h, kind, w, bias)
        };
        Self::captures(be, call, plan, dumps, out, act, w);
        written
    }

    /// qkv's or fc1's fprop, whose operand is the output `ln` of the normalization `norm`; as
    /// [`Self::linear_of_activation`] (the backend may compute the normalization as it casts the
    /// operand, [`Backend::gemm_of_norm`], unless a dump or a shadow GEMM reads `ln`). Returns
    /// whether `ln` was written.
    #[allow(clippy::too_many_arguments)]
    fn linear_of_norm(
        be: &mut B,
        call: &GemmCall,
        plan: &StepPlan,
        dumps: &mut Vec<DumpCapture>,
        out: &mut B::Buf,
        ln: &mut B::Buf,
        norm: NormFwd<'_, B::Buf>,
        w: &B::Buf,
        bias: Option<&B::Buf>,
    ) -> bool {
        let written = if call.shadow || plan.dumps(Site::new(call.id.layer, call.id.module), Role::Activation) {
            be.norm_fwd(ln, norm);
            be.gemm(call, out, ln, w, bias, None);
            true
        } else {
            be.gemm_of_norm(call, out, ln, norm, w, bias)
        };
        Self::captures(be, call, plan, dumps, out, ln, w);
        written
    }

    /// fc1's dgrad, whose operand is the activation function's backward at `h` from `dact`; as
    /// [`Self::linear_of_activation`] (the dump that needs `dh` is its gradient's).
    #[allow(clippy::too_many_arguments)]
    fn linear_of_activation_grad(
        be: &mut B,
        call: &GemmCall,
        plan: &StepPlan,
        dumps: &mut Vec<DumpCapture>,
        out: &mut B::Buf,
        dh: &mut B::Buf,
        h: &B::Buf,
        dact: &B::Buf,
        kind: Activation,
        w: &B::Buf,
    ) -> bool {
        let written = if call.shadow || plan.dumps(Site::new(call.id.layer, call.id.module), Role::Gradient) {
            be.activation_bwd(dh, h, dact, kind);
            be.gemm(call, out, dh, w, None, None);
            true
        } else {
            be.gemm_of_activation_grad(call, out, dh, h, dact, kind, w)
        };
        Self::captures(be, call, plan, dumps, out, dh, w);
        written
    }

    /// The dumps of a linear layer's GEMM: its operands and result, as the plan asks.
    fn captures(be: &mut B, call: &GemmCall, plan: &StepPlan, dumps: &mut Vec<DumpCapture>, out: &B::Buf, a: &B::Buf, b: &B::Buf) {
        let LinearDims { n, k, m } = call.dims;
        let (l, md) = (call.id.layer as usize, call.id.module);
        match call.id.gemm {
            Gemm::Fprop => {
                Self::capture(be, plan, dumps, l, md, Role::Activation, a, n, k);
                Self::capture(be, plan, dumps, l, md, Role::Weight, b, m, k);
                Self::capture(be, plan, dumps, l, md, Role::Output, out, n, m);
            }
            Gemm::Dgrad => {
                Self::capture(be, plan, dumps, l, md, Role::Gradient, a, n, m);
                Self::capture(be, plan, dumps, l, md, Role::Dgrad, out, n, k);
            }
            Gemm::Wgrad => Self::capture(be, plan, dumps, l, md, Role::Wgrad, out, m, k),
        }
    }

    /// Queues the forward and backward over one batch; gradients end in `state.grads` (zeroed
    /// first), and the per-token losses in `state.losses` ([`Self::step_loss`] reads them). Returns
    /// the tensors dumped on the way. `supervised` is the number of targets that are not
    /// [`crate::layers::IGNORE_TARGET`]: the loss is the mean over them (0, with zero gradients,
    /// when there are none). Nothing here waits for the device unless a dump is taken, so the
    /// caller may do host work while the step runs before it reads the loss.
    ///
    /// Under tensor parallelism (`dims.tp` > 1) `tp` is this rank's group: the row-parallel GEMMs'
    /// outputs and the column-parallel GEMMs' input gradients are all-reduced over it ([`tp`]); a
    /// model of one rank never calls it.
    pub fn launch_step(
        &mut self,
        be: &mut B,
        inputs: &B::Tokens,
        targets: &B::Tokens,
        supervised: usize,
        plan: &StepPlan,
        tp: &mut TpLink<'_>,
    ) -> Vec<DumpCapture> {
        // Only the gradients that accumulate start from zero (see `assigned_by_gemm`).
        let assigned = assigned_by_gemm(&self.dims);
        let mut accumulating: Vec<&mut B::Buf> = self.state.grads.iter_mut().zip(assigned).filter(|(_, assigned)| !assigned).map(|(g, _)| g).collect();
        be.fill_zero_all(&mut accumulating);
        let mut dumps = Vec::new();
        match self.dims.arch {
            Arch::Gpt => self.gpt_step(be, inputs, targets, supervised, plan, &mut dumps, tp),
            Arch::Llama => self.llama_step(be, inputs, targets, supervised, plan, &mut dumps, tp),
        }
        dumps
    }

    /// The mean loss of the step [`Self::launch_step`] queued, over its `supervised` targets: a
    /// download, which waits for the device to finish the backward queued before it.
    pub fn step_loss(&mut self, be: &mut B, supervised: usize) -> f64 {
        let losses = be.download(&self.state.losses, 0, self.dims.n, 1);
        losses.iter().map(|&x| x as f64).sum::<f64>() / supervised.max(1) as f64
    }

    /// The lm_head and the loss, forward and backward, from the final norm's output `lnf`:
    /// leaves the gradient of `lnf` in `dlnf`.
    fn head(&mut self, be: &mut B, targets: &B::Tokens, supervised: usize) {
        let d = self.dims;
        let head_w = Layout::of(&d).lm_head();
        let s = &mut self.state;
        let head = LinearDims { n: d.n, k: d.c, m: d.v };
        be.matmul_bf16_fwd(&mut s.logits, &s.lnf, &s.params[head_w], head);
        be.crossentropy(&mut s.losses, &mut s.logits, targets, d.v, 1.0 / supervised.max(1) as f32);
        be.matmul_bf16_bwd(&mut s.dlnf, &mut s.grads[head_w], &s.logits, &s.lnf, &s.params[head_w], head);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step that dumps has no graph signature; the faults' order does not matter, their values
    /// and the statistics level do; the casts' scales (which change every step) do not.
    #[test]
    fn graph_signatures_name_a_kind_of_step() {
        let id = |layer| GemmId { layer, module: Module::Fc2, gemm: Gemm::Dgrad };
        let scale = |s| OperandCast::Fp8Tensor { format: crate::fp8::Fp8Format::E4M3, scale: crate::backend::ScaleSource::Given { scale: s, amax_used: 1.0 } };
        let plan = |stats, mult: f32, s: f32| {
            let fault = OperandFault { scale_mult: mult, ..OperandFault::NONE };
            StepPlan {
                casts: [(id(0), (scale(s), scale(s)))].into_iter().collect(),
                faults: [(id(0), (fault, OperandFault::NONE, false)), (id(1), (OperandFault::NONE, fault, false))].into_iter().collect(),
                stats,
                dump_sites: HashSet::new(),
                dump_roles: Vec::new(),
                dump_max_elems: 0,
                dump_strided: false,
                shadow: false,
                accumulation: Accumulation::Split,
            }
        };
        let a = plan(StatsLevel::Cheap, 4.0, 1.0).graph_signature();
        assert!(a.is_some());
        for _ in 0..4 {
            assert_eq!(plan(StatsLevel::Cheap, 4.0, 2.0).graph_signature(), a, "another scale, the same kind (and any map order)");
        }
        assert_ne!(plan(StatsLevel::Cheap, 8.0, 1.0).graph_signature(), a);
        assert_ne!(plan(StatsLevel::Channels, 4.0, 1.0).graph_signature(), a);
        let mut dumping = plan(StatsLevel::Cheap, 4.0, 1.0);
        dumping.dump_sites.insert(Site::new(0, Module::Fc2));
        assert_eq!(dumping.graph_signature(), None);
    }

    #[test]
    fn dump_windows_take_leading_rows_or_a_stride() {
        assert_eq!(dump_window(10, 4, 100, false), (0, 40, 1));
        assert_eq!(dump_window(100, 64, 200, false), (0, 192, 1));
        assert_eq!(dump_window(2, 1000, 200, false), (0, 200, 1));
        assert_eq!(dump_window(100, 64, 200, true), (0, 200, 32));
    }
}
