//! Work a request hands to Tokio's blocking pool (`spawn_blocking_in_span`)
//! or to a task of its own (`spawn_in_span`) shows in its profile: a real
//! axum service on loopback under concurrent load, scored as Sentry's UI
//! slices a profile for a transaction (the chunk samples of its
//! `profiler_id` whose `thread_id` is its `thread.id` and whose timestamp
//! is inside `[start, end]`).
//!
//! Each of the concurrent clients has a CPU function of its own
//! (`spawned_work_cpu_<k>`) and sends its requests one after another, so a
//! sample showing client k's function belongs to client k's request in
//! flight: shown under another client's transaction it is a sample
//! misattributed. Precision, the share of the CPU samples shown for a
//! transaction that are its own, must be at least 0.99, and (nearly) every
//! transaction must show its own function.

use std::time::{Duration, Instant};

use axum::extract::Path;
use sentry_profiling::{ProfileLifecycle, ProfilingIntegration};
use sentry_profiling_tests::{
    CaptureTransport, functions_in_window, http_get_with, link_problem, run_service_with,
    split_items, transaction_window,
};
use sentry_profiling_tracing::{spawn_blocking_in_span, spawn_in_span};
use serde_json::Value;

const CLIENTS: u64 = 8;
const REQUESTS_PER_CLIENT: u64 = 8;
/// CPU per request, in milliseconds of the burning thread's CPU time.
const CPU_MS: u64 = 30;

