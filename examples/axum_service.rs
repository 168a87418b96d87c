//! The example service: `cargo run --release --example axum_service`.
//!
//! Serves `GET /`, `GET /work/{ms}`, `GET /sleep/{ms}`, `GET /db/{ms}` (a
//! query on a database thread of its own) and `GET /render/{ms}` (CPU on
//! Tokio's blocking pool) on `$ADDR`
//! (default `127.0.0.1:3000`), profiled continuously. Without `SENTRY_DSN`
//! every envelope is written to `$SENTRY_ENVELOPE_DIR` (default
//! `./sentry-envelopes/`). Ctrl-C or SIGTERM shuts down gracefully and prints
//! a summary.

use sentry_profiling_examples::{
    Settings, init_tracing, sentry_options, serve_until_signal, summarize_envelopes,
};

fn main() -> std::process::ExitCode {
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("axum_service: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let options = match sentry_options(&settings) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("axum_service: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let guard = sentry::init(options);
    init_tracing();

    let served = serve_until_signal(settings.addr, |addr| {
        eprintln!("axum_service: listening on http://{addr}");
    });
    eprintln!("axum_service: stopped; in-flight requests have finished");
    // In-flight requests have finished; their transactions are sent. Take
    // the counters before the client closes, then close it: that sends the
    // last profile chunk and waits for the transport.
    let stats_before_close = sentry_profiling::stats();
    drop(guard);
    let stats = sentry_profiling::stats().or(stats_before_close);

    if let Err(e) = served {
        eprintln!("axum_service: server error: {e}");
        return std::process::ExitCode::FAILURE;
    }
    print_summary(&settings, stats);
    std::process::ExitCode::SUCCESS
}

fn print_summary(settings: &Settings, stats: Option<sentry_profiling::ProfilerStats>) {
    println!("axum_service: summary");
    if let Some(s) = &stats {
        println!(
            "  profiler: session sampled {}, {} chunks, {} samples sent, {} captured, dropped {} (queue full) + {} (single-sample threads)",
            s.session_sampled,
            s.chunks_sent,
            s.samples_sent,
            s.sampler.samples_captured,
            s.sampler.dropped_queue_full,
            s.samples_single_thread,
        );
        if let Some(problem) = sentry_profiling_examples::sampling_problem(s) {
            println!("  {problem}");
        }
    }
    match &settings.dsn {
        Some(_) => println!("  envelopes sent to the configured SENTRY_DSN"),
        None => {
            let summary = summarize_envelopes(&settings.envelope_dir);
            println!(
                "  {} envelopes in {}: {} profile chunks, {} transactions",
                summary.files,
                settings.envelope_dir.display(),
                summary.chunks,
                summary.transactions
            );
            match sentry_profiling_examples::write_preview(&settings.envelope_dir, stats.as_ref()) {
                Ok(page) => println!("  what Sentry will show, per request: {}", page.display()),
                Err(e) => println!("  no preview page: {e}"),
            }
        }
    }
    if let Some(dir) = settings.export_dir() {
        for file in [
            sentry_profiling_examples::PPROF_FILE,
            sentry_profiling_examples::OTLP_FILE,
        ] {
            let path = dir.join(file);
            if path.exists() {
                println!(
                    "  {} (the last chunk; older ones in {}.1, .2, …)",
                    path.display(),
                    file
                );
            }
        }
    }
}
