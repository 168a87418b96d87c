//! Work a request fans out to threads that live a few milliseconds (as
//! argon2 runs each hash on threads of its own) is in the profile: a real
//! axum service on loopback under concurrent load, its chunks read as
//! Sentry reads them.
//!
//! - `GET /scoped/{k}` hashes on `std::thread::scope` threads (8 threads of
//!   2 to 5 ms of CPU time each), started from Tokio's blocking pool, and
//!   `GET /rayon/{k}` on a rayon pool of 4 threads built for the request:
//!   the threads' CPU time shown in the profile (each sample weighted, as
//!   Sentry weights it, by the time to the next sample of its profile
//!   thread) must be at least 0.9 of what the kernel counted for their
//!   hashing (each thread reads its own CPU clock). Each capture of a
//!   thread stands for one period of the process timer (10 ms here, its
//!   shortest): with `W` periods of their CPU time the count's standard
//!   deviation is at most `sqrt(W)`, and the load goes on until each kind
//!   ran at least 600 periods, so 0.9 is more than two standard deviations
//!   away.
//! - `GET /in_span/{k}` hashes on four `scope_in_span` threads, which run
//!   in the request's span: at least 0.99 of the CPU samples under its
//!   transactions must be their own (`clients::own_and_other`), and at
//!   least half of them must show their client's CPU function. A request's
//!   threads burn 8 to 20 ms of CPU time, sampled by the process timer
//!   every 10 ms of CPU time until the sampler tracks them: a request
//!   has at least one capture with a probability of `1 - e^(-8/10)`,
//!   0.55, at the least.
//! - No sample is dropped for being its thread's only one in a chunk.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::Path;
use rayon::prelude::*;
use sentry_profiling_tests::clients::{
    assert_every_request_succeeded, captured_options, client_of, cpu, drive, own_and_other,
};
use sentry_profiling_tests::{
    CaptureTransport, ChunkItem, http_get, run_service_with, split_items,
};
use sentry_profiling_tracing::{scope_in_span, spawn_blocking_in_span};

const CLIENTS: u64 = 4;
const REQUESTS_PER_CLIENT: u64 = 36;
/// Threads per `/scoped` request, and work items per `/rayon` request.
const THREADS: u64 = 8;
/// The process timer's period (its shortest, longer than the test
/// options' 500 Hz sampling period).
const PERIOD_NS: u64 = 10_000_000;
/// Periods of CPU time each kind must run for the bound.
const MIN_PERIODS: u64 = 600;

/// CPU time the kernel counted for the short-lived threads' hashing, by
/// kind, after the warm-up.
static SCOPED_NS: AtomicU64 = AtomicU64::new(0);
static RAYON_NS: AtomicU64 = AtomicU64::new(0);
static IN_SPAN_NS: AtomicU64 = AtomicU64::new(0);

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec and the clock id a
    // constant the kernel knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Burns `ms` milliseconds of the thread's CPU time.
fn burn(ms: u64) -> u64 {
    let start = thread_cpu_ns();
    let mut x = 1u64;
    while thread_cpu_ns() - start < ms * 1_000_000 {
        for i in 0..2_000u64 {
            x = std::hint::black_box(x.rotate_left(5) ^ i).wrapping_mul(0x100_0000_01b3);
        }
    }
    x
}

#[inline(never)]
fn scoped_hash(ms: u64) -> u64 {
    std::hint::black_box(burn(ms))
}

/// Counts the CPU time it burned itself: a rayon worker also spends CPU
/// time looking for work, in rayon's own code.
#[inline(never)]
fn rayon_hash(ms: u64) -> u64 {
    let before = thread_cpu_ns();
    let x = std::hint::black_box(burn(ms));
    RAYON_NS.fetch_add(thread_cpu_ns() - before, Ordering::Relaxed);
    x
}

/// 2 to 5 ms, by request and item.
fn ms_for(k: u64, i: u64) -> u64 {
    2 + (k + i) % 4
}

/// `GET /scoped/{k}`: eight scoped threads, from the blocking pool.
async fn scoped(Path(k): Path<u64>) -> String {
    let x = spawn_blocking_in_span(move || {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|i| {
                    std::thread::Builder::new()
                        .name("scoped-hash".into())
                        .spawn_scoped(s, move || {
                            let x = scoped_hash(ms_for(k, i));
                            SCOPED_NS.fetch_add(thread_cpu_ns(), Ordering::Relaxed);
                            x
                        })
                        .expect("spawn")
                })
                .collect();
            handles
                .into_iter()
                .fold(0, |x, h| x ^ h.join().expect("scoped thread"))
        })
    })
    .await
    .expect("blocking task");
    format!("{x:x}\n")
}

