//! The quantization contract: every low-precision element and scale format fp8scope emulates, with
//! its constants, and which format, block shape and scale encoding each GEMM operand gets under each
//! recipe. Written once here; `fp8-capture` casts from it, `fp8-capture formats --json` exports it,
//! and the Python package reads the constants from that export (`python/fp8scope/_formats.json`).
//!
//! Sources: the OCP Microscaling Formats (MX) specification v1.0 (E4M3, E5M2, E2M1, E8M0 and the
//! MX block scale), and NVIDIA Transformer Engine's `MXFP8BlockScaling` and `NVFP4BlockScaling`
//! recipes (`transformer_engine/common/recipe/__init__.py`, `common/util/ptx_arch_spec.cuh`,
//! `common/cast/nvfp4/core_nvfp4.cuh`, `pytorch/custom_recipes/reference_nvfp4.py`).

use crate::config::{FormatPolicy, RecipeKind};
use crate::names::{Gemm, Role};
use serde_json::{Value, json};

/// An element (or scale) number format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElementFormat {
    /// FP8 E4M3, the finite-only `fn` variant: max 448, NaN at 0x7F/0xFF.
    E4M3,
    /// FP8 E5M2, IEEE-like: max 57344, ±Inf at 0x7C/0xFC.
    E5M2,
    /// FP4 E2M1 (OCP MX): ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}, no Inf, no NaN.
    E2M1,
    /// E8M0 (OCP MX scale): an unsigned power of two 2^(code − 127), code 0xFF is NaN.
    E8M0,
}

pub use crate::element_formats::{E2M1_SPEC, E4M3_SPEC, E5M2_SPEC, E8M0_SPEC, FormatSpec, KERNEL_FORMATS, KernelFormat};

impl ElementFormat {
    pub const ALL: [ElementFormat; 4] = [ElementFormat::E4M3, ElementFormat::E5M2, ElementFormat::E2M1, ElementFormat::E8M0];

    pub const fn spec(self) -> &'static FormatSpec {
        match self {
            ElementFormat::E4M3 => &E4M3_SPEC,
            ElementFormat::E5M2 => &E5M2_SPEC,
            ElementFormat::E2M1 => &E2M1_SPEC,
            ElementFormat::E8M0 => &E8M0_SPEC,
        }
    }

    pub fn name(self) -> &'static str {
        self.spec().name
    }

    /// Parses a name (`e4m3`, also `e4m3fn`, `e5m2`, `e2m1`, `e8m0`), case-insensitively.
    pub fn parse(s: &str) -> Option<ElementFormat> {
        let s = s.trim().to_ascii_lowercase();
        let s = s.trim_end_matches("fnu").trim_end_matches("fn");
        ElementFormat::ALL.into_iter().find(|f| f.name() == s)
    }
}

/// How an E8M0 block scale is chosen from the block's amax (MXFP8). Both give a power of two X with
/// the block stored as `cast(x / X)`; they differ by one binade for most blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum E8m0Rounding {
    /// Transformer Engine's: X = 2^⌈log2(amax · (1/max))⌉ — `float_to_e8m0(amax * max_norm_rcp)`,
    /// which rounds the exponent *up* (`cvt.rp.satfinite.ue8m0x2.f32` on Blackwell, the same rule in
    /// integer code elsewhere). Nothing in the block exceeds max: no element saturates.
    #[default]
    Te,
    /// The OCP MX specification's (v1.0, §6.3): X = 2^(⌊log2(amax)⌋ − emax_elem), the exponent
    /// rounded *down*; the block's largest elements may exceed max and are clamped to it.
    Ocp,
}

impl E8m0Rounding {
    pub const ALL: [E8m0Rounding; 2] = [E8m0Rounding::Te, E8m0Rounding::Ocp];
    pub fn as_str(self) -> &'static str {
        match self {
            E8m0Rounding::Te => "te",
            E8m0Rounding::Ocp => "ocp",
        }
    }
    pub fn about(self) -> &'static str {
        match self {
            E8m0Rounding::Te => "Transformer Engine: exponent of amax/max rounded up (no element clips)",
            E8m0Rounding::Ocp => "OCP MX v1.0: floor(log2 amax) - emax_elem, rounded down (the largest elements may clip)",
        }
    }
}

