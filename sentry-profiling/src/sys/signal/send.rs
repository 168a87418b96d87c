//! Signals from the sampler thread (`rt_tgsigqueueinfo`, `SI_QUEUE`), for
//! threads without a CPU-time timer that it sees running.

use std::sync::atomic::Ordering;

use super::*;

/// Why a signal could not be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendError {
    /// The thread no longer exists.
    ThreadGone,
    /// The kernel's queue of pending real-time signals is full.
    QueueFull,
    /// No handler is installed.
    NotInstalled,
    /// Any other `errno`.
    Os(i32),
}

/// The kernel's `siginfo_t` layout for a queued signal (x86_64, aarch64).
#[repr(C)]
pub(super) struct QueuedSigInfo {
    pub(super) signo: i32,
    pub(super) errno: i32,
    pub(super) code: i32,
    pub(super) _pad0: i32,
    pub(super) pid: i32,
    pub(super) uid: u32,
    pub(super) value: usize,
    pub(super) _rest: [u8; 128 - 32],
}

// The kernel's layout (64-bit): `si_pid`, `si_uid`, then the `sigval`
// aligned to 8; 128 bytes in all, as `rt_tgsigqueueinfo` reads.
const _: () = {
    assert!(std::mem::offset_of!(QueuedSigInfo, code) == 8);
    assert!(std::mem::offset_of!(QueuedSigInfo, pid) == 16);
    assert!(std::mem::offset_of!(QueuedSigInfo, uid) == 20);
    assert!(std::mem::offset_of!(QueuedSigInfo, value) == 24);
    assert!(std::mem::size_of::<QueuedSigInfo>() == 128);
    assert!(std::mem::size_of::<QueuedSigInfo>() == std::mem::size_of::<libc::siginfo_t>());
};

/// Sends the profiling signal to thread `tid` of this process, naming `slot`.
pub(crate) fn send_sample_signal(tid: i32, slot: &Slot) -> Result<(), SendError> {
    let sig = SIGNAL.load(Ordering::Acquire);
    if sig == 0 {
        return Err(SendError::NotInstalled);
    }
    let pid = OWN_PID.load(Ordering::Relaxed);
    let info = QueuedSigInfo {
        signo: sig,
        errno: 0,
        code: SI_QUEUE,
        _pad0: 0,
        pid,
        uid: OWN_UID.load(Ordering::Relaxed),
        value: slot.index as usize,
        _rest: [0; 96],
    };
    match queue_signal(pid, tid, &info) {
        Ok(()) => Ok(()),
        Err(libc::ESRCH) => Err(SendError::ThreadGone),
        Err(libc::EAGAIN) => Err(SendError::QueueFull),
        Err(e) => Err(SendError::Os(e)),
    }
}

/// `rt_tgsigqueueinfo` of `info` (its `signo` the signal) to thread `tid` of
/// process `pid`; `Err` holds the `errno`.
pub(super) fn queue_signal(pid: i32, tid: i32, info: &QueuedSigInfo) -> Result<(), i32> {
    // SAFETY: rt_tgsigqueueinfo reads a 128-byte siginfo from a valid pointer;
    // `QueuedSigInfo` is exactly that size and lives for the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_rt_tgsigqueueinfo,
            pid as libc::c_long,
            tid as libc::c_long,
            info.signo as libc::c_long,
            std::ptr::from_ref(info),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}
