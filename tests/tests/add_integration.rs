//! `ClientOptions::add_integration(ProfilingIntegration::new()...)`, the
//! usual sentry-rust way to add an integration, on a real axum service on
//! loopback under concurrent load, with a real DSN and the SDK's HTTP
//! transport to a fake Sentry endpoint.
//!
//! The client builds its transport before an integration's `setup` runs, so
//! this form cannot link transactions or send the last chunk; the crate
//! refuses to profile and says so once, naming `apply`. Sentry itself keeps
//! working: every request's transaction arrives, none claims a profile, no
//! chunk is sent.
//!
//! The service runs in a child process of this binary (a fresh hub and
//! profiler, and a stderr of its own to read).

use std::time::{Duration, Instant};

use sentry_profiling::{ProfileLifecycle, ProfilingIntegration};
use sentry_profiling_tests::fake_sentry::FakeSentry;
use sentry_profiling_tests::{http_get, parse_envelope, run_self_as_child, run_service_with};

const CHILD_ENV: &str = "SENTRY_PROFILING_ADD_INTEGRATION_CHILD";
const REQUESTS: usize = 32;
const CONCURRENCY: usize = 8;

fn main() {
    if std::env::var_os(CHILD_ENV).is_some() {
        child();
        return;
    }
    let (stdout, stderr) = run_self_as_child(CHILD_ENV);
    let warnings = stderr
        .lines()
        .filter(|l| l.starts_with("sentry-profiling:"))
        .collect::<Vec<_>>();
    assert_eq!(
        warnings.len(),
        1,
        "expected exactly one warning from sentry-profiling:\n{stderr}"
    );
    for want in ["profiling disabled", "add_integration", "apply(options)"] {
        assert!(
            warnings[0].contains(want),
            "warning lacks {want:?}: {}",
            warnings[0]
        );
    }
    assert!(stdout.contains("add_integration child ok"), "{stdout}");
    println!("add_integration: refused with one warning naming `apply` ... ok");
}

#[inline(never)]
fn add_integration_handler_cpu(ms: u64) -> u64 {
    let until = Instant::now() + Duration::from_millis(ms);
    let mut x = 1u64;
    while Instant::now() < until {
        x = std::hint::black_box(x.wrapping_mul(0x9e37_79b9).rotate_left(7));
    }
    x
}

fn child() {
    let sentry = FakeSentry::start();
    let mut options = sentry::ClientOptions::new()
        .traces_sample_rate(1.0)
        .add_integration(
            ProfilingIntegration::new()
                .profile_session_sample_rate(1.0)
                .profile_lifecycle(ProfileLifecycle::Trace),
        );
    options.dsn = sentry.dsn().parse().ok();
    options.release = Some("add-integration-test".into());
    let app = axum::Router::new()
        .route(
            "/work/{n}",
            axum::routing::get(
                |axum::extract::Path(n): axum::extract::Path<u64>| async move {
                    format!("{:x}\n", add_integration_handler_cpu(20 + n % 5))
                },
            ),
        )
        .layer(sentry_profiling_tracing::http_layer());
    let statuses = run_service_with(options, app, |addr, _| async move {
        let mut tasks = tokio::task::JoinSet::new();
        let mut statuses = Vec::new();
        for i in 0..REQUESTS {
            if tasks.len() >= CONCURRENCY {
                statuses.push(tasks.join_next().await.expect("task").expect("join"));
            }
            tasks.spawn(async move { http_get(addr, format!("/work/{i}")).await });
        }
        while let Some(r) = tasks.join_next().await {
            statuses.push(r.expect("join"));
        }
        statuses
    });
    let ok = statuses
        .iter()
        .filter(|r| r.starts_with("HTTP/1.1 200"))
        .count();
    assert_eq!(ok, REQUESTS, "every request succeeds");
    assert!(
        sentry_profiling::stats().is_none(),
        "no profiling session may exist"
    );

    let mut transactions = Vec::new();
    for request in sentry.requests() {
        for item in parse_envelope(&request.body).items {
            let kind = item.header.get("type").and_then(|t| t.as_str());
            assert_ne!(kind, Some("profile_chunk"), "a chunk was sent");
            if kind == Some("transaction") {
                transactions.push(
                    serde_json::from_slice::<serde_json::Value>(&item.payload)
                        .expect("transaction JSON"),
                );
            }
        }
    }
    assert_eq!(
        transactions.len(),
        REQUESTS,
        "Sentry keeps working: one transaction per request"
    );
    for tx in &transactions {
        assert!(
            tx.pointer("/contexts/profile").is_none(),
            "a transaction claims a profile that was never sent: {tx}"
        );
    }
    println!("add_integration child ok");
}
