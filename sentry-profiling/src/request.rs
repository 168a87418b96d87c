//! A request as the profiler sees it: one sampled root span (a
//! transaction), from its creation to its close, as one object the tracing
//! layer keeps with the span. It owns what the request holds of the
//! session (a hold on the trace lifecycle, its lane) and gives both back
//! when it finishes or is dropped, whichever comes first, to the session
//! it began in: a request in flight while the SDK is initialised again
//! ends in the session that counted it, never in the new one.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use sentry_core::protocol::{SpanId, TraceId};

use crate::lanes::{LaneLink, now_ns};
use crate::request_times::RequestTimes;
use crate::session::Session;

/// [`Request::held`]: it began (its first entry was decided).
const BEGUN: u8 = 1;
/// It holds the trace lifecycle (the profiler runs for it).
const HOLDS_PROFILER: u8 = 2;
/// Its lane is registered: its samples are filed under it.
const HOLDS_LANE: u8 = 4;
/// It finished: nothing is held any more.
const FINISHED: u8 = 8;

/// One request (see the module's doc). Made when its root span is created
/// ([`Request::new`]), begun at the span's first entry
/// ([`Request::begin`]), finished when the span closes
/// ([`Request::finish`], or its drop).
#[derive(Debug)]
pub struct Request {
    /// Its lane id: the context word its spans publish while it holds the
    /// lane.
    lane: u64,
    /// When its root span was created, and on which thread.
    created_ns: u64,
    created_on: u64,
    /// What it holds (the flags above). Atomic so that the span's shared
    /// extensions can hold it: only the thread that runs the span's
    /// callbacks changes it.
    held: AtomicU8,
    /// The session it was made in, kept: it begins there, and its finish
    /// gives its hold back there, whatever session runs by then.
    session: SessionRef,
    /// Its time beyond its future's own polls, shared with whoever measures
    /// it (see [`RequestTimes`]); made when its lane is registered.
    times: OnceLock<Arc<RequestTimes>>,
    /// The times its maker keeps a handle on (see [`Request::with_times`]).
    given: Option<Arc<RequestTimes>>,
}

impl Request {
    /// A root span is created now, on this thread, in `session` (which the
    /// request keeps: the one look-up of the session a request makes): a
    /// new lane id.
    pub fn new(session: &SessionRef) -> Self {
        Self::made(session.keep(), None)
    }

    /// The same as [`Request::new`], in a session its maker already kept
    /// (`http_layer()`, which hands it over), with the times it will
    /// measure into if its lane is registered
    /// ([`RequestTimes::registered`] says whether): the maker reads them at
    /// the end without looking the request up.
    pub fn with_times(session: SessionRef, times: Arc<RequestTimes>) -> Self {
        Self::made(session.keep_owned(), Some(times))
    }

    fn made(session: SessionRef, given: Option<Arc<RequestTimes>>) -> Self {
        Self {
            lane: crate::lanes::next_lane(),
            created_ns: now_ns(),
            created_on: crate::thread_word::current_thread_id(),
            held: AtomicU8::new(0),
            session,
            times: OnceLock::new(),
            given,
        }
    }

    /// The session it was made in (see [`Request::new`]).
    pub fn session(&self) -> &SessionRef {
        &self.session
    }

    /// Its lane id (whether or not the lane is registered).
    pub fn lane(&self) -> u64 {
        self.lane
    }

    /// Its time beyond its future's polls (see [`RequestTimes`]), once its
    /// lane is registered; `None` before, or for a request without a lane
    /// (whose threads' samples are not filed under it).
    pub fn times(&self) -> Option<&Arc<RequestTimes>> {
        self.times.get()
    }

    /// Whether its lane is registered (see [`Request::begin`]).
    pub fn holds_lane(&self) -> bool {
        self.held.load(Ordering::Relaxed) & HOLDS_LANE != 0
    }

    /// Its root span is entered for the first time, `sampled` if its Sentry
    /// transaction is, named `name`, in its session. Returns whether the
    /// profiler runs now (either lifecycle); only the first call does
    /// anything.
    ///
    /// A sampled request holds the trace lifecycle (the profiler runs for
    /// it) and, while the profiler runs, registers its lane, named and
    /// linked to the trace and span `ids` returns (read only then). The
    /// lane begins when the root span was created, or, created on another
    /// thread, now: before the profiler resumes, which wakes the sampler
    /// thread, and on a busy machine that can take this thread's core for
    /// a while, which the lane must cover. A lane refused (too many
    /// requests in flight, counted in
    /// [`ProfilerStats::lane_registrations_refused`](crate::ProfilerStats))
    /// leaves the request on its OS threads: [`Request::holds_lane`] says
    /// so, and its spans must publish 0, not the lane.
    pub fn begin(
        &self,
        sampled: bool,
        name: &Arc<str>,
        ids: impl FnOnce() -> (TraceId, SpanId),
    ) -> bool {
        let session = &self.session;
        if self.held.load(Ordering::Relaxed) != 0 {
            return session.is_running();
        }
        if !sampled {
            self.held.store(BEGUN, Ordering::Relaxed);
            return session.is_running();
        }
        let start_ns = if self.created_on == crate::thread_word::current_thread_id() {
            self.created_ns
        } else {
            now_ns()
        };
        let mut held = BEGUN;
        // Counted by the session only when it returns true, so the hold
        // is given back once, at the finish.
        let holds_profiler = session.0.root_started(self.lane, name);
        if holds_profiler {
            held |= HOLDS_PROFILER;
        }
        let running = holds_profiler || session.is_running();
        if running {
            let (trace_id, span_id) = ids();
            let link = LaneLink {
                name: Arc::clone(name),
                trace_id,
                span_id,
            };
            if session.0.lane_started(self.lane, link, start_ns) {
                held |= HOLDS_LANE;
                // Its threads' samples are filed under its lane from now
                // on: the sampler side learns where to add their waits.
                let times = match &self.given {
                    Some(given) => Arc::clone(given),
                    None => Arc::new(RequestTimes::default()),
                };
                if session.0.request_times(self.lane, &times) {
                    times.set_registered();
                    let _ = self.times.set(times);
                }
            }
        }
        self.held.store(held, Ordering::Relaxed);
        running
    }

