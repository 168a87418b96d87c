//! End to end over the network: the example service with a real DSN, so the
//! SDK's own HTTP transport (reqwest) carries every envelope, to a small
//! hand-written HTTP/1.1 envelope receiver on loopback. The receiver keeps
//! each request's path, headers and body; the test then checks that the
//! `profile_chunk` items arrived intact (byte lengths, headers, Relay's
//! acceptance rules) and that every transaction links to a received chunk.
//!
//! The receiver runs on its own thread and Tokio runtime, so it keeps
//! answering while the SDK flushes the last chunk at shutdown.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sentry_profiling_tests::{
    decode_body, http_get, link_problem, local_settings, parse_envelope, relay_violations,
    run_example_service, split_items,
};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
struct Received {
    method: String,
    path: String,
    /// Header names lower-cased, values trimmed, in arrival order.
    headers: Vec<(String, String)>,
    /// The body after any transfer decoding (not content decoding).
    body: Vec<u8>,
}

impl Received {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

type Store = Arc<Mutex<Vec<Received>>>;

/// A minimal Sentry envelope endpoint: HTTP/1.1 with keep-alive,
/// `Content-Length` or chunked bodies, every request answered `200 {}`.
struct EnvelopeReceiver {
    addr: SocketAddr,
    store: Store,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl EnvelopeReceiver {
    fn start() -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let store = Store::default();
        let (stop, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server_store = Arc::clone(&store);
        let thread = std::thread::Builder::new()
            .name("envelope-receiver".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                    loop {
                        tokio::select! {
                            _ = &mut stop_rx => break,
                            accepted = listener.accept() => {
                                let (stream, _) = accepted.unwrap();
                                tokio::spawn(serve_connection(stream, Arc::clone(&server_store)));
                            }
                        }
                    }
                });
            })
            .unwrap();
        Self {
            addr,
            store,
            stop,
            thread,
        }
    }

    /// Stops accepting and returns everything received.
    fn finish(self) -> Vec<Received> {
        let _ = self.stop.send(());
        self.thread.join().unwrap();
        std::mem::take(&mut *self.store.lock().unwrap())
    }
}

/// Reads more bytes into `buf`; `None` at end of stream or on error.
async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<()> {
    let mut tmp = [0u8; 64 * 1024];
    match stream.read(&mut tmp).await {
        Ok(0) | Err(_) => None,
        Ok(n) => {
            buf.extend_from_slice(&tmp[..n]);
            Some(())
        }
    }
}

/// Reads until `buf` holds at least `len` bytes.
async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>, len: usize) -> Option<()> {
    while buf.len() < len {
        read_more(stream, buf).await?;
    }
    Some(())
}

/// Position of the first `needle` in `buf`, reading more until it appears.
async fn find(stream: &mut TcpStream, buf: &mut Vec<u8>, needle: &[u8]) -> Option<usize> {
    loop {
        if let Some(p) = buf.windows(needle.len()).position(|w| w == needle) {
            return Some(p);
        }
        read_more(stream, buf).await?;
    }
}

/// Decodes a `Transfer-Encoding: chunked` body (trailers are skipped).
async fn read_chunked(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = find(stream, buf, b"\r\n").await?;
        let line = String::from_utf8_lossy(&buf[..line_end]).into_owned();
        let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
        buf.drain(..line_end + 2);
        if size == 0 {
            loop {
                let end = find(stream, buf, b"\r\n").await?;
                buf.drain(..end + 2);
                if end == 0 {
                    return Some(body);
                }
            }
        }
        fill(stream, buf, size + 2).await?;
        body.extend_from_slice(&buf[..size]);
        buf.drain(..size + 2);
    }
}

