//! Async attribution: which request a sample belongs to, across `.await`
//! hops between Tokio workers.
//!
//! Sentry's UI shows a transaction's profile as the samples of one
//! `thread.id` inside the transaction's time window. A Tokio request runs on
//! whichever worker is free after each `.await`, and that worker interleaves
//! other requests, so with OS thread ids the window shows other requests'
//! work and misses the request's own work on other workers.
//!
//! Lanes fix that. Each root span gets a *lane*: a numeric id of its own,
//! above any kernel thread id. While any span of the request is entered on a
//! thread, the tracing layer keeps the lane in that thread's context word,
//! which the signal handler copies into every sample. The encoder then files
//! such samples under the lane's id instead of the OS thread's, and the
//! transaction and its spans carry the lane as their `thread.id`: Sentry
//! shows exactly the request's samples, whichever workers took them. Samples
//! taken outside any sampled root span stay on their OS thread. Each sample
//! is filed once.
//!
//! A lane that is not running on any thread at a tick (suspended at an
//! `.await`, or queued for a worker) gets a sample with a single
//! `(suspended: awaiting or queued)` frame, so its flame graph shows wall
//! time like a thread's does, and a request that mostly awaits still has
//! samples to link to. These fill-in samples are added when the chunk is
//! encoded, never by the signal handler.
//!
//! # Where the parts live
//!
//! - this file: lane ids, what a lane stands for ([`LaneLink`]) and the
//!   events of its life ([`LaneEvent`]);
//! - [`registry`]: how a request registers its lane and reports its end
//!   from an application thread (bounded, never blocking), and how the
//!   chunk thread reads them;
//! - [`table`]: the chunk thread's table of lanes: their windows,
//!   expiry, fill-ins and end samples, the caps on both, and which thread
//!   key each sample of a chunk is filed under (what the encoders read).
//!
//! The functions `sentry-profiling-tracing` calls live in
//! the hidden `hooks` module (not public API), above both this module and the
//! session: lanes never call into the session.
//!
//! The seam to the sampler is the per-thread context word only
//! ([`crate::set_thread_context`]): the layer publishes the lane there, the
//! signal handler copies it into each sample, and nothing here touches the
//! sampler. The seam to the encoders is [`Lanes::thread_keys`] (and
//! [`Lanes::link`] for the exporters' labels).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

mod edges;
mod estimate;
mod lane_map;
pub(crate) mod registry;
mod ring;
pub(crate) mod table;

pub(crate) use registry::LaneRegistry;
pub(crate) use table::Lanes;

use crate::attribution::LANE_BASE;

/// `Change::woken_ns` of a poll of an instrumented future that was not
/// woken (its first poll): the request's wakes are known, this poll had
/// none.
pub const NOT_WOKEN: u64 = 1;

static NEXT_LANE: AtomicU64 = AtomicU64::new(LANE_BASE);

/// Allocates a new lane id (a request's, made when its root span is created).
pub(crate) fn next_lane() -> u64 {
    NEXT_LANE.fetch_add(1, Ordering::Relaxed)
}

/// A lane's life, as the tracing layer reports it.
#[derive(Debug, Clone)]
pub(crate) enum LaneEvent {
    /// A sampled root span was entered for the first time. The link
    /// travels by value: the chunk thread allocates the lane's copy
    /// itself, so that nothing the request's worker allocates is freed on
    /// another thread (see [`Lanes::apply`]).
    Started {
        lane: u64,
        link: LaneLink,
        start_ns: u64,
    },
    /// That root span closed.
    Finished { lane: u64, end_ns: u64 },
    /// The transaction the lane stands for spans `start_ns..=end_ns`. It
    /// can begin before the lane, and end before or after the root span
    /// closes (its thread was preempted between the tracing layers'
    /// callbacks, or between the transaction's end and the span's close,
    /// for milliseconds on a busy machine). The lane begins no later than the
    /// transaction and ends with it: it covers the whole transaction Sentry
    /// shows it under, and gets no fill-in after it, where Sentry shows
    /// none of the lane's samples.
    Transaction {
        lane: u64,
        start_ns: u64,
        end_ns: u64,
    },
}

/// One change of a thread's context word: a poll of the request it left
/// ended, and one of the request it entered began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Change {
    pub(crate) tid: u32,
    /// The word before (`None`: not known, its publication was lost).
    pub(crate) from: Option<u64>,
    pub(crate) to: u64,
    /// When the new word was published (`CLOCK_REALTIME`, ns).
    pub(crate) at_ns: u64,
    /// For the first poll of an instrumented future on this thread, when
    /// that future was woken ([`NOT_WOKEN`]: it was not; 0: not an
    /// instrumented future's poll).
    pub(crate) woken_ns: u64,
    /// The thread entered the request to run work handed off to it, not
    /// as a Tokio worker polling a task (see `context::OFF_WORKER`).
    pub(crate) off_worker: bool,
}

