//! The sampler falls behind: when a tick takes longer than its period (here
//! the sampler thread is starved of CPU), the missed ticks are skipped and
//! counted, never queued up and fired in a burst afterwards.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sentry_profiling::{Sampler, SamplerConfig, SamplerStats};

const HZ: u32 = 1000;
/// Ticks allowed beyond elapsed time / period: the snapshot boundaries and
/// the first tick of a window.
const SLACK_TICKS: f64 = 25.0;

/// The sampler thread's id (its name is `sentry-profiler`; no Sentry session
/// runs in this binary, so no other thread has that prefix).
fn sampler_tid() -> libc::pid_t {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == "sentry-profiler" {
            found.push(entry.file_name().to_string_lossy().parse().unwrap());
        }
    }
    assert_eq!(found.len(), 1, "sampler threads found: {found:?}");
    found[0]
}

fn affinity(tid: libc::pid_t) -> libc::cpu_set_t {
    // SAFETY: a zeroed cpu_set_t is an empty set; the call fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let rc = libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
        assert_eq!(
            rc,
            0,
            "sched_getaffinity: {}",
            std::io::Error::last_os_error()
        );
        set
    }
}

fn set_affinity(tid: libc::pid_t, set: &libc::cpu_set_t) {
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), set) };
    assert_eq!(
        rc,
        0,
        "sched_setaffinity: {}",
        std::io::Error::last_os_error()
    );
}

fn one_cpu(cpu: usize) -> libc::cpu_set_t {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET sets one bit of it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        set
    }
}

fn set_policy(tid: libc::pid_t, policy: libc::c_int) -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param for a non-real-time policy.
    unsafe { libc::sched_setscheduler(tid, policy, &param) == 0 }
}

#[inline(never)]
fn hog(stop: &AtomicBool) {
    let mut x = 0u64;
    while !stop.load(Ordering::Relaxed) {
        x = std::hint::black_box(x.wrapping_mul(13).wrapping_add(1));
    }
}

fn ticks_per_period_bound(elapsed: Duration) -> f64 {
    elapsed.as_secs_f64() * f64::from(HZ) + SLACK_TICKS
}

fn snapshot(sampler: &Sampler) -> (Instant, SamplerStats) {
    (Instant::now(), sampler.stats())
}

#[test]
fn overrun_ticks_are_skipped_and_counted_not_queued() {
    let sampler = Sampler::start(SamplerConfig::default().frequency_hz(HZ)).expect("sampler");
    let tid = sampler_tid();
    let original = affinity(tid);
    // SAFETY: CPU_ISSET reads a bit of a valid set.
    let cpu = (0..libc::CPU_SETSIZE as usize)
        .find(|&c| unsafe { libc::CPU_ISSET(c, &original) })
        .expect("some CPU is allowed");

    std::thread::sleep(Duration::from_millis(300));
    let (t0, s0) = snapshot(&sampler);

    // Starve the sampler: alone on one CPU with two busy threads, at the
    // idle scheduling class (which an unprivileged process may choose).
    let stop = Arc::new(AtomicBool::new(false));
    let hogs: Vec<_> = (0..2)
        .map(|i| {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name(format!("hog-{i}"))
                .spawn(move || {
                    set_affinity(0, &one_cpu(cpu));
                    hog(&stop)
                })
                .unwrap()
        })
        .collect();
    set_affinity(tid, &one_cpu(cpu));
    assert!(
        set_policy(tid, libc::SCHED_IDLE),
        "SCHED_IDLE: {}",
        std::io::Error::last_os_error()
    );
    std::thread::sleep(Duration::from_millis(1500));

    // End the stall.
    stop.store(true, Ordering::Relaxed);
    for h in hogs {
        h.join().unwrap();
    }
    let restored = set_policy(tid, libc::SCHED_OTHER);
    set_affinity(tid, &original);
    let (t1, s1) = snapshot(&sampler);
    std::thread::sleep(Duration::from_millis(400));
    let (t2, s2) = snapshot(&sampler);
    let stats = sampler.stop();

    let skipped = s2.ticks_skipped - s0.ticks_skipped;
    assert!(skipped > 0, "no tick was counted as skipped: {stats:?}");

    // No burst after the stall: the window right after it has at most its
    // own share of ticks. Had the missed ticks been queued, hundreds would
    // fire here at once.
    let after = (s2.ticks - s1.ticks) as f64;
    assert!(
        after <= ticks_per_period_bound(t2 - t1),
        "{after} ticks in {:?} after the stall ({skipped} skipped): a burst",
        t2 - t1
    );
    // Nor over the whole run, and run plus skipped ticks account for the
    // schedule without exceeding it.
    let whole = (s2.ticks - s0.ticks) as f64;
    assert!(
        whole <= ticks_per_period_bound(t2 - t0),
        "{whole} ticks in {:?}",
        t2 - t0
    );
    assert!(
        whole + skipped as f64 <= ticks_per_period_bound(t2 - t0),
        "{whole} ticks + {skipped} skipped exceed {:?} of schedule",
        t2 - t0
    );
    if restored {
        // Back on a normal policy, the sampler resumes ticking.
        assert!(after > 0.0, "the sampler did not resume after the stall");
    }
}