async fn serve_connection(mut stream: TcpStream, store: Store) -> Option<()> {
    let mut buf = Vec::new();
    loop {
        let head_end = find(&mut stream, &mut buf, b"\r\n\r\n").await?;
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        buf.drain(..head_end + 4);
        let mut lines = head.split("\r\n");
        let mut request_line = lines.next()?.split(' ');
        let method = request_line.next()?.to_owned();
        let path = request_line.next()?.to_owned();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let header = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        if header("expect").is_some_and(|v| v.eq_ignore_ascii_case("100-continue")) {
            stream
                .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                .await
                .ok()?;
        }
        let body = if header("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
        {
            read_chunked(&mut stream, &mut buf).await?
        } else {
            let len = header("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            fill(&mut stream, &mut buf, len).await?;
            buf.drain(..len).collect()
        };
        let close = header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
        store.lock().unwrap().push(Received {
            method,
            path,
            headers,
            body,
        });
        stream
            .write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
            )
            .await
            .ok()?;
        if close {
            return Some(());
        }
    }
}

#[test]
fn reqwest_transport_carries_profile_chunks_intact() {
    let receiver = EnvelopeReceiver::start();
    let port = receiver.addr.port();
    let mut settings = local_settings("e2e-http");
    settings.dsn = Some(format!("http://public@127.0.0.1:{port}/42"));
    let dir = settings.envelope_dir.clone();

    let responses = run_example_service(&settings, |addr, _shutdown| async move {
        let mut tasks = Vec::new();
        for _round in 0..2 {
            for _ in 0..3 {
                tasks.push(tokio::spawn(http_get(addr, "/work/60")));
                tasks.push(tokio::spawn(http_get(addr, "/sleep/40")));
            }
            tokio::time::sleep(Duration::from_millis(120)).await;
        }
        let mut responses = Vec::new();
        for t in tasks {
            responses.push(t.await.unwrap());
        }
        responses
    });
    // `run_example_service` closed the client: the last chunk was sent and
    // the transport flushed.
    let received = receiver.finish();

    assert_eq!(responses.len(), 12);
    assert!(
        responses.iter().all(|r| r.starts_with("HTTP/1.1 200")),
        "every request succeeded"
    );
    assert!(
        std::fs::read_dir(&dir).map_or(true, |mut d| d.next().is_none()),
        "with a DSN nothing goes to the envelope directory"
    );

    assert!(!received.is_empty(), "the transport sent something");
    for r in &received {
        assert_eq!(r.method, "POST");
        assert_eq!(
            r.path, "/api/42/envelope/",
            "envelope endpoint of project 42"
        );
        let auth = r.header("x-sentry-auth").expect("X-Sentry-Auth header");
        let fields: Vec<&str> = auth
            .trim_start_matches("Sentry ")
            .split(',')
            .map(str::trim)
            .collect();
        assert!(
            fields.contains(&"sentry_key=public"),
            "auth names the DSN's key: {auth}"
        );
        if let Some(len) = r.header("content-length") {
            assert_eq!(
                len.parse::<usize>().ok(),
                Some(r.body.len()),
                "Content-Length matches the body"
            );
        }
    }

    // Chunks come gzip-compressed from the crate's own sender; what the
    // SDK's transport sends is not encoded.
    let bodies: Vec<Vec<u8>> = received
        .iter()
        .map(|r| {
            decode_body(r.header("content-encoding"), &r.body).unwrap_or_else(|| {
                panic!(
                    "body with Content-Encoding {:?} does not decode",
                    r.header("content-encoding")
                )
            })
        })
        .collect();
    assert!(
        received
            .iter()
            .zip(&bodies)
            .any(|(r, b)| r.header("content-encoding") == Some("gzip")
                && parse_envelope(b)
                    .items
                    .iter()
                    .any(|i| i.header["type"] == "profile_chunk")),
        "chunk envelopes are sent gzip-compressed"
    );
    let envelopes: Vec<_> = bodies.iter().map(|b| parse_envelope(b)).collect();
    let (chunks, transactions) = split_items(&envelopes);
    let mut checked_chunks = 0;
    for env in &envelopes {
        for item in env
            .items
            .iter()
            .filter(|i| i.header["type"] == "profile_chunk")
        {
            assert_eq!(
                item.header["platform"], "rust",
                "chunk item header: {}",
                item.header
            );
            assert_eq!(
                item.header["length"].as_u64(),
                Some(item.payload.len() as u64),
                "the whole declared payload arrived"
            );
            let chunk = &chunks[checked_chunks];
            let v = relay_violations(chunk);
            assert!(v.is_empty(), "Relay would reject a chunk: {v:?}");
            assert_eq!(
                env.header.get("event_id").and_then(Value::as_str),
                chunk.payload.get("chunk_id").and_then(Value::as_str),
                "envelope event_id is the chunk id"
            );
            checked_chunks += 1;
        }
    }
    assert!(
        checked_chunks > 0,
        "at least one profile chunk arrived over HTTP"
    );
    assert_eq!(checked_chunks, chunks.len());

    assert_eq!(
        transactions.len(),
        responses.len(),
        "one transaction per request, none lost"
    );
    let names: Vec<&str> = transactions
        .iter()
        .filter_map(|t| t["transaction"].as_str())
        .collect();
    assert_eq!(names.iter().filter(|n| **n == "GET /work/{ms}").count(), 6);
    assert_eq!(names.iter().filter(|n| **n == "GET /sleep/{ms}").count(), 6);
    for tx in &transactions {
        if let Some(problem) = link_problem(tx, &chunks) {
            panic!("transaction not linked to a received chunk: {problem}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
