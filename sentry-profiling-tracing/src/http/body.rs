//! The response body `http_layer()` hands back: a request is not over when
//! its handler returns a response, since the server then polls the body,
//! and that is where compression, templating into a stream or a
//! server-sent event's work runs. Each poll of the body runs inside the
//! request's root span, as each poll of the handler's future does, so its
//! samples land in the request's lane; the body owns the root span and the
//! transaction from the moment the response is ready, and ends both when
//! the body ends, fails or is dropped.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use sentry_core::protocol::SpanStatus;
use sentry_core::{Hub, Transaction, TransactionOrSpan};

use sentry_profiling::hooks::RequestTimes;
use sentry_profiling::hooks::handover::{HandedLane, Handover};

use crate::poll::PollTracker;

/// What a request holds from its first poll until its response body ends:
/// the root span (whose lane its samples go to), the hub its polls run
/// under, and the transaction this middleware started (none when it reused
/// one that was already on the scope, such as sentry-tower's, which its
/// owner finishes).
#[derive(Debug)]
pub(super) struct RequestScope {
    pub(super) span: tracing::Span,
    pub(super) hub: Arc<Hub>,
    pub(super) transaction: Option<Transaction>,
    /// When the request's polls were woken, and their totals (see
    /// `poll.rs`); `None` while no profiling session runs.
    pub(super) tracker: Option<PollTracker>,
    /// The transaction still to be tagged with the thread its samples are
    /// filed under (ours, or one reused from the scope); see
    /// [`RequestScope::poll`].
    pub(super) untagged: Option<TransactionOrSpan>,
    /// The transaction's name, which also names its lane (interned, see
    /// `layer::intern`): the lane handed over shares it, so the transport
    /// thread frees nothing this thread allocated for it.
    pub(super) name: Arc<str>,
    /// The lane handed to the transport with our transaction rather than
    /// tagged on it.
    pub(super) lane: Option<HandedLane>,
    /// The request's times measured away from its future (see
    /// `sentry_profiling::hooks::RequestTimes`), shared with its root
    /// span's request, which measures into them once its lane is
    /// registered (`None` while no session runs).
    pub(super) times: Option<Arc<RequestTimes>>,
    /// The session the request was made in (kept; `None` while none runs).
    pub(super) session: Option<sentry_profiling::hooks::SessionRef>,
}

impl RequestScope {
    /// Runs one poll of the request: `f` runs under its hub, with its root
    /// span entered (which makes the request's lane this thread's context
    /// word), and is handed the context to poll with (whose waker notes
    /// when the request is woken).
    ///
    /// Until the transaction is tagged with the thread its samples are
    /// filed under, each poll tries, once the profiler runs, with the root
    /// span entered (its lane is this thread's context word by then) and
    /// before `f`: a handler that panics in its first poll never returns
    /// here, and its transaction is still linked. Our own transaction's
    /// lane is not written on it but handed to the transport when it
    /// finishes (see [`RequestScope::end`]); a reused transaction (which
    /// its owner finishes), one on an OS thread, and one with a
    /// transaction profile (V1) are tagged here.
    pub(super) fn poll<R>(
        &mut self,
        cx: &mut Context<'_>,
        f: impl FnOnce(&mut Context<'_>) -> R,
    ) -> R {
        let RequestScope {
            span,
            hub,
            transaction,
            tracker,
            untagged,
            name,
            lane,
            times: _,
            session,
        } = self;
        let run = |cx: &mut Context<'_>| {
            Hub::run(Arc::clone(hub), || {
                let _entered = span.enter();
                if let (true, Some(session)) = (untagged.is_some(), session.as_ref()) {
                    tag(session, untagged, transaction.is_some(), name, lane);
                }
                f(cx)
            })
        };
        match tracker {
            Some(tracker) => tracker.poll(cx, run),
            None => run(cx),
        }
    }

    /// Its times so far (see [`RequestScope::times`]); `None` for a request
    /// whose lane was not registered.
    fn times_now(&self) -> Option<sentry_profiling::hooks::RequestTimesNow> {
        self.times
            .as_ref()
            .filter(|t| t.registered())
            .map(|t| t.now())
    }

