//! Shared by the sampler test binaries (each its own process, since each
//! installs the signal handler).

use std::sync::Arc;
use std::time::{Duration, Instant};

use sentry_profiling::{ModuleSet, Sample, Sampler, SamplerConfig, SamplerStats};

/// Runs a sampler with `config` for `run`, receiving every sample as it
/// comes (so the bounded queue never fills), then stops it. Returns the
/// samples taken within the run, the measured run time and the final
/// counters.
///
/// A sampler that dozes (the application idle) records the periods it
/// slept through at the tick that ends the doze, up to half a second
/// later, and a waiting thread's samples leave only once the thread is
/// known alive after them (its CPU clock read, every few periods): samples
/// of the run's last periods may come well after it, and each thread's at
/// its own time. So the run waits until every thread still alive at its
/// end has a sample stamped at or after the end (at most [`DOZE_WAIT`]),
/// and keeps the samples stamped within it.
#[allow(
    dead_code,
    reason = "each test binary includes this module and uses one of the two"
)]
pub(crate) fn sample_for(
    config: SamplerConfig,
    run: Duration,
) -> (Vec<Sample>, Duration, SamplerStats) {
    let (samples, elapsed, stats, _) = sample_with_modules(config, run);
    (samples, elapsed, stats)
}

/// [`sample_for`], also returning the modules the sampler last saw (to
/// name and check the frames of its samples).
pub(crate) fn sample_with_modules(
    config: SamplerConfig,
    run: Duration,
) -> (Vec<Sample>, Duration, SamplerStats, Arc<ModuleSet>) {
    let sampler = Sampler::start(config).expect("sampler starts");
    let started = Instant::now();
    let mut samples: Vec<Sample> = Vec::new();
    while started.elapsed() < run {
        if let Some(s) = sampler.recv_timeout(Duration::from_millis(50)) {
            samples.push(s);
        }
        samples.extend(sampler.try_iter());
    }
    samples.extend(sampler.try_iter());
    let elapsed = started.elapsed();
    let end_ns = realtime_ns();
    let waited = Instant::now();
    let mut pending: std::collections::HashSet<u32> = samples
        .iter()
        .map(Sample::thread_id)
        .filter(|tid| std::path::Path::new(&format!("/proc/self/task/{tid}")).exists())
        .collect();
    let mut seen = samples.len();
    while !pending.is_empty() && waited.elapsed() < DOZE_WAIT {
        if let Some(s) = sampler.recv_timeout(Duration::from_millis(20)) {
            samples.push(s);
        }
        samples.extend(sampler.try_iter());
        for s in &samples[seen..] {
            if s.timestamp_ns() >= end_ns {
                pending.remove(&s.thread_id());
            }
        }
        seen = samples.len();
    }
    samples.retain(|s| s.timestamp_ns() < end_ns);
    let modules = sampler.modules();
    (samples, elapsed, sampler.stop(), modules)
}

/// The longest [`sample_for`] waits for the threads' last samples: a doze
/// (48 periods at 101 Hz, about half a second), then up to 16 periods
/// until a parked thread's clock is read, on a machine whose other load
/// may delay the sampler thread by as much again. The wait ends as soon as
/// every thread's samples have passed the run's end, so this bounds only a
/// run whose threads' samples never come.
const DOZE_WAIT: Duration = Duration::from_secs(3);

/// `CLOCK_REALTIME` in nanoseconds, as samples are stamped.
fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
