//! The response body is part of the request: what the server does while it
//! polls a response's body after the handler returned (tower-http's gzip
//! compression of a large JSON document, a server-sent event stream whose
//! events each burn CPU in `stream_event_work`) is in the request's lane,
//! and its transaction lasts until the body has been sent.
//!
//! A real axum service on loopback, a client for each endpoint sending its
//! requests one after another while the other does the same, so the two
//! requests in flight interleave on the runtime's two workers. The truth
//! comes from outside the profiler: each client's requests do not overlap,
//! so a sample of gzip code (frames named `flate2`, `miniz_oxide` or
//! `deflate`) or of `stream_event_work` taken while client k's request n
//! was in flight belongs to that request; and a layer between
//! `http_layer()` and the compression records every poll of each body
//! (thread, wall-clock interval). Scored, per kind of work: recall, the
//! share of its samples on its request's lane (at least 0.95), and the
//! share Sentry shows for the request's transaction (on the lane, inside
//! the window; at least 0.95); and that each transaction ends after its
//! body's last sample. A sample of that code on an OS thread that was not
//! polling such a body at the time is a period the sampler filled with the
//! thread's last capture after the thread had left the request (the body
//! was then polled on the other worker, or the thread waited between two
//! events):
//! a stale stack filed under no request, counted and printed (with the
//! recall over all samples) but left out of the recall.
//!
//! Then, shorter, how `http_layer()` composes with sentry-tower, as the
//! README describes: inside sentry-tower's layers with their transactions,
//! sentry-tower finishes its transaction when the handler's response is
//! ready, before the body, while the lane still covers the body; with
//! sentry-tower's layers making no transaction, `http_layer()`'s covers
//! the body; outside them with transactions, each request gets two.
//!
//! One test, so that the Sentry hubs and profilers of the runs never
//! overlap.

use std::convert::Infallible;
use std::sync::OnceLock;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::sse::{Event, Sse};
use axum::routing::get;
use sentry_profiling_tests::clients::{captured_options_with, client_of, trace_header};
use sentry_profiling_tests::{
    CaptureTransport, ChunkItem, relay_violations, run_service_with, split_items,
    transaction_window,
};
use serde_json::Value;

/// The JSON document `/export` sends, before compression.
const JSON_BYTES: usize = 768 * 1024;
/// Events per `/events` stream, and what each waits before its work.
const EVENTS: u64 = 8;
const EVENT_GAP: Duration = Duration::from_millis(5);
/// Client 0 asks for `/export`, client 1 for `/events`.
const EXPORT_CLIENT: u64 = 0;
const EVENTS_CLIENT: u64 = 1;

/// A deterministic JSON array of records, `JSON_BYTES` long or a little
/// more: numbers from a xorshift generator, so it compresses as real data
/// does (a few times, not a thousand).
fn json_document() -> &'static [u8] {
    static JSON: OnceLock<Vec<u8>> = OnceLock::new();
    JSON.get_or_init(|| {
        use std::fmt::Write as _;
        let mut out = String::with_capacity(JSON_BYTES + 256);
        let mut x = 0x2545_f491_4f6c_dd1du64;
        out.push('[');
        let mut i = 0u64;
        while out.len() < JSON_BYTES {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if i > 0 {
                out.push(',');
            }
            let _ = write!(
                out,
                r#"{{"id":{i},"sku":"item-{:05}","price":{}.{:02},"stock":{},"tags":["t{}","t{}"]}}"#,
                x % 100_000,
                (x >> 20) % 10_000,
                (x >> 40) % 100,
                (x >> 8) % 1000,
                (x >> 3) % 50,
                (x >> 13) % 50,
            );
            i += 1;
        }
        out.push(']');
        out.into_bytes()
    })
}

