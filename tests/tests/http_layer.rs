//! `http_layer()` on a real axum service on loopback under concurrent
//! load: what it records of each request (as `sentry-tower` does), no
//! child span repeating the transaction (the handler's own span is the
//! transaction's child), and a
//! handler that panics before its first `.await`, with no catch-panic
//! layer, still yielding a transaction linked to its samples.
//!
//! Scored as Sentry's UI slices a profile for a transaction (see
//! `sentry_profiling_tests::clients`): every transaction is linked, with
//! precision at least 0.99, and (`clients::assert_shown`) at least three in
//! four show their own CPU function on a loaded machine. Each client's
//! first request is a warm-up (see `clients::drive`), scored for precision
//! only.

use axum::extract::Path;
use sentry_profiling_tests::clients::{
    assert_shown, captured_options, client_of, cpu, cpu_across_await, drive, own_and_other, shown,
};
use sentry_profiling_tests::{CaptureTransport, link_problem, run_service_with, split_items};
use serde_json::Value;

const CLIENTS: u64 = 6;
const REQUESTS_PER_CLIENT: u64 = 7;
const CPU_MS: u64 = 20;

async fn work(Path(k): Path<u64>) -> String {
    use tracing::Instrument;
    let x = cpu_across_await(k, CPU_MS).await;
    // A span of the handler's own: a child of the transaction itself.
    async { tokio::task::yield_now().await }
        .instrument(tracing::info_span!("handler.step"))
        .await;
    format!("{x:x}\n")
}

/// Burns its CPU, then panics before its first `.await`.
async fn panics(Path(k): Path<u64>) -> String {
    let x = cpu(k, CPU_MS);
    if x != 1 {
        panic!("handler for client {k} fails on purpose");
    }
    String::new()
}

/// One test, so the PII checks (a hub of their own) never run beside the
/// service (the process's main hub).
#[test]
fn http_layer() {
    pii_rules_follow_send_default_pii();
    records_the_request_and_survives_panics();
}

fn records_the_request_and_survives_panics() {
    let capture = CaptureTransport::new();
    let options = captured_options(&capture);
    let app = axum::Router::new()
        .route("/work/{k}", axum::routing::get(work))
        .route("/panic/{k}", axum::routing::get(panics))
        .layer(sentry_profiling_tracing::http_layer());
    // Every third request panics (never a warm-up).
    let responses = run_service_with(options, app, |addr, _| {
        drive(addr, CLIENTS, REQUESTS_PER_CLIENT, |k, n| {
            if n % 3 == 2 {
                format!("/panic/{k}?n={n}")
            } else {
                format!("/work/{k}?n={n}&user=u:p")
            }
        })
    });
    let requests = (CLIENTS * REQUESTS_PER_CLIENT) as usize;
    let panicking = (CLIENTS * (REQUESTS_PER_CLIENT / 3)) as usize;
    let ok = responses
        .iter()
        .filter(|r| r.starts_with("HTTP/1.1 200"))
        .count();
    assert_eq!(ok, requests - panicking, "every other request succeeds");

    let (chunks, transactions) = split_items(&capture.envelopes());
    assert_eq!(
        transactions.len(),
        requests,
        "one transaction per request, panicking ones included"
    );
    let (mut own, mut other, mut scored, mut showing_own, mut panicked) = (0, 0, 0, 0, 0);
    let mut child_spans = 0;
    for tx in &transactions {
        let name = tx["transaction"].as_str().unwrap_or("?");
        let (k, n) = client_of(tx).unwrap_or_else(|| panic!("no client in {tx}"));
        let request = &tx["request"];
        assert_eq!(request["method"], "GET", "{tx}");
        let url = request["url"].as_str().unwrap_or_default();
        let expected = if name == "GET /panic/{k}" {
            panicked += 1;
            assert_eq!(
                tx.pointer("/contexts/trace/status").and_then(Value::as_str),
                Some("internal_error"),
                "a panicking handler's transaction: {tx}"
            );
            format!("http://localhost/panic/{k}?n={n}")
        } else {
            assert_eq!(name, "GET /work/{k}");
            format!("http://localhost/work/{k}?n={n}&user=u:p")
        };
        assert_eq!(url, expected, "request.url");
        let headers = request["headers"].as_object().expect("request.headers");
        assert_eq!(
            headers.get("host").and_then(Value::as_str),
            Some("localhost")
        );
        assert!(headers.contains_key("sentry-trace"), "{headers:?}");
        let root_span_id = tx.pointer("/contexts/trace/span_id");
        for span in tx["spans"].as_array().into_iter().flatten() {
            assert_ne!(
                span["description"], "http.request",
                "spurious child span: {span}"
            );
            assert!(
                span.pointer("/data/sentry_profiling.http_root").is_none(),
                "{span}"
            );
            assert_eq!(span.get("parent_span_id"), root_span_id, "{span}");
            child_spans += 1;
        }
        let problem = link_problem(tx, &chunks);
        let (o, x) = own_and_other(tx, &chunks);
        own += o;
        other += x;
        if n == 0 {
            continue;
        }
        if let Some(problem) = problem {
            panic!("transaction not linked: {problem}");
        }
        scored += 1;
        showing_own += usize::from(o > 0);
        if o == 0 {
            println!(
                "{name} (client {k}, request {n}) shows no own CPU sample ({x} of others), window {:?}",
                sentry_profiling_tests::transaction_window(tx)
            );
        }
    }
    assert_eq!(panicked, panicking);
    assert_eq!(
        child_spans,
        requests - panicking,
        "the handler's own span, once per successful request, and no other"
    );
    let precision = own as f64 / (own + other).max(1) as f64;
    println!(
        "{scored} scored transactions ({panicked} panicked), {showing_own} show their own CPU function; {own} own CPU samples shown, {other} of other requests; precision {precision:.4}"
    );
    assert!(precision >= 0.99, "precision {precision:.4} < 0.99");
    // Every transaction linked (above) and precision; how many show their
    // own CPU function at all, weighted as Sentry weights what it shows:
    assert_shown("http_layer() with apply", &shown(&transactions, &chunks));
}

