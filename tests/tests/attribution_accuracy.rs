//! Async attribution, measured against the truth: with lanes, what Sentry
//! shows for each transaction is that request's own work (precision at
//! least 0.99, recall at least 0.95 for requests with 3 or more samples),
//! where OS thread ids show other requests' work and miss its own. Both are
//! measured in this run on the example's mix of concurrent `/work` (CPU in
//! slices with `yield_now`) and `/sleep` requests on two Tokio workers.

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
    assert!(lanes.recall >= 0.95, "lane recall {:.3}", lanes.recall);
    assert!(
        lanes.precision > os.precision && lanes.recall > os.recall,
        "lanes measure better than OS threads: {lanes:?} vs {os:?}"
    );
}