/// `GET /export`: the document, which tower-http's `CompressionLayer`
/// gzips while the server polls the body (the handler only hands it over).
async fn export() -> ([(http::HeaderName, &'static str); 1], Body) {
    (
        [(http::header::CONTENT_TYPE, "application/json")],
        Body::from(Bytes::from_static(json_document())),
    )
}

/// A stream event's work: a fixed amount of arithmetic (a few milliseconds
/// in a debug build), the same on an idle or a loaded machine.
#[inline(never)]
fn stream_event_work(seed: u64) -> u64 {
    let mut x = seed | 1;
    for i in 0..1_500_000u64 {
        x = std::hint::black_box(x.rotate_left(7) ^ i).wrapping_mul(0x100_0000_01b3);
    }
    x
}

/// `GET /events`: server-sent events, each after a short wait and some
/// work done inside the stream, that is, while the server polls the body.
async fn events() -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    Sse::new(futures_util::stream::unfold(0u64, |i| async move {
        if i == EVENTS {
            return None;
        }
        tokio::time::sleep(EVENT_GAP).await;
        let x = stream_event_work(i);
        Some((Ok(Event::default().data(format!("{i} {x:x}"))), i + 1))
    }))
}

fn router() -> axum::Router {
    axum::Router::new()
        .route("/export", get(export))
        .route("/events", get(events))
        // Inside `http_layer()` (added to the router after it), so its work
        // happens inside the body `http_layer()` polls.
        .layer(tower_http::compression::CompressionLayer::new())
        .layer(truth::BodyPollsLayer)
}

/// How the router's layers are stacked around `router()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Composition {
    /// `http_layer()` alone.
    HttpLayer,
    /// `http_layer()` inside sentry-tower's layers, which make
    /// transactions (the README's composition).
    InsideTowerTransactions,
    /// `http_layer()` inside sentry-tower's layers, which make none.
    InsideTowerNoTransactions,
    /// `http_layer()` outside sentry-tower's layers, which make
    /// transactions.
    OutsideTowerTransactions,
}

fn app(composition: Composition) -> axum::Router {
    use sentry_profiling_tracing::http_layer;
    use sentry_tower::{NewSentryLayer, SentryHttpLayer};
    match composition {
        Composition::HttpLayer => router().layer(http_layer()),
        Composition::InsideTowerTransactions => router()
            .layer(http_layer())
            .layer(SentryHttpLayer::new().enable_transaction())
            .layer(NewSentryLayer::new_from_top()),
        Composition::InsideTowerNoTransactions => router()
            .layer(http_layer())
            .layer(SentryHttpLayer::new())
            .layer(NewSentryLayer::new_from_top()),
        Composition::OutsideTowerTransactions => router()
            .layer(SentryHttpLayer::new().enable_transaction())
            .layer(NewSentryLayer::new_from_top())
            .layer(http_layer()),
    }
}

/// The truth about where each body was polled, recorded outside the
/// profiler: a layer between `http_layer()` and the compression that
/// records every poll of each response's body (its thread and wall-clock
/// interval, and whose request it is).
mod truth {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Mutex;
    use std::task::{Context, Poll};

    /// One poll of a response body.
    #[derive(Debug, Clone, Copy)]
    pub(super) struct BodyPoll {
        pub(super) tid: u64,
        pub(super) start: f64,
        pub(super) end: f64,
        pub(super) client: u64,
    }

    static POLLS: Mutex<Vec<BodyPoll>> = Mutex::new(Vec::new());

    /// Every poll recorded since the last call.
    pub(super) fn take() -> Vec<BodyPoll> {
        std::mem::take(&mut *POLLS.lock().unwrap_or_else(|e| e.into_inner()))
    }

    #[derive(Debug, Clone, Copy)]
    pub(super) struct BodyPollsLayer;

    impl<S> tower_layer::Layer<S> for BodyPollsLayer {
        type Service = BodyPolls<S>;
        fn layer(&self, inner: S) -> BodyPolls<S> {
            BodyPolls(inner)
        }
    }

    #[derive(Debug, Clone)]
    pub(super) struct BodyPolls<S>(S);