    /// Writes the request's poll totals on `target` (see
    /// [`crate::poll::PollTotals::record`]).
    pub(super) fn record_polls(&self, target: &TransactionOrSpan) {
        if let Some(tracker) = &self.tracker {
            tracker
                .totals()
                .record(target, sentry_profiling::hooks::wall_ns(), self.times_now());
        }
    }

    /// Ends the request: closes the root span (ending its lane, and letting
    /// the trace lifecycle see the root end), then finishes the
    /// transaction, with `status` in place of the one the response gave if
    /// there is one. The span closes first so that the Sentry span a
    /// `sentry-tracing` layer made of it, and its children, are recorded in
    /// the transaction before it is sent. Must not be called with the span
    /// entered.
    ///
    /// The poll totals and the lane are handed to the transport with the
    /// transaction (`hooks::handover::finish_handed`) rather than written on it: the
    /// crate's own transaction sender writes them on its thread (the
    /// totals as measurements), and any other transport adds them after
    /// the SDK has copied the transaction's trace context.
    pub(super) fn end(self, status: Option<SpanStatus>) {
        let times = self.times_now();
        let RequestScope {
            span,
            transaction,
            tracker,
            lane,
            ..
        } = self;
        drop(span);
        if let Some(tx) = transaction {
            if let Some(status) = status {
                tx.set_status(status);
            }
            // The request's end: its root span closed (its lane ended).
            let end_ns = sentry_profiling::hooks::wall_ns();
            let handover = Handover {
                totals: tracker.and_then(|t| t.totals().snapshot(end_ns, times)),
                lane,
            };
            // Ended where its parts end, so that they make its duration.
            let end = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(end_ns);
            if handover.totals.is_none() && handover.lane.is_none() {
                tx.finish_with_timestamp(end);
            } else {
                sentry_profiling::hooks::handover::finish_handed(handover, || {
                    tx.finish_with_timestamp(end)
                });
            }
        }
    }
}

/// Tags `untagged` (see [`RequestScope::poll`]) once the profiler runs
/// (see `crate::tag`); `own`: it is the transaction this middleware
/// started, named `name`, whose lane goes to `lane` instead.
fn tag(
    session: &sentry_profiling::hooks::SessionRef,
    untagged: &mut Option<TransactionOrSpan>,
    own: bool,
    name: &Arc<str>,
    lane: &mut Option<HandedLane>,
) {
    use crate::tag::{Tagged, Target};
    let Some(target) = untagged.take() else {
        return;
    };
    let whose = if own { Target::Own } else { Target::Reused };
    let word = sentry_profiling::hooks::thread_context();
    match crate::tag::tag(session, &target, whose, word, Some(name)) {
        Tagged::Done => {}
        Tagged::Handed(handed) => *lane = Some(handed),
        // Tagged at a later poll, if it runs again.
        Tagged::NotRunning => *untagged = Some(target),
    }
}

pin_project_lite::pin_project! {
    /// The body of a response that went through
    /// [`http_layer()`](crate::http_layer): the service's own body, each
    /// poll of it run inside the request's root span (so its CPU, such as
    /// tower-http's compression or a stream's per-event work, shows in the
    /// request's profile), with the request's transaction finished when the
    /// body ends (its last frame, or an error) or is dropped, whichever
    /// comes first.
    ///
    /// A body dropped before its end (a `HEAD` request, a client that went
    /// away, a server that stops at the announced length) keeps the
    /// response's status; a body that fails gets `internal_error`.
    pub struct ProfilingBody<B> {
        #[pin]
        inner: B,
        // `None` once the request has ended.
        request: Option<RequestScope>,
    }

    impl<B> PinnedDrop for ProfilingBody<B> {
        fn drop(this: Pin<&mut Self>) {
            if let Some(request) = this.project().request.take() {
                // A panic in a poll of the body unwinds through here.
                let status = std::thread::panicking().then_some(SpanStatus::InternalError);
                request.end(status);
            }
        }
    }
}

impl<B> ProfilingBody<B> {
    pub(super) fn new(inner: B, request: Option<RequestScope>) -> Self {
        Self { inner, request }
    }
}

impl<B> std::fmt::Debug for ProfilingBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProfilingBody")
            .field("ended", &self.request.is_none())
            .finish_non_exhaustive()
    }
}

