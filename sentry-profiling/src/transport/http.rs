//! The crate's own HTTP delivery, used when the client has no transport of
//! its own: the SDK's reqwest transport built with timeouts for everything
//! the SDK sends, and a dedicated sender for profile chunks.
//!
//! The SDK's transport cannot carry chunks well: its rate limiter does not
//! know the `profile_chunk` category (a raw envelope is only stopped by a
//! limit on all categories), and its HTTP client has no timeouts, so an
//! endpoint that accepts a connection and never answers holds its thread
//! for good. The chunk sender here has one thread, a queue bounded in
//! chunks and bytes that the profiler thread never waits on, timeouts on
//! every request, and the rate limits of the `profile_chunk` category.
//! Every chunk it does not deliver is counted by reason, logged sparingly,
//! and reported to Sentry in a client report once the endpoint answers
//! again.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use sentry_core::{Transport, TransportOptions};

use crate::error::log_throttled;
use crate::session::DeliveryCounters;

/// Chunks waiting to be sent, at most.
const MAX_QUEUED_CHUNKS: usize = 8;
/// Bytes of chunks waiting to be sent, at most (a single chunk larger than
/// this is still taken when the queue is empty).
const MAX_QUEUED_BYTES: usize = 64 * 1024 * 1024;
/// How long a `429` without any rate-limit header stops chunks.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(60);
/// The longest time allowed to establish a connection, when the request
/// timeout is longer.
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The profile chunk data category: the one Relay assigns to chunks of
/// backend platforms such as `rust` (`profile_chunk_ui` is for UI
/// platforms, and its limits do not apply here).
const CATEGORY: &str = "profile_chunk";

/// Builds the client's transport and the chunk sender from the client's
/// transport options. `timeout` bounds every request.
pub(crate) fn create(
    options: TransportOptions,
    timeout: Duration,
    counters: Arc<DeliveryCounters>,
) -> (Arc<dyn Transport>, Arc<ChunkSender>) {
    let connect_timeout = timeout.min(MAX_CONNECT_TIMEOUT);
    let settings = ClientSettings {
        url: options.dsn.envelope_api_url().to_string(),
        auth: options.dsn.to_auth(Some(&options.user_agent)).to_string(),
        http_proxy: options.http_proxy.as_deref().map(str::to_owned),
        https_proxy: options.https_proxy.as_deref().map(str::to_owned),
        accept_invalid_certs: options.accept_invalid_certs,
        timeout,
        connect_timeout,
    };
    let mut builder = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(connect_timeout);
    builder = settings.apply_async(builder);
    let sdk: Arc<dyn Transport> = match builder.build() {
        Ok(client) => Arc::new(
            sentry::transports::ReqwestHttpTransportOptions::from(options)
                .with_client(client)
                .build(),
        ),
        Err(e) => {
            // Only a missing TLS backend makes this fail; the SDK's own
            // client would fail the same way, so report it and let the SDK
            // build its default.
            eprintln!("sentry-profiling: cannot build the HTTP client with timeouts: {e}");
            Arc::new(sentry::transports::ReqwestHttpTransportOptions::from(options).build())
        }
    };
    (sdk, ChunkSender::start(settings, counters))
}

/// What both HTTP clients are built from.
#[derive(Debug, Clone)]
struct ClientSettings {
    url: String,
    auth: String,
    http_proxy: Option<String>,
    https_proxy: Option<String>,
    accept_invalid_certs: bool,
    timeout: Duration,
    connect_timeout: Duration,
}

impl ClientSettings {
    fn proxies(&self) -> Vec<reqwest::Proxy> {
        let mut proxies = Vec::new();
        let http = self.http_proxy.as_deref().map(reqwest::Proxy::http);
        let https = self.https_proxy.as_deref().map(reqwest::Proxy::https);
        for proxy in [http, https].into_iter().flatten() {
            match proxy {
                Ok(p) => proxies.push(p),
                Err(e) => eprintln!("sentry-profiling: invalid proxy: {e}"),
            }
        }
        proxies
    }

