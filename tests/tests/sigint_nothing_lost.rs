//! Nothing lost at Ctrl-C: the example service under concurrent load,
//! stopped with SIGINT at a random moment, twenty times. Every request that
//! got a `200` has its transaction on disk, linked to samples of the
//! profile, and the final chunk is there (its samples reach the end of the
//! last transaction).
//!
//! The service runs as a child process of this binary, doing exactly what
//! the `axum_service` example's `main` does (the same library calls:
//! settings from the environment, `sentry_options`, `init_tracing`,
//! `serve_until_signal`, then closing the client), so it is stopped by a
//! real SIGINT through Tokio's Ctrl-C handling.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sentry_profiling_tests::{
    chunk_samples, link_problem, read_envelope_dir, split_items, transaction_window,
};
use serde_json::Value;

const CHILD_ENV: &str = "SENTRY_PROFILING_SIGINT_SERVICE";
const RUNS: usize = 20;
/// Concurrent clients per run.
const CLIENTS: usize = 6;
/// A service that has not exited this long after SIGINT has hung.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
/// The final chunk's last sample may precede the last transaction's end by
/// this much (a few sampling periods, on a loaded machine).
const FINAL_CHUNK_SLACK_SECS: f64 = 0.25;

fn main() {
    if std::env::var_os(CHILD_ENV).is_some() {
        std::process::exit(sentry_profiling_tests::serve_example_from_env());
    }
    let started = Instant::now();
    let mut served = 0;
    for run in 0..RUNS {
        served += one_run(run);
    }
    assert!(
        served >= RUNS,
        "only {served} requests were served in {RUNS} runs: the load never ran"
    );
    println!(
        "sigint_nothing_lost: {RUNS} runs, {served} requests served, all transactions and final chunks on disk ({:?})",
        started.elapsed()
    );
}

/// The example service, as `examples/axum_service.rs` runs it.
/// A request the load generator made, and whether it was served.
struct Request {
    trace_id: String,
    path: String,
    ok: bool,
}

fn one_run(run: usize) -> usize {
    let dir = std::env::temp_dir().join(format!(
        "sentry-profiling-sigint-{}-{run}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env(CHILD_ENV, "1")
        .env("ADDR", "127.0.0.1:0")
        .env("SENTRY_ENVELOPE_DIR", &dir)
        .env_remove("SENTRY_DSN")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the service");
    let addr = listening_addr(&mut child);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (requests, sigint_at) = runtime.block_on(drive(addr, &mut child));
    let status = wait_exit(&mut child, run);
    assert!(
        status.success(),
        "run {run}: the service exited with {status}"
    );

    let served: Vec<&Request> = requests.iter().filter(|r| r.ok).collect();
    check_run(run, &dir, &served, sigint_at);
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "run {run}: {} requests served ({} attempts, the rest refused or cut off by the shutdown)",
        served.len(),
        requests.len()
    );
    served.len()
}

/// Reads the service's bound address from its stdout (with a timeout).
fn listening_addr(child: &mut Child) -> SocketAddr {
    match sentry_profiling_tests::listening_addr(child, Duration::from_secs(60)) {
        Some(a) => a,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the service never reported its address");
        }
    }
}

/// Runs the clients, sends SIGINT at a random moment after the first
/// response, and keeps the load on until the service has gone.
async fn drive(addr: SocketAddr, child: &mut Child) -> (Vec<Request>, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let (first_tx, first_rx) = tokio::sync::watch::channel(false);
    let first_tx = Arc::new(first_tx);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let stop = Arc::clone(&stop);
            let first_tx = Arc::clone(&first_tx);
            tokio::spawn(async move {
                let mut done = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let path = if rand::random::<bool>() {
                        format!("/work/{}", rand::random_range(5..40u32))
                    } else {
                        format!("/sleep/{}", rand::random_range(5..60u32))
                    };
                    let trace_id = format!("{:032x}", rand::random::<u128>());
                    let ok = request(addr, &path, &trace_id).await;
                    if ok {
                        let _ = first_tx.send(true);
                    }
                    let refused = !ok;
                    done.push(Request { trace_id, path, ok });
                    if refused {
                        // Shutting down: do not spin on refused connects.
                        tokio::time::sleep(Duration::from_millis(5 + c as u64)).await;
                    }
                }
                done
            })
        })
        .collect();
    let mut first = first_rx;
    // (The borrow `wait_for` returns is dropped at once: holding it would
    // block the clients' `send`.)
    let served = matches!(
        tokio::time::timeout(Duration::from_secs(30), first.wait_for(|v| *v)).await,
        Ok(Ok(_))
    );
    assert!(served, "no request was served within 30 s");
    tokio::time::sleep(Duration::from_millis(rand::random_range(100..1200u64))).await;
    let sigint_at = now_secs();
    // SAFETY: sends SIGINT to our own child process.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
    // Load continues while the service drains; it ends once it has exited.
    let deadline = Instant::now() + EXIT_TIMEOUT;
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for c in clients {
        all.extend(c.await.unwrap());
    }
    (all, sigint_at)
}

/// One `GET` with a `sentry-trace` header; true when it got a whole `200`.
async fn request(addr: SocketAddr, path: &str, trace_id: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let span_id = format!("{:016x}", rand::random::<u64>());
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nsentry-trace: {trace_id}-{span_id}-1\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(req.as_bytes()).await?;
        let mut out = Vec::new();
        stream.read_to_end(&mut out).await?;
        std::io::Result::Ok(out)
    };
    match tokio::time::timeout(Duration::from_secs(20), exchange).await {
        Ok(Ok(out)) => {
            let text = String::from_utf8_lossy(&out);
            text.starts_with("HTTP/1.1 200") && (text.contains("worked") || text.contains("slept"))
        }
        _ => false,
    }
}

fn wait_exit(child: &mut Child, run: usize) -> std::process::ExitStatus {
    let deadline = Instant::now() + EXIT_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("run {run}: the service did not exit within {EXIT_TIMEOUT:?} of SIGINT");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn check_run(run: usize, dir: &Path, served: &[&Request], sigint_at: f64) {
    let (chunks, transactions) = split_items(&read_envelope_dir(dir));
    let by_trace: std::collections::HashMap<&str, &Value> = transactions
        .iter()
        .filter_map(|t| Some((t.pointer("/contexts/trace/trace_id")?.as_str()?, t)))
        .collect();
    let mut last_end = 0f64;
    for r in served {
        let Some(tx) = by_trace.get(r.trace_id.as_str()) else {
            panic!(
                "run {run}: {} (trace {}) got 200 but its transaction is not on disk ({} transactions in {})",
                r.path,
                r.trace_id,
                transactions.len(),
                dir.display()
            );
        };
        if let Some(problem) = link_problem(tx, &chunks) {
            panic!(
                "run {run}: {} does not link to the profile: {problem}",
                r.path
            );
        }
        if let Some((_, end)) = transaction_window(tx) {
            last_end = last_end.max(end);
        }
    }
    if served.is_empty() {
        return;
    }
    // The final chunk: samples up to the last transaction's end, which
    // only the chunk sent at shutdown holds.
    let last_sample = chunks
        .iter()
        .flat_map(chunk_samples)
        .filter_map(|s| s["timestamp"].as_f64())
        .fold(0f64, f64::max);
    assert!(
        last_sample >= last_end - FINAL_CHUNK_SLACK_SECS,
        "run {run}: the last sample ({last_sample:.3}) is well before the last transaction's end ({last_end:.3}; SIGINT at {sigint_at:.3}): the final chunk is missing"
    );
}
