//! Requests per second, profiler memory and chunk bytes at 100, 1,000 and
//! the most requests per second this machine sustains, profiling on vs off.
//!
//! The service is the example's router (`sentry_profiling_examples::router`)
//! with the README's set-up (trace lifecycle, the tracing layer, default
//! 60 s chunks), in a child process of its own per point, so that its
//! resident memory is the service's alone. "Off" is the same service with
//! the profiling session not sampled. Its envelopes go to one file through
//! a transport that only appends them (a writer thread), and are read after
//! the child shut down: chunk bytes, and whether each transaction links to
//! samples as Sentry links them (profiler id, `thread.id`, `[start, end]`).
//!
//! The load comes from this process: keep-alive HTTP/1.1 connections mixing
//! `/work/1`, `/` and `/sleep/5`, paced to the rate (open loop; a late
//! connection catches up without waiting) or, for "max", one request after
//! another on 32 connections.
//!
//! `cargo bench -p sentry-profiling-benches --bench request_rate`
//! (`REQUEST_RATE_BENCH_SECS`, default 20, sets each point's duration,
//! lengthened at low rates, up to 70 s, until a chunk is written during the
//! load: 60 s, or 4,096 finished requests; `REQUEST_RATE_BENCH_RATES`, default
//! `100,1000,max`, the rates); `-- --test` is the smoke run (2 s at
//! 100 req/s, on and off).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sentry::protocol::Envelope;
use sentry::{ClientOptions, Transport};
use sentry_profiling::{ProfileLifecycle, ProfilingIntegration};
use sentry_profiling_tests::{SampleIndex, parse_envelope, split_items};

const CHILD_ENV: &str = "REQUEST_RATE_BENCH_CHILD";
const OUT_ENV: &str = "REQUEST_RATE_BENCH_OUT";
const PATHS: [&str; 3] = ["/work/1", "/", "/sleep/5"];

// ---------------------------------------------------------------------------
// The service (child process)
// ---------------------------------------------------------------------------

/// Appends each envelope, length-prefixed, to one file from a thread of its
/// own: the request path pays only for the hand-over.
struct AppendTransport {
    tx: Mutex<Option<std::sync::mpsc::Sender<Vec<u8>>>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl AppendTransport {
    fn new(path: &Path) -> Arc<Self> {
        let file = std::fs::File::create(path).expect("bench output file");
        let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
        let writer = std::thread::spawn(move || {
            let mut out = std::io::BufWriter::new(file);
            for bytes in rx {
                let _ = out.write_all(&(bytes.len() as u64).to_le_bytes());
                let _ = out.write_all(&bytes);
            }
            let _ = out.flush();
        });
        Arc::new(Self {
            tx: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
        })
    }
}

impl Transport for AppendTransport {
    fn send_envelope(&self, envelope: Envelope) {
        let mut bytes = Vec::new();
        if envelope.to_writer(&mut bytes).is_ok() {
            if let Some(tx) = &*self.tx.lock().unwrap() {
                let _ = tx.send(bytes);
            }
        }
    }

