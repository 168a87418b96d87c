//! No crash at shutdown: the example service started, loaded and stopped
//! with SIGINT while requests are in flight, many times over, at 101 and
//! 1000 Hz. Each stop ends Tokio's runtime with its workers, blocking-pool
//! threads and the example's database thread exiting while the sampler
//! still samples them, then closes the client (the last chunk, the
//! transport). Any cycle that ends in a signal (or a non-zero exit, or a
//! hang) fails the test, with the child's stderr.
//!
//! `SHUTDOWN_CYCLES` sets the number of cycles (default 80, about half a
//! minute); `SHUTDOWN_CYCLES_VALGRIND=memcheck` (or `dhat`) runs each
//! child under valgrind (slow: use a few cycles), keeping every report of
//! a failed cycle in the directory the test prints.

use std::io::Read;
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "SENTRY_PROFILING_SHUTDOWN_CYCLE_SERVICE";
/// A service that has not exited this long after SIGINT has hung.
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);
/// Concurrent clients during a cycle.
const CLIENTS: usize = 6;

fn main() {
    if std::env::var_os(CHILD_ENV).is_some() {
        std::process::exit(sentry_profiling_tests::serve_example_from_env());
    }
    let cycles: usize = std::env::var("SHUTDOWN_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(80);
    let valgrind = std::env::var("SHUTDOWN_CYCLES_VALGRIND").ok();
    let keep = std::env::temp_dir().join(format!("shutdown-cycles-{}", std::process::id()));
    std::fs::create_dir_all(&keep).expect("a directory for reports");
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut served = 0;
    for cycle in 0..cycles {
        let hz = if cycle % 2 == 0 { 101 } else { 1000 };
        match one_cycle(cycle, hz, valgrind.as_deref(), &keep) {
            Ok(n) => served += n,
            Err(e) => {
                eprintln!("cycle {cycle} ({hz} Hz): {e}");
                failures.push(cycle);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {cycles} cycles failed: {failures:?} (reports in {})",
        failures.len(),
        keep.display()
    );
    assert!(
        served >= cycles,
        "only {served} requests served in {cycles} cycles"
    );
    let _ = std::fs::remove_dir_all(&keep);
    println!(
        "shutdown_cycles: {cycles} cycles at 101 and 1000 Hz, {served} requests served, no signal death ({:?})",
        started.elapsed()
    );
}

/// One start → load → SIGINT cycle; the requests served, or what went
/// wrong.
fn one_cycle(
    cycle: usize,
    hz: u32,
    valgrind: Option<&str>,
    keep: &std::path::Path,
) -> Result<usize, String> {
    let dir = keep.join(format!("envelopes-{cycle}"));
    let mut cmd = match valgrind {
        Some(tool) => {
            let mut c = Command::new("valgrind");
            c.arg(format!("--tool={tool}"));
            if tool == "dhat" {
                c.arg(format!(
                    "--dhat-out-file={}",
                    keep.join(format!("dhat-{cycle}.json")).display()
                ));
            } else {
                c.arg("--error-exitcode=99");
            }
            if tool == "memcheck" {
                // The one report that is Memcheck's and not the
                // process's: see the file.
                c.arg(format!(
                    "--suppressions={}/valgrind/nested-signal-frame.supp",
                    env!("CARGO_MANIFEST_DIR")
                ));
            }
            c.arg(format!(
                "--log-file={}",
                keep.join(format!("valgrind-{cycle}.log")).display()
            ));
            c.arg(std::env::current_exe().map_err(|e| e.to_string())?);
            c
        }
        None => Command::new(std::env::current_exe().map_err(|e| e.to_string())?),
    };
    let mut child = cmd
        .env(CHILD_ENV, "1")
        .env("ADDR", "127.0.0.1:0")
        .env("SENTRY_ENVELOPE_DIR", &dir)
        .env("SENTRY_PROFILE_FREQUENCY_HZ", hz.to_string())
        .env_remove("SENTRY_DSN")
        .env_remove("SENTRY_PROFILE_EXPORT_DIR")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    let stderr = collect(child.stderr.take());
    let addr = match sentry_profiling_tests::listening_addr(&mut child, Duration::from_secs(120)) {
        Some(a) => a,
        None => {
            let _ = child.kill();
            let status = child.wait();
            return Err(format!(
                "never listened ({status:?})\n{}",
                stderr.join().unwrap_or_default()
            ));
        }
    };
    let served = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (served, stop) = (Arc::clone(&served), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let path = match (c + i) % 4 {
                        0 => "/work/15",
                        1 => "/sleep/40",
                        2 => "/db/5",
                        _ => "/render/5",
                    };
                    if get(addr, path) {
                        served.fetch_add(1, Ordering::Relaxed);
                    } else {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    i += 1;
                }
            })
        })
        .collect();
    // Stop it once it has served a little, with requests in flight.
    let deadline = Instant::now() + Duration::from_secs(if valgrind.is_some() { 120 } else { 20 });
    while served.load(Ordering::Relaxed) < 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(rand::random_range(0..150u64)));
    // SAFETY: sends SIGINT to our own child process.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let status = wait_exit(
        &mut child,
        EXIT_TIMEOUT * if valgrind.is_some() { 10 } else { 1 },
    );
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let _ = c.join();
    }
    let stderr = stderr.join().unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    let served = served.load(Ordering::Relaxed);
    match status {
        Some(s) if s.success() => Ok(served),
        Some(s) => {
            let what = match s.signal() {
                Some(sig) => format!(
                    "killed by signal {sig}{}",
                    if s.core_dumped() {
                        " (core dumped)"
                    } else {
                        ""
                    }
                ),
                None => format!("exited with {s}"),
            };
            let log = keep.join(format!("stderr-{cycle}.txt"));
            let _ = std::fs::write(&log, &stderr);
            Err(format!(
                "{what} after serving {served}; stderr kept in {}\n{stderr}",
                log.display()
            ))
        }
        None => {
            let _ = child.kill();
            let _ = child.wait();
            Err(format!(
                "did not exit within its timeout after SIGINT\n{stderr}"
            ))
        }
    }
}

/// Reads a pipe to its end on a thread of its own.
fn collect(pipe: Option<std::process::ChildStderr>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_string(&mut text);
        }
        text
    })
}

/// One `GET`; true when it got a whole `200`.
fn get(addr: SocketAddr, path: &str) -> bool {
    use std::io::Write;
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    out.starts_with(b"HTTP/1.1 200")
}

fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
