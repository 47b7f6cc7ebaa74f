//! E8M0, the MX block scale: an unsigned power of two 2^(code − 127), code 0xFF NaN. The scale of a
//! block is chosen from its amax by one of two roundings ([`E8m0Rounding`]); these functions are
//! Transformer Engine's (`common/util/ptx_arch_spec.cuh` `float_to_e8m0`, `common/util/ptx.cuh`
//! `exp2f_rcp` and `exp2f`) and the OCP MX specification's (v1.0 §6.3), bit for bit.

use crate::fp8::Fp8Format;
use fp8scope_schemas::quant::E8m0Rounding;

/// The E8M0 NaN code.
pub const NAN_CODE: u8 = 0xFF;

/// Transformer Engine's `float_to_e8m0(val)`: the exponent of `val` rounded up (`cvt.rp.satfinite`):
/// NaN → 0xFF, Inf → 0xFE, 0 → 0x00, values up to 2^-127 → 0x00, values past 2^127 → 0xFE.
pub fn float_to_e8m0(val: f32) -> u8 {
    if val.is_nan() {
        return NAN_CODE;
    }
    if val.is_infinite() {
        return 0xFE;
    }
    if val == 0.0 {
        return 0;
    }
    let bits = val.to_bits();
    let mut exponent = ((bits >> 23) & 0xFF) as u8;
    let mantissa = bits & 0x7F_FFFF;
    if (mantissa > 0 && exponent != 0xFE) && !(exponent == 0 && mantissa <= 0x40_0000) {
        exponent += 1;
    }
    exponent
}

/// ⌊log2(a)⌋ of a finite positive f32 (subnormals included).
fn floor_log2(a: f32) -> i32 {
    let bits = a.to_bits() & 0x7FFF_FFFF;
    let exp = (bits >> 23) as i32;
    if exp > 0 {
        exp - 127
    } else {
        // Subnormal: the value is m · 2^-149 with m < 2^23.
        -149 + (31 - (bits & 0x7F_FFFF).leading_zeros() as i32)
    }
}

/// The E8M0 code of a block whose amax (max |x|, NaN ignored, Inf kept) is `amax`, for elements in
/// `fmt`:
/// * [`E8m0Rounding::Te`]: `float_to_e8m0(amax * (1 / max))`, the product an f32 multiply by the
///   f32 reciprocal of max, as Transformer Engine's `Quantized_Limits::max_norm_rcp`;
/// * [`E8m0Rounding::Ocp`]: ⌊log2(amax)⌋ − emax_elem + 127, clamped to [0, 254]; 0 for an all-zero
///   block, 254 for an infinite amax.
pub fn scale_code(rounding: E8m0Rounding, fmt: Fp8Format, amax: f32) -> u8 {
    match rounding {
        E8m0Rounding::Te => float_to_e8m0(amax * (1.0 / fmt.max())),
        E8m0Rounding::Ocp => {
            if amax.is_nan() {
                NAN_CODE
            } else if amax == 0.0 {
                0
            } else if amax.is_infinite() {
                0xFE
            } else {
                (floor_log2(amax) - fmt.spec().emax() + 127).clamp(0, 0xFE) as u8
            }
        }
    }
}

/// Transformer Engine's `exp2f_rcp<float>(code)`: the multiplier elements are cast with, 2^(127 − code):
/// NaN for 0xFF, 2^-127 (a subnormal) for 0xFE.
pub fn encode_multiplier(code: u8) -> f32 {
    match code {
        NAN_CODE => f32::NAN,
        0xFE => f32::from_bits(0x0040_0000),
        c => f32::from_bits(u32::from(254 - c) << 23),
    }
}

/// Transformer Engine's `exp2f(code)`: the value of a scale, 2^(code − 127): NaN for 0xFF, 2^-127
/// (a subnormal) for 0.
pub fn decode(code: u8) -> f32 {
    match code {
        NAN_CODE => f32::NAN,
        0 => f32::from_bits(0x0040_0000),
        c => f32::from_bits(u32::from(c) << 23),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn te_rounds_the_exponent_of_amax_over_max_up_and_ocp_rounds_log2_amax_down() {
        let e4 = Fp8Format::E4M3;
        // amax 448: amax/448 = 1 exactly -> 2^0 (127) under TE; OCP: floor(log2 448) = 8, 8 - 8 = 0.
        assert_eq!(scale_code(E8m0Rounding::Te, e4, 448.0), 127);
        assert_eq!(scale_code(E8m0Rounding::Ocp, e4, 448.0), 127);
        // amax 449: TE goes up one binade (449/448 > 1); OCP stays (449 clips to 448).
        assert_eq!(scale_code(E8m0Rounding::Te, e4, 449.0), 128);
        assert_eq!(scale_code(E8m0Rounding::Ocp, e4, 449.0), 127);
        // amax 1: TE 2^ceil(log2(1/448)) = 2^-8; OCP 2^(0 - 8) = 2^-8.
        assert_eq!(scale_code(E8m0Rounding::Te, e4, 1.0), 119);
        assert_eq!(scale_code(E8m0Rounding::Ocp, e4, 1.0), 119);
        // amax 300: TE 2^ceil(log2 0.67) = 2^0; OCP 2^(8-8) = 2^0. amax 500: TE 2^1, OCP 2^0.
        assert_eq!(scale_code(E8m0Rounding::Te, e4, 500.0), 128);
        assert_eq!(scale_code(E8m0Rounding::Ocp, e4, 500.0), 127);
        // E5M2: emax 15.
        assert_eq!(scale_code(E8m0Rounding::Ocp, Fp8Format::E5M2, 1.0), 112);
        assert_eq!(scale_code(E8m0Rounding::Te, Fp8Format::E5M2, 57344.0), 127);
        // Specials.
        assert_eq!(float_to_e8m0(0.0), 0);
        assert_eq!(float_to_e8m0(f32::INFINITY), 0xFE);
        assert_eq!(float_to_e8m0(f32::NAN), 0xFF);
        assert_eq!(float_to_e8m0(f32::MAX), 0xFE, "satfinite");
        assert_eq!(float_to_e8m0(f32::from_bits(0x0040_0000)), 0, "2^-127 is code 0");
        assert_eq!(float_to_e8m0(f32::from_bits(0x0040_0001)), 1);
        assert_eq!(float_to_e8m0(f32::from_bits(1)), 0);
        assert_eq!(scale_code(E8m0Rounding::Ocp, e4, f32::from_bits(1)), 0, "2^-149 - 8 clamps to 2^-127");
        assert_eq!(floor_log2(f32::from_bits(0x0040_0000)), -127);
        assert_eq!(floor_log2(1.5), 0);
        for c in 1..=0xFDu8 {
            assert_eq!(decode(c) * encode_multiplier(c), 1.0, "code {c}");
        }
        assert_eq!(encode_multiplier(0), 2f32.powi(127));
        assert!(decode(0xFF).is_nan() && encode_multiplier(0xFF).is_nan());
    }
}
