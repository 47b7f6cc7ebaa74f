//! Exact statistics of a tensor and of its quantization error, computed on the host in f64 with a
//! fixed summation order (so that two identical runs record identical numbers).
//!
//! This module depends on no backend: the backends use it (the CPU to compute, the CUDA backend to
//! finish what its kernels reduced), and the types it defines travel in their reports.

use rayon::prelude::*;

/// Plain statistics of a tensor's finite values.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Moments {
    pub min: f32,
    pub max: f32,
    pub mean: f64,
    pub std: f64,
    /// log2(max |x| / min non-zero |x|), 0 when there is no non-zero value.
    pub dynamic_range_log2: f64,
}

/// Chunk size of the parallel reductions; partial results are combined in chunk order.
const CHUNK: usize = 1 << 15;

#[derive(Clone, Copy, Default)]
struct Partial {
    count: u64,
    sum: f64,
    sumsq: f64,
    min: f32,
    max: f32,
    amax: f32,
    min_abs_nonzero: f32,
}

fn partial(x: &[f32]) -> Partial {
    let mut p = Partial { min: f32::INFINITY, max: f32::NEG_INFINITY, min_abs_nonzero: f32::INFINITY, ..Default::default() };
    for &v in x {
        if !v.is_finite() {
            continue;
        }
        p.count += 1;
        p.sum += v as f64;
        p.sumsq += (v as f64) * (v as f64);
        p.min = p.min.min(v);
        p.max = p.max.max(v);
        let a = v.abs();
        p.amax = p.amax.max(a);
        if a > 0.0 {
            p.min_abs_nonzero = p.min_abs_nonzero.min(a);
        }
    }
    p
}

fn combine(a: Partial, b: Partial) -> Partial {
    Partial {
        count: a.count + b.count,
        sum: a.sum + b.sum,
        sumsq: a.sumsq + b.sumsq,
        min: a.min.min(b.min),
        max: a.max.max(b.max),
        amax: a.amax.max(b.amax),
        min_abs_nonzero: a.min_abs_nonzero.min(b.min_abs_nonzero),
    }
}

/// Min, max, mean, standard deviation (population) and dynamic range of the finite values of `x`.
/// With no finite value, every field is 0.
pub fn moments(x: &[f32]) -> Moments {
    let parts: Vec<Partial> = x.par_chunks(CHUNK).map(partial).collect();
    let p = parts.into_iter().reduce(combine).unwrap_or_default();
    if p.count == 0 {
        return Moments::default();
    }
    let n = p.count as f64;
    let mean = p.sum / n;
    let var = (p.sumsq / n - mean * mean).max(0.0);
    let dynamic_range_log2 = if p.amax > 0.0 && p.min_abs_nonzero.is_finite() { (p.amax as f64 / p.min_abs_nonzero as f64).log2() } else { 0.0 };
    Moments { min: p.min, max: p.max, mean, std: var.sqrt(), dynamic_range_log2 }
}

/// Sums (Σ (a−b)², Σ a·b, Σ a², Σ b², max |a−b|) over finite pairs, in chunk order.
fn error_sums(a: &[f32], b: &[f32]) -> (f64, f64, f64, f64, f64, u64) {
    a.par_chunks(CHUNK)
        .zip(b.par_chunks(CHUNK))
        .map(|(a, b)| {
            let mut s = (0.0f64, 0.0f64, 0.0f64, 0.0f64, 0.0f64, 0u64);
            for (&x, &y) in a.iter().zip(b) {
                let (x, y) = (x as f64, y as f64);
                if !x.is_finite() || !y.is_finite() {
                    continue;
                }
                let d = x - y;
                s.0 += d * d;
                s.1 += x * y;
                s.2 += x * x;
                s.3 += y * y;
                s.4 = s.4.max(d.abs());
                s.5 += 1;
            }
            s
        })
        .collect::<Vec<_>>()
        .into_iter()
        .fold((0.0, 0.0, 0.0, 0.0, 0.0, 0), |s, p| (s.0 + p.0, s.1 + p.1, s.2 + p.2, s.3 + p.3, s.4.max(p.4), s.5 + p.5))
}

/// Cosine similarity of two vectors; 1 when both are zero, 0 when exactly one is.
pub fn cosine_from(dot: f64, na2: f64, nb2: f64) -> f64 {
    if na2 == 0.0 && nb2 == 0.0 {
        1.0
    } else if na2 == 0.0 || nb2 == 0.0 {
        0.0
    } else {
        dot / (na2.sqrt() * nb2.sqrt())
    }
}

/// How a cast's dequantized values differ from its input.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QuantError {
    /// Mean squared error.
    pub mse: f64,
    /// Cosine similarity.
    pub cos: f64,
    /// Multiplicative bias ⟨x, q⟩ / ⟨x, x⟩ − 1 (0 when x is all zero).
    pub bias: f64,
}

impl QuantError {
    /// From the sums Σ (q−x)², Σ q·x, Σ q², Σ x² over `n` finite pairs.
    pub fn from_sums(d2: f64, dot: f64, q2: f64, x2: f64, n: f64) -> QuantError {
        QuantError { mse: if n == 0.0 { 0.0 } else { d2 / n }, cos: cosine_from(dot, q2, x2), bias: if x2 == 0.0 { 0.0 } else { dot / x2 - 1.0 } }
    }
}