    fn apply_async(&self, mut builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
        for p in self.proxies() {
            builder = builder.proxy(p);
        }
        builder.danger_accept_invalid_certs(self.accept_invalid_certs)
    }

    fn blocking_client(&self) -> Result<reqwest::blocking::Client, reqwest::Error> {
        let mut builder = reqwest::blocking::Client::builder()
            .timeout(self.timeout)
            .connect_timeout(self.connect_timeout)
            .danger_accept_invalid_certs(self.accept_invalid_certs);
        for p in self.proxies() {
            builder = builder.proxy(p);
        }
        builder.build()
    }
}

/// Why a chunk was not delivered, as client reports name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loss {
    QueueOverflow,
    NetworkError,
    SendError,
    RatelimitBackoff,
}

impl Loss {
    const ALL: [Loss; 4] = [
        Loss::QueueOverflow,
        Loss::NetworkError,
        Loss::SendError,
        Loss::RatelimitBackoff,
    ];

    fn name(self) -> &'static str {
        match self {
            Loss::QueueOverflow => "queue_overflow",
            Loss::NetworkError => "network_error",
            Loss::SendError => "send_error",
            Loss::RatelimitBackoff => "ratelimit_backoff",
        }
    }
}

/// The sender's state, behind one lock.
#[derive(Debug, Default)]
struct Queue {
    chunks: VecDeque<Vec<u8>>,
    bytes: usize,
    /// A request is in flight.
    busy: bool,
    /// No more chunks are taken; the thread ends once the queue is empty.
    closed: bool,
    /// Shutdown ran out of time: what is still queued is dropped unsent.
    abandoned: bool,
    /// Losses not yet reported to Sentry, indexed like [`Loss::ALL`].
    unreported: [u64; 4],
}

#[derive(Debug)]
struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when a chunk is queued or the sender is closed.
    work: Condvar,
    /// Signalled when a chunk has been dealt with.
    progress: Condvar,
    counters: Arc<DeliveryCounters>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts, logs and remembers (for the next client report) one chunk
    /// that was not delivered.
    fn lost(&self, queue: &mut Queue, loss: Option<Loss>, why: &str) {
        let c = &self.counters;
        let counter = match loss {
            Some(Loss::QueueOverflow) => &c.queue_full,
            Some(Loss::NetworkError) => &c.send_failed,
            Some(Loss::SendError) => &c.http_error,
            // A `429` is recorded by the server itself; it is counted here
            // but never reported again.
            Some(Loss::RatelimitBackoff) | None => &c.rate_limited,
        };
        let n = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if let Some(loss) = loss {
            if let Some(i) = Loss::ALL.iter().position(|l| *l == loss) {
                queue.unreported[i] += 1;
            }
        }
        log_throttled(n, || format!("profile chunk dropped: {why} ({n} so far)"));
    }
}

/// Sends profile chunks to the DSN's envelope endpoint from a thread of its
/// own (see the module documentation).
#[derive(Debug)]
pub(crate) struct ChunkSender {
    shared: Arc<Shared>,
}

