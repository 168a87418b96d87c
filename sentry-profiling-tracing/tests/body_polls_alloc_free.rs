//! Polling a response body through `http_layer()` allocates nothing: each
//! poll enters the request's root span (as each poll of the handler's
//! future does) and runs under its hub, and neither the wrapper nor the
//! profiling layer reaches the allocator for it. A counting global
//! allocator (its own test file: it serves the whole process) counts the
//! calls the polling thread makes over 500 polls of a streamed body.
//!
//! With `sentry-tracing`'s `SpanLayer` also registered, entering a span it
//! tracks costs its own allocations (it binds a fresh hub per entry, on
//! every poll of the handler's future too); that figure is printed, not
//! asserted: it is sentry-tracing's.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http_body::{Body, Frame};
use sentry_core::{Client, ClientOptions, Hub};
use tower_layer::Layer as _;
use tower_service::Service;
use tracing_subscriber::prelude::*;

#[path = "../../sentry-profiling/tests/support/counting_alloc.rs"]
mod counting_alloc;

use counting_alloc::{Counting, tracked};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const POLLS: u64 = 500;

/// The context word the body's last poll ran with: its request's lane.
static POLLED_IN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A streamed body: `left` frames of static bytes, then its end.
struct Stream {
    left: u64,
}

impl Body for Stream {
    type Data = &'static [u8];
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        self.left -= 1;
        POLLED_IN.store(
            sentry_profiling::hooks::thread_context(),
            std::sync::atomic::Ordering::Relaxed,
        );
        Poll::Ready(Some(Ok(Frame::data(&b"event\n"[..]))))
    }
}

/// A service answering one streamed response.
struct Respond(Option<http::Response<Stream>>);

impl Service<http::Request<()>> for Respond {
    type Response = http::Response<Stream>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<()>) -> Self::Future {
        std::future::ready(Ok(self.0.take().expect("one request")))
    }
}

/// Allocator calls per poll of a body through `http_layer()`, with
/// `dispatch` as this thread's subscriber, after a few polls to warm up
/// (thread-local stacks grow once).
fn calls_per_poll(dispatch: &tracing::Dispatch) -> f64 {
    let hub = Arc::new(Hub::new(Some(client()), Arc::new(Default::default())));
    tracing::dispatcher::with_default(dispatch, || {
        Hub::run(hub, || {
            let response = http::Response::new(Stream { left: POLLS + 10 });
            let mut service = sentry_profiling_tracing::http_layer().layer(Respond(Some(response)));
            let future = service.call(http::Request::get("/s").body(()).expect("a request"));
            let mut cx = Context::from_waker(Waker::noop());
            let mut future = std::pin::pin!(future);
            let Poll::Ready(Ok(response)) = future.as_mut().poll(&mut cx) else {
                unreachable!("the response is ready");
            };
            let mut body = std::pin::pin!(response.into_body());
            for _ in 0..10 {
                assert!(matches!(
                    body.as_mut().poll_frame(&mut cx),
                    Poll::Ready(Some(Ok(_)))
                ));
            }
            let ((), calls) = tracked(|| {
                for _ in 0..POLLS {
                    let frame = body.as_mut().poll_frame(&mut cx);
                    // Matched, not dropped as a whole: a frame's data is static.
                    assert!(matches!(frame, Poll::Ready(Some(Ok(_)))));
                }
            });
            assert!(
                sentry_profiling::hooks::is_lane(
                    POLLED_IN.load(std::sync::atomic::Ordering::Relaxed)
                ),
                "the body is polled in its request's lane"
            );
            calls as f64 / POLLS as f64
        })
    })
}

/// A client whose transactions go nowhere, profiling with lanes (the trace
/// lifecycle: the request's root span starts the profiler and gets a
/// lane, so each poll sets the thread's context word).
fn client() -> Arc<Client> {
    static CLIENT: std::sync::OnceLock<Arc<Client>> = std::sync::OnceLock::new();
    CLIENT
        .get_or_init(|| {
            let mut options = ClientOptions::new().traces_sample_rate(1.0);
            options.dsn = "https://public@sentry.invalid/1".parse().ok();
            options.transport = Some(Arc::new(|_: &ClientOptions| {
                Arc::new(NoTransport) as Arc<dyn sentry_core::Transport>
            }));
            let options = sentry_profiling::ProfilingIntegration::new()
                .profile_session_sample_rate(1.0)
                .profile_lifecycle(sentry_profiling::ProfileLifecycle::Trace)
                .apply(options);
            Arc::new(Client::from(options))
        })
        .clone()
}

struct NoTransport;

impl sentry_core::Transport for NoTransport {
    fn send_envelope(&self, _: sentry_core::Envelope) {}
}

#[test]
fn body_polls_allocate_nothing() {
    let ours = tracing::Dispatch::new(
        tracing_subscriber::registry().with(sentry_profiling_tracing::layer()),
    );
    let calls = calls_per_poll(&ours);
    println!("allocator calls per body poll, http_layer() and the profiling layer: {calls}");
    assert_eq!(calls, 0.0, "a body poll allocates");

    let with_sentry_tracing = tracing::Dispatch::new(
        tracing_subscriber::registry()
            .with(sentry_tracing::SpanLayer::new())
            .with(sentry_profiling_tracing::layer()),
    );
    println!(
        "allocator calls per body poll with sentry-tracing's SpanLayer too: {}",
        calls_per_poll(&with_sentry_tracing)
    );
}
