//! The CPU backend: the numeric reference. Layers come from `crate::layers` (f32, deterministic,
//! rayon-parallel), GEMMs from `matrixmultiply` with FP32 accumulation over operands that
//! [`cast::cast_operand`] rounded to BF16 or cast to FP8 exactly; GEMM outputs are rounded to BF16.

pub mod cast;
mod hopper;

use crate::backend::operands::operand_shapes;
use crate::backend::{AdamW, Backend, GemmCall, GemmId, GemmReport, LinearDims, OperandCast, OperandFault, ScaleSource, ShadowError, StatsLevel};
use crate::layers;
use crate::tensor_stats;
use crate::weight_motion::WeightMotion;
use cast::{cast_operand, round_bf16_inplace};
use fp8scope_schemas::manifest::DeviceInfo;
use fp8scope_schemas::names::{Gemm, Module};
use rayon::prelude::*;
use std::collections::HashMap;

pub use fp8scope_schemas::config::CpuAccumulator;

/// The CPU device: holds the queue of GEMM reports and the last RoPE table.
#[derive(Default)]
pub struct CpuBackend {
    reports: Vec<GemmReport>,
    /// The shadowed fprops of this step that wait for their output's gradient: (FP8 output, BF16
    /// output) by site, paired with dY by the first gradient GEMM of the site (`pair_fprop_error`).
    fprop_errors: HashMap<(u32, Module), (Vec<f32>, Vec<f32>)>,
    /// Each FP8 fprop weight as of the last recorded step, by site: where [`crate::weight_motion`]
    /// measures its motion from.
    prev_weights: HashMap<(u32, Module), Vec<f32>>,
    /// What this step's casts replaced in `prev_weights` (None: nothing was there), since
    /// `begin_step_work`, for [`Backend::repeat_step`].
    replaced_weights: HashMap<(u32, Module), Option<Vec<f32>>>,
    /// The cosines and sines of `layers::rope_table` for (T, HD, theta's bits), kept across calls.
    rope: Option<((usize, usize, u32), Vec<f32>)>,
    /// How per-tensor FP8 GEMMs accumulate (`--cpu-accumulator`).
    accumulator: CpuAccumulator,
    /// Tests only: `take_error` reports a planted failure once `take_reports` has run this many
    /// times (a device backend failing mid-run, for the training loop's error path).
    #[cfg(test)]
    pub(crate) fail_after_steps: Option<u32>,
    #[cfg(test)]
    steps_taken: u32,
}

impl CpuBackend {
    pub fn new() -> CpuBackend {
        CpuBackend::default()
    }

    /// The backend of a run's recipe: its FP8 GEMMs accumulate as `recipe.cpu_accumulator` says.
    pub fn for_recipe(recipe: &fp8scope_schemas::config::RecipeConfig) -> CpuBackend {
        let mut be = CpuBackend::new();
        be.set_accumulator(recipe.cpu_accumulator);
        be
    }

    /// How per-tensor FP8 GEMMs accumulate from now on: in FP32, or as Hopper's tensor cores do
    /// in the mode of each call's `fast_accumulation` (`crate::accumulator`). GEMMs with a BF16
    /// or block-scaled operand accumulate in FP32 either way.
    pub fn set_accumulator(&mut self, accumulator: CpuAccumulator) {
        self.accumulator = accumulator;
    }

    /// Pairs the error of the site's shadowed fprop of this step, if one waits, with its output's
    /// gradient `dy` (operand a of the site's dgrad and wgrad): ⟨δY, dY⟩, the change of the step's
    /// loss the fprop's FP8 error makes, to first order.
    fn pair_fprop_error(&mut self, layer: u32, module: Module, dy: &[f32]) {
        let Some((test, reference)) = self.fprop_errors.remove(&(layer, module)) else { return };
        let (inner, norm) = tensor_stats::error_inner(&test, &reference, dy);
        let fprop = GemmId { layer, module, gemm: Gemm::Fprop };
        if let Some(s) = self.reports.iter_mut().rev().find(|r| r.id == fprop).and_then(|r| r.shadow.as_mut()) {
            s.dual_inner = Some(inner);
            s.dual_norm = Some(norm);
        }
    }

