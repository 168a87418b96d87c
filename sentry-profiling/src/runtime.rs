//! The profiler session: lifecycle (manual or trace), the profiler thread
//! that turns samples into chunks and sends them, flush and shutdown.
//!
//! Everything an application thread calls here (root span started/finished,
//! start/stop) is a few atomic operations: the sampler is created paused on
//! the profiler thread at init (which waits for it, up to two seconds, so
//! that the first transactions are sampled) and only resumed or paused
//! afterwards.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use sentry_core::Transport;

use crate::attribution::{LaneEvent, LaneLink, Lanes, ThreadAttribution};
use crate::chunk::Chunk;
use crate::encode::sentry_chunk::{ChunkMeta, encode_chunk};
use crate::encode::view::ProfileView;
use crate::options::{ProfileLifecycle, SamplerConfig};
use crate::sampler::{Sampler, SamplerControl, SamplerStats, register_own_thread};
use crate::symbolize::Symbolizer;
use crate::transaction_profile::{Intercepted, V1Config, V1Context, V1Drop, V1Pending, intercept};
use crate::transport::exporters::{ExportCounts, ExportTarget, Exporter};
use crate::transport::{DeliveryCounters, chunk_envelope};

/// The session currently running in this process, for the tracing layer.
static CURRENT: ArcSwapOption<Runtime> = ArcSwapOption::const_empty();
/// The most recent session, kept after shutdown so its counters stay readable.
static LAST: ArcSwapOption<Runtime> = ArcSwapOption::const_empty();

/// The running session, if profiling is configured and this process's
/// session was sampled. Never in a forked child: the session's threads
/// stayed in the parent.
pub(crate) fn current() -> Option<Arc<Runtime>> {
    if crate::sys::in_forked_child() {
        return None;
    }
    CURRENT.load_full()
}

/// The current session, or the last one after it shut down (none in a
/// forked child, whose copy of the counters would only mislead).
pub(crate) fn last() -> Option<Arc<Runtime>> {
    if crate::sys::in_forked_child() {
        return None;
    }
    LAST.load_full()
}

/// Settled configuration of a session.
#[derive(Debug, Clone)]
pub(crate) struct RuntimeConfig {
    pub(crate) sampler: SamplerConfig,
    pub(crate) lifecycle: ProfileLifecycle,
    pub(crate) chunk_duration: Duration,
    pub(crate) symbolize: bool,
    pub(crate) release: String,
    pub(crate) environment: Option<String>,
    pub(crate) debug: bool,
    pub(crate) attribution: ThreadAttribution,
    pub(crate) exports: Vec<ExportTarget>,
    pub(crate) service_name: String,
    /// Transaction-based (V1) profiling instead of continuous chunks.
    pub(crate) v1: Option<V1Config>,
}

/// Transactions waiting for their V1 profile, at most.
const V1_QUEUE: usize = 256;
/// How much sample history V1 mode keeps (the longest profile, and slack).
const V1_HISTORY: Duration = Duration::from_secs(35);

/// How long `sentry::init` waits for the sampler to be ready, at most.
const SAMPLER_READY_WAIT: Duration = Duration::from_secs(2);

/// How far before a chunk's first sample lanes are filled in, at most.
const MAX_FILL_LEAD_NS: u64 = 2_000_000_000;

/// Lane events waiting for the profiler thread, at most.
const LANE_QUEUE: usize = 16_384;

/// Lanes registered whose end the profiler thread has not read yet, at
/// most. Each such lane holds two places in the lane queue (its start and
/// its end), so the queue never refuses an event: a lane's end, once its
/// start was taken, always arrives. A request past this bound (that many
/// requests in flight at once) is not given a lane: its samples stay on the
/// OS threads that ran it (counted in
/// [`ProfilerStats::lane_registrations_refused`]).
const MAX_LANES_IN_FLIGHT: usize = LANE_QUEUE / 2;

/// Lanes in flight from which the profiler thread is woken early to read
/// the lane queue (it otherwise reads it every [`PROFILER_TICK`]).
const LANES_HIGH_WATER: usize = MAX_LANES_IN_FLIGHT / 4;

/// Finished lanes one chunk holds, at most: the chunk in progress is written
/// out early when more requests than that have finished in it. This bounds
/// the profiler's memory (the lanes, and their samples in the chunk) and the
/// chunk's size at any request rate; at low rates chunks last their full
/// duration.
const MAX_FINISHED_LANES_PER_CHUNK: usize = 4_096;

