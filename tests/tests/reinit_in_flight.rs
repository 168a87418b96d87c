//! The SDK initialised again while a request is in flight, through
//! `sentry::init` and real tracing spans: the request ends in the session
//! it began in, and the new session's count of live roots, and so its
//! decision to pause, is its own. Request R1 begins, the guard is dropped,
//! the SDK is initialised again (1 s chunks), R2 begins, R1 ends, and R2
//! burns CPU for three chunks: the new session keeps sampling R2 for all of
//! it, and stops once R2 has ended.

use std::time::{Duration, Instant};

use sentry_profiling::{ProfileLifecycle, ProfilingIntegration};
use sentry_profiling_tests::clients::thread_cpu;
use sentry_profiling_tests::{CaptureTransport, functions_in_window, split_items};
use serde_json::Value;
use tracing_subscriber::prelude::*;

/// The chunk length: a session with no live root pauses at the end of its
/// chunk, so R2 outlasting three of them would show a wrong count.
const CHUNK: Duration = Duration::from_secs(1);

fn running() -> bool {
    sentry_profiling::hooks::session()
        .and_then(|s| s.running_profiler_id())
        .is_some()
}

fn init(capture: &std::sync::Arc<CaptureTransport>) -> sentry::ClientInitGuard {
    let mut options = sentry::ClientOptions::new().traces_sample_rate(1.0);
    options.dsn = "https://public@sentry.invalid/1".parse().ok();
    options.release = Some("reinit-test@1".into());
    options.transport = Some(capture.factory());
    let guard = sentry::init(
        ProfilingIntegration::new()
            .profile_session_sample_rate(1.0)
            .profile_lifecycle(ProfileLifecycle::Trace)
            .chunk_duration(CHUNK)
            .apply(options),
    );
    // Give the chunk thread time to create the (paused) sampler.
    std::thread::sleep(Duration::from_millis(200));
    guard
}

#[inline(never)]
fn reinit_burn(d: Duration) {
    let until = Instant::now() + d;
    let mut x = 0u64;
    while Instant::now() < until {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}

#[test]
fn a_request_in_flight_across_a_new_init_ends_in_its_own_session() {
    let subscriber = tracing_subscriber::registry()
        .with(sentry::integrations::tracing::SpanLayer::new())
        .with(sentry_profiling_tracing::layer());
    let _default = tracing::subscriber::set_default(subscriber);

    let first = CaptureTransport::new();
    let guard = init(&first);
    // R1 begins in the first session (which counts it as a live root) and
    // is still in flight when that session shuts down.
    let r1 = tracing::info_span!("r1");
    r1.in_scope(|| reinit_burn(Duration::from_millis(50)));
    assert!(running(), "R1 started the first session's profiler");
    drop(guard);

    let second = CaptureTransport::new();
    let guard = init(&second);
    assert!(
        !running(),
        "nothing runs in the new session before its root"
    );
    let r2 = tracing::info_span!("r2");
    let entered = r2.enter();
    assert!(running(), "R2 started the new session's profiler");
    // R1 ends now: its hold goes back to the first session, not this one.
    drop(r1);
    let cpu_before = thread_cpu();
    reinit_burn(3 * CHUNK);
    let cpu = thread_cpu() - cpu_before;
    assert!(
        running(),
        "the new session still samples its live root R2 after three chunk ends"
    );
    drop(entered);
    drop(r2);
    // With R2 gone the session has no live root: it stops at its chunk's
    // end (twice the chunk, and a margin for a busy machine, at most).
    let t = Instant::now();
    while running() && t.elapsed() < CHUNK * 2 + Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !running(),
        "no live root is left counted in the new session"
    );
    drop(guard);

    let (chunks, transactions) = split_items(&second.envelopes());
    let r2 = transactions
        .iter()
        .find(|t| t["transaction"] == "r2")
        .expect("R2's transaction was sent");
    let thread = r2
        .pointer("/contexts/trace/data/thread.id")
        .and_then(Value::as_str)
        .expect("R2 is tagged with its thread");
    let (start, end) = sentry_profiling_tests::transaction_window(r2).expect("R2's window");
    let burning = chunks
        .iter()
        .flat_map(|c| functions_in_window(c, Some(thread), start, end))
        .filter(|stack| stack.iter().any(|f| f.contains("reinit_burn")))
        .count();
    // Each capture is taken by the thread's own CPU-time timer after one
    // period of its CPU time (101 Hz), so a sampler that runs throughout
    // shows about `cpu / period` captures of `reinit_burn`, however busy
    // the machine (less CPU means fewer captures, not fewer per CPU
    // second). A sampler paused at a chunk's end, as a root counted one
    // too few causes, shows at most the first of the three chunks: about a
    // third. Half separates the two with room for lost captures.
    let period = Duration::from_secs(1) / 101;
    let shown = period * burning as u32;
    let share = shown.as_secs_f64() / cpu.as_secs_f64();
    assert!(
        share >= 0.5,
        "R2's profile shows reinit_burn for {shown:?} of its {cpu:?} of CPU ({share:.2})"
    );
}
