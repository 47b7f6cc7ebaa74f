//! The element formats' constants, and the formats the CUDA kernels cast to: the part of the
//! quantization contract ([`crate::quant`]) that `fp8-capture`'s build script and kernel compiler
//! read too (they include this file by path, so it uses nothing outside `std`). The kernels' format
//! codes, their `FMT_*` and `*_MAX` constants, their conversions and the names of every cast kernel
//! are generated from [`KERNEL_FORMATS`] (`capture/src/backend/cuda/kernel_units.rs`): a new
//! element format is one [`FormatSpec`] and one [`KernelFormat`] here, plus its kernels.
//!
//! Sources: the OCP Microscaling Formats (MX) specification v1.0 (E4M3, E5M2, E2M1, E8M0) and
//! CUDA's `cuda_fp8.h` (`__nv_fp8_interpretation_t`).

/// The constants of a format. Values are exact (every one is a power of two or a short dyadic).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FormatSpec {
    /// Lower-case name as on the command line and in the tables: `e4m3`, `e5m2`, `e2m1`, `e8m0`.
    pub name: &'static str,
    /// Total bits (sign included where there is one).
    pub bits: u32,
    pub signed: bool,
    pub exponent_bits: u32,
    /// Explicit mantissa (fraction) bits.
    pub mantissa_bits: u32,
    pub bias: i32,
    /// Largest finite value.
    pub max_finite: f64,
    /// Smallest positive normal value.
    pub min_normal: f64,
    /// Smallest positive subnormal value (None: the format has no subnormals).
    pub min_subnormal: Option<f64>,
    /// Code (positive sign) of the largest finite value.
    pub max_code: u8,
    /// Code (positive sign) of +Inf, if the format has infinities.
    pub inf_code: Option<u8>,
    /// Codes (positive sign) that are NaN.
    pub nan_codes: &'static [u8],
}

impl FormatSpec {
    /// ⌊log2(max_finite)⌋: the exponent of the largest value (OCP's `emax_elem`).
    pub fn emax(&self) -> i32 {
        self.max_finite.log2().floor() as i32
    }

    /// The distance between the largest finite value and the one below it.
    pub fn ulp_at_max(&self) -> f64 {
        2f64.powi(self.emax() - self.mantissa_bits as i32)
    }

    /// Where round-to-nearest leaves the finite range: `max + ulp_at_max / 2`. A non-saturating cast
    /// turns |x| at or above it into Inf or NaN (464 for E4M3, 61440 for E5M2).
    pub fn overflow_threshold(&self) -> f64 {
        self.max_finite + self.ulp_at_max() / 2.0
    }

    /// The code a non-saturating cast gives past [`Self::overflow_threshold`]: Inf where the format
    /// has it, else its first NaN code; None for a format with neither (E2M1 always saturates).
    pub fn overflow_code(&self) -> Option<u8> {
        self.inf_code.or(self.nan_codes.first().copied())
    }
}

pub const E4M3_SPEC: FormatSpec = FormatSpec {
    name: "e4m3",
    bits: 8,
    signed: true,
    exponent_bits: 4,
    mantissa_bits: 3,
    bias: 7,
    max_finite: 448.0,
    min_normal: 0.015625,             // 2^-6
    min_subnormal: Some(0.001953125), // 2^-9
    max_code: 0x7E,
    inf_code: None,
    nan_codes: &[0x7F],
};

pub const E5M2_SPEC: FormatSpec = FormatSpec {
    name: "e5m2",
    bits: 8,
    signed: true,
    exponent_bits: 5,
    mantissa_bits: 2,
    bias: 15,
    max_finite: 57344.0,
    min_normal: 6.103515625e-05,            // 2^-14
    min_subnormal: Some(1.52587890625e-05), // 2^-16
    max_code: 0x7B,
    inf_code: Some(0x7C),
    nan_codes: &[0x7D, 0x7E, 0x7F],
};

pub const E2M1_SPEC: FormatSpec = FormatSpec {
    name: "e2m1",
    bits: 4,
    signed: true,
    exponent_bits: 2,
    mantissa_bits: 1,
    bias: 1,
    max_finite: 6.0,
    min_normal: 1.0,
    min_subnormal: Some(0.5),
    max_code: 0x7,
    inf_code: None,
    nan_codes: &[],
};

pub const E8M0_SPEC: FormatSpec = FormatSpec {
    name: "e8m0",
    bits: 8,
    signed: false,
    exponent_bits: 8,
    mantissa_bits: 0,
    bias: 127,
    max_finite: 1.7014118346046923e38, // 2^127
    min_normal: 5.877471754111438e-39, // 2^-127
    min_subnormal: None,
    max_code: 0xFE,
    inf_code: None,
    nan_codes: &[0xFF],
};

/// A format the CUDA backend's per-tensor casts write: the code by which the kernels and the
/// backend number it (the `F` of `cast_fwd_l{L}_f{F}_t{T}`), the name of its constants in the
/// kernels, and how CUDA converts to it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KernelFormat {
    /// The kernels' code: `FMT_<TAG>` and the `f<code>` of kernel names. Codes are 0, 1, 2, … in
    /// the order of [`KERNEL_FORMATS`].
    pub code: u8,
    /// Upper-case tag of the kernels' constants: `FMT_E4M3`, `E4M3_MAX`.
    pub tag: &'static str,
    /// The element format's constants; None for BF16, which the casts round to without a scale.
    pub spec: Option<&'static FormatSpec>,
    /// CUDA's `__nv_fp8_interpretation_t` of the format, given to `__nv_cvt_float_to_fp8` and
    /// `__nv_cvt_fp8_to_halfraw` (None for BF16).
    pub cuda_fp8: Option<&'static str>,
}

impl KernelFormat {
    /// Whether the casts write one byte per element with a per-tensor scale (an FP8 format).
    pub fn is_fp8(&self) -> bool {
        self.spec.is_some()
    }
}

/// Every format the CUDA casts write, by code.
pub const KERNEL_FORMATS: [KernelFormat; 3] = [
    KernelFormat { code: 0, tag: "BF16", spec: None, cuda_fp8: None },
    KernelFormat { code: 1, tag: "E4M3", spec: Some(&E4M3_SPEC), cuda_fp8: Some("__NV_E4M3") },
    KernelFormat { code: 2, tag: "E5M2", spec: Some(&E5M2_SPEC), cuda_fp8: Some("__NV_E5M2") },
];
