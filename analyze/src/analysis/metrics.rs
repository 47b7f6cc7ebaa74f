//! The error metrics between a run's tensor `a` and the baseline's `b`, accumulated in f64 over
//! flat f32 buffers in one pass (so a tensor split over several rows or batches adds up exactly).
//!
//! Definitions (also in README.md), with d = a − b over the n aligned elements:
//! - cosine = Σab / (‖a‖·‖b‖); 1 when d = 0, 0 when exactly one of a, b is all zeros;
//! - mse = Σd² / n;
//! - rel_l2 = ‖d‖ / ‖b‖ (0 when d = 0, +∞ when b = 0 ≠ d);
//! - sqnr_db = 10·log10(‖b‖² / ‖d‖²) (+∞ when d = 0);
//! - max_abs_diff = max |d|.
//!
//! Any non-finite element makes the sums non-finite; `nonfinite` counts such element pairs.

use serde::Serialize;

/// Running sums over aligned element pairs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Accum {
    pub n: u64,
    pub dot: f64,
    pub aa: f64,
    pub bb: f64,
    pub dd: f64,
    pub max_abs: f64,
    pub nonfinite: u64,
}

/// The metrics of one tensor pair.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Metrics {
    pub numel: u64,
    pub cosine: f64,
    pub mse: f64,
    pub rel_l2: f64,
    pub sqnr_db: f64,
    pub max_abs_diff: f64,
    /// Element pairs where the run's or the baseline's value is NaN or ±∞.
    pub nonfinite: u64,
}

impl Accum {
    /// Adds the element pairs of `a` (run) and `b` (baseline); the slices have equal lengths.
    pub fn add(&mut self, a: &[f32], b: &[f32]) {
        debug_assert_eq!(a.len(), b.len());
        // Four independent lanes let the CPU overlap the dependent f64 adds.
        let mut dot = [0f64; 4];
        let mut aa = [0f64; 4];
        let mut bb = [0f64; 4];
        let mut dd = [0f64; 4];
        let mut mx = [0f64; 4];
        let ca = a.chunks_exact(4);
        let cb = b.chunks_exact(4);
        let (ra, rb) = (ca.remainder(), cb.remainder());
        for (qa, qb) in ca.zip(cb) {
            for k in 0..4 {
                let (x, y) = (qa[k] as f64, qb[k] as f64);
                let d = x - y;
                dot[k] += x * y;
                aa[k] += x * x;
                bb[k] += y * y;
                dd[k] += d * d;
                mx[k] = mx[k].max(d.abs());
            }
        }
        for (&x, &y) in ra.iter().zip(rb) {
            let (x, y) = (x as f64, y as f64);
            let d = x - y;
            dot[0] += x * y;
            aa[0] += x * x;
            bb[0] += y * y;
            dd[0] += d * d;
            mx[0] = mx[0].max(d.abs());
        }
        let sum = |v: [f64; 4]| (v[0] + v[1]) + (v[2] + v[3]);
        self.dot += sum(dot);
        self.aa += sum(aa);
        self.bb += sum(bb);
        self.dd += sum(dd);
        self.max_abs = self.max_abs.max(mx.into_iter().fold(0.0, f64::max));
        self.n += a.len() as u64;
        if !(self.dot.is_finite() && self.aa.is_finite() && self.bb.is_finite()) || self.nonfinite > 0 {
            self.nonfinite += a.iter().zip(b).filter(|(x, y)| !x.is_finite() || !y.is_finite()).count() as u64;
        }
    }

