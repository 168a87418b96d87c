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
    /// Ticks the sampler thread could not run on time (a tick overran its
    /// period, or the thread was not given a core); the tick that runs
    /// next records every thread's samples for them (up to 100 periods).
    ticks_skipped,
    /// Light dozes: ticks after which the sampler slept up to 4 periods (or
    /// until a thread ran a period of CPU time), because no thread was in
    /// a request and none needed a look every period; the tick after one
    /// records every period slept through.
    light_dozes,
    /// Signals sent to threads by the sampler thread (timer signals are not
    /// counted here).
    signals_sent,
    /// Stacks captured by the signal handler and unwound.
    samples_captured,
    /// Stacks of threads blocked in the kernel, read by the sampler thread
    /// without interrupting them (where they wait).
    waits_read,
    /// Of those attempts, reads thrown away because the thread woke up
    /// while its stack was copied.
    waits_raced,
    /// Of those, captures raised by the thread's own CPU-time timer.
    samples_timer,
    /// Timer periods without a capture of their own (the thread's previous
    /// capture was not read yet, or the kernel counted them as overruns):
    /// the fills before the capture show them where the kernel's counts of
    /// the thread's CPU time are read, its latest stack otherwise.
    samples_timer_missed,
    /// Threads for which no CPU-time timer could be created; they are
    /// signalled from the sampler thread instead.
    timers_failed,
    /// Samples of threads at ticks when they were not running, recorded
    /// with the stack they wait in.
    samples_idle,
    /// Samples handed to the consumer.
    samples_emitted,
    /// Captures whose stack pointer was outside the known stack mapping
    /// (recorded with the program counter only).
    samples_off_stack,
    /// Captures spent learning a thread's stack bounds (taken before the
    /// sampler knew where its stack is, so they hold no stack): not
    /// recorded, the thread's next capture counts.
    captures_discarded,
    /// Timers brought forward because their thread was found in a request
    /// of which no stack was captured yet.
    timers_nudged,
    /// Captures the sampler thread asked a running thread for because its
    /// timer had expired and the kernel had not fired it for more than a
    /// period of the thread's CPU time (see `Services::catch_stalled_timer`).
    timers_stalled,
    /// Threads added to the sampler's table when they entered their first
    /// profiled request, before the thread listing would have found them.
    threads_added_early,
    /// Ticks at which a thread still had a signal from the sampler thread
    /// in flight.
    samples_late,
    /// Samples dropped because the consumer's queue was full.
    dropped_queue_full,
    /// Samples not taken because no capture slot was free.
    dropped_no_slot,
    /// Samples not taken because the signal could not be sent.
    dropped_signal_failed,
    /// Calls of `rt_tgsigqueueinfo` (the sampler thread signalling a
    /// thread) the kernel refused as forbidden (`EPERM`, `EACCES`,
    /// `ENOSYS`: a seccomp policy), the sampler's probe when it starts
    /// included; once refused, the call is not made again. With this and
    /// `timers_denied` non-zero (or this alone with `cpu_timers(false)`), no
    /// stack of running code can be captured: the process says so once on
    /// stderr.
    signals_denied,
    /// Calls of `timer_create` or `timer_settime` (CPU-time timers) the
    /// kernel refused as forbidden, the probe included; once refused, no
    /// timer is created again, and threads without one are signalled by
    /// the sampler thread instead.
    timers_denied,
    /// Calls of `process_vm_readv` (copying a blocked thread's stack) the
    /// kernel refused as forbidden, the probe included; once refused,
    /// `/proc/self/mem` is read instead.
    vm_read_denied,
    /// Signals whose handler did not run in time (thread blocks the signal,
    /// or was starved); the sampler stops waiting for them.
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
    /// Captures of threads the sampler had not given a timer of their own
    /// (threads that live between two listings of the thread list), raised
    /// by the process-wide CPU-time timer (see `short_lived`).
    short_lived_captures,
    /// Periods of the process timer those captures stood for beyond one
    /// each (the kernel's overruns).
    short_lived_overruns,
    /// Process-timer signals that found every spare slot full: periods of
    /// short-lived threads' CPU time with no sample.
    short_lived_missed,
    /// Process-timer signals that found the running thread already sampled
    /// with its own timer (or one of the profiler's threads) and did
    /// nothing: the process timer's cost on threads that need none of it.
    short_lived_known_hits,
    /// Whether the process-wide CPU-time timer is in use (1) or could not
    /// be created (0: timers refused or off, or another sampler has it).
    short_lived_timer,
}