/// How often the profiler thread takes the sampler's samples and reads the
/// lane queue.
const PROFILER_TICK: Duration = Duration::from_millis(100);

enum Request {
    Flush(Sender<()>),
    Shutdown(Sender<()>),
}

/// Counters of a session.
#[derive(Debug, Default)]
struct Counters {
    chunks_sent: AtomicU64,
    samples_sent: AtomicU64,
    samples_single_thread: AtomicU64,
    chunks_without_transport: AtomicU64,
    lane_events_dropped: AtomicU64,
    lanes_registered: AtomicU64,
    lane_registrations_refused: AtomicU64,
    lanes_tracked: AtomicU64,
    lanes_tracked_max: AtomicU64,
    lanes_expired: AtomicU64,
    lane_fill_ins: AtomicU64,
    lane_fill_ins_capped: AtomicU64,
    chunks_cut_early: AtomicU64,
    export_sent: AtomicU64,
    export_failed: AtomicU64,
    export_dropped: AtomicU64,
    v1_sent: AtomicU64,
    v1_dropped: [AtomicU64; 5],
}

/// What a profiling session has done so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProfilerStats {
    /// Whether this process's profiling session was sampled.
    pub session_sampled: bool,
    /// `profile_chunk` envelopes handed to the transport (with the crate's
    /// own delivery: taken into its send queue).
    pub chunks_sent: u64,
    /// Samples in those chunks.
    pub samples_sent: u64,
    /// Samples left out because their thread had only one sample in its
    /// chunk (Sentry's ingestion drops those).
    pub samples_single_thread: u64,
    /// Chunks that could not be sent because no client transport existed.
    pub chunks_without_transport: u64,
    /// Chunks the Sentry endpoint accepted (answered 2xx). Known only when
    /// the crate delivers chunks itself (the `http` feature, and no
    /// transport of the application's own); 0 otherwise.
    pub chunks_delivered: u64,
    /// Chunks the crate's own delivery dropped, by reason (all 0 when the
    /// application's transport carries chunks: it then counts its own).
    pub chunks_dropped: ChunkDrops,
    /// Lane start/finish events the lane queue refused. Lanes reserve their
    /// places, so this stays 0; it counts a broken invariant.
    pub lane_events_dropped: u64,
    /// Requests (sampled root spans) given a lane.
    pub lanes_registered: u64,
    /// Requests not given a lane because too many were in flight at once
    /// (their samples stay on their OS threads, and their transactions are
    /// tagged with the OS thread).
    pub lane_registrations_refused: u64,
    /// Lanes registered whose end the profiler thread has not read yet
    /// (requests in flight, plus those finished since its last read).
    pub lanes_in_flight: u64,
    /// Lanes the profiler thread holds now: open ones, and finished ones
    /// whose chunk is not written yet.
    pub lanes_tracked: u64,
    /// The most lanes the profiler thread held at once.
    pub lanes_tracked_max: u64,
    /// Lanes forgotten because they stayed open too long (10 minutes: a
    /// leaked root span, or a lost end).
    pub lanes_expired: u64,
    /// `(suspended)` fill-in and end samples added to lanes.
    pub lane_fill_ins: u64,
    /// Suspended ticks left without a fill-in because their chunk reached
    /// its bound of fill-ins.
    pub lane_fill_ins_capped: u64,
    /// Chunks written before their full duration because as many requests
    /// as one chunk holds had finished in them.
    pub chunks_cut_early: u64,
    /// Exports (OTLP requests, files) that succeeded.
    pub exports_sent: u64,
    /// Exports that failed (endpoint down, file not writable).
    pub exports_failed: u64,
    /// Samples left out of exports that reached their size bound.
    pub export_samples_dropped: u64,
    /// Transaction-based (V1) profiles sent with their transaction.
    pub transaction_profiles_sent: u64,
    /// V1 profiles not sent, by reason.
    pub transaction_profiles_dropped: crate::TransactionProfileDrops,
    /// The sampler's counters.
    pub sampler: SamplerStats,
}