impl<B: Body> Body for ProfilingBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let Some(request) = this.request.as_mut() else {
            return this.inner.poll_frame(cx);
        };
        let mut inner = this.inner;
        let (poll, end) = request.poll(cx, |cx| {
            let poll = inner.as_mut().poll_frame(cx);
            // Whether this poll ended the body, and with which status. A
            // server stops polling a body that says it has ended (one
            // whose length is known), so the end is taken from the frame
            // that completes it rather than left to the drop.
            let end = match &poll {
                Poll::Ready(None) => Some(None),
                Poll::Ready(Some(Err(_))) => Some(Some(SpanStatus::InternalError)),
                Poll::Ready(Some(Ok(_))) if inner.is_end_stream() => Some(None),
                _ => None,
            };
            (poll, end)
        });
        if let Some(status) = end {
            if let Some(request) = this.request.take() {
                request.end(status);
            }
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll, Waker};

    use http::{Request, Response, StatusCode};
    use http_body::{Body, Frame};
    use sentry_core::protocol::{Envelope, EnvelopeItem, SpanStatus};
    use sentry_core::{Client, ClientOptions, Hub};
    use tower_layer::Layer as _;
    use tower_service::Service;
    use tracing_subscriber::layer::{Context as LayerContext, Layer};
    use tracing_subscriber::prelude::*;
    use tracing_subscriber::registry::LookupSpan;

    use super::ProfilingBody;

    /// Keeps each finished transaction's status.
    #[derive(Default)]
    struct Capture(Mutex<Vec<Option<SpanStatus>>>);

    impl sentry_core::Transport for Capture {
        fn send_envelope(&self, envelope: Envelope) {
            for item in envelope.items() {
                if let EnvelopeItem::Transaction(tx) = item {
                    let status = match tx.contexts.get("trace") {
                        Some(sentry_core::protocol::Context::Trace(t)) => t.status,
                        _ => None,
                    };
                    self.0.lock().unwrap().push(status);
                }
            }
        }
    }

    impl Capture {
        fn finished(&self) -> Vec<Option<SpanStatus>> {
            self.0.lock().unwrap().clone()
        }
    }

    /// A body of scripted frames; checks that each poll runs inside the
    /// request's root span.
    struct Script {
        frames: VecDeque<Result<&'static str, &'static str>>,
        /// Whether it says it has ended once its frames are gone (as a
        /// body of known length does), instead of answering `None`.
        says_end: bool,
    }

    impl Body for Script {
        type Data = &'static [u8];
        type Error = &'static str;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
            assert_eq!(
                tracing::Span::current().metadata().map(|m| m.name()),
                Some("http.request"),
                "polled inside the request's root span"
            );
            Poll::Ready(
                self.frames
                    .pop_front()
                    .map(|f| f.map(|s| Frame::data(s.as_bytes()))),
            )
        }

        fn is_end_stream(&self) -> bool {
            self.says_end && self.frames.is_empty()
        }
    }

    /// Counts closed `http.request` spans.
    struct Closes(Arc<AtomicUsize>);

    impl<S> Layer<S> for Closes
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    {
        fn on_close(&self, id: tracing::span::Id, ctx: LayerContext<'_, S>) {
            if ctx.span(&id).is_some_and(|s| s.name() == "http.request") {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// A service answering one scripted response.
    struct Respond(Option<Response<Script>>);

    impl Service<Request<()>> for Respond {
        type Response = Response<Script>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Response<Script>, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            std::future::ready(Ok(self.0.take().expect("one request")))
        }
    }

    /// A hub whose client captures transactions, and a tracing registry
    /// that counts closed root spans, both bound to this thread only.
    struct Harness {
        capture: Arc<Capture>,
        closed: Arc<AtomicUsize>,
        hub: Arc<Hub>,
        dispatch: tracing::Dispatch,
    }

    impl Harness {
        fn new() -> Self {
            let capture = Arc::new(Capture::default());
            let mut options = ClientOptions::new().traces_sample_rate(1.0);
            options.dsn = "https://public@sentry.invalid/1".parse().ok();
            options.transport = Some(Arc::new(Arc::clone(&capture)));
            let hub = Arc::new(Hub::new(
                Some(Arc::new(Client::from(options))),
                Arc::new(Default::default()),
            ));
            let closed = Arc::new(AtomicUsize::new(0));
            let dispatch = tracing::Dispatch::new(
                tracing_subscriber::registry().with(Closes(Arc::clone(&closed))),
            );
            Self {
                capture,
                closed,
                hub,
                dispatch,
            }
        }

        fn run<R>(&self, f: impl FnOnce() -> R) -> R {
            tracing::dispatcher::with_default(&self.dispatch, || Hub::run(Arc::clone(&self.hub), f))
        }

        /// The response `http_layer()` gives for `status` and `body`.
        fn respond(&self, status: StatusCode, body: Script) -> Response<ProfilingBody<Script>> {
            self.run(|| {
                let mut response = Response::new(body);
                *response.status_mut() = status;
                let mut service = crate::http_layer().layer(Respond(Some(response)));
                let future = service.call(Request::get("/x").body(()).expect("a request"));
                let mut future = std::pin::pin!(future);
                match future
                    .as_mut()
                    .poll(&mut Context::from_waker(Waker::noop()))
                {
                    Poll::Ready(Ok(response)) => response,
                    _ => unreachable!("the response is ready"),
                }
            })
        }

        fn poll(&self, body: &mut ProfilingBody<Script>) -> Option<Result<(), &'static str>> {
            self.run(
                || match Pin::new(body).poll_frame(&mut Context::from_waker(Waker::noop())) {
                    Poll::Ready(frame) => frame.map(|f| f.map(drop)),
                    Poll::Pending => unreachable!("a script is never pending"),
                },
            )
        }

        /// The statuses of the transactions sent, and how many root spans
        /// closed.
        fn ended(&self) -> (Vec<Option<SpanStatus>>, usize) {
            (self.capture.finished(), self.closed.load(Ordering::SeqCst))
        }
    }

    fn script(frames: &[Result<&'static str, &'static str>], says_end: bool) -> Script {
        Script {
            frames: frames.iter().copied().collect(),
            says_end,
        }
    }

    #[test]
    fn a_request_ends_with_its_body_not_its_response() {
        let h = Harness::new();
        let mut body = h
            .respond(StatusCode::OK, script(&[Ok("a"), Ok("b")], false))
            .into_body();
        assert_eq!(h.ended(), (vec![], 0), "the response alone ends nothing");
        assert_eq!(h.poll(&mut body), Some(Ok(())));
        assert_eq!(h.poll(&mut body), Some(Ok(())));
        assert_eq!(h.ended(), (vec![], 0));
        assert_eq!(h.poll(&mut body), None);
        assert_eq!(h.ended(), (vec![Some(SpanStatus::Ok)], 1));
        drop(body);
        assert_eq!(h.ended(), (vec![Some(SpanStatus::Ok)], 1), "ended once");
    }

    #[test]
    fn a_body_that_says_it_ended_ends_the_request_with_its_last_frame() {
        let h = Harness::new();
        let mut body = h
            .respond(StatusCode::OK, script(&[Ok("a")], true))
            .into_body();
        assert_eq!(h.poll(&mut body), Some(Ok(())));
        assert_eq!(h.ended(), (vec![Some(SpanStatus::Ok)], 1));
        assert!(body.is_end_stream());
    }

    #[test]
    fn a_failing_body_ends_the_request_as_an_internal_error() {
        let h = Harness::new();
        let mut body = h
            .respond(StatusCode::OK, script(&[Ok("a"), Err("cut")], false))
            .into_body();
        assert_eq!(h.poll(&mut body), Some(Ok(())));
        assert_eq!(h.poll(&mut body), Some(Err("cut")));
        assert_eq!(h.ended(), (vec![Some(SpanStatus::InternalError)], 1));
    }

    #[test]
    fn a_body_never_polled_ends_the_request_when_dropped() {
        // A `HEAD` request, or a client gone before the body was sent.
        let h = Harness::new();
        let response = h.respond(StatusCode::NOT_FOUND, script(&[Ok("a")], false));
        assert_eq!(h.ended(), (vec![], 0));
        drop(response);
        assert_eq!(h.ended(), (vec![Some(SpanStatus::NotFound)], 1));
    }

    #[test]
    fn a_body_dropped_midway_keeps_the_response_status() {
        let h = Harness::new();
        let mut body = h
            .respond(StatusCode::OK, script(&[Ok("a"), Ok("b")], false))
            .into_body();
        assert_eq!(h.poll(&mut body), Some(Ok(())));
        drop(body);
        assert_eq!(h.ended(), (vec![Some(SpanStatus::Ok)], 1));
    }
}
