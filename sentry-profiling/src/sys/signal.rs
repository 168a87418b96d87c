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
//! space's lock, so it can wait behind `mmap`s of other threads: in the
//! stress run it cost 165 µs per sample against 2.2 µs for `memcpy`, which
//! is why it is not used everywhere. Where a seccomp policy forbids it
//! (probed once, at installation), the handler falls back to `memcpy`.
//!
//! Slots are leaked on purpose: a signal that arrives late, after its sampler
//! gave up or even stopped, still finds valid memory, and a state word or a
//! thread id that tells it to do nothing. For the same reason the handler is never
//! uninstalled: restoring `SIG_DFL` while a queued signal is in flight would
//! kill the process.

use std::cell::UnsafeCell;
use std::sync::Mutex;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
use std::time::Duration;

use super::thread::clock_ns;

/// [`Slot::sibling`] when the slot has none.
const NO_SIBLING: u32 = u32::MAX;

/// How many slots can ever exist in the process.
pub(crate) const MAX_SLOTS: usize = 4096;

/// Slot pointers by index; entries are written once, under `ARENA_GROW`.
static ARENA: [AtomicPtr<Slot>; MAX_SLOTS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_SLOTS];
/// Number of initialised entries of `ARENA`.
static ARENA_LEN: AtomicUsize = AtomicUsize::new(0);
/// Serialises slot creation and keeps slots that no sampler currently owns.
static ARENA_POOL: Mutex<Vec<&'static Slot>> = Mutex::new(Vec::new());

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

thread_local! {
    /// The per-thread context word, copied into every sample of the thread.
    ///
    /// It is a `const`-initialised atomic with no destructor, so reading it
    /// from the signal handler is a plain TLS load: no lazy initialisation,
    /// no destructor registration, no allocation.
    static CONTEXT: AtomicU64 = const { AtomicU64::new(0) };
    /// The thread's kernel id, cached by the handler on its first run on
    /// the thread (0 until then). Same properties as `CONTEXT`.
    static TID: AtomicI32 = const { AtomicI32::new(0) };
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
    fn from_u32(v: u32) -> Self {
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
}

/// One preallocated capture buffer. See the module docs for the protocol.
pub(crate) struct Slot {
    index: u32,
    state: AtomicU32,
    /// The thread the slot is bound to; the handler of any other thread
    /// leaves the slot alone.
    tid: AtomicI32,
    /// Timer signals that found the slot (and its sibling) full since the
    /// sampler last looked.
    missed: AtomicU32,
    /// Index of the second slot bound to the same thread, which the handler
    /// fills when this one is full; `NO_SIBLING` if none.
    sibling: AtomicU32,
    /// Bounds of the target thread's stack mapping, set by the sampler.
    stack_lo: AtomicUsize,
    stack_hi: AtomicUsize,
    captured: UnsafeCell<Captured>,
    buf: *mut u8,
    cap: usize,
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

    /// Re-arms a slot the sampler has read ([`Slot::take`]), with the
    /// thread's stack bounds as now known. The bounds change only here and in
    /// [`Slot::bind`], while no handler may read them.
    pub(crate) fn rearm(&self, lo: usize, hi: usize) {
        if self.state() != SlotState::Done {
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

    /// If the handler has finished, hands its output to `f`. The slot stays
    /// full until [`Slot::rearm`].
    pub(crate) fn take<R>(&self, f: impl FnOnce(&Captured, &[u8]) -> R) -> Option<R> {
        if self.state() != SlotState::Done {
            return None;
        }
        // SAFETY: state is Done (observed with Acquire, pairing with the
        // handler's Release store), so the handler no longer touches the slot
        // and will not until the sampler re-arms it; `stack_len <= cap` is
        // guaranteed by the handler.
        let (captured, stack) = unsafe {
            let captured = &*self.captured.get();
            let len = captured.stack_len.min(self.cap);
            (captured, std::slice::from_raw_parts(self.buf, len))
        };
        Some(f(captured, stack))
    }
}

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
    VM_READ.store(probe_vm_read(), Ordering::Relaxed);
    MAIN_STACK_TOP.store(
        super::maps::stack_mappings().main_stack_top().unwrap_or(0),
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
        // SAFETY: a zeroed sigaction is a valid starting value; the handler
        // has the SA_SIGINFO signature and is async-signal-safe (see
        // `handler`); the old action is written to a local.
        let installed = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = handler as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_ONSTACK;
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

fn current_action(sig: i32) -> Option<libc::sigaction> {
    // SAFETY: querying with a null new action only writes `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        (libc::sigaction(sig, std::ptr::null(), &mut old) == 0).then_some(old)
    }
}

fn disposition_is_default(sig: i32) -> bool {
    current_action(sig).is_some_and(|a| a.sa_sigaction == libc::SIG_DFL)
}

fn handler_is_ours(sig: i32) -> bool {
    current_action(sig).is_some_and(|a| a.sa_sigaction == handler as *const () as usize)
}

/// The start of the kernel's `siginfo_t` for a POSIX timer's signal
/// (x86_64, aarch64), as far as the handler reads it.
#[repr(C)]
struct TimerSigInfo {
    signo: i32,
    errno: i32,
    code: i32,
    _pad0: i32,
    timer_id: i32,
    overrun: i32,
}

/// The kernel's `siginfo_t` layout for a queued signal (x86_64, aarch64).
#[repr(C)]
struct QueuedSigInfo {
    signo: i32,
    errno: i32,
    code: i32,
    _pad0: i32,
    pid: i32,
    uid: u32,
    value: usize,
    _rest: [u8; 128 - 32],
}

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
    // SAFETY: rt_tgsigqueueinfo reads a 128-byte siginfo from a valid pointer;
    // `QueuedSigInfo` is exactly that size and lives for the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_rt_tgsigqueueinfo,
            pid as libc::c_long,
            tid as libc::c_long,
            sig as libc::c_long,
            std::ptr::from_ref(&info),
        )
    };
    if rc == 0 {
        return Ok(());
    }
    match std::io::Error::last_os_error().raw_os_error().unwrap_or(0) {
        libc::ESRCH => Err(SendError::ThreadGone),
        libc::EAGAIN => Err(SendError::QueueFull),
        e => Err(SendError::Os(e)),
    }
}

