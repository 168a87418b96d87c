//! The trace lifecycle, through `sentry::init` and real tracing spans: the
//! first sampled root span starts the profiler, overlapping roots keep it
//! running, the last one ending stops it once its chunk has finished (as
//! the spec says: no wake-up per request), and unsampled roots never start
//! it. Every transaction it profiled links to a chunk that Relay accepts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sentry_profiling::{ProfileLifecycle, ProfilingIntegration};
use sentry_profiling_tests::{CaptureTransport, link_problem, relay_violations, split_items};
use tracing_subscriber::prelude::*;

fn running() -> bool {
    sentry_profiling::hooks::session()
        .and_then(|s| s.running_profiler_id())
        .is_some()
}

/// Waits until the sampler has ticked a few more times (it is running) or
/// a while has passed without ticks (it is paused); returns the tick delta.
fn ticks_over(d: Duration) -> u64 {
    let before = sentry_profiling::stats().unwrap().sampler.ticks;
    std::thread::sleep(d);
    sentry_profiling::stats().unwrap().sampler.ticks - before
}

#[inline(never)]
fn busy_for(d: Duration) {
    let until = Instant::now() + d;
    let mut x = 0u64;
    while Instant::now() < until {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}

/// The chunk length: the profiler stops at most this long (plus a
/// profiler tick) after the last root span ended.
const CHUNK: Duration = Duration::from_secs(1);

/// Waits until the profiler has stopped (its chunk finished), at most
/// twice the chunk length plus a margin; returns how long it took.
fn wait_stopped() -> Duration {
    let t = Instant::now();
    while running() && t.elapsed() < CHUNK * 2 + Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(20));
    }
    t.elapsed()
}

#[test]
fn roots_start_and_stop_the_profiler() {
    let capture = CaptureTransport::new();
    let mut options = sentry::ClientOptions::new().traces_sampler(|ctx| {
        if ctx.name().starts_with("unsampled") {
            0.0
        } else {
            1.0
        }
    });
    options.dsn = "https://public@sentry.invalid/1".parse().ok();
    options.release = Some("lifecycle-test@1".into());
    options.transport = Some(capture.factory());
    let guard = sentry::init(
        ProfilingIntegration::new()
            .profile_session_sample_rate(1.0)
            .profile_lifecycle(ProfileLifecycle::Trace)
            .chunk_duration(CHUNK)
            .apply(options),
    );
    let subscriber = tracing_subscriber::registry()
        .with(sentry::integrations::tracing::SpanLayer::new())
        .with(sentry_profiling_tracing::layer());
    let _default = tracing::subscriber::set_default(subscriber);

    // Give the profiler thread time to create the (paused) sampler.
    std::thread::sleep(Duration::from_millis(200));
    assert!(!running(), "nothing runs before the first root span");
    assert_eq!(
        ticks_over(Duration::from_millis(200)),
        0,
        "sampler paused at start"
    );

    // An unsampled root never starts it.
    {
        let span = tracing::info_span!("unsampled root");
        let _e = span.enter();
        assert!(
            !running(),
            "an unsampled root span must not start the profiler"
        );
        busy_for(Duration::from_millis(100));
    }
    assert_eq!(ticks_over(Duration::from_millis(150)), 0);

    // Overlapping sampled roots: started by the first, kept by the second.
    let a = tracing::info_span!("root a");
    let b = tracing::info_span!("root b");
    a.in_scope(|| busy_for(Duration::from_millis(150)));
    assert!(running(), "the first sampled root span starts the profiler");
    b.in_scope(|| busy_for(Duration::from_millis(150)));
    drop(a);
    assert!(running(), "an overlapping root keeps it running");
    // While every thread waits the sampler dozes (the next tick stands for
    // the periods slept through): its ticks are counted while the
    // application runs.
    let before = sentry_profiling::stats().unwrap().sampler.ticks;
    b.in_scope(|| busy_for(Duration::from_millis(200)));
    let ticks = sentry_profiling::stats().unwrap().sampler.ticks - before;
    assert!(ticks > 5, "sampler ticks while a root is active ({ticks})");
    drop(b);
    // The spec stops the profiler when no root span is active "letting the
    // current chunk finish": it runs on to the end of its chunk, so a
    // service whose requests come and go pays no wake-up per request.
    assert!(running(), "the chunk in progress finishes first");
    assert!(
        ticks_over(Duration::from_millis(100)) > 0,
        "the sampler ticks on until the chunk ends"
    );
    let took = wait_stopped();
    assert!(!running(), "the last root span ending stops it ({took:?})");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        ticks_over(Duration::from_millis(200)),
        0,
        "no ticks once the chunk of the last root ended"
    );

    // A later root starts it again, in the same session.
    let profiler_id = {
        let c = tracing::info_span!("root c");
        let _e = c.enter();
        busy_for(Duration::from_millis(150));
        sentry_profiling::hooks::session()
            .and_then(|s| s.running_profiler_id())
            .unwrap()
    };
    wait_stopped();
    assert!(!running());
    drop(_default);
    drop(guard);

    let (chunks, transactions) = split_items(&capture.envelopes());
    assert!(!chunks.is_empty(), "the open chunk was sent at shutdown");
    for c in &chunks {
        assert_eq!(
            c.payload["profiler_id"], &*profiler_id,
            "one profiler_id per session"
        );
        let v = relay_violations(c);
        assert!(v.is_empty(), "{v:?}");
    }
    let names: Vec<&str> = transactions
        .iter()
        .filter_map(|t| t["transaction"].as_str())
        .collect();
    assert_eq!(
        names.len(),
        3,
        "three sampled transactions, the unsampled one not sent: {names:?}"
    );
    for tx in &transactions {
        if let Some(p) = link_problem(tx, &chunks) {
            panic!("{p}");
        }
    }
    let _ = Arc::strong_count(&capture);
}