impl ChunkSender {
    fn start(settings: ClientSettings, counters: Arc<DeliveryCounters>) -> Arc<Self> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            work: Condvar::new(),
            progress: Condvar::new(),
            counters,
        });
        let worker = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name("sentry-profiler-send".into())
            .spawn(move || run(&worker, &settings));
        if let Err(e) = spawned {
            eprintln!("sentry-profiling: cannot start the chunk sender thread: {e}");
            shared.lock().closed = true;
        }
        Arc::new(Self { shared })
    }

    /// Queues an envelope's bytes; never waits for the network. Returns
    /// whether it was queued (a full queue drops it, counted).
    pub(crate) fn submit(&self, envelope: Vec<u8>) -> bool {
        let mut q = self.shared.lock();
        if q.closed {
            self.shared
                .lost(&mut q, Some(Loss::NetworkError), "the sender is shut down");
            return false;
        }
        let full = q.chunks.len() >= MAX_QUEUED_CHUNKS
            || (!q.chunks.is_empty() && q.bytes + envelope.len() > MAX_QUEUED_BYTES);
        if full {
            self.shared.lost(
                &mut q,
                Some(Loss::QueueOverflow),
                "the send queue is full (the endpoint is slow or unreachable)",
            );
            return false;
        }
        q.bytes += envelope.len();
        q.chunks.push_back(envelope);
        drop(q);
        self.shared.work.notify_one();
        true
    }

    /// Waits until every queued chunk has been dealt with, at most
    /// `timeout`. Returns whether it was.
    pub(crate) fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut q = self.shared.lock();
        while q.busy || !q.chunks.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            q = self
                .shared
                .progress
                .wait_timeout(q, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// Takes no more chunks; the thread ends once it has dealt with the
    /// queued ones.
    pub(crate) fn close(&self) {
        self.shared.lock().closed = true;
        self.shared.work.notify_one();
    }

    /// Sends what is queued within `timeout`, then stops; whatever could
    /// not be sent in time is dropped (and counted) instead of holding the
    /// process up. Never waits longer than `timeout`.
    pub(crate) fn shutdown(&self, timeout: Duration) -> bool {
        self.close();
        let done = self.flush(timeout);
        if !done {
            let mut q = self.shared.lock();
            q.abandoned = true;
            while let Some(chunk) = q.chunks.pop_front() {
                q.bytes -= chunk.len();
                self.shared.lost(
                    &mut q,
                    Some(Loss::NetworkError),
                    "not sent before the shutdown timeout",
                );
            }
        }
        done
    }
}

/// The sender thread: takes chunks one at a time until closed.
fn run(shared: &Shared, settings: &ClientSettings) {
    // Built (and dropped) on this thread: a blocking client must not be
    // dropped inside an async runtime, and `sentry::init` may run in one.
    let client = match settings.blocking_client() {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("sentry-profiling: cannot build the HTTP client for profile chunks: {e}");
            None
        }
    };
    let mut limits = RateLimits::default();
    loop {
        let mut q = shared.lock();
        while q.chunks.is_empty() && !q.closed {
            q = shared.work.wait(q).unwrap_or_else(|e| e.into_inner());
        }
        let Some(chunk) = q.chunks.pop_front() else {
            return;
        };
        q.bytes -= chunk.len();
        if q.abandoned {
            shared.lost(
                &mut q,
                Some(Loss::NetworkError),
                "not sent before the shutdown timeout",
            );
            continue;
        }
        if let Some(left) = limits.limited(Instant::now()) {
            let why = format!("rate limited by Sentry for another {} s", left.as_secs());
            shared.lost(&mut q, Some(Loss::RatelimitBackoff), &why);
            drop(q);
            shared.progress.notify_all();
            continue;
        }
        q.busy = true;
        let reported = q.unreported;
        drop(q);

        let outcome = match &client {
            Some(client) => post(client, settings, chunk, &reported, &mut limits),
            None => Outcome::Failed("no HTTP client".into()),
        };

        let mut q = shared.lock();
        q.busy = false;
        match outcome {
            Outcome::Delivered => {
                shared
                    .counters
                    .delivered
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                for (u, r) in q.unreported.iter_mut().zip(reported) {
                    *u = u.saturating_sub(r);
                }
            }
            Outcome::RateLimited { report_accepted } => {
                if report_accepted {
                    for (u, r) in q.unreported.iter_mut().zip(reported) {
                        *u = u.saturating_sub(r);
                    }
                }
                shared.lost(&mut q, None, "rate limited by Sentry");
            }
            Outcome::Status(status) => {
                let why = format!("Sentry answered HTTP {status}");
                shared.lost(&mut q, Some(Loss::SendError), &why);
            }
            Outcome::Failed(e) => {
                let why = format!("request failed: {e}");
                shared.lost(&mut q, Some(Loss::NetworkError), &why);
            }
        }
        drop(q);
        shared.progress.notify_all();
    }
}