/// How the scale of an operand is stored and derived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleEncoding {
    /// One FP32 scale for the tensor: (max / amax) / 2^margin, from an amax history (delayed) or the
    /// tensor's own amax (current).
    Fp32Tensor,
    /// One FP32 scale per block: (max / block amax) / 2^margin (DeepSeek-V3 style).
    Fp32Block,
    /// One E8M0 power of two per block (MX).
    E8m0Block(E8m0Rounding),
    /// NVFP4's two levels: an FP32 tensor scale S_enc = 448·6 / amax, and per block an E4M3 decode
    /// scale s_b = e4m3(block_amax · (S_enc / 6)); elements are cast with 1 / (s_b / S_enc).
    E4m3BlockUnderFp32Tensor,
}

impl ScaleEncoding {
    pub fn name(self) -> &'static str {
        match self {
            ScaleEncoding::Fp32Tensor => "fp32_tensor",
            ScaleEncoding::Fp32Block => "fp32_block",
            ScaleEncoding::E8m0Block(E8m0Rounding::Te) => "e8m0_block_te",
            ScaleEncoding::E8m0Block(E8m0Rounding::Ocp) => "e8m0_block_ocp",
            ScaleEncoding::E4m3BlockUnderFp32Tensor => "e4m3_block_fp32_tensor",
        }
    }
}

/// The extent of one scale, in the operand's row-major layout (as `capture`'s GEMMs store it:
/// fprop X (n×k), W (m×k); dgrad dY (n×m), W (m×k); wgrad dY (n×m), X (n×k)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockShape {
    /// One scale for the whole tensor.
    Tensor,
    /// One scale per `rows × cols` tile (the last tiles of a dimension may be shorter).
    Tile { rows: usize, cols: usize },
}

/// Transformer Engine's NVFP4 switches (`NVFP4BlockScaling`), all off by default as in TE.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Nvfp4Switches {
    /// No random Hadamard transform on the wgrad operands.
    #[serde(default)]
    pub disable_rht: bool,
    /// Gradients rounded to nearest instead of stochastically.
    #[serde(default)]
    pub disable_stochastic_rounding: bool,
    /// Weights in 1×16 blocks instead of 16×16.
    #[serde(default)]
    pub disable_2d_quantization: bool,
}

/// Everything about how one GEMM operand is quantized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OperandQuant {
    pub element: ElementFormat,
    pub block: BlockShape,
    pub scale: ScaleEncoding,
    /// A 16-point random Hadamard transform along the reduction dimension before the cast.
    pub rht: bool,
    /// Stochastic rounding of the elements (else round to nearest even).
    pub stochastic: bool,
}

/// MX block length: 32 elements along the reduction dimension (OCP MX, MXFP8).
pub const MX_BLOCK: usize = 32;
/// NVFP4 block length: 16 elements along the reduction dimension; weights 16×16 in 2D mode.
pub const NVFP4_BLOCK: usize = 16;
/// DeepSeek-V3 block length: 1×128 activations and gradients, 128×128 weights.
pub const DEEPSEEK_BLOCK: usize = 128;
/// Size of the Hadamard matrix of NVFP4's random Hadamard transform.
pub const RHT_SIZE: usize = 16;
/// The fixed random signs of Transformer Engine's wgrad Hadamard transform (`get_wgrad_sign_vector`).
pub const RHT_SIGNS: [f32; RHT_SIZE] = [1.0, 1.0, 1.0, -1.0, 1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, 1.0, -1.0, 1.0, -1.0, -1.0];

/// A 1-D block of `len` elements along the GEMM's reduction dimension: along a row (1×len) in fprop
/// and dgrad, along a column (len×1) in wgrad, whose reduction runs over the tokens (the transposed
/// operand). Weights reduce along their columns in fprop (W is m×k, k reduced) and along their rows
/// in dgrad (dX = dY·W reduces m).
pub fn reduction_block(gemm: Gemm, role: Role, len: usize) -> BlockShape {
    match (gemm, role) {
        (Gemm::Dgrad, Role::Weight) | (Gemm::Wgrad, _) => BlockShape::Tile { rows: len, cols: 1 },
        _ => BlockShape::Tile { rows: 1, cols: len },
    }
}

