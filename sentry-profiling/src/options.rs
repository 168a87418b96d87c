//! Configuration: the sampler's [`SamplerConfig`] and its `DEFAULT_*` values.

use crate::Error;

/// Default sampling frequency: 101 Hz, prime so it does not fall into
/// lockstep with periodic work (Sentry's profiling spec).
pub const DEFAULT_FREQUENCY_HZ: u32 = 101;
/// Highest accepted sampling frequency.
pub const MAX_FREQUENCY_HZ: u32 = 1000;
/// Default number of stack bytes copied per sample, from the stack pointer up.
pub const DEFAULT_STACK_COPY_BYTES: usize = 64 * 1024;
/// Largest accepted stack copy.
pub const MAX_STACK_COPY_BYTES: usize = 1024 * 1024;
/// Default capacity of the sample queue between sampler and consumer.
pub const DEFAULT_QUEUE_CAPACITY: usize = 16 * 1024;

/// How the sampler runs. Built with `SamplerConfig::default()` and the
/// `#[must_use]` setters; checked by [`crate::Sampler::start`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SamplerConfig {
    /// Samples per second per thread, 1 to 1000. Default 101.
    pub frequency_hz: u32,
    /// Stack bytes copied per sample, 256 B to 1 MiB. Default 64 KiB.
    pub stack_copy_bytes: usize,
    /// Samples that may wait for the consumer before new ones are dropped
    /// (and counted). Default 16384.
    pub queue_capacity: usize,
    /// The signal to use. Default: the highest real-time signal that has no
    /// handler. A signal the application handles is never taken over.
    pub signal: Option<i32>,
    /// Whether running threads are sampled by their own CPU-time timers
    /// (the kernel raises the signal on the thread's core). Default true.
    /// When false, or where a timer cannot be created, the sampler thread
    /// signals each thread whose CPU clock moved, at every tick: one
    /// cross-core interrupt per sample, for kernels or sandboxes whose
    /// per-thread CPU timers misbehave. That mode also leans towards running
    /// code on a loaded machine: a thread signalled while it waits for a core
    /// takes the signal when it runs again. Threads blocked in the kernel are
    /// never signalled in either mode, but in this one a thread seen running
    /// that enters a blocking call (`poll`, `nanosleep`, a timed `futex`
    /// wait…) before the signal arrives sees that call fail with `EINTR`.
    pub cpu_timers: bool,
    /// Whether threads the sampler has not listed yet (threads that live a
    /// few milliseconds, such as a `std::thread::scope`'s or a hashing
    /// library's workers) are sampled by a process-wide CPU-time timer,
    /// armed while the process starts threads. Default true. Their samples
    /// go to one profile thread per thread name (`"{name} (short-lived
    /// threads)"`, more when several ran at once), each capture drawn over
    /// the CPU time it stands for. Needs `cpu_timers`.
    pub short_lived_threads: bool,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            frequency_hz: DEFAULT_FREQUENCY_HZ,
            stack_copy_bytes: DEFAULT_STACK_COPY_BYTES,
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            signal: None,
            cpu_timers: true,
            short_lived_threads: true,
        }
    }
}

impl SamplerConfig {
    /// Sets the sampling frequency in Hz (1 to 1000).
    #[must_use]
    pub fn frequency_hz(mut self, hz: u32) -> Self {
        self.frequency_hz = hz;
        self
    }

    /// Sets how many stack bytes are copied per sample (256 B to 1 MiB).
    #[must_use]
    pub fn stack_copy_bytes(mut self, bytes: usize) -> Self {
        self.stack_copy_bytes = bytes;
        self
    }

    /// Sets the sample queue's capacity.
    #[must_use]
    pub fn queue_capacity(mut self, samples: usize) -> Self {
        self.queue_capacity = samples;
        self
    }

    /// Uses a specific signal instead of picking a free real-time signal.
    #[must_use]
    pub fn signal(mut self, signal: i32) -> Self {
        self.signal = Some(signal);
        self
    }

