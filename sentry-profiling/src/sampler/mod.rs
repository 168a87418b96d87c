//! The sampler: a dedicated thread that ticks against absolute deadlines,
//! harvests what the signal handler captured, unwinds it and emits
//! [`Sample`]s into a bounded queue, one per thread per sampling period
//! (wall-clock semantics), each thread's in time order.
//!
//! Running threads sample themselves: each has a CPU-time timer
//! ([`sys::CpuTimer`]) whose signal the kernel raises on the thread's own
//! core after every period of CPU time, and two capture slots, so the
//! sampler never interrupts a thread on another core to sample running
//! code. A thread's timer captures are its samples of running code, one per
//! period of CPU time it used (periods the kernel reports as overruns, or
//! that found both slots full, are stand-ins repeating the capture's
//! stack): the running share of its wall-clock samples. Its other periods
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
//!   pure transitions (see `state`); `Worker::tick_thread` performs the
//!   system calls and feeds what they return to them;
//! - a thread's stack bounds are learned before its first capture (see
//!   `ThreadTable::refresh_context_slots` and [`Worker::look_blocked`]), and
//!   a thread found in a request with no capture yet has its timer brought
//!   forward ([`Worker::nudge`]);
//! - where the thread waits is read without interrupting it (a signal would
//!   make its `poll`, `nanosleep`, timed `futex` wait… fail with `EINTR`):
//!   the kernel shows the stack pointer and program counter of a thread
//!   blocked in a system call, and the sampler copies and unwinds its stack
//!   ([`Worker::look_blocked`]). It looks once the thread has stayed off the
//!   CPU for a whole tick after running, or, for a thread that never waits
//!   that long, every `PROBE_EVERY` periods at most; while the answers stay
//!   the same, less and less often (down to every `MAX_ASK_EVERY` periods);
//! - a preempted thread stands where it last ran, and a thread never seen
//!   waiting is taken to be preempted when it does not run;
//! - a fill is filed under the request (context word) the thread published
//!   at the fill's moment (`crate::context` keeps a short history, so a late
//!   sampler still knows), with a stack captured in that request (or, none
//!   captured within 100 ms, the thread's latest stack if that was taken
//!   inside a request); a thread in no request, or whose word at that moment
//!   is no longer known, files it under no request, so a request's lane
//!   never gets time its thread spent elsewhere;
//! - a thread that stays parked has its CPU clock read less and less often,
//!   down to every `MAX_CHECK_EVERY` periods;
//! - a tick that comes late (the sampler thread was not given a core in
//!   time) records every thread's samples for the periods it missed (up to
//!   `MAX_CATCH_UP`), so each thread still gets one sample per period.
//!
//! A thread whose timer cannot be created (the user's limit of pending
//! signals reached), and every thread with `cpu_timers(false)`, is sampled
//! the way every thread was before timers: at each tick at which its CPU
//! clock moved, read from here if it is blocked in the kernel, signalled if
//! it is running; its previous stack repeated otherwise.

mod ledger;
mod periods;
mod sample;
mod state;
mod stats;
mod threads;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use sample::Sample;
pub use stats::SamplerStats;

use crate::Error;
use crate::options::SamplerConfig;
use crate::sys::{self, Slot};
use crate::unwind::{ModuleSet, SharedModules, StackUnwinder};
use state::{Awaited, Clock};
use stats::Counters;
use threads::{ThreadTable, Tracked};

/// How long a signalled thread may take to run the handler before the
/// sampler stops waiting for it (a thread that blocks the signal, or is
/// starved of CPU).
const ABANDON_AFTER: Duration = Duration::from_millis(500);

/// Most sampling periods between two reads of a parked thread's CPU clock.
const MAX_CHECK_EVERY: u64 = 16;

/// Most periods between two questions to a thread about where it waits,
/// while its answers stay the same.
const MAX_ASK_EVERY: u64 = 128;

/// How long a fill of a request in which no stack was captured yet waits
/// for one. A thread's samples leave in time order, so this holds its later
/// samples too: it stays below the 150 ms a transaction-based profile waits
/// for samples up to its end.
const REQUEST_STACK_WAIT_NS: u64 = 100_000_000;

/// CPU time after which the timer of a thread found in a request with no
/// capture yet fires (see [`Worker::nudge`]).
const NUDGE_AFTER: Duration = Duration::from_micros(500);

/// Most missed periods one tick records samples for.
const MAX_CATCH_UP: u32 = 100;

/// Application CPU per sampling period (the process's, less the profiler's
/// own threads') below which a tick counts as idle: 0.5 % of a core.
const IDLE_APP_CPU_NS_PER_PERIOD: u64 = 50_000;
/// Idle ticks in a row after which the sampler dozes.
const IDLE_TICKS_BEFORE_DOZING: u32 = 3;
/// How many periods a doze lasts at most. Any capture (a thread that ran a
/// period of CPU time fires its timer) ends it at once; the next tick then
/// stands for the periods slept through, as a late tick does, so every
/// period of every thread still gets its sample.
const DOZE_PERIODS: u32 = 16;

/// Sampling periods between two looks at whether a thread that keeps running now and
/// then is waiting, to learn where it waits (about 100 ms at 101 Hz).
const PROBE_EVERY: u64 = 10;

/// CPU time a thread may gain between samples and still count as idle.
///
/// The thread's clock is read at the tick that signals it, so the signal
/// delivery, the handler and the return from it (a few microseconds) are
/// counted against the next tick. Without this margin a parked thread would
/// look busy at every tick because it was sampled at the previous one. A timer wake-up that goes straight back to sleep costs
/// about 30 µs here, and also stays below it: such a thread is back where
/// its last stack was taken. 50 µs is 0.5 % of a 101 Hz period.
const IDLE_CPU_SLACK_NS: u64 = 50_000;

