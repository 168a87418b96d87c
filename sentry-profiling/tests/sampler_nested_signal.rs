//! A thread sampled while it runs the application's own signal handler
//! (as Tokio's SIGINT handler runs at every shutdown): the profiling
//! signal nests inside it, and the sampler copies the thread's stack
//! through the outer handler's signal frame. Nothing may break, and the
//! stacks must show the handler's code.
//!
//! The thread burns CPU inside a SIGUSR2 handler, on its own stack (no
//! alternate stack), 40 times for about 20 ms each, while the sampler
//! samples it at 1000 Hz.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use sentry_profiling::{Sampler, SamplerConfig, Symbolizer};

#[path = "support/names.rs"]
mod names;

/// How many times the handler ran to its end.
static HANDLED: AtomicU32 = AtomicU32::new(0);
static STOP: AtomicBool = AtomicBool::new(false);

#[inline(never)]
fn burn_in_signal_handler() -> u64 {
    let started = Instant::now();
    let mut x = 1u64;
    while started.elapsed() < Duration::from_millis(20) {
        for i in 0..2_000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    x
}

extern "C" fn on_sigusr2(_: libc::c_int) {
    std::hint::black_box(burn_in_signal_handler());
    HANDLED.fetch_add(1, Ordering::Relaxed);
}

#[inline(never)]
fn spin_outside_the_handler() {
    while !STOP.load(Ordering::Relaxed) {
        let mut x = 0u64;
        for i in 0..10_000u64 {
            x = std::hint::black_box(x.wrapping_mul(3).wrapping_add(i));
        }
    }
}

#[test]
fn a_thread_inside_its_own_signal_handler_is_sampled_there() {
    // SAFETY: a zeroed sigaction is a valid value to fill in; the handler
    // only burns CPU and touches atomics.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigusr2 as extern "C" fn(libc::c_int) as usize;
        assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()), 0);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = std::thread::Builder::new()
        .name("in-handler".into())
        .spawn(move || {
            // SAFETY: pthread_self has no preconditions.
            tx.send(unsafe { libc::pthread_self() }).unwrap();
            spin_outside_the_handler();
        })
        .unwrap();
    let thread = rx.recv().unwrap();
    let sampler = Sampler::start(SamplerConfig::default().frequency_hz(1000)).expect("sampler");
    let mut samples = Vec::new();
    for _ in 0..40 {
        // SAFETY: `thread` is alive until STOP is set and it is joined.
        assert_eq!(unsafe { libc::pthread_kill(thread, libc::SIGUSR2) }, 0);
        let until = Instant::now() + Duration::from_millis(40);
        while Instant::now() < until {
            if let Some(s) = sampler.recv_timeout(Duration::from_millis(10)) {
                samples.push(s);
            }
        }
    }
    samples.extend(sampler.try_iter());
    let modules = sampler.modules();
    let stats = sampler.stop();
    STOP.store(true, Ordering::Relaxed);
    worker.join().unwrap();
    let mut sym = Symbolizer::new();
    let (mut of_thread, mut in_handler) = (0usize, 0usize);
    for s in samples
        .iter()
        .filter(|s| &**s.thread_name() == "in-handler")
    {
        of_thread += 1;
        let names = names::function_names(&mut sym, &modules, s);
        in_handler += usize::from(names.iter().any(|n| n.ends_with("burn_in_signal_handler")));
    }
    let handled = HANDLED.load(Ordering::Relaxed);
    eprintln!(
        "handled {handled}; samples of the thread {of_thread}, in the handler {in_handler}; stats {stats:?}"
    );
    assert_eq!(handled, 40, "every SIGUSR2 ran its handler to the end");
    assert!(
        in_handler >= 100,
        "only {in_handler} of {of_thread} samples show the code running in the signal handler"
    );
}
