//! The profiler session: its lifecycle (manual or trace), flush and
//! shutdown. The parts:
//!
//! - this file: the session itself, what application threads call (a few
//!   atomic operations each), and starting and stopping it;
//! - [`intake`]: the sampler thread's consumer: takes the samples and the
//!   threads' context-word changes as they come, and hands them to the
//!   chunk thread in batches with the flush and shutdown commands;
//! - [`chunk_thread`]: the thread that creates the sampler and takes those
//!   batches into the chunk writer;
//! - [`desk`]: what the chunk thread keeps: the lane table and the samples
//!   so far;
//! - [`chunk_writer`]: the chunk in progress: fill-ins, encoding, exports,
//!   handing chunks to the sink;
//! - [`v1`]: transaction-based (V1) profiling: its sampling decision, its
//!   writer (in place of the chunk writer), and the seam
//!   ([`v1::PendingProfile`]) through which the Sentry glue hands it
//!   transactions;
//! - [`sink`]: where finished chunks go ([`sink::ChunkSink`], implemented
//!   by the Sentry transport glue);
//! - [`stats`]: counters and [`ProfilerStats`].
//!
//! The session depends on the sampler, the lanes and the encoders, never on
//! the Sentry glue (`transport`, `transaction_profile`, `integration`): the
//! glue hands it a sink and pending transactions through the traits above.
//! Unit tests (`import_graph`: `the_core_never_names_the_glue`,
//! `no_import_circle`), which read the crate's module graph from its `use`
//! trees and paths, keep it that way.
//!
//! Everything an application thread calls here (root span started/finished,
//! start/stop) is a few atomic operations: the sampler is created paused on
//! the chunk thread at init (which waits for it, up to two seconds, so
//! that the first transactions are sampled) and only resumed or paused
//! afterwards.

mod chunk_thread;
mod chunk_writer;
mod desk;
mod intake;
pub(crate) mod sink;
mod stats;
pub(crate) mod v1;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwapOption;

use crate::attribution::ThreadAttribution;
use crate::export::{ExportTarget, FileRetention};
use crate::lanes::{LaneLink, LaneRegistry};
use crate::options::{ProfileLifecycle, SamplerConfig};
use crate::request_times::RequestTimes;
use crate::sampler::{SamplerControl, SamplerStats};
use intake::Command;
use sink::ChunkSink;
use stats::Counters;
pub(crate) use stats::DeliveryCounters;
pub use stats::{ChunkDrops, ProfilerStats};
use v1::{PendingProfile, V1Config};

/// The session currently running in this process, for the tracing layer.
static CURRENT: ArcSwapOption<Session> = ArcSwapOption::const_empty();
/// The most recent session, kept after shutdown so its counters stay readable.
static LAST: ArcSwapOption<Session> = ArcSwapOption::const_empty();

/// The running session, if profiling is configured and this process's
/// session was sampled. Never in a forked child: the session's threads
/// stayed in the parent.
pub(crate) fn current() -> Option<Current> {
    if crate::sys::in_forked_child() {
        return None;
    }
    let guard = CURRENT.load();
    guard.is_some().then_some(Current(guard))
}

/// The running session, borrowed for a moment (see [`current`]). Reading
/// it touches no reference count: the application's threads read it several
/// times per request, and a count they all write would be one cache line
/// passed between cores at every look.
pub(crate) struct Current(arc_swap::Guard<Option<Arc<Session>>>);

impl std::ops::Deref for Current {
    type Target = Session;

    fn deref(&self) -> &Session {
        match &*self.0 {
            Some(session) => session,
            // `current` builds a `Current` only around a session.
            None => unreachable!("a Current always holds a session"),
        }
    }
}

impl Current {
    /// The session itself, to keep beyond this moment (one reference
    /// count): what a request that holds something of it keeps, so that it
    /// gives it back there.
    pub(crate) fn shared(&self) -> Arc<Session> {
        match &*self.0 {
            Some(session) => Arc::clone(session),
            None => unreachable!("a Current always holds a session"),
        }
    }
}

/// The current session, or the last one after it shut down (none in a
/// forked child, whose copy of the counters would only mislead).
pub(crate) fn last() -> Option<Arc<Session>> {
    if crate::sys::in_forked_child() {
        return None;
    }
    LAST.load_full()
}

