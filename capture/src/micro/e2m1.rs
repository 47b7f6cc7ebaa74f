//! FP4 E2M1 (OCP MX): 1 sign, 2 exponent (bias 1), 1 mantissa bit; the values ±{0, 0.5, 1, 1.5, 2,
//! 3, 4, 6}, no Inf, no NaN. Codes are the low 4 bits of a byte, the sign in bit 3.
//!
//! [`encode_rn`] rounds to nearest, ties to even, and saturates to ±6 (`cvt.rn.satfinite.e2m1x2.f32`);
//! [`encode_sr`] rounds stochastically: up with probability equal to the distance from the value
//! below, over the step, decided by a 32-bit random number. NaN has no code: both give `0x0` for it
//! and the callers keep such elements NaN in their dequantized values, so that a NaN stays visible.

/// The 8 magnitudes, by code.
pub const VALUES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
/// The largest magnitude.
pub const MAX: f32 = 6.0;

/// The value of a code (bits above the low 4 are ignored).
#[inline]
pub fn decode(code: u8) -> f32 {
    let v = VALUES[(code & 0x7) as usize];
    if code & 0x8 != 0 { -v } else { v }
}

#[inline]
fn sign_bit(y: f32) -> u8 {
    if y.is_sign_negative() { 0x8 } else { 0 }
}

/// Round to nearest (ties to the even code), saturating. The midpoints and their rounding: 0.25 → 0,
/// 0.75 → 1, 1.25 → 1, 1.75 → 2, 2.5 → 2, 3.5 → 4, 5 → 4.
#[inline]
pub fn encode_rn(y: f32) -> u8 {
    if y.is_nan() {
        return 0;
    }
    let a = y.abs();
    let code = u8::from(a > 0.25) + u8::from(a >= 0.75) + u8::from(a > 1.25) + u8::from(a >= 1.75) + u8::from(a > 2.5) + u8::from(a >= 3.5) + u8::from(a > 5.0);
    code | sign_bit(y)
}

/// Stochastic rounding with the random number `r`: |y| (clamped to 6) lies between the magnitudes
/// lo ≤ |y| ≤ hi; it rounds to hi when `r < p · 2^32`, p = (|y| − lo) / (hi − lo), else to lo. The
/// probability of rounding up is p to within 2^-32, so E[value] = y: the rounding is unbiased.
#[inline]
pub fn encode_sr(y: f32, r: u32) -> u8 {
    if y.is_nan() {
        return 0;
    }
    let a = y.abs().min(MAX);
    // The code of the magnitude at or below a.
    let lo = VALUES.iter().rposition(|&v| v <= a).unwrap_or(0);
    if lo == 7 || VALUES[lo] == a {
        return lo as u8 | sign_bit(y);
    }
    let step = VALUES[lo + 1] - VALUES[lo]; // a power of two: the division is exact
    let p = (a - VALUES[lo]) / step;
    let up = f64::from(r) < f64::from(p) * 4_294_967_296.0;
    (lo as u8 + u8::from(up)) | sign_bit(y)
}

/// The 32-bit random number of element `index` under `seed`: SplitMix64 of `seed + (index + 1) ·
/// 0x9E3779B97F4A7C15`, high half. A counter-based stream, so that any element's number is known
/// without the others' (and the Python reference computes the same).
#[inline]
pub fn random_bits(seed: u64, index: u64) -> u32 {
    let mut z = seed.wrapping_add(index.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 32) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Round to nearest against a direct search over the 8 magnitudes in f64, on a dense sweep.
    #[test]
    fn round_to_nearest_is_the_nearest_value_ties_to_even() {
        let mut checked = 0;
        for i in 0..=16_000 {
            let y = i as f32 / 2000.0; // 0..8 in steps of 1/2000, every midpoint included
            for y in [y, -y] {
                let a = f64::from(y.abs()).min(6.0);
                let best = (0..8).min_by(|&p, &q| {
                    let (dp, dq) = ((a - f64::from(VALUES[p])).abs(), (a - f64::from(VALUES[q])).abs());
                    dp.partial_cmp(&dq).unwrap().then((p % 2).cmp(&(q % 2)))
                });
                let code = encode_rn(y);
                assert_eq!(code & 7, best.unwrap() as u8, "{y}");
                assert_eq!(code & 8 != 0, y.is_sign_negative(), "{y}");
                checked += 1;
            }
        }
        assert_eq!(checked, 32_002);
        assert_eq!(encode_rn(1e30), 7);
        assert_eq!(encode_rn(f32::NEG_INFINITY), 0xF);
        assert_eq!(encode_rn(-0.0), 0x8);
        for c in 0..16u8 {
            assert_eq!(encode_rn(decode(c)), c, "code {c} round-trips");
            assert_eq!(encode_sr(decode(c), 0), c);
            assert_eq!(encode_sr(decode(c), u32::MAX), c);
        }
    }

    #[test]
    fn stochastic_rounding_picks_the_neighbours_with_the_right_odds() {
        // 2.25 is a quarter of the way from 2 to 3: up when r < 2^30.
        assert_eq!(encode_sr(2.25, (1 << 30) - 1), 5);
        assert_eq!(encode_sr(2.25, 1 << 30), 4);
        assert_eq!(encode_sr(-0.1, 0), 0x9, "0.1 is 0.2 of the way to 0.5");
        assert_eq!(encode_sr(-0.1, u32::MAX), 0x8);
        assert_eq!(encode_sr(7.0, 0), 7, "saturates");
    }
}
