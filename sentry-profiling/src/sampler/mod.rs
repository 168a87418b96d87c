//! The sampler: a dedicated thread that ticks against absolute deadlines,
//! harvests what the signal handler captured, unwinds it and hands
//! [`Sample`]s to the consumer it owns (a bounded queue for a standalone
//! [`Sampler`], the session's intake for a profiling session), one per
//! thread per sampling period (wall-clock semantics), each thread's in time
//! order.
//!
//! Running threads sample themselves: each has a CPU-time timer
//! ([`sys::CpuTimer`]) whose signal the kernel raises on the thread's own
//! core after every period of CPU time, and two capture slots, so the
//! sampler never interrupts a thread on another core to sample running
//! code. A thread's timer captures are its samples of running code, one per
//! period of CPU time it used (periods the kernel reports as overruns, or
//! that found both slots full, are shown by the fills before the capture
//! from the kernel's counts of its CPU time, or where those cannot be read
//! by stand-ins repeating the capture's stack): the running share of its
//! wall-clock samples. Its other periods
//! are "fills", samples that stand for time it was not running, recorded
//! with the stack it waits in:
//!
//! - every period slot of a live thread (the ticks' deadlines) gets a
//!   sample within half a period of it: a capture, a stand-in or a fill
//!   (see `ledger`), so a thread's samples are never more than two periods
//!   apart; a held fill is cancelled only by a sample in its own slot;
//! - a fill is held until the thread is known to be alive at or after its
//!   slot (a later capture, or its CPU clock read), so no sample outlives
//!   its thread, and a thread's samples leave in time order;
//! - where a thread stands when it does not run, whether a signal's answer
//!   is awaited, and when it is looked at next are explicit states with
//!   pure transitions (see `state`); what a tick does about a thread is
//!   decided in one place (`step`), its system calls behind a trait the
//!   sampler thread implements;
//! - a thread's stack bounds are learned before its first capture (see
//!   `ThreadTable::refresh_word_slots` and [`Services::look_blocked`]), and
//!   a thread found in a request with no capture yet has its timer brought
//!   forward ([`Services::nudge`]);
//! - where the thread waits is read without interrupting it (a signal would
//!   make its `poll`, `nanosleep`, timed `futex` wait… fail with `EINTR`):
//!   the kernel shows the stack pointer and program counter of a thread
//!   blocked in a system call, and the sampler copies and unwinds its stack
//!   ([`Services::look_blocked`]). It looks once the thread has stayed off the
//!   CPU for a whole tick after running, or, for a thread that never waits
//!   that long, every `step::PROBE_EVERY` periods at most; while the answers stay
//!   the same, less and less often (down to every `MAX_ASK_EVERY` periods);
//! - a period shows only what is known of it, never a stack of another
//!   moment: a thread found runnable but not running (preempted) shows
//!   `(waiting for a CPU)`; one that ran without a capture shows the
//!   capture next to it if one lies within a period and a half (it ran
//!   through), or else `(running: no stack captured in time)` where the
//!   kernel counted it running (else `(waiting: where not read in time)`);
//!   one that waits shows where it was read waiting;
//! - a fill is filed under the request (context word) the thread published
//!   at the fill's moment (`crate::context` keeps a short history, so a late
//!   sampler still knows); a thread in no request, or whose word at that
//!   moment is no longer known, files it under no request, so a request's
//!   lane never gets time its thread spent elsewhere;
//! - a thread that stays parked has its CPU clock read less and less often,
//!   down to every `step::MAX_CHECK_EVERY` periods;
//! - a tick that comes late (the sampler thread was not given a core in
//!   time) records every thread's samples for the periods it missed (up to
//!   `MAX_CATCH_UP`), so each thread still gets one sample per period.
//!
//! Threads that live between two listings of the thread list (a scope's or
//! a hashing library's workers, a few milliseconds each) are sampled by a
//! process-wide CPU-time timer, armed while the process starts threads:
//! its signal lands on the running thread in proportion to its CPU time,
//! does nothing on a thread that has a timer of its own, and fills a spare
//! slot otherwise; a thread younger than a listing interval is left to it
//! until the next listing. Their captures go to shared profile threads,
//! one per thread name (more when several ran at once), each drawn over
//! the CPU time it stands for (see `short_lived`). A tracked thread that
//! exits has its samples closed at its last known-alive moment, and one
//! with a single sample has it filed there too (see `closing`): Sentry
//! drops a thread with a single sample.
//!
//! A thread whose timer cannot be created (the user's limit of pending
//! signals reached), and every thread with `cpu_timers(false)`, is sampled
//! the way every thread was before timers: at each tick at which its CPU
//! clock moved, read from here if it is blocked in the kernel, signalled if
//! it is running; its previous stack repeated otherwise. So is every thread
//! when the kernel refuses timers (a seccomp policy); which calls it
//! refuses is probed at the start and noted when it changes, counted, and
//! said once on stderr (see `denied`).

