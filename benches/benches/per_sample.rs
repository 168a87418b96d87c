//! Per-sample cost, side by side with pprof-rs, on the same kind of thread.
//!
//! One worker thread sits at a chosen stack depth and runs a stall meter: it
//! reads the monotonic clock in a tight loop, and every gap between two
//! reads longer than 1.5 µs (and shorter than 2 ms) is time the thread was
//! interrupted. With one busy worker on two cores, those gaps are the
//! signal deliveries: kernel entry, the handler, and (for pprof-rs, which
//! unwinds in its handler) the unwind.
//!
//! - interruption per sample: the worker's stall time / its samples;
//! - total CPU per sample: the process's CPU time, minus the worker's own
//!   uninterrupted work, divided by the samples taken: the handler plus
//!   everything the profiler does elsewhere (sampler thread, unwinding,
//!   chunk building; for pprof-rs, building its report at the end).
//!
//! Both subtract a baseline run of the same worker with no profiler (timer
//! interrupts and VM exits stall a thread too).
//!
//! `cargo bench -p sentry-profiling-benches --bench per_sample`
//! (`-- --test` for a short smoke run). Nothing here asserts on a timing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sentry_profiling::{Chunk, ChunkMeta, ModuleSet, Sampler, SamplerConfig, encode_chunk};
use sentry_profiling_benches::at_depth;

