//! Memory and payload growth over one full chunk with the whole profiler on:
//! `sentry::init` with the integration, the manual lifecycle started, and
//! 16 busy threads whose stacks keep changing (each cycles through depths
//! 5 to 60 and two leaf functions, so stacks and frames are not all one).
//!
//! - peak RSS added: the process's `VmHWM` at the end minus its `VmHWM`
//!   with the workers already running and no profiler;
//! - chunk JSON size per sample, as sent and gzip-compressed.
//!
//! `cargo bench -p sentry-profiling-benches --bench growth` runs one 60 s
//! chunk; `-- --test` runs a 2 s chunk (a smoke run). Nothing here asserts
//! on a figure.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sentry::{Envelope, Transport};
use sentry_profiling::{ProfilingIntegration, start_profiler};
use sentry_profiling_benches::at_depth;

const THREADS: usize = 16;

/// Counts bytes written, keeping none of them.
#[derive(Debug, Default)]
struct Counter(usize);

impl Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Measures each envelope, as sent and gzip-compressed (as the crate's own
/// HTTP sender compresses it), without keeping a copy: what a real
/// transport holds is not the profiler's memory.
#[derive(Debug, Default)]
struct ChunkSizes {
    /// (bytes, gzip bytes) per envelope.
    sizes: Mutex<Vec<(usize, usize)>>,
}

impl Transport for ChunkSizes {
    fn send_envelope(&self, envelope: Envelope) {
        let mut plain = Counter::default();
        let _ = envelope.to_writer(&mut plain);
        let mut gz = flate2::write::GzEncoder::new(Counter::default(), flate2::Compression::fast());
        let _ = envelope.to_writer(&mut gz);
        let zipped = gz.finish().map(|c| c.0).unwrap_or(0);
        self.sizes.lock().unwrap().push((plain.0, zipped));
    }
}

/// This process's memory, from `/proc/self/status`, in KiB.
#[derive(Debug, Clone, Copy)]
struct Memory {
    /// Peak resident set.
    hwm: u64,
    /// Resident anonymous memory (heap, stacks, arenas).
    anon: u64,
    /// Resident file-backed pages (the executable's and libraries' sections
    /// read for unwinding and symbols; shared with the page cache).
    file: u64,
}

fn memory() -> Memory {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    Memory {
        hwm: field("VmHWM:"),
        anon: field("RssAnon:"),
        file: field("RssFile:"),
    }
}

fn mib(after: u64, before: u64) -> f64 {
    after.saturating_sub(before) as f64 / 1024.0
}

#[inline(never)]
fn leaf_a(stop: &AtomicBool) {
    sentry_profiling_benches::spin_for(stop, Duration::from_micros(700));
}

#[inline(never)]
fn leaf_b(stop: &AtomicBool) {
    sentry_profiling_benches::spin_for(stop, Duration::from_micros(300));
}

fn workers(stop: &Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<()>> {
    (0..THREADS)
        .map(|i| {
            let stop = Arc::clone(stop);
            std::thread::Builder::new()
                .name(format!("growth-{i}"))
                .spawn(move || {
                    let mut depth = 5 + i;
                    while !stop.load(Ordering::Relaxed) {
                        at_depth(depth, &|| {
                            if depth % 2 == 0 {
                                leaf_a(&stop)
                            } else {
                                leaf_b(&stop)
                            }
                        });
                        depth = if depth >= 60 { 5 } else { depth + 1 };
                    }
                })
                .expect("spawn")
        })
        .collect()
}

fn main() {
    let quick = std::env::args().any(|a| a == "--test");
    let chunk = Duration::from_secs(if quick { 2 } else { 60 });

    let stop = Arc::new(AtomicBool::new(false));
    let handles = workers(&stop);
    std::thread::sleep(Duration::from_millis(500));
    let before = memory();

    let sizes = Arc::new(ChunkSizes::default());
    let mut options = sentry::ClientOptions::new();
    options.dsn = "https://public@sentry.invalid/1".parse().ok();
    let factory: Arc<dyn sentry::TransportFactory> = Arc::new(Arc::clone(&sizes));
    options.transport = Some(factory);
    let guard = sentry::init(
        ProfilingIntegration::new()
            .profile_session_sample_rate(1.0)
            .chunk_duration(chunk)
            .apply(options),
    );
    let started = Instant::now();
    start_profiler();
    std::thread::sleep(Duration::from_secs(1));
    let settled = memory();
    // One full chunk, and the moment it is sent.
    while started.elapsed() < chunk + Duration::from_millis(500) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let after = memory();
    let stats = sentry_profiling::stats().unwrap_or_default();
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.join();
    }
    drop(guard);

    let sizes = sizes.sizes.lock().unwrap().clone();
    let (bytes, zipped) = sizes
        .iter()
        .fold((0, 0), |(b, z), (b1, z1)| (b + b1, z + z1));
    let per = |total: usize| {
        if stats.samples_sent == 0 {
            f64::NAN
        } else {
            total as f64 / stats.samples_sent as f64
        }
    };
    println!(
        "one {} s chunk, {THREADS} busy threads, 101 Hz",
        chunk.as_secs()
    );
    println!("| figure | value |");
    println!("|---|---|");
    println!(
        "| peak RSS added (VmHWM, end − before init) | {:.2} MiB |",
        mib(after.hwm, before.hwm)
    );
    println!(
        "| anonymous RSS added: 1 s after start / at the end | {:.2} / {:.2} MiB |",
        mib(settled.anon, before.anon),
        mib(after.anon, before.anon)
    );
    println!(
        "| file-backed RSS added (sections read for unwinding and symbols) | {:.2} MiB |",
        mib(after.file, before.file)
    );
    println!(
        "| envelopes / chunks / samples sent | {} / {} / {} |",
        sizes.len(),
        stats.chunks_sent,
        stats.samples_sent
    );
    println!(
        "| chunk envelopes per sample: as JSON / gzip | {:.1} B / {:.1} B |",
        per(bytes),
        per(zipped)
    );
}
