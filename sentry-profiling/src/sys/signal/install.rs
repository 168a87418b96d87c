//! Installing the handler: picking a free signal (never one the
//! application handles or ignores), once per process, never uninstalled.

use std::sync::atomic::Ordering;

use super::probe::probe_vm_read;
use super::*;

/// The signal the handler was installed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SignalSetup {
    /// The signal number.
    pub(crate) signal: i32,
}

/// Installs the handler (once per process) and returns the signal in use.
///
/// With `preferred`, that signal is used if it has no handler or already has
/// ours; otherwise the highest real-time signal whose disposition is
/// `SIG_DFL` is taken. A signal the application handles or ignores is never
/// touched.
pub(crate) fn install_handler(preferred: Option<i32>) -> Result<SignalSetup, String> {
    let _guard = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: getpid has no preconditions.
    OWN_PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
    // SAFETY: getuid has no preconditions.
    OWN_UID.store(unsafe { libc::getuid() }, Ordering::Relaxed);
    VM_READ.store(probe_vm_read().is_ok(), Ordering::Relaxed);
    MAIN_STACK_TOP.store(
        crate::sys::maps::stack_mappings()
            .main_stack_top()
            .unwrap_or(0),
        Ordering::Relaxed,
    );
    let current = SIGNAL.load(Ordering::Relaxed);
    if current != 0 {
        if preferred.is_some_and(|p| p != current) {
            return Err(format!(
                "the profiler already uses signal {current}; it cannot switch to {} in this process",
                preferred.unwrap_or_default()
            ));
        }
        if !handler_is_ours(current) {
            return Err(format!(
                "signal {current} was taken over by another handler after the profiler installed it"
            ));
        }
        return Ok(SignalSetup { signal: current });
    }
    let candidates: Vec<i32> = match preferred {
        Some(sig) => vec![sig],
        None => (libc::SIGRTMIN()..=libc::SIGRTMAX()).rev().collect(),
    };
    for sig in candidates {
        if !disposition_is_default(sig) {
            continue;
        }
        // Not `SA_ONSTACK`: the handler runs on the interrupted stack. A
        // thread's alternate signal stack is the application's, small (std
        // gives each thread `max(SIGSTKSZ, AT_MINSIGSTKSZ)` bytes, 8 KiB on
        // x86_64, above a guard page; C code may give 2 to 4 KiB), and made
        // for its crash handlers: the kernel's frame (3.4 KiB with AVX-512
        // state) and the handler there left too little room (a frame larger
        // than the stack is a SIGSEGV from the kernel; under valgrind, whose
        // frames are larger, the guard page was hit at a shutdown). A
        // thread's own stack has room for a call of a few KiB wherever it
        // can make one.
        //
        // `SA_NODEFER`: the signal stays deliverable while the handler
        // runs. The process-wide timer's signal (see `spare`) is
        // process-directed: the kernel gives it to the thread that was
        // running, unless that thread blocks it, and then to another
        // thread, which may be blocked in a system call that fails with
        // `EINTR` when the signal wakes it. A thread blocks the signal
        // while it runs its handler unless this flag is set. The handler
        // is re-entrant: a nested delivery claims another slot (or none)
        // with the same compare-and-swap, and the known-thread check
        // returns at once.
        //
        // SAFETY: a zeroed sigaction is a valid starting value; the handler
        // has the SA_SIGINFO signature and is async-signal-safe (see
        // `handler`); the old action is written to a local.
        let installed = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = handler as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_NODEFER;
            libc::sigemptyset(&mut action.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, &action, &mut old) == 0 && old.sa_sigaction == libc::SIG_DFL
        };
        if installed {
            SIGNAL.store(sig, Ordering::Release);
            return Ok(SignalSetup { signal: sig });
        }
    }
    Err(match preferred {
        Some(sig) => format!(
            "`signal` {sig} already has a handler or is ignored (it was left alone); choose another"
        ),
        None => "every real-time signal already has a handler; set a free one with `signal`".into(),
    })
}

/// The addresses signal handlers return to (`sa_restorer`: libc's
/// `__restore_rt`, which makes the `rt_sigreturn` system call), over every
/// signal that has a handler now. A frame whose return address is one of
/// them is a signal handler's: the interrupted code's registers are in the
/// kernel's signal frame above it (see `unwind::signal_frame`). Empty
/// where the C library leaves the return to the kernel (aarch64's glibc:
/// the vDSO's trampoline).
pub(crate) fn signal_restorers() -> Vec<u64> {
    let mut restorers = Vec::new();
    for sig in 1..=libc::SIGRTMAX() {
        let Some(action) = current_action(sig) else {
            continue;
        };
        if action.sa_sigaction == libc::SIG_DFL || action.sa_sigaction == libc::SIG_IGN {
            continue;
        }
        if let Some(restorer) = action.sa_restorer {
            let addr = restorer as usize as u64;
            if !restorers.contains(&addr) {
                restorers.push(addr);
            }
        }
    }
    restorers
}

pub(super) fn current_action(sig: i32) -> Option<libc::sigaction> {
    // SAFETY: querying with a null new action only writes `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        (libc::sigaction(sig, std::ptr::null(), &mut old) == 0).then_some(old)
    }
}

pub(super) fn disposition_is_default(sig: i32) -> bool {
    current_action(sig).is_some_and(|a| a.sa_sigaction == libc::SIG_DFL)
}

pub(super) fn handler_is_ours(sig: i32) -> bool {
    current_action(sig).is_some_and(|a| a.sa_sigaction == handler as *const () as usize)
}
