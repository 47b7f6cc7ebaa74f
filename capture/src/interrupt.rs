//! Ctrl-C and SIGTERM during training: the first one asks the loop to stop after the current step,
//! so the run ends with every step it trained recorded and a manifest that says it was interrupted;
//! a second one ends the process at once (closed parts stay readable either way).

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    if STOP.swap(true, Ordering::SeqCst) {
        // Second signal: leave now. _exit is async-signal-safe.
        unsafe { libc::_exit(130) };
    }
}

/// Installs the handlers (SIGINT, SIGTERM).
pub fn install() {
    // SAFETY: `on_signal` only touches an atomic and calls `_exit`, both async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

/// Whether a stop was requested.
pub fn requested() -> bool {
    STOP.load(Ordering::SeqCst)
}
