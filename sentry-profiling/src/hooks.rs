//! **Not public API.** The seam between this crate and
//! `sentry-profiling-tracing` (its `tracing` layer and `http_layer`): the
//! trace lifecycle, lane registration, and the linking data of the current
//! session. Exported (hidden) only because the two crates are separate; it
//! may change in any release without notice. Applications use
//! `sentry_profiling_tracing::layer()` and never call these.
//!
//! It sits above the session and the lanes: both are reached through it,
//! neither calls back into it.

pub use crate::attribution::is_lane;
use crate::lanes::now_ns;
pub use crate::lanes::{LaneLink, new_lane};

// What the workspace's other crates need that is not a hook: the tracing
// layer's thread word and OS-thread keys; the benches' chunk encoder; the
// tests' pprof decoding and slow envelope directory.
pub use crate::chunk::{Chunk, ChunkSample};
pub use crate::encode::sentry_chunk::{ChunkMeta, EncodedChunk, encode_chunk};
pub use crate::thread_word::{current_thread_id, set_thread_context, thread_context};
pub use crate::transaction_tags::{
    AWAITING, CPU_WAIT, HandedLane, Handover, LONG_POLLS, LONGEST_POLL, LONGEST_POLL_START, POLLED,
    POLLS, PollTotals, QUEUED, TOKIO_MEASUREMENTS, finish_handed,
};
pub use crate::transport::{OS_THREAD_ID, OS_THREAD_NAME};

/// pprof's `profile.proto` message types (as the `pprof_file` export
/// writes them).
pub mod pprof_proto {
    pub use crate::encode::pprof::{
        Function, Label, Line, Location, Mapping, Profile, Sample, ValueType,
    };
}

/// Makes `transport`'s writer thread pause `per_write` before each write,
/// from its next one on: a slow disk, for the workspace's tests
/// (`Duration::ZERO` ends it).
pub fn set_envelope_dir_write_delay(
    transport: &crate::EnvelopeDirTransport,
    per_write: std::time::Duration,
) {
    transport.set_write_delay(per_write);
}

/// The running session, looked up once for the calls a span or a request
/// makes in a row (see [`SessionRef`]); `None` without one (profiling not
/// configured, this process's session not sampled, or a forked child).
#[inline]
pub fn session() -> Option<SessionRef> {
    crate::session::current().map(SessionRef)
}

/// The running session, borrowed for the few calls made in a row where it
/// was looked up: reading it touches no reference count. Not to be kept:
/// a new session (the SDK initialised again) is only seen by a new
/// [`session`].
pub struct SessionRef(crate::session::Current);

impl std::fmt::Debug for SessionRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionRef").finish_non_exhaustive()
    }
}

impl SessionRef {
    /// A sampled root span (transaction) became active. Returns whether the
    /// profiler runs for it (trace lifecycle, session sampled); the caller
    /// must then call [`SessionRef::root_finished`] once. The `profiler_id`
    /// is not handed out here: each copy of it touches a reference count
    /// every thread shares, so [`SessionRef::running_profiler_id`] is asked
    /// only where it is written.
    ///
    /// `lane` and `name` identify the root span; with transaction-based
    /// profiling they decide (deterministically) whether it is profiled.
    pub fn root_started(&self, lane: u64, name: &str) -> bool {
        // The lane begins now, before the profiler resumes: resuming wakes
        // the sampler thread, which on a busy machine can take this
        // thread's core for a while, and the lane must cover that time. A
        // root span created on this thread already has an earlier start
        // (its creation, which `lane_started` prefers), so the clock is not
        // read.
        if crate::lanes::LANE_CREATED.with(std::cell::Cell::get).0 != lane {
            ROOT_STARTED.with(|c| c.set((lane, now_ns())));
        }
        // `root_started` counts the root only when it returns true (it asks
        // for the profiler id itself), so true here always pairs with one
        // `root_finished`.
        self.0.root_started(lane, name)
    }

    /// A root span for which [`SessionRef::root_started`] returned true
    /// finished.
    pub fn root_finished(&self) {
        self.0.root_finished();
    }

    /// Whether samples are being taken right now (either lifecycle): what
    /// [`SessionRef::running_profiler_id`] answers, without copying the id.
    pub fn is_running(&self) -> bool {
        self.0.is_running()
    }

    /// The session's `profiler_id` if samples are being taken right now
    /// (either lifecycle), for tagging transactions and spans.
    pub fn running_profiler_id(&self) -> Option<std::sync::Arc<str>> {
        if self.0.is_running() {
            self.0.profiler_id().map(|_| self.0.profiler_id_shared())
        } else {
            None
        }
    }

    /// The long-poll threshold in nanoseconds (see
    /// `ProfilingIntegration::long_poll_threshold`).
    pub fn long_poll_ns(&self) -> u64 {
        self.0.long_poll_ns()
    }

    /// An instrumented request's poll ran past the long-poll threshold.
    pub fn long_poll_seen(&self) {
        self.0.long_poll_seen();
    }