/// Settled configuration of a session.
#[derive(Debug, Clone)]
pub(crate) struct SessionConfig {
    pub(crate) sampler: SamplerConfig,
    pub(crate) lifecycle: ProfileLifecycle,
    pub(crate) chunk_duration: Duration,
    pub(crate) symbolize: bool,
    pub(crate) release: String,
    pub(crate) environment: Option<String>,
    pub(crate) debug: bool,
    pub(crate) attribution: ThreadAttribution,
    pub(crate) exports: Vec<ExportTarget>,
    /// How many exported files are kept.
    pub(crate) file_retention: FileRetention,
    pub(crate) service_name: String,
    /// Transaction-based (V1) profiling instead of continuous chunks.
    pub(crate) v1: Option<V1Config>,
    /// A poll of an instrumented request at least this long is a long poll.
    pub(crate) long_poll: Duration,
    /// Whether requests whose transactions Sentry never links (shorter than
    /// 19.8 ms) keep their lanes in chunks without exports.
    pub(crate) short_request_lanes: bool,
    /// Blocking polls as issue events.
    pub(crate) blocking: crate::blocking::BlockingConfig,
}

/// A request's lane and its times, handed to the intake (see
/// [`Session::request_times`]).
pub(super) type NewTimes = (u64, Arc<RequestTimes>);

/// How long `sentry::init` waits for the sampler to be ready, at most.
const SAMPLER_READY_WAIT: Duration = Duration::from_secs(2);

/// One profiling session (one `sentry::init`).
pub(crate) struct Session {
    profiler_id: Arc<str>,
    config: OnceLock<SessionConfig>,
    session_sampled: AtomicBool,
    /// Where chunks go (set by the Sentry glue's transport factory).
    sink: Mutex<Option<Arc<dyn ChunkSink>>>,
    delivery: Arc<DeliveryCounters>,
    control: OnceLock<SamplerControl>,
    commands: Mutex<Option<Sender<Command>>>,
    /// Lanes registered by application threads, read by the chunk thread.
    lanes: LaneRegistry,
    /// Where a request with a lane hands its [`RequestTimes`] to the
    /// sampler thread's intake, which adds its threads' waits for a CPU.
    times: OnceLock<SyncSender<NewTimes>>,
    /// The intake's end of that queue, until the intake takes it.
    times_rx: Mutex<Option<Receiver<NewTimes>>>,
    v1_queue: OnceLock<std::sync::mpsc::SyncSender<Box<dyn PendingProfile>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Root spans active (trace lifecycle): counted as each begins and
    /// ends, on every worker, so each worker on a line of its own.
    active_roots: crate::own_line::SpreadCount,
    manual_running: AtomicBool,
    shut_down: AtomicBool,
    counters: Counters,
    last_sampler_stats: Mutex<SamplerStats>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("profiler_id", &self.profiler_id)
            .field("session_sampled", &self.session_sampled)
            .finish_non_exhaustive()
    }
}

