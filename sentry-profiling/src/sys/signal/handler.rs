//! The signal handler: async-signal-safe (no allocation, no locks, no
//! `dl_*`, no `_Unwind_*`), it reads only the interrupted thread's registers
//! and stack (see the module docs of `sys::signal`).

use std::sync::atomic::Ordering;

use super::copy::{copy_own_memory, copy_to_thread_pointer};
use super::slot::{ARENA, ARENA_LEN};
use super::spare::{PROCESS_TIMER_VALUE, capture_spare};
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
    // Installed with SA_NODEFER (see `install`), the handler can be
    // interrupted by its own signal: such a nested delivery returns at
    // once, so no capture shows the handler's own frames and no slot is
    // claimed twice by one thread. Its period is lost, as an overrun's is.
    if IN_HANDLER.with(|h| h.swap(true, Ordering::Relaxed)) {
        return;
    }
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
    IN_HANDLER.with(|h| h.store(false, Ordering::Relaxed));
}

thread_local! {
    /// Whether the thread is inside the handler (see [`handler`]). A
    /// `const`-initialised atomic with no destructor: reading it in the
    /// handler is a plain TLS access, with no lazy initialisation and no
    /// allocation.
    static IN_HANDLER: std::sync::atomic::AtomicBool = const { std::sync::atomic::AtomicBool::new(false) };
}

/// The body of the handler: finds the slot the signal was sent for, claims
/// it (or the thread's second slot), and writes the registers, the times,
/// the context word and a copy of the stack into it.
///
/// # Safety
/// Must only be called from the signal handler with the kernel's arguments.
#[inline(always)]
pub(super) unsafe fn capture(info: *const libc::siginfo_t, ucontext: *const libc::c_void) {
    if info.is_null() || ucontext.is_null() {
        return;
    }
    // SAFETY: `info` is the kernel's siginfo for this delivery (the
    // function's contract), not null (above).
    let Some(delivery) = (unsafe { read_delivery(info) }) else {
        return;
    };
    if delivery.timer && delivery.index == PROCESS_TIMER_VALUE {
        // SAFETY: called from the handler with the kernel's `ucontext`.
        unsafe { capture_spare(ucontext, delivery.overrun) };
        return;
    }
    let Some(slot) = bound_slot(&delivery) else {
        return;
    };
    // Periods of CPU time that passed between two of the kernel's checks
    // (made at its scheduler tick, while the thread runs) come as one signal
    // with the others counted as overruns: each is a sample owed.
    if delivery.overrun > 0 {
        slot.missed
            .fetch_add(delivery.overrun.unsigned_abs(), Ordering::Relaxed);
    }
    let Some(slot) = claim_slot(slot, delivery.timer) else {
        return;
    };

    let started_ns = clock_ns(libc::CLOCK_MONOTONIC).unwrap_or(0);
    // SAFETY: `ucontext` is the kernel's ucontext_t for this delivery.
    let regs = unsafe { read_regs(ucontext.cast()) };
    let timestamp_ns = clock_ns(libc::CLOCK_REALTIME).unwrap_or(0);
    // SAFETY: `slot` was claimed above; `regs.sp` is the interrupted
    // thread's stack pointer.
    let (stack_len, flags) = unsafe { copy_stack(slot, regs.sp as usize) };

    // SAFETY: exclusive access in the Writing state (see `Slot`'s Sync impl).
    unsafe {
        *slot.captured.get() = Captured {
            regs,
            timestamp_ns,
            context: thread_context(),
            stack_len,
            flags: flags | if delivery.timer { FLAG_TIMER } else { 0 },
            handler_ns: clock_ns(libc::CLOCK_MONOTONIC)
                .unwrap_or(0)
                .saturating_sub(started_ns),
            name: [0; 16],
            periods: 1,
        };
    }
    slot.state.store(SlotState::Done as u32, Ordering::Release);
    notify_completion();
}

