//! Why a request waited: each instrumented future (the request's in
//! `http_layer()`, its response body, the tasks of `spawn_in_span` and
//! `.profiled()`) wraps the waker of every poll in one of its own, which
//! notes when the future is woken before passing the wake on. Between a
//! wake and the next poll the request is *queued* (its task is runnable,
//! but no Tokio worker polls it yet: the runtime is saturated, or a worker
//! is blocked by another task's long poll); between the end of a poll and
//! the wake that follows it, it is *awaiting* (not ready: a database, a
//! downstream call, a timer).
//!
//! Two things use that. Each poll's wake time travels with the context word
//! the poll's span publishes (`hooks::poll::set_started`), so the profiler
//! thread draws the request's waits as `(queued for a Tokio worker)` and
//! `(awaiting)` in its lane; and the future keeps per-request totals
//! ([`PollTotals`]), which go on the request's transaction (or child span)
//! as `tokio.*` data when it ends.
//!
//! The wake path is one clock read, one compare-and-swap and the wake of
//! the task's own waker: no lock, no allocation (the task's waker is cloned
//! only when it changes). The state the wrapping waker shares with the
//! future is taken from a small pool of this thread's finished requests,
//! so a request allocates it only when none is free.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Wake, Waker};

use atomic_waker::AtomicWaker;
use sentry_core::TransactionOrSpan;
use sentry_profiling::hooks;

/// What an instrumented future's waker shares with the future.
#[derive(Debug, Default)]
struct WakeState {
    /// When the future was first woken since its last poll began
    /// (`CLOCK_REALTIME`, ns; 0: not woken since).
    woken_ns: AtomicU64,
    /// The waker of the task that polls the future, as of its latest poll.
    task: AtomicWaker,
}

impl Wake for WakeState {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Only the first wake after a poll began counts: the request has
        // been runnable since then.
        if self.woken_ns.load(Ordering::Relaxed) == 0 {
            let _ = self.woken_ns.compare_exchange(
                0,
                hooks::wall_ns().max(hooks::poll::NOT_WOKEN + 1),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        // Taking the task's waker wakes the task once; a later wake before
        // the next poll finds it scheduled already, and that poll registers
        // the waker again.
        self.task.wake();
    }
}

/// Wake states of finished requests kept on each thread for the next ones,
/// at most (a few kilobytes).
const POOLED_STATES: usize = 64;

thread_local! {
    /// Wake states no waker refers to any more (see [`POOLED_STATES`]).
    static POOL: RefCell<Vec<Arc<WakeState>>> = const { RefCell::new(Vec::new()) };
}

/// A wake state as new: one of this thread's pool, else a new one.
fn fresh_state() -> Arc<WakeState> {
    POOL.try_with(|p| p.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Gives `state` back to this thread's pool if nothing else refers to it
/// (no waker of it is held by a timer or an I/O driver any more), reset;
/// otherwise the caller's reference is all that goes, and whoever drops
/// the last waker frees it.
fn recycle(state: &mut Arc<WakeState>) {
    let Some(s) = Arc::get_mut(state) else {
        return;
    };
    *s.woken_ns.get_mut() = 0;
    // Drops the task's waker it held, as dropping the state would.
    s.task = AtomicWaker::new();
    let _ = POOL.try_with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < POOLED_STATES {
            p.push(Arc::clone(state));
        }
    });
}

/// Per-request poll totals, kept by the future that polls (no atomics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PollTotals {
    /// Polls so far.
    pub(crate) polls: u64,
    /// Time spent inside polls, ns.
    pub(crate) polled_ns: u64,
    /// Time from wakes to the polls they caused, ns.
    pub(crate) queued_ns: u64,
    /// The longest poll, ns, and when it began (`CLOCK_REALTIME`, ns).
    pub(crate) longest_ns: u64,
    pub(crate) longest_start_ns: u64,
    /// Polls at least the long-poll threshold long.
    pub(crate) long_polls: u64,
    /// When the first poll began, and the latest one ended.
    pub(crate) first_start_ns: u64,
    pub(crate) last_end_ns: u64,
}

