//! The slot protocol: a leaked, preallocated capture buffer per thread and
//! its state word (`Free → Requested → Writing → Done → Requested …`), which
//! makes the handler's writes and the sampler's reads exclusive; and the
//! completion counter the sampler waits on.

use std::cell::UnsafeCell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use super::*;

/// [`Slot::sibling`] when the slot has none.
pub(super) const NO_SIBLING: u32 = u32::MAX;

/// How many slots can ever exist in the process.
pub(crate) const MAX_SLOTS: usize = 4096;

/// Slot pointers by index; entries are written once, under `ARENA_GROW`.
pub(super) static ARENA: [AtomicPtr<Slot>; MAX_SLOTS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_SLOTS];
/// Number of initialised entries of `ARENA`.
pub(super) static ARENA_LEN: AtomicUsize = AtomicUsize::new(0);
/// Serialises slot creation and keeps slots that no sampler currently owns.
pub(super) static ARENA_POOL: Mutex<Vec<&'static Slot>> = Mutex::new(Vec::new());

/// The lifecycle of a slot; transitions are single compare-and-swaps.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotState {
    /// Not bound to a thread, or not armed: a signal naming it does nothing.
    Free = 0,
    /// Armed: the next signal of its thread fills it.
    Requested = 1,
    /// The handler is writing into it.
    Writing = 2,
    /// The handler finished; the sampler may read it.
    Done = 3,
}

impl SlotState {
    pub(super) fn from_u32(v: u32) -> Self {
        match v {
            1 => Self::Requested,
            2 => Self::Writing,
            3 => Self::Done,
            _ => Self::Free,
        }
    }
}

/// Interrupted registers, as unwinding needs them.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Regs {
    /// Program counter.
    pub(crate) pc: u64,
    /// Stack pointer.
    pub(crate) sp: u64,
    /// Frame pointer (`rbp` / `x29`).
    pub(crate) fp: u64,
    /// Link register (`x30`), aarch64 only; 0 elsewhere.
    #[cfg_attr(
        not(target_arch = "aarch64"),
        expect(dead_code, reason = "only aarch64 unwinding reads the link register")
    )]
    pub(crate) lr: u64,
}

/// What the handler records besides the stack bytes.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Captured {
    /// Interrupted registers.
    pub(crate) regs: Regs,
    /// `CLOCK_REALTIME` at capture, in nanoseconds since the Unix epoch.
    pub(crate) timestamp_ns: u64,
    /// The thread's context word at capture.
    pub(crate) context: u64,
    /// Number of stack bytes copied, starting at `regs.sp`.
    pub(crate) stack_len: usize,
    /// `FLAG_*` bits.
    pub(crate) flags: u32,
    /// Time spent in the handler body (monotonic clock), nanoseconds.
    pub(crate) handler_ns: u64,
    /// The interrupted thread's name (`comm`, zero-terminated), read for a
    /// spare slot's capture only (see `spare`); zeroes otherwise.
    pub(crate) name: [u8; 16],
    /// Periods of CPU time the capture stands for: 1, plus the timer's
    /// overruns for a spare slot's capture (a bound slot counts those in
    /// [`Slot::take_missed`]).
    pub(crate) periods: u32,
}

impl Captured {
    /// The thread name recorded with a spare slot's capture.
    pub(crate) fn thread_name(&self) -> &str {
        let len = self.name.iter().position(|&b| b == 0).unwrap_or(16);
        std::str::from_utf8(&self.name[..len]).unwrap_or("")
    }
}

/// One preallocated capture buffer. See the module docs for the protocol.
pub(crate) struct Slot {
    pub(super) index: u32,
    pub(super) state: AtomicU32,
    /// The thread the slot is bound to; the handler of any other thread
    /// leaves the slot alone.
    pub(super) tid: AtomicI32,
    /// Timer signals that found the slot (and its sibling) full since the
    /// sampler last looked.
    pub(super) missed: AtomicU32,
    /// Index of the second slot bound to the same thread, which the handler
    /// fills when this one is full; `NO_SIBLING` if none.
    pub(super) sibling: AtomicU32,
    /// Bounds of the target thread's stack mapping, set by the sampler.
    pub(super) stack_lo: AtomicUsize,
    pub(super) stack_hi: AtomicUsize,
    pub(super) captured: UnsafeCell<Captured>,
    pub(super) buf: *mut u8,
    pub(super) cap: usize,
}

