//! Shared by the test binaries that check no system call returns `EINTR`
//! because of the sampler (`sampler_no_eintr`, `sampler_starved_timers`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sentry_profiling::{ModuleSet, Sample, Sampler, SamplerConfig, SamplerStats};

/// Calls made and `EINTR`s seen by one thread.
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) calls: AtomicU64,
    pub(crate) eintr: AtomicU64,
    /// Other unexpected errors (a broken test, not the profiler's doing).
    pub(crate) other: AtomicU64,
}

impl Tally {
    /// Counts one call's result: `ret < 0` with `errno` set is a failure,
    /// and `ok_errnos` are the expected ones (timeouts).
    pub(crate) fn count(&self, ret: libc::c_long, ok_errnos: &[i32]) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if ret < 0 {
            let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            if e == libc::EINTR {
                self.eintr.fetch_add(1, Ordering::Relaxed);
            } else if !ok_errnos.contains(&e) {
                self.other.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// (calls, `EINTR`s, other errors).
    pub(crate) fn get(&self) -> (u64, u64, u64) {
        (
            self.calls.load(Ordering::Relaxed),
            self.eintr.load(Ordering::Relaxed),
            self.other.load(Ordering::Relaxed),
        )
    }
}

pub(crate) fn timespec_ms(ms: i32) -> libc::timespec {
    libc::timespec {
        tv_sec: 0,
        tv_nsec: libc::c_long::from(ms) * 1_000_000,
    }
}

/// Runs a sampler at `hz` for `run`, receiving every sample as it comes
/// (so the bounded queue never fills); returns the samples, the modules
/// they were taken in, and the final counters.
pub(crate) fn sample_at(hz: u32, run: Duration) -> (Vec<Sample>, Arc<ModuleSet>, SamplerStats) {
    let sampler = Sampler::start(SamplerConfig::default().frequency_hz(hz)).expect("sampler");
    let started = Instant::now();
    let mut samples = Vec::new();
    while started.elapsed() < run {
        if let Some(s) = sampler.recv_timeout(Duration::from_millis(50)) {
            samples.push(s);
        }
        samples.extend(sampler.try_iter());
    }
    let modules = sampler.modules();
    samples.extend(sampler.try_iter());
    (samples, modules, sampler.stop())
}
