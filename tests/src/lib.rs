//! Helpers shared by the end-to-end tests: an in-memory capturing transport,
//! and Relay's acceptance rules for `profile_chunk` items, re-stated from
//! Relay's `relay-profiling` (sample v2 parsing and normalisation, debug
//! image types) so a test fails where ingestion would reject a chunk.

pub mod attribution;
pub mod fake_sentry;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use sentry_core::Transport;
use sentry_core::protocol::Envelope;
pub use sentry_profiling_examples::{EnvelopeItem, ParsedEnvelope, parse_envelope};
use serde_json::Value;

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
        otlp_endpoint: None,
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
    let guard = sentry::init(options);
    sentry_profiling_examples::init_tracing();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
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

/// A `profile_chunk` item, parsed.
#[derive(Debug, Clone)]
pub struct ChunkItem {
    /// The item header.
    pub header: Value,
    /// The payload.
    pub payload: Value,
    /// The payload's size in bytes, as sent.
    pub payload_len: usize,
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

fn is_event_id(v: Option<&Value>) -> bool {
    v.and_then(Value::as_str).is_some_and(|s| {
        s.len() == 32
            && s.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    })
}

fn is_hex_addr(v: Option<&Value>) -> bool {
    v.and_then(Value::as_str).is_some_and(|s| {
        s.strip_prefix("0x")
            .is_some_and(|h| !h.is_empty() && u64::from_str_radix(h, 16).is_ok())
    })
}

/// Checks one chunk against Relay's rules; returns every violation.
///
/// Parsing: `version` "2", `profiler_id`/`chunk_id` event ids, `platform`
/// string matching the item header's, `client_sdk {name, version}`,
/// samples `{timestamp: number, stack_id: integer, thread_id: string}`,
/// frames with hex-string `instruction_addr`, debug images of an accepted
/// type with hex-string addresses. Normalisation: threads with at most one
/// non-empty-stack sample are removed, and the chunk is rejected if no
/// sample remains, if an index is out of range, or if the samples span more
/// than 66 s. Size: at most 50 MiB.
pub fn relay_violations(chunk: &ChunkItem) -> Vec<String> {
    let mut v = Vec::new();
    let p = &chunk.payload;
    let mut check = |ok: bool, what: &str| {
        if !ok {
            v.push(what.to_owned());
        }
    };
    check(
        chunk.payload_len <= 50 * 1024 * 1024,
        "chunk larger than 50 MiB",
    );
    check(
        p.get("version").and_then(Value::as_str) == Some("2"),
        "version is not \"2\"",
    );
    check(
        is_event_id(p.get("profiler_id")),
        "profiler_id is not 32 lowercase hex digits",
    );
    check(
        is_event_id(p.get("chunk_id")),
        "chunk_id is not 32 lowercase hex digits",
    );
    let platform = p.get("platform").and_then(Value::as_str);
    check(platform.is_some(), "platform missing");
    check(
        chunk.header.get("platform").and_then(Value::as_str) == platform,
        "item header platform missing or different from payload platform",
    );
    check(
        p.get("release").and_then(Value::as_str).is_some(),
        "release missing",
    );
    let sdk = p.get("client_sdk");
    check(
        sdk.and_then(|s| s.get("name"))
            .and_then(Value::as_str)
            .is_some()
            && sdk
                .and_then(|s| s.get("version"))
                .and_then(Value::as_str)
                .is_some(),
        "client_sdk {name, version} missing",
    );
    let accepted = ["macho", "symbolic", "sourcemap", "proguard", "jvm"];
    for img in p
        .pointer("/debug_meta/images")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        check(
            img.get("type")
                .and_then(Value::as_str)
                .is_some_and(|t| accepted.contains(&t)),
            "debug image type not accepted by Relay",
        );
        check(
            is_hex_addr(img.get("image_addr")),
            "image_addr is not a hex string",
        );
        check(
            img.get("image_vmaddr").is_none() || is_hex_addr(img.get("image_vmaddr")),
            "image_vmaddr is not a hex string",
        );
        check(
            img.get("image_size").and_then(Value::as_u64).is_some(),
            "image_size is not an integer",
        );
        check(
            img.get("code_file").and_then(Value::as_str).is_some(),
            "code_file missing",
        );
        check(
            img.get("debug_id")
                .and_then(Value::as_str)
                .is_some_and(|d| d.len() == 36 && d.chars().filter(|&c| c == '-').count() == 4),
            "debug_id missing or not a UUID",
        );
    }
    let profile = p.get("profile");
    let samples = profile
        .and_then(|x| x.get("samples"))
        .and_then(Value::as_array);
    let stacks = profile
        .and_then(|x| x.get("stacks"))
        .and_then(Value::as_array);
    let frames = profile
        .and_then(|x| x.get("frames"))
        .and_then(Value::as_array);
    let (Some(samples), Some(stacks), Some(frames)) = (samples, stacks, frames) else {
        v.push("profile.samples/stacks/frames missing".into());
        return v;
    };
    for f in frames {
        let addr = f.get("instruction_addr");
        check(
            addr.is_none() || is_hex_addr(addr),
            "frame instruction_addr is not a hex string",
        );
        check(
            addr.is_some() || f.get("function").and_then(Value::as_str).is_some(),
            "frame has neither instruction_addr nor function",
        );
    }
    for s in stacks {
        let ok = s.as_array().is_some_and(|ids| {
            ids.iter()
                .all(|i| i.as_u64().is_some_and(|i| (i as usize) < frames.len()))
        });
        check(ok, "stack refers to a missing frame");
    }
    let mut per_thread: HashMap<&str, usize> = HashMap::new();
    for s in samples {
        let tid = s.get("thread_id").and_then(Value::as_str);
        check(tid.is_some(), "sample thread_id is not a string");
        check(
            s.get("timestamp").and_then(Value::as_f64).is_some(),
            "sample timestamp is not a number",
        );
        let stack = s.get("stack_id").and_then(Value::as_u64);
        check(
            stack.is_some_and(|i| (i as usize) < stacks.len()),
            "sample refers to a missing stack",
        );
        let non_empty = stack
            .and_then(|i| stacks.get(i as usize))
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty());
        if let (Some(tid), true) = (tid, non_empty) {
            *per_thread.entry(tid).or_default() += 1;
        }
    }
    let kept: Vec<f64> = samples
        .iter()
        .filter(|s| {
            s.get("thread_id")
                .and_then(Value::as_str)
                .is_some_and(|t| per_thread.get(t).copied().unwrap_or(0) > 1)
        })
        .filter_map(|s| s.get("timestamp").and_then(Value::as_f64))
        .collect();
    check(
        !kept.is_empty(),
        "no sample survives Relay's single-sample-thread removal",
    );
    check(
        kept.len() == samples.len(),
        "chunk has threads with a single sample (Relay would drop them)",
    );
    if let (Some(min), Some(max)) = (
        kept.iter().copied().reduce(f64::min),
        kept.iter().copied().reduce(f64::max),
    ) {
        check(max - min <= 66.0, "samples span more than 66 s");
    }
    let meta: HashSet<&str> = profile
        .and_then(|x| x.get("thread_metadata"))
        .and_then(Value::as_object)
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let used: HashSet<&str> = samples
        .iter()
        .filter_map(|s| s.get("thread_id").and_then(Value::as_str))
        .collect();
    check(
        meta == used,
        "thread_metadata does not list exactly the threads with samples",
    );
    v
}

