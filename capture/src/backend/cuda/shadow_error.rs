//! The error of an FP8 GEMM's result against its BF16 shadow GEMM (dump steps with `--shadow`, and
//! the flight recorder's), summed on the device by `output_error_partial` (`kernels/stats.cu`):
//! eight f64 partials a block come back instead of both outputs (two 32 MB downloads and a host pass
//! for one GEMM at the `seed` preset, several seconds a dump step over its 144 GEMMs). The CPU
//! references are [`crate::tensor_stats::output_error`] and, for a gradient GEMM's error paired
//! with its BF16 result (its dual: `dual_inner`, `dual_norm`), [`crate::tensor_stats::error_inner`]:
//! the same sums over the same finite pairs, in another order (f64, so they agree to its rounding),
//! and NaN when the FP8 result holds a non-finite value. An fprop's dual, dY, comes with the
//! backward; the GPU leaves it null.

use super::{CudaBackend, CudaError, DevBuf, cfg, grow};
use crate::tensor_stats::cosine_from;
use cudarc::driver::{CudaSlice, PushKernelArg};

/// Threads per block of `output_error_partial`.
const THREADS: u32 = 256;
/// Pairs each thread covers, at most (before the block count is capped).
const PER_THREAD: usize = 16;
/// Most blocks: the partials stay a few KB.
const MAX_BLOCKS: usize = 528;
/// Partials a block writes (kernels/stats.cu: output_error_partial).
const FIELDS: usize = 8;

/// A shadow GEMM's error: `output_error`'s (cosine, MSE, relative L2, max |t−r|), and `error_inner`
/// with the reference as the dual: (⟨t − r, r⟩, ‖r‖).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OutputError {
    pub cosine: f64,
    pub mse: f64,
    pub rel_l2: f64,
    pub max_abs_diff: f64,
    pub inner_with_reference: f64,
    pub reference_norm: f64,
}

/// The error from the blocks' partials, added in block order, as `output_error` and `error_inner`
/// finish their sums.
pub(super) fn error_from_partials(partials: &[f64]) -> OutputError {
    let mut s = [0.0f64; FIELDS];
    for b in partials.chunks_exact(FIELDS) {
        for k in 0..FIELDS {
            s[k] = if k == 4 { s[k].max(b[k]) } else { s[k] + b[k] };
        }
    }
    let [d2, dot, t2, r2, maxabs, pairs, nonfinite, inner] = s;
    let reference_norm = r2.sqrt();
    if nonfinite > 0.0 {
        return OutputError { cosine: f64::NAN, mse: f64::NAN, rel_l2: f64::NAN, max_abs_diff: f64::NAN, inner_with_reference: f64::NAN, reference_norm };
    }
    let mse = if pairs == 0.0 { 0.0 } else { d2 / pairs };
    let rel_l2 = if r2 == 0.0 { if d2 == 0.0 { 0.0 } else { f64::INFINITY } } else { (d2 / r2).sqrt() };
    OutputError { cosine: cosine_from(dot, t2, r2), mse, rel_l2, max_abs_diff: maxabs, inner_with_reference: inner, reference_norm }
}

impl CudaBackend {
    /// The error of `test` (f32 or BF16 storage) against `reference`'s first `test.len()` values,
    /// summed on the device. Synchronises (downloads the partials).
    pub(super) fn output_error_impl(&mut self, test: &DevBuf, reference: &CudaSlice<f32>) -> Result<OutputError, CudaError> {
        let n = test.len();
        if reference.len() < n {
            return Err(CudaError::Unsupported(format!("a shadow GEMM's reference holds {} values, its result {n}", reference.len())));
        }
        self.leave_step_graph()?;
        let blocks = n.div_ceil(THREADS as usize * PER_THREAD).clamp(1, MAX_BLOCKS);
        grow(&self.stream, &mut self.red, blocks * FIELDS)?;
        let (tp, rp, out) = (self.ptr(test.raw()), self.ptr(reference), self.ptr(&self.red));
        launch!(self, "output_error_partial", cfg((blocks as u32, 1, 1), THREADS), tp, test.is_bf16() as i32, rp, n as u64, out)?;
        let partials = self.stream.clone_dtoh(&self.red.slice(0..blocks * FIELDS))?;
        Ok(error_from_partials(&partials))
    }

    /// [`Self::output_error_impl`] for the tests that hold it against the CPU's `output_error`.
    pub fn output_error_for_test(&mut self, test: &DevBuf, reference: &DevBuf) -> Result<OutputError, CudaError> {
        if reference.is_bf16() {
            return Err(CudaError::Unsupported("the shadow reference is an f32 buffer".into()));
        }
        self.output_error_impl(test, reference)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_partials_finish_as_the_cpu_reference_does() {
        let t: Vec<f32> = (0..1000).map(|i| ((i as f32) * 0.37).sin()).collect();
        let r: Vec<f32> = t.iter().enumerate().map(|(i, v)| v + if i % 7 == 0 { 0.01 } else { 0.0 }).collect();
        // Two blocks' partials, split anywhere: the sums are additive, the max is a max.
        let part = |a: &[f32], b: &[f32]| -> [f64; FIELDS] {
            let mut p = [0.0; FIELDS];
            for (&x, &y) in a.iter().zip(b) {
                let (x, y) = (f64::from(x), f64::from(y));
                let d = x - y;
                p = [p[0] + d * d, p[1] + x * y, p[2] + x * x, p[3] + y * y, p[4].max(d.abs()), p[5] + 1.0, 0.0, p[7] + d * y];
            }
            p
        };
        let (p1, p2) = (part(&t[..300], &r[..300]), part(&t[300..], &r[300..]));
        let got = error_from_partials(&[p1, p2].concat());
        let want = crate::tensor_stats::output_error(&t, &r);
        let (inner, norm) = crate::tensor_stats::error_inner(&t, &r, &r);
        for (g, w) in [
            (got.cosine, want.0),
            (got.mse, want.1),
            (got.rel_l2, want.2),
            (got.max_abs_diff, want.3),
            (got.inner_with_reference, inner),
            (got.reference_norm, norm),
        ] {
            assert!((g - w).abs() <= 1e-12 * w.abs().max(1e-30), "{got:?} vs {want:?}, ({inner}, {norm})");
        }
        let mut bad = [p1, p2].concat();
        bad[FIELDS + 6] = 1.0;
        let b = error_from_partials(&bad);
        assert!(b.cosine.is_nan() && b.max_abs_diff.is_nan() && b.inner_with_reference.is_nan());
        let none = error_from_partials(&[]);
        assert_eq!((none.cosine, none.mse, none.rel_l2, none.max_abs_diff), (1.0, 0.0, 0.0, 0.0), "no pairs: two zero vectors");
    }
}
