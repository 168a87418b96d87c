//! A Sentry envelope endpoint for cost benchmarks: answers `200 {}` to every
//! request on a loopback port, with keep-alive (as Sentry does, so the SDK's
//! transport reuses its connection), and counts what it received.
//!
//! `sentry_sink <port>`; `GET /count` answers `<envelopes> <transactions>
//! <chunks> <bytes>` (a gzipped body counts as one chunk: only the
//! profiler's chunk sender compresses). It runs in a process of its own, so the measured
//! service pays only for sending, as it would in production. Runs until
//! killed.

use std::io::{BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sentry_profiling_benches::{Http1Headers, read_headers, read_line};

#[derive(Default)]
struct Counts {
    envelopes: AtomicU64,
    transactions: AtomicU64,
    chunks: AtomicU64,
    bytes: AtomicU64,
}

fn main() {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(3399);
    let listener = match TcpListener::bind(("127.0.0.1", port)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("sentry_sink: cannot bind 127.0.0.1:{port}: {e}");
            std::process::exit(1);
        }
    };
    let counts = Arc::new(Counts::default());
    for stream in listener.incoming().flatten() {
        let counts = Arc::clone(&counts);
        let _ = std::thread::Builder::new()
            .name("sink-conn".into())
            .spawn(move || serve(stream, &counts));
    }
}

/// Serves one keep-alive connection until the client closes it.
fn serve(stream: TcpStream, counts: &Counts) {
    let _ = stream.set_nodelay(true);
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    let mut body = Vec::new();
    loop {
        if !read_line(&mut reader, &mut line) {
            return;
        }
        let is_count = line.starts_with("GET /count");
        // Only the profiler's chunk sender compresses.
        let Some(Http1Headers {
            content_length: len,
            gzip,
        }) = read_headers(&mut reader, &mut line)
        else {
            return;
        };
        body.resize(len, 0);
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let answer = if is_count {
            format!(
                "{} {} {} {}",
                counts.envelopes.load(Ordering::Relaxed),
                counts.transactions.load(Ordering::Relaxed),
                counts.chunks.load(Ordering::Relaxed),
                counts.bytes.load(Ordering::Relaxed)
            )
        } else {
            counts.envelopes.fetch_add(1, Ordering::Relaxed);
            counts.bytes.fetch_add(len as u64, Ordering::Relaxed);
            let has = |kind: &[u8]| body.windows(kind.len()).filter(|w| *w == kind).count() as u64;
            counts
                .transactions
                .fetch_add(has(b"\"type\":\"transaction\""), Ordering::Relaxed);
            let chunks = if gzip {
                1
            } else {
                has(b"\"type\":\"profile_chunk\"")
            };
            counts.chunks.fetch_add(chunks, Ordering::Relaxed);
            "{}".to_owned()
        };
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{answer}",
            answer.len()
        );
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}