/// What became of one request.
#[derive(Debug)]
enum Outcome {
    Delivered,
    /// Sentry dropped the chunk for a rate limit: a `429`, or a `2xx` (the
    /// envelope's client report was taken) whose rate limits name chunks.
    RateLimited {
        report_accepted: bool,
    },
    Status(u16),
    Failed(String),
}

/// Posts one envelope (with a client report of earlier losses appended, if
/// any) and learns the rate limits from the answer.
fn post(
    client: &reqwest::blocking::Client,
    settings: &ClientSettings,
    mut body: Vec<u8>,
    reported: &[u64; 4],
    limits: &mut RateLimits,
) -> Outcome {
    append_client_report(&mut body, reported, SystemTime::now());
    let request = client
        .post(&settings.url)
        .header("X-Sentry-Auth", &settings.auth)
        .header("Content-Type", "application/x-sentry-envelope");
    // Chunk JSON repeats itself (sample records, frame records): gzip makes
    // it about ten times smaller, for a few milliseconds of this thread's
    // CPU per megabyte. Relay decodes `Content-Encoding: gzip`.
    let request = match gzip(&body) {
        Some(compressed) => request.header("Content-Encoding", "gzip").body(compressed),
        None => request.body(body),
    };
    let response = request.send();
    let response = match response {
        Ok(r) => r,
        Err(e) => return Outcome::Failed(error_chain(&e)),
    };
    let status = response.status().as_u16();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let now = Instant::now();
    limits.update(
        status,
        header("x-sentry-rate-limits").as_deref(),
        header("retry-after").as_deref(),
        now,
    );
    // Reading the (small) body lets the connection be reused; it is bounded
    // by the request timeout like the rest of the exchange.
    let _ = response.bytes();
    match status {
        // Relay accepts an envelope whose other items pass and names the
        // limits it applied: a limit on chunks means this one was dropped.
        200..=299 if limits.limited(now).is_some() => Outcome::RateLimited {
            report_accepted: true,
        },
        200..=299 => Outcome::Delivered,
        429 => Outcome::RateLimited {
            report_accepted: false,
        },
        s => Outcome::Status(s),
    }
}

/// `bytes` gzip-compressed at the fastest level; `None` if compression
/// failed (the body is then sent as it is).
fn gzip(bytes: &[u8]) -> Option<Vec<u8>> {
    use std::io::Write as _;
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(bytes.len() / 8),
        flate2::Compression::fast(),
    );
    encoder.write_all(bytes).ok()?;
    encoder.finish().ok()
}

/// An error with its causes (reqwest's own message omits them: "error
/// sending request" says nothing of a timeout or a refused connection).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Appends a `client_report` item for the `profile_chunk` losses in
/// `counts` (indexed like [`Loss::ALL`]); nothing when there are none.
fn append_client_report(envelope: &mut Vec<u8>, counts: &[u64; 4], now: SystemTime) {
    let discarded: Vec<serde_json::Value> = Loss::ALL
        .iter()
        .zip(counts)
        .filter(|(_, n)| **n > 0)
        .map(|(loss, n)| {
            serde_json::json!({ "reason": loss.name(), "category": CATEGORY, "quantity": n })
        })
        .collect();
    if discarded.is_empty() {
        return;
    }
    let timestamp = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let payload = serde_json::json!({ "timestamp": timestamp, "discarded_events": discarded });
    let Ok(payload) = serde_json::to_vec(&payload) else {
        return;
    };
    if !envelope.ends_with(b"\n") {
        envelope.push(b'\n');
    }
    envelope.extend_from_slice(
        format!(
            "{{\"type\":\"client_report\",\"length\":{}}}\n",
            payload.len()
        )
        .as_bytes(),
    );
    envelope.extend_from_slice(&payload);
    envelope.push(b'\n');
}

