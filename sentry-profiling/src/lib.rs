//! Continuous profiling for Tokio services, sent to Sentry.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(unsafe_op_in_unsafe_fn)]

mod chunk;
mod encode;
mod error;
mod integration;
mod options;
mod runtime;
#[cfg(profiling_supported)]
mod sampler;
#[cfg(not(profiling_supported))]
#[path = "sampler/unsupported.rs"]
mod sampler;
mod symbolize;
mod sys;
mod transport;
mod unwind;

pub use chunk::{Chunk, ChunkSample, MAX_CHUNK_DURATION};
pub use encode::sentry_chunk::{ChunkMeta, EncodedChunk, MAX_CHUNK_BYTES, PLATFORM, encode_chunk};
pub use error::Error;
pub use integration::ProfilingIntegration;
pub use options::{
    DEFAULT_CHUNK_DURATION, DEFAULT_FREQUENCY_HZ, DEFAULT_PROFILE_SESSION_SAMPLE_RATE,
    DEFAULT_QUEUE_CAPACITY, DEFAULT_STACK_COPY_BYTES, MAX_FREQUENCY_HZ, MAX_STACK_COPY_BYTES,
    ProfileLifecycle, SamplerConfig,
};
pub use runtime::ProfilerStats;
pub use sampler::{Sample, Sampler, SamplerControl, SamplerStats};
pub use symbolize::{Symbol, Symbolizer};
pub use transport::EnvelopeDirTransport;
pub use unwind::{ModuleInfo, ModuleSet, debug_id_from_build_id};

/// Starts the profiler (manual lifecycle). A no-op, logged in debug mode,
/// when the session is not sampled, the profiler already runs, or the
/// lifecycle is [`ProfileLifecycle::Trace`].
pub fn start_profiler() {
    if let Some(rt) = runtime::current() {
        rt.start_manual();
    }
}

/// Stops the profiler (manual lifecycle). A no-op, logged in debug mode,
/// with the trace lifecycle.
pub fn stop_profiler() {
    if let Some(rt) = runtime::current() {
        rt.stop_manual();
    }
}

/// Counters of the current profiling session (or of the last one, after
/// the client closed), if one was configured.
pub fn stats() -> Option<ProfilerStats> {
    runtime::last().map(|rt| rt.stats())
}

/// Sets the calling thread's context word, which the signal handler copies
/// into every sample of this thread; returns the previous value. The
/// tracing layer stores the entered span here. A plain thread-local store.
#[inline]
pub fn set_thread_context(value: u64) -> u64 {
    #[cfg(profiling_supported)]
    {
        sys::set_thread_context(value)
    }
    #[cfg(not(profiling_supported))]
    {
        let _ = value;
        0
    }
}

/// The kernel id of the calling thread (the `thread.id` Sentry links by).
pub fn current_thread_id() -> u64 {
    #[cfg(profiling_supported)]
    {
        sys::current_tid() as u64
    }
    #[cfg(not(profiling_supported))]
    {
        0
    }
}

/// Hooks for integrations such as `sentry-profiling-tracing`'s layer: the
/// trace lifecycle and linking data of the current session.
pub mod hooks {
    /// A sampled root span (transaction) became active. Returns the session's
    /// `profiler_id` when the profiler runs for it (trace lifecycle, session
    /// sampled); the caller must then call [`root_span_finished`] once.
    pub fn root_span_started() -> Option<String> {
        let rt = crate::runtime::current()?;
        rt.root_started()
            .then(|| rt.profiler_id().map(str::to_owned))
            .flatten()
    }

    /// A root span for which [`root_span_started`] returned `Some` finished.
    pub fn root_span_finished() {
        if let Some(rt) = crate::runtime::current() {
            rt.root_finished();
        }
    }

    /// The session's `profiler_id` if samples are being taken right now
    /// (either lifecycle), for tagging transactions and spans.
    pub fn running_profiler_id() -> Option<String> {
        let rt = crate::runtime::current()?;
        if rt.is_running() {
            rt.profiler_id().map(str::to_owned)
        } else {
            None
        }
    }

    /// The configured lifecycle of the current session.
    pub fn lifecycle() -> Option<crate::ProfileLifecycle> {
        crate::runtime::current().map(|rt| rt.lifecycle())
    }
}
