//! Shared by the sampler test binaries (each its own process, since each
//! installs the signal handler).

use std::time::{Duration, Instant};

use sentry_profiling::{Sample, Sampler, SamplerConfig, SamplerStats};

/// Runs a sampler with `config` for `run`, receiving every sample as it
/// comes (so the bounded queue never fills), then stops it. Returns the
/// samples, the measured run time and the final counters.
pub(crate) fn sample_for(
    config: SamplerConfig,
    run: Duration,
) -> (Vec<Sample>, Duration, SamplerStats) {
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
    (samples, elapsed, sampler.stop())
}
