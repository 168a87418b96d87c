//! Transaction-based profiles (format V1): each profiled transaction's
//! envelope carries one `profile` item with the spec's fields, its own
//! window's samples (overlapping transactions share the sampler), a link
//! both ways; too-short profiles are dropped with a counted reason; no
//! continuous chunk is sent, whatever `profile_session_sample_rate` says.

use std::time::Duration;

use sentry_profiling::ProfilingIntegration;
use sentry_profiling_tests::{
    CaptureTransport, http_get, run_service_with, timestamp_secs, transaction_window,
};
use serde_json::Value;

fn options(
    capture: &std::sync::Arc<CaptureTransport>,
    integration: ProfilingIntegration,
) -> sentry::ClientOptions {
    let mut options = sentry::ClientOptions::new().traces_sample_rate(1.0);
    options.dsn = "https://public@sentry.invalid/1".parse().ok();
    options.release = Some("v1-test@1.0".into());
    options.transport = Some(capture.factory());
    integration.apply(options)
}

/// Envelopes as (transaction, optional profile, item types).
fn collect(capture: &CaptureTransport) -> Vec<(Value, Option<Value>, Vec<String>)> {
    capture
        .envelopes()
        .iter()
        .filter_map(|env| {
            let types: Vec<String> = env
                .items
                .iter()
                .filter_map(|i| i.header["type"].as_str().map(str::to_owned))
                .collect();
            let item = |t: &str| {
                env.items
                    .iter()
                    .find(|i| i.header["type"] == t)
                    .map(|i| serde_json::from_slice::<Value>(&i.payload).unwrap())
            };
            Some((item("transaction")?, item("profile"), types))
        })
        .collect()
}

