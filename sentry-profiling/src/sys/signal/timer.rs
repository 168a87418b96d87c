//! Per-thread CPU-time timers (`timer_create` on the thread's CPU clock,
//! `SIGEV_THREAD_ID`): the kernel raises the signal on the thread's own
//! core after each period of CPU time it used.

use std::time::Duration;

use super::*;

/// The kernel's `struct sigevent` (x86_64, aarch64), for `timer_create`.
#[repr(C)]
pub(super) struct KernelSigEvent {
    pub(super) value: usize,
    pub(super) signo: i32,
    pub(super) notify: i32,
    pub(super) tid: i32,
    pub(super) _pad: [i32; 11],
}

// The kernel's `struct sigevent` (64-bit): value, signo, notify, then the
// thread id of `SIGEV_THREAD_ID`; 64 bytes.
const _: () = {
    assert!(std::mem::offset_of!(KernelSigEvent, signo) == 8);
    assert!(std::mem::offset_of!(KernelSigEvent, notify) == 12);
    assert!(std::mem::offset_of!(KernelSigEvent, tid) == 16);
    assert!(std::mem::size_of::<KernelSigEvent>() == 64);
    assert!(std::mem::size_of::<KernelSigEvent>() == std::mem::size_of::<libc::sigevent>());
};

/// A POSIX timer on one thread's CPU clock that raises the profiling signal
/// on that thread, naming its slot, after every period of CPU time the
/// thread consumes. Signals come from the timer interrupt on the core the
/// thread runs on: nobody else is woken or interrupted. A pending timer
/// signal is never queued twice (further expiries only count overruns), so a
/// thread that does not run the handler soon accumulates nothing.
///
/// Deleted on drop. Timers are not inherited by a forked child.
#[derive(Debug)]
pub(crate) struct CpuTimer(i32);

/// `timer_create` on thread `tid`'s scheduler CPU clock (as in
/// `thread_cpu_time_ns`) with `event`; the timer's id, or the `errno`.
pub(super) fn create_on_cpu_clock(tid: i32, event: &KernelSigEvent) -> Result<i32, i32> {
    let clock = ((!tid) << 3) | 6;
    let mut id: i32 = -1;
    // SAFETY: timer_create reads a 64-byte sigevent from a valid pointer
    // (`KernelSigEvent` is exactly that) and writes the timer id to a valid
    // i32.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_timer_create,
            clock as libc::c_long,
            std::ptr::from_ref(event),
            std::ptr::from_mut(&mut id),
        )
    };
    if rc == 0 {
        Ok(id)
    } else {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL))
    }
}

impl CpuTimer {
    /// Creates a timer on thread `tid`'s CPU clock, disarmed. Fails with
    /// the `errno` of `timer_create` (`EAGAIN` when the user's limit of
    /// pending signals, `RLIMIT_SIGPENDING`, is reached; `ESRCH`/`EINVAL`
    /// when the thread has exited).
    pub(crate) fn create(tid: i32, slot: &Slot) -> Result<Self, i32> {
        let sig = SIGNAL.load(Ordering::Acquire);
        if sig == 0 {
            return Err(libc::EINVAL);
        }
        let event = KernelSigEvent {
            value: slot.index as usize,
            signo: sig,
            notify: SIGEV_THREAD_ID,
            tid,
            _pad: [0; 11],
        };
        create_on_cpu_clock(tid, &event).map(Self)
    }

    /// Fires every `period` of the thread's CPU time from now on; a zero
    /// period disarms it. Fails with the `errno` of `timer_settime`.
    pub(crate) fn set(&self, period: Duration) -> Result<(), i32> {
        self.set_first(period, period)
    }

    /// CPU time left before the timer fires; zero when disarmed, and a
    /// nanosecond when it has expired and its signal is not delivered yet
    /// (the kernel's answer then). `None` if the kernel refused.
    pub(crate) fn remaining(&self) -> Option<Duration> {
        let zero = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let mut spec = libc::itimerspec {
            it_interval: zero,
            it_value: zero,
        };
        // SAFETY: timer_gettime on a timer id we own, writing a valid
        // itimerspec.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_timer_gettime,
                self.0 as libc::c_long,
                std::ptr::from_mut(&mut spec),
            )
        };
        (rc == 0).then(|| {
            Duration::new(
                spec.it_value.tv_sec.max(0) as u64,
                spec.it_value.tv_nsec.clamp(0, 999_999_999) as u32,
            )
        })
    }

    /// Fires after `first` of the thread's CPU time from now, then every
    /// `period`; a zero `first` disarms it. Fails with the `errno` of
    /// `timer_settime`.
    pub(crate) fn set_first(&self, first: Duration, period: Duration) -> Result<(), i32> {
        set_timer(self.0, first, period)
    }
}

/// `timer_settime` on timer `id`: fires after `first`, then every
/// `period`; a zero `first` disarms it. Fails with the `errno`.
pub(super) fn set_timer(id: i32, first: Duration, period: Duration) -> Result<(), i32> {
    let ts = |d: Duration| libc::timespec {
        tv_sec: d.as_secs() as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    };
    let spec = libc::itimerspec {
        it_interval: ts(period),
        it_value: ts(first),
    };
    // SAFETY: timer_settime on a timer id the caller owns, reading a valid
    // itimerspec and writing no old value.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_timer_settime,
            id as libc::c_long,
            0 as libc::c_long,
            std::ptr::from_ref(&spec),
            std::ptr::null_mut::<libc::itimerspec>(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL))
    }
}

impl Drop for CpuTimer {
    fn drop(&mut self) {
        // SAFETY: deletes a timer id this value owns; it is not used again.
        unsafe {
            libc::syscall(libc::SYS_timer_delete, self.0 as libc::c_long);
        }
    }
}