    fn shutdown(&self, _timeout: Duration) -> bool {
        drop(self.tx.lock().unwrap().take());
        if let Some(w) = self.writer.lock().unwrap().take() {
            let _ = w.join();
        }
        true
    }
}

fn child(profiling: bool, out: PathBuf) {
    let transport = AppendTransport::new(&out);
    let mut options = ClientOptions::new().traces_sample_rate(1.0);
    options.dsn = sentry_profiling_examples::LOCAL_DSN.parse().ok();
    options.release = Some("request-rate-bench@1".into());
    options.shutdown_timeout = Duration::from_secs(30);
    options.transport = Some(Arc::new(move |_: &ClientOptions| {
        Arc::clone(&transport) as Arc<dyn Transport>
    }));
    let options = ProfilingIntegration::new()
        .profile_session_sample_rate(if profiling { 1.0 } else { 0.0 })
        .profile_lifecycle(ProfileLifecycle::Trace)
        .apply(options);
    let guard = sentry::init(options);
    sentry_profiling_examples::init_tracing();
    let served =
        sentry_profiling_examples::serve_until_signal("127.0.0.1:0".parse().unwrap(), |addr| {
            println!("{addr}");
        });
    let stats = sentry_profiling::stats();
    drop(guard);
    if let Err(e) = served {
        eprintln!("request_rate child: {e}");
        std::process::exit(1);
    }
    if let Some(s) = stats {
        println!(
            "stats lanes_tracked_max={} lane_registrations_refused={} lane_fill_ins={} chunks_cut_early={} sampler_dropped_queue_full={}",
            s.lanes_tracked_max,
            s.lane_registrations_refused,
            s.lane_fill_ins,
            s.chunks_cut_early,
            s.sampler.dropped_queue_full
        );
    }
}

// ---------------------------------------------------------------------------
// The load (this process)
// ---------------------------------------------------------------------------

/// One keep-alive connection: requests until `stop`, paced to one every
/// `interval` (none: back to back). Returns (2xx, other) responses.
fn connection(
    addr: SocketAddr,
    seed: usize,
    interval: Option<Duration>,
    stop: &AtomicBool,
) -> (u64, u64) {
    let stream = TcpStream::connect(addr).expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let mut write = stream.try_clone().expect("clone stream");
    let mut read = BufReader::new(stream);
    let (mut ok, mut other) = (0, 0);
    let mut line = String::new();
    let mut body = Vec::new();
    let start = Instant::now();
    let mut i = 0u32;
    while !stop.load(Ordering::Relaxed) {
        if let Some(every) = interval {
            let due = start + every * i;
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
        let path = PATHS[(seed + i as usize) % PATHS.len()];
        i += 1;
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        write.write_all(req.as_bytes()).expect("write");
        line.clear();
        read.read_line(&mut line).expect("status line");
        let status_ok = line.starts_with("HTTP/1.1 2");
        let mut length = 0usize;
        loop {
            line.clear();
            read.read_line(&mut line).expect("header");
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
        body.resize(length, 0);
        read.read_exact(&mut body).expect("body");
        if status_ok {
            ok += 1;
        } else {
            other += 1;
        }
    }
    (ok, other)
}

fn rss_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A request rate: requests per second, or as many as the machine gives.
#[derive(Debug, Clone, Copy)]
enum Rate {
    PerSec(u32),
    Max,
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rate::PerSec(n) => write!(f, "{n}/s"),
            Rate::Max => f.write_str("max"),
        }
    }
}

/// One measured point.
#[derive(Debug, Default)]
struct Point {
    ok: u64,
    other: u64,
    secs: f64,
    /// Resident memory once the service was listening (before any load).
    rss_idle_kib: u64,
    /// The most resident memory seen during the load.
    rss_peak_kib: u64,
    /// Resident memory at the end of the load.
    rss_end_kib: u64,
    chunks: usize,
    chunk_bytes: usize,
    largest_chunk: usize,
    transactions: usize,
    unlinked: usize,
    child_stats: String,
}

fn spawn_child(profiling: bool, out: &Path) -> (Child, SocketAddr) {
    let exe = std::env::current_exe().expect("bench executable");
    let mut child = Command::new(exe)
        .env(CHILD_ENV, if profiling { "on" } else { "off" })
        .env(OUT_ENV, out)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the service");
    let mut stdout = BufReader::new(child.stdout.take().expect("child stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("service address");
    let addr = line.trim().parse().expect("service address");
    child.stdout = Some(stdout.into_inner());
    (child, addr)
}

fn measure(profiling: bool, rate: Rate, secs: f64, dir: &Path) -> Point {
    let out = dir.join(
        format!(
            "envelopes-{}-{rate}.bin",
            if profiling { "on" } else { "off" }
        )
        .replace('/', "per"),
    );
    let (mut child, addr) = spawn_child(profiling, &out);
    let pid = child.id();
    // Let the profiler thread create its sampler and read the modules.
    std::thread::sleep(Duration::from_millis(1500));
    let mut point = Point {
        rss_idle_kib: rss_kib(pid, "VmRSS:"),
        ..Point::default()
    };
    let (connections, interval) = match rate {
        Rate::PerSec(n) => {
            let c = (n / 50).clamp(2, 32);
            (
                c,
                Some(Duration::from_secs_f64(f64::from(c) / f64::from(n))),
            )
        }
        Rate::Max => (32, None),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let other = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let load: Vec<_> = (0..connections as usize)
        .map(|i| {
            let (stop, ok, other) = (Arc::clone(&stop), Arc::clone(&ok), Arc::clone(&other));
            std::thread::spawn(move || {
                let (o, x) = connection(addr, i, interval, &stop);
                ok.fetch_add(o, Ordering::Relaxed);
                other.fetch_add(x, Ordering::Relaxed);
            })
        })
        .collect();
    let deadline = started + Duration::from_secs_f64(secs);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        point.rss_peak_kib = point.rss_peak_kib.max(rss_kib(pid, "VmRSS:"));
    }
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.join().expect("load thread");
    }
    point.secs = started.elapsed().as_secs_f64();
    point.rss_end_kib = rss_kib(pid, "VmRSS:");
    point.ok = ok.load(Ordering::Relaxed);
    point.other = other.load(Ordering::Relaxed);
    // SAFETY: `pid` is our own child, still running (not yet waited for).
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGTERM);
    }
    let mut rest = String::new();
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_string(&mut rest);
    }
    let status = child.wait().expect("wait for the service");
    assert!(status.success(), "the service failed: {status}");
    point.child_stats = rest.trim().to_owned();
    read_envelopes(&out, &mut point);
    let _ = std::fs::remove_file(&out);
    point
}