fn cpu_ns(who: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes to a local timespec.
    unsafe { libc::clock_gettime(who, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What the worker measured.
#[derive(Debug, Default)]
struct Meter {
    stall_ns: AtomicU64,
    stalls: AtomicU64,
    cpu_ns: AtomicU64,
}

fn worker(depth: usize, stop: Arc<AtomicBool>, meter: Arc<Meter>) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("worker".into())
        .spawn(move || {
            at_depth(depth, &|| {
                let cpu0 = cpu_ns(libc::CLOCK_THREAD_CPUTIME_ID);
                let mut last = Instant::now();
                let (mut stall, mut stalls) = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    let gap = now.duration_since(last).as_nanos() as u64;
                    if (1_500..2_000_000).contains(&gap) {
                        stall += gap;
                        stalls += 1;
                    }
                    last = now;
                }
                meter.stall_ns.store(stall, Ordering::Relaxed);
                meter.stalls.store(stalls, Ordering::Relaxed);
                meter.cpu_ns.store(
                    cpu_ns(libc::CLOCK_THREAD_CPUTIME_ID) - cpu0,
                    Ordering::Relaxed,
                );
            });
        })
        .expect("spawn worker")
}

/// One measurement: (samples on the worker, interruption µs/sample, total CPU µs/sample).
type Row = (u64, f64, f64);

/// Stall time per second of a worker with no profiler at all (timer
/// interrupts, VM exits), and the process CPU beyond the worker's own work
/// per second: subtracted from the profiled runs.
#[derive(Debug, Clone, Copy, Default)]
struct Baseline {
    stall_per_s: f64,
    extra_cpu_per_s: f64,
}

fn baseline(depth: usize, run: Duration) -> Baseline {
    let stop = Arc::new(AtomicBool::new(false));
    let meter = Arc::new(Meter::default());
    let cpu0 = cpu_ns(libc::CLOCK_PROCESS_CPUTIME_ID);
    let started = Instant::now();
    let w = worker(depth, Arc::clone(&stop), Arc::clone(&meter));
    std::thread::sleep(run);
    stop.store(true, Ordering::Relaxed);
    w.join().expect("worker");
    let secs = started.elapsed().as_secs_f64();
    let stall = meter.stall_ns.load(Ordering::Relaxed);
    let own = meter.cpu_ns.load(Ordering::Relaxed).saturating_sub(stall);
    let extra = (cpu_ns(libc::CLOCK_PROCESS_CPUTIME_ID) - cpu0).saturating_sub(own);
    Baseline {
        stall_per_s: stall as f64 / secs,
        extra_cpu_per_s: extra as f64 / secs,
    }
}

fn finish(samples: u64, process_cpu: u64, meter: &Meter, base: Baseline, secs: f64) -> Row {
    let stall = meter.stall_ns.load(Ordering::Relaxed);
    let own_work = meter.cpu_ns.load(Ordering::Relaxed).saturating_sub(stall);
    let per = |ns: f64| {
        if samples == 0 {
            f64::NAN
        } else {
            ns.max(0.0) / samples as f64 / 1000.0
        }
    };
    (
        samples,
        per(stall as f64 - base.stall_per_s * secs),
        per(process_cpu.saturating_sub(own_work) as f64 - base.extra_cpu_per_s * secs),
    )
}

fn ours(depth: usize, run: Duration, base: Baseline) -> Row {
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let meter = Arc::new(Meter::default());
    let cpu0 = cpu_ns(libc::CLOCK_PROCESS_CPUTIME_ID);
    let w = worker(depth, Arc::clone(&stop), Arc::clone(&meter));
    let sampler = Sampler::start(SamplerConfig::default()).expect("sampler");
    let started = Instant::now();
    let mut chunk = Chunk::new();
    let mut on_worker = 0u64;
    let meta = ChunkMeta {
        profiler_id: "0".repeat(32),
        release: "bench".into(),
        environment: None,
    };
    let mut last_encode = Instant::now();
    while started.elapsed() < run {
        if let Some(s) = sampler.recv_timeout(Duration::from_millis(20)) {
            on_worker += u64::from(&**s.thread_name() == "worker" && !s.is_repeated());
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
    }
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.stop();
    w.join().expect("worker");
    let secs = t0.elapsed().as_secs_f64();
    finish(
        on_worker,
        cpu_ns(libc::CLOCK_PROCESS_CPUTIME_ID) - cpu0,
        &meter,
        base,
        secs,
    )
}

fn pprof_rs(depth: usize, run: Duration, base: Baseline) -> Row {
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let meter = Arc::new(Meter::default());
    let cpu0 = cpu_ns(libc::CLOCK_PROCESS_CPUTIME_ID);
    let w = worker(depth, Arc::clone(&stop), Arc::clone(&meter));
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(100)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()
        .expect("pprof-rs starts");
    std::thread::sleep(run);
    stop.store(true, Ordering::Relaxed);
    w.join().expect("worker");
    let report = guard.report().build().expect("pprof-rs report");
    drop(guard);
    let on_worker: isize = report
        .data
        .iter()
        .filter(|(frames, _)| frames.thread_name == "worker")
        .map(|(_, n)| *n)
        .sum();
    let secs = t0.elapsed().as_secs_f64();
    finish(
        on_worker.max(0) as u64,
        cpu_ns(libc::CLOCK_PROCESS_CPUTIME_ID) - cpu0,
        &meter,
        base,
        secs,
    )
}

fn main() {
    let quick = std::env::args().any(|a| a == "--test");
    let run = Duration::from_millis(if quick { 300 } else { 5_000 });
    println!("| depth | profiler | samples | interruption µs/sample | total CPU µs/sample |");
    println!("|---|---|---|---|---|");
    // pprof-rs installs its SIGPROF handler for good once started, so all
    // of our runs come first.
    let mut rows = Vec::new();
    let bases: Vec<Baseline> = [10, 50, 200].iter().map(|&d| baseline(d, run)).collect();
    for (i, depth) in [10, 50, 200].into_iter().enumerate() {
        rows.push((depth, "sentry-profiling 101 Hz", ours(depth, run, bases[i])));
    }
    for (i, depth) in [10, 50, 200].into_iter().enumerate() {
        rows.push((depth, "pprof-rs 100 Hz", pprof_rs(depth, run, bases[i])));
    }
    for (depth, b) in [10, 50, 200].iter().zip(&bases) {
        eprintln!(
            "baseline at depth {depth}: {:.0} µs/s stalled, {:.0} µs/s other CPU",
            b.stall_per_s / 1e3,
            b.extra_cpu_per_s / 1e3
        );
    }
    rows.sort_by_key(|r| r.0);
    for (depth, name, (n, stall, total)) in rows {
        println!("| {depth} | {name} | {n} | {stall:.2} | {total:.2} |");
    }
}
