//! Continuous profiling for Tokio services, sent to Sentry.
//!
//! This crate samples every thread of the process at 101 Hz, unwinds the
//! stacks with [framehop](https://docs.rs/framehop) using the modules' DWARF
//! call-frame information, and sends the result to Sentry as continuous
//! profiling chunks (`profile_chunk`, sample format v2), linked to your
//! transactions so that a slow transaction in Sentry shows where its time
//! went.
//!
//! # How it samples, and why that is safe
//!
//! Every thread of the process is sampled (listed from `/proc/self/task`,
//! so threads you did not register are sampled too). A running thread is
//! interrupted by a real-time signal (one nobody else handles; an
//! application's handler is never replaced), raised by its own CPU-time
//! timer after each sampling period of CPU it uses, on the core it runs on
//! (or, with [`ProfilingIntegration::cpu_timers`] off, sent by the sampler thread
//! to threads whose CPU clock moved). A thread blocked in a system call is
//! not signalled: the sampler thread, which wakes at absolute deadlines,
//! reads where it waits from `/proc` and copies its stack; a thread that
//! has not run since its last sample has its previous stack recorded
//! again. The handler copies the
//! interrupted registers and the live part of the thread's stack into a
//! preallocated slot and returns. It allocates nothing, takes no lock, calls
//! neither the dynamic loader nor the system unwinder, and never reads
//! outside the thread's own stack mapping. Unwinding happens afterwards, on
//! the sampler thread, over the copy. This is the part where earlier Rust
//! profilers, which unwound inside the handler, deadlocked and crashed.
//!
//! # What you do
//!
//! With Sentry: build a [`ProfilingIntegration`], let it
//! [`apply`](ProfilingIntegration::apply) itself to your `ClientOptions`,
//! pass them to `sentry::init`, and add `sentry_profiling_tracing::layer()`
//! to your `tracing` registry (and its `http_layer()` to an axum router).
//! `ClientOptions::add_integration` is not enough: the client builds its
//! transport before integrations run, so the integration could neither
//! link transactions nor send the last chunk; it then stays off and says so
//! once, naming `apply`.
//! With [`ProfileLifecycle::Trace`] the profiler runs while sampled root
//! spans are active; with [`ProfileLifecycle::Manual`], between
//! [`start_profiler`] and [`stop_profiler`].
//!
//! Without Sentry: [`Sampler`] gives you the samples directly.
//!
//! # When Sentry is unreachable
//!
//! Unless you bring a transport of your own, the crate delivers chunks
//! itself (feature `http`, on by default): from one background thread with
//! a bounded queue, request timeouts
//! ([`ProfilingIntegration::http_timeout`]), and Sentry's `profile_chunk`
//! rate limits honoured. An endpoint that is down, refuses, stalls or
//! rate-limits costs your requests nothing: chunks are dropped, counted by
//! reason in [`stats`] ([`ChunkDrops`]), logged sparingly, and reported to
//! Sentry as client reports when it answers again; profiling carries on as
//! soon as it does.
//!
//! # What it costs
//!
//! Measured on a 2-core x86_64 VM (`cargo xtask bench`; the repository's
//! `BENCHMARKS.md` has every figure and how it was taken): 0.3 to 2.1 µs in
//! the signal handler per sample (stack depth 10 to 200), 1 to 5 µs of
//! unwinding per sample on the sampler thread, 0.1 to 0.7 % of one core for
//! the profiler threads with 1 to 64 threads, and CPU per request within
//! about 0.5 % (median) of an unprofiled run for a saturated axum service.
//! Threads that did not run since their last sample are not interrupted;
//! the sampler still reads their CPU clock each tick (about 0.65 µs per
//! thread).
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicBool, Ordering};
//! use std::time::Duration;
//! use sentry_profiling::{Sampler, SamplerConfig, Symbolizer};
//!
//! #[inline(never)]
//! fn busy_work(stop: &AtomicBool) -> u64 {
//!     let mut x = 0u64;
//!     while !stop.load(Ordering::Relaxed) {
//!         x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
//!     }
//!     x
//! }
//!
//! let stop = Arc::new(AtomicBool::new(false));
//! let flag = Arc::clone(&stop);
//! let worker = std::thread::Builder::new()
//!     .name("worker".into())
//!     .spawn(move || busy_work(&flag))?;
//! match Sampler::start(SamplerConfig::default()) {
//!     Ok(sampler) => {
//!         std::thread::sleep(Duration::from_millis(300));
//!         let modules = sampler.modules();
//!         let mut symbols = Symbolizer::new();
//!         let hits = sampler
//!             .try_iter()
//!             .filter(|s| &**s.thread_name() == "worker")
//!             .filter(|s| {
//!                 s.frames().iter().any(|&addr| {
//!                     symbols.function(&modules, addr).is_some_and(|f| f.ends_with("busy_work"))
//!                 })
//!             })
//!             .count();
//!         assert!(hits > 0, "busy_work shows up in the worker's stacks");
//!         println!("{hits} samples in busy_work; {:?}", sampler.stop());
//!     }
//!     Err(sentry_profiling::Error::Unsupported) => {}
//!     Err(e) => panic!("{e}"),
//! }
//! stop.store(true, Ordering::Relaxed);
//! worker.join().unwrap();
//! # Ok::<(), std::io::Error>(())
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(unsafe_op_in_unsafe_fn)]

