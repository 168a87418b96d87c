//! Production request rates: the example's router under the heaviest
//! loopback load this machine gives (closed loop, 32 keep-alive connections
//! mixing `/work/1`, `/`, `/sleep/5` and `/sleep/25`) for 30 s, with the
//! default 60 s chunk and the trace lifecycle, then a clean shutdown. Every
//! request's transaction must be there and carry its profile context and
//! `thread.id`; every one Sentry links (19.8 ms or longer) must be linked as
//! Sentry links it (profiler id, `thread.id`, samples within its
//! `[start, end]`), while the shorter ones, which Relay unlinks, get no lane
//! in the chunks; every chunk must be small enough and acceptable to Relay,
//! and the profiler's lane table and queues bounded.
//!
//! `REQUEST_RATE_SECS` changes the load's duration (at least 30 s in CI).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sentry_core::Transport;
use sentry_core::protocol::Envelope;
use sentry_profiling::{ProfileLifecycle, ProfilingIntegration};
use sentry_profiling_tests::{SampleIndex, parse_envelope, relay_violations, split_items};
use serde_json::Value;

const CONNECTIONS: usize = 32;
const MAX_CHUNK_JSON: usize = 10 * 1024 * 1024;

/// What the run sent to Sentry, reduced as it arrives (a run produces
/// hundreds of thousands of transactions and many chunks; keeping their JSON
/// would measure the test, not the profiler).
#[derive(Default)]
struct Seen {
    index: SampleIndex,
    /// Each transaction's name, window, profile context and `thread.id`.
    transactions: Vec<Value>,
    chunks: usize,
    largest_chunk: usize,
    chunk_bytes: usize,
    relay_violations: Vec<String>,
}

impl Seen {
    fn add(&mut self, bytes: &[u8]) {
        let (chunks, transactions) = split_items(&[parse_envelope(bytes)]);
        for c in &chunks {
            self.chunks += 1;
            self.largest_chunk = self.largest_chunk.max(c.payload_len);
            self.chunk_bytes += c.payload_len;
            self.relay_violations.extend(relay_violations(c));
            self.index.add_chunk(c);
        }
        for tx in transactions {
            let keep = serde_json::json!({
                "transaction": tx["transaction"],
                "start_timestamp": tx["start_timestamp"],
                "timestamp": tx["timestamp"],
                "contexts": {
                    "profile": tx.pointer("/contexts/profile").cloned().unwrap_or_default(),
                    "trace": {"data": {"thread.id":
                        tx.pointer("/contexts/trace/data/thread.id").cloned().unwrap_or_default()}},
                },
            });
            self.transactions.push(keep);
        }
    }
}

/// Hands envelopes to a thread of their own, as a real transport does, so
/// the request path only pays for the hand-over.
struct Capture {
    tx: Mutex<Option<std::sync::mpsc::Sender<Envelope>>>,
}

impl Transport for Capture {
    fn send_envelope(&self, envelope: Envelope) {
        if let Some(tx) = &*self.tx.lock().unwrap() {
            let _ = tx.send(envelope);
        }
    }
}

/// One keep-alive connection sending requests one after another until
/// `stop`; returns (2xx responses, other responses).
async fn client(addr: std::net::SocketAddr, seed: usize, stop: Arc<AtomicBool>) -> (u64, u64) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let paths = ["/work/1", "/", "/sleep/5", "/sleep/25"];
    let (mut ok, mut other) = (0, 0);
    let mut i = seed;
    let mut line = String::new();
    while !stop.load(Ordering::Relaxed) {
        let path = paths[i % paths.len()];
        i += 1;
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        write.write_all(req.as_bytes()).await.expect("write");
        line.clear();
        read.read_line(&mut line).await.expect("status line");
        let status_ok = line.starts_with("HTTP/1.1 2");
        let mut length = 0usize;
        loop {
            line.clear();
            read.read_line(&mut line).await.expect("header");
            let h = line.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().expect("content-length");
                }
            }
        }
        let mut body = vec![0; length];
        read.read_exact(&mut body).await.expect("body");
        if status_ok {
            ok += 1;
        } else {
            other += 1;
        }
    }
    (ok, other)
}

