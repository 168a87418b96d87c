//! Memory bounded for the life of the process: the example service (its
//! pprof and OTLP files on, transactions and chunks through the SDK's HTTP
//! transport to a loopback Sentry) under load as fast as this machine
//! serves it for a minute. Its resident memory, read every 2 s, levels off:
//! between 20 s and the end it grows by less than 8 MiB, and its trend
//! (least squares) is under 150 bytes per request. When the exports kept a
//! whole session in memory it grew by about 1,100 bytes per request.
//!
//! `cargo xtask soak` is the ten-minute version, with the curve in
//! BENCHMARKS.md.
//!
//! The service runs as a child process of this binary (its memory is what
//! is measured), doing what the `axum_service` example's `main` does.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sentry_profiling_examples::{OTLP_FILE, PPROF_FILE};
use sentry_profiling_tests::fake_sentry::FakeSentry;

const CHILD_ENV: &str = "SENTRY_PROFILING_MEMORY_SERVICE";
/// How long the load runs (`SOAK_SECS` overrides it).
const DEFAULT_SECS: u64 = 60;
/// Readings before this are the warm-up (first chunks, caches, the
/// allocator's arenas).
const WARM_UP: Duration = Duration::from_secs(20);
const EVERY: Duration = Duration::from_secs(2);
/// Load connections, keep-alive, half on `GET /`, half on `GET /work/1`.
const CONNECTIONS: usize = 4;
const MAX_GROWTH_KIB: u64 = 8 * 1024;
const MAX_BYTES_PER_REQUEST: f64 = 150.0;

fn main() {
    if std::env::var_os(CHILD_ENV).is_some() {
        std::process::exit(sentry_profiling_tests::serve_example_from_env());
    }
    let secs = std::env::var("SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SECS);
    soak(Duration::from_secs(secs));
    println!("memory_bounded: ok");
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// Requests `path` over one keep-alive connection until `stop`, counting
/// the `200`s.
fn load(addr: SocketAddr, path: &'static str, stop: &AtomicBool, answered: &AtomicU64) {
    let Ok(stream) = TcpStream::connect(addr) else {
        return;
    };
    let _ = stream.set_nodelay(true);
    let mut writer = stream.try_clone().expect("clone the stream");
    let mut reader = BufReader::new(stream);
    let request = format!("GET {path} HTTP/1.1\r\nHost: service\r\n\r\n");
    let mut line = String::new();
    let mut body = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        if writer.write_all(request.as_bytes()).is_err() {
            return;
        }
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let ok = line.starts_with("HTTP/1.1 200");
        let mut len = 0usize;
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
        }
        body.resize(len, 0);
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        if ok {
            answered.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Least-squares slope of `points` (x, y).
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 { 0.0 } else { sxy / sxx }
}

fn soak(length: Duration) {
    let sentry = FakeSentry::start();
    sentry.discard_requests();
    let dir = std::env::temp_dir().join(format!(
        "sentry-profiling-memory-bounded-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let mut child = Command::new(std::env::current_exe().expect("current exe"))
        .env(CHILD_ENV, "1")
        .env("ADDR", "127.0.0.1:0")
        .env("SENTRY_DSN", sentry.dsn())
        .env("SENTRY_PROFILE_EXPORT_DIR", &dir)
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("SENTRY_PROFILE_SESSION_SAMPLE_RATE")
        .env_remove("SENTRY_TRACES_SAMPLE_RATE")
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the service");
    let pid = child.id();
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("the service's address");
    let addr: SocketAddr = line
        .trim()
        .strip_prefix("listening ")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));

    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let loads: Vec<_> = (0..CONNECTIONS)
        .map(|i| {
            let (stop, answered) = (Arc::clone(&stop), Arc::clone(&answered));
            let path = if i % 2 == 0 { "/" } else { "/work/1" };
            std::thread::spawn(move || load(addr, path, &stop, &answered))
        })
        .collect();
    let started = Instant::now();
    let mut readings = Vec::new();
    let mut next = started;
    while started.elapsed() <= length {
        let t = started.elapsed();
        readings.push((
            t.as_secs_f64(),
            rss_kib(pid),
            answered.load(Ordering::Relaxed),
        ));
        next += EVERY;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    stop.store(true, Ordering::Relaxed);
    for l in loads {
        let _ = l.join();
    }
    let _ = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status();
    let status = child.wait().expect("the service exits");

    let steady: Vec<_> = readings
        .iter()
        .filter(|r| r.0 >= WARM_UP.as_secs_f64())
        .collect();
    let curve: Vec<String> = readings
        .iter()
        .map(|r| format!("{:.0}s {} KiB {} req", r.0, r.1, r.2))
        .collect();
    eprintln!("memory_bounded: {}", curve.join(", "));
    let (first, last) = (steady[0], steady[steady.len() - 1]);
    let requests = last.2.saturating_sub(first.2);
    let secs = last.0 - first.0;
    let kib_per_sec = slope(&steady.iter().map(|r| (r.0, r.1 as f64)).collect::<Vec<_>>());
    let per_request = kib_per_sec * 1024.0 * secs / requests.max(1) as f64;
    eprintln!(
        "memory_bounded: {requests} requests in {secs:.0} s after the warm-up, trend {kib_per_sec:.1} KiB/s = {per_request:.1} bytes per request"
    );
    assert!(status.success(), "the service failed: {status}");
    assert!(
        requests > 1_000,
        "the service served too little to tell: {requests}"
    );
    let growth = last.1.saturating_sub(first.1);
    assert!(
        growth < MAX_GROWTH_KIB,
        "resident memory grew {growth} KiB after the warm-up: {curve:?}"
    );
    assert!(
        per_request < MAX_BYTES_PER_REQUEST,
        "resident memory grows {per_request:.0} bytes per request: {curve:?}"
    );
    // The exports were on, and wrote the rotated files as it ran.
    for file in [PPROF_FILE, OTLP_FILE] {
        let path = dir.join(file);
        assert!(path.exists(), "{} written", path.display());
        let mut first_rotated = path.into_os_string();
        first_rotated.push(".1");
        assert!(
            std::path::Path::new(&first_rotated).exists(),
            "several chunks written"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