mod attribution;
mod blocking;
mod chunk;
#[cfg(profiling_supported)]
mod context;
mod encode;
mod error;
mod export;
pub mod frames;
#[doc(hidden)]
pub mod hooks;
mod integration;
mod json_link;
mod lanes;
mod options;
mod own_line;
mod request;
mod request_times;
#[cfg(profiling_supported)]
mod sampler;
#[cfg(not(profiling_supported))]
#[path = "sampler/unsupported.rs"]
mod sampler;
mod session;
mod symbolize;
mod sys;
mod transaction_profile;
mod transaction_tags;
mod transport;
mod unwind;

pub use attribution::{LANE_BASE, ThreadAttribution};
pub use blocking::{
    BlockingStats, DEFAULT_BLOCKING_INTERVAL, DEFAULT_BLOCKING_THRESHOLD,
    MAX_BLOCKING_EVENTS_PER_MINUTE, MIN_BLOCKING_INTERVAL, MIN_BLOCKING_THRESHOLD,
};
pub use error::Error;
pub use integration::ProfilingIntegration;
pub use options::{
    DEFAULT_CHUNK_DURATION, DEFAULT_FREQUENCY_HZ, DEFAULT_HTTP_TIMEOUT,
    DEFAULT_LONG_POLL_THRESHOLD, DEFAULT_PROFILE_SESSION_SAMPLE_RATE, DEFAULT_QUEUE_CAPACITY,
    DEFAULT_STACK_COPY_BYTES, MAX_CHUNK_DURATION, MAX_FREQUENCY_HZ, MAX_STACK_COPY_BYTES,
    ProfileLifecycle, SamplerConfig,
};
pub use sampler::{Sample, Sampler, SamplerControl, SamplerStats};
pub use session::v1::TransactionProfileDrops;
pub use session::{ChunkDrops, ProfilerStats};
pub use symbolize::Symbolizer;
pub use transport::EnvelopeDirTransport;
#[cfg(all(test, profiling_supported))]
use unwind::debug_id_from_build_id;
pub use unwind::{ModuleInfo, ModuleSet};

/// Starts the profiler (manual lifecycle). A no-op, logged in debug mode,
/// when the session is not sampled, the profiler already runs, or the
/// lifecycle is [`ProfileLifecycle::Trace`]; also in the forked child of a
/// profiled process.
///
/// Not async-signal-safe (it may log, and reads the session through
/// `arc-swap`): from a signal handler, set a flag and call it elsewhere.
pub fn start_profiler() {
    if let Some(rt) = session::current() {
        rt.start_manual();
    }
}

/// Stops the profiler (manual lifecycle). A no-op, logged in debug mode,
/// with the trace lifecycle, when it is not running, and in a forked child.
/// Not async-signal-safe, like [`start_profiler`].
pub fn stop_profiler() {
    if let Some(rt) = session::current() {
        rt.stop_manual();
    }
}

/// Counters of the current profiling session (or of the last one, after
/// the client closed), if one was configured. `None` in the forked child of
/// a profiled process, which has no profiler.
pub fn stats() -> Option<ProfilerStats> {
    session::last().map(|rt| rt.stats())
}

/// The kernel's release string, for profiles' `os.version`.
fn kernel_release() -> String {
    #[cfg(profiling_supported)]
    {
        sys::kernel_release()
    }
    #[cfg(not(profiling_supported))]
    {
        "unknown".into()
    }
}

/// The calling thread's context word and kernel id (for the tracing layer,
/// through [`hooks`]).
mod thread_word {
    #[cfg(profiling_supported)]
    use crate::{context, sys};

    /// Sets the calling thread's context word, which the signal handler copies
    /// into every sample of this thread; returns the previous value. The
    /// tracing layer stores the entered request's lane here. It is kept in a
    /// thread-local, and mirrored into the thread's word slot, which the
    /// sampler reads without interrupting the thread (see `context`).
    #[inline]
    pub fn set_thread_context(value: u64) -> u64 {
        #[cfg(profiling_supported)]
        {
            context::publish(value, || sys::current_tid() as u32);
            sys::set_thread_context(value)
        }
        #[cfg(not(profiling_supported))]
        {
            let _ = value;
            0
        }
    }

    /// The calling thread's context word (see [`set_thread_context`]).
    #[inline]
    pub fn thread_context() -> u64 {
        #[cfg(profiling_supported)]
        {
            sys::thread_context()
        }
        #[cfg(not(profiling_supported))]
        {
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
}
