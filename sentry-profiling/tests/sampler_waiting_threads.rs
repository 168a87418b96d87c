//! Threads that wait are unwound through real frames only.
//!
//! Each thread waits in one primitive (std's `park`, `Condvar`, `mpsc` and
//! `sleep`, `parking_lot`'s `Condvar`, a `flume` and a `crossbeam` receive,
//! `epoll_wait`), each time after a deep chain of other calls that leaves
//! stale frame records on its stack where the waiting frames' locals now
//! are. A waiting thread is not signalled: its stack is read from the
//! kernel's stack pointer and program counter, without a frame pointer,
//! which is where a stale record could be taken for a real one. Every
//! sample of a waiting thread must reach the thread's root, hold the real
//! chain (`wait_inner` < `wait_outer` < `waiting_thread`) and none of the
//! decoy functions, and every (callee, caller) pair must pass a check
//! against the machine code. Run once on an idle process and once beside
//! two CPU hogs (the machine busy).

#[path = "support/callchain.rs"]
mod callchain;
#[path = "support/names.rs"]
mod names;
mod support;

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use callchain::{CallChainCheck, Verdict};
use sentry_profiling::{Sample, SamplerConfig, Symbolizer};

/// One wait: how long, at most.
const WAIT: Duration = Duration::from_millis(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Park,
    StdCondvar,
    StdChannel,
    Sleep,
    ParkingLotCondvar,
    Flume,
    Crossbeam,
    Epoll,
}

const KINDS: [Kind; 8] = [
    Kind::Park,
    Kind::StdCondvar,
    Kind::StdChannel,
    Kind::Sleep,
    Kind::ParkingLotCondvar,
    Kind::Flume,
    Kind::Crossbeam,
    Kind::Epoll,
];

/// A chain of calls through std (which keeps frame pointers, so it
/// pushes frame records) and frames with locals, returning before the
/// wait: the records stay on the stack below where the waiting chain's
/// frames will be.
#[inline(never)]
fn decoy_deep(depth: u32, acc: &mut u64, waits: &Waits) {
    let mut locals = [0u64; 24];
    locals[depth as usize % 24] = *acc;
    black_box(&mut locals);
    if depth == 0 {
        decoy_leaf(acc, waits);
    } else {
        decoy_deep(depth - 1, acc, waits);
    }
    *acc = acc.wrapping_add(locals.iter().sum::<u64>());
}

#[inline(never)]
fn decoy_leaf(acc: &mut u64, waits: &Waits) {
    // The same std paths the waits take, returning at once, from another
    // chain: their frame records are what a guess could take.
    std::thread::park_timeout(Duration::ZERO);
    waits.std_pair.1.notify_one();
    waits.pl_pair.1.notify_one();
    let now = Instant::now();
    let name = std::thread::current().name().map(str::len).unwrap_or(0);
    let text = format!("{acc}-{name}-{:?}", now.elapsed());
    let lock = Mutex::new(text.len());
    *acc = acc.wrapping_add(*lock.lock().unwrap() as u64);
    black_box(std::time::SystemTime::now());
}

/// What a thread waits on.
struct Waits {
    stop: AtomicBool,
    std_pair: (Mutex<bool>, Condvar),
    pl_pair: (parking_lot::Mutex<bool>, parking_lot::Condvar),
}

#[inline(never)]
fn wait_inner(kind: Kind, waits: &Waits, chans: &Chans) -> u64 {
    match kind {
        Kind::Park => std::thread::park_timeout(WAIT),
        Kind::StdCondvar => {
            let guard = waits.std_pair.0.lock().unwrap();
            drop(waits.std_pair.1.wait_timeout(guard, WAIT).unwrap());
        }
        Kind::StdChannel => drop(chans.std.recv_timeout(WAIT)),
        Kind::Sleep => std::thread::sleep(WAIT),
        Kind::ParkingLotCondvar => {
            let mut guard = waits.pl_pair.0.lock();
            black_box(waits.pl_pair.1.wait_for(&mut guard, WAIT));
        }
        Kind::Flume => drop(chans.flume.recv_timeout(WAIT)),
        Kind::Crossbeam => drop(chans.crossbeam.recv_timeout(WAIT)),
        Kind::Epoll => {
            let mut events = [libc::epoll_event { events: 0, u64: 0 }; 4];
            // SAFETY: `chans.epoll` is an epoll descriptor this test owns;
            // `events` is writable for 4 entries.
            let n = unsafe {
                libc::epoll_wait(chans.epoll, events.as_mut_ptr(), 4, WAIT.as_millis() as i32)
            };
            black_box(n);
        }
    }
    black_box(kind as u64)
}

