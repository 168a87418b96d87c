//! The sampler: a dedicated thread that ticks against absolute deadlines,
//! signals every thread whose CPU clock moved, unwinds what the handler
//! copied and emits [`Sample`]s into a bounded queue.
//!
//! Threads whose CPU time did not advance since their last sample are not
//! signalled; their previous stack is recorded again with the tick's
//! timestamp (wall-clock semantics at no cost to parked threads, and no
//! `EINTR` for a Tokio worker parked in `epoll_wait`).

mod sample;
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
use stats::Counters;
use threads::ThreadTable;

/// How long a signalled thread may take to run the handler before its slot
/// is abandoned (a thread that blocks the signal, or is starved of CPU).
const ABANDON_AFTER: Duration = Duration::from_millis(500);

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
        self.shared.active.store(false, Ordering::Release);
    }

    /// Resumes sampling.
    pub fn resume(&self) {
        if !self.shared.active.swap(true, Ordering::AcqRel) {
            if let Some(t) = &self.thread {
                t.unpark();
            }
        }
    }

    /// Whether the sampler is sampling (started and not paused).
    pub fn is_active(&self) -> bool {
        self.shared.active.load(Ordering::Acquire) && !self.shared.stop.load(Ordering::Acquire)
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
    free_slots: Vec<&'static Slot>,
    frames: Vec<u64>,
    pending: Vec<usize>,
}

impl Worker {
    fn new(config: SamplerConfig, tx: SyncSender<Sample>, shared: Arc<Shared>) -> Self {
        let unwinder = StackUnwinder::new(Arc::clone(&shared.modules));
        Self {
            period: Duration::from_secs_f64(1.0 / f64::from(config.frequency_hz)),
            threads: ThreadTable::default(),
            unwinder,
            free_slots: Vec::new(),
            frames: Vec::with_capacity(crate::unwind::MAX_FRAMES),
            pending: Vec::new(),
            config,
            tx,
            shared,
        }
    }

    fn run(&mut self) {
        let mut deadline = Instant::now();
        while !self.shared.stop.load(Ordering::Acquire) {
            if !self.shared.active.load(Ordering::Acquire) {
                // Paused: finish what is in flight, then sleep until resumed.
                self.collect_until(Instant::now() + Duration::from_millis(20));
                while !self.shared.active.load(Ordering::Acquire)
                    && !self.shared.stop.load(Ordering::Acquire)
                {
                    std::thread::park_timeout(Duration::from_millis(250));
                }
                deadline = Instant::now();
                continue;
            }
            let cpu_before = sys::own_cpu_time_ns();
            self.tick();
            let c = &self.shared.counters;
            c.tick_cpu_ns
                .add(sys::own_cpu_time_ns().saturating_sub(cpu_before));
            deadline += self.period;
            let now = Instant::now();
            if deadline <= now {
                // The tick overran: skip the missed ticks instead of bursting
                // to catch up, and count them.
                let behind = now.duration_since(deadline);
                let missed = (behind.as_nanos() / self.period.as_nanos().max(1)) as u64 + 1;
                self.shared.counters.ticks_skipped.add(missed);
                deadline += self.period * missed as u32;
            }
            while !self.shared.stop.load(Ordering::Acquire) {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                std::thread::park_timeout(deadline - now);
            }
        }
        self.finish();
    }

    fn tick(&mut self) {
        let shared = Arc::clone(&self.shared);
        let c = &shared.counters;
        c.ticks.add(1);
        let tick_ts = sys::realtime_ns();
        // Last tick's captures first: their threads' table entries still name
        // the threads that took them, even if a listing below finds an id
        // reused since.
        self.unwinder.refresh_modules();
        self.harvest(false);
        if self.threads.refresh_due() {
            let mut salvaged = Vec::new();
            self.threads.refresh(&own_threads(), c, &mut salvaged);
            self.free_slots.append(&mut salvaged);
        }

        self.pending.clear();
        for idx in 0..self.threads.len() {
            let t = self.threads.get_mut(idx);
            if t.gone {
                continue;
            }
            if t.outstanding.is_some() {
                c.samples_late.add(1);
                continue;
            }
            let Some(cpu) = sys::thread_cpu_time_ns(t.info.tid) else {
                t.gone = true;
                continue;
            };
            if cpu < t.last_cpu_ns {
                // A CPU clock never goes back: the id now names another thread.
                t.reset_identity();
                c.threads_recycled.add(1);
            }
            match &t.last_stack {
                Some(stack) if cpu.saturating_sub(t.last_cpu_ns) <= IDLE_CPU_SLACK_NS => {
                    // The thread's context word now, not at its last capture:
                    // it may have left a request's span before parking.
                    let context = t.context_slot.map_or(0, crate::context::read);
                    let sample = Sample::new(
                        tick_ts,
                        t.info.tid,
                        t.name.clone(),
                        stack.clone(),
                        context,
                        true,
                    )
                    .with_thread_start(t.info.start_time);
                    c.samples_idle.add(1);
                    emit(&self.tx, c, sample);
                }
                _ => {
                    t.last_cpu_ns = cpu;
                    self.pending.push(idx);
                }
            }
        }
        // Signal and go back to sleep: handlers are collected at the next
        // tick. Waiting for them here would cost a wake-up per tick, and on a
        // host with more runnable threads than cores each wake-up waits for a
        // CPU; the handlers themselves then skip the futex wake as well.
        let pending = std::mem::take(&mut self.pending);
        self.signal_all(&pending);
        self.pending = pending;
    }

