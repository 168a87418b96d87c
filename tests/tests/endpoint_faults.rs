//! The Sentry endpoint fails in every way it can while a profiled service
//! is under load: it goes down (connection refused), resets connections,
//! answers 503, accepts and never answers, and rate-limits profile chunks.
//! Throughout, the service's request latency stays near its healthy
//! baseline, memory stays bounded, every dropped chunk is counted by
//! reason, no chunk is sent while Sentry's `profile_chunk` rate limit is in
//! force (transactions still are), and once the endpoint is healthy again
//! chunks arrive again, intact, with a client report of what was lost.
//!
//! The service runs in-process (the example router) at 1000 Hz with 1 s
//! chunks and a 2 s request timeout, so each phase of a few seconds sees
//! several chunks. Latency and memory bounds are generous: they tell a
//! transport that blocks request threads or queues without bound (seconds,
//! hundreds of MiB) from one that does not, not fine differences.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use sentry_profiling::{ProfileLifecycle, ProfilerStats, ProfilingIntegration};
use sentry_profiling_tests::fake_sentry::{FakeSentry, Mode, Request};
use sentry_profiling_tests::{
    http_get, parse_envelope, relay_violations, run_service_with, split_items,
};
use serde_json::Value;

/// The test fails rather than hang past this (it takes about 35 s). A
/// transport without request timeouts hangs here: its thread never returns
/// from a stalled request, and the client's shutdown waits for it forever.
const WATCHDOG: Duration = Duration::from_secs(120);
/// The client's shutdown timeout.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);
/// The rate limit's length in the rate-limit phase.
const LIMIT_SECS: u32 = 5;

/// One phase of the run: a mode, held for a while under load.
#[derive(Debug)]
struct Phase {
    mode: Mode,
    secs: u64,
}

/// What was measured in one phase.
#[derive(Debug)]
struct PhaseResult {
    mode: Mode,
    latencies: Vec<Duration>,
    failed_requests: usize,
    before: ProfilerStats,
    after: ProfilerStats,
    rss_after: u64,
}

/// Threads of this process whose name starts with `prefix` (names are cut
/// to 15 bytes).
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                .filter(|name| name.starts_with(prefix))
                .count()
        })
        .unwrap_or(0)
}

/// Flushes the client `times` times with a short timeout while the
/// endpoint stalls, as an application flushing every few seconds would;
/// returns how many more profiler threads there are afterwards.
async fn flush_while_stalled(times: usize) -> usize {
    tokio::task::spawn_blocking(move || {
        let before = threads_named("sentry-profiler");
        for _ in 0..times {
            if let Some(client) = sentry::Hub::current().client() {
                client.flush(Some(Duration::from_millis(100)));
            }
        }
        threads_named("sentry-profiler").saturating_sub(before)
    })
    .await
    .expect("flushes")
}

fn stats() -> ProfilerStats {
    sentry_profiling::stats().expect("a profiling session is configured")
}

/// Resident set size of this process, in bytes.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS")
        * 1024
}

fn p99(latencies: &[Duration]) -> Duration {
    let mut sorted = latencies.to_vec();
    sorted.sort();
    sorted[(sorted.len() * 99 / 100).min(sorted.len() - 1)]
}

/// Requests the service in `workers` loops until `until`; returns each
/// request's latency and how many failed.
async fn load(addr: SocketAddr, until: Instant) -> (Vec<Duration>, usize) {
    let mut tasks = Vec::new();
    for worker in 0..2 {
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut failed = 0;
            let mut i = 0u64;
            while Instant::now() < until {
                let path = if (i + worker) % 2 == 0 {
                    "/work/2"
                } else {
                    "/sleep/3"
                };
                let started = Instant::now();
                let response = tokio::time::timeout(Duration::from_secs(30), http_get(addr, path))
                    .await
                    .unwrap_or_default();
                latencies.push(started.elapsed());
                if !response.starts_with("HTTP/1.1 200") {
                    failed += 1;
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (latencies, failed)
        }));
    }
    let mut latencies = Vec::new();
    let mut failed = 0;
    for t in tasks {
        let (l, f) = t.await.expect("load task");
        latencies.extend(l);
        failed += f;
    }
    (latencies, failed)
}

