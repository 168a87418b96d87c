//! The profiler never makes an application's system call fail with `EINTR`.
//!
//! `SA_RESTART` does not restart `poll`, `epoll_wait`, `nanosleep`, `futex`
//! waits with a timeout, `sigtimedwait`, or socket calls with a timeout
//! (signal(7), "Interruption of system calls"), and many C libraries and
//! drivers treat `EINTR` as an error. Threads here loop on each of those
//! (and on `read` from an empty pipe) with short timeouts while the sampler
//! runs at 101 Hz and then at 1000 Hz for 10 s each: not one call may come
//! back with `EINTR`, and the threads' samples must still show where they
//! wait (the waiting function of each thread, by name).

#[path = "support/eintr.rs"]
mod eintr;
#[path = "support/names.rs"]
mod names;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use eintr::{Tally, sample_at, timespec_ms};
use sentry_profiling::Symbolizer;

/// Each call's timeout.
const TIMEOUT_MS: i32 = 5;
const RUN: Duration = Duration::from_secs(10);

fn pipe() -> (i32, i32) {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints for the kernel to fill.
    let rc = unsafe { libc::pipe(fds.as_mut_ptr()) };
    assert_eq!(rc, 0, "pipe");
    (fds[0], fds[1])
}

#[inline(never)]
fn wait_in_poll(stop: &AtomicBool, tally: &Tally) {
    let (r, _w) = pipe();
    while !stop.load(Ordering::Relaxed) {
        let mut fd = libc::pollfd {
            fd: r,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut fd, 1, TIMEOUT_MS) };
        tally.count(rc.into(), &[]);
    }
}

#[inline(never)]
fn wait_in_epoll(stop: &AtomicBool, tally: &Tally) {
    let (r, _w) = pipe();
    // SAFETY: plain system calls on descriptors this function owns; `ev`
    // and `out` are valid for the kernel to read and write.
    let ep = unsafe { libc::epoll_create1(0) };
    assert!(ep >= 0, "epoll_create1");
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: 0,
    };
    // SAFETY: as above.
    let rc = unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, r, &mut ev) };
    assert_eq!(rc, 0, "epoll_ctl");
    let mut out = [libc::epoll_event { events: 0, u64: 0 }; 4];
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: `out` holds 4 events.
        let rc = unsafe { libc::epoll_wait(ep, out.as_mut_ptr(), 4, TIMEOUT_MS) };
        tally.count(rc.into(), &[]);
    }
}

#[inline(never)]
fn wait_in_nanosleep(stop: &AtomicBool, tally: &Tally) {
    while !stop.load(Ordering::Relaxed) {
        let ts = timespec_ms(TIMEOUT_MS);
        // SAFETY: `ts` is a valid timespec; no remainder is asked for.
        let rc = unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
        tally.count(rc.into(), &[]);
    }
}

#[inline(never)]
fn wait_in_pipe_read(stop: &AtomicBool, tally: &Tally, r: i32) {
    let mut byte = [0u8; 1];
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: reads at most one byte into `byte`.
        let rc = unsafe { libc::read(r, byte.as_mut_ptr().cast(), 1) };
        tally.count(rc as libc::c_long, &[]);
    }
}

#[inline(never)]
fn wait_in_futex(stop: &AtomicBool, tally: &Tally) {
    let word = std::sync::atomic::AtomicU32::new(0);
    while !stop.load(Ordering::Relaxed) {
        let ts = timespec_ms(TIMEOUT_MS);
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
        tally.count(rc, &[libc::ETIMEDOUT, libc::EAGAIN]);
    }
}

#[inline(never)]
fn wait_in_accept(stop: &AtomicBool, tally: &Tally) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let fd = std::os::fd::AsRawFd::as_raw_fd(&listener);
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: libc::suseconds_t::from(TIMEOUT_MS) * 1000,
    };
    // SAFETY: sets a timeval option on a socket this function owns.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_RCVTIMEO");
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: no peer address is asked for.
        let rc = unsafe { libc::accept(fd, std::ptr::null_mut(), std::ptr::null_mut()) };
        if rc >= 0 {
            // SAFETY: closes the descriptor just returned.
            unsafe { libc::close(rc) };
        }
        tally.count(rc.into(), &[libc::EAGAIN, libc::EWOULDBLOCK]);
    }
}

#[inline(never)]
fn wait_in_sigtimedwait(stop: &AtomicBool, tally: &Tally) {
    // SAFETY: builds a signal set and blocks SIGUSR1 in this thread only, so
    // that sigtimedwait may wait for it (nobody sends it).
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    while !stop.load(Ordering::Relaxed) {
        let ts = timespec_ms(TIMEOUT_MS);
        // SAFETY: valid set and timeout; no siginfo is asked for.
        let rc = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &ts) };
        tally.count(rc.into(), &[libc::EAGAIN]);
    }
}

