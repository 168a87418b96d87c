//! What publishing a context word costs the application's thread: the
//! tracing layer calls `hooks::set_thread_context` as a request's span is
//! entered and left (twice per poll), which stores the word in a
//! thread-local for the signal handler and mirrors each change, with its
//! time, into the thread's slot of a table the sampler reads.
//!
//! Two loops, each publishing a changing word then 0 (as a poll does):
//!
//! - `publish/one_thread`: one thread;
//! - `publish/two_threads`: two threads at once, on two cores (each pinned
//!   to its own core when the machine has two), as two Tokio workers
//!   serving requests side by side. The time is the slower thread's, per
//!   publication of each thread.
//!
//! The two are equal when no thread writes a cache line another thread's
//! publication writes: each slot's word and count sit on a line of their
//! own. Packed side by side, as they were before, two workers' slots shared
//! a line and every publication took it from the other core: 198 ns per
//! publication with two threads against 37 with one.
//!
//! `cargo bench -p sentry-profiling-benches --bench context_publish`.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use sentry_profiling::hooks::set_thread_context;

/// Pins the calling thread to `cpu` (best effort: a failure leaves it
/// where the kernel puts it).
fn pin(cpu: usize) {
    // SAFETY: `set` is a plain bit set owned by this frame, initialised by
    // `zeroed` (all-zero is an empty set) and passed with its own size;
    // `sched_setaffinity(0, …)` applies to the calling thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
    }
}

/// `iters` publications of a changing word and of 0, on each of `threads`
/// threads started together; the slowest thread's time.
fn publish_on(threads: usize, iters: u64) -> Duration {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let start = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                if cores >= threads {
                    pin(t);
                }
                // The first publication claims the thread's slot.
                set_thread_context(1);
                set_thread_context(0);
                start.wait();
                let began = Instant::now();
                for i in 0..iters / 2 {
                    set_thread_context(2 + (i & 1));
                    set_thread_context(0);
                }
                began.elapsed()
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("publishing thread"))
        .max()
        .unwrap_or_default()
}

fn publish(c: &mut Criterion) {
    let mut group = c.benchmark_group("publish");
    group.bench_function("one_thread", |b| {
        b.iter_custom(|iters| publish_on(1, iters))
    });
    group.bench_function("two_threads", |b| {
        b.iter_custom(|iters| publish_on(2, iters))
    });
    group.finish();
}

criterion_group!(benches, publish);
criterion_main!(benches);
