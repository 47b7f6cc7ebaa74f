//! The transformer, written once over the [`Backend`] trait: its parameters, activations, and the
//! forward and backward order. The plan of a step ([`StepPlan`]) says how each GEMM casts its
//! operands, which faults are active, what to measure and which tensors to dump; the model only
//! follows it.
//!
//! Pre-LN causal transformer: embedding (V,C) → L × [LN → qkv (C→3C) → attention → proj (C→C) →
//! residual; LN → fc1 (C→F) → GELU → fc2 (F→C) → residual] → LN → lm_head (C→V, no bias) →
//! cross-entropy. The four linears of each layer are the FP8 GEMM sites; the lm_head stays BF16.

use crate::backend::{Backend, GemmCall, GemmId, LinearDims, OperandCast, OperandFault, StatsLevel};
use fp8scope_schemas::config::{AttnMask, ModelDims};
use fp8scope_schemas::names::{Gemm, Module, Role, Site};
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};
use rand_pcg::Pcg64;
use std::collections::{HashMap, HashSet};

/// Model dimensions as plain sizes (N = B·T tokens per step).
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub v: usize,
    pub c: usize,
    pub f: usize,
    pub nh: usize,
    pub l: usize,
    pub b: usize,
    pub t: usize,
    pub n: usize,
    pub causal: bool,
}

impl Dims {
    pub fn from_model(m: &ModelDims) -> Dims {
        let (b, t) = (m.batch as usize, m.seq as usize);
        Dims {
            v: m.vocab as usize,
            c: m.channels as usize,
            f: m.ffn as usize,
            nh: m.heads as usize,
            l: m.layers as usize,
            b,
            t,
            n: b * t,
            causal: m.attn_mask == AttnMask::Causal,
        }
    }

    /// The linear layer dims of `module` (n tokens, k in, m out).
    pub fn linear(&self, module: Module) -> LinearDims {
        let (k, m) = match module {
            Module::Qkv => (self.c, 3 * self.c),
            Module::Proj => (self.c, self.c),
            Module::Fc1 => (self.c, self.f),
            Module::Fc2 => (self.f, self.c),
        };
        LinearDims { n: self.n, k, m }
    }
}

/// Parameters of one layer, in the order of [`LAYER_PARAMS`].
pub const LAYER_PARAMS: [&str; 12] =
    ["ln1_w", "ln1_b", "qkv_w", "qkv_b", "proj_w", "proj_b", "ln2_w", "ln2_b", "fc1_w", "fc1_b", "fc2_w", "fc2_b"];
const GLOBAL_PARAMS: usize = 4; // wte, lnf_w, lnf_b, lm_head
/// Index of the token embedding (V, C) in the flat parameter list.
pub const WTE: usize = 0;
const LNF_W: usize = 1;
const LNF_B: usize = 2;
const LM_HEAD: usize = 3;

/// Index of a layer parameter in the flat parameter list.
fn lp(layer: usize, j: usize) -> usize {
    GLOBAL_PARAMS + layer * LAYER_PARAMS.len() + j
}
const LN1_W: usize = 0;
const LN1_B: usize = 1;
const LN2_W: usize = 6;
const LN2_B: usize = 7;

/// (weight, bias) indices within a layer of a site's linear.
fn site_params(module: Module) -> (usize, usize) {
    match module {
        Module::Qkv => (2, 3),
        Module::Proj => (4, 5),
        Module::Fc1 => (8, 9),
        Module::Fc2 => (10, 11),
    }
}

/// Sizes of every parameter, in flat order; `param_count` checks the sum against the formula.
pub fn param_sizes(d: &Dims) -> Vec<usize> {
    let (v, c, f) = (d.v, d.c, d.f);
    let mut sizes = vec![v * c, c, c, v * c];
    for _ in 0..d.l {
        sizes.extend([c, c, 3 * c * c, 3 * c, c * c, c, c, c, f * c, f, c * f, c]);
    }
    sizes
}

/// Human names of the flat parameters (`layers.1.fc2_w`, `wte`, …).
pub fn param_names(d: &Dims) -> Vec<String> {
    let mut names: Vec<String> = ["wte", "lnf_w", "lnf_b", "lm_head"].iter().map(|s| s.to_string()).collect();
    for l in 0..d.l {
        names.extend(LAYER_PARAMS.iter().map(|p| format!("layers.{l}.{p}")));
    }
    names
}