/// The shortest transaction Sentry links to a profile: Relay removes the
/// `profiler_id` of a transaction that lasted less than 19.8 ms
/// (`scrub_profiler_id`, on the transaction's `event.duration`), so no
/// profile view shows a shorter one's samples. A transaction is taken to
/// be that short only below 19.7 ms: its window reaches the lane table
/// from the same timestamps the transaction carries, and a tenth of a
/// millisecond is far more than their rounding to floating-point seconds.
pub(crate) const SHORTEST_LINKED_NS: u64 = 19_700_000;

/// The shortest poll whose edges are worth samples of their own: a tenth of
/// a sampling period (see [`Lanes::add_poll_edges`]).
pub(crate) fn min_poll_ns(period_ns: u64) -> u64 {
    period_ns / 10
}

/// Where [`read_changes`] left off.
#[cfg(profiling_supported)]
pub(crate) type ChangeCursor = crate::context::ChangeCursor;

/// Where [`read_changes`] left off (nothing publishes context words here).
#[cfg(not(profiling_supported))]
#[derive(Debug, Default)]
pub(crate) struct ChangeCursor;

#[cfg(not(profiling_supported))]
impl ChangeCursor {
    /// A cursor (there is nothing to read).
    pub(crate) fn starting_now() -> Self {
        Self
    }
}

/// Appends every thread's context-word changes since the previous call to
/// `out`, keeping at most `room` in it (the rest counted as lost), for
/// [`Lanes::apply_change`] to make polls of later, on another thread.
pub(crate) fn read_changes(
    cursor: &mut ChangeCursor,
    out: &mut Vec<Change>,
    room: usize,
) -> PollsRead {
    #[cfg(profiling_supported)]
    {
        let mut read = PollsRead::default();
        let overwritten = crate::context::read_changes(cursor, |tid, from, to, at_ns, woken_ns| {
            read.changes += 1;
            if out.len() < room {
                out.push(Change {
                    tid,
                    from,
                    to,
                    at_ns,
                    woken_ns: woken_ns & !crate::context::OFF_WORKER,
                    off_worker: woken_ns & crate::context::OFF_WORKER != 0,
                });
            } else {
                read.lost += 1;
            }
        });
        read.lost += overwritten;
        read
    }
    #[cfg(not(profiling_supported))]
    {
        let _ = (cursor, out, room);
        PollsRead::default()
    }
}

/// What one [`read_changes`] found.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PollsRead {
    /// Context-word changes read.
    pub(crate) changes: u64,
    /// Changes overwritten before they were read, or past the room given.
    pub(crate) lost: u64,
}

/// What a lane stands for: its root span, by name and Sentry ids.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct LaneLink {
    /// The root span's display name (the transaction's name).
    pub(crate) name: Arc<str>,
    /// The trace id. Kept as the SDK's id (16 bytes, no allocation on the
    /// request's thread); written as hex only by the exports that use it.
    pub(crate) trace_id: sentry_core::protocol::TraceId,
    /// The root span's id (the transaction's span id).
    pub(crate) span_id: sentry_core::protocol::SpanId,
}

/// A finished poll of a request at least the blocking threshold long (see
/// [`Lanes::with_blocking_ns`]), as the lane table saw it: what
/// `crate::blocking` reads with the poll's samples.
#[derive(Debug, Clone)]
pub(crate) struct BlockingPoll {
    /// The request's lane.
    pub(crate) lane: u64,
    /// The thread that polled it.
    pub(crate) tid: u32,
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
    /// The request: its transaction's name, trace and span.
    pub(crate) link: Arc<LaneLink>,
}

/// Blocking polls the lane table holds between two takes (about 100 ms
/// apart), at most; later ones are counted as lost.
pub(crate) const MAX_BLOCKING_POLLS: usize = 4096;

impl BlockingPoll {
    /// How long the poll held its thread.
    pub(crate) fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// Wall-clock time in nanoseconds since the Unix epoch (the samples' clock).
///
/// Read with `clock_gettime` directly: a request reads it several times on
/// its worker, and `SystemTime`'s checked subtraction and `Duration`
/// conversion add work to every read.
#[inline]
pub(crate) fn now_ns() -> u64 {
    #[cfg(profiling_supported)]
    {
        crate::sys::realtime_ns()
    }
    #[cfg(not(profiling_supported))]
    {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    }
}