/// The format policy a recipe gets when none is asked for: Transformer Engine's defaults, E4M3
/// everywhere for `MXFP8BlockScaling` (its `fp8_format` defaults to E4M3), hybrid (E5M2 gradients)
/// for the per-tensor recipes. (block and nvfp4 do not follow the policy.)
pub fn default_policy(recipe: RecipeKind) -> FormatPolicy {
    match recipe {
        RecipeKind::Mxfp8 => FormatPolicy::E4m3,
        _ => FormatPolicy::Hybrid,
    }
}

/// The element format of `role` under a per-tensor recipe's format policy.
pub fn per_tensor_element(policy: FormatPolicy, role: Role) -> ElementFormat {
    match (policy, role) {
        (FormatPolicy::Hybrid, Role::Gradient) => ElementFormat::E5M2,
        _ => ElementFormat::E4M3,
    }
}

/// How `role`, operand of `gemm`, is quantized under `recipe` (None: it is not, BF16).
///
/// | recipe | element | block | scale |
/// | --- | --- | --- | --- |
/// | delayed, current | E4M3 (E5M2 gradients under `hybrid`) | tensor | FP32 |
/// | block | E4M3 | 1×128 along K (128×1 in wgrad), weights 128×128 | FP32 per block |
/// | mxfp8 | E4M3 (E5M2 gradients under `hybrid`) | 1×32 along K (32×1 in wgrad and for dgrad's W) | E8M0 |
/// | nvfp4 | E2M1 | 1×16 along K (16×1 in wgrad); weights 16×16 | E4M3 per block under FP32 per tensor |
///
/// NVFP4 also applies the random Hadamard transform to both wgrad operands (TE: `fp4_quant_fwd_inp`
/// and `fp4_quant_bwd_grad` in column-wise use) and rounds gradients stochastically in dgrad and
/// wgrad (`fp4_quant_bwd_grad`), each unless switched off.
pub fn operand_quant(
    recipe: RecipeKind,
    policy: FormatPolicy,
    mx_rounding: E8m0Rounding,
    nvfp4: Nvfp4Switches,
    gemm: Gemm,
    role: Role,
) -> Option<OperandQuant> {
    let plain = |element, block, scale| Some(OperandQuant { element, block, scale, rht: false, stochastic: false });
    match recipe {
        RecipeKind::Bf16 => None,
        RecipeKind::Delayed | RecipeKind::Current => plain(per_tensor_element(policy, role), BlockShape::Tensor, ScaleEncoding::Fp32Tensor),
        RecipeKind::Block => {
            let block = match (gemm, role) {
                (_, Role::Weight) => BlockShape::Tile { rows: DEEPSEEK_BLOCK, cols: DEEPSEEK_BLOCK },
                (Gemm::Wgrad, _) => BlockShape::Tile { rows: DEEPSEEK_BLOCK, cols: 1 },
                _ => BlockShape::Tile { rows: 1, cols: DEEPSEEK_BLOCK },
            };
            plain(ElementFormat::E4M3, block, ScaleEncoding::Fp32Block)
        }
        RecipeKind::Mxfp8 => plain(per_tensor_element(policy, role), reduction_block(gemm, role, MX_BLOCK), ScaleEncoding::E8m0Block(mx_rounding)),
        RecipeKind::Nvfp4 => {
            let block = if role == Role::Weight && !nvfp4.disable_2d_quantization {
                BlockShape::Tile { rows: NVFP4_BLOCK, cols: NVFP4_BLOCK }
            } else {
                reduction_block(gemm, role, NVFP4_BLOCK)
            };
            Some(OperandQuant {
                element: ElementFormat::E2M1,
                block,
                scale: ScaleEncoding::E4m3BlockUnderFp32Tensor,
                rht: gemm == Gemm::Wgrad && !nvfp4.disable_rht,
                stochastic: role == Role::Gradient && !nvfp4.disable_stochastic_rounding,
            })
        }
    }
}