/// Threads the profiler runs itself; they are never sampled.
static OWN_THREADS: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// Marks the calling thread as one of the profiler's own.
pub(crate) fn register_own_thread() -> OwnThreadGuard {
    let tid = sys::current_tid();
    OWN_THREADS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(tid);
    OwnThreadGuard(tid)
}

/// Unregisters the thread on drop.
#[derive(Debug)]
pub(crate) struct OwnThreadGuard(i32);

impl Drop for OwnThreadGuard {
    fn drop(&mut self) {
        let mut own = OWN_THREADS.lock().unwrap_or_else(|e| e.into_inner());
        own.retain(|t| *t != self.0);
    }
}

fn own_threads() -> Vec<i32> {
    OWN_THREADS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// State shared by the sampler thread and its owner.
#[derive(Debug)]
struct Shared {
    stop: AtomicBool,
    /// False while paused: the thread sleeps and sends no signal.
    active: AtomicBool,
    counters: Counters,
    modules: SharedModules,
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
    rx: Receiver<Sample>,
    thread: Option<JoinHandle<()>>,
    signal: i32,
}

impl Sampler {
    /// Installs the signal handler (once per process) and starts the sampler
    /// thread.
    pub fn start(config: SamplerConfig) -> Result<Self, Error> {
        Self::start_with(config, true)
    }

    /// Like [`Sampler::start`], but sends no signal until [`Sampler::resume`].
    pub fn start_paused(config: SamplerConfig) -> Result<Self, Error> {
        Self::start_with(config, false)
    }

    fn start_with(config: SamplerConfig, active: bool) -> Result<Self, Error> {
        let config = config.validated()?;
        sys::watch_fork();
        if sys::in_forked_child() {
            return Err(Error::ForkedChild);
        }
        let setup = sys::install_handler(config.signal).map_err(Error::Signal)?;
        let (tx, rx) = std::sync::mpsc::sync_channel(config.queue_capacity);
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
                let mut worker = Worker::new(config, tx, thread_shared);
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
        self.rx.try_iter()
    }

    /// Waits up to `timeout` for the next sample.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<Sample> {
        self.rx.recv_timeout(timeout).ok()
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

    /// Stops the thread and hands back the queue and final counters.
    pub(crate) fn stop_and_drain(mut self) -> (SamplerStats, Vec<Sample>) {
        self.shutdown();
        let rest = self.rx.try_iter().collect();
        (self.stats(), rest)
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

    /// The sampler's counters.
    pub fn stats(&self) -> SamplerStats {
        self.shared.counters.snapshot()
    }
}

/// The sampler thread's state.
struct Worker {
    config: SamplerConfig,
    period: Duration,
    tx: SyncSender<Sample>,
    shared: Arc<Shared>,
    threads: ThreadTable,
    unwinder: StackUnwinder,
    frames: Vec<u64>,
    /// Reused to read threads' scheduler and system-call states.
    stat_buf: Vec<u8>,
    /// Reused to copy the stacks of threads blocked in the kernel.
    copy_buf: Vec<u8>,
    /// The latest stack captured in each request, by context word.
    requests: RequestStacks,
    /// Sampling periods elapsed so far (ticks run, and ticks missed that a
    /// later tick recorded); thread checks are scheduled in these.
    tick_no: u64,
    /// Periods missed since the last tick, whose samples it records.
    owed: u32,
    /// Idle ticks in a row (see [`IDLE_APP_CPU_NS_PER_PERIOD`]).
    idle_ticks: u32,
    /// The application's CPU time at the last tick.
    app_cpu_ns: u64,
}

/// `CLOCK_REALTIME` (as samples are stamped) and the monotonic clock (as
/// deadlines are kept) read at one moment: a pair read without being
/// preempted in between (a few tries), so a deadline converts to the time
/// samples are stamped in without the preemption's error.
fn clocks_now() -> (u64, Instant) {
    let mut best = None;
    for _ in 0..3 {
        let before = sys::realtime_ns();
        let now = Instant::now();
        let after = sys::realtime_ns();
        let spread = after.saturating_sub(before);
        let pair = (before + spread / 2, now);
        if spread < 20_000 {
            return pair;
        }
        if best.is_none_or(|(s, _)| spread < s) {
            best = Some((spread, pair));
        }
    }
    best.map_or_else(|| (sys::realtime_ns(), Instant::now()), |(_, pair)| pair)
}

/// What one tick stands for.
struct Tick {
    /// Sampling periods (more than one when the sampler thread could not
    /// run on time).
    periods: u32,
    /// When it ran (`CLOCK_REALTIME`, as samples are stamped), and the
    /// latest of its period slots: when it was due.
    ts: u64,
    slot_end: u64,
    now: Instant,
}

/// What a harvested capture was.
enum Harvested {
    /// Nothing new in the slot.
    Nothing,
    /// A sample of running code (a timer capture, or a capture of a thread
    /// without a timer), not emitted yet: the thread's held fills go first.
    Running(Sample),
    /// Two of them (both slots were full), the older first.
    Running2(Sample, Sample),
    /// The answer to a request for the thread's parked stack.
    Parked,
    /// A capture spent learning the thread's stack bounds.
    Discarded,
}

impl Harvested {
    /// The samples of running code it holds, oldest first.
    fn running(self) -> impl Iterator<Item = Sample> {
        let (a, b) = match self {
            Self::Running(a) => (Some(a), None),
            Self::Running2(a, b) => (Some(a), Some(b)),
            _ => (None, None),
        };
        a.into_iter().chain(b)
    }
}

impl Worker {
    fn new(config: SamplerConfig, tx: SyncSender<Sample>, shared: Arc<Shared>) -> Self {
        let unwinder = StackUnwinder::new(Arc::clone(&shared.modules));
        Self {
            period: Duration::from_secs_f64(1.0 / f64::from(config.frequency_hz)),
            threads: ThreadTable::default(),
            unwinder,
            frames: Vec::with_capacity(crate::unwind::MAX_FRAMES),
            stat_buf: Vec::with_capacity(512),
            copy_buf: Vec::new(),
            requests: RequestStacks::default(),
            tick_no: 0,
            owed: 0,
            idle_ticks: 0,
            app_cpu_ns: 0,
            config,
            tx,
            shared,
        }
    }

    fn run(&mut self) {
        let mut deadline = Instant::now();
        while !self.shared.stop.load(Ordering::Acquire) {
            if !self.shared.active.load(Ordering::Acquire) {
                // Paused: stop the timers, finish what is in flight, then
                // sleep until resumed.
                self.settle();
                self.owed = 0;
                while !self.shared.active.load(Ordering::Acquire)
                    && !self.shared.stop.load(Ordering::Acquire)
                {
                    // `resume` and `stop` unpark this thread: the timeout
                    // only bounds an idle process's wake-ups.
                    std::thread::park_timeout(Duration::from_secs(2));
                }
                deadline = Instant::now();
                continue;
            }
            let cpu_before = sys::own_cpu_time_ns();
            let periods = self.tick(deadline);
            let c = &self.shared.counters;
            c.tick_cpu_ns
                .add(sys::own_cpu_time_ns().saturating_sub(cpu_before));
            deadline += self.period;
            if self.note_idle(periods) {
                // Nothing of the application ran for a few ticks (every
                // thread waits): sleep until a thread runs a period of CPU
                // time (its timer's capture wakes this thread) or the doze
                // ends. The tick after it stands for every period slept
                // through, so no thread loses a sample; it only costs fewer
                // wake-ups.
                let seen = sys::completion_seq();
                let until = deadline + self.period * (DOZE_PERIODS - 1);
                let now = Instant::now();
                if until > now && !self.shared.stop.load(Ordering::Acquire) {
                    sys::wait_completion(seen, until - now);
                }
                let now = Instant::now();
                if now >= deadline {
                    let passed = (now.duration_since(deadline).as_nanos()
                        / self.period.as_nanos().max(1)) as u32;
                    deadline += self.period * passed;
                    self.owed = (self.owed + passed).min(MAX_CATCH_UP);
                    continue;
                }
            }
            let now = Instant::now();
            if deadline <= now {
                // The tick overran, or the thread was not given a core in
                // time: skip the missed ticks instead of bursting to catch
                // up, count them, and let the next tick record their samples.
                let behind = now.duration_since(deadline);
                let missed = (behind.as_nanos() / self.period.as_nanos().max(1)) as u64 + 1;
                self.shared.counters.ticks_skipped.add(missed);
                deadline += self.period * missed as u32;
                self.owed = (self.owed + missed as u32).min(MAX_CATCH_UP);
            }
            while !self.shared.stop.load(Ordering::Acquire) {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                std::thread::park_timeout(deadline - now);
            }
        }
        self.settle();
        self.threads.release_all();
    }

    /// Records whether the tick that stood for `periods` periods was idle
    /// (the application used less than [`IDLE_APP_CPU_NS_PER_PERIOD`] per
    /// period since the tick before); returns whether the sampler should
    /// doze.
    fn note_idle(&mut self, periods: u32) -> bool {
        let own: u64 = own_threads()
            .iter()
            .filter_map(|&tid| sys::thread_cpu_time_ns(tid))
            .sum();
        let app = sys::process_cpu_time_ns().saturating_sub(own);
        let used = app.saturating_sub(self.app_cpu_ns);
        self.app_cpu_ns = app;
        if used < u64::from(periods) * IDLE_APP_CPU_NS_PER_PERIOD {
            self.idle_ticks = self.idle_ticks.saturating_add(1);
        } else {
            self.idle_ticks = 0;
        }
        self.idle_ticks >= IDLE_TICKS_BEFORE_DOZING
    }

    /// One tick, due at `deadline`; returns how many periods it stood for.
    fn tick(&mut self, deadline: Instant) -> u32 {
        let shared = Arc::clone(&self.shared);
        let c = &shared.counters;
        c.ticks.add(1);
        let periods = 1 + std::mem::take(&mut self.owed);
        self.tick_no += u64::from(periods);
        let (ts, now) = clocks_now();
        // The slots are the deadlines, one period apart, however late the
        // tick runs (see `ledger`).
        let late = now.saturating_duration_since(deadline).as_nanos() as u64;
        let tick = Tick {
            periods,
            ts,
            slot_end: ts.saturating_sub(late),
            now,
        };
        self.unwinder.refresh_modules();
        self.threads.refresh_context_slots(&own_threads(), c);
        for idx in 0..self.threads.len() {
            self.tick_thread(idx, &tick, c);
        }
        // After the captures: those were taken by the threads the table
        // still names, even if the listing now finds an id reused since.
        if self
            .threads
            .refresh_due(self.idle_ticks >= IDLE_TICKS_BEFORE_DOZING)
        {
            self.threads.refresh(&own_threads(), c);
        }
        self.threads.remove_gone();
        periods
    }

    /// One thread's part of a tick that stands for `periods` sampling
    /// periods (more than one when the sampler thread could not run on
    /// time), the latest of whose slots is `slot_end`.
    ///
    /// The thread's samples of running code (this tick's captures, and
    /// stand-ins for periods the kernel counted without one) take their
    /// period slots in its ledger, and every slot left free gets a fill
    /// (see `ledger`). Then, if it did not run, its CPU clock and scheduler
    /// state tell where it stands, which its fills show (see `state`).
    fn tick_thread(&mut self, idx: usize, tick: &Tick, c: &Counters) {
        if self.threads.get_mut(idx).gone || !self.bind(idx, c) {
            return;
        }
        let harvested = self.harvest(idx, c);
        let tick_no = self.tick_no;
        let period_ns = self.period.as_nanos() as u64;
        let t = self.threads.get_mut(idx);
        if t.timer.is_none() {
            for sample in harvested.running() {
                t.ledger.push_sample(sample);
            }
            // Whatever was held when the thread lost its timer goes first.
            t.ledger.alive_ns = u64::MAX;
            flush(&self.tx, c, t, &self.requests, false);
            self.untimed(idx, tick.ts, tick.now, c);
            return;
        }
        self.nudge(idx, c);
        let t = self.threads.get_mut(idx);
        let missed = t.slot.map_or(0, |s| s.take_missed());
        let slots = ledger::slot_times(tick.periods, tick.slot_end, t.ledger.last_slot, period_ns);
        if let Some(&last) = slots.last() {
            t.ledger.last_slot = Some(last);
        }
        // This tick's samples of running code: the captures (with their
        // stacks, which the fills among them show), then stand-ins.
        let mut captures: Vec<(u64, Arc<[u64]>, u64)> = Vec::new();
        let mut running: Vec<u64> = Vec::new();
        for sample in harvested.running() {
            let (stack, context) = (sample.frames().clone(), sample.context());
            let ts = t.ledger.push_sample(sample);
            captures.push((ts, stack, context));
            running.push(ts);
        }
        // The timer fired again before the slot was read, or more periods
        // passed than the kernel signalled (overruns): the thread ran
        // through, and its latest stack stands in for those periods, right
        // after the capture, a microsecond apart: no request may get a
        // moment the thread was not running in it.
        let stand_ins = ledger::stand_in_times(
            running.last().copied(),
            missed,
            tick.periods,
            t.last_stack.is_some(),
        );
        if !stand_ins.is_empty() {
            let stack = t.last_stack.clone().unwrap_or_else(|| Arc::from(&[][..]));
            let context = t.last_context;
            for ts in &stand_ins {
                let sample = sample_of(t, *ts, stack.clone(), context, true);
                running.push(t.ledger.push_sample(sample));
            }
            c.samples_timer_missed.add(stand_ins.len() as u64);
        }
        let placed = t
            .ledger
            .place_tick(slots, &running, period_ns / 2, period_ns);
        for slot in placed.free {
            // What the thread's published context word was at the slot (the
            // sampler may run late).
            let word = t
                .context_slot
                .map(|s| crate::context::word_at(s, t.info.tid, slot));
            let turn = (slot / period_ns.max(1)) as usize;
            let at_tick = periods::standing(
                word,
                &t.place.known(t.last_stack.as_ref(), t.last_context),
                |c| self.requests.pick(c, turn),
            );
            t.ledger.push_fill(slot, word, at_tick);
        }
        let ran_within_ns = period_ns * 3 / 2;
        let never_waiting = t.place.wait.is_none();
        for (ts, stack, context) in &captures {
            t.ledger
                .captured(*ts, stack, *context, ran_within_ns, never_waiting, |c| {
                    self.requests.get(c)
                });
        }
        if !running.is_empty() {
            // Alive and running: what was held until the capture leaves with
            // what was known until then.
            flush(&self.tx, c, t, &self.requests, false);
            t.place.ran();
            t.schedule.ran(tick_no);
            return;
        }
        match awaited(t, tick.now, c) {
            Awaited::Pending => return,
            // Given up: record the held periods with what is known.
            Awaited::GaveUp => flush(&self.tx, c, t, &self.requests, false),
            Awaited::Nothing => {}
        }
        if !t.schedule.check_due(tick_no) {
            return;
        }
        let cpu = sys::thread_cpu_time_ns(t.info.tid);
        let clock = state::clock(t.cpu_seen_ns, cpu, IDLE_CPU_SLACK_NS);
        if let (Clock::Ran | Clock::Stayed, Some(cpu)) = (clock, cpu) {
            t.cpu_seen_ns = cpu;
        }
        match clock {
            Clock::Gone => {
                t.gone = true;
                flush(&self.tx, c, t, &self.requests, false);
                return;
            }
            Clock::Recycled => {
                flush(&self.tx, c, t, &self.requests, false);
                t.reset_identity();
                c.threads_recycled.add(1);
                return;
            }
            Clock::Ran => {
                // It ran without filling a timer period. This tick's fill
                // waits one tick (the thread may be parking somewhere new);
                // the older ones leave with what was known.
                t.ledger.alive_ns = t.ledger.alive_ns.max(tick.slot_end.saturating_sub(1));
                flush(&self.tx, c, t, &self.requests, false);
                t.place.ran_uncaptured(t.last_stack.as_ref());
                t.schedule.ran(tick_no);
                if !t.asking.is_unresponsive() && t.schedule.probe(tick_no, PROBE_EVERY) {
                    if let Look::Waiting(stack, context) = self.look_blocked(idx, c) {
                        learned_waiting(self.threads.get_mut(idx), tick_no, stack, context);
                    }
                }
            }
            Clock::Stayed => {
                t.ledger.alive_ns = t.ledger.alive_ns.max(tick.ts);
                let unresponsive = t.asking.is_unresponsive();
                if !t.place.is_current() && !unresponsive && !t.schedule.ask_due(tick_no) {
                    // It waited in the same place the last times it was
                    // asked: take it to be there again.
                    t.place.assume_waiting();
                }
                if !t.place.is_current() && !unresponsive {
                    // Off the CPU for a whole tick since it last ran: waiting
                    // in the kernel, or runnable but not given a core (more
                    // runnable threads than cores). Learn which, and where it
                    // waits, without interrupting it.
                    match self.look_blocked(idx, c) {
                        Look::Waiting(stack, context) => {
                            learned_waiting(self.threads.get_mut(idx), tick_no, stack, context);
                        }
                        Look::Running => {
                            let t = self.threads.get_mut(idx);
                            let context_now = t
                                .context_slot
                                .map_or(0, |s| crate::context::read_for(s, t.info.tid));
                            t.place.found_preempted(
                                t.last_stack.as_ref(),
                                t.last_context,
                                context_now,
                            );
                        }
                        Look::Gone => self.threads.get_mut(idx).gone = true,
                    }
                } else {
                    t.place.stayed_off();
                    t.schedule.stayed_off(MAX_CHECK_EVERY);
                }
            }
        }
        let t = self.threads.get_mut(idx);
        flush(&self.tx, c, t, &self.requests, false);
        t.schedule.next_check = tick_no + t.schedule.check_every;
    }

    /// Brings the timer of thread `idx` forward when it is inside a request
    /// of which no stack was captured yet (on any thread): its next capture
    /// comes after `NUDGE_AFTER` of its CPU time rather than after what is
    /// left of the current period. Otherwise a short request on a thread
    /// that gets a small share of a busy machine's cores can end before its
    /// first capture, and its periods have no stack to show. The shortened
    /// period is one of the thread's periods like any other (a capture
    /// beyond the tick's periods cancels a fill), so the thread is not
    /// sampled more than once per period of its wall time. Repeated at every
    /// tick that finds the thread in such a request (the capture may land in
    /// another request the thread polls in between), at most once per tick.
    fn nudge(&mut self, idx: usize, c: &Counters) {
        let period = self.period;
        let t = self.threads.get_mut(idx);
        let (Some(slot), Some(timer)) = (t.context_slot, &t.timer) else {
            return;
        };
        if !t.timer_armed {
            return;
        }
        let word = crate::context::read_for(slot, t.info.tid);
        if word == 0 || self.requests.get(word).is_some() {
            return;
        }
        // An expired timer whose signal waits for the thread to run again
        // (preempted) must be left alone: re-arming it makes the kernel
        // drop that signal, and with it the capture.
        if timer.remaining().is_none_or(|left| left <= NUDGE_AFTER) {
            return;
        }
        if timer.set_first(NUDGE_AFTER, period) {
            c.timers_nudged.add(1);
        }
    }

    /// A thread without a timer: signalled from here whenever its CPU clock
    /// moved, its previous stack repeated otherwise.
    fn untimed(&mut self, idx: usize, tick_ts: u64, now: Instant, c: &Counters) {
        let t = self.threads.get_mut(idx);
        if awaited(t, now, c) == Awaited::Pending {
            return;
        }
        let Some(cpu) = sys::thread_cpu_time_ns(t.info.tid) else {
            t.gone = true;
            return;
        };
        if cpu < t.cpu_seen_ns {
            t.reset_identity();
            c.threads_recycled.add(1);
            return;
        }
        match t.last_stack.clone() {
            Some(stack)
                if cpu - t.cpu_seen_ns <= IDLE_CPU_SLACK_NS || t.asking.is_unresponsive() =>
            {
                let context = t.context_slot.map_or(0, crate::context::read);
                c.samples_idle.add(1);
                emit_for(&self.tx, c, t, tick_ts, stack, context, true);
            }
            _ => {
                t.cpu_seen_ns = cpu;
                // A thread blocked in the kernel is read from here; only one
                // seen running is signalled (see `SamplerConfig::cpu_timers`).
                match self.look_blocked(idx, c) {
                    Look::Waiting(stack, context) => {
                        let t = self.threads.get_mut(idx);
                        t.last_stack = Some(stack.clone());
                        t.last_context = context;
                        emit_for(&self.tx, c, t, tick_ts, stack, context, false);
                    }
                    Look::Running => request(self.threads.get_mut(idx), true, now, c),
                    Look::Gone => self.threads.get_mut(idx).gone = true,
                }
            }
        }
    }

    /// Learns where thread `idx` waits, if it is blocked in the kernel,
    /// without interrupting it (see `sys::syscall_state`): the stack it
    /// waits in and the context word it publishes.
    fn look_blocked(&mut self, idx: usize, c: &Counters) -> Look {
        let cap = self.config.stack_copy_bytes;
        let t = self.threads.get_mut(idx);
        let tid = t.info.tid;
        let context_slot = t.context_slot;
        let known_bounds = t.stack_bounds;
        let Some(cpu_before) = sys::thread_cpu_time_ns(tid) else {
            return Look::Gone;
        };
        let (sp, pc) = match sys::syscall_state(tid, &mut self.stat_buf) {
            Some(sys::SyscallState::Blocked { sp, pc, .. }) => (sp, pc),
            Some(sys::SyscallState::Running) => return Look::Running,
            None if sys::thread_cpu_time_ns(tid).is_none() => return Look::Gone,
            // Unreadable (a hardened /proc): nothing is learned.
            None => return Look::Running,
        };
        let top = match known_bounds {
            Some((lo, hi)) if (lo..hi).contains(&(sp as usize)) => Some(hi),
            _ => {
                // Blocked in the kernel, its stack pointer is on its stack:
                // its bounds are learned here, before its first capture.
                let mapping = self.threads.stack_mapping(sp as usize);
                if let Some(bounds) = mapping {
                    if known_bounds.is_none() {
                        self.threads.set_bounds(idx, bounds);
                    }
                }
                mapping.map(|(_, hi)| hi)
            }
        };
        let len = top.map_or(0, |hi| (hi.saturating_sub(sp as usize)).min(cap));
        self.copy_buf.resize(len, 0);
        let copied = sys::read_own_memory(sp, &mut self.copy_buf[..len]);
        let context = context_slot.map_or(0, |s| crate::context::read_for(s, tid));
        if sys::thread_cpu_time_ns(tid) != Some(cpu_before) {
            // It woke up while its stack was read: the copy may mix two
            // moments.
            c.waits_raced.add(1);
            return Look::Running;
        }
        let start = Instant::now();
        self.unwinder
            .unwind_blocked(pc, sp, &self.copy_buf[..copied], &mut self.frames);
        c.unwind_ns.add(start.elapsed().as_nanos() as u64);
        c.waits_read.add(1);
        Look::Waiting(Arc::from(&self.frames[..]), context)
    }

    /// Gives a thread its slot and timer, and arms the timer, if not done
    /// yet. Returns false if the thread has no slot (counted).
    fn bind(&mut self, idx: usize, c: &Counters) -> bool {
        let cap = self.config.stack_copy_bytes;
        let period = self.period;
        let timers = self.config.cpu_timers;
        let t = self.threads.get_mut(idx);
        if t.slot.is_none() {
            let Some(slot) = Slot::acquire(cap) else {
                c.dropped_no_slot.add(1);
                return false;
            };
            // The second slot is a bonus: without it (the process-wide
            // limit reached) a capture that finds the first one full is
            // counted as missed.
            let second = Slot::acquire(cap);
            let (lo, hi) = t.stack_bounds.unwrap_or((0, 0));
            if !slot.bind(t.info.tid, lo, hi, second) {
                let _ = Slot::release(slot);
                if let Some(second) = second {
                    let _ = Slot::release(second);
                }
                return false;
            }
            t.slot = Some(slot);
            t.slot2 = second.filter(|s| s.bind(t.info.tid, lo, hi, None));
            t.cpu_seen_ns = sys::thread_cpu_time_ns(t.info.tid).unwrap_or(0);
            if timers {
                match sys::CpuTimer::create(t.info.tid, slot) {
                    Ok(timer) => t.timer = Some(timer),
                    // An exited thread's CPU clock is an invalid clock.
                    Err(_) if sys::thread_cpu_time_ns(t.info.tid).is_none() => t.gone = true,
                    Err(_) => c.timers_failed.add(1),
                }
            }
        }
        if let Some(timer) = &t.timer {
            if !t.timer_armed {
                t.timer_armed = timer.set(period);
                if !t.timer_armed {
                    t.timer = None;
                    if sys::thread_cpu_time_ns(t.info.tid).is_none() {
                        t.gone = true;
                    } else {
                        // The kernel refused: sample it from here instead.
                        c.timers_failed.add(1);
                    }
                }
            }
        }
        true
    }

    /// Reads the thread's slot if the handler filled it, emits what it
    /// holds, and re-arms it.
    fn harvest(&mut self, idx: usize, c: &Counters) -> Harvested {
        // The older capture first, when both slots are full.
        let t = self.threads.get_mut(idx);
        let slots = [t.slot, t.slot2];
        let filled = |s: Option<&'static Slot>| s.and_then(|s| s.filled_at());
        let order = match (filled(slots[0]), filled(slots[1])) {
            (Some(a), Some(b)) if b < a => [1, 0],
            _ => [0, 1],
        };
        let first = self.harvest_slot(idx, slots[order[0]], c);
        let second = self.harvest_slot(idx, slots[order[1]], c);
        match (first, second) {
            (Harvested::Running(a), Harvested::Running(b)) => Harvested::Running2(a, b),
            (Harvested::Running(a), _) | (_, Harvested::Running(a)) => Harvested::Running(a),
            (Harvested::Parked, _) | (_, Harvested::Parked) => Harvested::Parked,
            (Harvested::Discarded, _) | (_, Harvested::Discarded) => Harvested::Discarded,
            _ => Harvested::Nothing,
        }
    }

    /// [`Worker::harvest`] for one of the thread's slots.
    fn harvest_slot(&mut self, idx: usize, slot: Option<&'static Slot>, c: &Counters) -> Harvested {
        let Some(slot) = slot else {
            return Harvested::Nothing;
        };
        let frames = &mut self.frames;
        let unwinder = &mut self.unwinder;
        let Some(filled) = slot.filled() else {
            return Harvested::Nothing;
        };
        let cap = *filled.captured();
        let off_stack = cap.flags & sys::FLAG_OFF_STACK != 0;
        if !off_stack {
            let start = Instant::now();
            unwinder.unwind(&cap.regs, filled.stack(), frames);
            c.unwind_ns.add(start.elapsed().as_nanos() as u64);
        }
        let timer = cap.flags & sys::FLAG_TIMER != 0;
        let mut keep = true;
        if off_stack {
            let sp = cap.regs.sp as usize;
            // Bounds just learned, or learned through the thread's other slot
            // after this one was armed: spent, the next capture counts.
            let stale = self
                .threads
                .get_mut(idx)
                .stack_bounds
                .is_some_and(|(lo, hi)| (lo..hi).contains(&sp));
            if self.threads.learn_bounds(idx, sp) || stale {
                keep = false;
            } else {
                self.frames.clear();
                self.frames.push(cap.regs.pc);
                c.samples_off_stack.add(1);
            }
        }
        let t = self.threads.get_mut(idx);
        let (lo, hi) = t.stack_bounds.unwrap_or((0, 0));
        filled.rearm(lo, hi);
        // Any capture proves the thread takes the signal again. A timer
        // capture also ends a question about where the thread waits: it
        // runs, and the question's signal may have found the slot full.
        let request = t.asking.answered();
        c.handler_ns.add(cap.handler_ns);
        if !keep {
            c.captures_discarded.add(1);
            return Harvested::Discarded;
        }
        let stack: Arc<[u64]> = match &t.last_stack {
            Some(last) if **last == self.frames[..] => last.clone(),
            _ => Arc::from(&self.frames[..]),
        };
        t.last_stack = Some(stack.clone());
        t.last_context = cap.context;
        c.samples_captured.add(1);
        if timer {
            c.samples_timer.add(1);
        }
        if timer || t.timer.is_none() || request.is_some_and(|r| r.as_sample) {
            self.requests.record(cap.context, &stack);
            return Harvested::Running(sample_of(t, cap.timestamp_ns, stack, cap.context, false));
        }
        // The answer to where it waits, taken by a signal (so possibly while
        // it ran): the same answer as last time means asking less often (up
        // to once a second at 101 Hz), another one at every chance again.
        let answer = t.place.found_waiting(stack, cap.context, false);
        t.schedule.answered(answer, self.tick_no, MAX_ASK_EVERY);
        Harvested::Parked
    }

    /// Stops the timers, waits briefly for requests in flight, and records
    /// every thread's held fills (the sampler is pausing or stopping).
    fn settle(&mut self) {
        for idx in 0..self.threads.len() {
            let t = self.threads.get_mut(idx);
            if let Some(timer) = &t.timer {
                if t.timer_armed {
                    timer.set(Duration::ZERO);
                    t.timer_armed = false;
                }
            }
        }
        let until = Instant::now() + Duration::from_millis(20);
        loop {
            let seen = sys::completion_seq();
            let waiting = (0..self.threads.len()).any(|i| {
                let t = self.threads.get_mut(i);
                t.asking.is_asked()
                    && [t.slot, t.slot2]
                        .into_iter()
                        .flatten()
                        .all(|s| s.state() != sys::SlotState::Done)
            });
            let now = Instant::now();
            if !waiting || now >= until {
                break;
            }
            sys::wait_completion(seen, until - now);
        }
        let shared = Arc::clone(&self.shared);
        let c = &shared.counters;
        for idx in 0..self.threads.len() {
            if self.threads.get_mut(idx).gone || self.threads.get_mut(idx).slot.is_none() {
                continue;
            }
            let harvested = self.harvest(idx, c);
            let t = self.threads.get_mut(idx);
            t.asking.forget();
            for sample in harvested.running() {
                t.ledger.push_sample(sample);
            }
            let alive = sys::thread_cpu_time_ns(t.info.tid).is_some();
            if alive {
                t.ledger.alive_ns = u64::MAX;
            }
            flush(&self.tx, c, t, &self.requests, true);
            // Fills after the thread was last seen alive are dropped.
            t.ledger.clear();
            if alive {
                t.ledger.alive_ns = sys::realtime_ns();
            }
            t.schedule.reset_checks();
        }
    }
}

/// What [`Worker::look_blocked`] found.
enum Look {
    /// Blocked in the kernel: the stack it waits in, and its context word.
    Waiting(Arc<[u64]>, u64),
    /// Running or runnable (or it woke up while being read).
    Running,
    /// Exited.
    Gone,
}

/// Records where `t` waits, just read from here while it was blocked there
/// (so verified), at period `tick_no`.
fn learned_waiting(t: &mut Tracked, tick_no: u64, stack: Arc<[u64]>, context: u64) {
    let answer = t.place.found_waiting(stack, context, true);
    t.schedule.answered(answer, tick_no, MAX_ASK_EVERY);
}

/// The latest stack captured in each request (by context word), for
/// periods a thread spends in a request without a capture of its own there.
/// Bounded: the oldest requests are forgotten first.
#[derive(Default)]
struct RequestStacks {
    by_context: rustc_hash::FxHashMap<u64, Recent>,
    order: std::collections::VecDeque<u64>,
}

/// Most stacks [`RequestStacks`] keeps of one request.
const RECENT_PER_REQUEST: usize = 4;

/// A request's latest stacks, the newest at `latest`.
#[derive(Default)]
struct Recent {
    stacks: [Option<Arc<[u64]>>; RECENT_PER_REQUEST],
    latest: usize,
    len: usize,
}

/// Most requests [`RequestStacks`] remembers.
const MAX_REQUEST_STACKS: usize = 1024;

impl RequestStacks {
    fn record(&mut self, context: u64, stack: &Arc<[u64]>) {
        if context == 0 {
            return;
        }
        let recent = match self.by_context.entry(context) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                self.order.push_back(context);
                e.insert(Recent::default())
            }
        };
        recent.latest = (recent.latest + 1) % RECENT_PER_REQUEST;
        recent.stacks[recent.latest] = Some(stack.clone());
        recent.len = (recent.len + 1).min(RECENT_PER_REQUEST);
        if self.order.len() > MAX_REQUEST_STACKS {
            if let Some(old) = self.order.pop_front() {
                self.by_context.remove(&old);
            }
        }
    }

    /// The request's latest stack.
    fn get(&self, context: u64) -> Option<Arc<[u64]>> {
        self.pick(context, 0)
    }

    /// One of the request's latest stacks, the `n`th newest (round).
    /// Periods a thread spends preempted in a request show these in turn:
    /// where it was preempted is not known, and one stack repeated over a
    /// long preemption (a capture that happened to land in the runtime's
    /// code between two slices of work) would show that code for all of
    /// it.
    fn pick(&self, context: u64, n: usize) -> Option<Arc<[u64]>> {
        let recent = self.by_context.get(&context)?;
        if recent.len == 0 {
            return None;
        }
        let back = n % recent.len;
        let i = (recent.latest + RECENT_PER_REQUEST - back) % RECENT_PER_REQUEST;
        recent.stacks[i].clone()
    }
}

