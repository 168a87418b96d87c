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

/// Keeps each `profile_chunk` payload's size, and the bytes of the largest.
#[derive(Debug, Default)]
struct ChunkSizes {
    sizes: Mutex<Vec<usize>>,
    largest: Mutex<Vec<u8>>,
}

impl Transport for ChunkSizes {
    fn send_envelope(&self, envelope: Envelope) {
        let mut bytes = Vec::new();
        if envelope.to_writer(&mut bytes).is_err() {
            return;
        }
        let parsed = sentry_profiling_examples::parse_envelope(&bytes);
        for item in parsed.items {
            if item.header.get("type").and_then(|t| t.as_str()) == Some("profile_chunk") {
                self.sizes.lock().unwrap().push(item.payload.len());
                let mut largest = self.largest.lock().unwrap();
                if item.payload.len() > largest.len() {
                    *largest = item.payload;
                }
            }
        }
    }
}

/// `VmHWM` and `VmRSS` of this process, in KiB.
fn memory_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmHWM:"), field("VmRSS:"))
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

fn gzip_len(bytes: &[u8]) -> usize {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let _ = enc.write_all(bytes);
    enc.finish().map(|v| v.len()).unwrap_or(0)
}

fn main() {
    let quick = std::env::args().any(|a| a == "--test");
    let chunk = Duration::from_secs(if quick { 2 } else { 60 });

    let stop = Arc::new(AtomicBool::new(false));
    let handles = workers(&stop);
    std::thread::sleep(Duration::from_millis(500));
    let (hwm_before, rss_before) = memory_kib();

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
    // One full chunk, and the moment it is sent.
    while started.elapsed() < chunk + Duration::from_millis(500) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let (hwm_after, rss_after) = memory_kib();
    let stats = sentry_profiling::stats().unwrap_or_default();
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.join();
    }
    drop(guard);

    let sizes_sent = sizes.sizes.lock().unwrap().clone();
    let largest = sizes.largest.lock().unwrap().clone();
    let largest_samples = serde_json::from_slice::<serde_json::Value>(&largest)
        .ok()
        .and_then(|v| v["profile"]["samples"].as_array().map(Vec::len))
        .unwrap_or(0);
    let per = |bytes: usize| {
        if largest_samples == 0 {
            f64::NAN
        } else {
            bytes as f64 / largest_samples as f64
        }
    };
    println!(
        "one {} s chunk, {THREADS} busy threads, 101 Hz",
        chunk.as_secs()
    );
    println!("| figure | value |");
    println!("|---|---|");
    println!(
        "| peak RSS added (VmHWM) | {:.2} MiB |",
        hwm_after.saturating_sub(hwm_before) as f64 / 1024.0
    );
    println!(
        "| RSS added at the end | {:.2} MiB |",
        rss_after.saturating_sub(rss_before) as f64 / 1024.0
    );
    println!(
        "| chunks sent / samples sent | {} / {} |",
        stats.chunks_sent, stats.samples_sent
    );
    println!(
        "| largest chunk: samples, JSON bytes, gzip bytes | {largest_samples}, {}, {} |",
        largest.len(),
        gzip_len(&largest)
    );
    println!(
        "| chunk JSON per sample: as sent / gzip | {:.1} B / {:.1} B |",
        per(largest.len()),
        per(gzip_len(&largest))
    );
    eprintln!("chunk payload sizes: {sizes_sent:?}");
}
