//! Idle threads: a thread parked in a blocking call (here a channel
//! receive, like a Tokio worker in `epoll_wait`) still appears in the
//! profile at the tick rate (wall-clock semantics, so its waiting time is
//! visible), yet it is (almost) never interrupted: its samples repeat its
//! last stack instead of signalling it, so a parked thread pays nothing and
//! its blocking syscall is not interrupted.

mod support;

use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use sentry_profiling::{Sample, SamplerConfig};

const HZ: u32 = 101;
const RUN: Duration = Duration::from_secs(2);
const NAME: &str = "idle-parked";

/// Blocks until the sender is dropped; returns how many times the blocking
/// call came back early (it must not: nothing is sent).
#[inline(never)]
fn park_until_hung_up(rx: &Receiver<()>) -> u32 {
    let mut wakeups = 0;
    while rx.recv().is_ok() {
        wakeups += 1;
    }
    wakeups
}

#[test]
fn parked_thread_is_sampled_at_tick_rate_without_being_signalled() {
    let (hang_up, rx) = channel::<()>();
    let parked = std::thread::Builder::new()
        .name(NAME.to_owned())
        .spawn(move || park_until_hung_up(&rx))
        .unwrap();
    // Let the thread set its name before the sampler lists threads.
    std::thread::sleep(Duration::from_millis(50));

    let (samples, elapsed, stats) =
        support::sample_for(SamplerConfig::default().frequency_hz(HZ), RUN);
    drop(hang_up);
    let wakeups = parked.join().unwrap();

    let mine: Vec<&Sample> = samples
        .iter()
        .filter(|s| &**s.thread_name() == NAME)
        .collect();
    let total = mine.len();
    let repeated = mine.iter().filter(|s| s.is_repeated()).count();
    let interrupted = total - repeated;
    let expected = f64::from(HZ) * elapsed.as_secs_f64();
    eprintln!(
        "elapsed={elapsed:?} wakeups={wakeups} expected={expected:.1} samples={total} repeated={repeated} \
         interrupted={interrupted} stats={stats:?}"
    );
    assert!(
        total as f64 >= expected * 0.80,
        "the parked thread got {total} samples, expected at least 80% of {expected:.0}"
    );
    assert!(
        repeated * 2 > total,
        "only {repeated} of {total} samples of the parked thread were repeated stacks"
    );
    assert!(
        interrupted <= 5,
        "the parked thread was interrupted {interrupted} times (of {total} samples); \
         an idle thread must not be signalled"
    );
    assert_eq!(
        wakeups, 0,
        "the parked thread's blocking call returned early"
    );
    // The repeated stack is a real one: the thread was caught while parked.
    assert!(
        mine.iter().all(|s| !s.frames().is_empty()),
        "a sample of the parked thread has no frames"
    );
}