/// Why chunks were not delivered (see [`ProfilerStats::chunks_dropped`]).
/// The first drop of each kind, and every hundredth, is also logged to
/// stderr, and the drops are reported to Sentry as `profile_chunk` client
/// reports once the endpoint accepts a chunk again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChunkDrops {
    /// The send queue was full (the endpoint is slower than the profiler,
    /// or unreachable): the chunk was dropped without waiting.
    pub queue_full: u64,
    /// The request failed: connection refused or reset, timed out (an
    /// endpoint that accepts and never answers), or still queued when the
    /// shutdown timeout ran out.
    pub send_failed: u64,
    /// The endpoint answered with an error status other than `429`.
    pub http_error: u64,
    /// Sentry rate-limited profile chunks: answered `429`, or the chunk
    /// was dropped unsent while an earlier answer's `X-Sentry-Rate-Limits`
    /// (category `profile_chunk`, or all) or `Retry-After` was in force.
    pub rate_limited: u64,
}

/// One profiling session (one `sentry::init`).
pub(crate) struct Runtime {
    profiler_id: String,
    config: OnceLock<RuntimeConfig>,
    session_sampled: AtomicBool,
    transport: Mutex<Option<Arc<dyn Transport>>>,
    #[cfg(feature = "http")]
    chunk_sender: Mutex<Option<Arc<crate::transport::http::ChunkSender>>>,
    delivery: Arc<DeliveryCounters>,
    control: OnceLock<SamplerControl>,
    requests: Mutex<Option<Sender<Request>>>,
    lane_events: OnceLock<std::sync::mpsc::SyncSender<LaneEvent>>,
    /// Lanes holding places in the lane queue (see [`MAX_LANES_IN_FLIGHT`]).
    lanes_in_flight: AtomicUsize,
    /// The profiler thread, to wake it when lanes pile up.
    profiler_thread: OnceLock<std::thread::Thread>,
    v1_queue: OnceLock<std::sync::mpsc::SyncSender<V1Pending>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    active_roots: AtomicUsize,
    manual_running: AtomicBool,
    shut_down: AtomicBool,
    counters: Counters,
    last_sampler_stats: Mutex<SamplerStats>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("profiler_id", &self.profiler_id)
            .field("session_sampled", &self.session_sampled)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            profiler_id: crate::encode::sentry_chunk::new_id(),
            config: OnceLock::new(),
            session_sampled: AtomicBool::new(false),
            transport: Mutex::new(None),
            #[cfg(feature = "http")]
            chunk_sender: Mutex::new(None),
            delivery: Arc::default(),
            control: OnceLock::new(),
            requests: Mutex::new(None),
            lane_events: OnceLock::new(),
            lanes_in_flight: AtomicUsize::new(0),
            profiler_thread: OnceLock::new(),
            v1_queue: OnceLock::new(),
            thread: Mutex::new(None),
            active_roots: AtomicUsize::new(0),
            manual_running: AtomicBool::new(false),
            shut_down: AtomicBool::new(false),
            counters: Counters::default(),
            last_sampler_stats: Mutex::new(SamplerStats::default()),
        })
    }

    /// Records the client's transport (called by the transport factory).
    pub(crate) fn set_transport(&self, transport: Arc<dyn Transport>) {
        *self.transport.lock().unwrap_or_else(|e| e.into_inner()) = Some(transport);
    }

    /// The counters the crate's chunk sender keeps.
    #[cfg(feature = "http")]
    pub(crate) fn delivery_counters(&self) -> Arc<DeliveryCounters> {
        Arc::clone(&self.delivery)
    }

    /// Records the crate's own chunk sender (called by the transport
    /// factory; `None` when the application's transport carries chunks).
    #[cfg(feature = "http")]
    pub(crate) fn set_chunk_sender(
        &self,
        sender: Option<Arc<crate::transport::http::ChunkSender>>,
    ) {
        *self.chunk_sender.lock().unwrap_or_else(|e| e.into_inner()) = sender;
    }

    /// Starts the session: publishes it and starts the profiler thread with a
    /// paused sampler. Called once, from the integration's `setup`.
    pub(crate) fn activate(self: &Arc<Self>, config: RuntimeConfig, sampled: bool) {
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
        *self.requests.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        let (lane_tx, lane_rx) = std::sync::mpsc::sync_channel(LANE_QUEUE);
        let _ = self.lane_events.set(lane_tx);
        let (v1_tx, v1_rx) = std::sync::mpsc::sync_channel(V1_QUEUE);
        let _ = self.v1_queue.set(v1_tx);
        let this = Arc::clone(self);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("sentry-profiler-chunks".into())
            .spawn(move || this.run(rx, lane_rx, v1_rx, ready_tx));
        match spawned {
            Ok(handle) => {
                let _ = self.profiler_thread.set(handle.thread().clone());
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
                    "sentry-profiling: profiling disabled: cannot start the profiler thread: {e}"
                );
                self.session_sampled.store(false, Ordering::Release);
            }
        }
    }

    fn config(&self) -> Option<&RuntimeConfig> {
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
            .then_some(self.profiler_id.as_str())
    }

    /// The lifecycle mode.
    pub(crate) fn lifecycle(&self) -> ProfileLifecycle {
        self.config()
            .map_or(ProfileLifecycle::Manual, |c| c.lifecycle)
    }

    /// Whether samples are being taken right now, or will be as soon as the
    /// sampler (created at init on the profiler thread) is ready.
    pub(crate) fn is_running(&self) -> bool {
        if self.shut_down.load(Ordering::Acquire) || self.profiler_id().is_none() {
            return false;
        }
        self.active_roots.load(Ordering::Acquire) > 0
            || self.manual_running.load(Ordering::Acquire)
            || self.control.get().is_some_and(SamplerControl::is_active)
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
        if self.active_roots.fetch_add(1, Ordering::AcqRel) == 0 {
            self.set_sampling(true);
        }
        true
    }

    /// Trace lifecycle: a root span for which [`Runtime::root_started`]
    /// returned true has finished.
    pub(crate) fn root_finished(&self) {
        let prev = self
            .active_roots
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        if prev == Ok(1) {
            self.set_sampling(false);
            // A root that started between the decrement and the pause must
            // not be left unprofiled.
            if self.active_roots.load(Ordering::Acquire) > 0 {
                self.set_sampling(true);
            }
        }
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

    /// V1 mode: hands a transaction envelope to be profiled to the profiler
    /// thread, or gives it back (not one to profile, or queue full).
    pub(crate) fn v1_submit(
        &self,
        envelope: sentry_core::protocol::Envelope,
    ) -> Option<sentry_core::protocol::Envelope> {
        let pending = match intercept(envelope) {
            Intercepted::Profile(p) => p,
            Intercepted::Pass(envelope) => return Some(envelope),
        };
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

    /// The configured attribution.
    pub(crate) fn attribution(&self) -> ThreadAttribution {
        self.config()
            .map_or_else(ThreadAttribution::default, |c| c.attribution)
    }

    /// Registers a lane with the profiler thread; never blocks. Returns
    /// false (and counts it) when the lane cannot be tracked: too many
    /// lanes in flight, or no profiler thread. The caller then leaves the
    /// request on its OS threads and must not report its end.
    pub(crate) fn lane_started(&self, lane: u64, link: Arc<LaneLink>, start_ns: u64) -> bool {
        let Some(tx) = self.lane_events.get() else {
            return false;
        };
        let c = &self.counters;
        let reserved =
            self.lanes_in_flight
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < MAX_LANES_IN_FLIGHT).then_some(n + 1)
                });
        let Ok(before) = reserved else {
            c.lane_registrations_refused.fetch_add(1, Ordering::Relaxed);
            self.wake_profiler();
            return false;
        };
        if before + 1 == LANES_HIGH_WATER {
            self.wake_profiler();
        }
        let event = LaneEvent::Started {
            lane,
            link,
            start_ns,
        };
        if tx.try_send(event).is_err() {
            // Only when the profiler thread is gone (or the reservation
            // invariant broke): give the place back.
            self.lanes_in_flight.fetch_sub(1, Ordering::AcqRel);
            c.lane_events_dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        c.lanes_registered.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Reports the end of a lane for which [`Runtime::lane_started`]
    /// returned true; never blocks (its place in the queue is reserved).
    pub(crate) fn lane_finished(&self, lane: u64, end_ns: u64) {
        if let Some(tx) = self.lane_events.get() {
            if tx.try_send(LaneEvent::Finished { lane, end_ns }).is_err() {
                self.counters
                    .lane_events_dropped
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The profiler thread read a lane's end: its places in the queue are
    /// free again.
    fn lane_released(&self) {
        let _ = self
            .lanes_in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    fn wake_profiler(&self) {
        if let Some(t) = self.profiler_thread.get() {
            t.unpark();
        }
    }

    /// Sends the chunk in progress now, waiting up to `timeout`.
    pub(crate) fn flush(&self, timeout: Duration) -> bool {
        if crate::sys::in_forked_child() {
            // The profiler thread stayed in the parent: nothing to wait for.
            return true;
        }
        self.request(Request::Flush, timeout)
    }

    /// Stops profiling for good, sending the last chunk; waits up to `timeout`.
    pub(crate) fn shutdown(&self, timeout: Duration) -> bool {
        if crate::sys::in_forked_child() {
            // The profiler thread, and the chunk it was building, belong to
            // the parent, which sends them at its own shutdown.
            return true;
        }
        if self.shut_down.swap(true, Ordering::AcqRel) {
            return true;
        }
        let done = self.request(Request::Shutdown, timeout);
        if done {
            if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
                let _ = t.join();
            }
        }
        let current = CURRENT.load();
        if current.as_ref().is_some_and(|c| std::ptr::eq(&**c, self)) {
            CURRENT.store(None);
        }
        done
    }

    fn request(&self, make: fn(Sender<()>) -> Request, timeout: Duration) -> bool {
        let (ack_tx, ack_rx) = std::sync::mpsc::channel();
        let sent = self
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|tx| tx.send(make(ack_tx)).is_ok());
        if !sent {
            return true;
        }
        if let Some(t) = self
            .thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            t.thread().unpark();
        }
        ack_rx.recv_timeout(timeout).is_ok()
    }

    /// Counters so far.
    pub(crate) fn stats(&self) -> ProfilerStats {
        let c = &self.counters;
        ProfilerStats {
            session_sampled: self.session_sampled.load(Ordering::Acquire),
            chunks_sent: c.chunks_sent.load(Ordering::Relaxed),
            samples_sent: c.samples_sent.load(Ordering::Relaxed),
            samples_single_thread: c.samples_single_thread.load(Ordering::Relaxed),
            chunks_without_transport: c.chunks_without_transport.load(Ordering::Relaxed),
            chunks_delivered: self.delivery.delivered.load(Ordering::Relaxed),
            chunks_dropped: ChunkDrops {
                queue_full: self.delivery.queue_full.load(Ordering::Relaxed),
                send_failed: self.delivery.send_failed.load(Ordering::Relaxed),
                http_error: self.delivery.http_error.load(Ordering::Relaxed),
                rate_limited: self.delivery.rate_limited.load(Ordering::Relaxed),
            },
            lane_events_dropped: c.lane_events_dropped.load(Ordering::Relaxed),
            lanes_registered: c.lanes_registered.load(Ordering::Relaxed),
            lane_registrations_refused: c.lane_registrations_refused.load(Ordering::Relaxed),
            lanes_in_flight: self.lanes_in_flight.load(Ordering::Relaxed) as u64,
            lanes_tracked: c.lanes_tracked.load(Ordering::Relaxed),
            lanes_tracked_max: c.lanes_tracked_max.load(Ordering::Relaxed),
            lanes_expired: c.lanes_expired.load(Ordering::Relaxed),
            lane_fill_ins: c.lane_fill_ins.load(Ordering::Relaxed),
            lane_fill_ins_capped: c.lane_fill_ins_capped.load(Ordering::Relaxed),
            chunks_cut_early: c.chunks_cut_early.load(Ordering::Relaxed),
            exports_sent: c.export_sent.load(Ordering::Relaxed),
            exports_failed: c.export_failed.load(Ordering::Relaxed),
            export_samples_dropped: c.export_dropped.load(Ordering::Relaxed),
            transaction_profiles_sent: c.v1_sent.load(Ordering::Relaxed),
            transaction_profiles_dropped: crate::TransactionProfileDrops::from_counts(
                std::array::from_fn(|i| c.v1_dropped[i].load(Ordering::Relaxed)),
            ),
            sampler: self
                .control
                .get()
                .map(SamplerControl::stats)
                .unwrap_or_else(|| {
                    self.last_sampler_stats
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .clone()
                }),
        }
    }

    /// The profiler thread.
    fn run(
        self: Arc<Self>,
        requests: Receiver<Request>,
        lane_events: Receiver<LaneEvent>,
        v1_requests: Receiver<V1Pending>,
        ready: Sender<()>,
    ) {
        let _own = register_own_thread();
        let Some(config) = self.config().cloned() else {
            return;
        };
        let sampler = match Sampler::start_paused(config.sampler.clone()) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("{e}; profiling disabled");
                self.session_sampled.store(false, Ordering::Release);
                return;
            }
        };
        let _ = self.control.set(sampler.control());
        // Roots may have started while the sampler was being created.
        if self.active_roots.load(Ordering::Acquire) > 0
            || self.manual_running.load(Ordering::Acquire)
        {
            sampler.resume();
        }
        let _ = ready.send(());
        let meta = ChunkMeta {
            profiler_id: self.profiler_id.clone(),
            release: config.release.clone(),
            environment: config.environment.clone(),
        };
        let mut builder = ChunkWriter {
            runtime: &self,
            meta,
            chunk: Chunk::new(),
            symbolizer: config.symbolize.then(Symbolizer::new),
            chunk_duration: config.chunk_duration,
            lanes: Lanes::default(),
            lane_events,
            attribution: config.attribution,
            period_ns: 1_000_000_000 / u64::from(config.sampler.frequency_hz.max(1)),
            filled_until_ns: 0,
            meter: Default::default(),
            exporters: config
                .exports
                .iter()
                .filter_map(|t| {
                    Exporter::new(t)
                        .map_err(|e| eprintln!("sentry-profiling: {e}"))
                        .ok()
                })
                .collect(),
            service_name: config.service_name.clone(),
            v1: config.v1.is_some().then(|| V1State {
                requests: v1_requests,
                pending: Vec::new(),
                os_version: crate::kernel_release(),
            }),
        };
        loop {
            match requests.try_recv() {
                Ok(Request::Flush(ack)) => {
                    builder.drain(&sampler);
                    builder.finish(&sampler);
                    let _ = ack.send(());
                }
                Ok(Request::Shutdown(ack)) => {
                    let modules = sampler.modules();
                    let (stats, rest) = sampler.stop_and_drain();
                    for s in &rest {
                        builder.push(s, &modules);
                    }
                    builder.finish_with(&modules);
                    builder.finish_exports();
                    *self
                        .last_sampler_stats
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()) = stats;
                    let _ = ack.send(());
                    return;
                }
                Err(_) => {}
            }
            // Take samples in batches: sleeping instead of blocking on the
            // queue spares the sampler a wake-up per sample. Flush and
            // shutdown requests unpark the thread.
            std::thread::park_timeout(PROFILER_TICK);
            builder.drain(&sampler);
            builder.read_lane_events();
            builder.rotate_if_due(&sampler);
        }
    }

    /// Hands one profile chunk on: to the crate's chunk sender when there is
    /// one (it never waits for the network; a full queue drops the chunk and
    /// counts it in [`ChunkDrops`]), else to the client's transport.
    fn send_profile_chunk(&self, chunk: crate::EncodedChunk) -> Handed {
        #[cfg(feature = "http")]
        {
            let sender = self
                .chunk_sender
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if let Some(sender) = sender {
                return if sender.submit(crate::transport::chunk_envelope_bytes(chunk)) {
                    Handed::Taken
                } else {
                    Handed::Dropped
                };
            }
        }
        if self.send_chunk_envelope(chunk_envelope(chunk)) {
            Handed::Taken
        } else {
            Handed::NoTransport
        }
    }

    /// Hands an envelope to the client's transport.
    fn send_chunk_envelope(&self, envelope: sentry_core::protocol::Envelope) -> bool {
        let transport = self
            .transport
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        match transport {
            Some(t) => {
                t.send_envelope(envelope);
                true
            }
            None => match sentry_core::Hub::main().client() {
                Some(client) => {
                    client.send_envelope(envelope);
                    true
                }
                None => false,
            },
        }
    }
}

