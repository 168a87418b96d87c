//! With `sentry-tower` already in the stack (a hub per request and its HTTP
//! layer creating transactions), the profiling middleware inside it reuses
//! that transaction: one transaction per request, named by `sentry-tower`,
//! tagged with its thread and linked to the profile.
//!
//! A real axum service on loopback under concurrent load, scored as
//! Sentry's UI shows each transaction (`sentry_view`, see
//! `sentry_profiling_tests::clients::shown`): every request has a linked
//! transaction, its own CPU function is shown with precision at least 0.99,
//! and at least three transactions in four show it at all
//! (`clients::assert_shown` says why not every one on a loaded machine).

use axum::extract::Path;
use sentry_profiling_tests::clients::{
    assert_every_request_succeeded, assert_shown, captured_options, cpu_across_await, drive, shown,
};
use sentry_profiling_tests::{CaptureTransport, relay_violations, run_service_with, split_items};
use serde_json::Value;

const CLIENTS: u64 = 6;
const REQUESTS_PER_CLIENT: u64 = 6;
const CPU_MS: u64 = 20;

/// CPU in two slices with an `.await` between them, and a sleep.
async fn work(Path(k): Path<u64>) -> String {
    let x = cpu_across_await(k, CPU_MS).await;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    format!("{x:x}\n")
}

#[test]
fn one_linked_transaction_per_request_with_sentry_tower() {
    let capture = CaptureTransport::new();
    let options = captured_options(&capture);
    let app = axum::Router::new()
        .route("/work/{k}", axum::routing::get(work))
        .layer(sentry_profiling_tracing::http_layer())
        .layer(sentry_tower::SentryHttpLayer::new().enable_transaction())
        .layer(sentry_tower::NewSentryLayer::new_from_top());
    let responses = run_service_with(options, app, |addr, _| {
        drive(addr, CLIENTS, REQUESTS_PER_CLIENT, |k, n| {
            format!("/work/{k}?n={n}")
        })
    });
    let requests = (CLIENTS * REQUESTS_PER_CLIENT) as usize;
    assert_every_request_succeeded(&responses, requests);

    let (chunks, transactions) = split_items(&capture.envelopes());
    assert_eq!(
        transactions.len(),
        requests,
        "one transaction per request, not two"
    );
    for tx in &transactions {
        assert_eq!(
            tx.pointer("/contexts/trace/origin").and_then(Value::as_str),
            Some("auto.http.tower"),
            "sentry-tower's transaction: {tx}"
        );
        assert_eq!(tx["transaction"], "GET /work/{k}");
    }
    for c in &chunks {
        assert_eq!(relay_violations(c), Vec::<String>::new());
    }
    assert_shown(
        "http_layer() inside sentry-tower",
        &shown(&transactions, &chunks),
    );
}
