//! Async attribution, measured against the truth: with lanes, what Sentry
//! shows for each transaction is that request's own work (precision at
//! least 0.99, recall at least 0.85 for requests with 3 or more samples),
//! where OS thread ids show other requests' work and miss its own.
//!
//! Recall is below 1 by design: a sample that stands for time a thread was
//! not running (a fill) is filed under a request only where the thread is
//! known to stand in that request (preempted in it, or waiting inside it);
//! otherwise it goes to the OS thread, and a moment the truth gives to the
//! request (its future was being polled, the thread was preempted) can be
//! missing from its lane. Precision is what a user relies on: nothing
//! foreign in a transaction's profile.

use sentry_profiling::attribution::ThreadAttribution;
use sentry_profiling_tests::attribution::measure;

#[test]
fn lanes_show_each_request_its_own_samples() {
    let lanes = measure(ThreadAttribution::Lanes, 6);
    let os = measure(ThreadAttribution::OsThreads, 6);
    eprintln!("lanes: {lanes:?}");
    eprintln!("os threads: {os:?}");
    assert!(lanes.requests >= 10, "enough requests scored: {lanes:?}");
    assert!(
        lanes.precision >= 0.99,
        "lane precision {:.3}",
        lanes.precision
    );
    assert!(lanes.recall >= 0.85, "lane recall {:.3}", lanes.recall);
    assert!(
        lanes.precision > os.precision && lanes.recall > os.recall,
        "lanes measure better than OS threads: {lanes:?} vs {os:?}"
    );
}
