//! Blocking polls as Sentry issues: a poll of a request that kept its
//! Tokio worker for at least the blocking threshold becomes, through the
//! client like any event, a warning-level issue event grouped by the code
//! that blocked and the way it blocked.
//!
//! Everything here runs on the chunk thread; an application thread does no
//! work for it beyond what the lanes already cost (its context word, which
//! the sampler thread reads). The pipeline:
//!
//! 1. the lane table ([`crate::lanes::Lanes`]) sees each poll end when it
//!    reads the thread's context-word change, and reports the polls at
//!    least [`BlockingConfig::threshold`] long ([`BlockingPoll`], a bounded
//!    queue, overflow counted);
//! 2. [`watch::Watch`] keeps each thread's most recent samples of requests
//!    (a bounded ring per thread) and, once a poll's samples are all in,
//!    reads the poll's samples from it and decides what the poll was doing
//!    ([`classify`]: on the CPU, in the kernel in a named call, or waiting
//!    on a lock; the culprit, the innermost application frame by the
//!    README's stack-trace rules; and the stack that shows it);
//! 3. [`windows::Windows`] groups the polls by culprit (the blocking
//!    site): the first poll of a site opens a window of
//!    [`BlockingConfig::interval`], and when it closes one event stands for
//!    every poll in it (count, worst and median durations; the kind most
//!    of them were read as, which with the culprit is its fingerprint; the
//!    worst such poll's stack, request and trace), within a global bound of
//!    [`MAX_BLOCKING_EVENTS_PER_MINUTE`]; what does not fit is counted;
//! 4. [`event`] writes that event, which the session hands to the client
//!    (`before_send`, sampling and client reports) and sends through its
//!    transport (rate limits of the `error` category).
//!
//! The windows still open when the session shuts down are sent then.

pub(crate) mod classify;
pub(crate) mod event;
pub(crate) mod watch;
pub(crate) mod windows;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Default shortest poll that becomes a blocking-poll issue event (see
/// `ProfilingIntegration::blocking_threshold`): 50 ms.
pub const DEFAULT_BLOCKING_THRESHOLD: Duration = Duration::from_millis(50);
/// The shortest blocking threshold accepted: 1 ms.
pub const MIN_BLOCKING_THRESHOLD: Duration = Duration::from_millis(1);
/// Default length of the window in which the blocking polls of one
/// site make one event (see `ProfilingIntegration::blocking_interval`):
/// 60 s.
pub const DEFAULT_BLOCKING_INTERVAL: Duration = Duration::from_secs(60);
/// The shortest window accepted: 1 s.
pub const MIN_BLOCKING_INTERVAL: Duration = Duration::from_secs(1);
/// Blocking-poll events sent per minute at most, all sites together.
pub const MAX_BLOCKING_EVENTS_PER_MINUTE: usize = 20;

/// How blocking polls become events, settled from the options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlockingConfig {
    /// Whether blocking polls become events at all.
    pub(crate) enabled: bool,
    /// A poll at least this long is a blocking poll.
    pub(crate) threshold: Duration,
    /// One event per site per this long.
    pub(crate) interval: Duration,
}

impl Default for BlockingConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            threshold: DEFAULT_BLOCKING_THRESHOLD,
            interval: DEFAULT_BLOCKING_INTERVAL,
        }
    }
}

impl BlockingConfig {
    /// The threshold in nanoseconds, 0 when the feature is off (what the
    /// lane table takes).
    pub(crate) fn threshold_ns(&self) -> u64 {
        if self.enabled {
            u64::try_from(self.threshold.as_nanos()).unwrap_or(u64::MAX)
        } else {
            0
        }
    }
}

pub(crate) use crate::lanes::BlockingPoll;

pub(crate) use crate::lanes::MAX_BLOCKING_POLLS as MAX_PENDING_POLLS;

/// The session's counters of blocking polls.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) polls: AtomicU64,
    pub(crate) polls_lost: AtomicU64,
    pub(crate) polls_without_stack: AtomicU64,
    pub(crate) events_sent: AtomicU64,
    pub(crate) events_filtered: AtomicU64,
    pub(crate) events_dropped: AtomicU64,
    pub(crate) polls_in_dropped_events: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        if n > 0 {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub(crate) fn snapshot(&self) -> BlockingStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        BlockingStats {
            polls: l(&self.polls),
            polls_lost: l(&self.polls_lost),
            polls_without_stack: l(&self.polls_without_stack),
            events_sent: l(&self.events_sent),
            events_filtered: l(&self.events_filtered),
            events_dropped: l(&self.events_dropped),
            polls_in_dropped_events: l(&self.polls_in_dropped_events),
        }
    }
}

/// What became of blocking polls (see
/// [`ProfilingIntegration::blocking_issues`](crate::ProfilingIntegration::blocking_issues)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BlockingStats {
    /// Polls of requests at least the blocking threshold long that were
    /// read with their samples and grouped into an event's window.
    pub polls: u64,
    /// Blocking polls not grouped: more than the watch holds between two
    /// reads (4,096 about every 100 ms), or more distinct sites open
    /// at once than it keeps (256).
    pub polls_lost: u64,
    /// Blocking polls none of whose samples shows an application frame
    /// (on a saturated machine the sampler may not read where a thread
    /// waited in time, and shows `(waiting: where not read in time)`):
    /// an issue with no culprit would group nothing, so they make no
    /// event.
    pub polls_without_stack: u64,
    /// Events handed to the transport.
    pub events_sent: u64,
    /// Events `before_send`, an event processor or the client's
    /// `sample_rate` dropped (also in the client's reports), or that found
    /// no client.
    pub events_filtered: u64,
    /// Events not made because the global bound of
    /// `MAX_BLOCKING_EVENTS_PER_MINUTE` was reached.
    pub events_dropped: u64,
    /// The blocking polls those dropped events stood for.
    pub polls_in_dropped_events: u64,
}
