//! Helpers shared by the end-to-end tests: an in-memory capturing transport,
//! and Relay's acceptance rules for `profile_chunk` items, re-stated from
//! Relay's `relay-profiling` (sample v2 parsing and normalisation, debug
//! image types) so a test fails where ingestion would reject a chunk (in
//! `relay.rs`, which the stress run shares).

pub mod attribution;
pub mod browser;
pub mod clients;
pub mod fake_sentry;
pub mod phantom;
mod relay;
pub mod sentry_functions;
pub mod short_polls;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use sentry_core::Transport;
use sentry_core::protocol::Envelope;
pub use sentry_profiling_examples::{EnvelopeItem, ParsedEnvelope, parse_envelope};
use serde_json::Value;

pub use relay::{
    ChunkItem, SENTRY_CUSTOM_MEASUREMENT_LIMIT, event_violations, measurement_violations,
    relay_violations,
};

/// The README's Rust snippets, compiled as this crate's doctests: this
/// crate depends on everything the README's dependency list names (sentry
/// with its `tracing` feature, both crates of this project,
/// tracing-subscriber, axum, tokio), so the README cannot drift from the
/// code.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// The documents the README links to in `docs/`, compiled the same way, so
/// a Rust snippet moved there (or added) cannot drift from the code either.
#[cfg(doctest)]
#[doc = include_str!("../../docs/how-it-works.md")]
#[doc = include_str!("../../docs/why-a-request-waited.md")]
#[doc = include_str!("../../docs/sentry-pipeline.md")]
#[doc = include_str!("../../docs/misuse.md")]
#[doc = include_str!("../../docs/limits.md")]
#[doc = include_str!("../../docs/development.md")]
pub struct DocsDoctests;

/// Sends `GET path` over a fresh HTTP/1.1 connection and returns the whole
/// response (status line, headers, body).
pub async fn http_get(addr: std::net::SocketAddr, path: impl AsRef<str>) -> String {
    http_get_with(addr, path, &[]).await
}

/// [`http_get`] with extra request headers.
pub async fn http_get_with(
    addr: std::net::SocketAddr,
    path: impl AsRef<str>,
    headers: &[(&str, &str)],
) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let req = format!(
        "GET {} HTTP/1.1\r\nHost: localhost\r\n{extra}Connection: close\r\n\r\n",
        path.as_ref()
    );
    stream
        .write_all(req.as_bytes())
        .await
        .expect("write request");
    let mut out = String::new();
    stream
        .read_to_string(&mut out)
        .await
        .expect("read response");
    out
}

/// The trace id of a request's `sentry-trace` header (empty without one):
/// the tests name each request by the trace id they send it with.
pub fn trace_id_of(headers: &http::HeaderMap) -> String {
    headers
        .get("sentry-trace")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split('-').next())
        .unwrap_or_default()
        .to_owned()
}

/// Example-service settings for a test: loopback on any port, no DSN (so
/// envelopes go to a fresh temporary directory named after `tag` and this
/// process), traces and profiling sessions always sampled.
pub fn local_settings(tag: &str) -> sentry_profiling_examples::Settings {
    let dir = std::env::temp_dir().join(format!("sentry-profiling-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    sentry_profiling_examples::Settings {
        addr: "127.0.0.1:0".parse().expect("loopback address"),
        dsn: None,
        envelope_dir: dir,
        traces_sample_rate: 1.0,
        profile_session_sample_rate: 1.0,
        profile_frequency_hz: sentry_profiling::DEFAULT_FREQUENCY_HZ,
        otlp_endpoint: None,
        profile_export_dir: None,
    }
}

/// Every envelope file in `dir`, in write order, parsed.
pub fn read_envelope_dir(dir: &std::path::Path) -> Vec<ParsedEnvelope> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files
        .iter()
        .filter_map(|f| std::fs::read(f).ok())
        .map(|b| parse_envelope(&b))
        .collect()
}

/// Starts the example server's graceful shutdown (see
/// [`run_example_service`]).
#[derive(Debug, Clone, Default)]
pub struct Shutdown(Arc<Mutex<Option<tokio::sync::oneshot::Sender<()>>>>);

impl Shutdown {
    /// Begins graceful shutdown: the server stops accepting and waits for
    /// requests in flight. Later calls do nothing.
    pub fn begin(&self) {
        if let Some(tx) = self.0.lock().unwrap().take() {
            let _ = tx.send(());
        }
    }
}

