//! A closed-loop HTTP/1.1 load generator for the cost benchmark: a fixed
//! number of `GET`s over keep-alive connections, optionally paced to a
//! total rate, on loopback only.
//!
//! `load <addr> <path> <requests> <connections> [rate per second]` prints
//! one line: `<requests answered> <seconds> <p50 µs> <p99 µs> <failures>`.
//! A fixed count (not a fixed time) makes every round of every mode do the
//! same work, so CPU per request compares like with like.

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sentry_profiling_benches::{read_headers, read_line};

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        eprintln!("usage: load <addr> <path> <requests> <connections> [rate]");
        return std::process::ExitCode::FAILURE;
    }
    let Ok(addr) = args[1].parse::<SocketAddr>() else {
        eprintln!("load: {:?} is not an address", args[1]);
        return std::process::ExitCode::FAILURE;
    };
    if !addr.ip().is_loopback() {
        eprintln!("load: only loopback addresses are load-tested");
        return std::process::ExitCode::FAILURE;
    }
    let path = args[2].clone();
    let total: u64 = args[3].parse().unwrap_or(1000);
    let conns: u64 = args[4].parse::<u64>().unwrap_or(8).max(1);
    let rate: Option<f64> = args
        .get(5)
        .and_then(|r| r.parse().ok())
        .filter(|r| *r > 0.0);
    let next = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..conns)
        .map(|_| {
            let (next, failures, path) = (Arc::clone(&next), Arc::clone(&failures), path.clone());
            std::thread::spawn(move || {
                run_connection(addr, &path, total, rate, started, &next, &failures)
            })
        })
        .collect();
    let mut latencies: Vec<u32> = Vec::with_capacity(total as usize);
    for w in workers {
        latencies.extend(w.join().unwrap_or_default());
    }
    let secs = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let pct = |p: usize| {
        latencies
            .get((latencies.len() * p / 100).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    println!(
        "{} {secs:.4} {} {} {}",
        latencies.len(),
        pct(50),
        pct(99),
        failures.load(Ordering::Relaxed)
    );
    std::process::ExitCode::SUCCESS
}

/// Takes request numbers from `next` until `total` are taken; returns each
/// answered request's latency in microseconds.
fn run_connection(
    addr: SocketAddr,
    path: &str,
    total: u64,
    rate: Option<f64>,
    started: Instant,
    next: &AtomicU64,
    failures: &AtomicU64,
) -> Vec<u32> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: load\r\n\r\n");
    let mut latencies = Vec::new();
    let mut conn: Option<(TcpStream, BufReader<TcpStream>)> = None;
    loop {
        let n = next.fetch_add(1, Ordering::Relaxed);
        if n >= total {
            return latencies;
        }
        if let Some(rate) = rate {
            // Request n is due at n / rate seconds: an open schedule shared by
            // all connections.
            let due = started + Duration::from_secs_f64(n as f64 / rate);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        let t = Instant::now();
        if conn.is_none() {
            conn = TcpStream::connect(addr).ok().and_then(|s| {
                let _ = s.set_nodelay(true);
                let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
                let r = BufReader::new(s.try_clone().ok()?);
                Some((s, r))
            });
        }
        let ok = match &mut conn {
            Some((s, r)) => s.write_all(request.as_bytes()).is_ok() && read_response(r),
            None => false,
        };
        if ok {
            latencies.push(u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX));
        } else {
            failures.fetch_add(1, Ordering::Relaxed);
            conn = None;
        }
    }
}

/// Reads one response with a `Content-Length` body; false on any error or
/// a status other than 200.
fn read_response(r: &mut BufReader<TcpStream>) -> bool {
    let mut line = String::new();
    if !read_line(r, &mut line) {
        return false;
    }
    let ok = line.starts_with("HTTP/1.1 200");
    let Some(headers) = read_headers(r, &mut line) else {
        return false;
    };
    let len = headers.content_length;
    let mut body = vec![0; len];
    ok && r.read_exact(&mut body).is_ok()
}
