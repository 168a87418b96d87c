//! Short-lived threads: a process-wide CPU-time timer and the spare slots
//! its captures go to.
//!
//! The sampler finds threads by listing them (see `sampler::threads`), and
//! a thread that lives a few milliseconds between two listings is never
//! given a timer of its own. The process's CPU clock
//! (`CLOCK_PROCESS_CPUTIME_ID`) counts the CPU time of every thread, those
//! too: a timer on it with `SIGEV_SIGNAL` raises the profiling signal, after
//! every period of the process's CPU time, on the thread that was running
//! when the period ran out (since Linux 6.3 the kernel gives a
//! process-directed timer signal to the current thread when it can take
//! it; earlier kernels may give it to another thread, which then takes a
//! capture of its own stack that the sampler files under it as well). So
//! each thread is interrupted in proportion to the CPU time it uses,
//! however short its life, as `setitimer(ITIMER_PROF)` does for pprof-rs
//! and Go.
//!
//! A thread the sampler already samples with its own timer (or one of the
//! profiler's own threads) is marked in [`KNOWN`], a bitmap by thread id;
//! the handler looks the bit up and returns at once, so no period of such a
//! thread is sampled twice. Any other thread has no slot bound to it: the
//! handler claims one of a few spare slots (compare-and-swap on the state
//! word, as for a bound slot), and records the thread's name with
//! the capture. Its stack is copied from the stack pointer up to the
//! thread pointer (the thread control block at the top of the thread's own
//! stack allocation, see the module docs of `sys::signal`) with
//! `process_vm_readv`, which stops at an unmapped page instead of faulting:
//! nothing proves beforehand that the stack pointer is on that allocation.
//! Where that call is refused, only the program counter is kept.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use super::copy::copy_to_thread_pointer;
use super::slot::{ARENA, ARENA_LEN};
use super::timer::KernelSigEvent;
use super::*;
use crate::sys::arch::read_regs;

/// The value a process timer's signal carries in place of a slot index: no
/// slot has it (there are at most `MAX_SLOTS`).
pub(super) const PROCESS_TIMER_VALUE: usize = 0x5350_4152;

/// [`Slot::tid`] of a spare slot: no thread has it, so a signal naming the
/// slot's index as a bound slot leaves it alone.
pub(super) const SPARE_TID: i32 = -2;

/// How many spare slots there are at most.
pub(crate) const MAX_SPARES: usize = 16;

/// `sigev_notify` value of a process-directed signal.
const SIGEV_SIGNAL: i32 = 0;

/// Thread ids the kernel can hand out: `PID_MAX_LIMIT` on 64-bit Linux.
const TID_LIMIT: usize = 1 << 22;

/// One bit per thread id: set for a thread the sampler samples with its
/// own timer and for the profiler's own threads. 512 KiB of zeroed
/// static memory, of which only the pages of ids in use are ever touched.
static KNOWN: [AtomicU64; TID_LIMIT / 64] = [const { AtomicU64::new(0) }; TID_LIMIT / 64];

