//! `cargo xtask soak [MINUTES]`: the example service's resident memory over
//! a long run at the maximum loopback request rate, with its pprof and OTLP
//! file exports on, profiling off and then on.
//!
//! The example binary (release) sends its envelopes through the SDK's HTTP
//! transport to the loopback sink (`sentry_sink`), so the run writes no
//! envelope files, and writes its pprof and OTLP files (one per chunk,
//! rotated) into a temporary directory (`SENTRY_PROFILE_EXPORT_DIR`). Two
//! load generators run for the whole time, one on `GET /` and one on
//! `GET /work/1`, four keep-alive connections each, in batches whose
//! requests are counted. Resident memory (`VmRSS`) is read every 10 s.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::cost::{Killed, start_sink};

const EXAMPLE: &str = "target/release/examples/axum_service";
const LOAD: &str = "target/release/load";
/// The sink's port (see `cost::free_port`).
fn sink_port() -> u16 {
    crate::cost::free_port("soak sink")
}

/// The service's port (see `cost::free_port`).
fn service_port() -> u16 {
    crate::cost::free_port("soak service")
}
/// How often resident memory is read.
const EVERY: Duration = Duration::from_secs(10);
/// Requests per load batch (a batch reports how many were answered).
const BATCH: u64 = 20_000;

/// One run's readings.
struct Run {
    /// (seconds since the load started, resident KiB).
    rss: Vec<(u64, u64)>,
    requests: u64,
    secs: f64,
}

fn build() -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let ok = Command::new(&cargo)
        .args(["build", "--release", "-p", "sentry-profiling-examples"])
        .args(["--example", "axum_service"])
        .status()
        .map_err(|e| e.to_string())?
        .success()
        && Command::new(&cargo)
            .args(["build", "--release", "-p", "sentry-profiling-benches"])
            .args(["--bin", "sentry_sink", "--bin", "load"])
            .status()
            .map_err(|e| e.to_string())?
            .success();
    ok.then_some(())
        .ok_or_else(|| "building the soak's binaries failed".into())
}

fn rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Runs load batches on `path` until `stop`; returns (answered, seconds).
fn load_until(path: &'static str, stop: Arc<AtomicBool>) -> (u64, f64) {
    let (mut answered, mut secs) = (0u64, 0f64);
    while !stop.load(Ordering::Relaxed) {
        let Ok(out) = Command::new(LOAD)
            .args([
                format!("127.0.0.1:{}", service_port()),
                path.to_owned(),
                BATCH.to_string(),
                "4".to_owned(),
            ])
            .stderr(Stdio::null())
            .output()
        else {
            break;
        };
        let f: Vec<f64> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        if let [n, s, ..] = f.as_slice() {
            answered += *n as u64;
            secs += s;
        } else {
            break;
        }
    }
    (answered, secs)
}

fn run(session_rate: &str, minutes: u64, dir: &std::path::Path) -> Result<Run, String> {
    let _ = std::fs::remove_dir_all(dir);
    let child = Command::new(EXAMPLE)
        .env("ADDR", format!("127.0.0.1:{}", service_port()))
        .env(
            "SENTRY_DSN",
            format!("http://public@127.0.0.1:{}/1", sink_port()),
        )
        .env("SENTRY_PROFILE_EXPORT_DIR", dir)
        .env("SENTRY_PROFILE_SESSION_SAMPLE_RATE", session_rate)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {EXAMPLE}: {e}"))?;
    let service = Killed(child);
    let pid = service.0.id();
    let until = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", service_port())).is_err() {
        if Instant::now() > until {
            return Err("the example did not start listening".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let loads: Vec<_> = ["/", "/work/1"]
        .into_iter()
        .map(|path| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || load_until(path, stop))
        })
        .collect();
    let started = Instant::now();
    let mut next = started;
    let mut rss = Vec::new();
    let total = Duration::from_secs(minutes * 60);
    loop {
        let t = started.elapsed();
        rss.push((t.as_secs(), rss_kib(pid).unwrap_or(0)));
        eprintln!(
            "xtask soak: {session_rate} {:>4} s {:>7} KiB",
            t.as_secs(),
            rss.last().map_or(0, |r| r.1)
        );
        if t >= total {
            break;
        }
        next += EVERY;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    stop.store(true, Ordering::Relaxed);
    let (mut requests, mut secs) = (0, 0f64);
    for l in loads {
        let (n, s) = l.join().unwrap_or((0, 0.0));
        requests += n;
        secs = secs.max(s);
    }
    let _ = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status();
    drop(service);
    Ok(Run {
        rss,
        requests,
        secs,
    })
}

/// Runs the soak; returns (and prints) its Markdown report.
pub(crate) fn soak(minutes: u64) -> Result<String, String> {
    build()?;
    let _sink = start_sink(sink_port())?;
    let dir = std::env::temp_dir().join(format!("sentry-profiling-soak-{}", std::process::id()));
    let off = run("0", minutes, &dir)?;
    let on = run("1", minutes, &dir)?;
    let _ = std::fs::remove_dir_all(&dir);
    let mut report = format!(
        "Resident memory (MiB) of the example at the maximum loopback rate (`GET /` and `GET /work/1`, 4 connections each), pprof and OTLP files on, transactions to a loopback sink, {minutes} min:\n\n\
         | s | profiling off | on |\n|---|---|---|\n"
    );
    for ((t, a), (_, b)) in off.rss.iter().zip(&on.rss) {
        if *t % 60 < 10 || *t < 60 {
            report.push_str(&format!(
                "| {t} | {:.1} | {:.1} |\n",
                *a as f64 / 1024.0,
                *b as f64 / 1024.0
            ));
        }
    }
    for (name, r) in [("off", &off), ("on", &on)] {
        let at_minute = r.rss.iter().find(|(t, _)| *t >= 60).map_or(0, |x| x.1);
        let after = r.rss.iter().filter(|(t, _)| *t >= 60);
        let max_dev = after
            .map(|(_, kib)| (*kib as i64 - at_minute as i64).unsigned_abs())
            .max()
            .unwrap_or(0);
        report.push_str(&format!(
            "\n{name}: {} requests in {:.0} s ({:.0}/s); after the first minute resident memory stays within {:.1} MiB of its level at one minute ({:.1} MiB).",
            r.requests,
            r.secs,
            r.requests as f64 / r.secs.max(1e-9),
            max_dev as f64 / 1024.0,
            at_minute as f64 / 1024.0,
        ));
    }
    report.push('\n');
    print!("{report}");
    Ok(report)
}
