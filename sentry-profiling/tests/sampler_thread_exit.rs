//! A thread that blocks inside a request and exits right after keeps the
//! request's samples, with the function it blocked in: the sampler learns
//! where it blocked (read from `/proc`, unwound without the frame-pointer
//! register), and the periods it held for the request (waiting for the
//! request's first captured stack, which never comes) leave with that
//! stack when the thread is found gone, instead of being dropped with it.
//!
//! Before: a Tokio runtime shut down right after a request that blocked
//! its worker lost that request's last periods (`tokio_waits` failed now
//! and then), and, beside busy threads, about one run in 30 of this test
//! took a stale pointer to a static on the stack for a frame record, so
//! the blocked stack ended two frames above the system call.

#[path = "support/names.rs"]
mod names;

use std::time::Duration;

use sentry_profiling::hooks::{current_thread_id, set_thread_context};
use sentry_profiling::{Sampler, SamplerConfig, Symbolizer};

/// How long the request blocks its thread: less than the 100 ms a period
/// of a request waits for the request's first captured stack (so those
/// periods are still held when the thread exits), and long enough for a
/// sampler starved of CPU beside busy threads to look at it while blocked.
const BLOCK: Duration = Duration::from_millis(90);

#[inline(never)]
fn blocked_in_request() {
    std::thread::sleep(BLOCK);
    std::hint::black_box(());
}

/// Burns about `ms` milliseconds of the thread's time (less than a
/// sampling period: no timer capture is due).
#[inline(never)]
fn spin(ms: u64) -> u64 {
    let until = std::time::Instant::now() + Duration::from_millis(ms);
    let mut x = 1u64;
    while std::time::Instant::now() < until {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
    x
}

#[test]
fn a_thread_that_exits_right_after_blocking_in_a_request_keeps_its_samples() {
    // The request's context word, as the tracing layer publishes a lane.
    let lane = sentry_profiling::hooks::next_lane();
    // Another thread keeps running, as a service's other work does: the
    // sampler ticks every period rather than dozing while the application
    // idles (a dozing one is woken by the session when a request begins).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                spin(1);
            }
        })
    };
    let worker = std::thread::Builder::new()
        .name("request-then-exit".into())
        .spawn(move || {
            // Parked first, as a worker waits for work: the sampler lists
            // the thread and learns where it waits outside any request.
            std::thread::sleep(Duration::from_millis(300));
            set_thread_context(lane);
            spin(1);
            blocked_in_request();
            set_thread_context(0);
            current_thread_id()
        })
        .unwrap();
    // Listed when the sampler starts.
    std::thread::sleep(Duration::from_millis(50));
    let sampler = Sampler::start(SamplerConfig::default()).expect("sampler starts");
    let tid = worker.join().unwrap();
    // The sampler finds the thread gone at a tick after it exited (a doze
    // may last half a second).
    std::thread::sleep(Duration::from_millis(800));
    let modules = sampler.modules();
    let mut samples: Vec<_> = sampler.try_iter().collect();
    let stats = sampler.stop();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    busy.join().unwrap();
    samples.retain(|s| u64::from(s.thread_id()) == tid);

    let mut sym = Symbolizer::new();
    let blocked = samples
        .iter()
        .filter(|s| s.context() == lane)
        .filter(|s| {
            names::function_names(&mut sym, &modules, s)
                .iter()
                .any(|n| n.ends_with("blocked_in_request"))
        })
        .count();
    // What each sample of the thread shows, for a failure's report.
    for s in &samples {
        let names = names::function_names(&mut sym, &modules, s);
        let top: Vec<_> = names.iter().take(4).collect();
        eprintln!("{} {:#x} {top:?}", s.timestamp_ns(), s.context());
    }
    eprintln!(
        "samples of the thread: {}, in the request where it blocked: {blocked}; {stats:?}",
        samples.len()
    );
    // 90 ms is nine periods at 101 Hz; a starved sampler may look late,
    // and periods after the thread was last seen alive are not known.
    assert!(
        blocked >= 3,
        "the request's periods where its thread blocked: {blocked} samples (of {} of the thread)",
        samples.len()
    );
}
