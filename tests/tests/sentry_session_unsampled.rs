//! Session sampling: rate 0 (the default) and invalid rates profile
//! nothing and send no chunk, without panicking; transactions are sent
//! unchanged.

use std::time::Duration;

use sentry_profiling::{ProfileLifecycle, ProfilingIntegration};
use sentry_profiling_tests::{CaptureTransport, split_items};
use tracing_subscriber::prelude::*;

fn run(integration: ProfilingIntegration) -> (usize, usize, bool) {
    let capture = CaptureTransport::new();
    let mut options = sentry::ClientOptions::new().traces_sample_rate(1.0);
    options.dsn = "https://public@sentry.invalid/1".parse().ok();
    options.transport = Some(capture.factory());
    let guard = sentry::init(
        integration
            .profile_lifecycle(ProfileLifecycle::Trace)
            .apply(options),
    );
    let sub = tracing_subscriber::registry()
        .with(sentry::integrations::tracing::SpanLayer::new())
        .with(sentry_profiling_tracing::layer());
    tracing::subscriber::with_default(sub, || {
        tracing::info_span!("root").in_scope(|| {
            sentry_profiling::start_profiler(); // no-op in trace mode
            std::thread::sleep(Duration::from_millis(100));
            assert!(
                sentry_profiling::hooks::session()
                    .and_then(|s| s.running_profiler_id())
                    .is_none()
            );
        });
    });
    let sampled = sentry_profiling::stats().is_some_and(|s| s.session_sampled);
    drop(guard);
    let (chunks, transactions) = split_items(&capture.envelopes());
    assert!(
        transactions
            .iter()
            .all(|t| t.pointer("/contexts/profile").is_none())
    );
    (chunks.len(), transactions.len(), sampled)
}

#[test]
fn unsampled_and_invalid_rates_profile_nothing() {
    assert_eq!(
        run(ProfilingIntegration::new()),
        (0, 1, false),
        "default rate 0"
    );
    for bad in [f64::NAN, -0.5, 1.5] {
        let (chunks, transactions, sampled) =
            run(ProfilingIntegration::new().profile_session_sample_rate(bad));
        assert_eq!((chunks, transactions, sampled), (0, 1, false), "rate {bad}");
    }
    let (chunks, _, _) = run(ProfilingIntegration::new()
        .profile_session_sample_rate(1.0)
        .frequency_hz(0));
    assert_eq!(chunks, 0, "an invalid frequency disables profiling");
}
