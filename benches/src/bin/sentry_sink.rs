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
            let (transactions, chunks) = if gzip { (0, 1) } else { item_counts(&body) };
            counts
                .transactions
                .fetch_add(transactions, Ordering::Relaxed);
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

/// Transactions and profile chunks in an uncompressed envelope, read from
/// its item headers: each gives its item's type and (usually) its
/// payload's length, so the payloads are skipped rather than scanned. The
/// sink stands in for Sentry, whose work is not the service's: it must not
/// charge the machine more for a larger transaction than the kernel does.
fn item_counts(body: &[u8]) -> (u64, u64) {
    let line_end = |from: usize| {
        body.get(from..)
            .and_then(|rest| rest.iter().position(|&b| b == b'\n'))
            .map_or(body.len(), |i| from + i)
    };
    let (mut transactions, mut chunks) = (0, 0);
    // After the envelope's own header line.
    let mut at = line_end(0) + 1;
    while at < body.len() {
        let end = line_end(at);
        let header = &body[at..end];
        let payload = end + 1;
        if header.is_empty() {
            at = payload;
            continue;
        }
        if contains(header, b"\"type\":\"transaction\"") {
            transactions += 1;
        } else if contains(header, b"\"type\":\"profile_chunk\"") {
            chunks += 1;
        }
        at = match length_of(header) {
            Some(len) => payload.saturating_add(len).saturating_add(1),
            // No length: the payload ends with its line.
            None => line_end(payload) + 1,
        };
    }
    (transactions, chunks)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    find(haystack, needle).is_some()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The `length` an item header gives.
fn length_of(header: &[u8]) -> Option<usize> {
    const KEY: &[u8] = b"\"length\":";
    let from = find(header, KEY)? + KEY.len();
    let digits = header[from..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    std::str::from_utf8(&header[from..from + digits])
        .ok()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::item_counts;

    #[test]
    fn items_are_counted_from_their_headers() {
        let tx = br#"{"name":"\"type\":\"transaction\"","x":"{\"type\":\"profile_chunk\"}"}"#;
        let mut body = b"{\"event_id\":\"e\"}\n".to_vec();
        body.extend_from_slice(
            format!("{{\"type\":\"transaction\",\"length\":{}}}\n", tx.len()).as_bytes(),
        );
        body.extend_from_slice(tx);
        body.extend_from_slice(b"\n{\"type\":\"client_report\"}\n{\"discarded_events\":[]}\n");
        body.extend_from_slice(b"{\"type\":\"profile_chunk\",\"length\":2}\n{}");
        assert_eq!(item_counts(&body), (1, 1));
        assert_eq!(item_counts(b"{}"), (0, 0));
        assert_eq!(
            item_counts(b"{}\n{\"type\":\"transaction\",\"length\":99}\n{}"),
            (1, 0)
        );
    }
}