/// `GET /rayon/{k}`: eight items on a pool of four threads built for the
/// request.
async fn rayon_route(Path(k): Path<u64>) -> String {
    let x = spawn_blocking_in_span(move || {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .thread_name(|_| "rayon-hash".into())
            .build()
            .expect("pool");
        let x = pool.install(|| {
            (0..THREADS)
                .into_par_iter()
                .map(|i| rayon_hash(ms_for(k, i)))
                .reduce(|| 0, |a, b| a ^ b)
        });
        drop(pool);
        x
    })
    .await
    .expect("blocking task");
    format!("{x:x}\n")
}

/// `GET /in_span/{k}`: four threads in the request's span burning the
/// client's own function.
async fn in_span(Path(k): Path<u64>) -> String {
    let x = spawn_blocking_in_span(move || {
        scope_in_span(|s| {
            let handles: Vec<_> = (0..4)
                .map(|i| {
                    s.spawn(move || {
                        let x = cpu(k, ms_for(k, i));
                        IN_SPAN_NS.fetch_add(thread_cpu_ns(), Ordering::Relaxed);
                        x
                    })
                })
                .collect();
            handles
                .into_iter()
                .fold(0, |x, h| x ^ h.join().expect("thread"))
        })
    })
    .await
    .expect("blocking task");
    format!("{x:x}\n")
}

/// Sentry's weighting: the time from each sample to the next sample of its
/// profile thread, summed over the samples (at or after `from`, Unix
/// seconds) whose stack holds `function`; and the part of it on the shared
/// timelines of short-lived threads.
fn shown_ns(chunks: &[ChunkItem], function: &str, from: f64) -> (u64, u64) {
    let (mut total, mut shared) = (0, 0);
    for chunk in chunks {
        let p = &chunk.payload["profile"];
        let frames = p["frames"].as_array().cloned().unwrap_or_default();
        let stacks = p["stacks"].as_array().cloned().unwrap_or_default();
        let holds = |stack_id: u64| {
            stacks[stack_id as usize]
                .as_array()
                .into_iter()
                .flatten()
                .any(|f| {
                    frames[f.as_u64().unwrap_or(0) as usize]["function"]
                        .as_str()
                        .is_some_and(|n| n.contains(function))
                })
        };
        let mut by_thread: std::collections::HashMap<&str, Vec<(f64, u64)>> =
            std::collections::HashMap::new();
        for s in p["samples"].as_array().into_iter().flatten() {
            let (Some(t), Some(ts), Some(st)) = (
                s["thread_id"].as_str(),
                s["timestamp"].as_f64(),
                s["stack_id"].as_u64(),
            ) else {
                continue;
            };
            by_thread.entry(t).or_default().push((ts, st));
        }
        for (thread, samples) in &mut by_thread {
            samples.sort_by(|a, b| a.0.total_cmp(&b.0));
            let on_shared = thread
                .parse::<u64>()
                .is_ok_and(|t| (SHORT_LIVED_BASE..LANE_BASE).contains(&t));
            for w in samples.windows(2) {
                if w[0].0 >= from && holds(w[0].1) {
                    let ns = ((w[1].0 - w[0].0) * 1e9).round() as u64;
                    total += ns;
                    shared += if on_shared { ns } else { 0 };
                }
            }
        }
    }
    (total, shared)
}

/// Profile thread ids of the short-lived threads' shared timelines start
/// here; the lanes' ids at `LANE_BASE`.
const SHORT_LIVED_BASE: u64 = 500_000_000;
const LANE_BASE: u64 = sentry_profiling::LANE_BASE;

