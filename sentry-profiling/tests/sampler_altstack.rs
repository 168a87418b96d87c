//! The profiling signal never runs on a thread's alternate signal stack.
//! That stack is the application's, made for its crash handlers, and
//! small: Rust's std gives each thread `max(SIGSTKSZ, AT_MINSIGSTKSZ)` bytes
//! (8 KiB on x86_64) above a guard page, C code often less. The kernel's
//! signal frame alone is 3.4 KiB on a machine with AVX-512; with the
//! handler's frames (and valgrind's larger frames) a delivery there came
//! close to the guard page, and hit it in one of sixty shutdowns under
//! DHAT. Delivered on the interrupted stack instead, the handler leaves the
//! alternate stack alone.
//!
//! A thread runs on CPU with an alternate stack of its own, painted with a
//! pattern, while the sampler samples it at 1000 Hz: the pattern must stay
//! whole, and the thread must have been sampled.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sentry_profiling::{Sampler, SamplerConfig};

const ALT_SIZE: usize = 64 * 1024;
const PATTERN: u8 = 0xA5;

#[inline(never)]
fn burn(stop: &AtomicBool) -> u64 {
    let mut x = 1u64;
    while !stop.load(Ordering::Relaxed) {
        for i in 0..10_000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    x
}

/// Runs `burn` on this thread with a painted alternate stack; returns the
/// deepest depth used in it (bytes from its top).
fn burn_with_painted_altstack(stop: &AtomicBool) -> usize {
    let mut alt = vec![PATTERN; ALT_SIZE];
    let new = libc::stack_t {
        ss_sp: alt.as_mut_ptr().cast(),
        ss_flags: 0,
        ss_size: ALT_SIZE,
    };
    // SAFETY: a zeroed stack_t is a valid out value.
    let mut old: libc::stack_t = unsafe { std::mem::zeroed() };
    // SAFETY: `alt` outlives its use as this thread's alternate stack: it
    // is replaced by the old one before `alt` is dropped.
    assert_eq!(unsafe { libc::sigaltstack(&new, &mut old) }, 0);
    std::hint::black_box(burn(stop));
    // SAFETY: restores the thread's previous alternate stack.
    assert_eq!(unsafe { libc::sigaltstack(&old, std::ptr::null_mut()) }, 0);
    let untouched = alt.iter().take_while(|&&b| b == PATTERN).count();
    ALT_SIZE - untouched
}

#[test]
fn the_profiling_signal_leaves_the_alternate_stack_alone() {
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let stop = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("altstack-burn".into())
            .spawn(move || burn_with_painted_altstack(&stop))
            .unwrap()
    };
    let sampler = Sampler::start(SamplerConfig::default().frequency_hz(1000)).expect("sampler");
    let started = Instant::now();
    let mut samples = 0usize;
    // 1.5 s, and on a busy machine (where the thread and the sampler get a
    // fraction of a core) until the thread has had enough deliveries to
    // say something, within 30 s.
    while started.elapsed() < Duration::from_millis(1500)
        || (sampler.stats().samples_captured <= 100 && started.elapsed() < Duration::from_secs(30))
    {
        if let Some(s) = sampler.recv_timeout(Duration::from_millis(50)) {
            samples += usize::from(&**s.thread_name() == "altstack-burn");
        }
        samples += sampler
            .try_iter()
            .filter(|s| &**s.thread_name() == "altstack-burn")
            .count();
    }
    let stats = sampler.stop();
    stop.store(true, Ordering::Relaxed);
    let used = worker.join().unwrap();
    eprintln!("alternate stack used: {used} bytes; samples {samples}; stats {stats:?}");
    // The handler ran on the thread at every capture of its running code,
    // by its timer or, a timer the kernel left unfired on a busy machine,
    // by the sampler's signal: both are deliveries that could have used
    // the alternate stack.
    assert!(
        samples > 100 && stats.samples_captured > 100,
        "the thread was hardly sampled ({samples} samples, {} captures): nothing was measured",
        stats.samples_captured
    );
    assert_eq!(
        used, 0,
        "the profiling signal used {used} bytes of the thread's alternate signal stack"
    );
}