impl Session {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            profiler_id: crate::encode::sentry_chunk::new_id().into(),
            config: OnceLock::new(),
            session_sampled: AtomicBool::new(false),
            sink: Mutex::new(None),
            delivery: Arc::default(),
            control: OnceLock::new(),
            commands: Mutex::new(None),
            lanes: LaneRegistry::default(),
            times: OnceLock::new(),
            times_rx: Mutex::new(None),
            v1_queue: OnceLock::new(),
            thread: Mutex::new(None),
            active_roots: crate::own_line::SpreadCount::default(),
            manual_running: AtomicBool::new(false),
            shut_down: AtomicBool::new(false),
            counters: Counters::default(),
            last_sampler_stats: Mutex::new(SamplerStats::default()),
        })
    }

    /// Records where chunks go (called by the transport factory).
    pub(crate) fn set_sink(&self, sink: Arc<dyn ChunkSink>) {
        *self.sink.lock().unwrap_or_else(|e| e.into_inner()) = Some(sink);
    }

    /// The counters the crate's chunk sender keeps.
    #[cfg(feature = "http")]
    pub(crate) fn delivery_counters(&self) -> Arc<DeliveryCounters> {
        Arc::clone(&self.delivery)
    }

    /// Starts the session: publishes it and starts the chunk thread with a
    /// paused sampler. Called once, from the integration's `setup`.
    pub(crate) fn activate(self: &Arc<Self>, config: SessionConfig, sampled: bool) {
        crate::sys::watch_fork();
        if self.config.set(config).is_err() {
            return;
        }
        if crate::sys::in_forked_child() {
            // The parent's sampler state (its locks, slots and thread list)
            // was copied mid-flight; a fresh session here could trip on it.
            self.debug("profiling disabled: this process is a fork of a profiled process");
            return;
        }
        LAST.store(Some(Arc::clone(self)));
        self.session_sampled.store(sampled, Ordering::Release);
        if !sampled {
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        *self.commands.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        let Some(lane_rx) = self.lanes.open() else {
            return;
        };
        // As many as lanes can be in flight: a request that registered its
        // lane always finds room, unless the intake is behind by that much.
        let (times_tx, times_rx) =
            std::sync::mpsc::sync_channel(crate::lanes::registry::MAX_LANES_IN_FLIGHT);
        let _ = self.times.set(times_tx);
        *self.times_rx.lock().unwrap_or_else(|e| e.into_inner()) = Some(times_rx);
        let (v1_tx, v1_rx) = std::sync::mpsc::sync_channel(v1::V1_QUEUE);
        let _ = self.v1_queue.set(v1_tx);
        let this = Arc::clone(self);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("sentry-profiler-chunks".into())
            .spawn(move || this.run(rx, lane_rx, v1_rx, ready_tx));
        match spawned {
            Ok(handle) => {
                *self.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
                CURRENT.store(Some(Arc::clone(self)));
                // Wait for the sampler (its module list takes a while to
                // read): a transaction that starts before it samples would
                // be linked to a profile with no samples of it.
                if ready_rx.recv_timeout(SAMPLER_READY_WAIT)
                    == Err(std::sync::mpsc::RecvTimeoutError::Timeout)
                {
                    self.debug("the sampler is not ready yet; the first samples will come late");
                }
            }
            Err(e) => {
                eprintln!(
                    "sentry-profiling: profiling disabled: cannot start the chunk thread: {e}"
                );
                self.session_sampled.store(false, Ordering::Release);
            }
        }
    }

    fn config(&self) -> Option<&SessionConfig> {
        self.config.get()
    }

    fn debug(&self, msg: &str) {
        if self.config().is_some_and(|c| c.debug) {
            eprintln!("[sentry] sentry-profiling: {msg}");
        }
    }

    /// The profiler id, when this session profiles.
    pub(crate) fn profiler_id(&self) -> Option<&str> {
        self.session_sampled
            .load(Ordering::Acquire)
            .then_some(&*self.profiler_id)
    }

    /// The profiler id, shared rather than copied, whether or not the
    /// session is sampled (see [`Session::profiler_id`]): for the crate's
    /// transaction sender to keep, and for tagging spans.
    pub(crate) fn profiler_id_shared(&self) -> Arc<str> {
        Arc::clone(&self.profiler_id)
    }

    /// The lifecycle mode.
    pub(crate) fn lifecycle(&self) -> ProfileLifecycle {
        self.config()
            .map_or(ProfileLifecycle::Manual, |c| c.lifecycle)
    }

    /// Whether samples are being taken right now, or will be as soon as the
    /// sampler (created at init on the chunk thread) is ready.
    pub(crate) fn is_running(&self) -> bool {
        if self.shut_down.load(Ordering::Acquire) || self.profiler_id().is_none() {
            return false;
        }
        // The sampler's flag first: while it samples (every request of a
        // busy service), the roots' count, spread over many lines, is not
        // read.
        self.manual_running.load(Ordering::Acquire)
            || self.control.get().is_some_and(SamplerControl::is_active)
            || self.active_roots.active() > 0
    }

    fn set_sampling(&self, on: bool) {
        if let Some(control) = self.control.get() {
            if on {
                control.resume()
            } else {
                control.pause()
            }
        }
    }

    /// Trace lifecycle: a sampled root span became active. Returns whether
    /// the profiler runs for it.
    ///
    /// In the steady state this is one atomic add and one atomic load: the
    /// sampler keeps running across the gaps between requests (see
    /// [`Session::pause_if_idle`]), so only the first root after a pause
    /// resumes it, waking the sampler thread.
    pub(crate) fn root_started(&self, lane: u64, name: &str) -> bool {
        if self.profiler_id().is_none() || self.shut_down.load(Ordering::Acquire) {
            return false;
        }
        let wanted = match self.v1() {
            Some(v1) => v1.sampled(lane, name),
            None => self.lifecycle() == ProfileLifecycle::Trace,
        };
        if !wanted {
            return false;
        }
        // Sequentially consistent with `pause_if_idle`'s store and load: either
        // this thread sees the sampler paused, or the chunk thread sees
        // this root and resumes it.
        self.active_roots.begin();
        if let Some(control) = self.control.get() {
            if !control.is_active() {
                control.resume();
            }
        }
        true
    }

    /// Trace lifecycle: a root span for which [`Session::root_started`]
    /// returned true has finished. The sampler is not paused here: the spec
    /// stops the profiler when no root span is active *letting the current
    /// chunk finish*, and pausing and resuming per request would cost a
    /// wake-up of the sampler thread (a `futex` system call) each time the
    /// number of requests in flight drops to zero and back.
    pub(crate) fn root_finished(&self) {
        self.active_roots.end();
    }

    /// On the chunk thread, at the end of a chunk (or, for transaction
    /// profiles, after a second without a root): pauses the sampler when
    /// the trace lifecycle has no root span active. Returns whether it
    /// paused.
    pub(super) fn pause_if_idle(&self) -> bool {
        let trace_driven = self.v1().is_some() || self.lifecycle() == ProfileLifecycle::Trace;
        if !trace_driven
            || self.manual_running.load(Ordering::Acquire)
            || self.active_roots.active() > 0
        {
            return false;
        }
        let Some(control) = self.control.get() else {
            return false;
        };
        control.pause();
        // A root that started between the load above and the pause saw the
        // sampler still active and did not resume it: resume it here.
        if self.active_roots.active() > 0 {
            control.resume();
            return false;
        }
        true
    }

    /// Whether a root span of the trace lifecycle is active.
    pub(super) fn roots_active(&self) -> bool {
        self.active_roots.active() > 0
    }

    /// Manual lifecycle: starts the profiler (spec no-op rules apply).
    pub(crate) fn start_manual(&self) {
        if self.lifecycle() == ProfileLifecycle::Trace {
            self.debug("start_profiler() has no effect with the trace lifecycle");
            return;
        }
        if self.profiler_id().is_none() {
            self.debug("start_profiler() has no effect: this profiling session was not sampled");
            return;
        }
        if self.manual_running.swap(true, Ordering::AcqRel) {
            self.debug("start_profiler() has no effect: the profiler is already running");
            return;
        }
        self.set_sampling(true);
    }

    /// Manual lifecycle: stops the profiler.
    pub(crate) fn stop_manual(&self) {
        if self.lifecycle() == ProfileLifecycle::Trace {
            self.debug("stop_profiler() has no effect with the trace lifecycle");
            return;
        }
        if !self.manual_running.swap(false, Ordering::AcqRel) {
            self.debug("stop_profiler() has no effect: the profiler is not running");
            return;
        }
        self.set_sampling(false);
    }

    /// Transaction-based profiling settings, when that mode is on.
    pub(crate) fn v1(&self) -> Option<&V1Config> {
        self.config().and_then(|c| c.v1.as_ref())
    }

    /// V1 mode: hands a transaction to be profiled to the chunk thread, or
    /// gives its envelope back, without a profile, when the queue is full
    /// (counted) or no chunk thread runs.
    pub(crate) fn v1_enqueue(
        &self,
        pending: Box<dyn PendingProfile>,
    ) -> Option<sentry_core::protocol::Envelope> {
        let Some(tx) = self.v1_queue.get() else {
            return Some(pending.without_profile());
        };
        match tx.try_send(pending) {
            Ok(()) => None,
            Err(e) => {
                self.counters.v1_dropped[4].fetch_add(1, Ordering::Relaxed);
                let pending = match e {
                    std::sync::mpsc::TrySendError::Full(p)
                    | std::sync::mpsc::TrySendError::Disconnected(p) => p,
                };
                Some(pending.without_profile())
            }
        }
    }

    /// The configured long-poll threshold, in nanoseconds.
    pub(crate) fn long_poll_ns(&self) -> u64 {
        self.config()
            .map_or(crate::options::DEFAULT_LONG_POLL_THRESHOLD, |c| c.long_poll)
            .as_nanos()
            .try_into()
            .unwrap_or(u64::MAX)
    }

    /// Counts a long poll of an instrumented request.
    pub(crate) fn long_poll_seen(&self) {
        self.counters.long_polls.fetch_add(1, Ordering::Relaxed);
    }

    /// The configured attribution.
    pub(crate) fn attribution(&self) -> ThreadAttribution {
        self.config()
            .map_or_else(ThreadAttribution::default, |c| c.attribution)
    }

    /// Registers a lane with the chunk thread; never blocks. Returns
    /// false (and counts it) when the lane cannot be tracked (see
    /// [`LaneRegistry::started`]).
    pub(crate) fn lane_started(&self, lane: u64, link: LaneLink, start_ns: u64) -> bool {
        self.lanes.started(lane, link, start_ns)
    }

    /// Hands the times of the request of lane `lane` (registered) to the
    /// sampler thread's intake, which adds the waits for a CPU it shows
    /// under that lane; never blocks. False (nothing will be added) when
    /// the intake is that far behind or gone.
    pub(crate) fn request_times(&self, lane: u64, times: &Arc<RequestTimes>) -> bool {
        self.times
            .get()
            .is_some_and(|tx| tx.try_send((lane, Arc::clone(times))).is_ok())
    }

    /// The intake's end of the queue [`Session::request_times`] fills
    /// (once).
    pub(super) fn take_request_times(&self) -> Option<Receiver<NewTimes>> {
        self.times_rx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Reports the end of a lane for which [`Session::lane_started`]
    /// returned true; never blocks.
    pub(crate) fn lane_finished(&self, lane: u64, end_ns: u64) {
        self.lanes.finished(lane, end_ns);
    }

    /// Reports the window of the transaction a lane stands for (see
    /// [`crate::lanes::LaneEvent::Transaction`]); never blocks.
    pub(crate) fn lane_transaction(&self, lane: u64, start_ns: u64, end_ns: u64) {
        self.lanes.transaction(lane, start_ns, end_ns);
    }

    /// Sends the chunk in progress now, waiting up to `timeout`.
    pub(crate) fn flush(&self, timeout: Duration) -> bool {
        if crate::sys::in_forked_child() {
            // The chunk thread stayed in the parent: nothing to wait for.
            return true;
        }
        self.command(Command::Flush, timeout)
    }

    /// Stops profiling for good, sending the last chunk; waits up to `timeout`.
    pub(crate) fn shutdown(&self, timeout: Duration) -> bool {
        if crate::sys::in_forked_child() {
            // The chunk thread, and the chunk it was building, belong to
            // the parent, which sends them at its own shutdown.
            return true;
        }
        if self.shut_down.swap(true, Ordering::AcqRel) {
            return true;
        }
        let done = self.command(Command::Shutdown, timeout);
        if done {
            if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
                let _ = t.join();
            }
        } else {
            // The chunk thread works on; a process that exits now loses the
            // chunk it is finishing.
            eprintln!(
                "sentry-profiling: the last profile chunk was not finished within the shutdown \
                 timeout ({timeout:?}); it is lost if the process exits now (a longer \
                 `ClientOptions::shutdown_timeout` gives it time)"
            );
        }
        let current = CURRENT.load();
        if current.as_ref().is_some_and(|c| std::ptr::eq(&**c, self)) {
            CURRENT.store(None);
        }
        done
    }

    /// Hands a command to the sampler thread's intake (which hands it on
    /// to the chunk thread with every sample it holds) and waits up to
    /// `timeout` for the chunk thread's answer. Shutting down stops the
    /// sampler thread: its last batch carries the command.
    fn command(&self, make: fn(Sender<()>) -> Command, timeout: Duration) -> bool {
        let (ack_tx, ack_rx) = std::sync::mpsc::channel();
        let command = make(ack_tx);
        let stop = matches!(command, Command::Shutdown(_));
        let sent = self
            .commands
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|tx| tx.send(command).is_ok());
        if !sent {
            return true;
        }
        if let Some(control) = self.control.get() {
            if stop {
                control.stop();
            } else {
                control.wake();
            }
        }
        ack_rx.recv_timeout(timeout).is_ok()
    }
}

#[cfg(test)]
mod import_graph;