    /// The motion of the fprop weight `w` (cast as `how` with `fault` into `cast`) since this site's
    /// last recorded step, and `w` kept for the next: per-tensor FP8 casts only (a block or
    /// micro-scaled grid changes with each block's amax). The previous weight is quantized on this
    /// step's grid, so a scale change is not motion.
    fn weight_motion(&mut self, id: GemmId, w: &[f32], how: OperandCast, fault: OperandFault, cast: &cast::Cast, dims: (usize, usize)) -> Option<WeightMotion> {
        let OperandCast::Fp8Tensor { format, .. } = how else { return None };
        let site = (id.layer, id.module);
        let prev = self.prev_weights.insert(site, w.to_vec());
        let motion = prev.as_ref().filter(|p| p.len() == w.len()).map(|prev| {
            // This step's grid: the scale the cast used, before the planted mis-scale it applies again.
            let grid =
                OperandCast::Fp8Tensor { format, scale: ScaleSource::Given { scale: cast.report.scale / fault.scale_mult, amax_used: cast.report.amax_used } };
            let q_prev = cast_operand(prev, dims.0, dims.1, grid, fault, StatsLevel::Amax, false).dequantized;
            let mut motion = crate::weight_motion::weight_motion(prev, w, &q_prev, &cast.dequantized);
            // Counted in the weight's own units: a planted mis-scale dequantizes the cast × scale_mult
            // (the quantization bias reports that), which would read as a motion × scale_mult.
            motion.quant_change /= f64::from(fault.scale_mult);
            motion
        });
        self.replaced_weights.insert(site, prev);
        motion
    }

    /// The RoPE table for (t, hd, theta), computed on the first call with these dimensions.
    fn rope_table(&mut self, t: usize, hd: usize, theta: f32) -> &[f32] {
        let key = (t, hd, theta.to_bits());
        if self.rope.as_ref().is_none_or(|(k, _)| *k != key) {
            self.rope = Some((key, layers::rope::rope_table(t, hd, theta)));
        }
        self.rope.as_ref().map_or(&[], |(_, tab)| tab.as_slice())
    }
}

/// The f32 GEMM of `gemm` kind over already-cast operands; `out` is overwritten.
fn raw_gemm(gemm: Gemm, out: &mut [f32], a: &[f32], b: &[f32], bias: Option<&[f32]>, d: LinearDims) {
    match gemm {
        Gemm::Fprop => layers::matmul::matmul_fwd(out, a, b, bias, d.n, d.k, d.m),
        Gemm::Dgrad => layers::matmul::matmul_dgrad(out, a, b, d.n, d.k, d.m),
        Gemm::Wgrad => {
            out.iter_mut().for_each(|v| *v = 0.0);
            layers::matmul::matmul_wgrad(out, None, a, b, d.n, d.k, d.m)
        }
    }
}

fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).map(|s| s.trim().to_string()))
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

impl Backend for CpuBackend {
    type Buf = Vec<f32>;
    type Tokens = Vec<u32>;

