//! Threads that live a few milliseconds, started and joined many times a
//! second (as argon2 does for each hash, or a `std::thread::scope` of a
//! request), are in the profile in proportion to their CPU time: the
//! process-wide CPU timer catches them whether or not a listing of the
//! thread list ever saw them, and Sentry's weighting (each sample counts
//! until the next sample of its profile thread) gives their samples the
//! CPU time they stand for.
//!
//! The bound: each capture stands for one period of CPU time, and the
//! process timer fires once per period of the process's CPU time on the
//! thread running then, so the CPU shown for the short-lived threads is
//! a count of periods (each a Bernoulli trial per period) around their
//! true CPU time. With `W` periods of their CPU time the count's standard
//! deviation is at most `sqrt(W)`; the run lasts until `W >= 600`, so
//! 0.9 of it is more than two standard deviations away. (The timer is
//! armed once a listing has seen threads come and go, 100 ms into a run
//! of several seconds at most.)

#[path = "support/clock.rs"]
mod clock;
#[path = "support/names.rs"]
mod names;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sentry_profiling::{Sample, Sampler, SamplerConfig, Symbolizer};

/// Burns the calling thread's CPU until it used `ms` milliseconds of it.
#[inline(never)]
fn short_lived_burn(ms: u64) -> u64 {
    let start = clock::thread_cpu_ns();
    let mut x = 1u64;
    while clock::thread_cpu_ns() - start < ms * 1_000_000 {
        for _ in 0..1000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    x
}

/// Profile thread ids of the short-lived threads' shared timelines start
/// here (see the sampler's `short_lived` module).
const SHORT_LIVED_BASE: u32 = 500_000_000;

#[test]
fn short_lived_threads_show_their_cpu_time() {
    let config = SamplerConfig::default();
    let period_ns = 1_000_000_000 / u64::from(config.frequency_hz);
    let sampler = Sampler::start(config).expect("sampler starts");
    let burned = AtomicU64::new(0);
    let mut samples: Vec<Sample> = Vec::new();
    let started = Instant::now();
    let mut round = 0u64;
    // Until the threads used 600 periods of CPU time, or a minute passed.
    while burned.load(Ordering::Relaxed) < 600 * period_ns
        && started.elapsed() < Duration::from_secs(60)
    {
        round += 1;
        std::thread::scope(|s| {
            for k in 0..8u64 {
                let burned = &burned;
                std::thread::Builder::new()
                    .name("burst-worker".into())
                    .spawn_scoped(s, move || {
                        std::hint::black_box(short_lived_burn(2 + (round + k) % 4));
                        burned.fetch_add(clock::thread_cpu_ns(), Ordering::Relaxed);
                    })
                    .expect("spawn");
            }
        });
        samples.extend(sampler.try_iter());
        // A request's worth of rest between bursts, as a service has.
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    samples.extend(sampler.try_iter());
    let modules = sampler.modules();
    let stats = sampler.stop();
    let burned_ns = burned.load(Ordering::Relaxed);

    // Sentry's weighting: each sample counts until the next sample of its
    // thread; an empty stack counts for nothing.
    let mut sym = Symbolizer::new();
    let mut by_thread: HashMap<u32, Vec<&Sample>> = HashMap::new();
    for s in &samples {
        by_thread.entry(s.thread_id()).or_default().push(s);
    }
    let mut shown_ns = 0u64;
    let mut shown_short_lived_ns = 0u64;
    let mut single = 0;
    for (tid, mut list) in by_thread {
        list.sort_by_key(|s| s.timestamp_ns());
        if list.iter().filter(|s| !s.frames().is_empty()).count() == 1 {
            single += 1;
        }
        for pair in list.windows(2) {
            let names = names::function_names(&mut sym, &modules, pair[0]);
            if !names.iter().any(|n| n.contains("short_lived_burn")) {
                continue;
            }
            let w = pair[1].timestamp_ns() - pair[0].timestamp_ns();
            shown_ns += w;
            if tid >= SHORT_LIVED_BASE {
                shown_short_lived_ns += w;
            }
        }
    }
    let ratio = shown_ns as f64 / burned_ns as f64;
    println!(
        "{round} rounds; threads burned {:.1} ms, shown {:.1} ms ({:.1} ms on shared timelines): {ratio:.3}; \
         {} short-lived captures, {} overruns, {} missed, {} process-timer hits on known threads; {single} single-sample threads",
        burned_ns as f64 / 1e6,
        shown_ns as f64 / 1e6,
        shown_short_lived_ns as f64 / 1e6,
        stats.short_lived_captures,
        stats.short_lived_overruns,
        stats.short_lived_missed,
        stats.short_lived_known_hits,
    );
    assert_eq!(stats.short_lived_timer, 1, "the process timer is in use");
    assert!(
        ratio >= 0.9,
        "the short-lived threads' CPU shown is {ratio:.3} of what they used"
    );
    assert_eq!(single, 0, "no thread has a single sample");
}
