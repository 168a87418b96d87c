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
pub use crate::request::{Request, SessionRef, Tagging};
pub use crate::request_times::{RequestTimes, RequestTimesNow};
pub use crate::thread_word::{current_thread_id, set_thread_context, thread_context};

/// What a request hands the transport with its transaction when it
/// finishes it (see [`handover::finish_handed`]).
pub mod handover {
    pub use crate::transaction_tags::{HandedLane, Handover, Offloaded, PollTotals, finish_handed};
}

/// The data keys the layer and the middleware write on transactions and
/// spans.
pub mod keys {
    pub use crate::transaction_tags::{
        AWAITING, CPU_WAIT, LONG_POLLS, LONGEST_POLL, LONGEST_POLL_START, OFFLOADED,
        OFFLOADED_CPU_WAIT, OFFLOADED_QUEUED, POLLED, POLLS, QUEUED, TOKIO_MEASUREMENTS,
    };
    pub use crate::transport::{OS_THREAD_ID, OS_THREAD_NAME};

    /// The transaction data key that asks the transport to attach a V1
    /// profile (set by the tracing layer and middleware; removed before
    /// sending).
    pub const TRANSACTION_PROFILE_MARKER: &str = crate::transaction_profile::V1_MARKER;
}

/// Not hooks: what the workspace's benches and tests need (the chunk
/// encoder, pprof decoding, a slow envelope directory).
pub mod workspace {
    pub use crate::chunk::{Chunk, ChunkSample};
    pub use crate::encode::sentry_chunk::{ChunkMeta, EncodedChunk, encode_chunk};

    /// pprof's `profile.proto` message types (as the `pprof_file` export
    /// writes them).
    pub mod pprof_proto {
        pub use crate::encode::pprof::{
            Function, Label, Line, Location, Mapping, Profile, Sample, ValueType,
        };
    }

    /// Makes `transport`'s writer thread pause `per_write` before each
    /// write, from its next one on: a slow disk, for the workspace's tests
    /// (`Duration::ZERO` ends it).
    pub fn set_envelope_dir_write_delay(
        transport: &crate::EnvelopeDirTransport,
        per_write: std::time::Duration,
    ) {
        transport.set_write_delay(per_write);
    }
}

/// The running session, looked up once for the calls a span or a request
/// makes in a row (see [`SessionRef`]); `None` without one (profiling not
/// configured, this process's session not sampled, or a forked child).
#[inline]
pub fn session() -> Option<SessionRef> {
    crate::session::current().map(|c| SessionRef(crate::request::Holder::Looked(c)))
}

/// A new lane id, as a request takes at its creation: for a test that
/// publishes a request's context word without a session.
pub fn next_lane() -> u64 {
    crate::lanes::next_lane()
}

/// `CLOCK_REALTIME` in nanoseconds: the clock of samples, context-word
/// changes and wake times.
#[inline]
pub fn wall_ns() -> u64 {
    now_ns()
}

/// The stamps of an instrumented future's polls: when it was woken and
/// when each poll began and ended, carried by the context words its span
/// publishes, so the chunk thread shows the time from a wake to its poll
/// as queued.
pub mod poll {
    pub use crate::lanes::NOT_WOKEN;

    /// The poll this thread is about to begin (by entering its request's
    /// span) is of an instrumented future woken at `woken_ns`
    /// ([`NOT_WOKEN`]: not woken, its first poll), begun at `start_ns`
    /// (read from [`super::wall_ns`] by the caller; 0: the publication
    /// reads the clock): the context word the span publishes carries both.
    /// `own`: the future is a request's own (`http_layer()`'s), not work
    /// it handed off, so the time this poll waits for a CPU is the
    /// request's `tokio.cpu_wait` rather than its `tokio.offloaded_cpu_wait`.
    /// Call it right before entering the span, and with `(0, 0, false)`
    /// right after (an entry that published nothing leaves it set).
    #[inline]
    pub fn set_started(woken_ns: u64, start_ns: u64, own: bool) {
        #[cfg(profiling_supported)]
        crate::context::set_poll_woken(
            if own && woken_ns != 0 {
                woken_ns | crate::context::OWN_POLL
            } else {
                woken_ns
            },
            start_ns,
        );
        #[cfg(not(profiling_supported))]
        let _ = (woken_ns, start_ns, own);
    }

    /// [`set_started`] for work a request handed to a thread that is not
    /// a Tokio worker (the blocking pool, a thread of its own), queued
    /// since `handed_ns`: its stretches in the request are never blocking
    /// polls. Call it right before entering the span, and
    /// `set_started(0, 0, false)` right after.
    #[inline]
    pub fn set_handed_off_worker(handed_ns: u64) {
        #[cfg(profiling_supported)]
        crate::context::set_poll_woken(handed_ns | crate::context::OFF_WORKER, 0);
        #[cfg(not(profiling_supported))]
        let _ = handed_ns;
    }

    /// When this thread last published a new context word (0: not since
    /// the last call), and forgets it: the end of a poll whose span's exit
    /// changed the word, without another clock read.
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
}
