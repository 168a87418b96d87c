//! The profiling signal: choosing a free signal, the handler, and the slots it
//! writes into.
//!
//! Every sampled thread has one [`Slot`] with a preallocated stack buffer,
//! bound to it by the sampler thread for as long as the thread lives, and
//! armed whenever it is empty. Two things raise the signal on the thread,
//! both carrying the slot's index (never a pointer) in `si_value`:
//!
//! - the thread's own CPU-time timer (`timer_create` on its CPU clock with
//!   `SIGEV_THREAD_ID`, see [`CpuTimer`]): the kernel raises it on the core
//!   the thread runs on, after every period of CPU time the thread consumed,
//!   so a running thread is sampled without any other thread doing anything;
//! - the sampler thread, with `rt_tgsigqueueinfo`, for a thread without a
//!   timer that it sees running. A thread blocked in the kernel is never
//!   signalled (its system call would fail with `EINTR`); see `blocked.rs`.
//!
//! The handler, running on the interrupted thread, checks that the slot is
//! bound to it, claims the slot with one compare-and-swap, copies
//! registers, a timestamp, the thread's context word and the live part of
//! its stack, and publishes the slot. A timer signal that finds the slot
//! still full only bumps the slot's missed counter. The handler allocates
//! nothing, takes no lock, calls no libc function that is not
//! async-signal-safe and reads no memory but the interrupted thread's own
//! stack mapping (whose bounds the sampler stored in the slot beforehand)
//! and this module's statics.
//!
//! Those bounds come from `/proc/self/maps` and may be stale by the time the
//! handler runs: the mapping that held the stack pointer can have shrunk
//! since (a neighbouring region that the kernel listed as one mapping with
//! the stack was unmapped, a heap that held an alternate stack was
//! trimmed). A `memcpy` up to a stale bound faults and kills the process.
//! So the handler copies with `memcpy` only what cannot have been unmapped:
//!
//! - on the thread's own stack, up to its thread pointer. Threads libraries
//!   put the thread control block at the top of the thread's stack
//!   allocation, above a guard page at its bottom; so when the listed
//!   mapping that holds the stack pointer also holds the thread pointer,
//!   everything between the two is the thread's own allocation, which lives
//!   as long as the thread;
//! - on the main thread's stack (`[stack]`), whose top never moves.
//!
//! Anywhere else (an alternate signal stack, a coroutine's stack) it uses
//! `process_vm_readv` on our own process, which stops at the first unmapped
//! page and returns what it copied. That system call takes the address
//! space's lock, so it can wait behind `mmap`s of other threads (far slower
//! than `memcpy` under load; BENCHMARKS has the figures), which is why it
//! is not used everywhere. Where a seccomp policy forbids it
//! (probed once, at installation), the handler falls back to `memcpy`.
//!
//! Slots are leaked on purpose: a signal that arrives late, after its sampler
//! gave up or even stopped, still finds valid memory, and a state word or a
//! thread id that tells it to do nothing. For the same reason the handler is never
//! uninstalled: restoring `SIG_DFL` while a queued signal is in flight would
//! kill the process.

mod copy;
mod handler;
mod install;
mod probe;
mod send;
mod slot;
mod spare;
mod timer;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};

#[cfg(test)]
use copy::copy_own_memory;
use handler::handler;
pub(crate) use install::{install_handler, signal_restorers};
pub(crate) use probe::{probe_cpu_timer, probe_signal, probe_vm_read};
pub(crate) use send::{SendError, send_sample_signal};
use slot::notify_completion;
pub(crate) use slot::{
    Captured, Regs, Slot, SlotState, completion_seq, wait_completion, wake_completion_waiters,
};
pub(crate) use spare::{
    ProcessTimer, ensure_spares, forget_known, mark_known, process_timer_counts, spare_slots,
};
pub(crate) use timer::CpuTimer;

use super::thread::clock_ns;

/// The signal number in use, 0 until a handler is installed.
static SIGNAL: AtomicI32 = AtomicI32::new(0);
/// Serialises installation.
static INSTALL: Mutex<()> = Mutex::new(());
/// The process id signals must come from (refreshed at every start, for forks).
static OWN_PID: AtomicI32 = AtomicI32::new(0);
/// This process's real user id, for the `siginfo` of the signals it sends
/// (read once rather than at every signal).
static OWN_UID: AtomicU32 = AtomicU32::new(0);

