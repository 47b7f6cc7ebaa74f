//! How an FP8 weight's quantized values move against its master values between two recorded steps:
//! the oscillation of TetraJet-v2 (Chen et al.), where master weights that settle at a rounding
//! boundary flip their quantized value back and forth while they themselves barely move.
//!
//! Both steps are quantized on the current step's grid, so a change of scale is not counted as
//! motion. Over elements whose position between grid points is spread evenly, a master change of
//! |Δw| flips a bin of width b with probability |Δw|/b, so E|Δq| = |Δw|: the ratio
//! Σ|Δq| / Σ|Δw| is about 1 for weights moving freely, well above 1 for weights held at
//! boundaries (oscillation), and below 1 for weights frozen under the grid (updates smaller than
//! half a bin that never cross it).

use rayon::prelude::*;

/// The motion of one weight between two recorded steps.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WeightMotion {
    /// Elements whose quantized value changed.
    pub flips: u64,
    /// Σ |q_now − q_prev| over the finite elements (dequantized units).
    pub quant_change: f64,
    /// Σ |w_now − w_prev| over the same elements.
    pub master_change: f64,
}

impl WeightMotion {
    /// Bins flipped per unit of master-weight change, Σ|Δq| / Σ|Δw|; None when the master did not
    /// move.
    pub fn flip_ratio(&self) -> Option<f64> {
        (self.master_change > 0.0).then(|| self.quant_change / self.master_change)
    }
}

/// The motion from (`w_prev`, its quantization `q_prev`) to (`w_now`, `q_now`), both quantized on
/// one grid. Elements with a non-finite value in any of the four are left out.
pub fn weight_motion(w_prev: &[f32], w_now: &[f32], q_prev: &[f32], q_now: &[f32]) -> WeightMotion {
    const CHUNK: usize = 1 << 14;
    w_prev
        .par_chunks(CHUNK)
        .zip(w_now.par_chunks(CHUNK))
        .zip(q_prev.par_chunks(CHUNK))
        .zip(q_now.par_chunks(CHUNK))
        .map(|(((wp, wn), qp), qn)| {
            let mut m = WeightMotion::default();
            for (((&a, &b), &c), &d) in wp.iter().zip(wn).zip(qp).zip(qn) {
                if !(a.is_finite() && b.is_finite() && c.is_finite() && d.is_finite()) {
                    continue;
                }
                m.flips += u64::from(c != d);
                m.quant_change += (d as f64 - c as f64).abs();
                m.master_change += (b as f64 - a as f64).abs();
            }
            m
        })
        .reduce(WeightMotion::default, |a, b| WeightMotion {
            flips: a.flips + b.flips,
            quant_change: a.quant_change + b.quant_change,
            master_change: a.master_change + b.master_change,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fp8::{self, Fp8Format};
    use rand::{Rng, SeedableRng};
    use rand_pcg::Pcg64;

    fn quantized(w: &[f32], scale: f32) -> Vec<f32> {
        let mut q = vec![0u8; w.len()];
        fp8::quantize(Fp8Format::E4M3, w, scale, &mut q);
        let mut d = vec![0f32; w.len()];
        fp8::dequantize(Fp8Format::E4M3, &q, scale, &mut d);
        d
    }

    #[test]
    fn free_motion_flips_about_one_bin_per_bin_moved_and_held_weights_far_more() {
        let mut rng = Pcg64::seed_from_u64(7);
        let scale = 448.0 / 0.1;
        // Free: weights spread over the grid, each moved by a random 0.05 to 0.3 of its bin.
        let w0: Vec<f32> = (0..200_000).map(|_| rng.random_range(0.02f32..0.08)).collect();
        let w1: Vec<f32> = w0.iter().map(|&w| w + 0.0015 * rng.random_range(-1.0f32..1.0)).collect();
        let free = weight_motion(&w0, &w1, &quantized(&w0, scale), &quantized(&w1, scale));
        let r = free.flip_ratio().unwrap();
        assert!((r - 1.0).abs() < 0.05, "free motion: {r}");
        // Held: every weight sits a hair below a rounding boundary and steps a hair above it.
        let boundary = |w: f32| {
            // Halfway between w's grid point and the next one up (positive codes are ordered).
            let mut code = [0u8];
            fp8::quantize(Fp8Format::E4M3, &[w], scale, &mut code);
            let mut pair = [0f32; 2];
            fp8::dequantize(Fp8Format::E4M3, &[code[0], code[0] + 1], scale, &mut pair);
            (pair[0] + pair[1]) / 2.0
        };
        let b: Vec<f32> = w0.iter().map(|&w| boundary(w)).collect();
        let h0: Vec<f32> = b.iter().map(|&m| m * (1.0 - 1e-5)).collect();
        let h1: Vec<f32> = b.iter().map(|&m| m * (1.0 + 1e-5)).collect();
        let held = weight_motion(&h0, &h1, &quantized(&h0, scale), &quantized(&h1, scale));
        assert!(held.flip_ratio().unwrap() > 100.0, "held at boundaries: {:?}", held.flip_ratio());
        assert!(held.flips as f64 > 0.9 * h0.len() as f64);
        // Frozen: no element moves: no ratio.
        assert_eq!(weight_motion(&w0, &w0, &quantized(&w0, scale), &quantized(&w0, scale)).flip_ratio(), None);
    }
}
