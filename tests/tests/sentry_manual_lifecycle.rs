//! The manual lifecycle: `start_profiler`/`stop_profiler` with the spec's
//! no-op rules; `flush` sends the chunk in progress; a transaction recorded
//! while the profiler runs links to it.

use std::time::{Duration, Instant};

use sentry_profiling::{ProfileLifecycle, ProfilingIntegration};
use sentry_profiling_tests::{CaptureTransport, link_problem, relay_violations, split_items};
use tracing_subscriber::prelude::*;

#[inline(never)]
fn manual_busy(d: Duration) {
    let until = Instant::now() + d;
    let mut x = 0u64;
    while Instant::now() < until {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}

fn ticks() -> u64 {
    sentry_profiling::stats().unwrap().sampler.ticks
}

#[test]
fn start_stop_and_flush() {
    let capture = CaptureTransport::new();
    let mut options = sentry::ClientOptions::new().traces_sample_rate(1.0);
    options.dsn = "https://public@sentry.invalid/1".parse().ok();
    options.debug = true;
    options.transport = Some(capture.factory());
    let guard = sentry::init(
        ProfilingIntegration::new()
            .profile_session_sample_rate(1.0)
            .apply(options),
    );
    let _default = tracing::subscriber::set_default(
        tracing_subscriber::registry()
            .with(sentry::integrations::tracing::SpanLayer::new())
            .with(sentry_profiling_tracing::layer()),
    );
    assert_eq!(
        sentry_profiling::hooks::session().map(|s| s.lifecycle()),
        Some(ProfileLifecycle::Manual)
    );
    std::thread::sleep(Duration::from_millis(200));

    // Stopping before starting, and root spans, do nothing in manual mode.
    sentry_profiling::stop_profiler();
    tracing::info_span!("a root span").in_scope(|| manual_busy(Duration::from_millis(50)));
    let t0 = ticks();
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(
        ticks(),
        t0,
        "manual mode: nothing runs before start_profiler()"
    );

    sentry_profiling::start_profiler();
    sentry_profiling::start_profiler(); // no-op: already running
    tracing::info_span!("profiled request").in_scope(|| manual_busy(Duration::from_millis(300)));
    assert!(ticks() > t0 + 10, "start_profiler() starts sampling");
    assert!(
        sentry::Hub::current()
            .client()
            .unwrap()
            .flush(Some(Duration::from_secs(2)))
    );
    let after_flush = split_items(&capture.envelopes()).0.len();
    assert!(after_flush >= 1, "flush sends the chunk in progress");

    sentry_profiling::stop_profiler();
    sentry_profiling::stop_profiler(); // no-op: not running
    std::thread::sleep(Duration::from_millis(50));
    let t1 = ticks();
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(ticks(), t1, "stop_profiler() stops sampling");

    // It can be started again.
    sentry_profiling::start_profiler();
    manual_busy(Duration::from_millis(100));
    assert!(ticks() > t1);
    drop(_default);
    drop(guard);

    let (chunks, transactions) = split_items(&capture.envelopes());
    assert!(
        chunks.len() > after_flush,
        "the last chunk was sent at shutdown"
    );
    for c in &chunks {
        let v = relay_violations(c);
        assert!(v.is_empty(), "{v:?}");
    }
    let profiled: Vec<_> = transactions
        .iter()
        .filter(|t| t["transaction"] == "profiled request")
        .collect();
    assert_eq!(profiled.len(), 1);
    assert_eq!(link_problem(profiled[0], &chunks), None);
    let before: Vec<_> = transactions
        .iter()
        .filter(|t| t["transaction"] == "a root span")
        .collect();
    assert_eq!(before.len(), 1);
    assert!(
        before[0].pointer("/contexts/profile").is_none(),
        "a transaction from before start_profiler() is not linked"
    );
}
