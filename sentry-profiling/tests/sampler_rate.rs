//! Sampling rate: a user asking for 101 Hz gets 101 samples per second of
//! every busy thread, spread over time. Two CPU-bound threads profiled for
//! 3 s must each get about 303 samples (within 10%), with strictly
//! increasing timestamps and no gap longer than 2.5 periods unless the
//! thread itself went that long without running.
//!
//! A busy thread samples itself with its CPU-time timer, which the kernel
//! fires at its scheduler tick (every 4 ms at `CONFIG_HZ=250`), so single
//! gaps are 8 or 12 ms rather than 9.9; a period the timer could not
//! deliver a capture for is recorded with the latest stack a microsecond
//! after that capture.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sentry_profiling::{Sample, SamplerConfig};

const HZ: u32 = 101;
const RUN: Duration = Duration::from_secs(3);
const NAMES: [&str; 2] = ["rate-busy-0", "rate-busy-1"];

/// Spins until `stop`; returns the longest time the thread went without
/// running (as seen between two consecutive clock reads), to tell a starved
/// thread from a missed sample.
#[inline(never)]
fn spin(stop: &AtomicBool) -> Duration {
    let mut x = 1u64;
    let mut last = Instant::now();
    let mut longest = Duration::ZERO;
    while !stop.load(Ordering::Relaxed) {
        for i in 0..1_000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
        let now = Instant::now();
        longest = longest.max(now - last);
        last = now;
    }
    std::hint::black_box(x);
    longest
}

#[test]
fn busy_threads_get_the_configured_rate_evenly_spaced() {
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = NAMES
        .iter()
        .map(|name| {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name((*name).to_owned())
                .spawn(move || spin(&stop))
                .unwrap()
        })
        .collect();
    // Let the workers set their names before the sampler lists threads.
    std::thread::sleep(Duration::from_millis(50));

    let (samples, elapsed, stats) =
        support::sample_for(SamplerConfig::default().frequency_hz(HZ), RUN);
    stop.store(true, Ordering::Relaxed);
    let longest_stalls: Vec<Duration> = workers.into_iter().map(|w| w.join().unwrap()).collect();

    let mut by_thread: HashMap<&str, Vec<&Sample>> = HashMap::new();
    for s in &samples {
        by_thread.entry(&**s.thread_name()).or_default().push(s);
    }
    let nominal = f64::from(HZ) * RUN.as_secs_f64();
    let expected = f64::from(HZ) * elapsed.as_secs_f64();
    let period_ns = 1e9 / f64::from(HZ);
    eprintln!(
        "elapsed={elapsed:?} nominal={nominal:.0} expected={expected:.1} period={:.3}ms stats={stats:?}",
        period_ns / 1e6
    );
    for (name, stall) in NAMES.into_iter().zip(longest_stalls) {
        let list = by_thread.get(name).map(Vec::as_slice).unwrap_or_default();
        let count = list.len();
        let repeated = list.iter().filter(|s| s.is_repeated()).count();
        let mut gaps: Vec<u64> = Vec::with_capacity(count);
        for pair in list.windows(2) {
            let (a, b) = (pair[0].timestamp_ns(), pair[1].timestamp_ns());
            assert!(
                b > a,
                "{name}: timestamps not increasing: {a} then {b} (sample {} of {count})",
                gaps.len() + 1
            );
            gaps.push(b - a);
        }
        gaps.sort_unstable();
        let median = gaps.get(gaps.len() / 2).copied().unwrap_or(0) as f64;
        let (min, max) = (
            gaps.first().copied().unwrap_or(0),
            gaps.last().copied().unwrap_or(0),
        );
        eprintln!(
            "{name}: samples={count} repeated={repeated} median_gap={:.3}ms min_gap={:.3}ms max_gap={:.3}ms longest_stall={stall:?}",
            median / 1e6,
            min as f64 / 1e6,
            max as f64 / 1e6
        );
        let count_f = count as f64;
        assert!(
            (count_f - expected).abs() <= expected * 0.10,
            "{name}: {count} samples, expected {expected:.0} ± 10% ({HZ} Hz over {elapsed:?}); \
             the thread itself once went {stall:?} without running"
        );
        assert!(
            (count_f - nominal).abs() <= nominal * 0.10,
            "{name}: {count} samples, expected {nominal:.0} ± 10% ({HZ} Hz over {RUN:?}); \
             the thread itself once went {stall:?} without running"
        );
        let allowed = (2.5 * period_ns) as u64 + stall.as_nanos() as u64;
        assert!(
            max <= allowed,
            "{name}: a gap of {:.3} ms (the period is {:.3} ms; the thread's longest stall {stall:?})",
            max as f64 / 1e6,
            period_ns / 1e6
        );
    }
}