/// MSE, cosine and multiplicative bias of `approx` against `exact`, over pairs where both are finite.
pub fn quant_error(exact: &[f32], approx: &[f32]) -> QuantError {
    let (d2, dot, a2, b2, _, n) = error_sums(approx, exact);
    QuantError::from_sums(d2, dot, a2, b2, n as f64)
}

/// The error's signed first-order effect: (⟨test − reference, dual⟩, ‖dual‖), in f64 over the
/// elements where all three are finite. A non-finite value in `test` makes the inner product NaN,
/// as in [`output_error`].
pub fn error_inner(test: &[f32], reference: &[f32], dual: &[f32]) -> (f64, f64) {
    let (inner, d2, nonfinite) = test
        .par_chunks(CHUNK)
        .zip(reference.par_chunks(CHUNK))
        .zip(dual.par_chunks(CHUNK))
        .map(|((t, r), g)| {
            let mut s = (0.0f64, 0.0f64, false);
            for ((&x, &y), &z) in t.iter().zip(r).zip(g) {
                if !x.is_finite() {
                    s.2 = true;
                    continue;
                }
                if !y.is_finite() || !z.is_finite() {
                    continue;
                }
                s.0 += (x as f64 - y as f64) * z as f64;
                s.1 += z as f64 * z as f64;
            }
            s
        })
        .collect::<Vec<_>>()
        .into_iter()
        .fold((0.0, 0.0, false), |s, p| (s.0 + p.0, s.1 + p.1, s.2 || p.2));
    (if nonfinite { f64::NAN } else { inner }, d2.sqrt())
}

/// Error of `test` against `reference`: (cosine, MSE, relative L2 ‖t−r‖/‖r‖, max |t−r|), over
/// finite pairs. Non-finite values in `test` make every metric NaN: an error must not hide them.
pub fn output_error(test: &[f32], reference: &[f32]) -> (f64, f64, f64, f64) {
    if test.iter().any(|v| !v.is_finite()) {
        return (f64::NAN, f64::NAN, f64::NAN, f64::NAN);
    }
    let (d2, dot, t2, r2, maxabs, n) = error_sums(test, reference);
    let mse = if n == 0 { 0.0 } else { d2 / n as f64 };
    let rel = if r2 == 0.0 { if d2 == 0.0 { 0.0 } else { f64::INFINITY } } else { (d2 / r2).sqrt() };
    (cosine_from(dot, t2, r2), mse, rel, maxabs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_inner_is_the_signed_pairing_of_the_error_with_its_dual() {
        // A gradient clipped at 1: the error points against the gradient, so its pairing with the
        // gradient (the descent signal lost) is negative and equals -Σ (|g| - 1)·|g| over the clipped.
        let g: Vec<f32> = (0..1000).map(|i| ((i as f32) * 0.013).sin() * 2.0).collect();
        let clipped: Vec<f32> = g.iter().map(|v| v.clamp(-1.0, 1.0)).collect();
        let (inner, norm) = error_inner(&clipped, &g, &g);
        let want: f64 = g.iter().map(|&v| v as f64).filter(|v| v.abs() > 1.0).map(|v| -(v.abs() - 1.0) * v.abs()).sum();
        assert!(inner < 0.0 && (inner - want).abs() < 1e-9 * want.abs(), "{inner} vs {want}");
        assert!((norm - g.iter().map(|&v| (v as f64).powi(2)).sum::<f64>().sqrt()).abs() < 1e-9);
        // A non-finite result cannot hide behind the sum.
        let mut bad = clipped.clone();
        bad[3] = f32::INFINITY;
        assert!(error_inner(&bad, &g, &g).0.is_nan());
    }

    #[test]
    fn moments_match_a_direct_f64_computation() {
        let x: Vec<f32> = (0..100_003).map(|i| ((i as f32) * 0.37).sin() * 3.0 + 0.25).collect();
        let m = moments(&x);
        let n = x.len() as f64;
        let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
        assert!((m.mean - mean).abs() < 1e-12, "{} vs {mean}", m.mean);
        assert!((m.std - var.sqrt()).abs() / var.sqrt() < 1e-9);
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        let amin = x.iter().filter(|v| **v != 0.0).fold(f32::INFINITY, |a, v| a.min(v.abs()));
        assert!((m.dynamic_range_log2 - (amax as f64 / amin as f64).log2()).abs() < 1e-12);
    }

    #[test]
    fn nonfinite_values_are_skipped_by_moments_but_poison_output_error() {
        let x = [1.0, f32::NAN, -3.0, f32::INFINITY];
        let m = moments(&x);
        assert_eq!((m.min, m.max), (-3.0, 1.0));
        assert!(output_error(&x, &[1.0, 1.0, 1.0, 1.0]).0.is_nan());
    }

    #[test]
    fn output_error_is_exact_on_a_known_pair() {
        let r = [3.0f32, 4.0];
        let t = [3.0f32, 5.0];
        let (cos, mse, rel, maxabs) = output_error(&t, &r);
        assert!((cos - 29.0 / (5.0 * 34f64.sqrt())).abs() < 1e-15);
        assert_eq!((mse, rel, maxabs), (0.5, 0.2, 1.0));
    }
}
