//! On a machine with more runnable threads than cores, a thread that
//! burns CPU between waits is still sampled where it burns, and its waits
//! never fail with `EINTR`.
//!
//! The kernel checks a thread's CPU-time timer only at its scheduler ticks,
//! and a busy scheduler that switches threads between ticks can keep a
//! thread off the CPU at every tick for hundreds of milliseconds of its CPU
//! time: its timer then stays expired and unfired. The sampler takes those
//! captures itself, with a signal, only while the thread is not blocked in
//! a system call. Here, beside CPU hogs (two more than the cores), threads
//! alternate 20 ms of CPU with short waits in calls that `SA_RESTART`
//! does not restart (`epoll_wait`, `nanosleep`, a timed `futex` wait):
//! none may return `EINTR`, each thread's captures must show its burning
//! function, and at most [`MAX_LONG_SHARE`] of their CPU time together may
//! be run in stretches longer than [`LONG_STRETCH`] without a capture. On
//! this project's 2-core VM, without the sampler's catch-up, 34% to 49% of
//! it is, in stretches of up to 96 ms (55 to 317 ms on an earlier kernel).

#[path = "support/eintr.rs"]
mod eintr;
#[path = "support/names.rs"]
mod names;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eintr::{Tally, sample_at, timespec_ms};
use sentry_profiling::Symbolizer;

const RUN: Duration = Duration::from_secs(10);
const HZ: u32 = 500;
/// CPU time each busy thread burns between two waits.
const BURN: Duration = Duration::from_millis(20);
/// Each wait's timeout.
const WAIT_MS: i32 = 1;
/// A stretch of a busy thread's CPU time between two captures of its
/// running code counts as long above this. The sampler takes a capture
/// itself after a period and 5 ms of CPU time without one (7 ms here),
/// counted from its first look after the latest capture, and looks at each
/// tick: a stretch is that and what the thread ran in the sampler's tick
/// gaps around it (about 4 ms of CPU each beside the hogs).
const LONG_STRETCH: Duration = Duration::from_millis(15);
/// The share of the busy threads' CPU time, the three together, they may
/// run in long stretches. Measured over the three: at most 5% with the
/// catch-up on a machine with only the test's hogs and four more, 11% with
/// a build running beside those too (one thread 12%: one thread's unlucky
/// scheduling moves its own share, so the bound is on the three together);
/// 34% to 49% without the catch-up (one thread 15% to 66%). Not a bound on
/// the longest stretch, with the reason: the sampler thread itself can be
/// kept off a CPU for tens of milliseconds (the host descheduling the VM's
/// CPU), and every thread then runs one long stretch at once; CI met that
/// once, 42 to 52 ms on all three threads in one run, about 1.5% of each
/// one's CPU time.
const MAX_LONG_SHARE: f64 = 0.20;

/// One busy thread's calls, and its CPU clock against the wall clock while
/// it burned: (wall-clock ns since the epoch, its CPU time in ns), taken
/// every 20,000 steps of its burning loop.
#[derive(Default)]
struct Busy {
    tally: Tally,
    clock: Mutex<Vec<(u64, u64)>>,
}

impl Busy {
    /// Until `stop`: burns [`BURN`] of CPU time, then makes one call with
    /// `wait`, which returns the call's result and the `errno`s it may
    /// expect.
    fn run(&self, stop: &AtomicBool, mut wait: impl FnMut() -> (libc::c_long, &'static [i32])) {
        let mut log = Vec::with_capacity(200_000);
        while !stop.load(Ordering::Relaxed) {
            burn_between_waits(BURN, &mut log);
            let (rc, ok_errnos) = wait();
            self.tally.count(rc, ok_errnos);
        }
        *self.clock.lock().unwrap() = log;
    }
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec this function owns.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Burns `cpu` of this thread's CPU time, noting its CPU clock in `log`.
#[inline(never)]
fn burn_between_waits(cpu: Duration, log: &mut Vec<(u64, u64)>) -> u64 {
    let until = thread_cpu() + cpu;
    let mut x = 1u64;
    loop {
        let now = thread_cpu();
        log.push((wall_ns(), now.as_nanos() as u64));
        if now >= until {
            break;
        }
        for _ in 0..20_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    x
}

/// The thread's CPU time at wall-clock `ns`, from its log.
fn cpu_at(log: &[(u64, u64)], ns: u64) -> Option<u64> {
    let i = log.partition_point(|&(wall, _)| wall <= ns);
    log.get(i.checked_sub(1)?).map(|&(_, cpu)| cpu)
}

/// CPU hogs in processes of their own (shell loops), killed when dropped,
/// the test failing or not.
struct Hogs(Vec<std::process::Child>);

impl Hogs {
    fn start(n: usize) -> Self {
        Self(
            (0..n)
                .map(|_| {
                    std::process::Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .spawn()
                        .expect("sh")
                })
                .collect(),
        )
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn busy_epoll(stop: &AtomicBool, busy: &Busy) {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints for the kernel to fill.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    // SAFETY: plain system calls on descriptors this function owns; `ev`
    // is valid for the kernel to read.
    let ep = unsafe { libc::epoll_create1(0) };
    assert!(ep >= 0, "epoll_create1");
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: 0,
    };
    // SAFETY: as above.
    let rc = unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fds[0], &mut ev) };
    assert_eq!(rc, 0, "epoll_ctl");
    let mut out = [libc::epoll_event { events: 0, u64: 0 }; 4];
    busy.run(stop, || {
        // SAFETY: `out` holds 4 events.
        let rc = unsafe { libc::epoll_wait(ep, out.as_mut_ptr(), 4, WAIT_MS) };
        (rc.into(), &[])
    });
}

fn busy_nanosleep(stop: &AtomicBool, busy: &Busy) {
    busy.run(stop, || {
        let ts = timespec_ms(WAIT_MS);
        // SAFETY: `ts` is a valid timespec; no remainder is asked for.
        let rc = unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
        (rc.into(), &[])
    });
}

fn busy_futex(stop: &AtomicBool, busy: &Busy) {
    let word = std::sync::atomic::AtomicU32::new(0);
    busy.run(stop, || {
        let ts = timespec_ms(WAIT_MS);
        // SAFETY: FUTEX_WAIT on a live word with a valid relative timeout.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                0u32,
                &ts as *const libc::timespec,
            )
        };
        (rc, &[libc::ETIMEDOUT, libc::EAGAIN])
    });
}