/// The spare slots' arena indices; the first `SPARE_COUNT` are set.
static SPARES: [AtomicU32; MAX_SPARES] = [const { AtomicU32::new(0) }; MAX_SPARES];
static SPARE_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Whether a [`ProcessTimer`] exists (there is one at most: its captures
/// go to the one set of spare slots).
static PROCESS_TIMER_TAKEN: AtomicBool = AtomicBool::new(false);

/// Process-timer signals that found the running thread known (and did
/// nothing), and those that found every spare slot full.
static HITS_KNOWN: AtomicU64 = AtomicU64::new(0);
static SPARES_FULL: AtomicU64 = AtomicU64::new(0);

/// Marks thread `tid` as sampled with its own timer, or as the profiler's
/// own: the process timer's signal does nothing on it.
pub(crate) fn mark_known(tid: i32) {
    if let Some((word, bit)) = known_bit(tid) {
        KNOWN[word].fetch_or(bit, Ordering::Release);
    }
}

/// Undoes [`mark_known`] (the thread exited, or its timer was deleted).
pub(crate) fn forget_known(tid: i32) {
    if let Some((word, bit)) = known_bit(tid) {
        KNOWN[word].fetch_and(!bit, Ordering::Release);
    }
}

/// Whether thread `tid` is marked known. Async-signal-safe.
#[inline(always)]
pub(super) fn is_known(tid: i32) -> bool {
    known_bit(tid).is_some_and(|(word, bit)| KNOWN[word].load(Ordering::Acquire) & bit != 0)
}

#[inline(always)]
fn known_bit(tid: i32) -> Option<(usize, u64)> {
    let tid = usize::try_from(tid).ok().filter(|&t| t < TID_LIMIT)?;
    Some((tid / 64, 1 << (tid % 64)))
}

/// Makes sure `count` spare slots (at most [`MAX_SPARES`]) of at least
/// `cap` bytes exist, armed; returns how many there are. Spare slots are
/// never released: like every slot, they outlive any signal in flight.
pub(crate) fn ensure_spares(count: usize, cap: usize) -> usize {
    let _guard = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    let mut have = SPARE_COUNT.load(Ordering::Acquire);
    while have < count.min(MAX_SPARES) {
        let Some(slot) = Slot::acquire(cap) else {
            break;
        };
        slot.make_spare(SPARE_TID);
        SPARES[have].store(slot.index, Ordering::Relaxed);
        have += 1;
        SPARE_COUNT.store(have, Ordering::Release);
    }
    have
}

/// The spare slots, for the sampler to harvest.
pub(crate) fn spare_slots() -> impl Iterator<Item = &'static Slot> {
    let count = SPARE_COUNT.load(Ordering::Acquire);
    SPARES[..count].iter().filter_map(|i| {
        let index = i.load(Ordering::Relaxed) as usize;
        // SAFETY: arena entries point at leaked, never-freed slots (or null).
        unsafe { ARENA.get(index)?.load(Ordering::Acquire).as_ref() }
    })
}

/// How many process-timer signals found a known thread, and how many found
/// every spare slot full, since the process started.
pub(crate) fn process_timer_counts() -> (u64, u64) {
    (
        HITS_KNOWN.load(Ordering::Relaxed),
        SPARES_FULL.load(Ordering::Relaxed),
    )
}

