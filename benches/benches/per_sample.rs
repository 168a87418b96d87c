//! Per-sample cost, side by side with pprof-rs, on the same kind of thread:
//! one worker spinning at a chosen stack depth (10, 50, 200), sampled at
//! about 100 Hz by each profiler in turn.
//!
//! - handler µs/sample: time inside the signal handler on the interrupted
//!   thread, from its first instruction to its return, read from
//!   `CLOCK_MONOTONIC`. Ours times itself (`SamplerStats::handler_ns`);
//!   pprof-rs's handler is wrapped, after pprof-rs installs it, by a
//!   handler that reads the same clock around a call to it. Kernel entry
//!   and `sigreturn` are not included for either (they are the same for
//!   both: one signal per sample).
//! - total CPU µs/sample: every CPU nanosecond the profiler spends per
//!   sample, wherever it runs. Ours (with its default per-thread CPU-time
//!   timers, and with `cpu_timers(false)`, where the sampler thread signals
//!   the worker): handler + the sampler thread's CPU in its ticks
//!   (harvesting, unwinding, signalling, the idle checks) + the consumer's
//!   CPU building and encoding chunks, read from thread CPU clocks. pprof-rs:
//!   handler (which unwinds and symbol-free aggregates in place) + the CPU of
//!   building its report at the end.
//!
//! `cargo bench -p sentry-profiling-benches --bench per_sample`
//! (`-- --test` for a short smoke run). Build with
//! `--features pprof-framehop` to compare with pprof-rs's framehop unwinder.
//! Nothing here asserts on a timing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sentry_profiling::hooks::workspace::{Chunk, ChunkMeta, encode_chunk};
use sentry_profiling::{ModuleSet, Sampler, SamplerConfig, SamplerStats};
use sentry_profiling_benches::{at_depth, spin};

/// Left out of every measurement: start-up costs.
const WARM_UP: Duration = Duration::from_secs(1);

