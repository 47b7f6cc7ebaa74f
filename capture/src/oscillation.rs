//! The planted weight oscillation (`--inject site=S,kind=oscillation,step=N`): the state TetraJet-v2
//! (Chen et al.) describes, in which master weights settle at the rounding boundaries of their
//! quantization grid and their quantized values flip back and forth while the masters barely move.
//! Here it is put there: before each step's casts from step N on, every element of S's weight is
//! moved to the rounding boundary of its FP8 grid (under the scale its forward cast uses that step)
//! nearest to it, a small `offset` of the bin past it, on the upper side at even steps and the
//! lower side at odd ones. Its forward weight then flips one bin at every element every step while
//! the master moves by twice the offset: the flip ratio (`weight_motion.rs`) is about
//! 1 / (2 · offset), where freely moving weights measure about 1. The optimizer's updates are
//! undone down to the boundary nearest to where they took the element, so the weight learns at the
//! grid's coarseness only, as an oscillating one does.

use crate::fp8::{self, Fp8Format};

/// The offset past the boundary when the spec gives no magnitude: 1/64 of the bin.
pub const DEFAULT_OFFSET: f64 = 1.0 / 64.0;

/// Moves each finite, nonzero value of `w` to the rounding boundary nearest to it of `format`'s
/// grid under `scale` (the values are cast as `w · scale`), then `offset` of that boundary's bin
/// past it: toward the larger magnitude when `outer`, the smaller otherwise. Zeros, non-finite
/// values and values whose scaled magnitude is past the largest finite value stay as they are.
pub fn park(w: &mut [f32], format: Fp8Format, scale: f32, outer: bool, offset: f64) {
    if !(scale.is_finite() && scale > 0.0) {
        return;
    }
    let max = format.max() as f64;
    for x in w.iter_mut() {
        let y = (*x as f64 * scale as f64).abs();
        if !x.is_finite() || y == 0.0 || y > max {
            continue;
        }
        // The grid points around y: q (nearest, its code c) and its neighbour on y's side.
        let c = fp8::encode(format, y as f32) & 0x7F;
        let q = fp8::decode(format, c) as f64;
        let (lo, hi) = if y >= q && c < format.max_code() {
            (q, fp8::decode(format, c + 1) as f64)
        } else if c > 0 {
            (fp8::decode(format, c - 1) as f64, q)
        } else {
            continue;
        };
        let bin = hi - lo;
        let parked = (lo + hi) / 2.0 + if outer { offset * bin } else { -offset * bin };
        *x = (parked / scale as f64).copysign(*x as f64) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_pcg::Pcg64;

    fn cast(format: Fp8Format, w: &[f32], scale: f32) -> Vec<f32> {
        w.iter().map(|&x| fp8::decode(format, fp8::cast(format, x, scale)) / scale).collect()
    }

    /// Parked on alternate sides, every element's cast flips one bin while the master moves by
    /// twice the offset: the flip ratio is 1 / (2 · offset).
    #[test]
    fn parked_weights_flip_a_bin_every_step_while_the_master_barely_moves() {
        let mut rng = Pcg64::seed_from_u64(7);
        for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
            let w0: Vec<f32> = (0..4096).map(|_| (rng.random::<f32>() - 0.5) * 0.2).collect();
            let scale = fp8::scale_for_amax(format, fp8::amax(&w0), 0);
            let (mut a, mut b) = (w0.clone(), w0.clone());
            park(&mut a, format, scale, true, DEFAULT_OFFSET);
            park(&mut b, format, scale, false, DEFAULT_OFFSET);
            let (qa, qb) = (cast(format, &a, scale), cast(format, &b, scale));
            let moved = w0.iter().filter(|&&x| x != 0.0).count();
            let flips = qa.iter().zip(&qb).filter(|(x, y)| x != y).count();
            assert_eq!(flips, moved, "{format:?}: every nonzero element flips");
            let dq: f64 = qa.iter().zip(&qb).map(|(x, y)| (x - y).abs() as f64).sum();
            let dw: f64 = a.iter().zip(&b).map(|(x, y)| (x - y).abs() as f64).sum();
            let ratio = dq / dw;
            assert!((ratio - 1.0 / (2.0 * DEFAULT_OFFSET)).abs() < 0.5, "{format:?}: flip ratio {ratio}");
            // Parking again from where it left the weight keeps it at the same boundaries.
            let mut again = a.clone();
            park(&mut again, format, scale, false, DEFAULT_OFFSET);
            assert_eq!(again, b, "{format:?}: a parked weight stays at its boundaries");
            // Each element stays within half a bin (plus the offset) of where it was.
            for (x, y) in w0.iter().zip(&a) {
                let q = cast(format, &[*x], scale)[0];
                assert!((y - x).abs() <= (q.abs() * 0.25).max(1e-3), "{format:?}: {x} parked at {y}");
            }
        }
    }

    #[test]
    fn zeros_non_finite_and_a_bad_scale_are_left_alone() {
        let mut w = vec![0.0, f32::NAN, f32::INFINITY, 1e30, 0.5];
        park(&mut w, Fp8Format::E4M3, 1.0, true, DEFAULT_OFFSET);
        assert_eq!(w[0], 0.0);
        assert!(w[1].is_nan() && w[2].is_infinite());
        assert_eq!(w[3], 1e30);
        assert_ne!(w[4], 0.5, "0.5 is a grid point: it moves to a boundary");
        let mut v = vec![0.3f32];
        park(&mut v, Fp8Format::E4M3, 0.0, true, DEFAULT_OFFSET);
        assert_eq!(v, [0.3]);
    }
}