// SAFETY: `captured` and `buf` are written only by the handler between a
// successful Requested->Writing CAS and the Done store (Release), and read only
// by the sampler after observing Done (Acquire) and before re-arming or
// freeing the slot; the state word makes those accesses exclusive.
unsafe impl Sync for Slot {}
// SAFETY: as above; the raw buffer pointer is owned by the slot forever.
unsafe impl Send for Slot {}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("index", &self.index)
            .field("state", &self.state())
            .field("tid", &self.tid.load(Ordering::Relaxed))
            .field("cap", &self.cap)
            .finish()
    }
}

impl Slot {
    /// Takes a free slot whose buffer holds at least `cap` bytes from the
    /// pool, or creates one. Returns `None` when the process-wide limit is
    /// reached.
    pub(crate) fn acquire(cap: usize) -> Option<&'static Slot> {
        let mut pool = ARENA_POOL.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pos) = pool.iter().position(|s| s.cap >= cap) {
            return Some(pool.swap_remove(pos));
        }
        let index = ARENA_LEN.load(Ordering::Relaxed);
        if index >= MAX_SLOTS {
            return None;
        }
        let buf: &'static mut [u8] = Box::leak(vec![0u8; cap].into_boxed_slice());
        let slot: &'static Slot = Box::leak(Box::new(Slot {
            index: index as u32,
            state: AtomicU32::new(SlotState::Free as u32),
            tid: AtomicI32::new(0),
            missed: AtomicU32::new(0),
            sibling: AtomicU32::new(NO_SIBLING),
            stack_lo: AtomicUsize::new(0),
            stack_hi: AtomicUsize::new(0),
            captured: UnsafeCell::new(Captured::default()),
            buf: buf.as_mut_ptr(),
            cap,
        }));
        ARENA[index].store(std::ptr::from_ref(slot).cast_mut(), Ordering::Release);
        ARENA_LEN.store(index + 1, Ordering::Release);
        Some(slot)
    }

    /// Unbinds a slot and gives it back to the process-wide pool. Returns
    /// false, and keeps the slot out of circulation for good, if a handler
    /// is still writing into it after a few milliseconds (a thread stopped
    /// inside the handler by a debugger).
    pub(crate) fn release(slot: &'static Slot) -> bool {
        for _ in 0..1000 {
            match slot.state() {
                SlotState::Writing => std::thread::sleep(Duration::from_micros(10)),
                cur => {
                    if slot
                        .state
                        .compare_exchange(
                            cur as u32,
                            SlotState::Free as u32,
                            Ordering::AcqRel,
                            Ordering::Relaxed,
                        )
                        .is_ok()
                    {
                        slot.tid.store(0, Ordering::Relaxed);
                        slot.sibling.store(NO_SIBLING, Ordering::Relaxed);
                        ARENA_POOL
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(slot);
                        return true;
                    }
                }
            }
        }
        false
    }

    /// Makes a fresh slot (from [`Slot::acquire`]) a spare one: bound to
    /// no thread (`tid` is one no thread has) and armed for the process
    /// timer's signal (see `spare`).
    pub(super) fn make_spare(&self, tid: i32) {
        self.tid.store(tid, Ordering::Relaxed);
        self.sibling.store(NO_SIBLING, Ordering::Relaxed);
        self.stack_lo.store(0, Ordering::Relaxed);
        self.stack_hi.store(0, Ordering::Relaxed);
        self.state
            .store(SlotState::Requested as u32, Ordering::Release);
    }

    /// Current state.
    pub(crate) fn state(&self) -> SlotState {
        SlotState::from_u32(self.state.load(Ordering::Acquire))
    }

    /// Binds a free slot to thread `tid`, whose stack mapping is `[lo, hi)`
    /// (`0, 0` when unknown), and arms it; `sibling` is the thread's other
    /// slot, which the handler fills when this one is full. Returns false if
    /// it was not free.
    pub(crate) fn bind(&self, tid: i32, lo: usize, hi: usize, sibling: Option<&Slot>) -> bool {
        if self.state() != SlotState::Free {
            return false;
        }
        self.tid.store(tid, Ordering::Relaxed);
        self.sibling
            .store(sibling.map_or(NO_SIBLING, |s| s.index), Ordering::Relaxed);
        self.missed.store(0, Ordering::Relaxed);
        self.stack_lo.store(lo, Ordering::Relaxed);
        self.stack_hi.store(hi, Ordering::Relaxed);
        self.state
            .compare_exchange(
                SlotState::Free as u32,
                SlotState::Requested as u32,
                Ordering::Release,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Re-arms a slot the sampler has read, with the thread's stack
    /// bounds as now known (see [`Filled::rearm`]). The bounds change only
    /// here and in [`Slot::bind`] and [`Slot::set_bounds`], while no handler
    /// may read them.
    fn rearm(&self, lo: usize, hi: usize) {
        if self.state() != SlotState::Done {
            return;
        }
        self.stack_lo.store(lo, Ordering::Relaxed);
        self.stack_hi.store(hi, Ordering::Relaxed);
        self.state
            .store(SlotState::Requested as u32, Ordering::Release);
    }

    /// Gives an armed slot the thread's stack bounds, learned before its
    /// first capture. The slot is disarmed for the change (a signal in
    /// between finds it free and tries the sibling, or counts a missed
    /// period), so no handler reads half-written bounds. A slot that is
    /// full or being written gets them at [`Slot::rearm`].
    pub(crate) fn set_bounds(&self, lo: usize, hi: usize) {
        if self
            .state
            .compare_exchange(
                SlotState::Requested as u32,
                SlotState::Free as u32,
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return;
        }
        self.stack_lo.store(lo, Ordering::Relaxed);
        self.stack_hi.store(hi, Ordering::Relaxed);
        self.state
            .store(SlotState::Requested as u32, Ordering::Release);
    }

    /// Timer signals that found the slot full since the last call.
    pub(crate) fn take_missed(&self) -> u32 {
        self.missed.swap(0, Ordering::Relaxed)
    }

    /// When the handler filled the slot, the capture's timestamp.
    pub(crate) fn filled_at(&self) -> Option<u64> {
        // SAFETY: as in `take`: Done (Acquire) makes `captured` the handler's
        // finished write, untouched until the slot is re-armed.
        (self.state() == SlotState::Done).then(|| unsafe { (*self.captured.get()).timestamp_ns })
    }

    /// The handler's capture, if it has finished one: a [`Filled`] that
    /// reads it and, consumed, re-arms the slot. The slot stays full until
    /// then.
    pub(crate) fn filled(&self) -> Option<Filled<'_>> {
        if self.state() != SlotState::Done {
            return None;
        }
        Some(Filled { slot: self })
    }
}

