//! Fork awareness: a child created by `fork()` inherits the profiler's
//! memory but none of its threads, so it must not use them.
//!
//! A `pthread_atfork` child handler, registered once when a session or a
//! sampler starts, sets one flag in the child. Everything that would talk to
//! the profiler's threads, wait for them, or take a lock one of them might
//! have held at the moment of the fork checks the flag first and does
//! nothing instead. The handler itself does one relaxed atomic store, which
//! is all POSIX allows between `fork()` and `exec()` in a multithreaded
//! process.

use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set in the child of a `fork()` taken after [`watch_fork`] ran.
static FORKED_CHILD: AtomicBool = AtomicBool::new(false);
static REGISTER: Once = Once::new();

extern "C" fn mark_child() {
    FORKED_CHILD.store(true, Ordering::Relaxed);
}

/// Registers the child handler, once per process.
pub(crate) fn watch_fork() {
    REGISTER.call_once(|| {
        // SAFETY: `mark_child` is an `extern "C" fn()` that only stores to a
        // static atomic, so it is safe to run in a freshly forked child; the
        // prepare and parent handlers are absent. Registration cannot be
        // undone, and the function lives for the whole program.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(mark_child)) };
        if rc != 0 {
            eprintln!(
                "sentry-profiling: pthread_atfork failed ({rc}); a forked child would not know its profiler is gone"
            );
        }
    });
}

/// Whether this process is the child of a `fork()` of a profiled process:
/// the profiler's threads do not exist here.
#[inline]
pub(crate) fn in_forked_child() -> bool {
    FORKED_CHILD.load(Ordering::Relaxed)
}
