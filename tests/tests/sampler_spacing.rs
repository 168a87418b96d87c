//! Every thread gets a sample in every period, on a busy machine too.
//!
//! Sentry weights a sample by the time to the next sample of its thread, so
//! a period that gets no sample is charged to the sample before it: to
//! whatever that thread ran then, possibly another request. The sampler
//! keeps a ledger of each thread's periods (see the sampler's module docs):
//! every period of a live thread gets a capture, a stand-in or a fill, so
//! two consecutive samples of a thread are never more than two periods
//! apart, and they leave in time order.
//!
//! Threads that run all the time, in short and in long bursts, and that
//! stay parked, are sampled for 3 s on the machine as it is and for 3 s
//! with two CPU hogs per core in other processes (so the threads are
//! preempted, their CPU-time timers fire late and the sampler thread itself
//! waits for a core).
//!
//! Threads that run now and then (a service at a few hundred requests a
//! second) let the sampler sleep through a few periods between captures
//! (its light doze): it wakes far fewer times a second, and every period
//! still gets its sample.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sentry_profiling::{Sample, Sampler, SamplerConfig, SamplerStats};
use sentry_profiling_tests::attribution::CpuHogs;

const HZ: u32 = 101;
const RUN: Duration = Duration::from_secs(3);
/// What a gap may exceed two periods by: each tick converts its deadline
/// from the monotonic clock to the realtime clock samples are stamped in,
/// from a pair of readings taken within 20 µs of each other.
const CLOCK_SLACK_NS: f64 = 100_000.0;

/// A thread sampled: its name and how long it runs, then sleeps, in ms.
type Spec = (&'static str, u64, u64);

/// One test at a time: each starts the process's sampler.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The threads sampled.
const THREADS: [Spec; 4] = [
    ("spacing-busy", 1_000, 0),
    ("spacing-short", 3, 4),
    ("spacing-long", 25, 25),
    ("spacing-parked", 0, 200),
];

#[inline(never)]
fn spin_for(d: Duration) {
    let until = Instant::now() + d;
    let mut x = 1u64;
    while Instant::now() < until {
        for i in 0..200u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    std::hint::black_box(x);
}

/// Threads that run a millisecond at a time, now and then: none runs a
/// whole period of CPU time between two of the sampler's usual ticks.
const LIGHT_THREADS: [Spec; 2] = [("light-short", 1, 9), ("light-parked", 0, 200)];

fn start_threads(specs: &[Spec], stop: &Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<()>> {
    specs
        .iter()
        .map(|&(name, run_ms, sleep_ms)| {
            let stop = Arc::clone(stop);
            std::thread::Builder::new()
                .name(name.to_owned())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        spin_for(Duration::from_millis(run_ms));
                        std::thread::sleep(Duration::from_millis(sleep_ms));
                    }
                })
                .unwrap()
        })
        .collect()
}

/// Runs `specs`' threads while `body` samples them; stops and joins them
/// after.
fn with_threads<T>(specs: &[Spec], body: impl FnOnce() -> T) -> T {
    let stop = Arc::new(AtomicBool::new(false));
    let threads = start_threads(specs, &stop);
    // Let the threads name themselves before the sampler lists them.
    std::thread::sleep(Duration::from_millis(50));
    let out = body();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    out
}

fn sample_for(run: Duration) -> (Vec<Sample>, SamplerStats) {
    let sampler =
        Sampler::start(SamplerConfig::default().frequency_hz(HZ)).expect("sampler starts");
    let started = Instant::now();
    let mut samples = Vec::new();
    while started.elapsed() < run {
        if let Some(s) = sampler.recv_timeout(Duration::from_millis(50)) {
            samples.push(s);
        }
        samples.extend(sampler.try_iter());
    }
    samples.extend(sampler.try_iter());
    (samples, sampler.stop())
}

/// Checks one run; returns what breaks the spacing (both runs are looked at
/// before the test fails).
fn check(label: &str, specs: &[Spec], samples: &[Sample], stats: &SamplerStats) -> Option<String> {
    let period_ns = 1e9 / f64::from(HZ);
    let mut by_thread: HashMap<&str, Vec<&Sample>> = HashMap::new();
    for s in samples {
        by_thread.entry(&**s.thread_name()).or_default().push(s);
    }
    let mut failures = Vec::new();
    for &(name, ..) in specs {
        let list = by_thread.get(name).map(Vec::as_slice).unwrap_or_default();
        assert!(
            list.len() as f64 >= 0.8 * f64::from(HZ) * RUN.as_secs_f64(),
            "{label} {name}: {} samples in {RUN:?} at {HZ} Hz; stats {stats:?}",
            list.len()
        );
        let mut max = 0u64;
        let mut over = 0;
        for pair in list.windows(2) {
            let (a, b) = (pair[0].timestamp_ns(), pair[1].timestamp_ns());
            assert!(
                b > a,
                "{label} {name}: samples out of time order: {a} then {b}"
            );
            max = max.max(b - a);
            if (b - a) as f64 > 2.0 * period_ns + CLOCK_SLACK_NS {
                over += 1;
                failures.push(format!(
                    "{name}: {:.1} ms between a sample at {a} ({}) and the next ({})",
                    (b - a) as f64 / 1e6,
                    if pair[0].is_repeated() {
                        "fill or stand-in"
                    } else {
                        "capture"
                    },
                    if pair[1].is_repeated() {
                        "fill or stand-in"
                    } else {
                        "capture"
                    },
                ));
            }
        }
        eprintln!(
            "{label} {name}: {} samples, longest gap {:.2} ms, {over} gaps over two periods",
            list.len(),
            max as f64 / 1e6
        );
    }
    (!failures.is_empty()).then(|| {
        format!(
            "{label}: gaps longer than two periods ({:.1} ms):\n{}\nstats {stats:?}",
            2.0 * period_ns / 1e6,
            failures.join("\n")
        )
    })
}

#[test]
fn every_period_of_every_thread_gets_a_sample_idle_and_contended() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (idle, contended) = with_threads(&THREADS, || {
        let (samples, stats) = sample_for(RUN);
        let idle = check("idle", &THREADS, &samples, &stats);

        let mut hogs = CpuHogs::start();
        let (samples, stats) = sample_for(RUN);
        let running = hogs.running();
        drop(hogs);
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        assert_eq!(running, 2 * cores, "a CPU hog died during the run");
        (idle, check("contended", &THREADS, &samples, &stats))
    });
    let failures: Vec<String> = [idle, contended].into_iter().flatten().collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn threads_that_run_now_and_then_cost_fewer_wake_ups_and_keep_every_period() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (samples, stats) = with_threads(&LIGHT_THREADS, || sample_for(RUN));
    let periods = f64::from(HZ) * RUN.as_secs_f64();
    eprintln!(
        "light: {} ticks, {} light dozes in {periods} periods",
        stats.ticks, stats.light_dozes
    );
    // The application used 10 % of a core: too busy for the sampler's
    // long doze, idle enough for its light one.
    assert!(
        stats.light_dozes as f64 >= 0.1 * periods,
        "the sampler dozed lightly {} times in {periods} periods: {stats:?}",
        stats.light_dozes
    );
    assert!(
        (stats.ticks as f64) <= 0.75 * periods,
        "{} ticks in {periods} periods: the light doze saved no wake-up: {stats:?}",
        stats.ticks
    );
    if let Some(failure) = check("light", &LIGHT_THREADS, &samples, &stats) {
        panic!("{failure}");
    }
}
