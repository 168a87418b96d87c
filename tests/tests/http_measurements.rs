//! A request's poll totals reach Sentry as measurements through the crate's
//! HTTP delivery, as production sends them: the example service with a DSN
//! (no transport of the application's own), to a fake Sentry endpoint on
//! loopback. Every transaction carries the six `tokio.*` measurements,
//! valid under Relay's measurement normalization and true to the request
//! (a CPU-bound request's time polled, a sleeping one's time awaiting), is
//! linked to the chunks sent beside it, and arrives exactly once. The
//! totals travel as measurements only (the worker that finished the request
//! wrote no data keys for them), except for a request with long polls,
//! whose long-poll keys exist only as data and bring the rest with them.

use sentry_profiling::hooks::keys::TOKIO_MEASUREMENTS;
use sentry_profiling_tests::fake_sentry::FakeSentry;
use sentry_profiling_tests::{
    SENTRY_CUSTOM_MEASUREMENT_LIMIT, http_get, link_problem, measurement_violations,
    parse_envelope, run_service_with, split_items,
};
use serde_json::Value;

const REQUESTS: usize = 24;
const CONCURRENCY: usize = 4;

#[test]
fn poll_totals_are_measurements_through_the_http_transport() {
    let fake = FakeSentry::start();
    let options = fake.profiled_options("http-measurements-test@1");
    let statuses = run_service_with(
        options,
        sentry_profiling_examples::router(),
        |addr, _| async move {
            let mut tasks = tokio::task::JoinSet::new();
            let mut statuses = Vec::new();
            for i in 0..REQUESTS {
                if tasks.len() >= CONCURRENCY {
                    statuses.push(tasks.join_next().await.expect("task").expect("join"));
                }
                // CPU-bound and sleeping requests: both polled and awaiting.
                let path = if i % 2 == 0 {
                    format!("/work/{}", 25 + i % 5)
                } else {
                    format!("/sleep/{}", 25 + i % 5)
                };
                tasks.spawn(async move { http_get(addr, path).await });
            }
            while let Some(r) = tasks.join_next().await {
                statuses.push(r.expect("join"));
            }
            statuses
        },
    );
    assert!(
        statuses.iter().all(|r| r.starts_with("HTTP/1.1 200")),
        "every request succeeds"
    );

    let envelopes: Vec<_> = fake
        .requests()
        .iter()
        .map(|r| parse_envelope(&r.body))
        .collect();
    let (chunks, transactions) = split_items(&envelopes);
    assert_eq!(
        transactions.len(),
        REQUESTS,
        "one transaction per request, each sent once"
    );
    assert!(!chunks.is_empty(), "chunks are sent beside them");
    for tx in &transactions {
        let name = tx["transaction"].as_str().unwrap_or("?");
        let data = &tx["contexts"]["trace"]["data"];
        for (key, unit) in TOKIO_MEASUREMENTS {
            let measured = &tx["measurements"][key];
            assert!(
                measured["value"].as_f64().is_some_and(|v| v >= 0.0),
                "{name}: measurement {key}: {measured}"
            );
            assert_eq!(measured["unit"], unit, "{name}: {key}'s unit");
            // Long polls' two keys exist only as data, and bring the rest
            // with them; otherwise the totals are not data too.
            if data.get("tokio.long_polls").is_some() {
                assert_eq!(
                    data[key].as_f64(),
                    measured["value"].as_f64(),
                    "{name}: {key}"
                );
            } else {
                assert!(data.get(key).is_none(), "{name}: {key} is data too: {data}");
            }
        }
        assert!(
            tx["measurements"]["tokio.polls"]["value"].as_f64() >= Some(1.0),
            "{name} was polled"
        );
        let key = if name.contains("sleep") {
            "tokio.awaiting"
        } else {
            "tokio.polled"
        };
        assert!(
            tx["measurements"][key]["value"].as_f64() >= Some(20.0),
            "{name}: {key} holds the request's 25+ ms: {}",
            tx["measurements"]
        );
        let v = measurement_violations(tx, SENTRY_CUSTOM_MEASUREMENT_LIMIT);
        assert!(
            v.is_empty(),
            "{name}: Relay would alter measurements: {v:?}"
        );
        if let Some(problem) = link_problem(tx, &chunks) {
            panic!("{name} is not linked: {problem}");
        }
    }
    let measured: Vec<Value> = transactions
        .iter()
        .map(|tx| tx["measurements"]["tokio.polls"]["value"].clone())
        .collect();
    eprintln!(
        "http_measurements: {} transactions with measurements (polls {measured:?}), {} chunks",
        transactions.len(),
        chunks.len()
    );
}
