//! With `sentry-tower` already in the stack (a hub per request and its HTTP
//! layer creating transactions), the profiling middleware reuses that
//! transaction: one transaction per request, named by `sentry-tower`, tagged
//! with its thread and linked to the profile.

use std::time::Duration;

use axum::routing::get;
use sentry_profiling_examples::{sleep, work};
use sentry_profiling_tests::{
    http_get, link_problem, local_settings, read_envelope_dir, relay_violations, run_service,
    split_items,
};

#[test]
fn one_linked_transaction_per_request_with_sentry_tower() {
    let settings = local_settings("tower");
    let dir = settings.envelope_dir.clone();
    let app = axum::Router::new()
        .route("/work/{ms}", get(work))
        .route("/sleep/{ms}", get(sleep))
        .layer(sentry_profiling_tracing::http_layer())
        .layer(sentry_tower::SentryHttpLayer::new().enable_transaction())
        .layer(sentry_tower::NewSentryLayer::new_from_top());
    let responses = run_service(&settings, app, |addr, _| async move {
        let mut tasks = Vec::new();
        for _ in 0..3 {
            tasks.push(tokio::spawn(http_get(addr, "/work/40")));
            tasks.push(tokio::spawn(http_get(addr, "/sleep/30")));
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        out
    });
    assert!(responses.iter().all(|r| r.starts_with("HTTP/1.1 200")));

    let envelopes = read_envelope_dir(&dir);
    let (chunks, transactions) = split_items(&envelopes);
    assert_eq!(
        transactions.len(),
        6,
        "one transaction per request, not two"
    );
    for tx in &transactions {
        assert_eq!(
            tx["contexts"]["trace"]["origin"], "auto.http.tower",
            "sentry-tower's transaction"
        );
        assert!(
            tx["transaction"] == "GET /work/{ms}" || tx["transaction"] == "GET /sleep/{ms}",
            "{}",
            tx["transaction"]
        );
        if let Some(p) = link_problem(tx, &chunks) {
            panic!("{p}");
        }
    }
    for c in &chunks {
        assert_eq!(relay_violations(c), Vec::<String>::new());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