/// Runs the example service as its binary does, on a loopback port and a
/// two-worker Tokio runtime: initialises Sentry and tracing from `settings`,
/// serves the example router, runs `drive` with the server's address (it may
/// begin the shutdown itself), then shuts down gracefully, drops the runtime
/// and closes the Sentry client (which sends the last profile chunk).
/// Returns what `drive` returned.
pub fn run_example_service<T, F, Fut>(settings: &sentry_profiling_examples::Settings, drive: F) -> T
where
    F: FnOnce(std::net::SocketAddr, Shutdown) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    run_service(settings, sentry_profiling_examples::router(), drive)
}

/// [`run_example_service`] with another router.
pub fn run_service<T, F, Fut>(
    settings: &sentry_profiling_examples::Settings,
    app: axum::Router,
    drive: F,
) -> T
where
    F: FnOnce(std::net::SocketAddr, Shutdown) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let options = sentry_profiling_examples::sentry_options(settings).expect("options");
    run_service_with(options, app, drive)
}

/// [`run_service`] with client options of the caller's own.
pub fn run_service_with<T, F, Fut>(options: sentry::ClientOptions, app: axum::Router, drive: F) -> T
where
    F: FnOnce(std::net::SocketAddr, Shutdown) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    run_service_on(2, options, app, drive)
}

/// [`run_service_with`] on a runtime of `workers` worker threads.
pub fn run_service_on<T, F, Fut>(
    workers: usize,
    options: sentry::ClientOptions,
    app: axum::Router,
    drive: F,
) -> T
where
    F: FnOnce(std::net::SocketAddr, Shutdown) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let guard = sentry::init(options);
    // `sentry::init` binds the client to this thread's hub, which is the
    // process's main hub only on the first thread that used one; the
    // runtime's threads start from the main hub. A binary whose tests each
    // run a service one after the other needs the client there too.
    sentry::Hub::main().bind_client(sentry::Hub::current().client());
    sentry_profiling_examples::init_tracing();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("runtime");
    let out = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let shutdown = Shutdown(Arc::new(Mutex::new(Some(stop_tx))));
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stop_rx.await;
                })
                .await
        });
        let out = drive(addr, shutdown.clone()).await;
        shutdown.begin();
        server.await.expect("server task").expect("server");
        out
    });
    // What the profiler did, for whoever reads a failing test's output.
    println!("profiler: {:?}", sentry_profiling::stats());
    drop(runtime);
    drop(guard);
    out
}

/// An HTTP request body after its `Content-Encoding` (none, `identity` or
/// `gzip`, what Sentry's ingestion accepts from this crate); `None` for any
/// other encoding or a corrupt gzip stream.
pub fn decode_body(content_encoding: Option<&str>, body: &[u8]) -> Option<Vec<u8>> {
    match content_encoding.map(str::trim) {
        None => Some(body.to_vec()),
        Some(e) if e.eq_ignore_ascii_case("identity") => Some(body.to_vec()),
        Some(e) if e.eq_ignore_ascii_case("gzip") => {
            use std::io::Read as _;
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(body)
                .read_to_end(&mut out)
                .ok()?;
            Some(out)
        }
        Some(_) => None,
    }
}

