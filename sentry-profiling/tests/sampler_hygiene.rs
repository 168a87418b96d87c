//! Signal hygiene: the profiler never takes over a signal the application
//! handles. With the application's own handlers on the two highest
//! real-time signals, the profiler picks another one, refuses an explicit
//! request for an occupied one, leaves the application's handlers installed
//! and working while it profiles, and still in place after it stops.

use std::os::unix::thread::JoinHandleExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sentry_profiling::{Sample, Sampler, SamplerConfig};

/// The application's signals (`SIGRTMAX`, `SIGRTMAX - 1`), set before the
/// handler is installed.
static APP_SIGNALS: [AtomicI32; 2] = [AtomicI32::new(0), AtomicI32::new(0)];
/// Deliveries of each application signal to the application's handler.
static DELIVERED: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
/// Deliveries of any other signal to the application's handler.
static DELIVERED_OTHER: AtomicUsize = AtomicUsize::new(0);

const ROUNDS: usize = 10;

/// The application's handler: only atomics, async-signal-safe.
extern "C" fn app_handler(sig: libc::c_int, _info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    for (app, count) in APP_SIGNALS.iter().zip(&DELIVERED) {
        if app.load(Ordering::Relaxed) == sig {
            count.fetch_add(1, Ordering::Relaxed);
            return;
        }
    }
    DELIVERED_OTHER.fetch_add(1, Ordering::Relaxed);
}

fn app_handler_addr() -> usize {
    app_handler as *const () as usize
}

fn current_action(sig: i32) -> libc::sigaction {
    // SAFETY: with a null new action, sigaction only writes the current one
    // into `old`, a zeroed (valid) local.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        assert_eq!(
            libc::sigaction(sig, std::ptr::null(), &mut old),
            0,
            "query signal {sig}"
        );
        old
    }
}

fn install_app_handler(sig: i32) {
    // SAFETY: a zeroed sigaction is a valid starting value; `app_handler` has
    // the SA_SIGINFO signature and only touches atomics (async-signal-safe).
    let rc = unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = app_handler_addr();
        action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(sig, &action, std::ptr::null_mut())
    };
    assert_eq!(rc, 0, "install the application's handler on {sig}");
}

fn assert_app_handler_in_place(sig: i32, when: &str) {
    let action = current_action(sig);
    assert_eq!(
        action.sa_sigaction,
        app_handler_addr(),
        "{when}: signal {sig} no longer has the application's handler"
    );
    assert_ne!(
        action.sa_flags & libc::SA_SIGINFO,
        0,
        "{when}: signal {sig} lost SA_SIGINFO"
    );
}

#[inline(never)]
fn spin(stop: &AtomicBool) -> u64 {
    let mut x = 1u64;
    while !stop.load(Ordering::Relaxed) {
        for i in 0..10_000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    x
}

#[test]
fn application_signal_handlers_are_never_taken_over() {
    let app = [libc::SIGRTMAX(), libc::SIGRTMAX() - 1];
    for (slot, sig) in APP_SIGNALS.iter().zip(app) {
        assert_eq!(
            current_action(sig).sa_sigaction,
            libc::SIG_DFL,
            "signal {sig} already has a handler before the test installs one"
        );
        slot.store(sig, Ordering::Relaxed);
        install_app_handler(sig);
    }

    // Asking for an occupied signal explicitly fails, and leaves it alone.
    // This runs before any successful start: once the profiler's handler is
    // installed, every later start reuses that signal.
    for sig in app {
        let err = Sampler::start(SamplerConfig::default().signal(sig))
            .expect_err("an explicit request for the application's signal must fail");
        eprintln!("signal({sig}) refused: {err}");
        assert_app_handler_in_place(sig, "after the refused start");
    }

    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let stop = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("hygiene-busy".into())
            .spawn(move || spin(&stop))
            .unwrap()
    };
    std::thread::sleep(Duration::from_millis(50));

    let sampler = Sampler::start(SamplerConfig::default()).expect("sampler starts");
    let profiler_signal = sampler.signal();
    eprintln!("application signals {app:?}, profiler signal {profiler_signal}");
    assert!(
        !app.contains(&profiler_signal),
        "the profiler took the application's signal {profiler_signal}"
    );
    assert!(
        (libc::SIGRTMIN()..=libc::SIGRTMAX()).contains(&profiler_signal),
        "the profiler's signal {profiler_signal} is not a real-time signal"
    );
    for sig in app {
        assert_app_handler_in_place(sig, "after the profiler started");
    }

    // The application keeps using its signals while the profiler runs: one
    // raised on this thread, one sent to the thread being profiled.
    let mut samples: Vec<Sample> = Vec::new();
    let target = worker.as_pthread_t();
    for _ in 0..ROUNDS {
        // SAFETY: raise only sends a signal to the calling thread; its
        // handler is `app_handler`, installed above.
        assert_eq!(unsafe { libc::raise(app[0]) }, 0);
        // SAFETY: `target` is a live thread (joined only below); the signal
        // has the application's handler.
        assert_eq!(unsafe { libc::pthread_kill(target, app[1]) }, 0);
        let until = Instant::now() + Duration::from_millis(50);
        while Instant::now() < until {
            if let Some(s) = sampler.recv_timeout(Duration::from_millis(10)) {
                samples.push(s);
            }
        }
    }
    // Real-time signals are queued, never merged: every one must arrive.
    let deadline = Instant::now() + Duration::from_secs(2);
    while DELIVERED[1].load(Ordering::Relaxed) < ROUNDS && Instant::now() < deadline {
        samples.extend(sampler.try_iter());
        std::thread::sleep(Duration::from_millis(10));
    }
    samples.extend(sampler.try_iter());
    let stats = sampler.stop();
    stop.store(true, Ordering::Relaxed);
    worker.join().unwrap();

    // All its samples (one per period), and those the handler took on it:
    // on a machine whose cores other processes compete for, the worker runs
    // a fraction of the time and its timer fires that much less.
    let worker_samples = samples
        .iter()
        .filter(|s| &**s.thread_name() == "hygiene-busy")
        .count();
    let worker_captures = samples
        .iter()
        .filter(|s| &**s.thread_name() == "hygiene-busy" && !s.is_repeated())
        .count();
    let delivered = [
        DELIVERED[0].load(Ordering::Relaxed),
        DELIVERED[1].load(Ordering::Relaxed),
    ];
    let other = DELIVERED_OTHER.load(Ordering::Relaxed);
    eprintln!(
        "app handler deliveries {delivered:?} (other {other}), worker samples {worker_samples}, \
         stats={stats:?}"
    );
    assert!(
        worker_samples >= 20 && worker_captures >= 3,
        "the profiler did not profile during the test ({worker_samples} samples of the worker, \
         {worker_captures} taken by the handler)"
    );
    assert_eq!(
        delivered,
        [ROUNDS, ROUNDS],
        "the application's handler must see exactly the signals the application sent"
    );
    assert_eq!(
        other, 0,
        "the application's handler received a signal it does not handle"
    );

    for sig in app {
        assert_app_handler_in_place(sig, "after the profiler stopped");
    }
    // SAFETY: as above, raise on the calling thread with our handler.
    assert_eq!(unsafe { libc::raise(app[0]) }, 0);
    assert_eq!(
        DELIVERED[0].load(Ordering::Relaxed),
        ROUNDS + 1,
        "the application's handler no longer runs after the profiler stopped"
    );
}
