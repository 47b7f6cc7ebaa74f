//! A measurement aid (`kernels/probe.cu`): with `FP8SCOPE_LEAD_US=N`, every step's forward starts
//! by holding the GPU for N µs, so that the host queues the whole step before the GPU starts it
//! and the GPU starts it rested. The step's time less N is the step with no wait for the host's
//! launches, at the clock of a GPU that has cooled below its power limit: on an H200 at llama-1b
//! the held step runs 7 ms faster at about 1935 MHz against 1695, while the profiler's idle time
//! between spans puts the wait for the host at 0.5 ms (bench/power.sh; bench/BENCHMARKS.md).
//! Off by default, and it changes no value a run records but `step_ms`.

use super::{CudaBackend, CudaError, cfg};
use cudarc::driver::PushKernelArg;

/// The hold in nanoseconds asked by `FP8SCOPE_LEAD_US` (`None`: unset, 0: none; a value that is
/// not a whole number of µs is an error, rather than a silent run without the hold).
pub(super) fn lead_ns(value: Option<&str>) -> Result<u64, CudaError> {
    match value {
        None => Ok(0),
        Some(v) => v
            .trim()
            .parse::<u64>()
            .map(|us| us.saturating_mul(1000))
            .map_err(|_| CudaError::Setting(format!("FP8SCOPE_LEAD_US={v}: expected a whole number of microseconds"))),
    }
}

impl CudaBackend {
    /// Queues the hold of `FP8SCOPE_LEAD_US` (the caller skips it, and its profiler span, when
    /// the variable is unset).
    pub(super) fn lead(&mut self) -> Result<(), CudaError> {
        let ns = self.settings.lead_ns;
        launch!(self, "hold_device", cfg((1, 1, 1), 1), ns)
    }
}

#[cfg(test)]
mod tests {
    use super::lead_ns;

    #[test]
    fn the_lead_is_read_in_microseconds_and_refuses_what_is_not_a_number() {
        assert_eq!(lead_ns(Some("250")).unwrap(), 250_000);
        assert_eq!(lead_ns(Some(" 7 ")).unwrap(), 7_000);
        assert!(lead_ns(Some("2.5ms")).unwrap_err().to_string().contains("FP8SCOPE_LEAD_US=2.5ms"));
        assert!(lead_ns(Some("-1")).is_err());
        assert_eq!(lead_ns(None).unwrap(), 0);
    }
}