    fn signal_all(&mut self, which: &[usize]) {
        let shared = Arc::clone(&self.shared);
        let c = &shared.counters;
        for &idx in which {
            let Some(slot) = self
                .free_slots
                .pop()
                .or_else(|| Slot::acquire(self.config.stack_copy_bytes))
            else {
                c.dropped_no_slot.add(1);
                continue;
            };
            let t = self.threads.get_mut(idx);
            let (lo, hi) = t.stack_bounds.unwrap_or((0, 0));
            if !slot.arm(lo, hi) {
                // Not free (should not happen for a slot we own): keep it
                // out of circulation.
                Slot::release(slot);
                continue;
            }
            match sys::send_sample_signal(t.info.tid, slot) {
                Ok(()) => {
                    c.signals_sent.add(1);
                    t.outstanding = Some((slot, Instant::now()));
                }
                Err(e) => {
                    slot.disarm();
                    self.free_slots.push(slot);
                    match e {
                        sys::SendError::ThreadGone => t.gone = true,
                        _ => c.dropped_signal_failed.add(1),
                    }
                }
            }
        }
    }

    /// Harvests completed slots until none is outstanding or `until` passes.
    fn collect_until(&mut self, until: Instant) {
        loop {
            let seen = sys::completion_seq();
            if self.harvest(false) == 0 {
                return;
            }
            let now = Instant::now();
            if now >= until {
                return;
            }
            sys::wait_completion(seen, until - now);
        }
    }

    /// Processes every finished slot; returns how many are still in flight.
    fn harvest(&mut self, final_pass: bool) -> usize {
        let shared = Arc::clone(&self.shared);
        let c = &shared.counters;
        let mut in_flight = 0;
        for idx in 0..self.threads.len() {
            let t = self.threads.get_mut(idx);
            let Some((slot, since)) = t.outstanding else {
                continue;
            };
            let frames = &mut self.frames;
            let unwinder = &mut self.unwinder;
            let taken = slot.take(|cap, stack| {
                let off_stack = cap.flags & sys::FLAG_OFF_STACK != 0;
                if !off_stack {
                    let start = Instant::now();
                    unwinder.unwind(&cap.regs, stack, frames);
                    c.unwind_ns.add(start.elapsed().as_nanos() as u64);
                }
                (*cap, off_stack)
            });
            let Some((cap, off_stack)) = taken else {
                let give_up = final_pass || t.gone || since.elapsed() > ABANDON_AFTER;
                if give_up && slot.abandon() {
                    c.signals_abandoned.add(1);
                    t.outstanding = None;
                    t.abandoned.push(slot);
                } else {
                    in_flight += 1;
                }
                continue;
            };
            t.outstanding = None;
            self.free_slots.push(slot);
            if off_stack {
                if !final_pass && self.threads.learn_bounds(idx, cap.regs.sp as usize) {
                    continue;
                }
                self.frames.clear();
                self.frames.push(cap.regs.pc);
                c.samples_off_stack.add(1);
            }
            let t = self.threads.get_mut(idx);
            let stack: Arc<[u64]> = match &t.last_stack {
                Some(last) if **last == self.frames[..] => last.clone(),
                _ => Arc::from(&self.frames[..]),
            };
            t.last_stack = Some(stack.clone());
            c.samples_captured.add(1);
            c.handler_ns.add(cap.handler_ns);
            let sample = Sample::new(
                cap.timestamp_ns,
                t.info.tid,
                t.name.clone(),
                stack,
                cap.context,
                false,
            )
            .with_thread_start(t.info.start_time);
            emit(&self.tx, c, sample);
        }
        self.threads.recycle_abandoned(&mut self.free_slots);
        self.threads.remove_gone(&mut self.free_slots);
        in_flight
    }

    fn finish(&mut self) {
        self.collect_until(Instant::now() + Duration::from_millis(20));
        self.harvest(true);
        for slot in self.free_slots.drain(..) {
            Slot::release(slot);
        }
        self.threads.release_all();
    }
}

fn emit(tx: &SyncSender<Sample>, c: &Counters, sample: Sample) {
    match tx.try_send(sample) {
        Ok(()) => c.samples_emitted.add(1),
        Err(TrySendError::Full(_)) => c.dropped_queue_full.add(1),
        Err(TrySendError::Disconnected(_)) => c.dropped_queue_full.add(1),
    }
}