/// Initial parameters: N(0, 0.02) for matrices (proj and fc2 scaled by 1/√(2L), GPT-2 style),
/// zero biases, unit LayerNorm gains.
pub fn init_params(d: &Dims, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = Pcg64::seed_from_u64(seed ^ 0x5EED_0F_1A7E);
    let std = 0.02f32;
    let resid_std = std / (2.0 * d.l as f32).sqrt();
    let names = param_names(d);
    param_sizes(d)
        .into_iter()
        .zip(names)
        .map(|(size, name)| {
            let suffix = name.rsplit('.').next().unwrap_or(&name).to_string();
            if suffix.starts_with("ln") && suffix.ends_with("_w") {
                vec![1.0; size]
            } else if suffix.ends_with("_b") {
                vec![0.0; size]
            } else {
                let s = if suffix == "proj_w" || suffix == "fc2_w" { resid_std } else { std };
                let normal = Normal::new(0.0f32, s).expect("finite std");
                (0..size).map(|_| normal.sample(&mut rng)).collect()
            }
        })
        .collect()
}

/// Relative size of the `--init-jitter` perturbation: half a BF16 ulp (BF16 keeps 8 significand
/// bits, so rounding to it moves a value by up to 2⁻⁹ of itself).
pub const INIT_JITTER_REL: f32 = 1.0 / 512.0;

/// Multiplies every value by 1 ± [`INIT_JITTER_REL`], the sign drawn from `seed` (a stream of its
/// own, so the weights' draw is unchanged). Zeros stay zeros.
pub fn jitter_params(params: &mut [Vec<f32>], seed: u64) {
    let mut rng = Pcg64::seed_from_u64(seed ^ 0x0717_7E12_5EED);
    for p in params.iter_mut() {
        for x in p.iter_mut() {
            let up: bool = rng.random();
            *x *= if up { 1.0 + INIT_JITTER_REL } else { 1.0 - INIT_JITTER_REL };
        }
    }
}

/// Activations of one layer saved for backward. Shapes in comments; N = B·T.
pub struct LayerActs<T> {
    pub ln1: T,      // (N, C)
    pub ln1_mean: T, // (N)
    pub ln1_rstd: T, // (N)
    pub qkv: T,      // (N, 3C)
    pub att: T,      // (B, NH, T, T)
    pub atty: T,     // (N, C)
    pub proj: T,     // (N, C)
    pub res2: T,     // (N, C) residual after attention
    pub ln2: T,      // (N, C)
    pub ln2_mean: T, // (N)
    pub ln2_rstd: T, // (N)
    pub fc1: T,      // (N, F)
    pub gelu: T,     // (N, F)
    pub fc2: T,      // (N, C)
}