impl PollTotals {
    /// The time neither polled nor queued, from the first poll's start to
    /// `end_ns`: the request awaited.
    pub(crate) fn awaiting_ns(&self, end_ns: u64) -> u64 {
        end_ns
            .saturating_sub(self.first_start_ns)
            .saturating_sub(self.polled_ns)
            .saturating_sub(self.queued_ns)
    }

    /// The totals as they go on a transaction or span, the request having
    /// ended at `end_ns`, with its `times` measured away from its future
    /// (for a request's own future with a lane); `None` before the first
    /// poll.
    pub(crate) fn snapshot(
        &self,
        end_ns: u64,
        times: Option<hooks::RequestTimesNow>,
    ) -> Option<hooks::handover::PollTotals> {
        (self.polls > 0).then(|| hooks::handover::PollTotals {
            polls: self.polls,
            polled_ns: self.polled_ns,
            queued_ns: self.queued_ns,
            awaiting_ns: self.awaiting_ns(end_ns),
            longest_ns: self.longest_ns,
            long_polls: self.long_polls,
            longest_start_ns: self.longest_start_ns,
            // The profile shows waits in whole sampling periods, so a
            // request whose polls are shorter than one may be shown
            // waiting longer than it was polled; it cannot have waited
            // longer in its polls than it spent in them.
            cpu_wait_ns: times.map(|t| t.cpu_wait_ns.min(self.polled_ns)),
            offloaded: times.map(|t| hooks::handover::Offloaded {
                ran_ns: t.offloaded_ns,
                // As for its polls: whole periods, within the time it ran.
                cpu_wait_ns: t.offloaded_cpu_wait_ns.min(t.offloaded_ns),
                queued_ns: t.offloaded_queued_ns,
            }),
        })
    }

    /// Writes the totals as `tokio.*` data of `span` (a transaction, or a
    /// child span), the request having ended at `end_ns` (with `times`, as
    /// [`PollTotals::snapshot`]): milliseconds as
    /// floating-point numbers, counts as integers; all under one lock of
    /// the span.
    pub(crate) fn record(
        &self,
        span: &TransactionOrSpan,
        end_ns: u64,
        times: Option<hooks::RequestTimesNow>,
    ) {
        let Some(totals) = self.snapshot(end_ns, times) else {
            return;
        };
        match span {
            TransactionOrSpan::Transaction(tx) => {
                let mut data = tx.data();
                for (key, value) in totals.data() {
                    data.set_data(key.into(), value);
                }
            }
            TransactionOrSpan::Span(s) => {
                let mut data = s.data();
                for (key, value) in totals.data() {
                    data.set_data(key.to_owned(), value);
                }
            }
        }
    }
}

/// An instrumented future's wake tracking and poll totals.
#[derive(Debug)]
pub(crate) struct PollTracker {
    /// Given back to the pool by `drop` (see [`recycle`]).
    state: Arc<WakeState>,
    /// The wrapping waker handed to the inner future (made at the first
    /// poll).
    waker: Option<Waker>,
    totals: PollTotals,
    long_poll_ns: u64,
    /// Whether the future is a request's own (see
    /// `hooks::poll::set_started`).
    own: bool,
    /// When the request's first poll began, if before this tracker's first
    /// poll (see [`PollTracker::begun_at`]).
    begun_ns: Option<u64>,
}

impl PollTracker {
    /// A tracker while a profiling session runs (without one, nothing
    /// reads what it would note), of a request's own future (`own`) or of
    /// work it handed off.
    pub(crate) fn if_profiling(own: bool) -> Option<Self> {
        Some(Self::new(&hooks::session()?, own))
    }

    /// A tracker in `session` (see [`PollTracker::if_profiling`]).
    pub(crate) fn new(session: &hooks::SessionRef, own: bool) -> Self {
        Self::with_long_poll_ns(session.long_poll_ns(), own)
    }

    fn with_long_poll_ns(long_poll_ns: u64, own: bool) -> Self {
        Self {
            state: fresh_state(),
            waker: None,
            totals: PollTotals::default(),
            long_poll_ns,
            own,
            begun_ns: None,
        }
    }