    impl<S, ReqBody, ResBody> tower_service::Service<http::Request<ReqBody>> for BodyPolls<S>
    where
        S: tower_service::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
        S::Future: Send + 'static,
        ResBody: 'static,
    {
        type Response = http::Response<RecordedBody<ResBody>>;
        type Error = S::Error;
        type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
            self.0.poll_ready(cx)
        }

        fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
            let client = if req.uri().path() == "/export" {
                super::EXPORT_CLIENT
            } else {
                super::EVENTS_CLIENT
            };
            let fut = self.0.call(req);
            Box::pin(async move {
                let response = fut.await?;
                Ok(response.map(|body| RecordedBody {
                    inner: Box::pin(body),
                    client,
                }))
            })
        }
    }

    /// A body whose polls are recorded.
    pub(super) struct RecordedBody<B> {
        inner: Pin<Box<B>>,
        client: u64,
    }

    impl<B: http_body::Body> http_body::Body for RecordedBody<B> {
        type Data = B::Data;
        type Error = B::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
            let start = super::now_secs();
            let out = self.inner.as_mut().poll_frame(cx);
            let poll = BodyPoll {
                tid: sentry_profiling::hooks::current_thread_id(),
                start,
                end: super::now_secs(),
                client: self.client,
            };
            POLLS.lock().unwrap_or_else(|e| e.into_inner()).push(poll);
            out
        }

        fn is_end_stream(&self) -> bool {
            self.inner.is_end_stream()
        }

        fn size_hint(&self) -> http_body::SizeHint {
            self.inner.size_hint()
        }
    }
}

/// One request as its client saw it.
#[derive(Debug)]
struct Sent {
    client: u64,
    n: u64,
    /// Wall-clock seconds when the client connected and when it had read
    /// the whole response.
    start: f64,
    end: f64,
    response: Vec<u8>,
}

fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `GET path` over a fresh connection, gzip accepted; the whole response.
async fn get_bytes(addr: std::net::SocketAddr, path: &str, trace: &str) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nAccept-Encoding: gzip\r\nsentry-trace: {trace}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(req.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    stream.read_to_end(&mut out).await.expect("read");
    out
}

/// Client k's `per_client` requests, one after another.
async fn client(addr: std::net::SocketAddr, k: u64, per_client: u64) -> Vec<Sent> {
    let path = if k == EXPORT_CLIENT {
        "/export"
    } else {
        "/events"
    };
    let mut sent = Vec::new();
    for n in 0..per_client {
        let start = now_secs();
        let response = get_bytes(addr, &format!("{path}?n={n}"), &trace_header(k, n)).await;
        sent.push(Sent {
            client: k,
            n,
            start,
            end: now_secs(),
            response,
        });
    }
    sent
}