/// Until when Sentry asked for no profile chunks.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct RateLimits {
    until: Option<Instant>,
}

impl RateLimits {
    /// The time left while chunks are rate limited.
    fn limited(&self, now: Instant) -> Option<Duration> {
        self.until
            .and_then(|u| u.checked_duration_since(now))
            .filter(|d| !d.is_zero())
    }

    fn extend(&mut self, until: Instant) {
        self.until = Some(self.until.map_or(until, |u| u.max(until)));
    }

    /// Learns from one response, as Sentry's SDK guidelines say: an
    /// `X-Sentry-Rate-Limits` header is authoritative; otherwise
    /// `Retry-After` applies to everything, and a bare `429` means 60 s.
    fn update(
        &mut self,
        status: u16,
        rate_limits: Option<&str>,
        retry_after: Option<&str>,
        now: Instant,
    ) {
        if let Some(header) = rate_limits {
            // <limit> = <seconds>:<category>(;<category>)*:<scope>[:<reason>...],
            // limits separated by commas; no category means all of them.
            for limit in header.split(',') {
                let mut fields = limit.trim().split(':');
                let Some(Ok(secs)) = fields.next().map(|s| s.trim().parse::<f64>()) else {
                    continue;
                };
                let Some(categories) = fields.next() else {
                    continue;
                };
                let applies = categories.trim().is_empty()
                    || categories.split(';').any(|c| c.trim() == CATEGORY);
                if applies {
                    self.extend(now + seconds(secs));
                }
            }
            return;
        }
        if let Some(value) = retry_after {
            let value = value.trim();
            let wait = match value.parse::<f64>() {
                Ok(secs) => seconds(secs),
                Err(_) => httpdate::parse_http_date(value)
                    .map(|at| {
                        at.duration_since(SystemTime::now())
                            .unwrap_or(Duration::ZERO)
                    })
                    .unwrap_or(DEFAULT_RETRY_AFTER),
            };
            self.extend(now + wait);
        } else if status == 429 {
            self.extend(now + DEFAULT_RETRY_AFTER);
        }
    }
}

