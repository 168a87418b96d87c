//! sentry-tower alone (`NewSentryLayer` + `SentryHttpLayer` making the
//! transactions, sentry's documented axum setup) with the profiling tracing
//! layer registered but no `http_layer()`: no span the tracing layer sees
//! roots a request, so nothing can be profiled. On a real axum service on
//! loopback under concurrent load, the crate says so once, naming the fix
//! (`http_layer()` inside sentry-tower's layers), and sentry-tower's
//! transactions still all arrive, none claiming a profile.
//!
//! (With `http_layer()` inside sentry-tower's layers every transaction is
//! profiled: `compose_sentry_tower.rs`.)
//!
//! The service runs in a child process of this binary (a fresh hub and
//! profiler, and a stderr of its own to read).

use axum::extract::Path;
use sentry_profiling::{ProfileLifecycle, ProfilingIntegration};
use sentry_profiling_tests::clients::{cpu, drive};
use sentry_profiling_tests::{CaptureTransport, run_self_as_child, run_service_with, split_items};

const CHILD_ENV: &str = "SENTRY_PROFILING_TOWER_ALONE_CHILD";
const CLIENTS: u64 = 6;
const REQUESTS_PER_CLIENT: u64 = 5;

fn main() {
    if std::env::var_os(CHILD_ENV).is_some() {
        child();
        return;
    }
    let (stdout, stderr) = run_self_as_child(CHILD_ENV);
    let warnings: Vec<_> = stderr
        .lines()
        .filter(|l| l.starts_with("sentry-profiling:"))
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "expected exactly one warning from sentry-profiling:\n{stderr}"
    );
    for want in [
        "has no profiled root span",
        "SentryHttpLayer",
        "sentry_profiling_tracing::http_layer()",
    ] {
        assert!(
            warnings[0].contains(want),
            "warning lacks {want:?}: {}",
            warnings[0]
        );
    }
    assert!(stdout.contains("sentry_tower_alone child ok"), "{stdout}");
    println!("sentry_tower_alone: one warning naming `http_layer()` ... ok");
}

async fn work(Path(k): Path<u64>) -> String {
    let x = cpu(k, 15);
    tokio::task::yield_now().await;
    format!("{x:x}\n")
}

fn child() {
    let capture = CaptureTransport::new();
    let mut options = sentry::ClientOptions::new().traces_sample_rate(1.0);
    options.dsn = sentry_profiling_examples::LOCAL_DSN.parse().ok();
    options.transport = Some(capture.factory());
    let options = ProfilingIntegration::new()
        .profile_session_sample_rate(1.0)
        .profile_lifecycle(ProfileLifecycle::Trace)
        .apply(options);
    let app = axum::Router::new()
        .route("/work/{k}", axum::routing::get(work))
        .layer(sentry_tower::SentryHttpLayer::new().enable_transaction())
        .layer(sentry_tower::NewSentryLayer::new_from_top());
    let responses = run_service_with(options, app, |addr, _| {
        drive(addr, CLIENTS, REQUESTS_PER_CLIENT, |k, _| {
            format!("/work/{k}")
        })
    });
    let requests = (CLIENTS * REQUESTS_PER_CLIENT) as usize;
    assert_eq!(
        responses
            .iter()
            .filter(|r| r.starts_with("HTTP/1.1 200"))
            .count(),
        requests,
        "every request succeeds"
    );
    let (chunks, transactions) = split_items(&capture.envelopes());
    assert_eq!(transactions.len(), requests, "sentry-tower's transactions");
    for tx in &transactions {
        assert_eq!(tx["contexts"]["trace"]["origin"], "auto.http.tower");
        assert!(tx.pointer("/contexts/profile").is_none(), "{tx}");
    }
    assert!(chunks.is_empty(), "nothing was profiled, no chunk is sent");
    println!("sentry_tower_alone child ok");
}