/// Burns `ms` of this thread's CPU time (not wall time: on a loaded machine
/// the request still does the same work).
fn burn(ms: u64) -> u64 {
    let start = thread_cpu();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    while thread_cpu().saturating_sub(start) < Duration::from_millis(ms) {
        for i in 0..5_000u64 {
            x = std::hint::black_box(x.rotate_left(5) ^ i).wrapping_mul(0x100_0000_01b3);
        }
    }
    x
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant
    // the kernel knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

macro_rules! cpu_functions {
    ($($k:literal => $name:ident),* $(,)?) => {
        $(
            #[inline(never)]
            fn $name(ms: u64) -> u64 {
                std::hint::black_box(burn(ms)) ^ $k
            }
        )*
        /// Client `k`'s CPU function.
        fn cpu(k: u64, ms: u64) -> u64 {
            match k {
                $($k => $name(ms),)*
                _ => unreachable!("client {k}"),
            }
        }
    };
}

cpu_functions! {
    0 => spawned_work_cpu_0,
    1 => spawned_work_cpu_1,
    2 => spawned_work_cpu_2,
    3 => spawned_work_cpu_3,
    4 => spawned_work_cpu_4,
    5 => spawned_work_cpu_5,
    6 => spawned_work_cpu_6,
    7 => spawned_work_cpu_7,
}

/// `GET /blocking/{k}`: the CPU on Tokio's blocking pool.
async fn blocking(Path(k): Path<u64>) -> String {
    let x = spawn_blocking_in_span(move || cpu(k, CPU_MS))
        .await
        .expect("blocking task");
    format!("{x:x}\n")
}

/// `GET /spawned/{k}`: the CPU in a spawned task, in three slices with
/// `.await`s between them.
async fn spawned(Path(k): Path<u64>) -> String {
    let x = spawn_in_span(async move {
        let mut x = 0;
        for _ in 0..3 {
            x ^= cpu(k, CPU_MS / 3);
            tokio::task::yield_now().await;
        }
        x
    })
    .await
    .expect("spawned task");
    format!("{x:x}\n")
}

/// The trace id a client's request continues: client and request number
/// in the low bits, so the transaction says whose it is.
fn trace_id(client: u64, n: u64) -> String {
    format!("5eed{:020x}{client:04x}{n:04x}", 0)
}

/// The client and request number of a transaction (see [`trace_id`]).
fn client_of(tx: &Value) -> Option<(u64, u64)> {
    let id = tx.pointer("/contexts/trace/trace_id")?.as_str()?;
    Some((
        u64::from_str_radix(id.get(24..28)?, 16).ok()?,
        u64::from_str_radix(id.get(28..32)?, 16).ok()?,
    ))
}

/// The client whose CPU function a stack shows, if any.
fn cpu_client(stack: &[String]) -> Option<u64> {
    stack.iter().find_map(|f| {
        let at = f.find("spawned_work_cpu_")?;
        f[at + "spawned_work_cpu_".len()..]
            .chars()
            .next()?
            .to_digit(10)
            .map(u64::from)
    })
}

#[derive(Debug, Default)]
struct Score {
    transactions: usize,
    showing_own: usize,
    own: usize,
    other: usize,
}

#[test]
fn spawned_and_blocking_work_shows_under_the_request() {
    let capture = CaptureTransport::new();
    let mut options = sentry::ClientOptions::new().traces_sample_rate(1.0);
    options.dsn = sentry_profiling_examples::LOCAL_DSN.parse().ok();
    options.transport = Some(capture.factory());
    let options = ProfilingIntegration::new()
        .profile_session_sample_rate(1.0)
        .profile_lifecycle(ProfileLifecycle::Trace)
        .frequency_hz(1000)
        .apply(options);
    let app = axum::Router::new()
        .route("/blocking/{k}", axum::routing::get(blocking))
        .route("/spawned/{k}", axum::routing::get(spawned))
        .layer(sentry_profiling_tracing::http_layer());
    let started = Instant::now();
    let responses = run_service_with(options, app, |addr, _| async move {
        let mut clients = tokio::task::JoinSet::new();
        let warm = std::sync::Arc::new(tokio::sync::Barrier::new(CLIENTS as usize));
        for k in 0..CLIENTS {
            let warm = warm.clone();
            clients.spawn(async move {
                let mut out = Vec::new();
                for n in 0..REQUESTS_PER_CLIENT {
                    let kind = if n % 2 == 0 { "blocking" } else { "spawned" };
                    let header = format!("{}-{:016x}-1", trace_id(k, n), k * 100 + n + 1);
                    out.push(
                        http_get_with(
                            addr,
                            format!("/{kind}/{k}"),
                            &[("sentry-trace", header.as_str())],
                        )
                        .await,
                    );
                    if n == 0 {
                        warm.wait().await;
                    }
                }
                out
            });
        }
        let mut all = Vec::new();
        while let Some(r) = clients.join_next().await {
            all.extend(r.expect("client"));
        }
        all
    });
    let requests = (CLIENTS * REQUESTS_PER_CLIENT) as usize;
    let ok = responses
        .iter()
        .filter(|r| r.starts_with("HTTP/1.1 200"))
        .count();
    assert_eq!(ok, requests, "every request succeeds");
    println!("{requests} requests in {:?}", started.elapsed());

    let (chunks, transactions) = split_items(&capture.envelopes());
    assert_eq!(transactions.len(), requests, "one transaction per request");
    let first_start = transactions
        .iter()
        .filter_map(|t| transaction_window(t).map(|w| w.0))
        .fold(f64::INFINITY, f64::min);
    let mut warmup_unlinked = 0;
    let mut blocking = Score::default();
    let mut spawned = Score::default();
    for tx in &transactions {
        let (client, n) = client_of(tx).unwrap_or_else(|| panic!("no client in {tx}"));
        let problem = link_problem(tx, &chunks);
        if n == 0 {
            warmup_unlinked += usize::from(problem.is_some());
        } else if let Some(problem) = problem {
            panic!(
                "transaction not linked: {problem} (request {:?}, started {:.3} s after the first)",
                client_of(tx),
                transaction_window(tx).map_or(0.0, |w| w.0) - first_start
            );
        }
        let name = tx["transaction"].as_str().unwrap_or("?");
        let score = if name.starts_with("GET /blocking") {
            &mut blocking
        } else if name.starts_with("GET /spawned") {
            &mut spawned
        } else {
            panic!("unexpected transaction {name}");
        };
        let profiler_id = tx.pointer("/contexts/profile/profiler_id");
        let thread_id = tx
            .pointer("/contexts/trace/data/thread.id")
            .and_then(Value::as_str);
        let (start, end) = transaction_window(tx).expect("window");
        let (mut own, mut other) = (0, 0);
        for chunk in chunks
            .iter()
            .filter(|c| c.payload.get("profiler_id") == profiler_id)
        {
            for stack in functions_in_window(chunk, thread_id, start, end) {
                match cpu_client(&stack) {
                    Some(c) if c == client => own += 1,
                    Some(_) => other += 1,
                    None => {}
                }
            }
        }
        if own == 0 {
            println!(
                "{name} (client {client}) shows no own CPU sample: window {:.1} ms from {start:.3}, {other} of others",
                (end - start) * 1e3
            );
        }
        score.own += own;
        score.other += other;
        if n == 0 {
            continue;
        }
        score.transactions += 1;
        score.showing_own += usize::from(own > 0);
    }
    println!("warm-up: {warmup_unlinked} of {CLIENTS} transactions without samples on their lane");
    for (kind, score) in [
        ("spawn_blocking_in_span", &blocking),
        ("spawn_in_span", &spawned),
    ] {
        let shown = score.own + score.other;
        let precision = score.own as f64 / shown.max(1) as f64;
        println!(
            "{kind}: {} transactions, {} show their own CPU function; {} own CPU samples shown, {} of other requests; precision {precision:.4}",
            score.transactions, score.showing_own, score.own, score.other
        );
        assert!(
            shown > 0,
            "{kind}: no CPU sample shown under any transaction"
        );
        assert!(precision >= 0.99, "{kind}: precision {precision:.4} < 0.99");
        assert!(
            score.showing_own * 100 >= score.transactions * 95,
            "{kind}: only {} of {} transactions show their own CPU function",
            score.showing_own,
            score.transactions
        );
    }
}