fn spec_json(s: &FormatSpec) -> Value {
    json!({
        "name": s.name,
        "bits": s.bits,
        "signed": s.signed,
        "exponent_bits": s.exponent_bits,
        "mantissa_bits": s.mantissa_bits,
        "bias": s.bias,
        "max_finite": s.max_finite,
        "min_normal": s.min_normal,
        "min_subnormal": s.min_subnormal,
        "max_code": s.max_code,
        "inf_code": s.inf_code,
        "nan_codes": s.nan_codes,
        "emax": s.emax(),
        "overflow_threshold": s.overflow_threshold(),
    })
}

fn block_json(b: BlockShape) -> Value {
    match b {
        BlockShape::Tensor => json!("tensor"),
        BlockShape::Tile { rows, cols } => json!([rows, cols]),
    }
}

/// The contract as JSON: formats with their constants, scale roundings, and for every recipe the
/// quantization of each (GEMM, operand role) under the default switches.
pub fn contract_json() -> Value {
    let formats: Vec<Value> = ElementFormat::ALL.iter().map(|f| spec_json(f.spec())).collect();
    let roundings: Vec<Value> = E8m0Rounding::ALL.iter().map(|r| json!({ "name": r.as_str(), "about": r.about() })).collect();
    let mut recipes = Vec::new();
    for recipe in RecipeKind::ALL {
        let mut operands = Vec::new();
        for gemm in Gemm::ALL {
            for role in gemm.operands() {
                let q = operand_quant(recipe, default_policy(recipe), E8m0Rounding::Te, Nvfp4Switches::default(), gemm, role);
                operands.push(match q {
                    None => json!({ "gemm": gemm.as_str(), "role": role.as_str(), "element": "bf16" }),
                    Some(q) => json!({
                        "gemm": gemm.as_str(), "role": role.as_str(), "element": q.element.name(), "block": block_json(q.block),
                        "scale": q.scale.name(), "rht": q.rht, "stochastic_rounding": q.stochastic,
                    }),
                });
            }
        }
        recipes.push(json!({ "name": recipe.as_str(), "operands": operands }));
    }
    json!({
        "about": "Generated from the Rust crate fp8scope-schemas (schemas/src/quant.rs); do not edit. \
                  Regenerate: FP8SCOPE_WRITE_FORMATS_JSON=1 cargo test --release --workspace --test formats_contract",
        "formats": formats,
        "e8m0_roundings": roundings,
        "blocks": { "mx": MX_BLOCK, "nvfp4": NVFP4_BLOCK, "deepseek": DEEPSEEK_BLOCK, "rht_size": RHT_SIZE },
        "rht_signs": RHT_SIGNS,
        "format_policy_of_recipes": "each recipe's default: e4m3 for mxfp8, hybrid (E5M2 gradients) for delayed and current",
        "recipes": recipes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Constants recomputed from the bit layout, so that a typo in a table entry fails.
    #[test]
    fn every_constant_follows_from_the_bit_layout() {
        for f in ElementFormat::ALL {
            let s = f.spec();
            assert_eq!(s.bits, u32::from(s.signed) + s.exponent_bits + s.mantissa_bits, "{}", s.name);
            let emin = 1 - s.bias;
            if f == ElementFormat::E8M0 {
                assert_eq!(s.min_normal, 2f64.powi(-s.bias));
                assert_eq!(s.max_finite, 2f64.powi(0xFE - s.bias));
                continue;
            }
            assert_eq!(s.min_normal, 2f64.powi(emin), "{}", s.name);
            assert_eq!(s.min_subnormal, Some(2f64.powi(emin - s.mantissa_bits as i32)), "{}", s.name);
            // The largest finite code's value, decoded from its bits.
            let e = i32::from(s.max_code >> s.mantissa_bits) - s.bias;
            let m = f64::from(s.max_code & ((1 << s.mantissa_bits) - 1)) / 2f64.powi(s.mantissa_bits as i32);
            assert_eq!(s.max_finite, (1.0 + m) * 2f64.powi(e), "{}", s.name);
        }
        assert_eq!(E4M3_SPEC.overflow_threshold(), 464.0);
        assert_eq!(E5M2_SPEC.overflow_threshold(), 61440.0);
        assert_eq!((E4M3_SPEC.emax(), E5M2_SPEC.emax(), E2M1_SPEC.emax()), (8, 15, 2));
        assert_eq!((E4M3_SPEC.overflow_code(), E5M2_SPEC.overflow_code(), E2M1_SPEC.overflow_code()), (Some(0x7F), Some(0x7C), None));
        assert_eq!(ElementFormat::parse("E4M3FN"), Some(ElementFormat::E4M3));
        assert_eq!(ElementFormat::parse("e8m0fnu"), Some(ElementFormat::E8M0));
        assert_eq!(ElementFormat::parse("e3m2"), None);
    }

    #[test]
    fn blocks_run_along_the_reduction_dimension() {
        let q = |r, g, role| operand_quant(r, FormatPolicy::Hybrid, E8m0Rounding::Te, Nvfp4Switches::default(), g, role).unwrap();
        let tile = |rows, cols| BlockShape::Tile { rows, cols };
        assert_eq!(q(RecipeKind::Mxfp8, Gemm::Fprop, Role::Activation).block, tile(1, 32));
        assert_eq!(q(RecipeKind::Mxfp8, Gemm::Fprop, Role::Weight).block, tile(1, 32));
        assert_eq!(q(RecipeKind::Mxfp8, Gemm::Dgrad, Role::Weight).block, tile(32, 1));
        assert_eq!(q(RecipeKind::Mxfp8, Gemm::Wgrad, Role::Gradient).block, tile(32, 1));
        assert_eq!(q(RecipeKind::Mxfp8, Gemm::Dgrad, Role::Gradient).element, ElementFormat::E5M2, "under hybrid");
        let mx_default =
            operand_quant(RecipeKind::Mxfp8, default_policy(RecipeKind::Mxfp8), E8m0Rounding::Te, Nvfp4Switches::default(), Gemm::Dgrad, Role::Gradient);
        assert_eq!(mx_default.unwrap().element, ElementFormat::E4M3, "TE's MXFP8 default");
        let w = q(RecipeKind::Nvfp4, Gemm::Dgrad, Role::Weight);
        assert_eq!((w.block, w.rht, w.stochastic), (tile(16, 16), false, false));
        let g = q(RecipeKind::Nvfp4, Gemm::Wgrad, Role::Gradient);
        assert_eq!((g.block, g.rht, g.stochastic), (tile(16, 1), true, true));
        let x = q(RecipeKind::Nvfp4, Gemm::Wgrad, Role::Activation);
        assert_eq!((x.rht, x.stochastic), (true, false));
        let dg = q(RecipeKind::Nvfp4, Gemm::Dgrad, Role::Gradient);
        assert_eq!((dg.block, dg.rht, dg.stochastic), (tile(1, 16), false, true));
        let off = Nvfp4Switches { disable_rht: true, disable_stochastic_rounding: true, disable_2d_quantization: true };
        let w1 = operand_quant(RecipeKind::Nvfp4, FormatPolicy::Hybrid, E8m0Rounding::Te, off, Gemm::Fprop, Role::Weight).unwrap();
        assert_eq!(w1.block, tile(1, 16));
        let g1 = operand_quant(RecipeKind::Nvfp4, FormatPolicy::Hybrid, E8m0Rounding::Te, off, Gemm::Wgrad, Role::Gradient).unwrap();
        assert_eq!((g1.rht, g1.stochastic), (false, false));
        assert_eq!(q(RecipeKind::Block, Gemm::Wgrad, Role::Activation).block, tile(128, 1));
        assert_eq!(operand_quant(RecipeKind::Bf16, FormatPolicy::Hybrid, E8m0Rounding::Te, off, Gemm::Fprop, Role::Weight), None);
    }
}