#[test]
fn profiled_transactions_carry_their_own_v1_profile() {
    let capture = CaptureTransport::new();
    let integration = ProfilingIntegration::new()
        .profile_session_sample_rate(1.0) // no effect: V1 takes precedence
        .profiles_sample_rate(1.0);
    run_service_with(
        options(&capture, integration),
        sentry_profiling_examples::router(),
        |addr, _| async move {
            let mut tasks = Vec::new();
            for _ in 0..3 {
                tasks.push(tokio::spawn(http_get(addr, "/work/100")));
            }
            tasks.push(tokio::spawn(http_get(addr, "/sleep/60")));
            for t in tasks {
                assert!(t.await.unwrap().starts_with("HTTP/1.1 200"));
            }
            // Too short for two samples: its profile is dropped, it is not.
            assert!(http_get(addr, "/").await.starts_with("HTTP/1.1 200"));
            tokio::time::sleep(Duration::from_millis(50)).await;
        },
    );
    let all = capture.envelopes();
    assert!(
        all.iter()
            .all(|e| e.items.iter().all(|i| i.header["type"] != "profile_chunk")),
        "no continuous chunks in transaction-based mode"
    );
    let envelopes = collect(&capture);
    assert_eq!(envelopes.len(), 5, "every transaction arrives");
    let mut with_burn = 0;
    for (tx, profile, types) in &envelopes {
        assert!(
            types.iter().filter(|t| *t == "profile").count() <= 1,
            "at most one profile per envelope"
        );
        let name = tx["transaction"].as_str().unwrap();
        let Some(p) = profile else {
            assert_eq!(
                name, "GET /",
                "only the too-short transaction lacks a profile"
            );
            assert!(tx.pointer("/contexts/profile").is_none());
            continue;
        };
        assert_eq!(p["version"], "1");
        assert_eq!(p["platform"], "rust");
        assert_eq!(p["release"], "v1-test@1.0");
        assert!(
            p["device"]["architecture"]
                .as_str()
                .is_some_and(|a| !a.is_empty())
        );
        assert_eq!(p["os"]["name"], "Linux");
        assert!(p["os"]["version"].as_str().is_some_and(|v| !v.is_empty()));
        let event_id = p["event_id"].as_str().unwrap();
        assert_eq!(event_id.len(), 32);
        assert_eq!(
            tx.pointer("/contexts/profile/profile_id")
                .and_then(Value::as_str),
            Some(event_id)
        );
        assert_eq!(
            tx.pointer("/contexts/profile/type").and_then(Value::as_str),
            Some("profile")
        );
        assert_eq!(p["transaction"]["id"], tx["event_id"]);
        assert_eq!(p["transaction"]["name"], tx["transaction"]);
        assert_eq!(
            p["transaction"]["trace_id"],
            tx["contexts"]["trace"]["trace_id"]
        );
        assert_eq!(
            p["transaction"]["active_thread_id"],
            tx["contexts"]["trace"]["data"]["thread.id"]
        );
        assert!(
            tx.pointer("/contexts/trace/data/sentry_profiling.profile_v1")
                .is_none()
        );
        let (start, end) = transaction_window(tx).unwrap();
        let ts = timestamp_secs(&p["timestamp"]).unwrap();
        assert!(
            (ts - start).abs() < 1e-3,
            "profile timestamp is the transaction's start"
        );
        assert!(
            p["debug_meta"]["images"]
                .as_array()
                .is_some_and(|i| i.iter().all(|i| i["type"] == "symbolic"))
        );
        let samples = p["profile"]["samples"].as_array().unwrap();
        assert!(samples.len() >= 2);
        let active = p["transaction"]["active_thread_id"].as_str().unwrap();
        let mut burn = false;
        let mut running_marks = 0;
        for s in samples {
            let elapsed: u64 = s["elapsed_since_start_ns"]
                .as_str()
                .expect("a string")
                .parse()
                .unwrap();
            assert!(
                elapsed as f64 / 1e9 <= end - start + 1e-3,
                "samples from the transaction's own window"
            );
            let stack = &p["profile"]["stacks"][s["stack_id"].as_u64().unwrap() as usize];
            let running = stack.as_array().unwrap().iter().any(|f| {
                p["profile"]["frames"][f.as_u64().unwrap() as usize]["function"]
                    == sentry_view::RUNNING_REQUEST_FUNCTION
            });
            if running {
                // On an OS thread only (the transaction's own, when its
                // request stayed on its OS thread, may show that it polled
                // another request meanwhile); never on a request's lane.
                assert!(
                    !sentry_view::is_lane_thread_id(s["thread_id"].as_str().unwrap()),
                    "(running a request) marks an OS thread, never a request's lane"
                );
                running_marks += 1;
            }
            if s["thread_id"] == active {
                burn |= stack.as_array().unwrap().iter().any(|f| {
                    p["profile"]["frames"][f.as_u64().unwrap() as usize]["function"]
                        == "sentry_profiling_examples::burn_cpu"
                });
            }
        }
        if name.starts_with("GET /work") {
            assert!(
                running_marks > 0,
                "the worker that ran {name} shows (running a request) in its OS-thread timeline, \
                 so Sentry charges that time to no unrelated stack"
            );
        }
        with_burn += usize::from(burn);
    }
    assert_eq!(
        with_burn, 3,
        "each /work profile shows burn_cpu on its own thread"
    );
    let stats = sentry_profiling::stats().unwrap();
    let short_has_profile = envelopes
        .iter()
        .any(|(tx, p, _)| tx["transaction"] == "GET /" && p.is_some());
    assert_eq!(
        stats.transaction_profiles_sent,
        4 + u64::from(short_has_profile)
    );
    assert_eq!(
        stats.transaction_profiles_dropped.too_few_samples,
        u64::from(!short_has_profile),
        "a profile with fewer than 2 samples is dropped and counted"
    );
    assert_eq!(stats.chunks_sent, 0);

    // profiles_sampler decides by transaction name.
    let capture = CaptureTransport::new();
    let integration = ProfilingIntegration::new().profiles_sampler(|name| {
        if name.starts_with("GET /work") {
            1.0
        } else {
            0.0
        }
    });
    run_service_with(
        options(&capture, integration),
        sentry_profiling_examples::router(),
        |addr, _| async move {
            assert!(http_get(addr, "/work/60").await.starts_with("HTTP/1.1 200"));
            assert!(
                http_get(addr, "/sleep/60")
                    .await
                    .starts_with("HTTP/1.1 200")
            );
        },
    );
    for (tx, profile, _) in collect(&capture) {
        let work = tx["transaction"] == "GET /work/{ms}";
        assert_eq!(profile.is_some(), work, "{}", tx["transaction"]);
    }
}
