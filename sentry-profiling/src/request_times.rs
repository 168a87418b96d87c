//! The parts of a request's time measured away from the future that
//! serves it (see [`RequestTimes`]): shared by the request (`request.rs`),
//! the sampler thread's intake, which adds its threads' waits for a CPU,
//! and the spawn helpers, which add its offloaded work's time. A core
//! type: the session holds it without knowing the request.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The parts of a request's time measured away from the future that
/// serves it, kept with the request (no table, nothing keyed by its word):
/// the sampler thread adds the time its threads were shown waiting for a
/// CPU, telling the future's own polls from the work it handed off, and
/// the spawn helpers add that work's time. Read when its transaction is
/// finished; each total is what was added so far.
#[derive(Debug, Default)]
pub struct RequestTimes {
    /// `(waiting for a CPU)` shown in its future's own polls, ns.
    cpu_wait_ns: AtomicU64,
    /// `(waiting for a CPU)` shown in its offloaded work, ns.
    offloaded_cpu_wait_ns: AtomicU64,
    /// Time its offloaded work ran (inside its closures and its tasks'
    /// polls, waiting for a CPU included), ns.
    offloaded_ns: AtomicU64,
    /// Time its offloaded work waited to start: from a closure's spawn to
    /// its start on a blocking thread, from a task's spawn to its first
    /// poll, and from a task's wakes to its polls, ns.
    offloaded_queued_ns: AtomicU64,
    /// Whether the request's lane was registered with these times (its
    /// threads' samples are filed under it, and their waits added here).
    registered: AtomicBool,
}

/// A snapshot of [`RequestTimes`], ns each.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestTimesNow {
    /// See [`RequestTimes`].
    pub cpu_wait_ns: u64,
    /// See [`RequestTimes`].
    pub offloaded_cpu_wait_ns: u64,
    /// See [`RequestTimes`].
    pub offloaded_ns: u64,
    /// See [`RequestTimes`].
    pub offloaded_queued_ns: u64,
}

impl RequestTimes {
    /// The sampler thread showed the request's thread waiting for a CPU for
    /// `ns`, in a poll of its own future (`own`) or in its offloaded work.
    pub(crate) fn cpu_waited(&self, own: bool, ns: u64) {
        let total = if own {
            &self.cpu_wait_ns
        } else {
            &self.offloaded_cpu_wait_ns
        };
        total.fetch_add(ns, Ordering::Relaxed);
    }

    /// A piece of its offloaded work waited `queued_ns` to start (or to be
    /// polled again) and then ran for `ran_ns`.
    pub fn offloaded(&self, queued_ns: u64, ran_ns: u64) {
        self.offloaded_queued_ns
            .fetch_add(queued_ns, Ordering::Relaxed);
        self.offloaded_ns.fetch_add(ran_ns, Ordering::Relaxed);
    }

    /// Whether the request's lane was registered with these times (see
    /// `Request::with_times`): only then do they measure anything. Read on
    /// the thread that began the request, after it began.
    pub fn registered(&self) -> bool {
        self.registered.load(Ordering::Relaxed)
    }

    /// The request's lane was registered with these times.
    pub(crate) fn set_registered(&self) {
        self.registered.store(true, Ordering::Relaxed);
    }

    /// The totals so far.
    pub fn now(&self) -> RequestTimesNow {
        RequestTimesNow {
            cpu_wait_ns: self.cpu_wait_ns.load(Ordering::Relaxed),
            offloaded_cpu_wait_ns: self.offloaded_cpu_wait_ns.load(Ordering::Relaxed),
            offloaded_ns: self.offloaded_ns.load(Ordering::Relaxed),
            offloaded_queued_ns: self.offloaded_queued_ns.load(Ordering::Relaxed),
        }
    }
}