/// What became of a chunk handed on.
enum Handed {
    Taken,
    /// The crate's sender dropped it (and counted why).
    #[cfg(feature = "http")]
    Dropped,
    NoTransport,
}

/// The profiler thread's chunk in progress.
struct ChunkWriter<'a> {
    runtime: &'a Runtime,
    meta: ChunkMeta,
    chunk: Chunk,
    symbolizer: Option<Symbolizer>,
    chunk_duration: Duration,
    lanes: Lanes,
    lane_events: Receiver<LaneEvent>,
    attribution: ThreadAttribution,
    period_ns: u64,
    /// Where the last chunk's lane fill-ins ended.
    filled_until_ns: u64,
    meter: crate::chunk::ProcessMeter,
    exporters: Vec<Exporter>,
    service_name: String,
    v1: Option<V1State>,
}

/// The profiler thread's transaction-based (V1) work.
struct V1State {
    requests: Receiver<V1Pending>,
    pending: Vec<V1Pending>,
    os_version: String,
}

impl ChunkWriter<'_> {
    fn push(&mut self, sample: &crate::Sample, modules: &crate::ModuleSet) {
        // A recycled thread id starts a new chunk, so each thread keeps its
        // own name. (Transaction profiles keep history instead of chunks;
        // their samples are filed by lane.)
        if !self
            .chunk
            .accepts(sample.timestamp_ns(), self.chunk_duration)
            || (self.v1.is_none() && self.chunk.holds_other_thread(sample))
        {
            self.finish_with(modules);
        }
        self.chunk.push(sample);
    }

    fn drain(&mut self, sampler: &Sampler) {
        self.meter.measure_into(&mut self.chunk);
        let modules = sampler.modules();
        for s in sampler.try_iter() {
            self.push(&s, &modules);
        }
    }

    /// V1 mode: builds and sends the profiles of transactions whose samples
    /// have arrived (all of them with `force`).
    fn process_v1(&mut self, modules: &crate::ModuleSet, force: bool) {
        self.read_lane_events();
        let Some(v1) = self.v1.as_mut() else { return };
        v1.pending.extend(v1.requests.try_iter());
        if v1.pending.is_empty() {
            return;
        }
        let newest = self.chunk.last_timestamp_ns().unwrap_or(0);
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut v1.pending)
            .into_iter()
            .partition(|p| force || p.ready(newest));
        v1.pending = waiting;
        let release = self.meta.release.clone();
        let environment = self.meta.environment.clone();
        let ctx = V1Context {
            lanes: &self.lanes,
            attribution: self.attribution,
            modules,
            period_ns: self.period_ns,
            release: &release,
            environment: environment.as_deref(),
            os_version: &v1.os_version,
        };
        let c = &self.runtime.counters;
        let mut symbolizer = self.symbolizer.as_mut();
        for p in ready {
            let (envelope, dropped) = p.finish(&self.chunk, &ctx, &mut symbolizer);
            match dropped {
                None => c.v1_sent.fetch_add(1, Ordering::Relaxed),
                Some(reason) => {
                    let i = match reason {
                        V1Drop::TooFewSamples => 0,
                        V1Drop::TooLong => 1,
                        V1Drop::TooLarge => 2,
                        V1Drop::MissingMetadata => 3,
                    };
                    c.v1_dropped[i].fetch_add(1, Ordering::Relaxed)
                }
            };
            self.runtime.send_chunk_envelope(envelope);
        }
    }

    /// Takes the lane queue's events into the lane table (every profiler
    /// tick, and before a chunk or profile is written).
    fn read_lane_events(&mut self) {
        let rt = self.runtime;
        for event in self.lane_events.try_iter() {
            if matches!(event, LaneEvent::Finished { .. }) {
                rt.lane_released();
            }
            self.lanes.apply(event);
        }
        self.note_lanes_tracked();
    }

    fn note_lanes_tracked(&self) {
        let c = &self.runtime.counters;
        let n = self.lanes.len() as u64;
        c.lanes_tracked.store(n, Ordering::Relaxed);
        c.lanes_tracked_max.fetch_max(n, Ordering::Relaxed);
    }

    fn rotate_if_due(&mut self, sampler: &Sampler) {
        if let Some(v1) = &self.v1 {
            // V1 mode sends no chunks: keep enough history for the longest
            // transaction still waiting, and the longest profile.
            let keep_from = now_ns().saturating_sub(V1_HISTORY.as_nanos() as u64);
            let oldest = v1
                .pending
                .iter()
                .map(V1Pending::start_ns)
                .min()
                .unwrap_or(u64::MAX);
            self.chunk.retain_since(keep_from.min(oldest));
            // Lanes that ended before the history kept are no longer needed.
            let expired = self.lanes.prune(keep_from.min(oldest));
            self.runtime
                .counters
                .lanes_expired
                .fetch_add(expired as u64, Ordering::Relaxed);
            self.note_lanes_tracked();
            let modules = sampler.modules();
            self.process_v1(&modules, false);
            return;
        }
        let Some(first) = self.chunk.first_timestamp_ns() else {
            return;
        };
        let now = now_ns();
        let full = self.lanes.finished() >= MAX_FINISHED_LANES_PER_CHUNK;
        if full || now.saturating_sub(first) >= self.chunk_duration.as_nanos() as u64 {
            if full {
                self.runtime
                    .counters
                    .chunks_cut_early
                    .fetch_add(1, Ordering::Relaxed);
            }
            self.drain(sampler);
            self.finish(sampler);
        }
    }

    fn finish(&mut self, sampler: &Sampler) {
        let modules = sampler.modules();
        self.finish_with(&modules);
    }

    fn record_exports(&self, counts: ExportCounts) {
        let c = &self.runtime.counters;
        c.export_sent.fetch_add(counts.sent, Ordering::Relaxed);
        c.export_failed.fetch_add(counts.failed, Ordering::Relaxed);
        c.export_dropped
            .fetch_add(counts.dropped, Ordering::Relaxed);
    }

    /// Writes the file exporters' accumulated profiles (at shutdown).
    fn finish_exports(&mut self) {
        let mut counts = ExportCounts::default();
        for e in &mut self.exporters {
            e.finish(&self.service_name, &mut counts);
        }
        self.record_exports(counts);
    }

    fn finish_with(&mut self, modules: &crate::ModuleSet) {
        if self.v1.is_some() {
            self.process_v1(modules, true);
            return;
        }
        self.read_lane_events();
        if self.chunk.is_empty() {
            return;
        }
        let mut chunk = self.chunk.take();
        let now = now_ns();
        if self.attribution == ThreadAttribution::Lanes {
            // Fill lanes from where the previous chunk's fill-ins ended (not
            // from this chunk's first sample, which can come well after the
            // root span that resumed the sampler), at most `MAX_FILL_LEAD`
            // before the first sample so the chunk stays within Relay's span.
            let from = chunk
                .first_timestamp_ns()
                .map_or(now, |first| first.saturating_sub(MAX_FILL_LEAD_NS))
                .max(self.filled_until_ns);
            let filled = self
                .lanes
                .fill_suspended_from(&mut chunk, self.period_ns, from, now);
            self.filled_until_ns = now;
            let c = &self.runtime.counters;
            c.lane_fill_ins
                .fetch_add(filled.added as u64, Ordering::Relaxed);
            c.lane_fill_ins_capped
                .fetch_add(filled.capped as u64, Ordering::Relaxed);
        }
        if !self.exporters.is_empty() {
            let view = ProfileView::build(
                &chunk,
                &self.lanes,
                modules,
                self.symbolizer.as_mut(),
                self.period_ns,
            );
            let mut counts = ExportCounts::default();
            for e in &mut self.exporters {
                e.export(&view, &self.service_name, &mut counts);
            }
            self.record_exports(counts);
        }
        let keys = self.lanes.thread_keys(&chunk, self.attribution);
        let keys = crate::encode::synthetic::mark_running_requests(&mut chunk, keys);
        let pieces = encode_chunk(
            &self.meta,
            &chunk,
            modules,
            self.symbolizer.as_mut(),
            &|i, _| keys[i].clone(),
        );
        let expired = self.lanes.prune(now);
        self.note_lanes_tracked();
        let c = &self.runtime.counters;
        c.lanes_expired.fetch_add(expired as u64, Ordering::Relaxed);
        c.samples_single_thread.fetch_add(
            pieces.iter().map(|p| p.dropped_single).sum::<usize>() as u64,
            Ordering::Relaxed,
        );
        for piece in pieces {
            let samples = piece.samples as u64;
            match self.runtime.send_profile_chunk(piece) {
                Handed::Taken => {
                    c.chunks_sent.fetch_add(1, Ordering::Relaxed);
                    c.samples_sent.fetch_add(samples, Ordering::Relaxed);
                }
                // Counted by the sender, by reason.
                #[cfg(feature = "http")]
                Handed::Dropped => {}
                Handed::NoTransport => {
                    c.chunks_without_transport.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// Wall-clock time in nanoseconds since the Unix epoch (the samples' clock).
fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