const BUSY: [&str; 3] = ["busy-epoll", "busy-nanosleep", "busy-futex"];

#[test]
fn busy_threads_on_a_crowded_machine_are_sampled_where_they_burn_and_never_see_eintr() {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let stop = Arc::new(AtomicBool::new(false));
    // Hogs in processes of their own, as other services on the machine.
    let _hogs = Hogs::start(cores + 2);
    let threads: Vec<Arc<Busy>> = BUSY.iter().map(|_| Arc::default()).collect();
    let mut busy = Vec::new();
    for (i, name) in BUSY.iter().enumerate() {
        let stop = Arc::clone(&stop);
        let busy_i = Arc::clone(&threads[i]);
        busy.push(
            std::thread::Builder::new()
                .name((*name).to_owned())
                .spawn(move || match i {
                    0 => busy_epoll(&stop, &busy_i),
                    1 => busy_nanosleep(&stop, &busy_i),
                    _ => busy_futex(&stop, &busy_i),
                })
                .expect("spawn"),
        );
    }
    std::thread::sleep(Duration::from_millis(50));

    let (samples, modules, stats) = sample_at(HZ, RUN);
    stop.store(true, Ordering::Relaxed);
    for h in busy {
        h.join().expect("thread");
    }
    eprintln!("{stats:?}");

    let mut sym = Symbolizer::new();
    let mut failures = Vec::new();
    // CPU time in all stretches, and in long ones, the three together.
    let (mut all_ns, mut long_ns) = (0u128, 0u128);
    for (i, name) in BUSY.iter().enumerate() {
        let (calls, eintr, other) = threads[i].tally.get();
        let mine: Vec<_> = samples
            .iter()
            .filter(|s| &**s.thread_name() == *name)
            .collect();
        // Its captures of running code (not a stack repeated for a period
        // it waited or stood preempted), in time order.
        let mut captures: Vec<_> = mine.iter().filter(|s| !s.is_repeated()).collect();
        captures.sort_by_key(|s| s.timestamp_ns());
        let burning = captures
            .iter()
            .filter(|s| {
                names::function_names(&mut sym, &modules, s)
                    .iter()
                    .any(|n| n.contains("burn_between_waits"))
            })
            .count();
        let log = threads[i].clock.lock().unwrap();
        let first_ns = captures.first().map_or(0, |s| s.timestamp_ns());
        // (CPU time without a capture, ms after the first capture).
        let stretches: Vec<(Duration, u64)> = captures
            .windows(2)
            .filter_map(|w| {
                let cpu = cpu_at(&log, w[1].timestamp_ns())? - cpu_at(&log, w[0].timestamp_ns())?;
                let at = w[0].timestamp_ns().saturating_sub(first_ns) / 1_000_000;
                Some((Duration::from_nanos(cpu), at))
            })
            .collect();
        let (longest, at) = stretches.iter().copied().max().unzip();
        let total: Duration = stretches.iter().map(|s| s.0).sum();
        let long: Duration = stretches
            .iter()
            .map(|s| s.0)
            .filter(|&cpu| cpu > LONG_STRETCH)
            .sum();
        let long_share = long.as_secs_f64() / total.as_secs_f64().max(1e-9);
        all_ns += total.as_nanos();
        long_ns += long.as_nanos();
        eprintln!(
            "{name}: calls={calls} EINTR={eintr} other_errors={other} samples={} captures={} burning={burning} longest CPU time without a capture={longest:?} (from {at:?} ms after its first capture) in long stretches={:.1}%",
            mine.len(),
            captures.len(),
            long_share * 100.0,
        );
        assert!(calls > 50, "{name} made only {calls} calls");
        assert_eq!(other, 0, "{name}: unexpected errors");
        if eintr > 0 {
            failures.push(format!("{name} returned EINTR {eintr} times"));
        }
        // It runs only in its burning function (its waits are captured
        // by reading where it blocks, not as running code).
        if captures.len() < 100 || burning * 10 < captures.len() * 9 {
            failures.push(format!(
                "{name}: {burning} of {} captures show burn_between_waits",
                captures.len()
            ));
        }
        if stretches.len() < 100 {
            failures.push(format!("{name}: only {} captures", stretches.len() + 1));
        }
    }
    let share = long_ns as f64 / all_ns.max(1) as f64;
    eprintln!("all three: {:.1}% in long stretches", share * 100.0);
    if share > MAX_LONG_SHARE {
        failures.push(format!(
            "the three ran {:.1}% of their CPU time in stretches of more than {LONG_STRETCH:?} without a capture (at most {:.0}%)",
            share * 100.0,
            MAX_LONG_SHARE * 100.0,
        ));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