/// Whole seconds, rounded up; nonsense (negative, NaN) is zero and absurd
/// values are capped at a day.
fn seconds(secs: f64) -> Duration {
    if secs.is_nan() || secs <= 0.0 {
        return Duration::ZERO;
    }
    Duration::from_secs(secs.ceil().min(86_400.0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    fn limited_for(status: u16, rl: Option<&str>, ra: Option<&str>) -> Option<u64> {
        let now = Instant::now();
        let mut l = RateLimits::default();
        l.update(status, rl, ra, now);
        l.limited(now).map(|d| d.as_secs())
    }

    #[test]
    fn rate_limit_header() {
        let h = "60:profile_chunk:organization";
        assert_eq!(limited_for(200, Some(h), None), Some(60));
        assert_eq!(limited_for(429, Some(h), None), Some(60));
        // Several categories, a reason, and the longest limit wins.
        let h = "10:transaction;profile_chunk:key:quota_exceeded, 30:profile_chunk:project";
        assert_eq!(limited_for(200, Some(h), None), Some(30));
        // No category: everything is limited.
        assert_eq!(limited_for(429, Some("2.5::organization"), None), Some(3));
        // Other categories, including the UI profile category, do not stop
        // backend chunks; nor does a malformed limit.
        let h = "60:transaction;profile_chunk_ui;error:organization, x:profile_chunk:org";
        assert_eq!(limited_for(200, Some(h), None), None);
        // The header wins over Retry-After and the status.
        assert_eq!(
            limited_for(429, Some("60:error:organization"), Some("10")),
            None
        );
    }

    #[test]
    fn retry_after_and_bare_429() {
        assert_eq!(limited_for(429, None, Some("7")), Some(7));
        assert_eq!(limited_for(503, None, Some("7")), Some(7));
        assert_eq!(limited_for(429, None, None), Some(60));
        assert_eq!(limited_for(200, None, None), None);
        assert_eq!(limited_for(503, None, None), None);
        // An HTTP date in the past means no wait; garbage means the default.
        let past = "Wed, 21 Oct 2015 07:28:00 GMT";
        assert_eq!(limited_for(429, None, Some(past)), None);
        assert_eq!(limited_for(429, None, Some("soon")), Some(60));
        let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
        let secs = limited_for(429, None, Some(&later)).unwrap();
        assert!((118..=120).contains(&secs), "{secs}");
    }

    #[test]
    fn client_report_item() {
        let mut env = b"{}\n{\"type\":\"profile_chunk\",\"length\":2}\n{}\n".to_vec();
        append_client_report(&mut env, &[0; 4], SystemTime::now());
        assert_eq!(env.iter().filter(|b| **b == b'\n').count(), 3, "no losses");
        append_client_report(&mut env, &[2, 0, 5, 0], SystemTime::UNIX_EPOCH);
        let text = String::from_utf8(env).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5);
        let header: serde_json::Value = serde_json::from_str(lines[3]).unwrap();
        assert_eq!(header["type"], "client_report");
        assert_eq!(header["length"].as_u64(), Some(lines[4].len() as u64));
        let report: serde_json::Value = serde_json::from_str(lines[4]).unwrap();
        assert_eq!(
            report["discarded_events"],
            serde_json::json!([
                {"reason": "queue_overflow", "category": "profile_chunk", "quantity": 2},
                {"reason": "send_error", "category": "profile_chunk", "quantity": 5},
            ])
        );
    }

    /// A loopback listener that accepts connections and never answers: the
    /// queue fills, the overflow is counted, requests time out, and
    /// shutdown gives up within its timeout.
    #[test]
    fn stalled_endpoint_fills_the_queue_and_shutdown_does_not_wait_for_it() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let held = std::thread::spawn(move || {
            // Keep accepted connections open, unanswered, for a while.
            let mut open = Vec::new();
            listener.set_nonblocking(true).unwrap();
            let until = Instant::now() + Duration::from_secs(4);
            while Instant::now() < until {
                if let Ok((s, _)) = listener.accept() {
                    open.push(s);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        let counters = Arc::new(DeliveryCounters::default());
        let settings = ClientSettings {
            url: format!("http://127.0.0.1:{port}/api/1/envelope/"),
            auth: "Sentry sentry_key=public, sentry_version=7".into(),
            http_proxy: None,
            https_proxy: None,
            accept_invalid_certs: false,
            timeout: Duration::from_millis(700),
            connect_timeout: Duration::from_millis(700),
        };
        let sender = ChunkSender::start(settings, Arc::clone(&counters));
        let started = Instant::now();
        let mut queued = 0;
        for _ in 0..MAX_QUEUED_CHUNKS + 4 {
            queued += usize::from(sender.submit(b"{}\n".to_vec()));
        }
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "submitting never waits for the network"
        );
        assert!(queued <= MAX_QUEUED_CHUNKS + 1, "{queued} queued");
        assert!(counters.queue_full.load(Ordering::Relaxed) >= 3);
        // One request times out...
        let deadline = Instant::now() + Duration::from_secs(10);
        while counters.send_failed.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(counters.send_failed.load(Ordering::Relaxed) >= 1);
        // ... and shutdown gives up on the rest within its timeout.
        let started = Instant::now();
        assert!(!sender.shutdown(Duration::from_millis(300)));
        assert!(started.elapsed() < Duration::from_secs(3));
        assert!(!sender.submit(b"{}\n".to_vec()), "closed");
        assert_eq!(counters.delivered.load(Ordering::Relaxed), 0);
        held.join().unwrap();
    }
}