/// A slot the handler has filled. While one exists the handler does not
/// touch the slot (it is Done, and only [`Filled::rearm`] makes it
/// writable again), so its capture can be read; what it lends out borrows
/// it, so nothing read from the slot outlives the re-arming.
pub(crate) struct Filled<'a> {
    slot: &'a Slot,
}

impl Filled<'_> {
    /// What the handler recorded besides the stack bytes.
    pub(crate) fn captured(&self) -> &Captured {
        // SAFETY: the slot was Done (observed with Acquire, pairing with the
        // handler's Release store) when this was made, and only `rearm`,
        // which consumes this, makes it writable again: the handler does not
        // write `captured` while this borrow lives.
        unsafe { &*self.slot.captured.get() }
    }

    /// The stack bytes copied, from the captured stack pointer up.
    pub(crate) fn stack(&self) -> &[u8] {
        let len = self.captured().stack_len.min(self.slot.cap);
        // SAFETY: as in `captured`; `buf` holds `cap` bytes, `len <= cap`,
        // and the handler wrote the first `stack_len` of them.
        unsafe { std::slice::from_raw_parts(self.slot.buf, len) }
    }

    /// Re-arms the slot for the next capture, with the thread's stack
    /// bounds as now known.
    pub(crate) fn rearm(self, lo: usize, hi: usize) {
        self.slot.rearm(lo, hi);
    }
}

/// The current value of the completion counter, for [`wait_completion`].
pub(crate) fn completion_seq() -> u32 {
    COMPLETIONS.load(Ordering::Acquire)
}

/// Blocks until the handler completes a slot after `seen` was read from
/// [`completion_seq`], or until `timeout` passes.
pub(crate) fn wait_completion(seen: u32, timeout: Duration) {
    WAITERS.fetch_add(1, Ordering::SeqCst);
    if COMPLETIONS.load(Ordering::SeqCst) == seen {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: FUTEX_WAIT on a valid, aligned u32 with a relative timeout;
        // the kernel re-checks the value, so a wake between the load above and
        // the wait is not lost.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                COMPLETIONS.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                seen,
                &ts as *const libc::timespec,
            );
        }
    }
    WAITERS.fetch_sub(1, Ordering::SeqCst);
}

/// Wakes every thread in [`wait_completion`] now, as a completed slot
/// would (the sampler stopping wakes its own doze this way).
pub(crate) fn wake_completion_waiters() {
    notify_completion();
}

/// Called by the handler when it is done with a slot.
#[inline(always)]
pub(super) fn notify_completion() {
    COMPLETIONS.fetch_add(1, Ordering::SeqCst);
    if WAITERS.load(Ordering::SeqCst) > 0 {
        // SAFETY: FUTEX_WAKE is a raw syscall (async-signal-safe) on a valid
        // static u32.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                COMPLETIONS.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                i32::MAX,
            );
        }
    }
}