/// The handler's part for a process timer's signal: nothing on a known
/// thread; otherwise a capture into a spare slot, with the thread's name and the periods it stands for (`1 + overrun`).
///
/// # Safety
/// Must only be called from the signal handler with the kernel's
/// `ucontext`.
#[inline(always)]
pub(super) unsafe fn capture_spare(ucontext: *const libc::c_void, overrun: i32) {
    let tid = crate::sys::kept_tid();
    if is_known(tid) {
        HITS_KNOWN.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let count = SPARE_COUNT.load(Ordering::Acquire);
    let len = ARENA_LEN.load(Ordering::Acquire);
    for spare in &SPARES[..count.min(MAX_SPARES)] {
        let index = spare.load(Ordering::Relaxed) as usize;
        if index >= len {
            continue;
        }
        // SAFETY: arena entries point at leaked, never-freed slots.
        let Some(slot) = (unsafe { ARENA[index].load(Ordering::Acquire).as_ref() }) else {
            continue;
        };
        if slot.tid.load(Ordering::Relaxed) != SPARE_TID
            || slot
                .state
                .compare_exchange(
                    SlotState::Requested as u32,
                    SlotState::Writing as u32,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            continue;
        }
        let started_ns = clock_ns(libc::CLOCK_MONOTONIC).unwrap_or(0);
        // SAFETY: `ucontext` is the kernel's ucontext_t for this delivery.
        let regs = unsafe { read_regs(ucontext.cast()) };
        let timestamp_ns = clock_ns(libc::CLOCK_REALTIME).unwrap_or(0);
        // SAFETY: `slot` was claimed above; `regs.sp` is the interrupted
        // thread's stack pointer.
        let (stack_len, flags) = unsafe { copy_to_thread_pointer(slot, regs.sp as usize) };
        let mut name = [0u8; 16];
        // SAFETY: PR_GET_NAME writes at most 16 bytes (the name and its
        // terminating zero) into a valid 16-byte buffer; a raw system
        // call, async-signal-safe.
        unsafe {
            libc::syscall(libc::SYS_prctl, libc::PR_GET_NAME, name.as_mut_ptr());
        }
        // SAFETY: exclusive access in the Writing state (see `Slot`'s Sync impl).
        unsafe {
            *slot.captured.get() = Captured {
                regs,
                timestamp_ns,
                context: thread_context(),
                stack_len,
                flags: flags | FLAG_TIMER | FLAG_PROCESS_TIMER,
                handler_ns: clock_ns(libc::CLOCK_MONOTONIC)
                    .unwrap_or(0)
                    .saturating_sub(started_ns),
                name,
                periods: 1 + overrun.unsigned_abs(),
            };
        }
        slot.state.store(SlotState::Done as u32, Ordering::Release);
        notify_completion();
        return;
    }
    SPARES_FULL.fetch_add(1, Ordering::Relaxed);
}

/// A POSIX timer on the process's CPU clock that raises the profiling
/// signal, naming no slot, after every period of CPU time the process uses
/// (see the module docs). At most one exists at a time. Deleted on drop.
#[derive(Debug)]
pub(crate) struct ProcessTimer(i32);

impl ProcessTimer {
    /// Creates the process timer, disarmed. `Err(None)` when one exists
    /// already (another sampler has it), `Err(Some(errno))` when the kernel
    /// refused.
    pub(crate) fn create() -> Result<Self, Option<i32>> {
        let sig = SIGNAL.load(Ordering::Acquire);
        if sig == 0 {
            return Err(Some(libc::EINVAL));
        }
        if PROCESS_TIMER_TAKEN.swap(true, Ordering::AcqRel) {
            return Err(None);
        }
        let event = KernelSigEvent {
            value: PROCESS_TIMER_VALUE,
            signo: sig,
            notify: SIGEV_SIGNAL,
            tid: 0,
            _pad: [0; 11],
        };
        let mut id: i32 = -1;
        // SAFETY: timer_create reads a 64-byte sigevent from a valid pointer
        // (`KernelSigEvent` is exactly that) and writes the timer id to a
        // valid i32.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_timer_create,
                libc::CLOCK_PROCESS_CPUTIME_ID as libc::c_long,
                std::ptr::from_ref(&event),
                std::ptr::from_mut(&mut id),
            )
        };
        if rc == 0 {
            Ok(Self(id))
        } else {
            PROCESS_TIMER_TAKEN.store(false, Ordering::Release);
            Err(Some(
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EINVAL),
            ))
        }
    }

    /// Fires after every `period` of the process's CPU time from now on; a
    /// zero period disarms it. Fails with the `errno` of `timer_settime`.
    pub(crate) fn set(&self, period: std::time::Duration) -> Result<(), i32> {
        super::timer::set_timer(self.0, period, period)
    }
}

impl Drop for ProcessTimer {
    fn drop(&mut self) {
        // SAFETY: deletes a timer id this value owns; it is not used again.
        unsafe {
            libc::syscall(libc::SYS_timer_delete, self.0 as libc::c_long);
        }
        PROCESS_TIMER_TAKEN.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_known_bitmap_marks_and_forgets_each_id_alone() {
        assert!(!is_known(4242));
        mark_known(4242);
        mark_known(4243);
        assert!(is_known(4242) && is_known(4243));
        forget_known(4242);
        assert!(!is_known(4242) && is_known(4243));
        forget_known(4243);
        // Ids the kernel cannot hand out are never known, and never panic.
        mark_known(-1);
        mark_known(i32::MAX);
        assert!(!is_known(-1) && !is_known(i32::MAX));
    }
}