fn clock(which: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes to a local timespec.
    unsafe { libc::clock_gettime(which, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn worker(depth: usize, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("worker".into())
        .spawn(move || {
            at_depth(depth, &|| spin(&stop));
        })
        .expect("spawn worker")
}

/// One measurement.
#[derive(Debug, Clone, Copy)]
struct Row {
    samples: u64,
    handler_us: f64,
    total_us: f64,
}

fn per(ns: u64, n: u64) -> f64 {
    if n == 0 {
        f64::NAN
    } else {
        ns as f64 / n as f64 / 1000.0
    }
}

fn ours(depth: usize, run: Duration, cpu_timers: bool) -> Row {
    let stop = Arc::new(AtomicBool::new(false));
    let w = worker(depth, Arc::clone(&stop));
    let sampler = Sampler::start(SamplerConfig::default().cpu_timers(cpu_timers)).expect("sampler");
    let meta = ChunkMeta {
        profiler_id: "0".repeat(32),
        release: "bench".into(),
        environment: None,
    };
    let started = Instant::now();
    let mut chunk = Chunk::new();
    let mut consumer_ns = 0u64;
    let mut last_encode = Instant::now();
    // Start-up (reading the module list, copying unwind tables, first
    // unwinds with cold caches) is left out: counted from the first second.
    let mut base = None;
    while started.elapsed() < run + WARM_UP {
        if base.is_none() && started.elapsed() >= WARM_UP {
            base = Some(sampler.stats());
            consumer_ns = 0;
        }
        // The profiler thread's rhythm: wake every 100 ms, drain the queue.
        std::thread::sleep(Duration::from_millis(100));
        let t0 = clock(libc::CLOCK_THREAD_CPUTIME_ID);
        for s in sampler.try_iter() {
            chunk.push(&s);
        }
        // Chunk building as the profiler thread does it, once a second.
        if last_encode.elapsed() > Duration::from_secs(1) {
            let modules: Arc<ModuleSet> = sampler.modules();
            let _ = encode_chunk(&meta, &chunk.take(), &modules, None, &|_, s| {
                Some((u64::from(s.thread_id), None))
            });
            last_encode = Instant::now();
        }
        consumer_ns += clock(libc::CLOCK_THREAD_CPUTIME_ID) - t0;
    }
    stop.store(true, Ordering::Relaxed);
    let end = sampler.stop();
    w.join().expect("worker");
    let base: SamplerStats = base.unwrap_or_default();
    let mut stats = end;
    stats.ticks -= base.ticks;
    stats.samples_captured -= base.samples_captured;
    stats.handler_ns -= base.handler_ns;
    stats.unwind_ns -= base.unwind_ns;
    stats.tick_cpu_ns -= base.tick_cpu_ns;
    eprintln!(
        "depth {depth}, cpu_timers {cpu_timers}: {} ticks, sampler CPU {:.1} µs/tick (unwinding {:.1} µs/sample), consumer {:.1} µs/sample",
        stats.ticks,
        per(stats.tick_cpu_ns, stats.ticks),
        per(stats.unwind_ns, stats.samples_captured),
        per(consumer_ns, stats.samples_captured),
    );
    Row {
        samples: stats.samples_captured,
        handler_us: per(stats.handler_ns, stats.samples_captured),
        total_us: per(
            stats.handler_ns + stats.tick_cpu_ns + consumer_ns,
            stats.samples_captured,
        ),
    }
}

/// pprof-rs's SIGPROF handler, and what the timing wrapper measured.
static PPROF_HANDLER: AtomicUsize = AtomicUsize::new(0);
static PPROF_NS: AtomicU64 = AtomicU64::new(0);
static PPROF_CALLS: AtomicU64 = AtomicU64::new(0);

extern "C" fn timed_pprof_handler(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
) {
    let inner = PPROF_HANDLER.load(Ordering::Acquire);
    if inner == 0 {
        return;
    }
    let t0 = clock(libc::CLOCK_MONOTONIC);
    // SAFETY: `inner` is the `sa_sigaction` pprof-rs installed with
    // SA_SIGINFO, so it has this signature; it is called with the arguments
    // the kernel gave this handler.
    unsafe {
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            std::mem::transmute(inner);
        f(sig, info, ctx);
    }
    PPROF_NS.fetch_add(clock(libc::CLOCK_MONOTONIC) - t0, Ordering::Relaxed);
    PPROF_CALLS.fetch_add(1, Ordering::Relaxed);
}

/// Puts the timing wrapper in front of whatever pprof-rs installed for
/// SIGPROF (again after every start: pprof-rs installs its handler each
/// time).
fn wrap_pprof_handler() {
    // SAFETY: a zeroed sigaction is a valid out-parameter.
    let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: reads the current SIGPROF action into a local.
    unsafe { libc::sigaction(libc::SIGPROF, std::ptr::null(), &mut current) };
    if current.sa_sigaction == timed_pprof_handler as *const () as usize {
        return;
    }
    PPROF_HANDLER.store(current.sa_sigaction, Ordering::Release);
    let mut wrapped = current;
    wrapped.sa_sigaction = timed_pprof_handler as *const () as usize;
    wrapped.sa_flags = current.sa_flags | libc::SA_SIGINFO;
    // SAFETY: installs a valid SA_SIGINFO handler for SIGPROF, keeping
    // pprof-rs's mask and flags.
    unsafe { libc::sigaction(libc::SIGPROF, &wrapped, std::ptr::null_mut()) };
}

fn pprof_rs(depth: usize, run: Duration) -> Row {
    let stop = Arc::new(AtomicBool::new(false));
    let w = worker(depth, Arc::clone(&stop));
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(100)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()
        .expect("pprof-rs starts");
    wrap_pprof_handler();
    // As for ours: counted from the first second.
    std::thread::sleep(WARM_UP);
    let (ns0, calls0) = (
        PPROF_NS.load(Ordering::Relaxed),
        PPROF_CALLS.load(Ordering::Relaxed),
    );
    std::thread::sleep(run);
    stop.store(true, Ordering::Relaxed);
    w.join().expect("worker");
    let handler_ns = PPROF_NS.load(Ordering::Relaxed) - ns0;
    let calls = PPROF_CALLS.load(Ordering::Relaxed) - calls0;
    let t0 = clock(libc::CLOCK_THREAD_CPUTIME_ID);
    let report = guard.report().build().expect("pprof-rs report");
    let report_ns = clock(libc::CLOCK_THREAD_CPUTIME_ID) - t0;
    drop(guard);
    let on_worker: isize = report
        .data
        .iter()
        .filter(|(frames, _)| frames.thread_name == "worker")
        .map(|(_, n)| *n)
        .sum();
    if on_worker <= 0 {
        eprintln!("pprof-rs reported no samples on the worker");
    }
    Row {
        samples: calls,
        handler_us: per(handler_ns, calls),
        total_us: per(handler_ns + report_ns, calls),
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--test");
    let run = Duration::from_millis(if quick { 300 } else { 10_000 });
    let unwinder = if cfg!(feature = "pprof-framehop") {
        "framehop"
    } else {
        "backtrace-rs"
    };
    // pprof-rs installs its SIGPROF handler for good once started, so all
    // of our runs come first.
    let depths = [10, 50, 200];
    let mine: Vec<Row> = depths.iter().map(|&d| ours(d, run, true)).collect();
    let signalled: Vec<Row> = depths.iter().map(|&d| ours(d, run, false)).collect();
    let theirs: Vec<Row> = depths.iter().map(|&d| pprof_rs(d, run)).collect();
    println!(
        "| depth | profiler | samples | handler µs/sample | total CPU µs/sample | pprof-rs ÷ ours (total) |"
    );
    println!("|---|---|---|---|---|---|");
    for (((depth, m), t), q) in depths.iter().zip(&mine).zip(&theirs).zip(&signalled) {
        println!(
            "| {depth} | sentry-profiling 101 Hz | {} | {:.2} | {:.2} | |",
            m.samples, m.handler_us, m.total_us
        );
        println!(
            "| {depth} | sentry-profiling 101 Hz, `cpu_timers(false)` | {} | {:.2} | {:.2} | |",
            q.samples, q.handler_us, q.total_us
        );
        println!(
            "| {depth} | pprof-rs 100 Hz ({unwinder}) | {} | {:.2} | {:.2} | {:.1}× |",
            t.samples,
            t.handler_us,
            t.total_us,
            t.total_us / m.total_us
        );
    }
}
