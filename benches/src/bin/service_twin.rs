//! The example service for overhead comparisons: one binary, the profiler
//! chosen at start (`off`, `sentry-profiling`, `pprof-rs`), the same router,
//! tracing and Sentry set-up: transactions through the SDK's HTTP transport
//! to `SENTRY_DSN` (a loopback sink in the cost benchmark), or to an
//! envelope directory without one.
//!
//! `service_twin <mode>`; `ADDR` and `SENTRY_ENVELOPE_DIR` as for the
//! example; with `TWIN_STATS` set, the profiler's counters are printed to
//! stderr at the end (unwinding time, ticks' CPU time, samples). Runs
//! until SIGINT/SIGTERM. Unlike the example, its transport
//! queues up to 200,000 transactions (see `TRANSACTION_QUEUE`).

use sentry_profiling_examples::{Settings, init_tracing, sentry_options, serve_until_signal};

/// Transactions the twin's transport queues at most: more than a round of
/// the cost benchmark sends.
const TRANSACTION_QUEUE: std::num::NonZeroUsize = std::num::NonZeroUsize::new(200_000).unwrap();

fn main() -> std::process::ExitCode {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "off".into());
    let mut settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("service_twin: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    settings.profile_session_sample_rate = if mode == "sentry-profiling" { 1.0 } else { 0.0 };
    let guard = match sentry_options(&settings) {
        Ok(mut o) => {
            // A round's every transaction waits in the queue rather than
            // being dropped while the transaction sender falls behind at
            // the maximum request rate: the cost benchmark waits until the
            // sink has them all, so each mode pays for delivering the
            // same transactions.
            o.transport_channel_capacity = Some(TRANSACTION_QUEUE);
            sentry::init(o)
        }
        Err(e) => {
            eprintln!("service_twin: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    init_tracing();
    let pprof = match mode.as_str() {
        "pprof-rs" => match pprof::ProfilerGuardBuilder::default()
            .frequency(100)
            .blocklist(&["libc", "libgcc", "pthread", "vdso"])
            .build()
        {
            Ok(g) => Some(g),
            Err(e) => {
                eprintln!("service_twin: pprof-rs: {e}");
                return std::process::ExitCode::FAILURE;
            }
        },
        "off" | "sentry-profiling" => None,
        other => {
            eprintln!("service_twin: unknown mode {other:?} (off, sentry-profiling, pprof-rs)");
            return std::process::ExitCode::FAILURE;
        }
    };
    let served = serve_until_signal(settings.addr, |_| {});
    if let Some(g) = pprof {
        // Build the report as a user would; its cost is after the load.
        let _ = g.report().build();
    }
    if std::env::var_os("TWIN_STATS").is_some() {
        eprintln!("{:#?}", sentry_profiling::stats());
    }
    drop(guard);
    if let Err(e) = served {
        eprintln!("service_twin: {e}");
        return std::process::ExitCode::FAILURE;
    }
    std::process::ExitCode::SUCCESS
}