/// The kernel's `struct sigevent` (x86_64, aarch64), for `timer_create`.
#[repr(C)]
struct KernelSigEvent {
    value: usize,
    signo: i32,
    notify: i32,
    tid: i32,
    _pad: [i32; 11],
}

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
        // The thread's scheduler CPU clock, as in `thread_cpu_time_ns`.
        let clock = ((!tid) << 3) | 6;
        let mut id: i32 = -1;
        // SAFETY: timer_create reads a 64-byte sigevent from a valid pointer
        // (`KernelSigEvent` is exactly that) and writes the timer id to a
        // valid i32.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_timer_create,
                clock as libc::c_long,
                std::ptr::from_ref(&event),
                std::ptr::from_mut(&mut id),
            )
        };
        if rc == 0 {
            Ok(Self(id))
        } else {
            Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL))
        }
    }

    /// Fires every `period` of the thread's CPU time from now on; a zero
    /// period disarms it. Returns false if the kernel refused.
    pub(crate) fn set(&self, period: Duration) -> bool {
        let ts = libc::timespec {
            tv_sec: period.as_secs() as libc::time_t,
            tv_nsec: period.subsec_nanos() as libc::c_long,
        };
        let spec = libc::itimerspec {
            it_interval: ts,
            it_value: ts,
        };
        // SAFETY: timer_settime on a timer id we own, reading a valid
        // itimerspec and writing no old value.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_timer_settime,
                self.0 as libc::c_long,
                0 as libc::c_long,
                std::ptr::from_ref(&spec),
                std::ptr::null_mut::<libc::itimerspec>(),
            )
        };
        rc == 0
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

/// Called by the handler when it is done with a slot.
#[inline(always)]
fn notify_completion() {
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

/// The signal handler. Async-signal-safe: see the module docs.
extern "C" fn handler(_sig: libc::c_int, info: *mut libc::siginfo_t, ucontext: *mut libc::c_void) {
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
unsafe fn capture(info: *const libc::siginfo_t, ucontext: *const libc::c_void) {
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
    if slot.tid.load(Ordering::Relaxed) != own_tid() {
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

/// The calling thread's kernel id, from a thread-local cache filled on first
/// use. Async-signal-safe: a TLS load, and a `gettid` system call once.
#[inline(always)]
fn own_tid() -> i32 {
    TID.with(|t| {
        let cached = t.load(Ordering::Relaxed);
        if cached != 0 {
            return cached;
        }
        // SAFETY: gettid has no preconditions and cannot fail.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
        t.store(tid, Ordering::Relaxed);
        tid
    })
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
unsafe fn copy_own_memory(src: usize, dst: *mut u8, len: usize) -> usize {
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

/// The calling thread's thread pointer: the address of its thread control
/// block, which x86-64 and AArch64 threads libraries place at the top of the
/// thread's stack allocation. Async-signal-safe (one instruction).
#[inline(always)]
fn thread_pointer() -> usize {
    let tp: usize;
    // SAFETY: the x86-64 TLS ABI makes the first word of the thread control
    // block, at %fs:0, point at the block itself; every thread that runs
    // Rust code has one (the handler's thread-local context needs it too).
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags));
    }
    // SAFETY: reading TPIDR_EL0 has no side effects.
    #[cfg(target_arch = "aarch64")]
    unsafe {
        std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nomem, nostack, preserves_flags));
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        tp = 0;
    }
    tp
}

/// Whether `process_vm_readv` can read this process's own memory (a seccomp
/// policy may forbid it).
fn probe_vm_read() -> bool {
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
    // SAFETY: both buffers are valid locals of the given lengths.
    let n = unsafe {
        libc::process_vm_readv(OWN_PID.load(Ordering::Relaxed), &local, 1, &remote, 1, 0)
    };
    n == src.len() as isize && dst == src
}

/// Reads PC, SP, FP (and LR) from the interrupted context.
///
/// # Safety
/// `uc` must point at the kernel's `ucontext_t` for the current delivery.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn read_regs(uc: *const libc::ucontext_t) -> Regs {
    // SAFETY: guaranteed by the caller.
    let gregs = unsafe { &(*uc).uc_mcontext.gregs };
    Regs {
        pc: gregs[libc::REG_RIP as usize] as u64,
        sp: gregs[libc::REG_RSP as usize] as u64,
        fp: gregs[libc::REG_RBP as usize] as u64,
        lr: 0,
    }
}

/// Reads PC, SP, FP (and LR) from the interrupted context.
///
/// # Safety
/// `uc` must point at the kernel's `ucontext_t` for the current delivery.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
unsafe fn read_regs(uc: *const libc::ucontext_t) -> Regs {
    // SAFETY: guaranteed by the caller.
    let mc = unsafe { &(*uc).uc_mcontext };
    Regs {
        pc: mc.pc,
        sp: mc.sp,
        fp: mc.regs[29],
        lr: mc.regs[30],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copying_stops_at_an_unmapped_page() {
        // SAFETY: getpid has no preconditions.
        OWN_PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
        assert!(probe_vm_read(), "process_vm_readv works here");
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