    /// Its root span closed: gives back what it holds (its lane ends now,
    /// and its hold on the trace lifecycle) to the session it began in,
    /// never looked up again. Never blocks; only the first call (or the
    /// drop) does anything.
    pub fn finish(&self) {
        let held = self.held.swap(FINISHED, Ordering::Relaxed);
        if held & (HOLDS_PROFILER | HOLDS_LANE) == 0 {
            return;
        }
        let session = &self.session.0;
        if held & HOLDS_LANE != 0 {
            session.lane_finished(self.lane, now_ns());
        }
        if held & HOLDS_PROFILER != 0 {
            session.root_finished();
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        self.finish();
    }
}

/// A session: as looked up ([`session`](crate::hooks::session)),
/// borrowed for the few calls made in a row, which touches no reference
/// count, and not to be kept (it holds one of the thread's few
/// `arc_swap` guards); or kept ([`SessionRef::keep`]), by a request for
/// its whole life, which stays that session after the SDK is initialised
/// again.
pub struct SessionRef(pub(crate) Holder);

/// How a [`SessionRef`] holds its session.
pub(crate) enum Holder {
    /// As looked up, borrowed.
    Looked(crate::session::Current),
    /// Kept: one reference count.
    Kept(Arc<Session>),
}

impl std::ops::Deref for Holder {
    type Target = Session;

    fn deref(&self) -> &Session {
        match self {
            Holder::Looked(current) => current,
            Holder::Kept(session) => session,
        }
    }
}

impl std::fmt::Debug for SessionRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionRef").finish_non_exhaustive()
    }
}

/// How a transaction or span of a request is tagged with the thread its
/// samples are filed under, as Sentry's spec asks: decided here, by
/// [`SessionRef::tagging`], for the tracing layer and the middleware alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tagging {
    /// The middleware's own transaction, on its lane: the lane goes to the
    /// transport with the transaction (see
    /// [`handover`](crate::hooks::handover)), which writes it and the
    /// lane's name on the transaction as it sends it.
    HandLane(u64),
    /// The lane, written now with its name; `os_thread_keys`: with
    /// transaction-based (V1) profiles, also the OS thread, where a
    /// transaction too short for its lane to get two samples is linked
    /// instead.
    Lane {
        /// The lane id.
        lane: u64,
        /// See above.
        os_thread_keys: bool,
    },
    /// The OS thread that runs it (lanes off, or no lane).
    OsThread,
}

impl SessionRef {
    /// The same session, to keep (one reference count): what a request
    /// holds for its whole life, and the middleware for a request's.
    pub fn keep(&self) -> SessionRef {
        SessionRef(Holder::Kept(match &self.0 {
            Holder::Looked(current) => current.shared(),
            Holder::Kept(session) => Arc::clone(session),
        }))
    }

    /// The same session, kept, taking this one's hold when it is already
    /// kept (no reference count touched).
    fn keep_owned(self) -> SessionRef {
        match self.0 {
            Holder::Kept(_) => self,
            Holder::Looked(_) => self.keep(),
        }
    }

    /// How to tag a transaction or span of the request whose context word
    /// is `word` (see [`Tagging`]); `own`: the transaction is the one the
    /// middleware started (others are finished by their owners, who hand
    /// nothing to the transport).
    pub fn tagging(&self, word: u64, own: bool) -> Tagging {
        if self.attribution() != crate::attribution::ThreadAttribution::Lanes
            || !crate::attribution::is_lane(word)
        {
            return Tagging::OsThread;
        }
        let v1 = self.transaction_profiling();
        if own && !v1 {
            Tagging::HandLane(word)
        } else {
            Tagging::Lane {
                lane: word,
                os_thread_keys: v1,
            }
        }
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
    /// [`Request::begin`] made). Always false in continuous mode.
    pub fn transaction_profiled(&self, lane: u64, name: &str) -> bool {
        self.0.v1().is_some_and(|v1| v1.sampled(lane, name))
    }
}
