//! The profiling signal arriving while a thread runs inside one of the
//! application's signal handlers (here, a handler that burns CPU for a
//! while) is harmless: the application's handler runs to completion, the
//! thread carries on, and the samples show the handler's code. Checked with
//! the handler on the thread's own stack and on an alternate signal stack
//! (where the profiler records the program counter only).

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sentry_profiling::{Sampler, SamplerConfig, Symbolizer};

#[path = "support/clock.rs"]
mod clock;

use clock::realtime_ns;

/// How long the application's handler burns CPU.
const IN_HANDLER: Duration = Duration::from_millis(300);

/// Handler runs that completed, per signal (SIGUSR1: own stack, SIGUSR2:
/// alternate stack).
static COMPLETED: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
/// Wall-clock window of each handler run, nanoseconds since the epoch.
static WINDOW: [(AtomicU64, AtomicU64); 2] = [
    (AtomicU64::new(0), AtomicU64::new(0)),
    (AtomicU64::new(0), AtomicU64::new(0)),
];
/// Whether the SIGUSR2 run was on the alternate stack.
static ON_ALT_STACK: AtomicBool = AtomicBool::new(false);
static ALT_LO: AtomicU64 = AtomicU64::new(0);
static ALT_HI: AtomicU64 = AtomicU64::new(0);
static TID: AtomicI32 = AtomicI32::new(0);

/// The CPU loop inside the application's handler: clock reads and
/// arithmetic only, which are async-signal-safe.
#[inline(never)]
fn spin_in_app_handler() -> u64 {
    let until = realtime_ns() + IN_HANDLER.as_nanos() as u64;
    let mut x = 0u64;
    while realtime_ns() < until {
        for _ in 0..1000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    x
}

extern "C" fn app_handler(sig: libc::c_int) {
    let i = usize::from(sig == libc::SIGUSR2);
    if i == 1 {
        let here = &sig as *const _ as u64;
        ON_ALT_STACK.store(
            (ALT_LO.load(Ordering::Relaxed)..ALT_HI.load(Ordering::Relaxed)).contains(&here),
            Ordering::Relaxed,
        );
    }
    WINDOW[i].0.store(realtime_ns(), Ordering::Relaxed);
    std::hint::black_box(spin_in_app_handler());
    WINDOW[i].1.store(realtime_ns(), Ordering::Relaxed);
    COMPLETED[i].fetch_add(1, Ordering::Relaxed);
}

fn install(sig: libc::c_int, flags: libc::c_int) {
    // SAFETY: the handler is async-signal-safe (atomics, clock reads and
    // arithmetic); a zeroed sigaction with an empty mask is valid.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = app_handler as *const () as usize;
        action.sa_flags = flags;
        libc::sigemptyset(&mut action.sa_mask);
        assert_eq!(libc::sigaction(sig, &action, std::ptr::null_mut()), 0);
    }
}

fn handler_of(sig: libc::c_int) -> usize {
    // SAFETY: a null new action only reads the current one into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old);
        old.sa_sigaction
    }
}

#[test]
fn profiling_signal_inside_an_application_handler_is_harmless() {
    install(libc::SIGUSR1, 0);
    install(libc::SIGUSR2, libc::SA_ONSTACK);
    let sampler = match Sampler::start(SamplerConfig::default().frequency_hz(500)) {
        Ok(s) => s,
        Err(sentry_profiling::Error::Unsupported) => return,
        Err(e) => panic!("{e}"),
    };
    assert!(
        sampler.signal() != libc::SIGUSR1 && sampler.signal() != libc::SIGUSR2,
        "the profiler took an application signal"
    );

    let worker = std::thread::Builder::new()
        .name("app-handler".into())
        .spawn(|| {
            // SAFETY: gettid has no preconditions.
            TID.store(unsafe { libc::gettid() }, Ordering::Relaxed);
            // An alternate signal stack for SIGUSR2 (leaked: it must outlive
            // every handler run on this thread).
            let alt: &'static mut [u8] = Vec::leak(vec![0u8; 256 * 1024]);
            ALT_LO.store(alt.as_ptr() as u64, Ordering::Relaxed);
            ALT_HI.store(alt.as_ptr() as u64 + alt.len() as u64, Ordering::Relaxed);
            let stack = libc::stack_t {
                ss_sp: alt.as_mut_ptr().cast(),
                ss_flags: 0,
                ss_size: alt.len(),
            };
            // SAFETY: `stack` describes a live, leaked buffer of that size.
            let rc = unsafe { libc::sigaltstack(&stack, std::ptr::null_mut()) };
            assert_eq!(rc, 0, "sigaltstack");
            // SAFETY: raising a signal whose handler is installed above; it
            // runs synchronously on this thread before `raise` returns.
            unsafe {
                assert_eq!(libc::raise(libc::SIGUSR1), 0);
                assert_eq!(libc::raise(libc::SIGUSR2), 0);
            }
            // The thread carries on normally afterwards.
            let mut x = 0u64;
            for i in 0..1_000_000u64 {
                x = std::hint::black_box(x ^ i);
            }
            x
        })
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !worker.is_finished() {
        assert!(
            Instant::now() < deadline,
            "the thread never left the handlers"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    worker.join().expect("the thread ran to its end");
    std::thread::sleep(Duration::from_millis(100));

    for (i, c) in COMPLETED.iter().enumerate() {
        assert_eq!(
            c.load(Ordering::Relaxed),
            1,
            "handler run {i} completed once"
        );
    }
    assert!(
        ON_ALT_STACK.load(Ordering::Relaxed),
        "SIGUSR2's handler ran on the alternate stack"
    );
    assert_eq!(handler_of(libc::SIGUSR1), app_handler as *const () as usize);
    assert_eq!(handler_of(libc::SIGUSR2), app_handler as *const () as usize);

    let modules = sampler.modules();
    let tid = TID.load(Ordering::Relaxed) as u32;
    let samples: Vec<_> = sampler
        .try_iter()
        .filter(|s| s.thread_id() == tid)
        .collect();
    let stats = sampler.stop();
    let mut symbols = Symbolizer::new();
    for (i, what) in ["own stack", "alternate stack"].iter().enumerate() {
        let (from, to) = (
            WINDOW[i].0.load(Ordering::Relaxed),
            WINDOW[i].1.load(Ordering::Relaxed),
        );
        let inside: Vec<_> = samples
            .iter()
            .filter(|s| (from..=to).contains(&s.timestamp_ns()) && !s.is_repeated())
            .collect();
        let in_spin = inside
            .iter()
            .filter(|s| {
                s.frames().iter().take(3).any(|&a| {
                    symbols
                        .function(&modules, a)
                        .is_some_and(|f| f.contains("spin_in_app_handler"))
                })
            })
            .count();
        assert!(
            in_spin > 0,
            "{what}: {} samples inside the handler, none in spin_in_app_handler; {stats:?}",
            inside.len()
        );
    }
}