/// What a delivery of the profiler's signal says.
struct Delivery {
    /// Sent by a CPU-time timer (else queued by the sampler thread).
    timer: bool,
    /// The sender's pid (queued signals only).
    pid: i32,
    /// Timer periods that passed without a signal of their own.
    overrun: i32,
    /// The slot's index in the arena.
    index: usize,
}

/// Reads the delivery's code, sender, overrun count and slot index; `None`
/// for a signal neither a timer nor `sigqueue` sent.
///
/// For both codes accepted the value sits where `si_value()` reads it (the
/// `_rt` and `_timer` members share that offset); the sender's pid is only
/// in `_rt`, the overrun count only in `_timer`, read through
/// `TimerSigInfo`, a prefix of the kernel's 128-byte siginfo.
///
/// # Safety
/// `info` must be the kernel's siginfo for this delivery.
#[inline(always)]
unsafe fn read_delivery(info: *const libc::siginfo_t) -> Option<Delivery> {
    // SAFETY: `info` is a valid siginfo for this delivery, read as above.
    unsafe {
        let code = (*info).si_code;
        if code != SI_QUEUE && code != SI_TIMER {
            return None;
        }
        let (pid, overrun) = if code == SI_QUEUE {
            ((*info).si_pid(), 0)
        } else {
            (0, (*info.cast::<TimerSigInfo>()).overrun)
        };
        Some(Delivery {
            timer: code == SI_TIMER,
            pid,
            overrun,
            index: (*info).si_value().sival_ptr as usize,
        })
    }
}

/// The slot the delivery names, if it was sent by this process (or a timer)
/// and the slot is still bound to this thread.
#[inline(always)]
fn bound_slot(delivery: &Delivery) -> Option<&'static Slot> {
    if (!delivery.timer && delivery.pid != OWN_PID.load(Ordering::Relaxed))
        || delivery.index >= ARENA_LEN.load(Ordering::Acquire)
    {
        return None;
    }
    // SAFETY: arena entries point at leaked, never-freed slots (or null).
    let slot = unsafe { ARENA[delivery.index].load(Ordering::Acquire).as_ref() }?;
    // A signal that outlived its slot's binding (a timer deleted, or a
    // sampler stopped, while it was pending) finds another thread's id.
    (slot.tid.load(Ordering::Relaxed) == crate::sys::kept_tid()).then_some(slot)
}

/// Claims `slot` for writing or, when it is full, the thread's second slot
/// if that one is empty; `None` when both are full (a timer's signal is
/// then counted as missed).
#[inline(always)]
fn claim_slot(slot: &'static Slot, timer: bool) -> Option<&'static Slot> {
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
    if claim(slot) {
        return Some(slot);
    }
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
            Some(other)
        }
        _ => {
            if timer {
                slot.missed.fetch_add(1, Ordering::Relaxed);
            }
            None
        }
    }
}

/// Copies the interrupted thread's stack from `sp` up into the claimed
/// slot's buffer (at most its capacity); returns the bytes copied and the
/// capture's flags (`FLAG_OFF_STACK` when `sp` is not on the thread's
/// stack as last read, and nothing was copied).
///
/// # Safety
/// `slot` must be claimed by this handler (in the Writing state), and `sp`
/// the interrupted thread's stack pointer.
#[inline(always)]
unsafe fn copy_stack(slot: &Slot, sp: usize) -> (usize, u32) {
    let lo = slot.stack_lo.load(Ordering::Relaxed);
    let hi = slot.stack_hi.load(Ordering::Relaxed);
    if lo == 0 && hi == 0 {
        // Bounds not learned yet (a thread bound since the last look at
        // the mappings, which may end before the next): copied up to its
        // thread pointer, as a spare slot's capture is.
        // SAFETY: as the caller's.
        return unsafe { copy_to_thread_pointer(slot, sp) };
    }
    if !(lo < hi && sp >= lo && sp < hi) {
        return (0, FLAG_OFF_STACK);
    }
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
}