    /// Samples running threads with per-thread CPU-time timers (default), or
    /// from the sampler thread alone (see [`SamplerConfig::cpu_timers`]).
    #[must_use]
    pub fn cpu_timers(mut self, enabled: bool) -> Self {
        self.cpu_timers = enabled;
        self
    }

    /// Samples threads not listed yet with a process-wide CPU-time timer
    /// (default), or only the threads the sampler lists (see
    /// [`SamplerConfig::short_lived_threads`]).
    #[must_use]
    pub fn short_lived_threads(mut self, enabled: bool) -> Self {
        self.short_lived_threads = enabled;
        self
    }

    /// Checks every value, naming the option that is out of range.
    pub(crate) fn validated(self) -> Result<Self, Error> {
        if !(1..=MAX_FREQUENCY_HZ).contains(&self.frequency_hz) {
            return Err(Error::InvalidOption {
                option: "frequency_hz",
                reason: format!("{} is outside 1..={MAX_FREQUENCY_HZ}", self.frequency_hz),
            });
        }
        if !(256..=MAX_STACK_COPY_BYTES).contains(&self.stack_copy_bytes) {
            return Err(Error::InvalidOption {
                option: "stack_copy_bytes",
                reason: format!(
                    "{} is outside 256..={MAX_STACK_COPY_BYTES}",
                    self.stack_copy_bytes
                ),
            });
        }
        if let Some(sig) = self.signal {
            let max = max_signal();
            if !(1..=max).contains(&sig) || cannot_be_caught(sig) {
                return Err(Error::InvalidOption {
                    option: "signal",
                    reason: format!(
                        "{sig} is not a signal a handler can be installed for (1..={max}, not SIGKILL or SIGSTOP)"
                    ),
                });
            }
        }
        if self.queue_capacity == 0 {
            return Err(Error::InvalidOption {
                option: "queue_capacity",
                reason: "must be at least 1".into(),
            });
        }
        Ok(self)
    }
}

/// The highest signal number.
fn max_signal() -> i32 {
    #[cfg(target_os = "linux")]
    {
        libc::SIGRTMAX()
    }
    #[cfg(not(target_os = "linux"))]
    {
        64
    }
}

/// SIGKILL and SIGSTOP: no handler can be installed for them.
fn cannot_be_caught(sig: i32) -> bool {
    #[cfg(unix)]
    {
        sig == libc::SIGKILL || sig == libc::SIGSTOP
    }
    #[cfg(not(unix))]
    {
        let _ = sig;
        false
    }
}

/// Default share of processes (profiling sessions) that profile: 0, as
/// Sentry's spec asks; set it to enable profiling.
pub const DEFAULT_PROFILE_SESSION_SAMPLE_RATE: f64 = 0.0;
/// The longest span of sample timestamps in one chunk. Sentry's ingestion
/// rejects chunks spanning more than 66 s.
pub const MAX_CHUNK_DURATION: std::time::Duration = std::time::Duration::from_secs(60);
/// Default longest chunk: 60 s.
pub const DEFAULT_CHUNK_DURATION: std::time::Duration = MAX_CHUNK_DURATION;

/// Default shortest poll counted as a long poll (see
/// `ProfilingIntegration::long_poll_threshold`): 10 ms.
pub const DEFAULT_LONG_POLL_THRESHOLD: std::time::Duration = std::time::Duration::from_millis(10);

/// Default limit on each request to Sentry when the crate delivers
/// envelopes itself (see `ProfilingIntegration::http_timeout`): 30 s.
pub const DEFAULT_HTTP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// When the profiler runs (Sentry's `profile_lifecycle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ProfileLifecycle {
    /// Only between [`crate::start_profiler`] and [`crate::stop_profiler`].
    #[default]
    Manual,
    /// Whenever at least one sampled root span (transaction) is active;
    /// needs tracing (`traces_sample_rate` or `traces_sampler`) and the
    /// `sentry-profiling-tracing` layer.
    Trace,
}