mod answers;
mod balance;
mod capture;
mod closing;
mod consumer;
mod denied;
mod held;
mod ledger;
mod period;
mod periods;
mod requests;
mod sample;
mod services;
mod short_lived;
mod slots;
mod state;
mod stats;
mod step;
mod threads;
mod worker;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub(crate) use consumer::Consumer;
pub use sample::Sample;
pub use stats::SamplerStats;

use crate::Error;
use crate::options::SamplerConfig;
use crate::sys;
use crate::unwind::{ModuleSet, SharedModules};
use stats::Counters;
use worker::Worker;

/// Threads the profiler runs itself; they are never sampled.
static OWN_THREADS: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// Marks the calling thread as one of the profiler's own.
pub(crate) fn register_own_thread() -> OwnThreadGuard {
    let tid = sys::current_tid();
    OWN_THREADS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(tid);
    // The process timer's signal does nothing on it (see `short_lived`).
    sys::mark_known(tid);
    OwnThreadGuard(tid)
}

/// Unregisters the thread on drop.
#[derive(Debug)]
pub(crate) struct OwnThreadGuard(i32);

impl Drop for OwnThreadGuard {
    fn drop(&mut self) {
        let mut own = OWN_THREADS.lock().unwrap_or_else(|e| e.into_inner());
        own.retain(|t| *t != self.0);
        sys::forget_known(self.0);
    }
}

