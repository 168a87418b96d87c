//! A service as its own authors write one, with this project's two crates
//! added as the README says and nothing else of the workspace: its own
//! `tracing_subscriber::fmt::init()` and an INFO log. The test
//! `tests/tests/setup_changes_nothing.rs` builds it on its own, so that its
//! dependencies' features are the ones a service gets, and checks that the
//! log still appears.

use sentry_profiling::{EnvelopeDirTransport, ProfileLifecycle, ProfilingIntegration};

/// What the service logs at INFO; the test looks for it on stdout.
const INFO_LINE: &str = "setup-check: the service's own INFO log";

#[tokio::main]
async fn main() {
    let dir = std::env::args_os().nth(1).map_or_else(
        || std::env::temp_dir().join("sentry-profiling-setup-check"),
        std::path::PathBuf::from,
    );
    let mut options = sentry::ClientOptions::new().traces_sample_rate(1.0);
    // Envelopes stay on this machine: any DSN, with the crate's envelope
    // directory as the transport (the README's line for local envelopes).
    options.dsn = "https://public@sentry.invalid/1".parse().ok();
    options.transport = Some(EnvelopeDirTransport::factory(&dir).expect("envelope directory"));
    let _guard = sentry::init(
        ProfilingIntegration::new()
            .profile_session_sample_rate(1.0)
            .profile_lifecycle(ProfileLifecycle::Trace)
            .apply(options),
    );
    // The service's logging, as it was before the crates were added: with
    // tracing-subscriber's default features, INFO and above unless
    // `RUST_LOG` says otherwise.
    tracing_subscriber::fmt::init();
    tracing::info!("{INFO_LINE}");
}
