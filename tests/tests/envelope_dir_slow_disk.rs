//! The example service writing its envelopes to a directory on a slow disk
//! (the transport's writer pauses before every write): requests take no
//! longer than with a fast one, since the transactions are only queued on
//! the Tokio workers, and the service shuts down within the client's
//! shutdown timeout although the writer is seconds behind.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sentry::Transport;
use sentry_profiling::{EnvelopeDirTransport, ProfileLifecycle, ProfilingIntegration};
use sentry_profiling_tests::{http_get, local_settings, run_service_with};

/// The writer's pause per envelope while the disk is slow: what a writer
/// on the workers would add to every request.
const DELAY: Duration = Duration::from_millis(100);
/// Rounds of requests, each one batch with a fast disk and one with a slow
/// one, so that both see the same machine.
const ROUNDS: usize = 4;
/// Sequential requests per batch.
const PER_BATCH: usize = 15;
/// Requests made last, with the disk slow, to leave the writer this many
/// envelopes (of `DELAY` each) behind at shutdown.
const BACKLOG: usize = 80;
/// The client's shutdown timeout.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(1);
/// What a busy machine may add to the shutdown (the server's graceful
/// stop, the runtime's, the profiler's last chunk); far less than the
/// backlog's `BACKLOG * DELAY`.
const SHUTDOWN_SLACK: Duration = Duration::from_secs(4);

/// Sends `n` requests one after the other, returning each one's latency.
async fn timed_requests(addr: std::net::SocketAddr, n: usize) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        let response = http_get(addr, "/").await;
        latencies.push(started.elapsed());
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    }
    latencies
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[test]
fn a_slow_envelope_directory_costs_requests_nothing() {
    assert!(BACKLOG as u32 * DELAY > SHUTDOWN_TIMEOUT + SHUTDOWN_SLACK);
    let settings = local_settings("slow-disk");
    let transport = Arc::new(EnvelopeDirTransport::new(&settings.envelope_dir).expect("dir"));
    // The example's options without a DSN (`sentry_options`), with a
    // transport this test keeps a handle on.
    let mut options = sentry::ClientOptions::new().traces_sample_rate(1.0);
    options.dsn = sentry_profiling_examples::LOCAL_DSN.parse().ok();
    options.shutdown_timeout = SHUTDOWN_TIMEOUT;
    options.transport = Some(Arc::new(Arc::clone(&transport)));
    let options = ProfilingIntegration::new()
        .profile_session_sample_rate(1.0)
        .profile_lifecycle(ProfileLifecycle::Trace)
        .apply(options);

    let slowed = Arc::clone(&transport);
    let (fast, slow, stopping) = run_service_with(
        options,
        sentry_profiling_examples::router(),
        |addr, _| async move {
            let set_delay =
                |d| sentry_profiling::hooks::workspace::set_envelope_dir_write_delay(&slowed, d);
            timed_requests(addr, 5).await;
            let (mut fast, mut slow) = (Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                // The fast batch starts with the writer caught up.
                set_delay(Duration::ZERO);
                let writer = Arc::clone(&slowed);
                // Through `&EnvelopeDirTransport`: sentry-core's
                // `Transport for Arc<T>` does not forward `flush`.
                let caught_up = tokio::task::spawn_blocking(move || {
                    Transport::flush(&*writer, Duration::from_secs(30))
                });
                assert!(caught_up.await.unwrap(), "the writer never caught up");
                fast.extend(timed_requests(addr, PER_BATCH).await);
                set_delay(DELAY);
                slow.extend(timed_requests(addr, PER_BATCH).await);
            }
            timed_requests(addr, BACKLOG).await;
            (fast, slow, Instant::now())
        },
    );
    let shutdown = stopping.elapsed();

    let (fast, slow) = (median(fast), median(slow));
    eprintln!(
        "median latency {fast:?} with a fast disk, {slow:?} with {DELAY:?} per write; \
         shutdown took {shutdown:?}"
    );
    assert!(
        slow < fast + DELAY / 2,
        "requests slowed down with the disk: median {slow:?} against {fast:?}"
    );
    assert!(
        shutdown < SHUTDOWN_TIMEOUT + SHUTDOWN_SLACK,
        "shutdown took {shutdown:?} with a {SHUTDOWN_TIMEOUT:?} timeout"
    );
    // The writer was still seconds behind when the timeout passed: what it
    // had not written is dropped, not waited for, once its current write
    // returns.
    let deadline = Instant::now() + DELAY + SHUTDOWN_SLACK;
    while transport.dropped() == 0 {
        assert!(
            Instant::now() < deadline,
            "nothing was left behind at shutdown"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!(
        "envelopes written {}, dropped {}, failed {}",
        transport.written(),
        transport.dropped(),
        transport.failed()
    );
    assert_eq!(transport.failed(), 0);
    let _ = std::fs::remove_dir_all(&settings.envelope_dir);
}