/// The waiting functions, by the name of the thread that runs each (names
/// of at most 15 bytes: the kernel keeps no more).
const WAITS: [(&str, &str); 7] = [
    ("wait-poll", "wait_in_poll"),
    ("wait-epoll", "wait_in_epoll"),
    ("wait-nanosleep", "wait_in_nanosleep"),
    ("wait-pipe-read", "wait_in_pipe_read"),
    ("wait-futex", "wait_in_futex"),
    ("wait-accept", "wait_in_accept"),
    ("wait-sigwait", "wait_in_sigtimedwait"),
];

/// Runs the waiting threads under a sampler at `hz` for [`RUN`]; returns
/// per thread (calls, EINTRs, other errors, samples, samples showing the
/// waiting function).
/// Per waiting function: its calls, `EINTR`s, other errors, samples, samples
/// that show it, and (when fewer than half do) what the rest show.
type Results = HashMap<&'static str, (u64, u64, u64, usize, usize, String)>;

fn run_at(hz: u32) -> Results {
    let stop = Arc::new(AtomicBool::new(false));
    let tallies: Vec<Arc<Tally>> = WAITS.iter().map(|_| Arc::default()).collect();
    // The pipe reader gets a byte every 20 ms, so it keeps coming back.
    let (pipe_r, pipe_w) = pipe();
    let mut handles = Vec::new();
    for (i, (name, _)) in WAITS.iter().enumerate() {
        let stop = Arc::clone(&stop);
        let tally = Arc::clone(&tallies[i]);
        handles.push(
            std::thread::Builder::new()
                .name((*name).to_owned())
                .spawn(move || match i {
                    0 => wait_in_poll(&stop, &tally),
                    1 => wait_in_epoll(&stop, &tally),
                    2 => wait_in_nanosleep(&stop, &tally),
                    3 => wait_in_pipe_read(&stop, &tally, pipe_r),
                    4 => wait_in_futex(&stop, &tally),
                    5 => wait_in_accept(&stop, &tally),
                    _ => wait_in_sigtimedwait(&stop, &tally),
                })
                .expect("spawn"),
        );
    }
    let feeder_stop = Arc::clone(&stop);
    let feeder = std::thread::spawn(move || {
        while !feeder_stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
            // SAFETY: writes one byte from a live buffer.
            unsafe { libc::write(pipe_w, b"x".as_ptr().cast(), 1) };
        }
        // One more, so the reader sees `stop`.
        // SAFETY: as above.
        unsafe { libc::write(pipe_w, b"x".as_ptr().cast(), 1) };
    });
    std::thread::sleep(Duration::from_millis(50));

    let (samples, modules, stats) = sample_at(hz, RUN);
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().expect("waiting thread");
    }
    feeder.join().expect("feeder");
    eprintln!("{hz} Hz: {stats:?}");

    let mut sym = Symbolizer::new();
    let mut out = HashMap::new();
    for (i, (name, func)) in WAITS.iter().enumerate() {
        let mine: Vec<_> = samples
            .iter()
            .filter(|s| &**s.thread_name() == *name)
            .collect();
        let showing = mine
            .iter()
            .filter(|s| {
                names::function_names(&mut sym, &modules, s)
                    .iter()
                    .any(|n| n.contains(func))
            })
            .count();
        // Where a thread's samples do not show its wait, what they show
        // instead (the most common stacks, leaf first), for the failure.
        let mut shown_instead = String::new();
        if showing * 2 < mine.len() {
            let mut stacks: HashMap<String, usize> = HashMap::new();
            for s in &mine {
                let names = names::function_names(&mut sym, &modules, s).join(" < ");
                *stacks
                    .entry(format!("{:x?}: {names}", s.frames()))
                    .or_default() += 1;
            }
            let mut stacks: Vec<_> = stacks.into_iter().collect();
            stacks.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
            for (stack, n) in stacks.iter().take(3) {
                shown_instead.push_str(&format!("\n    {n} samples: {stack}"));
            }
        }
        let (calls, eintr, other) = tallies[i].get();
        out.insert(
            *func,
            (calls, eintr, other, mine.len(), showing, shown_instead),
        );
    }
    out
}

#[test]
fn no_system_call_returns_eintr_and_waiting_threads_show_where_they_wait() {
    let mut failures = Vec::new();
    for hz in [101, 1000] {
        let results = run_at(hz);
        for (_, func) in WAITS {
            let (calls, eintr, other, samples, showing, ref shown_instead) = results[func];
            eprintln!(
                "{hz} Hz {func}: calls={calls} EINTR={eintr} other_errors={other} \
                 samples={samples} showing_the_wait={showing}"
            );
            assert!(calls > 100, "{func} made only {calls} calls");
            assert_eq!(other, 0, "{func}: unexpected errors");
            if eintr > 0 {
                failures.push(format!("{hz} Hz: {func} returned EINTR {eintr} times"));
            }
            // Most of its time each thread waits: at least half of its
            // samples must name the function it waits in.
            let expected = f64::from(hz) * RUN.as_secs_f64();
            if (samples as f64) < expected * 0.5 || showing * 2 < samples {
                failures.push(format!(
                    "{hz} Hz: {func}: {showing} of {samples} samples show where it waits \
                     (expected about {expected:.0} samples){shown_instead}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