pub(super) fn own_threads() -> Vec<i32> {
    OWN_THREADS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// State shared by the sampler thread and its owner.
#[derive(Debug)]
struct Shared {
    pub(super) stop: AtomicBool,
    /// False while paused: the thread sleeps and sends no signal.
    pub(super) active: AtomicBool,
    pub(super) counters: Counters,
    pub(super) modules: SharedModules,
}

/// A running sampler. Dropping it stops the sampler thread.
///
/// ```no_run
/// use sentry_profiling::{Sampler, SamplerConfig};
/// use std::time::Duration;
///
/// let sampler = Sampler::start(SamplerConfig::default())?;
/// std::thread::sleep(Duration::from_millis(200));
/// let samples: Vec<_> = sampler.try_iter().collect();
/// println!("{} samples, {:?}", samples.len(), sampler.stop());
/// # Ok::<(), sentry_profiling::Error>(())
/// ```
#[derive(Debug)]
pub struct Sampler {
    shared: Arc<Shared>,
    /// The queue's reading end (`None`: the samples go to a consumer of
    /// the crate's, see [`Sampler::start_feeding`]).
    rx: Option<Receiver<Sample>>,
    thread: Option<JoinHandle<()>>,
    signal: i32,
}

impl Sampler {
    /// Installs the signal handler (once per process) and starts the sampler
    /// thread.
    pub fn start(config: SamplerConfig) -> Result<Self, Error> {
        Self::start_with(config, true, None)
    }

    /// Like [`Sampler::start`], but sends no signal until [`Sampler::resume`].
    pub fn start_paused(config: SamplerConfig) -> Result<Self, Error> {
        Self::start_with(config, false, None)
    }

    /// Like [`Sampler::start_paused`], with the samples handed to `out` on
    /// the sampler thread instead of a queue (`try_iter` finds none).
    pub(crate) fn start_feeding(
        config: SamplerConfig,
        out: Box<dyn Consumer>,
    ) -> Result<Self, Error> {
        Self::start_with(config, false, Some(out))
    }

    fn start_with(
        config: SamplerConfig,
        active: bool,
        out: Option<Box<dyn Consumer>>,
    ) -> Result<Self, Error> {
        let config = config.validated()?;
        sys::watch_fork();
        if sys::in_forked_child() {
            return Err(Error::ForkedChild);
        }
        let setup = sys::install_handler(config.signal).map_err(Error::Signal)?;
        let (out, rx): (Box<dyn Consumer>, _) = match out {
            Some(out) => (out, None),
            None => {
                let (tx, rx) = std::sync::mpsc::sync_channel(config.queue_capacity);
                (Box::new(tx), Some(rx))
            }
        };
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            active: AtomicBool::new(active),
            counters: Counters::default(),
            modules: Arc::new(arc_swap::ArcSwap::from_pointee(ModuleSet::default())),
        });
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("sentry-profiler".into())
            .spawn(move || {
                let _own = register_own_thread();
                let mut worker = Worker::new(config, out, thread_shared);
                // Before the sampler counts as started: what the kernel
                // refuses is said (and counted) by then.
                worker.services.probe_capabilities(&worker.shared.counters);
                let _ = ready_tx.send(());
                worker.run();
            })
            .map_err(Error::Spawn)?;
        // Wait until the module list is published and the sampler thread has
        // excluded itself, so the first samples can be symbolised.
        let _ = ready_rx.recv();
        Ok(Self {
            shared,
            rx,
            thread: Some(thread),
            signal: setup.signal,
        })
    }

    /// The signal number the handler is installed on.
    pub fn signal(&self) -> i32 {
        self.signal
    }

    /// Samples taken so far that nobody has received yet.
    pub fn try_iter(&self) -> impl Iterator<Item = Sample> + '_ {
        self.rx.iter().flat_map(Receiver::try_iter)
    }

    /// Waits up to `timeout` for the next sample.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<Sample> {
        self.rx.as_ref()?.recv_timeout(timeout).ok()
    }

    /// The modules loaded in the process, as last seen by the sampler.
    pub fn modules(&self) -> Arc<ModuleSet> {
        self.shared.modules.load_full()
    }

    /// A handle that can pause, resume and read counters from any thread.
    pub fn control(&self) -> SamplerControl {
        SamplerControl {
            shared: Arc::clone(&self.shared),
            thread: self.thread.as_ref().map(|t| t.thread().clone()),
        }
    }

    /// Pauses sampling: the thread stays, with its module list and thread
    /// table, but sends no signal until [`Sampler::resume`].
    pub fn pause(&self) {
        self.control().pause();
    }

    /// Resumes sampling after [`Sampler::pause`].
    pub fn resume(&self) {
        self.control().resume();
    }

    /// Whether the sampler is sampling (started and not paused).
    pub fn is_active(&self) -> bool {
        self.control().is_active()
    }

    /// Counters so far.
    pub fn stats(&self) -> SamplerStats {
        self.shared.counters.snapshot()
    }

    /// Stops the sampler thread, waits for it and returns the final
    /// counters. Samples still queued are dropped with the sampler: receive
    /// them with [`Sampler::try_iter`] first.
    pub fn stop(mut self) -> SamplerStats {
        self.shutdown();
        self.stats()
    }

    fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // A dozing sampler thread waits for a capture, not for an unpark.
        sys::wake_completion_waiters();
        if sys::in_forked_child() {
            // The sampler thread stayed in the parent; joining it here would
            // wait forever, and even detaching it would touch a thread
            // descriptor nobody owns here.
            std::mem::forget(self.thread.take());
            return;
        }
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Pauses, resumes and observes a [`Sampler`] from any thread; all its
/// methods are a few atomic operations and never block.
#[derive(Debug, Clone)]
pub struct SamplerControl {
    shared: Arc<Shared>,
    thread: Option<std::thread::Thread>,
}

impl SamplerControl {
    /// Stops sending signals until [`SamplerControl::resume`].
    pub fn pause(&self) {
        // Sequentially consistent: the session pauses, then looks for a root
        // span that started meanwhile, which looks at this flag after it
        // counted itself (see `Session::pause_if_idle`).
        self.shared.active.store(false, Ordering::SeqCst);
    }

    /// Resumes sampling.
    pub fn resume(&self) {
        if !self.shared.active.swap(true, Ordering::SeqCst) {
            if let Some(t) = &self.thread {
                t.unpark();
            }
        }
    }

    /// Whether the sampler is sampling (started and not paused).
    pub fn is_active(&self) -> bool {
        self.shared.active.load(Ordering::SeqCst) && !self.shared.stop.load(Ordering::Acquire)
    }

    /// Wakes the sampler thread for its consumer, whether it is paused
    /// (see [`Consumer::paused`]) or dozing (see [`Consumer::dozing`]); its
    /// ticks keep their pace.
    pub(crate) fn wake(&self) {
        sys::wake_completion_waiters();
        if let Some(t) = &self.thread {
            t.unpark();
        }
    }

    /// Stops the sampler thread for good: it settles what it holds, hands
    /// it to its consumer ([`Consumer::stopped`]) and ends. Whoever owns
    /// the [`Sampler`] then joins it.
    pub(crate) fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        self.wake();
    }

    /// The sampler's counters.
    pub fn stats(&self) -> SamplerStats {
        self.shared.counters.snapshot()
    }
}
