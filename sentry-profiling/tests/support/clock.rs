//! The clocks the sampler test binaries compare samples against, read with
//! `clock_gettime` (a vDSO read: no allocation, and async-signal-safe, so
//! a signal handler of the test may call them).

/// `CLOCK_REALTIME` in nanoseconds: the clock samples are stamped with.
#[allow(dead_code)]
pub(crate) fn realtime_ns() -> u64 {
    read(libc::CLOCK_REALTIME)
}

/// The calling thread's CPU time in nanoseconds.
#[allow(dead_code)]
pub(crate) fn thread_cpu_ns() -> u64 {
    read(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid local timespec for the kernel to write.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
