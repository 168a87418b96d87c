//! Sentry's `transaction` rate limit holds for profiled transactions: once
//! the endpoint answers `429` with `X-Sentry-Rate-Limits: 60:transaction:…`,
//! the SDK's transport sends no more transactions for the limit's duration,
//! counts each one it drops in its client reports, and profile chunks (a
//! category of their own) keep flowing. A profiled transaction that reached
//! the transport as raw bytes would slip past the limit (the SDK only stops
//! a raw envelope for a limit on everything) and go uncounted.

use std::time::{Duration, Instant};

use sentry_profiling_tests::fake_sentry::{FakeSentry, Mode};
use sentry_profiling_tests::{http_get, parse_envelope, run_service_with};
use serde_json::Value;

/// Requests made once the limit is in force.
const LIMITED_REQUESTS: usize = 30;

/// Transactions a client report counts as dropped for the rate limit.
fn rate_limited_transactions(item: &Value) -> u64 {
    item["discarded_events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["category"] == "transaction" && d["reason"] == "ratelimit_backoff")
        .filter_map(|d| d["quantity"].as_u64())
        .sum()
}

#[test]
fn rate_limited_transactions_are_not_sent_and_are_counted() {
    let fake = FakeSentry::start();
    fake.set_mode(Mode::RateLimitTransactions { secs: 60 });
    let options = fake.profiled_options("rate-limit-test@1");
    let has_transaction =
        |fake: &FakeSentry| fake.requests().iter().any(|r| r.has_item("transaction"));
    run_service_with(options, sentry_profiling_examples::router(), |addr, _| {
        let fake = &fake;
        async move {
            let first = http_get(addr, "/work/5").await;
            assert!(first.starts_with("HTTP/1.1 200"), "{first}");
            // The first transaction meets the limit.
            let t = Instant::now();
            while !has_transaction(fake) && t.elapsed() < Duration::from_secs(10) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert!(has_transaction(fake), "the first transaction arrived");
            tokio::time::sleep(Duration::from_millis(200)).await;
            for _ in 0..LIMITED_REQUESTS {
                let r = http_get(addr, "/work/5").await;
                assert!(r.starts_with("HTTP/1.1 200"), "{r}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // Let a chunk end with the limit in force.
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
    });

    let requests = fake.requests();
    let with_transactions: Vec<_> = requests
        .iter()
        .filter(|r| r.has_item("transaction"))
        .collect();
    assert_eq!(
        with_transactions.len(),
        1,
        "only the transaction that met the limit was sent: {} were",
        with_transactions.len()
    );
    let limit_at = with_transactions[0].at;
    let chunks_after = requests
        .iter()
        .filter(|r| r.at > limit_at && r.has_item("profile_chunk") && r.status == Some(200))
        .count();
    assert!(
        chunks_after >= 1,
        "profile chunks keep flowing under a transaction limit"
    );
    let counted: u64 = requests
        .iter()
        .flat_map(|r| parse_envelope(&r.body).items)
        .filter(|i| i.header.get("type").and_then(Value::as_str) == Some("client_report"))
        .filter_map(|i| serde_json::from_slice::<Value>(&i.payload).ok())
        .map(|report| rate_limited_transactions(&report))
        .sum();
    // The SDK attaches its report to the next envelope it sends, so the
    // last drop may still be pending when the client closes.
    assert!(
        counted as usize + 1 >= LIMITED_REQUESTS && counted as usize <= LIMITED_REQUESTS,
        "the SDK's client reports count the dropped profiled transactions: {counted} of {LIMITED_REQUESTS}"
    );
    eprintln!(
        "transaction_rate_limit: 1 transaction sent, {counted} of {LIMITED_REQUESTS} counted as rate-limited, {chunks_after} chunks after the limit"
    );
}
