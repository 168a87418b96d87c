//! What noting a wake costs: the waker `sentry-profiling-tracing` wraps
//! around each poll of an instrumented future (`http_layer()`'s,
//! `spawn_in_span`'s, `.profiled()`) reads the clock, records the first wake
//! since the poll began and wakes the task's own waker.
//!
//! Criterion can only time a wake together with the poll that arms it
//! again (the first wake after a poll is the one that records), so four
//! loops are timed, each on one thread with a no-op task waker:
//!
//! - `profiled/poll_wake` and `profiled/poll`: a `.profiled()` future whose
//!   inner future keeps its context's waker, polled (and woken) per
//!   iteration;
//! - `bare/poll_wake` and `bare/poll`: the same inner future, not wrapped.
//!
//! A wake's own cost is `(profiled/poll_wake − profiled/poll) −
//! (bare/poll_wake − bare/poll)`: what the wrapping waker adds to a wake of
//! the task's waker. A profiling session runs (manual lifecycle, the
//! sampler not started), as the wrapper notes wakes only then.
//! `cargo bench -p sentry-profiling-benches --bench wake`.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use criterion::{Criterion, criterion_group, criterion_main};
use sentry_profiling_tracing::ProfiledExt;

/// A future that is never ready and keeps the waker of its latest poll.
struct KeepsWaker(Arc<Mutex<Option<Waker>>>);

impl Future for KeepsWaker {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut kept = self.0.lock().unwrap();
        match kept.as_ref() {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => *kept = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

fn bench<F: Future>(c: &mut Criterion, name: &str, make: impl Fn(KeepsWaker) -> F) {
    let kept = Arc::new(Mutex::new(None::<Waker>));
    let mut fut = Box::pin(make(KeepsWaker(Arc::clone(&kept))));
    let mut cx = Context::from_waker(Waker::noop());
    let _ = fut.as_mut().poll(&mut cx);
    let waker = kept.lock().unwrap().clone().expect("a waker");
    c.bench_function(&format!("{name}/poll_wake"), |b| {
        b.iter(|| {
            let _ = fut.as_mut().poll(&mut cx);
            waker.wake_by_ref();
        })
    });
    c.bench_function(&format!("{name}/poll"), |b| {
        b.iter(|| {
            let _ = fut.as_mut().poll(&mut cx);
        })
    });
}

fn wake(c: &mut Criterion) {
    let mut options = sentry::ClientOptions::new();
    options.dsn = sentry_profiling_examples::LOCAL_DSN.parse().ok();
    options.transport = Some(std::sync::Arc::new(|_: &sentry::ClientOptions| {
        std::sync::Arc::new(sentry_profiling_tests::CaptureTransport::default())
            as std::sync::Arc<dyn sentry::Transport>
    }));
    let _guard = sentry::init(
        sentry_profiling::ProfilingIntegration::new()
            .profile_session_sample_rate(1.0)
            .apply(options),
    );
    bench(c, "profiled", |f| f.profiled());
    bench(c, "bare", |f| f);
}

criterion_group!(benches, wake);
criterion_main!(benches);
