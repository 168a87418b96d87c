//! The signal handler: async-signal-safe (no allocation, no locks, no
//! `dl_*`, no `_Unwind_*`), it reads only the interrupted thread's registers
//! and stack (see the module docs of `sys::signal`).

use std::sync::atomic::Ordering;

use super::slot::{ARENA, ARENA_LEN};
use super::*;
use crate::sys::arch::{read_regs, thread_pointer};

/// The start of the kernel's `siginfo_t` for a POSIX timer's signal
/// (x86_64, aarch64), as far as the handler reads it.
#[repr(C)]
pub(super) struct TimerSigInfo {
    pub(super) signo: i32,
    pub(super) errno: i32,
    pub(super) code: i32,
    pub(super) _pad0: i32,
    pub(super) timer_id: i32,
    pub(super) overrun: i32,
}

// The kernel's layout (`include/uapi/asm-generic/siginfo.h`, 64-bit): the
// timer id and overrun count follow the three ints and padding.
const _: () = {
    assert!(std::mem::offset_of!(TimerSigInfo, code) == 8);
    assert!(std::mem::offset_of!(TimerSigInfo, timer_id) == 16);
    assert!(std::mem::offset_of!(TimerSigInfo, overrun) == 20);
    assert!(std::mem::size_of::<TimerSigInfo>() <= std::mem::size_of::<libc::siginfo_t>());
};

/// The signal handler. Async-signal-safe: see the module docs.
pub(super) extern "C" fn handler(
    _sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ucontext: *mut libc::c_void,
) {
    // SAFETY: __errno_location returns the calling thread's errno slot, valid
    // for the thread's lifetime; it is async-signal-safe.
    let errno = unsafe { libc::__errno_location() };
    // SAFETY: `errno` is valid (above).
    let saved_errno = unsafe { *errno };
    // SAFETY: the kernel passes valid `info` and `ucontext` pointers for an
    // SA_SIGINFO handler; `capture` checks them for null anyway.
    unsafe { capture(info, ucontext) };
    // SAFETY: `errno` is valid (above).
    unsafe { *errno = saved_errno };
}