#[inline(never)]
fn wait_outer(kind: Kind, waits: &Waits, chans: &Chans) -> u64 {
    black_box(wait_inner(kind, waits, chans)).wrapping_add(1)
}

struct Chans {
    std: std::sync::mpsc::Receiver<()>,
    flume: flume::Receiver<()>,
    crossbeam: crossbeam_channel::Receiver<()>,
    epoll: i32,
}

#[inline(never)]
fn waiting_thread(kind: Kind, waits: &Waits, chans: &Chans) -> u64 {
    let mut acc = 0u64;
    let mut round = 0u32;
    while !waits.stop.load(Ordering::Relaxed) {
        // Shallow chains leave records where the waiting frames will be,
        // deep ones below them.
        decoy_deep(round % 12, &mut acc, waits);
        acc = acc.wrapping_add(wait_outer(kind, waits, chans));
        round += 1;
    }
    acc
}

#[inline(never)]
fn hog(stop: &AtomicBool) -> u64 {
    let mut x = 1u64;
    while !stop.load(Ordering::Relaxed) {
        for i in 0..10_000u64 {
            x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    x
}

const DECOYS: [&str; 2] = ["decoy_deep", "decoy_leaf"];

/// Runs the waiting threads (and `hogs` CPU hogs) under the sampler and
/// checks every sample of a waiting thread.
fn check_waiting_threads(hogs: usize) {
    let waits = Arc::new(Waits {
        stop: AtomicBool::new(false),
        std_pair: (Mutex::new(false), Condvar::new()),
        pl_pair: (parking_lot::Mutex::new(false), parking_lot::Condvar::new()),
    });
    let mut senders = Vec::new();
    let threads: Vec<_> = KINDS
        .iter()
        .map(|&kind| {
            let (std_tx, std_rx) = std::sync::mpsc::channel::<()>();
            let (flume_tx, flume_rx) = flume::unbounded::<()>();
            let (cb_tx, cb_rx) = crossbeam_channel::unbounded::<()>();
            senders.push((std_tx, flume_tx, cb_tx));
            // SAFETY: plain system call; the descriptor is closed by the
            // thread when it ends.
            let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            assert!(epoll >= 0);
            let waits = Arc::clone(&waits);
            std::thread::Builder::new()
                .name(format!("wait-{kind:?}"))
                .spawn(move || {
                    let chans = Chans {
                        std: std_rx,
                        flume: flume_rx,
                        crossbeam: cb_rx,
                        epoll,
                    };
                    let r = waiting_thread(kind, &waits, &chans);
                    // SAFETY: the descriptor was created above for this thread.
                    unsafe { libc::close(epoll) };
                    r
                })
                .unwrap()
        })
        .collect();
    let hog_stop = Arc::new(AtomicBool::new(false));
    let hog_threads: Vec<_> = (0..hogs)
        .map(|i| {
            let stop = Arc::clone(&hog_stop);
            std::thread::Builder::new()
                .name(format!("hog-{i}"))
                .spawn(move || hog(&stop))
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));

    let (samples, _, stats, modules) = support::sample_with_modules(
        SamplerConfig::default().frequency_hz(101),
        Duration::from_secs(3),
    );
    waits.stop.store(true, Ordering::Relaxed);
    hog_stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.thread().unpark();
        t.join().unwrap();
    }
    for t in hog_threads {
        t.join().unwrap();
    }
    drop(senders);

    let mut sym = Symbolizer::new();
    let mut check = CallChainCheck::default();
    let mut waiting = 0usize;
    let mut not_known = 0usize;
    let mut unrooted = Vec::new();
    let mut false_frames = Vec::new();
    let mut ruled_out = Vec::new();
    let mut per_kind = std::collections::BTreeMap::<String, usize>::new();
    let mine = |s: &&Sample| s.thread_name().starts_with("wait-");
    for s in samples.iter().filter(mine) {
        let names = names::function_names(&mut sym, &modules, s);
        let pos = |needle: &str| names.iter().position(|n| n.ends_with(needle));
        // A thread caught running its decoys (a signal, every register
        // known) is not what this test is about.
        if names.iter().any(|n| DECOYS.iter().any(|d| n.ends_with(d))) {
            continue;
        }
        // A period it waited for a CPU, or ran with no capture next to it,
        // shows one synthetic frame: no function is claimed.
        if names.len() == 1 && names[0].starts_with('(') {
            not_known += 1;
            continue;
        }
        // Anywhere else, the thread is in `waiting_thread`, and waiting
        // (or close to it) in `wait_inner` below `wait_outer`.
        let (inner, outer, body) = (pos("wait_inner"), pos("wait_outer"), pos("waiting_thread"));
        let chain_ok = body.is_some()
            && inner.is_none_or(|i| outer.is_some_and(|o| i < o))
            && outer.is_none_or(|o| body.is_some_and(|b| o < b));
        if !chain_ok {
            false_frames.push(names.clone());
        }
        if inner.is_none() {
            if std::env::var_os("WAIT_DEBUG").is_some() {
                eprintln!("not waiting: {} {names:?}", s.thread_name());
            }
            continue;
        }
        waiting += 1;
        *per_kind.entry(s.thread_name().to_string()).or_default() += 1;
        let start = pos("Thread>::new::thread_start");
        let outermost_in_libc = s
            .frames()
            .last()
            .and_then(|&a| modules.find(a))
            .is_some_and(|m| m.path.contains("libc"));
        if !(start.is_some_and(|i| i + 3 >= names.len()) && outermost_in_libc) {
            unrooted.push(names.clone());
        }
        for pair in s.frames().windows(2) {
            if pair[0] != pair[1]
                && check.pair(callchain::in_modules(&modules), pair[0], pair[1])
                    == Verdict::RuledOut
            {
                let (a, b) = (
                    sym.function(&modules, pair[0]),
                    sym.function(&modules, pair[1]),
                );
                ruled_out.push(format!("{a:?} <- {b:?} ({:#x} <- {:#x})", pair[0], pair[1]));
            }
        }
    }
    eprintln!(
        "hogs={hogs} waiting samples={waiting} not known={not_known} per thread={per_kind:?} unrooted={} false={} \
         ruled-out pairs={} stats={stats:?}",
        unrooted.len(),
        false_frames.len(),
        ruled_out.len()
    );
    for names in unrooted.iter().chain(&false_frames).take(6) {
        eprintln!("  {names:?}");
    }
    for pair in ruled_out.iter().take(6) {
        eprintln!("  ruled out: {pair}");
    }
    assert_eq!(
        per_kind.len(),
        KINDS.len(),
        "every kind of waiting thread was caught waiting: {per_kind:?}"
    );
    assert!(
        waiting >= 8 * 100,
        "expected most of the 8 threads' ~300 samples each to be waits, got {waiting}"
    );
    assert!(
        false_frames.is_empty(),
        "{} samples of the waiting threads lack the real chain (a frame skipped or not on the stack)",
        false_frames.len()
    );
    assert!(
        ruled_out.is_empty(),
        "{} (callee, caller) pairs that the machine code rules out",
        ruled_out.len()
    );
    assert!(
        unrooted.is_empty(),
        "{} of {waiting} waiting samples do not reach the thread's root",
        unrooted.len()
    );
}

#[test]
fn waiting_threads_are_unwound_to_their_root_through_real_frames() {
    check_waiting_threads(0);
    check_waiting_threads(2);
}