    fn kind(&self) -> &'static str {
        "cpu"
    }

    fn device_info(&self) -> DeviceInfo {
        DeviceInfo { kind: "cpu".into(), name: cpu_name(), compute_capability: None, parallelism: rayon::current_num_threads() as u32, block_gemm: None }
    }

    fn zeros(&mut self, n: usize) -> Vec<f32> {
        vec![0.0; n]
    }
    fn upload(&mut self, data: &[f32]) -> Vec<f32> {
        data.to_vec()
    }
    fn upload_tokens(&mut self, tokens: &[u32]) -> Vec<u32> {
        tokens.to_vec()
    }
    fn download(&mut self, buf: &Vec<f32>, offset: usize, len: usize, stride: usize) -> Vec<f32> {
        (0..len).map(|i| buf[offset + i * stride]).collect()
    }
    fn overwrite(&mut self, buf: &mut Vec<f32>, data: &[f32]) {
        buf.copy_from_slice(data);
    }
    fn len(&self, buf: &Vec<f32>) -> usize {
        buf.len()
    }
    fn fill_zero(&mut self, buf: &mut Vec<f32>) {
        buf.par_chunks_mut(1 << 16).for_each(|c| c.fill(0.0));
    }

    fn embedding_fwd(&mut self, out: &mut Vec<f32>, tokens: &Vec<u32>, wte: &Vec<f32>, c: usize) {
        layers::embedding::embedding_fwd(out, tokens, wte, c)
    }
    fn embedding_bwd(&mut self, dwte: &mut Vec<f32>, dout: &Vec<f32>, tokens: &Vec<u32>, c: usize) {
        layers::embedding::embedding_bwd(dwte, dout, tokens, c)
    }
    fn layernorm_fwd(&mut self, out: &mut Vec<f32>, mean: &mut Vec<f32>, rstd: &mut Vec<f32>, inp: &Vec<f32>, w: &Vec<f32>, b: &Vec<f32>, c: usize) {
        layers::layernorm::layernorm_fwd(out, mean, rstd, inp, w, b, c)
    }
    fn layernorm_bwd(
        &mut self,
        dinp: &mut Vec<f32>,
        dw: &mut Vec<f32>,
        db: &mut Vec<f32>,
        dout: &Vec<f32>,
        inp: &Vec<f32>,
        w: &Vec<f32>,
        mean: &Vec<f32>,
        rstd: &Vec<f32>,
        c: usize,
    ) {
        layers::layernorm::layernorm_bwd(dinp, dw, db, dout, inp, w, mean, rstd, c)
    }
    fn rmsnorm_fwd(&mut self, out: &mut Vec<f32>, rstd: &mut Vec<f32>, inp: &Vec<f32>, w: &Vec<f32>, c: usize, eps: f32) {
        layers::rmsnorm::rmsnorm_fwd(out, rstd, inp, w, c, eps)
    }
    fn rmsnorm_bwd(&mut self, dinp: &mut Vec<f32>, dw: &mut Vec<f32>, dout: &Vec<f32>, inp: &Vec<f32>, w: &Vec<f32>, rstd: &Vec<f32>, c: usize) {
        layers::rmsnorm::rmsnorm_bwd(dinp, dw, dout, inp, w, rstd, c)
    }
    fn swiglu_fwd(&mut self, out: &mut Vec<f32>, inp: &Vec<f32>, f: usize) {
        layers::swiglu::swiglu_fwd(out, inp, f)
    }
    fn swiglu_bwd(&mut self, dinp: &mut Vec<f32>, inp: &Vec<f32>, dout: &Vec<f32>, f: usize) {
        layers::swiglu::swiglu_bwd(dinp, inp, dout, f)
    }
    fn rope_fwd(&mut self, out: &mut Vec<f32>, qkv: &Vec<f32>, b: usize, t: usize, nh: usize, kvh: usize, hd: usize, theta: f32) {
        let tab = self.rope_table(t, hd, theta);
        layers::rope::rope_fwd(out, qkv, tab, b, t, nh, kvh, hd)
    }
    fn rope_bwd(&mut self, dqkv: &mut Vec<f32>, dout: &Vec<f32>, b: usize, t: usize, nh: usize, kvh: usize, hd: usize, theta: f32) {
        let tab = self.rope_table(t, hd, theta);
        layers::rope::rope_bwd(dqkv, dout, tab, b, t, nh, kvh, hd)
    }
    fn attention_fwd(&mut self, out: &mut Vec<f32>, att: &mut Vec<f32>, qkv: &Vec<f32>, b: usize, t: usize, c: usize, nh: usize, kvh: usize, causal: bool) {
        layers::attention::attention_fwd(out, att, qkv, b, t, c, nh, kvh, causal);
        round_bf16_inplace(out);
    }
    fn attention_bwd(
        &mut self,
        dqkv: &mut Vec<f32>,
        datt: &mut Vec<f32>,
        dout: &Vec<f32>,
        _out: &Vec<f32>,
        qkv: &Vec<f32>,
        att: &Vec<f32>,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
        kvh: usize,
        causal: bool,
    ) {
        layers::attention::attention_bwd(dqkv, datt, dout, qkv, att, b, t, c, nh, kvh, causal);
        round_bf16_inplace(dqkv);
    }
    fn gelu_fwd(&mut self, out: &mut Vec<f32>, inp: &Vec<f32>) {
        layers::gelu::gelu_fwd(out, inp)
    }
    fn gelu_bwd(&mut self, dinp: &mut Vec<f32>, inp: &Vec<f32>, dout: &Vec<f32>) {
        layers::gelu::gelu_bwd(dinp, inp, dout)
    }
    fn add(&mut self, out: &mut Vec<f32>, a: &Vec<f32>, b: &Vec<f32>) {
        layers::residual::residual_fwd(out, a, b)
    }
    fn add_inplace(&mut self, acc: &mut Vec<f32>, x: &Vec<f32>) {
        layers::residual::add_inplace(acc, x)
    }
    fn round_bf16(&mut self, x: &mut Vec<f32>) {
        round_bf16_inplace(x)
    }
    fn matmul_bf16_fwd(&mut self, out: &mut Vec<f32>, inp: &Vec<f32>, w: &Vec<f32>, d: LinearDims) {
        let mut a = inp.clone();
        let mut b = w.clone();
        round_bf16_inplace(&mut a);
        round_bf16_inplace(&mut b);
        layers::matmul::matmul_fwd(out, &a, &b, None, d.n, d.k, d.m);
        round_bf16_inplace(out);
    }
    fn matmul_bf16_bwd(&mut self, dinp: &mut Vec<f32>, dw: &mut Vec<f32>, dout: &Vec<f32>, inp: &Vec<f32>, w: &Vec<f32>, d: LinearDims) {
        let mut g = dout.clone();
        let mut x = inp.clone();
        let mut b = w.clone();
        round_bf16_inplace(&mut g);
        round_bf16_inplace(&mut x);
        round_bf16_inplace(&mut b);
        layers::matmul::matmul_dgrad(dinp, &g, &b, d.n, d.k, d.m);
        round_bf16_inplace(dinp);
        let mut dw_step = vec![0.0; d.m * d.k];
        layers::matmul::matmul_wgrad(&mut dw_step, None, &g, &x, d.n, d.k, d.m);
        round_bf16_inplace(&mut dw_step);
        self.add_inplace(dw, &dw_step);
    }
    fn crossentropy(&mut self, losses: &mut Vec<f32>, logits: &mut Vec<f32>, targets: &Vec<u32>, v: usize, dloss: f32) {
        let input = logits.clone();
        layers::loss::crossentropy_fwd_bwd(losses, logits, &input, targets, v, dloss)
    }
    fn sumsq(&mut self, x: &Vec<f32>) -> f64 {
        let parts: Vec<f64> = x.par_chunks(1 << 15).map(|c| c.iter().map(|&v| (v as f64) * (v as f64)).sum()).collect();
        parts.into_iter().sum()
    }
    fn count_nonfinite(&mut self, x: &Vec<f32>) -> u64 {
        x.par_chunks(1 << 15).map(|c| c.iter().filter(|v| !v.is_finite()).count() as u64).sum()
    }
    fn adamw(&mut self, p: &mut Vec<f32>, g: &Vec<f32>, m: &mut Vec<f32>, v: &mut Vec<f32>, h: &AdamW) {
        if h.grad_scale == 1.0 {
            layers::adamw::adamw_update(p, g, m, v, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.t)
        } else {
            let scaled: Vec<f32> = g.par_iter().map(|&x| x * h.grad_scale).collect();
            layers::adamw::adamw_update(p, &scaled, m, v, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.t)
        }
    }

    fn gemm(&mut self, call: &GemmCall, out: &mut Vec<f32>, a: &Vec<f32>, b: &Vec<f32>, bias: Option<&Vec<f32>>, dbias: Option<&mut Vec<f32>>) {
        let [(ar, ac), (br, bc)] = operand_shapes(call.id.gemm, call.dims);
        let ca = cast_operand(a, ar, ac, call.cast_a, call.fault_a, call.stats, call.keep_quantized[0]);
        let cb = cast_operand(b, br, bc, call.cast_b, call.fault_b, call.stats, call.keep_quantized[1]);
        let bias_bf16: Option<Vec<f32>> = bias.map(|b| {
            let mut b = b.clone();
            round_bf16_inplace(&mut b);
            b
        });
        match (self.accumulator, &ca.codes, &cb.codes) {
            (CpuAccumulator::Hopper, Some(qa), Some(qb)) => {
                let mode = if call.fast_accumulation { crate::accumulator::Mode::Fast } else { crate::accumulator::Mode::Split };
                out.copy_from_slice(&hopper::linear_gemm(call.id.gemm, qa, qb, bias_bf16.as_deref(), call.dims, mode));
            }
            _ => {
                raw_gemm(call.id.gemm, out, &ca.dequantized, &cb.dequantized, bias_bf16.as_deref(), call.dims);
                round_bf16_inplace(out);
            }
        }
        if let Some(db) = dbias {
            // Column sums of dY in BF16-rounded operand precision, as the bias gradient.
            let m = call.dims.m;
            // Under NVFP4's Hadamard transform the cast dY is in the rotated basis, whose column
            // sums are not dY's: sum it back in the original basis.
            let unrotated;
            let dy = match call.cast_a {
                OperandCast::Nvfp4 { rht: true, .. } => {
                    unrotated = crate::micro::rht::inverse_transform_rows(&ca.dequantized, call.dims.n, m);
                    &unrotated
                }
                _ => &ca.dequantized,
            };
            let sums: Vec<f32> = (0..m).into_par_iter().map(|j| (0..call.dims.n).map(|i| dy[i * m + j]).sum::<f32>()).collect();
            db.iter_mut().zip(sums).for_each(|(d, s)| *d += s);
        }
        let is_fp8 = !matches!(call.cast_a, OperandCast::Bf16) || !matches!(call.cast_b, OperandCast::Bf16);
        let shadow = (call.shadow && is_fp8).then(|| {
            let ra = cast_operand(a, ar, ac, OperandCast::Bf16, Default::default(), crate::backend::StatsLevel::Amax, false);
            let rb = cast_operand(b, br, bc, OperandCast::Bf16, Default::default(), crate::backend::StatsLevel::Amax, false);
            let mut reference = vec![0.0; out.len()];
            raw_gemm(call.id.gemm, &mut reference, &ra.dequantized, &rb.dequantized, bias_bf16.as_deref(), call.dims);
            round_bf16_inplace(&mut reference);
            let (cosine, mse, rel_l2, max_abs_diff) = tensor_stats::output_error(out, &reference);
            // A gradient's dual is its BF16 value; an fprop's, dY, comes with the backward.
            let (dual_inner, dual_norm) = match call.id.gemm {
                Gemm::Fprop => {
                    self.fprop_errors.insert((call.id.layer, call.id.module), (out.clone(), reference));
                    (None, None)
                }
                _ => {
                    let (inner, norm) = tensor_stats::error_inner(out, &reference, &reference);
                    (Some(inner), Some(norm))
                }
            };
            ShadowError { numel: out.len() as u64, cosine, mse, rel_l2, max_abs_diff, dual_inner, dual_norm }
        });
        if call.id.gemm != Gemm::Fprop {
            self.pair_fprop_error(call.id.layer, call.id.module, a);
        }
        if call.nan_output && !out.is_empty() {
            out[0] = f32::NAN;
        }
        let output_nonfinite = self.count_nonfinite(out);
        let motion = (call.id.gemm == Gemm::Fprop && call.stats >= StatsLevel::Cheap)
            .then(|| self.weight_motion(call.id, b, call.cast_b, call.fault_b, &cb, (br, bc)))
            .flatten();
        let [role_a, role_b] = call.id.gemm.operands();
        let mut ra = ca.report;
        let mut rb = cb.report;
        rb.weight_motion = motion;
        ra.role = Some(role_a);
        rb.role = Some(role_b);
        self.reports.push(GemmReport { id: call.id, a: ra, b: rb, shadow, output_nonfinite });
    }

    fn take_reports(&mut self) -> Vec<GemmReport> {
        self.fprop_errors.clear();
        #[cfg(test)]
        {
            self.steps_taken += 1;
        }
        std::mem::take(&mut self.reports)
    }

    fn begin_step_work(&mut self, _signature: Option<u64>) {
        self.replaced_weights.clear();
    }

    fn repeat_step(&mut self) {
        for (site, prev) in std::mem::take(&mut self.replaced_weights) {
            match prev {
                Some(w) => self.prev_weights.insert(site, w),
                None => self.prev_weights.remove(&site),
            };
        }
    }

    #[cfg(test)]
    fn take_error(&mut self) -> Option<String> {
        match self.fail_after_steps {
            Some(n) if self.steps_taken >= n => {
                self.fail_after_steps = None;
                Some(format!("planted failure in step {n}"))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::GemmId;
    use fp8scope_schemas::names::Module;

    /// The bias gradient of a wgrad whose dY went through NVFP4's Hadamard transform is the column
    /// sums of dY, not of its rotation (which keep only a signed 4 × the first row of each run of 16).
    #[test]
    fn the_bias_gradient_under_the_hadamard_transform_sums_dy_in_its_own_basis() {
        let d = LinearDims { n: 64, k: 8, m: 8 };
        let dy: Vec<f32> = (0..d.n * d.m).map(|i| ((i * 37 % 23) as f32 - 11.0) / 8.0 + (i % d.m) as f32 * 0.25).collect();
        let x: Vec<f32> = (0..d.n * d.k).map(|i| ((i * 11 % 17) as f32 - 8.0) / 4.0).collect();
        let want: Vec<f64> = (0..d.m).map(|j| (0..d.n).map(|i| f64::from(dy[i * d.m + j])).sum()).collect();
        for rht in [false, true] {
            let mut call = GemmCall::bf16(GemmId { layer: 0, module: Module::Fc2, gemm: Gemm::Wgrad }, d);
            call.cast_a = OperandCast::Nvfp4 { tile_rows: 16, tile_cols: 1, rht, stochastic_seed: None };
            call.cast_b = OperandCast::Nvfp4 { tile_rows: 16, tile_cols: 1, rht, stochastic_seed: None };
            let mut be = CpuBackend::new();
            let (mut out, mut db) = (vec![0f32; d.m * d.k], vec![0f32; d.m]);
            be.gemm(&call, &mut out, &dy, &x, None, Some(&mut db));
            for j in 0..d.m {
                let err = (f64::from(db[j]) - want[j]).abs();
                // NVFP4 keeps 1 mantissa bit: each element within 1/4 of its block's scale; 64 of them.
                assert!(err < 0.08 * want.iter().map(|v| v.abs()).fold(1.0, f64::max), "rht {rht}, column {j}: {} vs {}", db[j], want[j]);
            }
        }
    }

    /// Under `--cpu-accumulator hopper`, each FP8 GEMM kind (its operands in their row-major
    /// layouts, transposed for the emulation) gives the FP32 GEMM's output to within the
    /// emulation's truncation and BF16 rounding, changes some bits of it (the emulation ran), and
    /// depends on the call's mode; BF16 GEMMs are untouched.
    #[test]
    fn the_hopper_accumulator_changes_fp8_gemms_within_their_rounding_and_leaves_bf16_alone() {
        use crate::backend::{OperandCast, ScaleSource};
        use crate::fp8::Fp8Format;
        // Every K (k, m, n for the three kinds) past one promotion interval of 128.
        let d = LinearDims { n: 160, k: 160, m: 192 };
        let x: Vec<f32> = (0..d.n * d.k).map(|i| ((i as f32) * 0.37).sin() * 3.0).collect();
        let w: Vec<f32> = (0..d.m * d.k).map(|i| ((i as f32) * 0.11).cos() * 0.2).collect();
        let dy: Vec<f32> = (0..d.n * d.m).map(|i| ((i as f32) * 0.53).sin() * 0.01).collect();
        let bias: Vec<f32> = (0..d.m).map(|j| j as f32 * 0.01).collect();
        let e4 = OperandCast::Fp8Tensor { format: Fp8Format::E4M3, scale: ScaleSource::Current { margin: 0 } };
        let e5 = OperandCast::Fp8Tensor { format: Fp8Format::E5M2, scale: ScaleSource::Current { margin: 0 } };
        for gemm in Gemm::ALL {
            let (a, b, len, cast_a, bias) = match gemm {
                Gemm::Fprop => (&x, &w, d.n * d.m, e4, Some(&bias)),
                Gemm::Dgrad => (&dy, &w, d.n * d.k, e5, None),
                Gemm::Wgrad => (&dy, &x, d.m * d.k, e5, None),
            };
            let base = GemmCall::bf16(GemmId { layer: 0, module: Module::Fc1, gemm }, d);
            let run = |acc: CpuAccumulator, call: &GemmCall| {
                let mut be = CpuBackend::new();
                be.set_accumulator(acc);
                let mut out = vec![0f32; len];
                be.gemm(call, &mut out, a, b, bias, None);
                out
            };
            let bf16 = [run(CpuAccumulator::Exact, &base), run(CpuAccumulator::Hopper, &base)];
            assert_eq!(bf16[0], bf16[1], "{gemm}: a BF16 GEMM is not emulated");
            let split = GemmCall { cast_a, cast_b: e4, ..base.clone() };
            let fast = GemmCall { fast_accumulation: true, ..split.clone() };
            let exact = run(CpuAccumulator::Exact, &split);
            let (hs, hf) = (run(CpuAccumulator::Hopper, &split), run(CpuAccumulator::Hopper, &fast));
            let norm = exact.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
            for (label, got) in [("split", &hs), ("fast", &hf)] {
                let err = got.iter().zip(&exact).map(|(p, q)| f64::from(p - q).powi(2)).sum::<f64>().sqrt();
                let differ = got.iter().zip(&exact).filter(|(p, q)| p.to_bits() != q.to_bits()).count();
                // BF16 rounding of either (2^-8 relative) dominates the 2^-13 truncations.
                assert!(err <= 8e-3 * norm, "{gemm} {label}: rel L2 {}", err / norm);
                assert!(differ > 0, "{gemm} {label}: no output changed; the emulation did not run");
            }
            assert!(hs != hf, "{gemm}: split and fast accumulation give the same bits");
        }
    }

    #[test]
    fn the_cpu_backend_never_keeps_an_error() {
        let mut be = CpuBackend::new();
        assert_eq!(be.take_error(), None);
        // Not even for values a device backend would flag, nor after a step's reports.
        let x = be.upload(&[1.0, f32::NAN, 3.0]);
        assert!(be.sumsq(&x).is_nan());
        assert_eq!(be.count_nonfinite(&x), 1);
        assert!(be.take_reports().is_empty());
        assert_eq!(be.take_error(), None);
    }

    #[test]
    fn a_shadowed_fprop_is_paired_with_the_gradient_of_its_output_and_a_gradient_gemm_with_itself() {
        use crate::backend::{OperandCast, ScaleSource};
        use crate::fp8::Fp8Format;
        let mut be = CpuBackend::new();
        let d = LinearDims { n: 8, k: 16, m: 12 };
        let x: Vec<f32> = (0..d.n * d.k).map(|i| ((i as f32) * 0.37).sin() * 3.0).collect();
        let w: Vec<f32> = (0..d.m * d.k).map(|i| ((i as f32) * 0.11).cos() * 0.2).collect();
        let dy: Vec<f32> = (0..d.n * d.m).map(|i| ((i as f32) * 0.53).sin() * 0.01).collect();
        let fp8 = OperandCast::Fp8Tensor { format: Fp8Format::E4M3, scale: ScaleSource::Current { margin: 0 } };
        let call = |gemm| GemmCall { cast_a: fp8, cast_b: fp8, shadow: true, ..GemmCall::bf16(GemmId { layer: 1, module: Module::Fc2, gemm }, d) };
        // The fprop's error waits for dY: its BF16 twin, computed here on the same inputs.
        let mut y = vec![0.0; d.n * d.m];
        be.gemm(&call(Gemm::Fprop), &mut y, &x, &w, None, None);
        // The BF16 twins come from another backend, so that this one's reports stay the model's.
        let mut twin = CpuBackend::new();
        let mut y_bf16 = vec![0.0; d.n * d.m];
        twin.gemm(&GemmCall::bf16(GemmId { layer: 1, module: Module::Fc2, gemm: Gemm::Fprop }, d), &mut y_bf16, &x, &w, None, None);
        assert_eq!(be.reports[0].shadow.unwrap().dual_inner, None, "no dY yet");
        let mut dx = vec![0.0; d.n * d.k];
        be.gemm(&call(Gemm::Dgrad), &mut dx, &dy, &w, None, None);
        let want: f64 = y.iter().zip(&y_bf16).zip(&dy).map(|((a, b), g)| (*a as f64 - *b as f64) * *g as f64).sum();
        let s = be.reports[0].shadow.unwrap();
        assert!((s.dual_inner.unwrap() - want).abs() <= 1e-12 * want.abs().max(1e-12), "{:?} vs {want}", s.dual_inner);
        let dy_norm = dy.iter().map(|g| (*g as f64).powi(2)).sum::<f64>().sqrt();
        assert!((s.dual_norm.unwrap() - dy_norm).abs() < 1e-12);
        assert_ne!(want, 0.0, "E4M3 changes this product");
        // The dgrad's own dual is its BF16 result.
        let mut dx_bf16 = vec![0.0; d.n * d.k];
        twin.gemm(&GemmCall::bf16(GemmId { layer: 1, module: Module::Fc2, gemm: Gemm::Dgrad }, d), &mut dx_bf16, &dy, &w, None, None);
        let want: f64 = dx.iter().zip(&dx_bf16).map(|(a, b)| (*a as f64 - *b as f64) * *b as f64).sum();
        let s = be.reports[1].shadow.unwrap();
        assert!((s.dual_inner.unwrap() - want).abs() <= 1e-12 * want.abs().max(1e-12), "{:?} vs {want}", s.dual_inner);
        // A new step forgets an fprop that never met its gradient.
        be.gemm(&call(Gemm::Fprop), &mut y, &x, &w, None, None);
        be.take_reports();
        assert!(be.fprop_errors.is_empty());
    }
}