/// The body of the handler.
///
/// # Safety
/// Must only be called from the signal handler with the kernel's arguments.
#[inline(always)]
pub(super) unsafe fn capture(info: *const libc::siginfo_t, ucontext: *const libc::c_void) {
    if info.is_null() || ucontext.is_null() {
        return;
    }
    // For both codes accepted the value sits where `si_value()` reads it
    // (the `_rt` and `_timer` members share that offset); the sender's pid is
    // only in `_rt`, the overrun count only in `_timer`, read through
    // `TimerSigInfo`, a prefix of the kernel's 128-byte siginfo.
    // SAFETY: `info` is a valid siginfo for this delivery, read as above.
    let (timer, pid, overrun, index) = unsafe {
        let code = (*info).si_code;
        if code != SI_QUEUE && code != SI_TIMER {
            return;
        }
        let (pid, overrun) = if code == SI_QUEUE {
            ((*info).si_pid(), 0)
        } else {
            (0, (*info.cast::<TimerSigInfo>()).overrun)
        };
        (
            code == SI_TIMER,
            pid,
            overrun,
            (*info).si_value().sival_ptr as usize,
        )
    };
    if (!timer && pid != OWN_PID.load(Ordering::Relaxed))
        || index >= ARENA_LEN.load(Ordering::Acquire)
    {
        return;
    }
    let slot_ptr = ARENA[index].load(Ordering::Acquire);
    if slot_ptr.is_null() {
        return;
    }
    // SAFETY: arena entries point at leaked, never-freed slots.
    let slot: &Slot = unsafe { &*slot_ptr };
    if slot.tid.load(Ordering::Relaxed) != crate::sys::kept_tid() {
        // A signal that outlived its slot's binding (a timer deleted, or a
        // sampler stopped, while it was pending).
        return;
    }
    // Periods of CPU time that passed between two of the kernel's checks
    // (made at its scheduler tick, while the thread runs) come as one signal
    // with the others counted as overruns: each is a sample owed.
    if overrun > 0 {
        slot.missed
            .fetch_add(overrun.unsigned_abs(), Ordering::Relaxed);
    }
    let claim = |s: &Slot| {
        s.state
            .compare_exchange(
                SlotState::Requested as u32,
                SlotState::Writing as u32,
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_ok()
    };
    let slot = if claim(slot) {
        slot
    } else {
        // Full: the thread's second slot, if it has one and it is empty.
        let sibling = slot.sibling.load(Ordering::Relaxed) as usize;
        let other = if sibling < ARENA_LEN.load(Ordering::Acquire) {
            ARENA[sibling].load(Ordering::Acquire)
        } else {
            std::ptr::null_mut()
        };
        // SAFETY: arena entries point at leaked, never-freed slots.
        match unsafe { other.as_ref() } {
            Some(other)
                if other.tid.load(Ordering::Relaxed) == slot.tid.load(Ordering::Relaxed)
                    && claim(other) =>
            {
                other
            }
            _ => {
                if timer {
                    slot.missed.fetch_add(1, Ordering::Relaxed);
                }
                return;
            }
        }
    };

    let started_ns = clock_ns(libc::CLOCK_MONOTONIC).unwrap_or(0);
    // SAFETY: `ucontext` is the kernel's ucontext_t for this delivery.
    let regs = unsafe { read_regs(ucontext.cast()) };
    let timestamp_ns = clock_ns(libc::CLOCK_REALTIME).unwrap_or(0);

    let lo = slot.stack_lo.load(Ordering::Relaxed);
    let hi = slot.stack_hi.load(Ordering::Relaxed);
    let sp = regs.sp as usize;
    let (stack_len, flags) = if lo < hi && sp >= lo && sp < hi {
        let tp = thread_pointer();
        if hi == MAIN_STACK_TOP.load(Ordering::Relaxed) || (sp < tp && tp <= hi) {
            // On the main stack, or on the thread's own stack below its
            // thread control block (see the module docs).
            let top = if sp < tp && tp <= hi { tp } else { hi };
            let len = (top - sp).min(slot.cap);
            // SAFETY: `[sp, top)` is memory that stays mapped while the
            // thread is stopped in this handler (the thread's own stack
            // allocation, or the main stack below its fixed top); `buf` has
            // `cap >= len` bytes and is exclusively ours in the Writing state.
            unsafe { std::ptr::copy_nonoverlapping(sp as *const u8, slot.buf, len) };
            (len, 0)
        } else {
            let len = (hi - sp).min(slot.cap);
            // SAFETY: `buf` has `cap >= len` bytes and is exclusively ours in
            // the Writing state; `[sp, sp + len)` is inside the mapping as last
            // read, and `copy_own_memory` stops where it no longer is.
            let copied = unsafe { copy_own_memory(sp, slot.buf, len) };
            (copied, 0)
        }
    } else {
        (0, FLAG_OFF_STACK)
    };

    // SAFETY: exclusive access in the Writing state (see `Slot`'s Sync impl).
    unsafe {
        *slot.captured.get() = Captured {
            regs,
            timestamp_ns,
            context: thread_context(),
            stack_len,
            flags: flags | if timer { FLAG_TIMER } else { 0 },
            handler_ns: clock_ns(libc::CLOCK_MONOTONIC)
                .unwrap_or(0)
                .saturating_sub(started_ns),
        };
    }
    slot.state.store(SlotState::Done as u32, Ordering::Release);
    notify_completion();
}

/// Copies up to `len` bytes from `src` to `dst` and returns how many were
/// copied: all of them, or those before the first page of `src` that is no
/// longer mapped (see the module docs). Async-signal-safe.
///
/// # Safety
/// `dst` must be valid for `len` bytes of writes and not overlap `src`.
/// Without a working `process_vm_readv`, `[src, src + len)` must also be
/// mapped and readable.
#[inline(always)]
pub(super) unsafe fn copy_own_memory(src: usize, dst: *mut u8, len: usize) -> usize {
    if VM_READ.load(Ordering::Relaxed) {
        let local = libc::iovec {
            iov_base: dst.cast(),
            iov_len: len,
        };
        let remote = libc::iovec {
            iov_base: src as *mut libc::c_void,
            iov_len: len,
        };
        // SAFETY: `local` is writable for `len` bytes (the caller's
        // guarantee); the kernel checks `remote` and reports an unmapped
        // page as a short count or EFAULT instead of faulting.
        let n = unsafe {
            libc::process_vm_readv(OWN_PID.load(Ordering::Relaxed), &local, 1, &remote, 1, 0)
        };
        return usize::try_from(n).unwrap_or(0);
    }
    // SAFETY: guaranteed by the caller when `process_vm_readv` is unavailable.
    unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst, len) };
    len
}