/// A service that answers `200` at once.
#[derive(Clone)]
struct Ok200;

impl tower_service::Service<http::Request<()>> for Ok200 {
    type Response = http::Response<()>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<http::Response<()>, std::convert::Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<()>) -> Self::Future {
        std::future::ready(Ok(http::Response::new(())))
    }
}

/// Headers Sentry counts as personal are left out unless
/// `send_default_pii` is set; a user name and password in the URL are
/// always replaced.
fn pii_rules_follow_send_default_pii() {
    for with_pii in [false, true] {
        let capture = CaptureTransport::new();
        let mut options = sentry::ClientOptions::new().traces_sample_rate(1.0);
        options.dsn = sentry_profiling_examples::LOCAL_DSN.parse().ok();
        options.transport = Some(capture.factory());
        options.send_default_pii = with_pii;
        let hub = std::sync::Arc::new(sentry::Hub::new(
            Some(std::sync::Arc::new(sentry::Client::from(options))),
            std::sync::Arc::new(Default::default()),
        ));
        sentry::Hub::run(hub, || {
            use tower_service::Service;
            let mut service =
                tower_layer::Layer::layer(&sentry_profiling_tracing::http_layer(), Ok200);
            let req = http::Request::get("http://user:secret@example.com:8080/a?b=c")
                .header("authorization", "Bearer t")
                .header("cookie", "session=1")
                .header("x-forwarded-for", "10.0.0.1")
                .header("accept", "text/plain")
                .body(())
                .unwrap();
            let fut = service.call(req);
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(fut).unwrap();
        });
        let (_, transactions) = split_items(&capture.envelopes());
        let [tx] = transactions.as_slice() else {
            panic!("one transaction expected, got {}", transactions.len());
        };
        let request = &tx["request"];
        assert_eq!(
            request["url"], "http://%5BFiltered%5D:%5BFiltered%5D@example.com:8080/a?b=c",
            "{request}"
        );
        let headers = request["headers"].as_object().expect("headers");
        assert_eq!(
            headers.get("accept").and_then(Value::as_str),
            Some("text/plain")
        );
        for personal in ["authorization", "cookie", "x-forwarded-for"] {
            assert_eq!(
                headers.contains_key(personal),
                with_pii,
                "{personal} with send_default_pii = {with_pii}: {headers:?}"
            );
        }
    }
}
