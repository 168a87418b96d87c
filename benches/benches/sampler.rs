//! Sampler costs, measured by the sampler's own counters while real threads
//! are sampled:
//!
//! - handler time per sample on the interrupted thread, by stack depth
//!   (the handler clocks itself; 64 KiB copy limit),
//! - unwind time per sample on the sampler thread, by stack depth,
//! - sampler CPU per tick and achieved rate with 1, 8 64 and 256 threads, busy
//!   and parked.
//!
//! `cargo bench -p sentry-profiling-benches --bench sampler` prints a table;
//! `-- --test` runs each case briefly (a smoke run for CI). Nothing here
//! asserts on a timing.

use std::time::{Duration, Instant};

use sentry_profiling::{Sampler, SamplerConfig, SamplerStats};
use sentry_profiling_benches::Workers;

/// Samples for `secs`; returns the counters, the samples of the workers
/// (threads named `bench-*`) and the time taken.
fn run(config: SamplerConfig, workers: &Workers, secs: f64) -> (SamplerStats, usize, Duration) {
    let _ = workers;
    let sampler = Sampler::start(config).expect("sampler starts");
    let start = Instant::now();
    let mut received = 0usize;
    while start.elapsed().as_secs_f64() < secs {
        received += sampler
            .try_iter()
            .filter(|s| s.thread_name().starts_with("bench-"))
            .count();
        std::thread::sleep(Duration::from_millis(20));
    }
    let elapsed = start.elapsed();
    let stats = sampler.stop();
    (stats, received, elapsed)
}

fn per(total_ns: u64, n: u64) -> f64 {
    if n == 0 {
        f64::NAN
    } else {
        total_ns as f64 / n as f64 / 1000.0
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--test");
    let secs = if quick { 0.3 } else { 5.0 };

    println!("per-sample cost by stack depth (1 busy thread, 101 Hz, 64 KiB copy limit)");
    println!(
        "{:>6} {:>10} {:>14} {:>14}",
        "depth", "samples", "handler µs", "unwind µs"
    );
    for depth in [10, 50, 200] {
        let workers = Workers::start(1, depth, true);
        let (s, _, _) = run(SamplerConfig::default(), &workers, secs);
        println!(
            "{:>6} {:>10} {:>14.2} {:>14.2}",
            depth,
            s.samples_captured,
            per(s.handler_ns, s.samples_captured),
            per(s.unwind_ns, s.samples_captured)
        );
    }

    println!();
    println!("sampler cost per tick (101 Hz, threads at depth 30)");
    println!(
        "{:>8} {:>7} {:>9} {:>16} {:>12} {:>14} {:>10} {:>12}",
        "threads",
        "state",
        "ticks/s",
        "samples/s/thread",
        "tick CPU µs",
        "CPU % of core",
        "signals",
        "timer samples"
    );
    // `SAMPLER_BENCH_CASE=256-busy` (say) runs one case alone, for profiling.
    let only = std::env::var("SAMPLER_BENCH_CASE").ok();
    for n in [1, 8, 64, 256] {
        for busy in [true, false] {
            let case = format!("{n}-{}", if busy { "busy" } else { "parked" });
            if only.as_ref().is_some_and(|o| *o != case) {
                continue;
            }
            let workers = Workers::start(n, 30, busy);
            std::thread::sleep(Duration::from_millis(50));
            let (s, received, elapsed) = run(SamplerConfig::default(), &workers, secs);
            let rate = s.ticks as f64 / elapsed.as_secs_f64();
            if std::env::var_os("SAMPLER_BENCH_STATS").is_some() {
                eprintln!("{s:?}");
            }
            println!(
                "{:>8} {:>7} {:>9.1} {:>16.1} {:>12.1} {:>14.2} {:>10} {:>12}",
                n,
                if busy { "busy" } else { "parked" },
                rate,
                received as f64 / n as f64 / elapsed.as_secs_f64(),
                per(s.tick_cpu_ns, s.ticks),
                s.tick_cpu_ns as f64 / elapsed.as_nanos() as f64 * 100.0,
                s.signals_sent,
                s.samples_timer
            );
        }
    }
}