    /// The same tracker, of a request whose first poll began at `begun_ns`
    /// (`CLOCK_REALTIME`), before its transaction started: its time is
    /// counted from there, so its parts make the transaction's duration.
    pub(crate) fn begun_at(mut self, begun_ns: u64) -> Self {
        self.begun_ns = Some(begun_ns);
        self
    }

    /// The totals so far.
    pub(crate) fn totals(&self) -> &PollTotals {
        &self.totals
    }

    /// Runs one poll: `enter` is called with the context (wrapping `cx`'s
    /// waker) to hand the inner future; it must enter the request's span
    /// (publishing its context word, which carries the wake time) before
    /// polling.
    pub(crate) fn poll<R>(
        &mut self,
        cx: &Context<'_>,
        enter: impl FnOnce(&mut Context<'_>) -> R,
    ) -> R {
        self.state.task.register(cx.waker());
        let start = hooks::wall_ns();
        let woken = self.state.woken_ns.swap(0, Ordering::Relaxed);
        let first = self.totals.polls == 0;
        // A wake during the previous poll queues the request from that
        // poll's end.
        let queued_from = if first || woken == 0 {
            None
        } else {
            Some(woken.max(self.totals.last_end_ns))
        };
        if let Some(from) = queued_from {
            self.totals.queued_ns += start.saturating_sub(from);
        }
        hooks::poll::set_started(
            queued_from.unwrap_or(hooks::poll::NOT_WOKEN),
            start,
            self.own,
        );
        let waker = self
            .waker
            .get_or_insert_with(|| Waker::from(Arc::clone(&self.state)));
        let mut inner_cx = Context::from_waker(waker);
        hooks::poll::take_last_published_ns();
        let out = enter(&mut inner_cx);
        hooks::poll::set_started(0, 0, false);
        // The span's exit published the thread's word back, and read the
        // clock then: the poll's end (read here only when it did not).
        let end = match hooks::poll::take_last_published_ns() {
            0 => hooks::wall_ns(),
            published => published.max(start),
        };
        // A request's first poll began when its middleware took it up,
        // before the transaction and the span it opened: from then on its
        // time is one of the three parts.
        let start = match self.begun_ns {
            Some(begun) if first => begun.min(start),
            _ => start,
        };
        let took = end.saturating_sub(start);
        let t = &mut self.totals;
        if first {
            t.first_start_ns = start;
        }
        t.polls += 1;
        t.polled_ns += took;
        t.last_end_ns = end;
        if took > t.longest_ns {
            t.longest_ns = took;
            t.longest_start_ns = start;
        }
        if took >= self.long_poll_ns {
            t.long_polls += 1;
            if let Some(session) = hooks::session() {
                session.long_poll_seen();
            }
        }
        out
    }
}

impl Drop for PollTracker {
    fn drop(&mut self) {
        // The future's own waker goes first: the state is then shared only
        // with wakers others hold.
        self.waker = None;
        recycle(&mut self.state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts wakes of the task.
    #[derive(Default)]
    struct Task(AtomicUsize);

    impl Wake for Task {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn the_measured_totals_are_the_ones_recorded() {
        // (`CPU_WAIT` and the offloaded ones come from the request's
        // times, for a profiled request.)
        let recorded = [
            hooks::keys::POLLS,
            hooks::keys::POLLED,
            hooks::keys::QUEUED,
            hooks::keys::AWAITING,
            hooks::keys::LONGEST_POLL,
            hooks::keys::CPU_WAIT,
            hooks::keys::OFFLOADED,
            hooks::keys::OFFLOADED_CPU_WAIT,
            hooks::keys::OFFLOADED_QUEUED,
        ];
        for (name, _) in hooks::keys::TOKIO_MEASUREMENTS {
            assert!(recorded.contains(&name), "{name}");
        }
        assert_eq!(recorded.len(), hooks::keys::TOKIO_MEASUREMENTS.len());
    }

    #[test]
    fn a_finished_requests_wake_state_is_reused_reset_and_a_held_one_is_not() {
        let task = Arc::new(Task::default());
        let task_waker = Waker::from(Arc::clone(&task));
        let cx = Context::from_waker(&task_waker);
        // A request woken after its last poll, then ended.
        let mut first = PollTracker::with_long_poll_ns(u64::MAX, true);
        let mut kept = None;
        first.poll(&cx, |inner| kept = Some(inner.waker().clone()));
        let kept = kept.unwrap();
        kept.wake_by_ref();
        assert_eq!(task.0.load(Ordering::Relaxed), 1);
        let state = Arc::as_ptr(&first.state);
        drop(kept);
        drop(first);
        // The next request on this thread gets that state, with neither the
        // wake nor the task of the one before.
        let mut second = PollTracker::with_long_poll_ns(u64::MAX, true);
        assert_eq!(Arc::as_ptr(&second.state), state, "reused");
        assert_eq!(second.state.woken_ns.load(Ordering::Relaxed), 0);
        second.state.task.wake();
        assert_eq!(
            task.0.load(Ordering::Relaxed),
            1,
            "no task of the one before"
        );
        second.poll(&cx, |_| ());
        drop(second);
        // A state whose waker someone still holds (a timer, an I/O driver)
        // stays theirs: the next request gets another, and the held waker
        // still wakes its task.
        let mut third = PollTracker::with_long_poll_ns(u64::MAX, true);
        assert_eq!(Arc::as_ptr(&third.state), state);
        let mut held = None;
        third.poll(&cx, |inner| held = Some(inner.waker().clone()));
        drop(third);
        let fourth = PollTracker::with_long_poll_ns(u64::MAX, true);
        assert_ne!(
            Arc::as_ptr(&fourth.state),
            state,
            "not handed out while held"
        );
        held.unwrap().wake();
        assert_eq!(task.0.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn wakes_reach_the_task_and_split_queued_from_polled() {
        let task = Arc::new(Task::default());
        let task_waker = Waker::from(Arc::clone(&task));
        let cx = Context::from_waker(&task_waker);
        let mut tracker = PollTracker::with_long_poll_ns(10_000_000, true);
        let mut kept = None;
        tracker.poll(&cx, |inner| kept = Some(inner.waker().clone()));
        let kept = kept.unwrap();
        assert_eq!(tracker.totals().polls, 1);
        assert_eq!(tracker.totals().queued_ns, 0, "a first poll is not queued");
        // Woken, then polled 20 ms later: 20 ms queued.
        kept.wake_by_ref();
        assert_eq!(task.0.load(Ordering::Relaxed), 1, "the task was woken");
        // A second wake before the poll changes nothing.
        kept.wake_by_ref();
        std::thread::sleep(std::time::Duration::from_millis(20));
        tracker.poll(&cx, |_| ());
        let queued = tracker.totals().queued_ns;
        assert!((20_000_000..200_000_000).contains(&queued), "{queued}");
        // Polled without a wake of ours: nothing more queued.
        tracker.poll(&cx, |_| ());
        assert_eq!(tracker.totals().queued_ns, queued);
        assert_eq!(tracker.totals().polls, 3);
        // A wake inside a poll queues the request from that poll's end.
        tracker.poll(&cx, |inner| {
            inner.waker().wake_by_ref();
            std::thread::sleep(std::time::Duration::from_millis(15));
        });
        assert!(tracker.totals().longest_ns >= 15_000_000);
        assert!(
            tracker.totals().long_polls >= 1,
            "a 15 ms poll is a long poll"
        );
        let before = tracker.totals().queued_ns;
        tracker.poll(&cx, |_| ());
        assert!(
            tracker.totals().queued_ns - before < 10_000_000,
            "the poll's own 15 ms are not queued"
        );
        let end = tracker.totals().last_end_ns;
        let t = tracker.totals();
        assert_eq!(
            t.awaiting_ns(end),
            (end - t.first_start_ns) - t.polled_ns - t.queued_ns
        );
    }
}