/// Thread ids present in a chunk's samples.
pub fn chunk_thread_ids(chunk: &ChunkItem) -> HashSet<String> {
    chunk
        .payload
        .pointer("/profile/samples")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
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
    let times: Vec<f64> = chunks
        .iter()
        .filter(|c| c.payload.get("profiler_id").and_then(Value::as_str) == Some(profiler_id))
        .flat_map(|c| {
            c.payload
                .pointer("/profile/samples")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        })
        .filter(|s| s.get("thread_id").and_then(Value::as_str) == Some(thread_id))
        .filter_map(|s| s.get("timestamp").and_then(Value::as_f64))
        .collect();
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
    if let Some(f) = v.as_f64() {
        return Some(f);
    }
    let s = v.as_str()?.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut t = time.splitn(3, ':');
    let (h, min) = (
        t.next()?.parse::<i64>().ok()?,
        t.next()?.parse::<i64>().ok()?,
    );
    let sec: f64 = t.next()?.parse().ok()?;
    // Days since the epoch for a proleptic Gregorian date (civil calendar).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + h * 3_600 + min * 60) as f64 + sec)
}

/// A transaction's `[start, end]` in Unix seconds.
pub fn transaction_window(tx: &Value) -> Option<(f64, f64)> {
    Some((
        timestamp_secs(tx.get("start_timestamp")?)?,
        timestamp_secs(tx.get("timestamp")?)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_timestamp_forms() {
        assert_eq!(timestamp_secs(&Value::from(12.5)), Some(12.5));
        let t = timestamp_secs(&Value::from("2026-11-22T11:56:33.797392362Z")).unwrap();
        assert!((t - 1_795_348_593.797_392).abs() < 1e-3, "{t}");
        assert_eq!(
            timestamp_secs(&Value::from("1970-01-01T00:00:00Z")),
            Some(0.0)
        );
    }
}