/// Everything the model keeps on the device.
pub struct State<T> {
    pub params: Vec<T>,
    pub grads: Vec<T>,
    pub adam_m: Vec<T>,
    pub adam_v: Vec<T>,
    /// res[0] = embedding, res[l+1] = output of layer l. (L+1) × (N, C).
    pub res: Vec<T>,
    pub layers: Vec<LayerActs<T>>,
    pub lnf: T,      // (N, C)
    pub lnf_mean: T, // (N)
    pub lnf_rstd: T, // (N)
    pub logits: T,   // (N, V)
    pub dlogits: T,  // (N, V)
    pub losses: T,   // (N)
    // backward scratch
    pub dres: T,  // (N, C)
    pub dln: T,   // (N, C)
    pub dlnf: T,  // (N, C)
    pub datty: T, // (N, C)
    pub dqkv: T,  // (N, 3C)
    pub datt: T,  // (B, NH, T, T)
    pub dgelu: T, // (N, F)
    pub dfc1: T,  // (N, F)
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

/// The result of a forward + backward pass.
pub struct StepOutput {
    pub loss: f64,
    pub dumps: Vec<DumpCapture>,
}

pub struct Model<B: Backend> {
    pub dims: Dims,
    pub state: State<B::Buf>,
}

fn two_mut<T>(v: &mut [T], i: usize, j: usize) -> (&mut T, &mut T) {
    assert!(i < j);
    let (a, b) = v.split_at_mut(j);
    (&mut a[i], &mut b[0])
}

impl<B: Backend> Model<B> {
    /// A model with [`init_params`] of `seed`, jittered by [`jitter_params`] when `jitter` is set.
    pub fn new(be: &mut B, dims: Dims, seed: u64, jitter: Option<u64>) -> Model<B> {
        let mut host = init_params(&dims, seed);
        if let Some(j) = jitter {
            jitter_params(&mut host, j);
        }
        let params: Vec<B::Buf> = host.iter().map(|p| be.upload(p)).collect();
        let sizes = param_sizes(&dims);
        let mut zeros = |n: usize| be.zeros(n);
        let grads = sizes.iter().map(|&s| zeros(s)).collect();
        let adam_m = sizes.iter().map(|&s| zeros(s)).collect();
        let adam_v = sizes.iter().map(|&s| zeros(s)).collect();
        let Dims { v, c, f, nh, l, b, t, n, .. } = dims;
        let res = (0..=l).map(|_| zeros(n * c)).collect();
        let layers = (0..l)
            .map(|_| LayerActs {
                ln1: zeros(n * c),
                ln1_mean: zeros(n),
                ln1_rstd: zeros(n),
                qkv: zeros(n * 3 * c),
                att: zeros(b * nh * t * t),
                atty: zeros(n * c),
                proj: zeros(n * c),
                res2: zeros(n * c),
                ln2: zeros(n * c),
                ln2_mean: zeros(n),
                ln2_rstd: zeros(n),
                fc1: zeros(n * f),
                gelu: zeros(n * f),
                fc2: zeros(n * c),
            })
            .collect();
        let state = State {
            params,
            grads,
            adam_m,
            adam_v,
            res,
            layers,
            lnf: zeros(n * c),
            lnf_mean: zeros(n),
            lnf_rstd: zeros(n),
            logits: zeros(n * v),
            dlogits: zeros(n * v),
            losses: zeros(n),
            dres: zeros(n * c),
            dln: zeros(n * c),
            dlnf: zeros(n * c),
            datty: zeros(n * c),
            dqkv: zeros(n * 3 * c),
            datt: zeros(b * nh * t * t),
            dgelu: zeros(n * f),
            dfc1: zeros(n * f),
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
        // that casts it to FP8 (in `byte_sources`' order).
        let mut keep_quantized = [false; 2];
        if dumped {
            for role in [Role::Activation, Role::Weight, Role::Gradient] {
                let is_fp8 = |&&(g, i): &&(Gemm, usize)| {
                    let c = casts(&GemmId { layer: layer as u32, module, gemm: g });
                    !matches!(if i == 0 { c.0 } else { c.1 }, OperandCast::Bf16)
                };
                if let Some(&(g, i)) = crate::record::rows::byte_sources(role).iter().find(is_fp8)
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
        }
    }

    /// Samples `buf` (rows × cols) into `dumps` if the plan dumps `role` of this site.
    #[allow(clippy::too_many_arguments)]
    fn capture(be: &mut B, plan: &StepPlan, dumps: &mut Vec<DumpCapture>, layer: usize, module: Module, role: Role, buf: &B::Buf, rows: usize, cols: usize) {
        let site = Site::new(layer as u32, module);
        if !plan.dump_sites.contains(&site) || !plan.dump_roles.contains(&role) {
            return;
        }
        let (offset, len, stride) = dump_window(rows, cols, plan.dump_max_elems, plan.dump_strided);
        let values = be.download(buf, offset, len, stride);
        dumps.push(DumpCapture { site, role, shape: (rows, cols), offset, stride, values });
    }

    /// One linear layer's GEMM plus the dumps of its operands and result.
    #[allow(clippy::too_many_arguments)]
    fn linear(be: &mut B, call: &GemmCall, plan: &StepPlan, dumps: &mut Vec<DumpCapture>, out: &mut B::Buf, a: &B::Buf, b: &B::Buf, bias: Option<&B::Buf>, dbias: Option<&mut B::Buf>) {
        be.gemm(call, out, a, b, bias, dbias);
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

    /// Forward and backward over one batch; gradients end in `state.grads` (zeroed first).
    /// `supervised` is the number of targets that are not [`crate::layers::IGNORE_TARGET`]: the
    /// loss is the mean over them (0, with zero gradients, when there are none).
    pub fn forward_backward(&mut self, be: &mut B, inputs: &B::Tokens, targets: &B::Tokens, supervised: usize, plan: &StepPlan) -> StepOutput {
        let d = self.dims;
        let mut dumps = Vec::new();
        for g in self.state.grads.iter_mut() {
            be.fill_zero(g);
        }
        // ---- forward
        {
            let s = &mut self.state;
            be.embedding_fwd(&mut s.res[0], inputs, &s.params[WTE], d.c);
        }
        for l in 0..d.l {
            let calls: Vec<GemmCall> = Module::ALL.iter().map(|&m| self.call(plan, l, m, Gemm::Fprop)).collect();
            let s = &mut self.state;
            let (before, after) = s.res.split_at_mut(l + 1);
            let (res_in, res_out) = (&before[l], &mut after[0]);
            let a = &mut s.layers[l];
            let p = &s.params;
            be.layernorm_fwd(&mut a.ln1, &mut a.ln1_mean, &mut a.ln1_rstd, res_in, &p[lp(l, LN1_W)], &p[lp(l, LN1_B)], d.c);
            let (w, bi) = site_params(Module::Qkv);
            Self::linear(be, &calls[0], plan, &mut dumps, &mut a.qkv, &a.ln1, &p[lp(l, w)], Some(&p[lp(l, bi)]), None);
            be.attention_fwd(&mut a.atty, &mut a.att, &a.qkv, d.b, d.t, d.c, d.nh, d.nh, d.causal);
            let (w, bi) = site_params(Module::Proj);
            Self::linear(be, &calls[1], plan, &mut dumps, &mut a.proj, &a.atty, &p[lp(l, w)], Some(&p[lp(l, bi)]), None);
            be.add(&mut a.res2, res_in, &a.proj);
            be.layernorm_fwd(&mut a.ln2, &mut a.ln2_mean, &mut a.ln2_rstd, &a.res2, &p[lp(l, LN2_W)], &p[lp(l, LN2_B)], d.c);
            let (w, bi) = site_params(Module::Fc1);
            Self::linear(be, &calls[2], plan, &mut dumps, &mut a.fc1, &a.ln2, &p[lp(l, w)], Some(&p[lp(l, bi)]), None);
            be.gelu_fwd(&mut a.gelu, &a.fc1);
            let (w, bi) = site_params(Module::Fc2);
            Self::linear(be, &calls[3], plan, &mut dumps, &mut a.fc2, &a.gelu, &p[lp(l, w)], Some(&p[lp(l, bi)]), None);
            be.add(res_out, &a.res2, &a.fc2);
        }
        let s = &mut self.state;
        be.layernorm_fwd(&mut s.lnf, &mut s.lnf_mean, &mut s.lnf_rstd, &s.res[d.l], &s.params[LNF_W], &s.params[LNF_B], d.c);
        let head = LinearDims { n: d.n, k: d.c, m: d.v };
        be.matmul_bf16_fwd(&mut s.logits, &s.lnf, &s.params[LM_HEAD], head);
        let per = supervised.max(1);
        be.crossentropy(&mut s.losses, &mut s.dlogits, &s.logits, targets, d.v, 1.0 / per as f32);

        // ---- backward
        {
            be.matmul_bf16_bwd(&mut s.dlnf, &mut s.grads[LM_HEAD], &s.dlogits, &s.lnf, &s.params[LM_HEAD], head);
            be.fill_zero(&mut s.dres);
            let (g_lnf_w, g_lnf_b) = two_mut(&mut s.grads, LNF_W, LNF_B);
            be.layernorm_bwd(&mut s.dres, g_lnf_w, g_lnf_b, &s.dlnf, &s.res[d.l], &s.params[LNF_W], &s.lnf_mean, &s.lnf_rstd, d.c);
        }
        for l in (0..d.l).rev() {
            let dgrad: Vec<GemmCall> = Module::ALL.iter().map(|&m| self.call(plan, l, m, Gemm::Dgrad)).collect();
            let wgrad: Vec<GemmCall> = Module::ALL.iter().map(|&m| self.call(plan, l, m, Gemm::Wgrad)).collect();
            let s = &mut self.state;
            let a = &s.layers[l];
            let p = &s.params;
            // fc2
            let (w, bi) = site_params(Module::Fc2);
            Self::linear(be, &dgrad[3], plan, &mut dumps, &mut s.dgelu, &s.dres, &p[lp(l, w)], None, None);
            let (gw, gb) = two_mut(&mut s.grads, lp(l, w), lp(l, bi));
            Self::linear(be, &wgrad[3], plan, &mut dumps, gw, &s.dres, &a.gelu, None, Some(gb));
            be.gelu_bwd(&mut s.dfc1, &a.fc1, &s.dgelu);
            // fc1
            let (w, bi) = site_params(Module::Fc1);
            Self::linear(be, &dgrad[2], plan, &mut dumps, &mut s.dln, &s.dfc1, &p[lp(l, w)], None, None);
            let (gw, gb) = two_mut(&mut s.grads, lp(l, w), lp(l, bi));
            Self::linear(be, &wgrad[2], plan, &mut dumps, gw, &s.dfc1, &a.ln2, None, Some(gb));
            let (gw, gb) = two_mut(&mut s.grads, lp(l, LN2_W), lp(l, LN2_B));
            be.layernorm_bwd(&mut s.dres, gw, gb, &s.dln, &a.res2, &p[lp(l, LN2_W)], &a.ln2_mean, &a.ln2_rstd, d.c);
            // proj
            let (w, bi) = site_params(Module::Proj);
            Self::linear(be, &dgrad[1], plan, &mut dumps, &mut s.datty, &s.dres, &p[lp(l, w)], None, None);
            let (gw, gb) = two_mut(&mut s.grads, lp(l, w), lp(l, bi));
            Self::linear(be, &wgrad[1], plan, &mut dumps, gw, &s.dres, &a.atty, None, Some(gb));
            be.attention_bwd(&mut s.dqkv, &mut s.datt, &s.datty, &a.qkv, &a.att, d.b, d.t, d.c, d.nh, d.nh, d.causal);
            // qkv
            let (w, bi) = site_params(Module::Qkv);
            Self::linear(be, &dgrad[0], plan, &mut dumps, &mut s.dln, &s.dqkv, &p[lp(l, w)], None, None);
            let (gw, gb) = two_mut(&mut s.grads, lp(l, w), lp(l, bi));
            Self::linear(be, &wgrad[0], plan, &mut dumps, gw, &s.dqkv, &a.ln1, None, Some(gb));
            let (gw, gb) = two_mut(&mut s.grads, lp(l, LN1_W), lp(l, LN1_B));
            be.layernorm_bwd(&mut s.dres, gw, gb, &s.dln, &s.res[l], &p[lp(l, LN1_W)], &a.ln1_mean, &a.ln1_rstd, d.c);
        }
        let s = &mut self.state;
        be.embedding_bwd(&mut s.grads[WTE], &s.dres, inputs, d.c);
        // Read only now: a download waits for the device, and the backward is queued behind it.
        let losses = be.download(&s.losses, 0, d.n, 1);
        let loss = losses.iter().map(|&x| x as f64).sum::<f64>() / per as f64;
        StepOutput { loss, dumps }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_table_matches_the_parameter_count_formula() {
        let d = Dims { v: 512, c: 64, f: 256, nh: 4, l: 2, b: 8, t: 64, n: 512, causal: true };
        let total: usize = param_sizes(&d).iter().sum();
        let per_layer = 4 * d.c + 3 * d.c * d.c + 3 * d.c + d.c * d.c + d.c + 2 * d.f * d.c + d.f + d.c;
        assert_eq!(total, 2 * d.v * d.c + 2 * d.c + d.l * per_layer);
        assert_eq!(param_names(&d).len(), param_sizes(&d).len());
    }

    #[test]
    fn the_init_jitter_moves_every_weight_by_half_a_bf16_ulp_and_keeps_zeros() {
        let d = Dims { v: 512, c: 64, f: 256, nh: 4, l: 2, b: 8, t: 64, n: 512, causal: true };
        let base = init_params(&d, 7);
        let mut j1 = base.clone();
        jitter_params(&mut j1, 1);
        let mut j2 = base.clone();
        jitter_params(&mut j2, 2);
        let (mut up, mut down, mut differ) = (0usize, 0usize, 0usize);
        for ((b, a), c) in base.iter().flatten().zip(j1.iter().flatten()).zip(j2.iter().flatten()) {
            if *b == 0.0 {
                assert_eq!(*a, 0.0, "zeros stay zeros");
                continue;
            }
            let r = (*a as f64 - *b as f64) / *b as f64;
            assert!((r.abs() - 1.0 / 512.0).abs() < 1e-6, "relative change {r}");
            if r > 0.0 { up += 1 } else { down += 1 }
            differ += (a != c) as usize;
        }
        let n = up + down;
        assert!(up.abs_diff(down) < n / 50, "signs balanced: {up} up, {down} down");
        assert!(differ > n / 3, "another seed draws other signs: {differ} of {n}");
    }

    #[test]
    fn dump_windows_take_leading_rows_or_a_stride() {
        assert_eq!(dump_window(10, 4, 100, false), (0, 40, 1));
        assert_eq!(dump_window(100, 64, 200, false), (0, 192, 1));
        assert_eq!(dump_window(2, 1000, 200, false), (0, 200, 1));
        assert_eq!(dump_window(100, 64, 200, true), (0, 200, 32));
    }
}
