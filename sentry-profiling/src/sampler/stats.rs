//! Sampler counters: relaxed atomics written by the sampler thread, read as
//! a [`SamplerStats`] snapshot.

use std::sync::atomic::{AtomicU64, Ordering};

/// A relaxed counter.
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    pub(crate) fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $(pub(crate) $name: Counter,)*
        }

        /// What the sampler has done so far.
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct SamplerStats {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl Counters {
            pub(crate) fn snapshot(&self) -> SamplerStats {
                SamplerStats { $($name: self.$name.get(),)* }
            }
        }
    };
}

counters! {
    /// Ticks run.
    ticks,
    /// Ticks skipped because a tick overran its period.
    ticks_skipped,
    /// Signals sent to threads.
    signals_sent,
    /// Stacks captured by the signal handler and unwound.
    samples_captured,
    /// Samples of threads that had not run since their previous sample.
    samples_idle,
    /// Samples handed to the consumer.
    samples_emitted,
    /// Captures whose stack pointer was outside the known stack mapping
    /// (recorded with the program counter only).
    samples_off_stack,
    /// Ticks at which a thread still had an earlier signal in flight.
    samples_late,
    /// Samples dropped because the consumer's queue was full.
    dropped_queue_full,
    /// Samples not taken because no capture slot was free.
    dropped_no_slot,
    /// Samples not taken because the signal could not be sent.
    dropped_signal_failed,
    /// Signals whose handler did not run in time (thread blocks the signal,
    /// exited, or was starved); their slot was abandoned.
    signals_abandoned,
    /// Thread ids found reused by a new thread.
    threads_recycled,
    /// Threads seen (first time or recycled id).
    threads_seen,
    /// Total nanoseconds spent unwinding on the sampler thread.
    unwind_ns,
    /// Total nanoseconds spent in the signal handler on sampled threads
    /// (measured by the handler itself, so excluding kernel entry and exit).
    handler_ns,
    /// Total CPU time of the sampler thread inside ticks, nanoseconds.
    tick_cpu_ns,
}