/// Whether a signal sent to `t` is still awaited at `now` (see
/// [`state::Asking::check`]), counting a tick it keeps waiting and a
/// signal given up on.
fn awaited(t: &mut Tracked, now: Instant, c: &Counters) -> Awaited {
    let awaited = t.asking.check(now, ABANDON_AFTER);
    match awaited {
        Awaited::Pending => c.samples_late.add(1),
        Awaited::GaveUp => c.signals_abandoned.add(1),
        Awaited::Nothing => {}
    }
    awaited
}

/// Sends thread `t` a signal asking for its stack; `as_sample` when the
/// capture is a sample of its own rather than the thread's parked stack.
fn request(t: &mut Tracked, as_sample: bool, now: Instant, c: &Counters) {
    let Some(slot) = t.slot else { return };
    match sys::send_sample_signal(t.info.tid, slot) {
        Ok(()) => {
            c.signals_sent.add(1);
            t.asking.sent(now, as_sample);
        }
        Err(sys::SendError::ThreadGone) => t.gone = true,
        Err(_) => c.dropped_signal_failed.add(1),
    }
}

/// Lets `t`'s held samples leave while they may (see `Ledger::drain`);
/// with `force` (the sampler pauses or stops), fills also leave while where
/// the thread stands is not known.
fn flush(
    tx: &SyncSender<Sample>,
    c: &Counters,
    t: &mut Tracked,
    requests: &RequestStacks,
    force: bool,
) {
    let view = ledger::DrainView {
        place: t.place.fill_place(t.last_stack.as_ref(), force),
        asking: t.asking.asks_where(),
        last: t.last_stack.as_ref(),
        last_context: t.last_context,
        force,
        request_stack_wait_ns: REQUEST_STACK_WAIT_NS,
    };
    let (tid, name, start) = (t.info.tid, &t.name, t.info.start_time);
    t.ledger.drain(
        &view,
        |context| requests.get(context),
        |out| match out {
            ledger::Out::Sample(sample) => emit(tx, c, sample),
            ledger::Out::Fill {
                timestamp_ns,
                stack,
                context,
            } => {
                c.samples_idle.add(1);
                let sample = Sample::new(timestamp_ns, tid, name.clone(), stack, context, true)
                    .with_thread_start(start);
                emit(tx, c, sample);
            }
        },
    );
}