#[test]
fn every_request_keeps_its_profile_at_the_highest_rate() {
    let secs: u64 = std::env::var("REQUEST_RATE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let (env_tx, env_rx) = std::sync::mpsc::channel::<Envelope>();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let reducer = {
        let seen = Arc::clone(&seen);
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            for envelope in env_rx {
                bytes.clear();
                envelope.to_writer(&mut bytes).unwrap();
                seen.lock().unwrap().add(&bytes);
            }
        })
    };
    let capture = Arc::new(Capture {
        tx: Mutex::new(Some(env_tx)),
    });
    let closer = Arc::clone(&capture);
    let mut options = sentry::ClientOptions::new().traces_sample_rate(1.0);
    options.dsn = "https://public@sentry.invalid/1".parse().ok();
    options.release = Some("request-rate@1".into());
    // The last chunk is written at shutdown; a debug build beside CPU hogs
    // can take longer than the default 2 s for it.
    options.shutdown_timeout = Duration::from_secs(30);
    options.transport = Some(Arc::new(move |_: &sentry::ClientOptions| {
        Arc::clone(&capture) as Arc<dyn Transport>
    }));
    // The default chunk duration (60 s): longer than the run, as in
    // production.
    let options = ProfilingIntegration::new()
        .profile_session_sample_rate(1.0)
        .profile_lifecycle(ProfileLifecycle::Trace)
        .apply(options);

    let started = Instant::now();
    let (ok, other) = sentry_profiling_tests::run_service_with(
        options,
        sentry_profiling_examples::router(),
        |addr, shutdown| async move {
            let stop = Arc::new(AtomicBool::new(false));
            let in_flight = Arc::new(AtomicU64::new(0));
            // The load runs on a runtime of its own, so it does not queue
            // behind the server's tasks.
            let load = {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("load runtime");
                    rt.block_on(async move {
                        let tasks: Vec<_> = (0..CONNECTIONS)
                            .map(|i| tokio::spawn(client(addr, i, Arc::clone(&stop))))
                            .collect();
                        let (mut ok, mut other) = (0, 0);
                        for t in tasks {
                            let (o, x) = t.await.expect("client task");
                            ok += o;
                            other += x;
                        }
                        (ok, other)
                    })
                })
            };
            let mut max_tracked = 0;
            let deadline = Instant::now() + Duration::from_secs(secs);
            while Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(500)).await;
                if let Some(s) = sentry_profiling::stats() {
                    max_tracked = max_tracked.max(s.lanes_tracked);
                    in_flight.fetch_max(s.lanes_in_flight, Ordering::Relaxed);
                }
            }
            stop.store(true, Ordering::Relaxed);
            let result = tokio::task::spawn_blocking(move || load.join().expect("load thread"))
                .await
                .expect("join");
            eprintln!(
                "lanes tracked at most {max_tracked} (sampled), in flight at most {}",
                in_flight.load(Ordering::Relaxed)
            );
            shutdown.begin();
            result
        },
    );
    let elapsed = started.elapsed().as_secs_f64();
    // The client is closed: every envelope was handed over.
    closer.tx.lock().unwrap().take();
    reducer.join().expect("reducer");
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let stats = sentry_profiling::stats().expect("stats after shutdown");
    eprintln!(
        "{ok} requests ({other} not 2xx) in {secs} s: {:.0} req/s; {} chunks, largest {} bytes, {:.0} chunk bytes per request",
        ok as f64 / secs as f64,
        seen.chunks,
        seen.largest_chunk,
        seen.chunk_bytes as f64 / ok.max(1) as f64,
    );
    eprintln!("profiler stats: {stats:#?} (run {elapsed:.1} s)");

    assert!(
        ok as f64 / secs as f64 > 100.0,
        "the load reached production rates"
    );
    assert_eq!(other, 0, "every request succeeded");
    assert_eq!(
        seen.transactions.len() as u64,
        ok,
        "every 2xx request has its transaction"
    );
    let mut problems: HashMap<String, usize> = HashMap::new();
    let mut unlinked = 0;
    let (mut linked, mut short) = (Vec::new(), 0);
    for tx in &seen.transactions {
        if !sentry_profiling_tests::linked_by_sentry(tx) {
            // Relay unlinks it: it still says which profiler and thread it
            // ran on, but no lane stands for it in the chunks.
            short += 1;
            let tagged = tx.pointer("/contexts/profile/profiler_id").is_some()
                && tx.pointer("/contexts/trace/data/thread.id").is_some();
            if !tagged {
                *problems.entry("short, not tagged".into()).or_default() += 1;
                unlinked += 1;
            }
            continue;
        }
        linked.push(tx);
        if let Some(p) = seen.index.link_problem(tx) {
            unlinked += 1;
            // Group by the problem's kind (the part before the ids).
            let kind: String = p.split_whitespace().take(6).collect::<Vec<_>>().join(" ");
            *problems.entry(kind).or_default() += 1;
        }
    }
    // What Sentry shows: samples of the transaction's thread in its window.
    let shown = linked
        .iter()
        .filter(|tx| {
            let (Some(p), Some(t), Some((start, end))) = (
                tx.pointer("/contexts/profile/profiler_id")
                    .and_then(Value::as_str),
                tx.pointer("/contexts/trace/data/thread.id")
                    .and_then(Value::as_str),
                sentry_profiling_tests::transaction_window(tx),
            ) else {
                return false;
            };
            seen.index.samples_in(p, t, start, end) >= 1
        })
        .count();
    eprintln!(
        "{shown} of {} transactions Sentry links show samples ({short} shorter than 19.8 ms); unlinked: {unlinked} {problems:?}",
        linked.len()
    );
    assert_eq!(unlinked, 0, "every transaction links: {problems:?}");
    assert!(
        linked.len() as u64 >= ok / 20,
        "the `/sleep/25` requests are among those linked"
    );
    assert!(
        shown as f64 >= 0.99 * linked.len() as f64,
        "at least 99% of the transactions Sentry links show samples"
    );
    assert!(
        stats.lanes_unlinked > 0,
        "the short requests' lanes were left out"
    );
    assert!(
        seen.relay_violations.is_empty(),
        "Relay would reject chunks: {:?}",
        &seen.relay_violations[..seen.relay_violations.len().min(5)]
    );
    assert!(
        seen.largest_chunk <= MAX_CHUNK_JSON,
        "a chunk of {} bytes",
        seen.largest_chunk
    );
    // Bounded: lanes reserve their places in the queue, and the lane table
    // holds at most the requests in flight plus one chunk's finished ones
    // (and those finishing before the profiler thread's next read).
    assert_eq!(stats.lane_events_dropped, 0);
    assert_eq!(
        stats.lane_registrations_refused, 0,
        "32 connections never fill the table"
    );
    assert_eq!(stats.lanes_in_flight, 0, "every lane's end was read");
    assert_eq!(stats.lanes_registered, ok, "every request had a lane");
    assert!(
        stats.lanes_tracked_max <= 8_192 + 2 * 4_096,
        "lane table bounded: {}",
        stats.lanes_tracked_max
    );
    assert_eq!(
        stats.lane_fill_ins_capped, 0,
        "no chunk reached the fill cap"
    );
    // Fill-ins: at most two per period a request lasted (one per suspended
    // tick, plus its end samples).
    let period = 1.0 / 101.0;
    let allowed: f64 = seen
        .transactions
        .iter()
        .filter_map(sentry_profiling_tests::transaction_window)
        .map(|(start, end)| 2.0 * ((end - start) / period).ceil() + 2.0)
        .sum();
    eprintln!(
        "{} fill-ins for {ok} requests ({allowed:.0} allowed)",
        stats.lane_fill_ins
    );
    assert!(stats.lane_fill_ins as f64 <= allowed);
    assert_eq!(
        stats.sampler.dropped_queue_full, 0,
        "the sampler's queue kept up"
    );
}
