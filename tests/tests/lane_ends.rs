//! A finished request is known as finished within one batch: while the
//! sampler samples, its thread hands the chunk thread its samples and the
//! threads' context-word changes every 100 ms, and the chunk thread reads
//! the lane queue with each batch (not only at its idle tick, a second), so
//! a lane's places in the lane queue are free again, and it stops being
//! "open", about 100 ms after its root span closed. And no `(suspended)`
//! fill-in is filed under a lane later than one period after its end: the
//! fill-ins follow the lane's end as stamped, not when it was read.
//!
//! Requests are real root spans on a Tokio runtime (awaiting, then burning
//! CPU), one after another, under the trace lifecycle.

use std::time::{Duration, Instant};

use sentry_profiling::{ProfileLifecycle, ProfilingIntegration};
use sentry_profiling_tests::{
    CaptureTransport, chunk_samples, functions_in_window, split_items, timestamp_secs,
};
use sentry_view::SUSPENDED_FUNCTION;
use serde_json::Value;
use tracing::Instrument;
use tracing_subscriber::prelude::*;

const REQUESTS: usize = 60;

#[inline(never)]
fn burn(d: Duration) {
    let until = Instant::now() + d;
    let mut x = 0u64;
    while Instant::now() < until {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}

fn in_flight() -> u64 {
    sentry_profiling::stats().map_or(0, |s| s.lanes_in_flight)
}

#[test]
fn lane_ends_are_known_within_one_batch() {
    let capture = CaptureTransport::new();
    let mut options = sentry::ClientOptions::new().traces_sample_rate(1.0);
    options.dsn = "https://public@sentry.invalid/1".parse().ok();
    options.release = Some("lane-ends@1".into());
    options.transport = Some(capture.factory());
    let guard = sentry::init(
        ProfilingIntegration::new()
            .profile_session_sample_rate(1.0)
            .profile_lifecycle(ProfileLifecycle::Trace)
            .apply(options),
    );
    let subscriber = tracing_subscriber::registry()
        .with(sentry::integrations::tracing::SpanLayer::new())
        .with(sentry_profiling_tracing::layer());
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let period = Duration::from_nanos(1_000_000_000 / 101);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut known_after = Vec::with_capacity(REQUESTS);
    for i in 0..REQUESTS {
        let span = tracing::info_span!("GET /lane-end", request = i);
        rt.block_on(
            async {
                // 22 ms: long enough for Sentry to link (a shorter
                // request gets no lane, see `short_request_lanes`).
                tokio::time::sleep(Duration::from_millis(14)).await;
                burn(Duration::from_millis(8));
            }
            .instrument(span),
        );
        // The root span closed when the future completed.
        let ended = Instant::now();
        assert!(in_flight() <= 1, "requests run one after another");
        while in_flight() > 0 && ended.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_micros(200));
        }
        known_after.push(ended.elapsed());
    }
    drop(rt);
    let stats = sentry_profiling::stats().unwrap();
    drop(guard);

    known_after.sort();
    let median = known_after[REQUESTS / 2];
    let p90 = known_after[REQUESTS * 9 / 10];
    eprintln!(
        "lane end known after: median {median:?}, p90 {p90:?}, max {:?} (period {period:?})",
        known_after[REQUESTS - 1]
    );
    assert_eq!(stats.lanes_registered, REQUESTS as u64, "{stats:?}");
    assert_eq!(stats.lane_events_dropped, 0);
    // Read with the next batch: at most 100 ms after the end (these
    // requests start right after the batch that read the one before, so
    // close to it), plus the sampler thread's tick (a light doze between
    // requests delays it up to 4 periods), the chunk thread's wake-up and
    // this thread's polling, which a busy machine delays. The bound leaves
    // 5 periods for those; the idle tick alone would give 500 ms or more.
    let batch = Duration::from_millis(100);
    assert!(
        median <= batch + 5 * period,
        "a lane's end was known {median:?} after it (median), over one batch (+ 5 periods)"
    );

    let (chunks, transactions) = split_items(&capture.envelopes());
    assert_eq!(transactions.len(), REQUESTS);
    let mut lane_samples: std::collections::HashMap<String, usize> = Default::default();
    for c in &chunks {
        for s in chunk_samples(c) {
            if let Some(t) = s.get("thread_id").and_then(Value::as_str) {
                *lane_samples.entry(t.to_owned()).or_default() += 1;
            }
        }
    }
    let slack = period.as_secs_f64();
    let mut late_captures = Vec::new();
    for tx in &transactions {
        let lane = tx
            .pointer("/contexts/trace/data/thread.id")
            .and_then(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .or_else(|| v.as_u64().map(|n| n.to_string()))
            })
            .expect("every transaction carries its thread.id");
        let end = timestamp_secs(&tx["timestamp"]).unwrap();
        let n = lane_samples.get(&lane).copied().unwrap_or(0);
        assert!(n >= 2, "lane {lane} has {n} samples");
        for c in &chunks {
            for stack in functions_in_window(c, Some(&lane), end + slack, f64::MAX) {
                // The lane table's own samples (fill-ins, end samples) stop
                // at the lane's end: none may come a period later.
                assert!(
                    !stack.iter().any(|f| f == SUSPENDED_FUNCTION),
                    "lane {lane} got a fill-in more than one period after its end ({end})"
                );
                late_captures.push(stack.first().cloned().unwrap_or_default());
            }
        }
    }
    // Captured stacks stamped with a lane after its end come from the
    // sampler's per-thread context history, not from the lane table; they
    // are outside the transaction's window, so Sentry does not show them
    // for it. Reported, not asserted here.
    if !late_captures.is_empty() {
        eprintln!(
            "{} captured samples filed under a lane more than one period after its end (leaf functions: {:?})",
            late_captures.len(),
            late_captures.iter().take(5).collect::<Vec<_>>()
        );
    }
}