#[test]
fn endpoint_faults_do_not_hurt_the_service_and_profiling_recovers() {
    std::thread::Builder::new()
        .name("watchdog".into())
        .spawn(|| {
            std::thread::sleep(WATCHDOG);
            eprintln!(
                "endpoint_faults: watchdog fired after {WATCHDOG:?}: is a transport stuck on a stalled request?"
            );
            std::process::exit(101);
        })
        .expect("watchdog");

    let server = FakeSentry::start();
    let mut options = sentry::ClientOptions::new().traces_sample_rate(1.0);
    options.dsn = Some(server.dsn().parse().expect("DSN"));
    options.release = Some("endpoint-faults@1".into());
    options.shutdown_timeout = SHUTDOWN_TIMEOUT;
    let options = ProfilingIntegration::new()
        .profile_session_sample_rate(1.0)
        .profile_lifecycle(ProfileLifecycle::Trace)
        .frequency_hz(1000)
        .chunk_duration(Duration::from_secs(1))
        .http_timeout(Duration::from_secs(2))
        .apply(options);
    assert!(
        options.transport.is_some(),
        "the crate's own HTTP delivery is installed"
    );

    let phases = [
        Phase {
            mode: Mode::Healthy,
            secs: 5,
        },
        Phase {
            mode: Mode::Down,
            secs: 4,
        },
        Phase {
            mode: Mode::Reset,
            secs: 4,
        },
        Phase {
            mode: Mode::Unavailable,
            secs: 4,
        },
        Phase {
            mode: Mode::Stall,
            secs: 6,
        },
        Phase {
            mode: Mode::RateLimitChunks { secs: LIMIT_SECS },
            secs: 5,
        },
        Phase {
            mode: Mode::Healthy,
            secs: 8,
        },
        // The client closes while the endpoint stalls.
        Phase {
            mode: Mode::Stall,
            secs: 2,
        },
    ];
    let started = Instant::now();
    let mut flush_threads = None;
    let (results, closing) =
        run_service_with(options, sentry_profiling_examples::router(), |addr, _| {
            let server = &server;
            let flush_threads = &mut flush_threads;
            async move {
                let mut results = Vec::new();
                for phase in &phases {
                    server.set_mode(phase.mode);
                    let before = stats();
                    let until = Instant::now() + Duration::from_secs(phase.secs);
                    let (latencies, failed_requests) = load(addr, until).await;
                    if phase.mode == Mode::Stall && flush_threads.is_none() {
                        *flush_threads = Some(flush_while_stalled(8).await);
                    }
                    results.push(PhaseResult {
                        mode: phase.mode,
                        latencies,
                        failed_requests,
                        before,
                        after: stats(),
                        rss_after: rss_bytes(),
                    });
                }
                (results, Instant::now())
            }
        });
    let closed_in = closing.elapsed();
    // Flushes that cannot finish while the endpoint stalls do not pile up
    // helper threads, each waiting for a request timeout.
    let flush_threads = flush_threads.expect("flushed while stalled");
    assert!(
        flush_threads <= 2,
        "{flush_threads} more profiler threads after 8 flushes against a stalled endpoint"
    );
    let total = started.elapsed();
    let end = stats();
    let requests = server.requests();
    drop(server);

    for r in &results {
        let d = &r.after.chunks_dropped;
        let b = &r.before.chunks_dropped;
        eprintln!(
            "{:?}: {} requests, p99 {:?}, chunks delivered +{}, dropped +{} queue full, +{} send failed, +{} http error, +{} rate limited, RSS {} MiB",
            r.mode,
            r.latencies.len(),
            p99(&r.latencies),
            r.after.chunks_delivered - r.before.chunks_delivered,
            d.queue_full - b.queue_full,
            d.send_failed - b.send_failed,
            d.http_error - b.http_error,
            d.rate_limited - b.rate_limited,
            r.rss_after / (1024 * 1024),
        );
    }
    eprintln!("total {total:?}; closed in {closed_in:?}; final stats {end:?}");

    // Closing the client while the endpoint stalls takes the shutdown
    // timeout, not the request timeout of each envelope still queued (the
    // slack covers the server's and the runtime's own shutdown).
    assert!(
        closed_in < SHUTDOWN_TIMEOUT + Duration::from_secs(3),
        "closing took {closed_in:?}"
    );

    // The service answered every request, and no fault phase made it slow.
    for r in &results {
        assert!(!r.latencies.is_empty(), "{:?}: the load ran", r.mode);
        assert_eq!(
            r.failed_requests, 0,
            "{:?}: every request succeeded",
            r.mode
        );
    }
    let baseline = p99(&results[0].latencies);
    let bound = baseline * 3 + Duration::from_millis(250);
    for r in &results[1..] {
        let p = p99(&r.latencies);
        assert!(
            p < bound,
            "{:?}: p99 latency {p:?} against a healthy baseline of {baseline:?}",
            r.mode
        );
    }

    // Memory stays bounded through the faults.
    let rss_base = results[0].rss_after;
    let rss_peak = results.iter().map(|r| r.rss_after).max().unwrap_or(0);
    assert!(
        rss_peak.saturating_sub(rss_base) < 64 * 1024 * 1024,
        "RSS grew from {} MiB to {} MiB",
        rss_base >> 20,
        rss_peak >> 20
    );

    // Chunks flowed while healthy, and every fault dropped some, counted
    // under its reason.
    let healthy = &results[0];
    assert!(
        healthy.after.chunks_delivered > healthy.before.chunks_delivered,
        "chunks are delivered while the endpoint is healthy"
    );
    let delta = |r: &PhaseResult, f: fn(&ProfilerStats) -> u64| f(&r.after) - f(&r.before);
    let send_failed = |s: &ProfilerStats| s.chunks_dropped.send_failed;
    assert!(
        delta(&results[1], send_failed) > 0,
        "down: send failures counted"
    );
    assert!(
        delta(&results[2], send_failed) > 0,
        "reset: send failures counted"
    );
    assert!(
        delta(&results[3], |s| s.chunks_dropped.http_error) > 0,
        "503: HTTP errors counted"
    );
    // A stalled request ends with the timeout, possibly only once the next
    // phase has begun.
    assert!(
        delta(&results[4], send_failed) + delta(&results[5], send_failed) > 0,
        "stall: timeouts counted"
    );
    assert!(
        delta(&results[5], |s| s.chunks_dropped.rate_limited) > 0,
        "rate limit: drops counted"
    );
    assert!(end.chunks_sent > 0 && end.session_sampled);

    // While Sentry's profile_chunk limit is in force, no chunk reaches it;
    // transactions still do.
    let limited: Vec<&Request> = requests.iter().filter(|r| r.rate_limited).collect();
    assert!(!limited.is_empty(), "a chunk met the rate limit");
    assert!(
        limited.iter().all(|r| r.has_item("profile_chunk")),
        "only chunks were limited"
    );
    for l in &limited {
        let window = l.at..l.at + Duration::from_secs(u64::from(LIMIT_SECS));
        let chunks_inside = requests
            .iter()
            .filter(|r| r.at > l.at && window.contains(&r.at) && r.has_item("profile_chunk"))
            .count();
        assert_eq!(
            chunks_inside, 0,
            "no chunk request within {LIMIT_SECS} s of a profile_chunk rate limit"
        );
        let transactions_inside = requests
            .iter()
            .filter(|r| window.contains(&r.at) && r.has_item("transaction"))
            .count();
        assert!(
            transactions_inside > 0,
            "transactions are still sent while chunks are rate limited"
        );
    }

    // Profiling recovered: chunks arrived after the faults, intact, and the
    // losses were reported in a client report.
    let recovered: Vec<&Request> = requests
        .iter()
        .filter(|r| r.mode == Mode::Healthy && r.status == Some(200) && !r.rate_limited)
        .filter(|r| r.at > limited.last().map_or(r.at, |l| l.at))
        .filter(|r| r.has_item("profile_chunk"))
        .collect();
    assert!(
        !recovered.is_empty(),
        "chunks arrive again once the endpoint recovered"
    );
    let recovery = &results[6];
    assert!(recovery.after.chunks_delivered > recovery.before.chunks_delivered);
    let envelopes: Vec<_> = recovered.iter().map(|r| parse_envelope(&r.body)).collect();
    let (chunks, _) = split_items(&envelopes);
    for chunk in &chunks {
        let v = relay_violations(chunk);
        assert!(v.is_empty(), "Relay would reject a recovered chunk: {v:?}");
    }
    for r in &recovered {
        assert_eq!(r.path, "/api/1/envelope/");
    }
    // Every loss is reported once, in a client report appended to a later
    // chunk envelope that Sentry took (2xx: the first of them may come
    // while chunks are still rate limited, as the report item itself is
    // accepted).
    let reported = |reason: &str| -> u64 {
        requests
            .iter()
            .filter(|r| r.status.is_some_and(|s| (200..300).contains(&s)))
            .flat_map(|r| parse_envelope(&r.body).items)
            .filter(|i| i.header["type"] == "client_report")
            .flat_map(|i| {
                let report: Value = serde_json::from_slice(&i.payload).expect("client report JSON");
                report["discarded_events"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter(|d| d["category"] == "profile_chunk" && d["reason"] == reason)
            .filter_map(|d| d["quantity"].as_u64())
            .sum()
    };
    assert_eq!(
        reported("send_error"),
        end.chunks_dropped.http_error,
        "each chunk the 503s dropped is reported once"
    );
    let network = reported("network_error");
    assert!(
        network > 0 && network <= end.chunks_dropped.send_failed,
        "failed sends are reported: {network} of {}",
        end.chunks_dropped.send_failed
    );
    assert!(
        reported("ratelimit_backoff") > 0,
        "chunks dropped under the rate limit are reported"
    );
}
