//! How much of the work done in polls of every length Sentry shows
//! (`sentry_profiling_tests::short_polls`): the example's
//! `GET /work/60/{slice_ms}` with slices of 1, 3, 6, 12 and 30 ms, four
//! connections on two Tokio workers, idle and then beside four CPU hogs.
//! For each slice length: `burn_cpu` as the transactions' profiles show it
//! (bare or estimated, and the estimated part alone) and as Sentry's
//! function metrics give it, over its wall time less the time shown
//! waiting for a CPU (the target: 0.9 to 1.1); and over its threads' CPU
//! time; `burn_cpu`'s share of the running time shown; the share with no
//! stack (the target: at most 2 % idle); requests with no capture.
//!
//! `cargo bench -p sentry-profiling-benches --bench short_polls`
//! (`SHORT_POLLS_ROUNDS`, default 30 rounds of one request per slice
//! length); `-- --test` is the smoke run (2 rounds, idle only).

use std::process::Command;

use sentry_profiling_tests::attribution::CpuHogs;
use sentry_profiling_tests::short_polls::{SliceFigures, measure};

/// Set in the child that measures one case (a fresh Sentry client and
/// profiler each): `idle` or `hogs`.
const CASE: &str = "SHORT_POLLS_CASE";

fn main() {
    let smoke = std::env::args().any(|a| a == "--test");
    let rounds: u64 = if smoke {
        2
    } else {
        std::env::var("SHORT_POLLS_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(30)
    };
    if let Ok(case) = std::env::var(CASE) {
        let hogs = (case == "hogs").then(CpuHogs::start);
        let figures = measure(rounds, 4, include_str!("../../README.md"));
        drop(hogs);
        println!("short_polls, {case}: {rounds} rounds");
        println!("{}", SliceFigures::TABLE_HEADER);
        for f in &figures {
            println!("{f}");
        }
        assert!(
            figures.iter().any(|f| f.bare_ns > 0),
            "burn_cpu shown in no request"
        );
        return;
    }
    let cases: &[&str] = if smoke { &["idle"] } else { &["idle", "hogs"] };
    for case in cases {
        let out = Command::new(std::env::current_exe().expect("this benchmark's path"))
            .args(std::env::args().skip(1))
            .env(CASE, case)
            .output()
            .expect("the benchmark's child runs");
        print!("{}", String::from_utf8_lossy(&out.stdout));
        assert!(
            out.status.success(),
            "the {case} case failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
