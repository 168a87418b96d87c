//! No function is shown where it did not run
//! (`sentry_profiling_tests::phantom`): a service with four named CPU
//! functions timed in-process (in a handler before and after an `.await`,
//! on the blocking pool, on a database thread of its own), six concurrent
//! clients on the machine's cores, at the default frequency.
//!
//! The time shown in a function at a moment no call of it ran where the
//! sample says (on that OS thread; on a request's lane, in that request)
//! must be at most [`MAX_PHANTOM`] of the time shown in it, on threads and
//! on lanes. Before fills showed only what is known of their period, it
//! was 87 to 95 % on threads (idle blocking-pool threads kept showing the
//! last request's code; a preempted thread stood where it was last
//! captured) and up to 34 % on lanes (a request's periods without a capture
//! showed its other stacks, the next poll's before it began). And each
//! function must be shown for at least [`MIN_SHOWN`] of the CPU time its
//! calls burned: a profile that shows nothing shows nothing false.
//!
//! The time requests are shown in `(waiting for a CPU)` must match the
//! kernel's run delay of their threads ([`CPU_WAIT_RATIO`]), and each
//! transaction's `tokio.cpu_wait` must carry that time as shown by the
//! time it was sent ([`MIN_MEASURED`]).

use std::time::Duration;

use sentry_profiling_tests::phantom::{CPU_MS, Measured, Shown, measure};

/// The phantom share allowed: 0 measured; one sample's weight is about
/// 0.5 % of a function's time in this run.
const MAX_PHANTOM: f64 = 0.02;

/// The least share of a function's CPU time it must be shown for: a
/// thread is captured once per period of its CPU time, so the time shown
/// follows it (83 to 94 % measured beside four CPU hogs); the rest is room
/// for a sampler thread kept off the CPU on a busy machine.
const MIN_SHOWN: f64 = 0.5;

/// How far the time requests are shown waiting for a CPU may lie from the
/// kernel's count of it (the run delay of their threads in the timed
/// calls), as a ratio: 0.82 to 0.83 measured on an idle machine, 0.95 to
/// 0.97 beside four CPU hogs; 1.01 to 1.04 beside four CPU hogs on a
/// machine busy with other builds (load 6 to 7) since the periods in a
/// request's poll take the counted waits first, and those the counts do
/// not cover yet show a wait, owed (the thread's total stays the kernel's
/// count; more of it falls in the requests). A thread's waits are shown a period per fill
/// of a period it did not run through (counted in fills, 0.97 of the
/// kernel's count on an idle machine); Sentry weights each sample by the
/// time to the next one, and waits of a few milliseconds between runs (the
/// scheduler's slices on an idle machine, here four busy threads on two
/// cores) are counted at the tick after them, in fills nearer a poll's end
/// than its start, which get less than a period each.
const CPU_WAIT_RATIO: (f64, f64) = (0.7, 1.2);

/// The least share of the time shown waiting for a CPU that requests'
/// `tokio.cpu_wait` totals carry: they count what was shown by the time
/// the transaction was sent, less a request's last periods (0.93 to 0.94
/// measured).
const MIN_MEASURED: f64 = 0.7;

#[test]
fn no_function_is_shown_where_it_did_not_run() {
    let Measured {
        shown,
        requests,
        cpu_wait,
    } = measure(
        sentry_profiling::DEFAULT_FREQUENCY_HZ,
        6,
        Duration::from_secs(8),
    );
    println!("{requests} requests");
    println!("{cpu_wait}");
    let mut failures = Vec::new();
    println!("{}", Shown::TABLE_HEADER);
    for s in &shown {
        println!("{s}");
        let cpu_ns = s.calls as u64 * CPU_MS * 1_000_000;
        let shown_ns: u64 = s.shown_ns.iter().sum();
        if s.calls == 0 || (shown_ns as f64) < cpu_ns as f64 * MIN_SHOWN {
            failures.push(format!(
                "{}: shown {:.0} ms for {} calls of {CPU_MS} ms of CPU",
                s.function,
                shown_ns as f64 / 1e6,
                s.calls
            ));
        }
        if s.phantom_share_on(0) > MAX_PHANTOM {
            failures.push(format!(
                "{}: {:.1}% of its time on OS threads shown where no call ran",
                s.function,
                s.phantom_share_on(0) * 100.0
            ));
        }
        if s.phantom_share_on(1) > MAX_PHANTOM {
            failures.push(format!(
                "{}: {:.1}% of its time on lanes shown where no call ran",
                s.function,
                s.phantom_share_on(1) * 100.0
            ));
        }
    }
    let ratio = cpu_wait.ratio();
    if ratio < CPU_WAIT_RATIO.0 || ratio > CPU_WAIT_RATIO.1 {
        failures.push(format!(
            "requests were shown waiting for a CPU {ratio:.2} times the kernel's count"
        ));
    }
    if cpu_wait.measured != requests
        || cpu_wait.measured_ns > cpu_wait.shown_ns
        || (cpu_wait.measured_ns as f64) < cpu_wait.shown_ns as f64 * MIN_MEASURED
    {
        failures.push(format!(
            "tokio.cpu_wait does not match the profile: {cpu_wait}"
        ));
    }
    assert!(requests >= 30, "only {requests} requests");
    assert!(failures.is_empty(), "{failures:#?}");
}
