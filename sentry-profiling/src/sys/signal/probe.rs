//! Probes of the system calls the sampler captures stacks with, each made
//! in a way that changes nothing: a seccomp policy (as locked-down
//! container profiles have) may refuse any of them, and the sampler wants
//! to know which before it relies on them, to fall back and to say so.
//!
//! A seccomp filter belongs to the thread that installed it and the threads
//! created after it, so a probe answers for the thread that makes it: the
//! sampler thread probes what it calls itself.

use super::send::{QueuedSigInfo, queue_signal};
use super::timer::{KernelSigEvent, create_on_cpu_clock, set_timer};
use super::*;

/// `sigev_notify` value of a timer that notifies nobody.
const SIGEV_NONE: i32 = 1;

/// The `errno` of the system call just made.
fn last_errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EINVAL)
}

/// Whether the calling thread may signal threads of this process with
/// `rt_tgsigqueueinfo`, as [`super::send_sample_signal`] does; `Err` holds
/// the `errno`. Sends signal 0 to the calling thread: the kernel makes its
/// checks and delivers nothing.
pub(crate) fn probe_signal() -> Result<(), i32> {
    // SAFETY: getpid and getuid have no preconditions.
    let (pid, uid) = unsafe { (libc::getpid(), libc::getuid()) };
    let tid = crate::sys::current_tid();
    let info = QueuedSigInfo {
        signo: 0,
        errno: 0,
        code: SI_QUEUE,
        _pad0: 0,
        pid,
        uid,
        value: usize::MAX,
        _rest: [0; 96],
    };
    // Signal 0 is never delivered.
    queue_signal(pid, tid, &info)
}

/// Whether the calling thread may create, set, read and delete a CPU-time
/// timer, as [`super::CpuTimer`] does; `Err` holds the first call refused
/// and its `errno`. The timer, on the calling thread's own CPU clock,
/// notifies nobody, is only ever set disarmed, and is deleted at once (a
/// policy that refuses `timer_delete` leaves this one timer behind: the
/// sampler then creates no more, which would each be left behind when
/// their thread ends).
pub(crate) fn probe_cpu_timer() -> Result<(), (&'static str, i32)> {
    let tid = crate::sys::current_tid();
    let event = KernelSigEvent {
        value: 0,
        signo: 0,
        notify: SIGEV_NONE,
        tid: 0,
        _pad: [0; 11],
    };
    let id = create_on_cpu_clock(tid, &event).map_err(|e| ("timer_create", e))?;
    // Disarmed (all zero): the probe changes nothing.
    let mut result = set_timer(id, std::time::Duration::ZERO, std::time::Duration::ZERO)
        .map_err(|e| ("timer_settime", e));
    if result.is_ok() {
        let zero = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let mut current = libc::itimerspec {
            it_interval: zero,
            it_value: zero,
        };
        // SAFETY: timer_gettime on the timer just created, writing a valid
        // itimerspec.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_timer_gettime,
                id as libc::c_long,
                std::ptr::from_mut(&mut current),
            )
        };
        if rc != 0 {
            result = Err(("timer_gettime", last_errno()));
        }
    }
    // SAFETY: deletes the timer created above; it is not used again.
    let rc = unsafe { libc::syscall(libc::SYS_timer_delete, id as libc::c_long) };
    if rc != 0 && result.is_ok() {
        result = Err(("timer_delete", last_errno()));
    }
    result
}

/// Whether `process_vm_readv` can read this process's own memory from the
/// calling thread; `Err` holds the `errno`.
pub(crate) fn probe_vm_read() -> Result<(), i32> {
    let src = [0x5au8; 16];
    let mut dst = [0u8; 16];
    let local = libc::iovec {
        iov_base: dst.as_mut_ptr().cast(),
        iov_len: dst.len(),
    };
    let remote = libc::iovec {
        iov_base: src.as_ptr() as *mut libc::c_void,
        iov_len: src.len(),
    };
    // SAFETY: getpid has no preconditions; both buffers are valid locals of
    // the given lengths.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n < 0 {
        return Err(last_errno());
    }
    if n == src.len() as isize && dst == src {
        Ok(())
    } else {
        Err(libc::EFAULT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_pass_without_a_seccomp_policy() {
        assert_eq!(probe_signal(), Ok(()));
        assert_eq!(probe_cpu_timer(), Ok(()));
        assert_eq!(probe_vm_read(), Ok(()));
    }
}
