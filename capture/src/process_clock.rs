//! Seconds since this process started, for the start-up figure of a run (`first_step_s` in the
//! manifest): from the kernel's record of the process start on Linux (so the loading of the binary
//! counts too), else from the first call of [`mark_start`] (which `main` makes first thing).

use std::sync::OnceLock;
use std::time::Instant;

static MARK: OnceLock<Instant> = OnceLock::new();

/// Notes the start of the program, for systems that do not say when the process started.
pub fn mark_start() {
    MARK.get_or_init(Instant::now);
}

/// Seconds since the process started (to 10 ms on Linux), or since [`mark_start`].
pub fn seconds_since_start() -> f64 {
    from_proc().unwrap_or_else(|| MARK.get_or_init(Instant::now).elapsed().as_secs_f64())
}

/// `/proc/uptime` minus the process's start time (`/proc/self/stat` field 22, in clock ticks since
/// boot).
fn from_proc() -> Option<f64> {
    let uptime: f64 = std::fs::read_to_string("/proc/uptime").ok()?.split_whitespace().next()?.parse().ok()?;
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces: count the fields after its closing parenthesis.
    let after = &stat[stat.rfind(')')? + 1..];
    let start_ticks: f64 = after.split_whitespace().nth(19)?.parse().ok()?;
    // SAFETY: sysconf only reads a system constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then(|| (uptime - start_ticks / ticks as f64).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_counts_from_the_process_start_and_moves_forward() {
        mark_start();
        let a = seconds_since_start();
        std::thread::sleep(std::time::Duration::from_millis(60));
        let b = seconds_since_start();
        assert!(a >= 0.0 && b > a && b - a < 5.0, "{a} then {b}");
        if let Some(p) = from_proc() {
            // The test process started before this test ran, and not hours ago.
            assert!(p > 0.0 && p < 3600.0, "{p}");
        }
    }
}
