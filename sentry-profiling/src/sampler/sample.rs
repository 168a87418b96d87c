//! The sampler's output record.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One stack sample of one thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    timestamp_ns: u64,
    thread_id: u32,
    thread_name: Arc<str>,
    frames: Arc<[u64]>,
    context: u64,
    repeated: bool,
    thread_start: u64,
}

impl Sample {
    pub(crate) fn new(
        timestamp_ns: u64,
        thread_id: i32,
        thread_name: Arc<str>,
        frames: Arc<[u64]>,
        context: u64,
        repeated: bool,
    ) -> Self {
        Self {
            timestamp_ns,
            thread_id: thread_id as u32,
            thread_name,
            frames,
            context,
            repeated,
            thread_start: 0,
        }
    }

    /// Sets the sampled thread's start time (kernel clock ticks since boot),
    /// which tells two threads that had the same id apart.
    pub(crate) fn with_thread_start(mut self, start: u64) -> Self {
        self.thread_start = start;
        self
    }

    /// The same sample at another time (a thread's samples leave in time
    /// order; see the sampler's ledger).
    pub(crate) fn at(mut self, timestamp_ns: u64) -> Self {
        self.timestamp_ns = timestamp_ns;
        self
    }

    /// The sampled thread's start time (see [`Sample::with_thread_start`]).
    pub(crate) fn thread_start(&self) -> u64 {
        self.thread_start
    }

    /// When the stack was captured, in nanoseconds since the Unix epoch
    /// (`CLOCK_REALTIME`, read in the signal handler).
    pub fn timestamp_ns(&self) -> u64 {
        self.timestamp_ns
    }

    /// When the stack was captured.
    pub fn timestamp(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(self.timestamp_ns)
    }

    /// Kernel thread id of the sampled thread.
    pub fn thread_id(&self) -> u32 {
        self.thread_id
    }

    /// The thread's name as the kernel reports it.
    pub fn thread_name(&self) -> &Arc<str> {
        &self.thread_name
    }

    /// Code addresses, leaf first. The first is the interrupted program
    /// counter; the others are return addresses minus one (inside the call
    /// instruction), ready for symbolication.
    pub fn frames(&self) -> &Arc<[u64]> {
        &self.frames
    }

    /// The thread's context word at the time of the sample: what
    /// `sentry-profiling-tracing`'s layer stored for the span the thread
    /// was running (0 outside any request).
    pub fn context(&self) -> u64 {
        self.context
    }

    /// True when the thread had not run since its previous sample, so it was
    /// not interrupted and its previous stack was recorded again.
    pub fn is_repeated(&self) -> bool {
        self.repeated
    }
}