/// Whether `process_vm_readv` on our own process works (probed at
/// installation; see the module docs).
static VM_READ: AtomicBool = AtomicBool::new(false);
/// The top of the main thread's stack (`[stack]`), which never moves; 0 if
/// unknown. Read at installation.
static MAIN_STACK_TOP: AtomicUsize = AtomicUsize::new(0);

/// Bumped by the handler each time it finishes with a slot; a futex word.
static COMPLETIONS: AtomicU32 = AtomicU32::new(0);
/// Number of threads blocked in [`wait_completion`].
static WAITERS: AtomicU32 = AtomicU32::new(0);

/// `si_code` of a signal sent with `rt_sigqueueinfo`/`rt_tgsigqueueinfo`.
const SI_QUEUE: i32 = -1;
/// `si_code` of a signal raised by a POSIX timer.
const SI_TIMER: i32 = -2;
/// `sigev_notify` value that sends a timer's signal to one thread.
const SIGEV_THREAD_ID: i32 = 4;

/// Flag in [`Captured::flags`]: the stack pointer was outside the bounds the
/// sampler supplied (unknown thread, alternate signal stack), nothing copied.
pub(crate) const FLAG_OFF_STACK: u32 = 1;
/// Flag in [`Captured::flags`]: the thread's CPU-time timer raised the
/// signal (the thread was running); otherwise the sampler sent it.
pub(crate) const FLAG_TIMER: u32 = 2;
/// Flag in [`Captured::flags`]: the process's CPU-time timer raised the
/// signal on a thread with no slot of its own, and the capture is in a
/// spare slot (see `spare`).
pub(crate) const FLAG_PROCESS_TIMER: u32 = 4;

thread_local! {
    /// The per-thread context word, copied into every sample of the thread.
    ///
    /// It is a `const`-initialised atomic with no destructor, so reading it
    /// from the signal handler is a plain TLS load: no lazy initialisation,
    /// no destructor registration, no allocation.
    static CONTEXT: AtomicU64 = const { AtomicU64::new(0) };
}

/// Sets the calling thread's context word (see [`crate::set_thread_context`]).
#[inline]
pub(crate) fn set_thread_context(value: u64) -> u64 {
    CONTEXT.with(|c| c.swap(value, Ordering::Relaxed))
}

/// Reads the calling thread's context word.
#[inline]
pub(crate) fn thread_context() -> u64 {
    CONTEXT.with(|c| c.load(Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copying_stops_at_an_unmapped_page() {
        // SAFETY: getpid has no preconditions.
        OWN_PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
        assert_eq!(probe_vm_read(), Ok(()), "process_vm_readv works here");
        VM_READ.store(true, Ordering::Relaxed);
        let page = 4096;
        // SAFETY: a fresh anonymous mapping of two pages; the second is
        // unmapped at once, the first at the end.
        let map = unsafe {
            let map = libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(map, libc::MAP_FAILED);
            std::ptr::write_bytes(map.cast::<u8>(), 7, page);
            assert_eq!(libc::munmap(map.cast::<u8>().add(page).cast(), page), 0);
            map as usize
        };
        let mut buf = vec![0u8; 2 * page];
        // SAFETY: `buf` holds `2 * page` bytes; the unmapped tail of the
        // source is what is under test.
        let copied = unsafe { copy_own_memory(map + page / 2, buf.as_mut_ptr(), 2 * page) };
        assert_eq!(copied, page / 2, "copied up to the unmapped page");
        assert!(buf[..copied].iter().all(|&b| b == 7));
        // SAFETY: `buf` holds 64 bytes; the source is entirely unmapped.
        let none = unsafe { copy_own_memory(map + page, buf.as_mut_ptr(), 64) };
        assert_eq!(none, 0, "nothing copied from an unmapped page");
        // SAFETY: the first page, still mapped.
        unsafe { libc::munmap(map as *mut libc::c_void, page) };
    }
}