/// A transport that keeps every envelope's bytes.
#[derive(Debug, Default, Clone)]
pub struct CaptureTransport {
    envelopes: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl CaptureTransport {
    /// A new, empty capture.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A transport factory for `ClientOptions::transport` that hands out
    /// this capture.
    pub fn factory(self: &Arc<Self>) -> Arc<dyn sentry_core::TransportFactory> {
        Arc::new(Arc::clone(self))
    }

    /// Everything captured so far, parsed.
    pub fn envelopes(&self) -> Vec<ParsedEnvelope> {
        self.envelopes
            .lock()
            .unwrap()
            .iter()
            .map(|b| parse_envelope(b))
            .collect()
    }
}

impl Transport for CaptureTransport {
    fn send_envelope(&self, envelope: Envelope) {
        let mut bytes = Vec::new();
        envelope.to_writer(&mut bytes).unwrap();
        self.envelopes.lock().unwrap().push(bytes);
    }
}

/// A `transaction` item, parsed.
pub type TransactionItem = Value;

/// Splits envelopes into chunks and transactions.
pub fn split_items(envelopes: &[ParsedEnvelope]) -> (Vec<ChunkItem>, Vec<TransactionItem>) {
    let mut chunks = Vec::new();
    let mut transactions = Vec::new();
    for env in envelopes {
        for item in &env.items {
            match item.header.get("type").and_then(Value::as_str) {
                Some("profile_chunk") => chunks.push(ChunkItem {
                    header: item.header.clone(),
                    payload: serde_json::from_slice(&item.payload).expect("chunk payload is JSON"),
                    payload_len: item.payload.len(),
                }),
                Some("transaction") => transactions.push(
                    serde_json::from_slice(&item.payload).expect("transaction payload is JSON"),
                ),
                _ => {}
            }
        }
    }
    (chunks, transactions)
}

/// A chunk's `profile.samples` (empty when missing).
pub fn chunk_samples(chunk: &ChunkItem) -> &[Value] {
    chunk
        .payload
        .pointer("/profile/samples")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// Thread ids present in a chunk's samples.
pub fn chunk_thread_ids(chunk: &ChunkItem) -> HashSet<String> {
    chunk_samples(chunk)
        .iter()
        .filter_map(|s| {
            s.get("thread_id")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .collect()
}

/// Transactions at least this long (two periods at 101 Hz) must have
/// samples inside their own time window.
pub const MIN_WINDOWED_SECS: f64 = 0.02;

/// Checks that a transaction links to one of `chunks` as Sentry's UI does:
/// a `profile` context with the chunks' `profiler_id`, a `thread.id` that has
/// samples in a chunk of that profiler, and, for transactions of at least
/// [`MIN_WINDOWED_SECS`], samples of that thread inside the transaction's
/// `[start, end]` (what the UI shows). Returns the reason when it does not.
pub fn link_problem(tx: &Value, chunks: &[ChunkItem]) -> Option<String> {
    let mut index = SampleIndex::default();
    for c in chunks {
        index.add_chunk(c);
    }
    index.link_problem(tx)
}

/// Sample timestamps by profiler and thread, gathered chunk by chunk, so a
/// long run can check its transactions' links without keeping its chunks.
#[derive(Debug, Default)]
pub struct SampleIndex {
    /// (profiler id, thread id) -> sample timestamps, sorted by
    /// [`SampleIndex::link_problem`] on first use.
    times: std::collections::HashMap<(String, String), Vec<f64>>,
}

impl SampleIndex {
    /// Adds a chunk's samples.
    pub fn add_chunk(&mut self, chunk: &ChunkItem) {
        let Some(profiler_id) = chunk.payload.get("profiler_id").and_then(Value::as_str) else {
            return;
        };
        for s in chunk_samples(chunk) {
            let (Some(thread), Some(t)) = (
                s.get("thread_id").and_then(Value::as_str),
                s.get("timestamp").and_then(Value::as_f64),
            ) else {
                continue;
            };
            self.times
                .entry((profiler_id.to_owned(), thread.to_owned()))
                .or_default()
                .push(t);
        }
    }

    /// The samples of `thread_id` of profiler `profiler_id` within
    /// `[start, end]`.
    pub fn samples_in(&self, profiler_id: &str, thread_id: &str, start: f64, end: f64) -> usize {
        self.times
            .get(&(profiler_id.to_owned(), thread_id.to_owned()))
            .map_or(0, |v| v.iter().filter(|&&t| t >= start && t <= end).count())
    }

    /// [`link_problem`] against the chunks added so far.
    pub fn link_problem(&self, tx: &Value) -> Option<String> {
        let name = tx.get("transaction").and_then(Value::as_str).unwrap_or("?");
        let Some(profiler_id) = tx
            .pointer("/contexts/profile/profiler_id")
            .and_then(Value::as_str)
        else {
            return Some(format!("{name}: no contexts.profile.profiler_id"));
        };
        if tx.pointer("/contexts/profile/type").and_then(Value::as_str) != Some("profile") {
            return Some(format!("{name}: contexts.profile.type is not \"profile\""));
        }
        let Some(thread_id) = tx
            .pointer("/contexts/trace/data/thread.id")
            .and_then(Value::as_str)
        else {
            return Some(format!("{name}: no contexts.trace.data[\"thread.id\"]"));
        };
        let Some((start, end)) = transaction_window(tx) else {
            return Some(format!(
                "{name}: start_timestamp/timestamp missing or unreadable"
            ));
        };
        let times = self
            .times
            .get(&(profiler_id.to_owned(), thread_id.to_owned()))
            .map_or(&[][..], Vec::as_slice);
        if times.is_empty() {
            return Some(format!(
                "{name}: no chunk of profiler {profiler_id} has samples of thread {thread_id}"
            ));
        }
        let in_window = times.iter().any(|&t| t >= start && t <= end);
        (end - start >= MIN_WINDOWED_SECS && !in_window).then(|| {
            format!(
                "{name}: no sample of thread {thread_id} in [{start}, {end}] ({} elsewhere)",
                times.len()
            )
        })
    }
}

/// Symbolised function names of every sample in `chunk` whose thread is
/// `thread_id` (or any thread) and whose timestamp is within `[start, end]`.
pub fn functions_in_window(
    chunk: &ChunkItem,
    thread_id: Option<&str>,
    start: f64,
    end: f64,
) -> Vec<Vec<String>> {
    let p = &chunk.payload["profile"];
    let frames = p["frames"].as_array().cloned().unwrap_or_default();
    let stacks = p["stacks"].as_array().cloned().unwrap_or_default();
    p["samples"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| thread_id.is_none_or(|t| s["thread_id"].as_str() == Some(t)))
        .filter(|s| {
            s["timestamp"]
                .as_f64()
                .is_some_and(|t| t >= start && t <= end)
        })
        .map(|s| {
            stacks[s["stack_id"].as_u64().unwrap_or(0) as usize]
                .as_array()
                .into_iter()
                .flatten()
                .map(|f| {
                    frames[f.as_u64().unwrap_or(0) as usize]["function"]
                        .as_str()
                        .unwrap_or("")
                        .to_owned()
                })
                .collect()
        })
        .collect()
}

/// A Sentry timestamp as Unix seconds: either a number or an RFC 3339 UTC
/// string (`2026-01-02T03:04:05.678Z`), as the SDK writes both.
pub fn timestamp_secs(v: &Value) -> Option<f64> {
    sentry_view::timestamp_ns(v).map(|ns| ns as f64 / 1e9)
}

/// A transaction's `[start, end]` in Unix seconds.
pub fn transaction_window(tx: &Value) -> Option<(f64, f64)> {
    Some((
        timestamp_secs(tx.get("start_timestamp")?)?,
        timestamp_secs(tx.get("timestamp")?)?,
    ))
}

/// The shortest transaction Sentry links to a profile, in seconds: Relay
/// removes the `profiler_id` of a shorter one (`scrub_profiler_id`), and by
/// default the profiler gives such a request no lane of its own in chunks.
pub const SHORTEST_LINKED_SECS: f64 = 0.0198;

/// Whether Sentry links `tx` to its profile: it lasted at least
/// [`SHORTEST_LINKED_SECS`].
pub fn linked_by_sentry(tx: &Value) -> bool {
    transaction_window(tx).is_some_and(|(start, end)| end - start >= SHORTEST_LINKED_SECS)
}

/// For tests with their own `main` (`harness = false`) that run each case in
/// a child process of their own: runs this test binary again with `env_var`
/// set, and returns its stdout and stderr after asserting it succeeded.
pub fn run_self_as_child(env_var: &str) -> (String, String) {
    let out = std::process::Command::new(std::env::current_exe().expect("current exe"))
        .env(env_var, "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "child failed: {}\n--- stdout\n{stdout}--- stderr\n{stderr}",
        out.status
    );
    (stdout, stderr)
}

/// The address a child service from [`serve_example_from_env`] reports on
/// its stdout (`listening ADDR`), waiting at most `timeout`; `None` if it
/// never does. Takes the child's stdout (which must be piped).
pub fn listening_addr(
    child: &mut std::process::Child,
    timeout: std::time::Duration,
) -> Option<std::net::SocketAddr> {
    use std::io::BufRead;
    let stdout = child.stdout.take()?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(a) = line.strip_prefix("listening ") {
                let _ = tx.send(a.parse().ok());
            }
        }
    });
    rx.recv_timeout(timeout).ok().flatten()
}

/// What the `axum_service` example's `main` does, for tests that run the
/// service as a child process of their own binary: settings from the
/// environment, `sentry_options`, `init_tracing`, `serve_until_signal`
/// (printing `listening <addr>` once it listens), then closing the client.
/// Returns the process's exit code.
pub fn serve_example_from_env() -> i32 {
    let settings = sentry_profiling_examples::Settings::from_env().expect("settings");
    let options = sentry_profiling_examples::sentry_options(&settings).expect("options");
    let guard = sentry::init(options);
    sentry_profiling_examples::init_tracing();
    let served = sentry_profiling_examples::serve_until_signal(settings.addr, |addr| {
        println!("listening {addr}");
    });
    drop(guard);
    match served {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("service: {e}");
            1
        }
    }
}
