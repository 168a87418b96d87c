//! tower-http's `TraceLayer` inside sentry-tower's layers (`NewSentryLayer`
//! and `SentryHttpLayer` making the transactions): the first span the tracing
//! layer sees in a request is `TraceLayer`'s, which `sentry-tracing` makes
//! a child span of sentry-tower's transaction. The transaction itself must
//! carry `thread.id` and be linked, not only that child span.
//!
//! The same holds for any tracing span a handler opens inside sentry-tower's
//! transaction (`/instrumented`, without `TraceLayer`): the first such span
//! tags the transaction, and a later top-level span of the same handler
//! does not take it over.
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
use sentry_profiling_tests::{CaptureTransport, run_service_with, split_items};
use serde_json::Value;

const CLIENTS: u64 = 6;
const REQUESTS_PER_CLIENT: u64 = 8;
const CPU_MS: u64 = 20;

async fn work(Path(k): Path<u64>) -> String {
    let x = cpu_across_await(k, CPU_MS).await;
    format!("{x:x}\n")
}

/// The CPU in a span of the handler's own (the request's first tracing
/// span), then a second top-level span that does no work.
async fn instrumented(Path(k): Path<u64>) -> String {
    use tracing::Instrument;
    let x = work(Path(k))
        .instrument(tracing::info_span!("handler.work"))
        .await;
    async { tokio::task::yield_now().await }
        .instrument(tracing::info_span!("handler.after"))
        .await;
    x
}

#[test]
fn transactions_are_linked_with_trace_layer_inside_sentry_tower() {
    let capture = CaptureTransport::new();
    let options = captured_options(&capture);
    let app = axum::Router::new()
        .route(
            "/work/{k}",
            axum::routing::get(work).layer(tower_http::trace::TraceLayer::new_for_http()),
        )
        .route("/instrumented/{k}", axum::routing::get(instrumented))
        .layer(sentry_tower::SentryHttpLayer::new().enable_transaction())
        .layer(sentry_tower::NewSentryLayer::new_from_top());
    let responses = run_service_with(options, app, |addr, _| {
        drive(addr, CLIENTS, REQUESTS_PER_CLIENT, |k, n| {
            let kind = if n % 2 == 0 { "work" } else { "instrumented" };
            format!("/{kind}/{k}?n={n}")
        })
    });
    let requests = (CLIENTS * REQUESTS_PER_CLIENT) as usize;
    assert_every_request_succeeded(&responses, requests);

    let (chunks, transactions) = split_items(&capture.envelopes());
    assert_eq!(transactions.len(), requests, "one transaction per request");
    for tx in &transactions {
        assert_eq!(
            tx.pointer("/contexts/trace/origin").and_then(Value::as_str),
            Some("auto.http.tower"),
            "sentry-tower's transaction: {tx}"
        );
        let name = tx["transaction"].as_str().unwrap_or_default();
        assert!(
            name == "GET /work/{k}" || name == "GET /instrumented/{k}",
            "{name}"
        );
        // The transaction itself carries the thread Sentry finds its
        // samples under (not only TraceLayer's child span).
        assert!(
            tx.pointer("/contexts/trace/data/thread.id")
                .and_then(Value::as_str)
                .is_some(),
            "no thread.id on the transaction: {tx}"
        );
    }
    let all = shown(&transactions, &chunks);
    for (what, name) in [
        ("TraceLayer inside sentry-tower", "GET /work/{k}"),
        (
            "a handler's spans inside sentry-tower",
            "GET /instrumented/{k}",
        ),
    ] {
        let of: Vec<_> = all.iter().filter(|s| s.name == name).cloned().collect();
        assert_shown(what, &of);
    }
}