    /// The configured lifecycle.
    pub fn lifecycle(&self) -> crate::ProfileLifecycle {
        self.0.lifecycle()
    }

    /// The configured thread attribution.
    pub fn attribution(&self) -> crate::attribution::ThreadAttribution {
        self.0.attribution()
    }

    /// Whether the session makes transaction-based (V1) profiles, whose
    /// too-short transactions are pointed back at their OS thread (so
    /// transactions and spans carry the OS-thread keys until they are
    /// sent).
    pub fn transaction_profiling(&self) -> bool {
        self.0.v1().is_some()
    }

    /// With transaction-based (V1) profiling: whether the transaction of
    /// root span `lane` named `name` gets a profile (the same decision
    /// [`SessionRef::root_started`] made). Always false in continuous mode.
    pub fn transaction_profiled(&self, lane: u64, name: &str) -> bool {
        self.0.v1().is_some_and(|v1| v1.sampled(lane, name))
    }

    /// A sampled root span holding `lane` (from [`new_lane`]) was entered
    /// for the first time; its samples are filed under the lane, named and
    /// linked as `link` says. Never blocks.
    ///
    /// Returns false when the lane could not be registered (too many
    /// requests in flight, counted in
    /// [`ProfilerStats::lane_registrations_refused`](crate::ProfilerStats)):
    /// the caller must then leave the request on its OS threads (context
    /// word 0, `thread.id` of the OS thread) and not call
    /// [`SessionRef::lane_finished`].
    #[must_use]
    pub fn lane_started(&self, lane: u64, link: LaneLink) -> bool {
        // The lane began when its root span was created or, created on
        // another thread, when it was first entered here (before the
        // profiler resumed); whatever came first on this thread. Both were
        // read from the clock earlier, so it is read again only when
        // neither is this lane's.
        let start_ns = [
            crate::lanes::LANE_CREATED.with(std::cell::Cell::get),
            ROOT_STARTED.with(std::cell::Cell::get),
        ]
        .into_iter()
        .filter_map(|(l, t)| (l == lane).then_some(t))
        .min()
        .unwrap_or_else(now_ns);
        self.0.lane_started(lane, link, start_ns)
    }

    /// The root span holding `lane`, for which
    /// [`SessionRef::lane_started`] returned true, closed. Never blocks.
    pub fn lane_finished(&self, lane: u64) {
        let end_ns = now_ns();
        self.0.lane_finished(lane, end_ns);
        let _ = LANE_FINISHED.try_with(|c| c.set(end_ns));
    }
}

/// `CLOCK_REALTIME` in nanoseconds: the clock of samples, context-word
/// changes and wake times.
#[inline]
pub fn wall_ns() -> u64 {
    now_ns()
}

/// The poll this thread is about to begin (by entering its request's span)
/// is of an instrumented future woken at `woken_ns` ([`NOT_WOKEN`]: not
/// woken, its first poll): the context word the span publishes carries it,
/// and the profiler thread shows the time from the wake to the poll as
/// queued. Call it right before entering the span, and with 0 right after
/// (an entry that published nothing leaves it set).
#[inline]
pub fn set_poll_woken(woken_ns: u64) {
    set_poll_started(woken_ns, 0);
}

/// As [`set_poll_woken`], for a poll that began at `start_ns` (read from
/// [`wall_ns`] by the caller): the span's publication is stamped with it,
/// without reading the clock again.
#[inline]
pub fn set_poll_started(woken_ns: u64, start_ns: u64) {
    #[cfg(profiling_supported)]
    crate::context::set_poll_woken(woken_ns, start_ns);
    #[cfg(not(profiling_supported))]
    let _ = (woken_ns, start_ns);
}

pub use crate::lanes::NOT_WOKEN;

/// When this thread last published a new context word (0: not since the
/// last call), and forgets it: the end of a poll whose span's exit changed
/// the word, without another clock read.
#[inline]
pub fn take_last_published_ns() -> u64 {
    #[cfg(profiling_supported)]
    {
        crate::context::take_last_published_ns()
    }
    #[cfg(not(profiling_supported))]
    {
        0
    }
}

/// The transaction data key that asks the transport to attach a V1
/// profile (set by the tracing layer and middleware; removed before
/// sending).
pub const TRANSACTION_PROFILE_MARKER: &str = crate::transaction_profile::V1_MARKER;

thread_local! {
    /// The lane whose root span last called [`SessionRef::root_started`]
    /// on this thread, and when.
    static ROOT_STARTED: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
    /// When this thread last reported a lane's end (see
    /// [`take_lane_finished_ns`]).
    static LANE_FINISHED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// When this thread last reported a lane's end
/// ([`SessionRef::lane_finished`]; 0: not since the last call), and
/// forgets it: the request's end, for its
/// totals, without another clock read. Call it once before closing the
/// root span (to forget an older end) and once after.
#[inline]
pub fn take_lane_finished_ns() -> u64 {
    LANE_FINISHED.try_with(|c| c.replace(0)).unwrap_or(0)
}
