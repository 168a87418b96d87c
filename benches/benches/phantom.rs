//! Whether a function is shown where it did not run
//! (`sentry_profiling_tests::phantom`): a service with four named CPU
//! functions timed in-process (in a handler before and after an `.await`,
//! on the blocking pool, on a database thread), six concurrent clients on
//! the machine's cores, at the default frequency. For each function: the
//! time Sentry shows in it and the share of that time at moments when no
//! call of it ran anywhere (the phantom share; the target is at most 10%);
//! and the time requests are shown waiting for a CPU against the kernel's
//! run delay of their threads (the target: within 20%).
//!
//! `cargo bench -p sentry-profiling-benches --bench phantom`
//! (`PHANTOM_BENCH_SECS`, default 20; `PHANTOM_BENCH_CLIENTS`, default 6);
//! `-- --test` is the smoke run (3 s).

use std::time::Duration;

use sentry_profiling_tests::phantom::{Measured, Shown, measure};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--test");
    let secs = if smoke {
        3
    } else {
        env_or("PHANTOM_BENCH_SECS", 20)
    };
    let clients = env_or("PHANTOM_BENCH_CLIENTS", 6) as usize;
    let hz = sentry_profiling::DEFAULT_FREQUENCY_HZ;
    let Measured {
        shown,
        requests,
        cpu_wait,
    } = measure(hz, clients, Duration::from_secs(secs));
    println!(
        "phantom: {requests} requests in {secs} s, {clients} clients, {hz} Hz, {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("{}", Shown::TABLE_HEADER);
    for s in &shown {
        println!("{s}");
    }
    let worst = shown.iter().map(|s| s.phantom_share()).fold(0.0, f64::max);
    println!("worst phantom share: {:.1}%", worst * 100.0);
    println!("{cpu_wait}");
    if smoke {
        assert!(
            shown.iter().any(|s| s.shown_ns.iter().sum::<u64>() > 0),
            "no timed function shown at all"
        );
    }
}