#[test]
fn short_lived_threads_of_requests_show_their_cpu_time() {
    let capture = CaptureTransport::new();
    let options = captured_options(&capture);
    let app = axum::Router::new()
        .route("/scoped/{k}", axum::routing::get(scoped))
        .route("/rayon/{k}", axum::routing::get(rayon_route))
        .route("/in_span/{k}", axum::routing::get(in_span))
        .layer(sentry_profiling_tracing::http_layer());
    let (responses, from) = run_service_with(options, app, |addr, _| async move {
        // A warm-up of each kind: the sampler starts with the first
        // request, and arms its process-wide timer once it has seen
        // threads come and go.
        for _ in 0..3 {
            for kind in ["scoped", "rayon", "in_span"] {
                http_get(addr, format!("/{kind}/0")).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        SCOPED_NS.store(0, Ordering::Relaxed);
        RAYON_NS.store(0, Ordering::Relaxed);
        IN_SPAN_NS.store(0, Ordering::Relaxed);
        let before = sentry_profiling::stats().map(|s| s.sampler);
        let from = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64();
        // Rounds of load until both kinds ran enough periods (a minute at
        // most: the check below then says so).
        let started = std::time::Instant::now();
        let mut responses = Vec::new();
        while (SCOPED_NS.load(Ordering::Relaxed) < MIN_PERIODS * PERIOD_NS
            || RAYON_NS.load(Ordering::Relaxed) < MIN_PERIODS * PERIOD_NS)
            && started.elapsed() < Duration::from_secs(60)
        {
            responses.extend(
                drive(addr, CLIENTS, REQUESTS_PER_CLIENT, |k, n| {
                    let kind = ["scoped", "rayon", "in_span"][(n % 3) as usize];
                    format!("/{kind}/{k}")
                })
                .await,
            );
        }
        let after = sentry_profiling::stats().map(|s| s.sampler);
        if let (Some(b), Some(a)) = (before, after) {
            // What the process timer caught of threads without a timer of
            // their own, against the short-lived threads' CPU time.
            let periods = (a.short_lived_captures + a.short_lived_overruns)
                - (b.short_lived_captures + b.short_lived_overruns);
            let burned = SCOPED_NS.load(Ordering::Relaxed)
                + RAYON_NS.load(Ordering::Relaxed)
                + IN_SPAN_NS.load(Ordering::Relaxed);
            println!(
                "process timer: {periods} periods of threads without a timer ({:.1} ms), short-lived threads' CPU {:.1} ms, known-thread hits {}",
                (periods * PERIOD_NS) as f64 / 1e6,
                burned as f64 / 1e6,
                a.short_lived_known_hits - b.short_lived_known_hits
            );
        }
        (responses, from)
    });
    let requests = responses.len();
    assert_every_request_succeeded(&responses, requests);
    let stats = sentry_profiling::stats().expect("a profiling session");
    let (chunks, transactions) = split_items(&capture.envelopes());

    let mut failures = Vec::new();
    for (kind, function, burned) in [
        ("scoped", "scoped_hash", SCOPED_NS.load(Ordering::Relaxed)),
        ("rayon", "rayon_hash", RAYON_NS.load(Ordering::Relaxed)),
    ] {
        let (shown, shared) = shown_ns(&chunks, function, from);
        let ratio = shown as f64 / burned.max(1) as f64;
        println!(
            "{kind}: the threads used {:.1} ms of CPU ({} periods), {:.1} ms shown ({:.1} ms on shared timelines): {ratio:.3}",
            burned as f64 / 1e6,
            burned / PERIOD_NS,
            shown as f64 / 1e6,
            shared as f64 / 1e6,
        );
        if burned < MIN_PERIODS * PERIOD_NS {
            failures.push(format!(
                "{kind}: only {burned} ns of CPU: too few periods for the bound"
            ));
        }
        if ratio < 0.9 {
            failures.push(format!("{kind}: {ratio:.3} of the threads' CPU time shown"));
        }
    }
    // Work the request's span went with: under its own transactions.
    let (mut own, mut other, mut showing) = (0, 0, 0);
    let mut scored = 0;
    for tx in &transactions {
        let name = tx["transaction"].as_str().unwrap_or("?");
        if !name.starts_with("GET /in_span") || client_of(tx).is_none_or(|(_, n)| n == 0) {
            continue;
        }
        let (o, x) = own_and_other(tx, &chunks);
        scored += 1;
        showing += usize::from(o > 0);
        own += o;
        other += x;
    }
    let precision = own as f64 / (own + other).max(1) as f64;
    println!(
        "in_span: {showing} of {scored} transactions show their own CPU function; {own} own samples, {other} of other requests: precision {precision:.4}"
    );
    println!("sampler: {:?}", stats.sampler);
    if showing * 2 < scored {
        failures.push(format!(
            "in_span: only {showing} of {scored} transactions show their threads' work"
        ));
    }
    if precision < 0.99 {
        failures.push(format!("in_span: precision {precision:.4} < 0.99"));
    }
    if stats.samples_single_thread != 0 {
        failures.push(format!(
            "{} samples dropped as their thread's only one in a chunk",
            stats.samples_single_thread
        ));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
