//! Async attribution accuracy: what Sentry would show for each transaction
//! of the example's request mix, scored against instrumented truth (see
//! `sentry_profiling_tests::attribution`), with lanes and with OS thread
//! ids, in the same run.
//!
//! `cargo bench -p sentry-profiling-benches --bench attribution` (add
//! `-- --test` for a short smoke run).

use sentry_profiling::ThreadAttribution;
use sentry_profiling_tests::attribution::measure;

fn main() {
    let quick = std::env::args().any(|a| a == "--test");
    let rounds = if quick { 2 } else { 20 };
    println!(
        "| attribution | requests scored (≥ 3 samples) | precision mean [min] | recall mean [min] |"
    );
    println!("|---|---|---|---|");
    for mode in [ThreadAttribution::Lanes, ThreadAttribution::OsThreads] {
        let a = measure(mode, rounds);
        println!(
            "| {:?} | {} | {:.3} [{:.3}] | {:.3} [{:.3}] |",
            mode, a.requests, a.precision, a.min_precision, a.recall, a.min_recall
        );
    }
}