/// A response's header block (lower-cased) and its body, de-chunked.
fn parse_response(raw: &[u8]) -> (String, Vec<u8>) {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a header block");
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let mut rest = &raw[split + 4..];
    if !head.contains("transfer-encoding: chunked") {
        return (head, rest.to_vec());
    }
    let mut body = Vec::new();
    loop {
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a chunk size line");
        let size = usize::from_str_radix(
            std::str::from_utf8(&rest[..line_end])
                .expect("chunk size")
                .trim(),
            16,
        )
        .expect("a hexadecimal chunk size");
        rest = &rest[line_end + 2..];
        if size == 0 {
            return (head, body);
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

/// Checks what each client received: the whole document, gzipped, and
/// every event.
fn check_responses(sent: &[Sent]) {
    for s in sent {
        let (head, body) = parse_response(&s.response);
        assert!(head.starts_with("http/1.1 200"), "{head}");
        if s.client == EXPORT_CLIENT {
            assert!(head.contains("content-encoding: gzip"), "{head}");
            let plain = sentry_profiling_tests::decode_body(Some("gzip"), &body)
                .expect("a valid gzip stream");
            assert!(plain == json_document(), "the document, whole");
        } else {
            assert!(head.contains("content-type: text/event-stream"), "{head}");
            let text = String::from_utf8(body).expect("UTF-8 events");
            let events = text.lines().filter(|l| l.starts_with("data:")).count();
            assert_eq!(events as u64, EVENTS, "{text}");
        }
    }
}

/// Runs one composition: `exports` requests to `/export` and `events`
/// to `/events`, concurrently.
fn run_composition(composition: Composition, exports: u64, events: u64) -> Run {
    json_document();
    truth::take();
    let capture = CaptureTransport::new();
    // Inside sentry-tower's layers the transaction ends when the handler
    // returns, a few milliseconds in, and Sentry unlinks a transaction that
    // short (so by default it gets no lane): its lane is kept here to show
    // where the body's work goes.
    let options = captured_options_with(&capture, |p| {
        p.short_request_lanes(composition == Composition::InsideTowerTransactions)
    });
    let sent = run_service_with(options, app(composition), |addr, _| async move {
        let a = tokio::spawn(client(addr, EXPORT_CLIENT, exports));
        let b = tokio::spawn(client(addr, EVENTS_CLIENT, events));
        let mut sent = a.await.expect("export client");
        sent.extend(b.await.expect("events client"));
        sent
    });
    check_responses(&sent);
    let (chunks, transactions) = split_items(&capture.envelopes());
    for c in &chunks {
        assert_eq!(relay_violations(c), Vec::<String>::new());
    }
    let body_polls = truth::take();
    Run {
        samples: body_samples(&chunks),
        sent,
        chunks,
        transactions,
        body_polls,
    }
}

/// What one run left: the client's requests, the envelopes' chunks and
/// transactions, the chunks' samples of body work, and every poll of a
/// response body.
struct Run {
    sent: Vec<Sent>,
    chunks: Vec<ChunkItem>,
    transactions: Vec<Value>,
    samples: Vec<BodySample>,
    body_polls: Vec<truth::BodyPoll>,
}

impl Run {
    /// Scores one kind of body work; `tx_of` gives a request's transaction
    /// (the one that carries its lane).
    fn score(&self, work: BodyWork, tx_of: &dyn Fn(u64, u64) -> Option<Linked>) -> Score {
        score(work, &self.samples, &self.sent, &self.body_polls, tx_of)
    }
}

/// What a sample shows of the body's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyWork {
    /// gzip: `flate2`, `miniz_oxide` or anything named `deflate`.
    Compression,
    /// The stream's per-event function.
    EventWork,
}

impl BodyWork {
    fn of(frames: &[&str]) -> Option<Self> {
        if frames.iter().any(|f| f.contains("stream_event_work")) {
            Some(Self::EventWork)
        } else if frames
            .iter()
            .any(|f| f.contains("miniz_oxide") || f.contains("flate2") || f.contains("deflate"))
        {
            Some(Self::Compression)
        } else {
            None
        }
    }

    /// The client whose requests cause it.
    fn client(self) -> u64 {
        match self {
            Self::Compression => EXPORT_CLIENT,
            Self::EventWork => EVENTS_CLIENT,
        }
    }
}

/// A chunk sample showing body work.
#[derive(Debug)]
struct BodySample {
    work: BodyWork,
    thread: String,
    ts: f64,
}

fn body_samples(chunks: &[ChunkItem]) -> Vec<BodySample> {
    let mut out = Vec::new();
    for chunk in chunks {
        let p = &chunk.payload["profile"];
        let empty = Vec::new();
        let frames = p["frames"].as_array().unwrap_or(&empty);
        let stacks = p["stacks"].as_array().unwrap_or(&empty);
        for s in p["samples"].as_array().unwrap_or(&empty) {
            let stack = &stacks[s["stack_id"].as_u64().unwrap_or(0) as usize];
            let names: Vec<&str> = stack
                .as_array()
                .unwrap_or(&empty)
                .iter()
                .map(|f| {
                    frames[f.as_u64().unwrap_or(0) as usize]["function"]
                        .as_str()
                        .unwrap_or("")
                })
                .collect();
            if let Some(work) = BodyWork::of(&names) {
                out.push(BodySample {
                    work,
                    thread: s["thread_id"].as_str().unwrap_or("").to_owned(),
                    ts: s["timestamp"].as_f64().unwrap_or(0.0),
                });
            }
        }
    }
    out
}

/// A request's transaction as the score needs it.
#[derive(Debug, Clone)]
struct Linked {
    thread: String,
    start: f64,
    end: f64,
    origin: String,
}

fn linked(tx: &Value) -> Linked {
    let (start, end) = transaction_window(tx).expect("a window");
    Linked {
        thread: tx
            .pointer("/contexts/trace/data/thread.id")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        start,
        end,
        origin: tx
            .pointer("/contexts/trace/origin")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
    }
}

/// One kind of body work, scored against the requests in flight.
#[derive(Debug, Default, Clone)]
struct Score {
    /// Samples showing it, in all.
    samples: usize,
    /// Of those, on the lane of the request in flight at their moment, and
    /// shown for its transaction (on that lane, inside its window).
    on_lane: usize,
    shown: usize,
    /// Samples not on that lane: on another lane, or on an OS thread that
    /// was polling a body of the kind at their moment.
    missed: usize,
    /// Samples on an OS thread that was not polling such a body at their
    /// moment: periods in which the thread did something else (it had left
    /// the request, and the body was polled on another worker, or not at
    /// all), which the sampler filled with the thread's last capture,
    /// filed under no request. A stale stack, not the body's work: left
    /// out of the recall.
    stale: usize,
    /// Per request of the kind, its latest sample on its lane.
    last_on_lane: std::collections::BTreeMap<u64, f64>,
}

impl Score {
    /// Of the samples of the body's work, the share on its request's lane.
    fn recall(&self) -> f64 {
        self.on_lane as f64 / (self.on_lane + self.missed).max(1) as f64
    }
    /// Of the samples of the body's work, the share Sentry shows for its
    /// request's transaction.
    fn shown_share(&self) -> f64 {
        self.shown as f64 / (self.on_lane + self.missed).max(1) as f64
    }
    /// Of all samples showing the work's functions, stale ones included,
    /// the share on the request's lane.
    fn recall_all(&self) -> f64 {
        self.on_lane as f64 / self.samples.max(1) as f64
    }

    fn summary(&self) -> String {
        format!(
            "{} samples, {} stale: recall {:.4} ({:.4} of all), {:.4} shown for the transaction",
            self.samples,
            self.stale,
            self.recall(),
            self.recall_all(),
            self.shown_share()
        )
    }
}

/// Scores the `samples` of `work` against the requests in flight at their
/// moment, with `polls` where each body was polled.
fn score(
    work: BodyWork,
    samples: &[BodySample],
    sent: &[Sent],
    polls: &[truth::BodyPoll],
    tx_of: &dyn Fn(u64, u64) -> Option<Linked>,
) -> Score {
    let mut score = Score::default();
    let mut misplaced = Vec::new();
    for s in samples.iter().filter(|s| s.work == work) {
        score.samples += 1;
        let req = sent
            .iter()
            .find(|r| r.client == work.client() && r.start <= s.ts && s.ts <= r.end);
        let tx = req.and_then(|r| tx_of(r.client, r.n));
        if let (Some(req), Some(tx)) = (req, &tx) {
            if s.thread == tx.thread {
                let shown = tx.start <= s.ts && s.ts <= tx.end;
                score.on_lane += 1;
                score.shown += usize::from(shown);
                let l = score.last_on_lane.entry(req.n).or_insert(s.ts);
                *l = l.max(s.ts);
                continue;
            }
        }
        let polling = polls.iter().any(|p| {
            p.client == work.client()
                && p.tid.to_string() == s.thread
                && p.start <= s.ts
                && s.ts <= p.end
        });
        if !is_lane(&s.thread) && !polling {
            score.stale += 1;
            continue;
        }
        score.missed += 1;
        misplaced.push(format!(
            "{:.4} on {}, request {:?} on {:?}",
            s.ts,
            s.thread,
            req.map(|r| r.n),
            tx.map(|t| t.thread)
        ));
    }
    for m in misplaced.iter().take(10) {
        println!("  {work:?} sample not on its request's lane: {m}");
    }
    score
}

/// Whether a sample's `thread_id` is a lane (lane ids start at 10^9,
/// above any Linux thread id).
fn is_lane(thread: &str) -> bool {
    thread.parse::<u64>().is_ok_and(|t| t >= 1_000_000_000)
}

/// Transactions by (client, request), for one origin.
fn transactions_by_request(
    transactions: &[Value],
    origin: &str,
) -> std::collections::HashMap<(u64, u64), Linked> {
    transactions
        .iter()
        .filter_map(|tx| Some((client_of(tx)?, linked(tx))))
        .filter(|(_, l)| l.origin == origin)
        .collect()
}

const OUR_ORIGIN: &str = "auto.http.sentry_profiling";
const TOWER_ORIGIN: &str = "auto.http.tower";

#[test]
fn response_bodies_are_part_of_their_requests() {
    http_layer_alone();
    inside_sentry_tower();
}

/// The recall every kind of body work must reach.
const MIN_RECALL: f64 = 0.95;

/// The main case: recall of the body's work on its request's lane, and the
/// transaction covering the body.
fn http_layer_alone() {
    const EXPORTS: u64 = 8;
    const STREAMS: u64 = 5;
    let run = run_composition(Composition::HttpLayer, EXPORTS, STREAMS);
    assert_eq!(run.transactions.len() as u64, EXPORTS + STREAMS);
    let by_request = transactions_by_request(&run.transactions, OUR_ORIGIN);
    assert_eq!(by_request.len(), run.transactions.len(), "one per request");
    for tx in &run.transactions {
        assert_eq!(
            tx.pointer("/contexts/trace/status").and_then(Value::as_str),
            Some("ok"),
            "{tx}"
        );
        if let Some(problem) = sentry_profiling_tests::link_problem(tx, &run.chunks) {
            panic!("not linked: {problem}");
        }
    }
    let tx_of = |k, n| by_request.get(&(k, n)).cloned();
    let mut failures = Vec::new();
    for work in [BodyWork::Compression, BodyWork::EventWork] {
        let score = run.score(work, &tx_of);
        println!("http_layer(): {work:?}: {}", score.summary());
        if score.on_lane + score.missed < 20 {
            failures.push(format!(
                "{work:?}: only {} samples",
                score.on_lane + score.missed
            ));
        }
        if score.recall() < MIN_RECALL {
            failures.push(format!("{work:?}: recall {:.4}", score.recall()));
        }
        if score.shown_share() < MIN_RECALL {
            failures.push(format!(
                "{work:?}: {:.4} shown for the transaction",
                score.shown_share()
            ));
        }
        // Every transaction ends after its body's last sample.
        for (&n, &last) in &score.last_on_lane {
            let tx = tx_of(work.client(), n).expect("a transaction");
            if tx.end < last {
                failures.push(format!(
                    "{work:?} request {n}: transaction ends at {:.4}, before its body's sample at {last:.4}",
                    tx.end
                ));
            }
        }
    }
    // A stream's handler returns at once; its transaction lasts at least as
    // long as the stream's waits.
    let min_stream = (EVENTS as u32 * EVENT_GAP).as_secs_f64();
    for n in 0..STREAMS {
        let tx = tx_of(EVENTS_CLIENT, n).expect("a transaction per stream");
        if tx.end - tx.start < min_stream {
            failures.push(format!(
                "stream {n}: a transaction of {:.4} s, shorter than its stream ({min_stream} s at least)",
                tx.end - tx.start
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// With sentry-tower: what each ordering gives (see the README). Streams
/// only (plus two exports, so both requests interleave): a stream's
/// handler returns at once, so whether a transaction covers its body is
/// plain.
fn inside_sentry_tower() {
    const EXPORTS: u64 = 2;
    const STREAMS: u64 = 3;
    let min_stream = (EVENTS as u32 * EVENT_GAP).as_secs_f64();

    // Inside sentry-tower's layers, which make the transactions: one per
    // request, sentry-tower's, finished when the handler's response is
    // ready; the body is still in the request's lane, after the
    // transaction's end.
    let run = run_composition(Composition::InsideTowerTransactions, EXPORTS, STREAMS);
    assert_eq!(
        run.transactions.len() as u64,
        EXPORTS + STREAMS,
        "one per request"
    );
    let by_request = transactions_by_request(&run.transactions, TOWER_ORIGIN);
    assert_eq!(
        by_request.len(),
        run.transactions.len(),
        "all sentry-tower's"
    );
    let tx_of = |k, n| by_request.get(&(k, n)).cloned();
    let score = run.score(BodyWork::EventWork, &tx_of);
    println!(
        "inside sentry-tower's layers making transactions: EventWork: {}",
        score.summary()
    );
    assert!(score.recall() >= MIN_RECALL, "{score:?}");
    assert!(
        score.shown_share() <= 1.0 - MIN_RECALL,
        "sentry-tower's transaction ends before the body: {score:?}"
    );
    assert!(!score.last_on_lane.is_empty(), "stream work was sampled");
    for (&n, &last) in &score.last_on_lane {
        let tx = tx_of(EVENTS_CLIENT, n).expect("a transaction per stream");
        assert!(
            tx.end < last,
            "sentry-tower's transaction ends when the handler returns, before the stream's work at {last}: {tx:?}"
        );
    }

    // Inside sentry-tower's layers, which make no transaction:
    // `http_layer()`'s covers the body.
    let run = run_composition(Composition::InsideTowerNoTransactions, EXPORTS, STREAMS);
    assert_eq!(
        run.transactions.len() as u64,
        EXPORTS + STREAMS,
        "one per request"
    );
    let by_request = transactions_by_request(&run.transactions, OUR_ORIGIN);
    assert_eq!(
        by_request.len(),
        run.transactions.len(),
        "all http_layer()'s"
    );
    let tx_of = |k, n| by_request.get(&(k, n)).cloned();
    let score = run.score(BodyWork::EventWork, &tx_of);
    println!(
        "inside sentry-tower's layers making none: EventWork: {}",
        score.summary()
    );
    assert!(score.recall() >= MIN_RECALL, "{score:?}");
    assert!(score.shown_share() >= MIN_RECALL, "{score:?}");
    for n in 0..STREAMS {
        let tx = tx_of(EVENTS_CLIENT, n).expect("a transaction per stream");
        assert!(tx.end - tx.start >= min_stream, "covers the stream: {tx:?}");
    }

    // Outside sentry-tower's layers, which make transactions: two per
    // request, sentry-tower's (no lane, not linked to the profile) and
    // `http_layer()`'s, which covers the body.
    let run = run_composition(Composition::OutsideTowerTransactions, EXPORTS, STREAMS);
    let ours = transactions_by_request(&run.transactions, OUR_ORIGIN);
    let tower = transactions_by_request(&run.transactions, TOWER_ORIGIN);
    assert_eq!(
        ours.len() as u64,
        EXPORTS + STREAMS,
        "{:#?}",
        run.transactions
    );
    assert_eq!(
        tower.len() as u64,
        EXPORTS + STREAMS,
        "{:#?}",
        run.transactions
    );
    assert!(tower.values().all(|t| t.thread.is_empty()), "{tower:?}");
    for n in 0..STREAMS {
        let tx = &ours[&(EVENTS_CLIENT, n)];
        assert!(tx.end - tx.start >= min_stream, "covers the stream: {tx:?}");
    }
    println!("outside sentry-tower's layers making transactions: two per request");
}