fn read_envelopes(path: &Path, point: &mut Point) {
    let bytes = std::fs::read(path).unwrap_or_default();
    let mut index = SampleIndex::default();
    let mut transactions = Vec::new();
    let mut at = 0;
    while at + 8 <= bytes.len() {
        let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
        at += 8;
        let Some(envelope) = bytes.get(at..at + len) else {
            break;
        };
        at += len;
        let (chunks, txs) = split_items(&[parse_envelope(envelope)]);
        for c in &chunks {
            point.chunks += 1;
            point.chunk_bytes += c.payload_len;
            point.largest_chunk = point.largest_chunk.max(c.payload_len);
            index.add_chunk(c);
        }
        transactions.extend(txs);
    }
    point.transactions = transactions.len();
    // Only the transactions Sentry links (19.8 ms or longer) must link:
    // Relay unlinks the shorter ones, which get no lane.
    point.unlinked = transactions
        .iter()
        .filter(|tx| {
            sentry_profiling_tests::linked_by_sentry(tx) && index.link_problem(tx).is_some()
        })
        .count();
}

fn main() {
    if let Ok(mode) = std::env::var(CHILD_ENV) {
        let out = PathBuf::from(std::env::var_os(OUT_ENV).expect("output path"));
        child(mode == "on", out);
        return;
    }
    let smoke = std::env::args().any(|a| a == "--test");
    let secs: f64 = if smoke {
        2.0
    } else {
        std::env::var("REQUEST_RATE_BENCH_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20.0)
    };
    let rates: Vec<Rate> = if smoke {
        vec![Rate::PerSec(100)]
    } else {
        std::env::var("REQUEST_RATE_BENCH_RATES")
            .unwrap_or_else(|_| "100,1000,max".into())
            .split(',')
            .map(|r| match r.trim() {
                "max" => Rate::Max,
                n => Rate::PerSec(n.parse().expect("REQUEST_RATE_BENCH_RATES: numbers or max")),
            })
            .collect()
    };
    let dir = std::env::temp_dir().join(format!("request-rate-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench directory");
    println!(
        "| rate | profiling | req/s | 2xx | other | RSS idle MiB | RSS peak MiB | RSS end MiB | chunks | chunk bytes/s | chunk bytes/request | largest chunk | transactions | unlinked |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mib = |k: u64| k as f64 / 1024.0;
    let mut failures = Vec::new();
    for &rate in &rates {
        // A full run lasts long enough at every rate for chunks to be
        // written during the load (60 s, or 4,096 finished requests), so
        // the memory measured is the steady state's.
        let secs = match rate {
            Rate::PerSec(n) if !smoke => secs.max(4_096.0 / f64::from(n) + 10.0).min(70.0),
            _ => secs,
        };
        for profiling in [false, true] {
            let p = measure(profiling, rate, secs, &dir);
            println!(
                "| {rate} | {} | {:.0} | {} | {} | {:.1} | {:.1} | {:.1} | {} | {:.0} | {:.0} | {} | {} | {} |",
                if profiling { "on" } else { "off" },
                p.ok as f64 / p.secs,
                p.ok,
                p.other,
                mib(p.rss_idle_kib),
                mib(p.rss_peak_kib),
                mib(p.rss_end_kib),
                p.chunks,
                p.chunk_bytes as f64 / p.secs,
                p.chunk_bytes as f64 / p.ok.max(1) as f64,
                p.largest_chunk,
                p.transactions,
                if profiling {
                    p.unlinked.to_string()
                } else {
                    "-".into()
                },
            );
            if !p.child_stats.is_empty() {
                eprintln!(
                    "  {rate} {}: {}",
                    if profiling { "on" } else { "off" },
                    p.child_stats
                );
            }
            if p.ok == 0 || p.other > 0 {
                failures.push(format!("{rate}: {} ok, {} other", p.ok, p.other));
            }
            if profiling && (p.unlinked > 0 || p.chunks == 0) {
                failures.push(format!(
                    "{rate}: {} unlinked of {}, {} chunks",
                    p.unlinked, p.transactions, p.chunks
                ));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "request_rate bench: {failures:#?}");
}
