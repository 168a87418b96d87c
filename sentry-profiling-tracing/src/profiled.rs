//! `.profiled()`: a future run inside the span that was current when it was
//! made (as `tracing`'s `.instrument(span)` does), whose wakes are noted
//! (see `poll.rs`), so that a task a request hands work to shows in the
//! request's profile with its queued and awaiting time told apart.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use std::sync::Arc;

use sentry_core::{Hub, TransactionOrSpan};
use sentry_profiling::hooks::RequestTimes;

use crate::poll::PollTracker;

pin_project_lite::pin_project! {
    /// A future polled inside a span, with its wakes noted; see
    /// [`ProfiledExt::profiled`].
    pub struct Profiled<F> {
        #[pin]
        inner: F,
        span: tracing::Span,
        // Wakes and poll totals, while a profiling session runs.
        tracker: Option<PollTracker>,
        // The Sentry span current when the future was made, if it is a
        // child span (not the transaction, whose totals are the request's):
        // it gets this future's totals when the future completes.
        sentry_span: Option<TransactionOrSpan>,
        // Work a request handed off (`spawn_in_span`): its request's times,
        // which get each poll's time and wait, and when it was spawned.
        offloaded: Option<(Arc<RequestTimes>, u64)>,
    }
}

impl<F> Profiled<F> {
    /// Marks the future as work its request handed off (a task of
    /// `spawn_in_span`, spawned now): its polls' time goes to the request's
    /// `tokio.offloaded` totals.
    pub(crate) fn offloaded(mut self) -> Self {
        if self.tracker.is_some() {
            self.offloaded = crate::layer::request_times(&self.span)
                .map(|times| (times, sentry_profiling::hooks::wall_ns()));
        }
        self
    }
}

impl<F> std::fmt::Debug for Profiled<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Profiled")
            .field("span", &self.span)
            .finish_non_exhaustive()
    }
}

/// Makes any future a [`Profiled`] one.
pub trait ProfiledExt: Future + Sized {
    /// Runs this future inside the span current now (its samples land in
    /// that span's request, whichever thread polls it), and notes when it
    /// is woken: the request's profile then shows the time this future
    /// waited for a Tokio worker as `(queued for a Tokio worker)` and the
    /// time it waited for what it awaits as `(awaiting)`. When the current
    /// Sentry span is a child span (not the transaction), it gets the
    /// future's `tokio.*` totals (polls, time polled, queued and awaiting,
    /// longest poll) when the future completes.
    ///
    /// `spawn_in_span(f)` is `tokio::spawn(f.profiled())`; use this for
    /// tasks spawned some other way (a `JoinSet`, another runtime), or to
    /// time a part of a request that you `.await` directly.
    fn profiled(self) -> Profiled<Self> {
        let sentry_span = match Hub::current().configure_scope(|s| s.get_span()) {
            Some(span @ TransactionOrSpan::Span(_)) => Some(span),
            _ => None,
        };
        Profiled {
            inner: self,
            span: tracing::Span::current(),
            // Not the request's own future: awaited directly, its polls
            // are inside the request's own (whose word it keeps, so it
            // publishes nothing and its mark is never read); spawned, its
            // polls are work the request handed off.
            tracker: PollTracker::if_profiling(false),
            sentry_span,
            offloaded: None,
        }
    }
}

impl<F: Future> ProfiledExt for F {}

impl<F: Future> Future for Profiled<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let span = &*this.span;
        let inner = this.inner;
        let run = move |cx: &mut Context<'_>| {
            let _entered = span.enter();
            inner.poll(cx)
        };
        let poll = match this.tracker.as_mut() {
            Some(tracker) => {
                let before = *tracker.totals();
                let poll = tracker.poll(cx, run);
                if let Some((times, spawned_ns)) = this.offloaded.as_ref() {
                    let after = tracker.totals();
                    // A first poll waited from the spawn; a later one from
                    // its wake (the tracker's queued time).
                    let waited = if before.polls == 0 {
                        after.first_start_ns.saturating_sub(*spawned_ns)
                    } else {
                        after.queued_ns - before.queued_ns
                    };
                    times.offloaded(waited, after.polled_ns - before.polled_ns);
                }
                poll
            }
            None => run(cx),
        };
        if poll.is_ready() {
            if let (Some(tracker), Some(target)) = (this.tracker.as_ref(), this.sentry_span.take())
            {
                tracker
                    .totals()
                    .record(&target, sentry_profiling::hooks::wall_ns(), None);
            }
        }
        poll
    }
}
