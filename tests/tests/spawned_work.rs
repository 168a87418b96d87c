//! Work a request hands to Tokio's blocking pool (`spawn_blocking_in_span`)
//! or to a task of its own (`spawn_in_span`) shows in its profile: a real
//! axum service on loopback under concurrent load, scored as Sentry's UI
//! slices a profile for a transaction (the chunk samples of its
//! `profiler_id` whose `thread_id` is its `thread.id` and whose timestamp
//! is inside `[start, end]`).
//!
//! Each client burns CPU in a function of its own (see
//! `sentry_profiling_tests::clients`). Precision, the share of the CPU
//! samples shown for a transaction that are its own, must be at least 0.99;
//! every transaction must be linked, and (`clients::assert_shown`) at least
//! three in four show their own function on a loaded machine. Each
//! client's first request is a warm-up (see `clients::drive`): on a loaded
//! machine it can end before the profiler has started and the sampler has
//! found the blocking pool's new threads, so it is scored for precision
//! only, and the number of warm-ups left unlinked is printed.

use std::time::Instant;

use axum::extract::Path;
use sentry_profiling_tests::clients::{
    assert_every_request_succeeded, assert_shown, captured_options, client_of, cpu, drive,
    own_and_other, shown,
};
use sentry_profiling_tests::{CaptureTransport, link_problem, run_service_with, split_items};
use sentry_profiling_tracing::{spawn_blocking_in_span, spawn_in_span};

const CLIENTS: u64 = 8;
const REQUESTS_PER_CLIENT: u64 = 8;
/// CPU per request, in milliseconds of the burning thread's CPU time.
const CPU_MS: u64 = 30;

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
    let options = captured_options(&capture);
    let app = axum::Router::new()
        .route("/blocking/{k}", axum::routing::get(blocking))
        .route("/spawned/{k}", axum::routing::get(spawned))
        .layer(sentry_profiling_tracing::http_layer());
    let started = Instant::now();
    let responses = run_service_with(options, app, |addr, _| {
        drive(addr, CLIENTS, REQUESTS_PER_CLIENT, |k, n| {
            let kind = if n % 2 == 0 { "blocking" } else { "spawned" };
            format!("/{kind}/{k}")
        })
    });
    let requests = (CLIENTS * REQUESTS_PER_CLIENT) as usize;
    assert_every_request_succeeded(&responses, requests);
    println!("{requests} requests in {:?}", started.elapsed());

    let (chunks, transactions) = split_items(&capture.envelopes());
    assert_eq!(transactions.len(), requests, "one transaction per request");
    println!(
        "{} chunks, {} samples",
        chunks.len(),
        chunks
            .iter()
            .map(|c| sentry_profiling_tests::chunk_samples(c).len())
            .sum::<usize>()
    );
    let mut warmup_unlinked = 0;
    let mut unlinked = 0;
    let mut blocking = Score::default();
    let mut spawned = Score::default();
    for tx in &transactions {
        let name = tx["transaction"].as_str().unwrap_or("?");
        let (_, n) = client_of(tx).unwrap_or_else(|| panic!("no client in {tx}"));
        let problem = link_problem(tx, &chunks);
        if n == 0 {
            warmup_unlinked += usize::from(problem.is_some());
        } else if let Some(problem) = &problem {
            println!(
                "not linked: {problem} (client and request {:?}, window {:?})",
                client_of(tx),
                sentry_profiling_tests::transaction_window(tx)
            );
            unlinked += 1;
        }
        let score = if name.starts_with("GET /blocking") {
            &mut blocking
        } else if name.starts_with("GET /spawned") {
            &mut spawned
        } else {
            panic!("unexpected transaction {name}");
        };
        let (own, other) = own_and_other(tx, &chunks);
        score.own += own;
        score.other += other;
        if n == 0 {
            continue;
        }
        score.transactions += 1;
        score.showing_own += usize::from(own > 0 || problem.is_some());
    }
    println!("warm-up: {warmup_unlinked} of {CLIENTS} transactions without samples on their lane");
    assert_eq!(
        unlinked, 0,
        "{unlinked} transactions not linked (see above)"
    );
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
    }
    // How many show their own CPU function at all, weighted as Sentry
    // weights what it shows (see `clients::assert_shown`).
    let all = shown(&transactions, &chunks);
    for (kind, prefix) in [
        ("spawn_blocking_in_span", "GET /blocking"),
        ("spawn_in_span", "GET /spawned"),
    ] {
        let of_kind: Vec<_> = all
            .iter()
            .filter(|s| s.name.starts_with(prefix))
            .cloned()
            .collect();
        assert_shown(kind, &of_kind);
    }
}
