//! What sampling short-lived threads costs: a process that starts a
//! thread `RATE` times a second, each burning half a millisecond of CPU
//! time and exiting, for `SECONDS`, with the sampler off, on with only the
//! threads it lists (`short_lived_threads(false)`), and on with the
//! process timer too (the default). Prints the sampler thread's CPU time
//! per second, the process's CPU time per thread start, and what the
//! sampler caught of the short-lived threads.
//!
//! ```text
//! cargo run --release -p sentry-profiling --example thread_starts -- RATE SECONDS ROUNDS
//! ```

use std::time::{Duration, Instant};

use sentry_profiling::{Sampler, SamplerConfig};

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock ids are
    // constants the kernel knows.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The CPU time of this process's threads named `name`, from `schedstat`.
fn threads_cpu_ns(name: &str) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        let path = entry.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(path.join("schedstat")).unwrap_or_default();
        total += stat
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
    }
    total
}

#[inline(never)]
fn short_lived_work() -> u64 {
    let start = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
    let mut x = 1u64;
    while clock_ns(libc::CLOCK_THREAD_CPUTIME_ID) - start < 500_000 {
        for i in 0..500u64 {
            x = std::hint::black_box(x.rotate_left(5) ^ i).wrapping_mul(0x100_0000_01b3);
        }
    }
    x
}

/// One run: returns (sampler CPU ns, process CPU ns, starts, captures of
/// short-lived threads).
fn run(mode: &str, rate: u64, seconds: u64) -> (u64, u64, u64, u64) {
    let sampler = match mode {
        "off" => None,
        "listed" => Some(Sampler::start(
            SamplerConfig::default().short_lived_threads(false),
        )),
        _ => Some(Sampler::start(SamplerConfig::default())),
    }
    .map(|s| s.expect("sampler starts"));
    std::thread::sleep(Duration::from_millis(300));
    // Samples are received (and dropped) as they come, as a consumer would.
    let drain = |s: &Option<Sampler>| s.iter().for_each(|s| s.try_iter().for_each(drop));
    drain(&sampler);
    let cpu0 = clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID);
    let prof0 = threads_cpu_ns("sentry-profiler");
    let every = Duration::from_nanos(1_000_000_000 / rate);
    let started = Instant::now();
    let mut next = started;
    let mut starts = 0;
    while started.elapsed() < Duration::from_secs(seconds) {
        std::thread::Builder::new()
            .name("short-lived".into())
            .spawn(short_lived_work)
            .expect("spawn")
            .join()
            .expect("join");
        starts += 1;
        drain(&sampler);
        next += every;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    let cpu = clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID) - cpu0;
    let prof = threads_cpu_ns("sentry-profiler") - prof0;
    let caught = sampler.map_or(0, |s| s.stop().short_lived_captures);
    (prof, cpu, starts, caught)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rate: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let seconds: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let rounds: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let modes = ["off", "listed", "on"];
    let mut totals = [(0u64, 0u64, 0u64, 0u64); 3];
    for round in 0..rounds {
        for k in 0..3 {
            // The order turns from round to round.
            let m = (k + round as usize) % 3;
            let (prof, cpu, starts, caught) = run(modes[m], rate, seconds);
            println!(
                "round {round} {:>6}: {starts} starts, sampler {:.2} ms/s, process {:.1} us/start, {caught} short-lived captures",
                modes[m],
                prof as f64 / 1e6 / seconds as f64,
                cpu as f64 / 1e3 / starts as f64,
            );
            let t = &mut totals[m];
            *t = (t.0 + prof, t.1 + cpu, t.2 + starts, t.3 + caught);
        }
    }
    println!("{rate} thread starts a second, {rounds} rounds of {seconds} s:");
    for (m, (prof, cpu, starts, caught)) in totals.iter().enumerate() {
        println!(
            "  {:>6}: sampler {:.2} ms of CPU a second, process {:.1} us of CPU per thread start, {} short-lived captures",
            modes[m],
            *prof as f64 / 1e6 / (seconds * rounds) as f64,
            *cpu as f64 / 1e3 / (*starts).max(1) as f64,
            caught
        );
    }
}