    /// The metrics of everything added so far.
    pub fn finish(&self) -> Metrics {
        let n = self.n;
        let nan = f64::NAN;
        if self.nonfinite > 0 {
            return Metrics { numel: n, cosine: nan, mse: nan, rel_l2: nan, sqnr_db: nan, max_abs_diff: nan, nonfinite: self.nonfinite };
        }
        let cosine = if self.dd == 0.0 {
            1.0
        } else if self.aa == 0.0 || self.bb == 0.0 {
            0.0
        } else {
            (self.dot / (self.aa.sqrt() * self.bb.sqrt())).clamp(-1.0, 1.0)
        };
        let mse = if n == 0 { 0.0 } else { self.dd / n as f64 };
        let rel_l2 = if self.dd == 0.0 {
            0.0
        } else if self.bb == 0.0 {
            f64::INFINITY
        } else {
            self.dd.sqrt() / self.bb.sqrt()
        };
        let sqnr_db = if self.dd == 0.0 { f64::INFINITY } else { 10.0 * (self.bb / self.dd).log10() };
        Metrics { numel: n, cosine, mse, rel_l2, sqnr_db, max_abs_diff: self.max_abs, nonfinite: 0 }
    }
}

/// The error measure `locate` ranks by: 1 − cosine, and 2 (cosine −1, the worst) when the
/// tensors hold non-finite values.
pub fn error_of_cosine(cosine: f64) -> f64 {
    if cosine.is_finite() { 1.0 - cosine } else { 2.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(a: &[f32], b: &[f32]) -> Metrics {
        let mut acc = Accum::default();
        acc.add(a, b);
        acc.finish()
    }

    #[test]
    fn identical_tensors_give_cosine_one_and_no_error() {
        let a: Vec<f32> = (0..103).map(|i| (i as f32 * 0.37).sin()).collect();
        let m = metrics(&a, &a);
        assert_eq!((m.cosine, m.mse, m.rel_l2, m.max_abs_diff), (1.0, 0.0, 0.0, 0.0));
        assert!(m.sqnr_db.is_infinite() && m.sqnr_db > 0.0);
    }

    #[test]
    fn metrics_match_their_definitions_on_a_worked_example() {
        // a = (1, 2, 3, 4, 5), b = (1, 2, 3, 4, 4): d = (0, 0, 0, 0, 1).
        let m = metrics(&[1., 2., 3., 4., 5.], &[1., 2., 3., 4., 4.]);
        let (ab, aa, bb) = (1. + 4. + 9. + 16. + 20., 55.0f64, 46.0f64);
        assert!((m.cosine - ab / (aa.sqrt() * bb.sqrt())).abs() < 1e-15);
        assert_eq!(m.mse, 0.2);
        assert!((m.rel_l2 - 1.0 / 46f64.sqrt()).abs() < 1e-15);
        assert!((m.sqnr_db - 10.0 * 46f64.log10()).abs() < 1e-12);
        assert_eq!(m.max_abs_diff, 1.0);
    }

    #[test]
    fn splitting_a_tensor_over_several_adds_changes_nothing_but_rounding() {
        let a: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.1).cos()).collect();
        let b: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.1).cos() + 0.01 * (i as f32).sin()).collect();
        let whole = metrics(&a, &b);
        let mut acc = Accum::default();
        for (x, y) in a.chunks(77).zip(b.chunks(77)) {
            acc.add(x, y);
        }
        let parts = acc.finish();
        assert!((whole.cosine - parts.cosine).abs() < 1e-14);
        assert!((whole.mse - parts.mse).abs() / whole.mse < 1e-12);
        assert_eq!(whole.max_abs_diff, parts.max_abs_diff);
    }

    #[test]
    fn non_finite_values_are_counted_and_poison_the_metrics() {
        let m = metrics(&[1.0, f32::NAN, 3.0, f32::INFINITY, 5.0], &[1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(m.nonfinite, 2);
        assert!(m.cosine.is_nan());
        assert_eq!(error_of_cosine(m.cosine), 2.0);
    }

    #[test]
    fn zero_tensors_have_defined_metrics() {
        let z = [0.0f32; 8];
        let one = [1.0f32; 8];
        assert_eq!(metrics(&z, &z).cosine, 1.0);
        assert_eq!(metrics(&one, &z).cosine, 0.0);
        assert!(metrics(&one, &z).rel_l2.is_infinite());
    }
}