/// Emits one sample of thread `t`.
fn emit_for(
    tx: &SyncSender<Sample>,
    c: &Counters,
    t: &Tracked,
    timestamp_ns: u64,
    stack: Arc<[u64]>,
    context: u64,
    repeated: bool,
) {
    emit(tx, c, sample_of(t, timestamp_ns, stack, context, repeated));
}

/// A sample of thread `t`.
fn sample_of(
    t: &Tracked,
    timestamp_ns: u64,
    stack: Arc<[u64]>,
    context: u64,
    repeated: bool,
) -> Sample {
    Sample::new(
        timestamp_ns,
        t.info.tid,
        t.name.clone(),
        stack,
        context,
        repeated,
    )
    .with_thread_start(t.info.start_time)
}

fn emit(tx: &SyncSender<Sample>, c: &Counters, sample: Sample) {
    match tx.try_send(sample) {
        Ok(()) => c.samples_emitted.add(1),
        Err(TrySendError::Full(_)) => c.dropped_queue_full.add(1),
        Err(TrySendError::Disconnected(_)) => c.dropped_queue_full.add(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_gives_its_last_few_stacks_in_turn() {
        let s = |a: u64| -> Arc<[u64]> { Arc::from(&[a][..]) };
        let mut r = RequestStacks::default();
        assert!(r.get(7).is_none());
        // Context 0 is outside any request: never recorded.
        r.record(0, &s(1));
        assert!(r.get(0).is_none());
        r.record(7, &s(1));
        r.record(7, &s(2));
        assert_eq!(r.get(7), Some(s(2)));
        assert_eq!(r.pick(7, 1), Some(s(1)));
        assert_eq!(r.pick(7, 2), Some(s(2)));
        for a in 3..=6 {
            r.record(7, &s(a));
        }
        // The last four, newest first, in turn.
        let turns: Vec<_> = (0..5).map(|n| r.pick(7, n).unwrap()[0]).collect();
        assert_eq!(turns, [6, 5, 4, 3, 6]);
        // Another request's stacks are never given.
        assert!(r.pick(8, 0).is_none());
    }
}
