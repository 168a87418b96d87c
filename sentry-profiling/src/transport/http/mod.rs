//! The crate's own HTTP delivery, used when the client has no transport of
//! its own: the SDK's reqwest transport built with timeouts for what the SDK
//! sends (errors, sessions, logs), and two senders of the crate's own, one
//! for profile chunks and one for transactions.
//!
//! The SDK's transport cannot carry chunks well: its rate limiter does not
//! know the `profile_chunk` category (a raw envelope is only stopped by a
//! limit on all categories), and its HTTP client has no timeouts, so an
//! endpoint that accepts a connection and never answers holds its thread
//! for good. Nor can it carry a transaction's poll totals as Sentry
//! measurements: sentry-types' typed transaction has no `measurements`, and
//! a transaction it gets as raw bytes would slip past the `transaction`
//! rate limit and go uncounted in client reports.
//!
//! Each sender ([`sender`]) has one thread, a queue the caller never waits
//! on, timeouts on every request, and the rate limits of its category.
//! Every item it does not deliver is counted by reason and logged
//! sparingly. A lost chunk is reported to Sentry in a client report with a
//! later chunk; a lost transaction is recorded in the SDK's client report
//! recorder, which the SDK attaches to its next envelope, as with the SDK's
//! own transport.

mod limits;
mod sender;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sentry_core::client_report::{Reason, Recorder};
use sentry_core::protocol::{Envelope, EnvelopeItem};
use sentry_core::{Transport, TransportOptions};

use crate::error::log_throttled;
use crate::session::DeliveryCounters;
use limits::Loss;
use sender::{Bounds, Kind, Sender};

/// Chunks waiting to be sent, at most, and their bytes (a single chunk
/// larger than that is still taken when the queue is empty).
const CHUNK_BOUNDS: Bounds = Bounds {
    items: 8,
    bytes: 64 * 1024 * 1024,
};
/// Transactions waiting to be sent, at most, unless the client's options
/// set `transport_channel_capacity`: about a tenth of a second of a busy
/// service's transactions, to ride out a slow answer.
const DEFAULT_QUEUED_TRANSACTIONS: usize = 1024;
/// The longest time allowed to establish a connection, when the request
/// timeout is longer.
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends profile chunks.
pub(crate) type ChunkSender = Sender<Chunks>;
/// Sends transactions, with their poll totals as measurements.
pub(crate) type TransactionSender = Sender<Transactions>;

/// The client's transport and the crate's two senders.
pub(crate) struct Delivery {
    pub(crate) sdk: Arc<dyn Transport>,
    pub(crate) senders: Senders,
}

/// The crate's two senders.
pub(crate) struct Senders {
    pub(crate) chunks: Arc<ChunkSender>,
    pub(crate) transactions: Arc<TransactionSender>,
}

impl Senders {
    /// Waits for both queues until `deadline`; whether both were emptied.
    pub(crate) fn flush(&self, deadline: std::time::Instant) -> bool {
        let left = || deadline.saturating_duration_since(std::time::Instant::now());
        let transactions = self.transactions.flush(left());
        self.chunks.flush(left()) && transactions
    }

    /// Both take no more; their threads end once their queues are dealt
    /// with.
    pub(crate) fn close(&self) {
        self.chunks.close();
        self.transactions.close();
    }

    /// Shuts both down by `deadline` (see [`Sender::shutdown`]).
    pub(crate) fn shutdown(&self, deadline: std::time::Instant) -> bool {
        let left = || deadline.saturating_duration_since(std::time::Instant::now());
        let transactions = self.transactions.shutdown(left());
        self.chunks.shutdown(left()) && transactions
    }
}

/// Builds the client's transport and the senders from the client's
/// transport options. `timeout` bounds every request.
pub(crate) fn create(
    options: TransportOptions,
    timeout: Duration,
    counters: Arc<DeliveryCounters>,
    profiler_id: Arc<str>,
) -> Delivery {
    let connect_timeout = timeout.min(MAX_CONNECT_TIMEOUT);
    let settings = ClientSettings {
        url: options.dsn.envelope_api_url(),
        auth: options.dsn.to_auth(Some(&options.user_agent)).to_string(),
        http_proxy: options.http_proxy.as_deref().map(str::to_owned),
        https_proxy: options.https_proxy.as_deref().map(str::to_owned),
        accept_invalid_certs: options.accept_invalid_certs,
        timeout,
        connect_timeout,
    };
    let recorder = options.client_report_recorder.clone();
    let queued_transactions = options
        .transport_channel_capacity
        .map_or(DEFAULT_QUEUED_TRANSACTIONS, |n| n.get());
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
    let chunks = Sender::start(Chunks { counters }, CHUNK_BOUNDS, settings.clone());
    let transactions = Sender::start(
        Transactions {
            recorder,
            profiler_id,
            lost: AtomicU64::new(0),
        },
        Bounds {
            items: queued_transactions,
            bytes: usize::MAX,
        },
        settings,
    );
    Delivery {
        sdk,
        senders: Senders {
            chunks,
            transactions,
        },
    }
}

/// Profile chunks, as envelope bytes the chunk thread encoded.
#[derive(Debug)]
pub(crate) struct Chunks {
    counters: Arc<DeliveryCounters>,
}

impl Kind for Chunks {
    type Item = Vec<u8>;
    const THREAD: &'static str = "sentry-profiler-send";
    /// The one Relay assigns to chunks of backend platforms such as `rust`
    /// (`profile_chunk_ui` is for UI platforms, and its limits do not apply
    /// here).
    const CATEGORY: &'static str = "profile_chunk";
    const GZIP_AT: usize = 0;

    fn size(item: &Vec<u8>) -> usize {
        item.len()
    }

    fn body(&self, item: &mut Vec<u8>, unreported: &[u64; 4]) -> Option<Vec<u8>> {
        // A chunk lost on the way is only counted: its bytes are not
        // needed again.
        Some(sender::with_report(
            std::mem::take(item),
            Self::CATEGORY,
            unreported,
        ))
    }

    fn body_while_limited(&self, _: &Vec<u8>) -> Option<Vec<u8>> {
        None
    }

    fn lost(&self, _: Option<&Vec<u8>>, loss: Option<Loss>, why: &str) -> bool {
        let c = &self.counters;
        let counter = match loss {
            Some(Loss::QueueOverflow) => &c.queue_full,
            Some(Loss::NetworkError) => &c.send_failed,
            Some(Loss::SendError) => &c.http_error,
            // A `429` is recorded by the server itself; it is counted here
            // but never reported again.
            Some(Loss::RatelimitBackoff) | None => &c.rate_limited,
        };
        let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
        log_throttled(n, || format!("profile chunk dropped: {why} ({n} so far)"));
        loss.is_some()
    }

    fn delivered(&self) {
        self.counters.delivered.fetch_add(1, Ordering::Relaxed);
    }
}

/// A transaction's envelope, as the SDK made it, with the poll totals
/// handed with it and what the transport still has to do to it.
pub(crate) struct Outgoing {
    pub(crate) envelope: Envelope,
    pub(crate) totals: Option<crate::transaction_tags::PollTotals>,
    pub(crate) link: super::Link,
    /// Whether it is linked to the session's profiler id (the sender's
    /// copy of it).
    pub(crate) linked: bool,
}

/// Transactions: linked (see [`super::Link::prepare_for_writing`]) and
/// serialised on the sender thread, with their `profile` context and poll
/// totals (as measurements) written into the SDK's JSON (see
/// [`crate::transaction_tags::envelope_bytes`]).
pub(crate) struct Transactions {
    recorder: Recorder,
    /// The session's profiler id, for the transactions linked to it: this
    /// thread's copy, so that only it touches its reference count.
    profiler_id: Arc<str>,
    /// Transactions not delivered, for the log.
    lost: AtomicU64,
}

impl Kind for Transactions {
    type Item = Outgoing;
    const THREAD: &'static str = "sentry-transport-tx";
    const CATEGORY: &'static str = "transaction";
    /// Transactions are a few kilobytes: compressing them would cost more
    /// CPU than it saves on a fast link, as the SDK's own transport judges.
    const GZIP_AT: usize = 256 * 1024;

    fn size(_: &Outgoing) -> usize {
        0
    }

    fn body(&self, item: &mut Outgoing, _: &[u64; 4]) -> Option<Vec<u8>> {
        let profiler_id = item.linked.then_some(&*self.profiler_id);
        let envelope = std::mem::replace(&mut item.envelope, Envelope::new());
        item.envelope = item.link.prepare_for_writing(envelope, profiler_id);
        match crate::transaction_tags::envelope_bytes(
            &item.envelope,
            item.totals.as_ref(),
            profiler_id,
            item.link.lane.as_ref(),
        ) {
            Ok(bytes) => Some(bytes),
            Err(e) => {
                self.lost(
                    Some(item),
                    Some(Loss::SendError),
                    &format!("cannot serialise it: {e}"),
                );
                None
            }
        }
    }

    /// The envelope's other items (typically the SDK's client report),
    /// which the `transaction` limit does not stop.
    fn body_while_limited(&self, item: &Outgoing) -> Option<Vec<u8>> {
        let item = &item.envelope;
        let mut rest = Envelope::new().with_headers(item.headers().clone());
        for i in item.items() {
            if !matches!(i, EnvelopeItem::Transaction(_)) {
                rest.add_item(i.clone());
            }
        }
        rest.items().next()?;
        let mut bytes = Vec::new();
        rest.to_writer(&mut bytes).ok()?;
        Some(bytes)
    }

    fn lost(&self, item: Option<&Outgoing>, loss: Option<Loss>, why: &str) -> bool {
        let n = self.lost.fetch_add(1, Ordering::Relaxed) + 1;
        log_throttled(n, || format!("transaction dropped: {why} ({n} so far)"));
        // A `429` (loss `None`) is recorded by Sentry itself.
        let (Some(Outgoing { envelope, .. }), Some(loss)) = (item, loss) else {
            return false;
        };
        let reason = match loss {
            Loss::QueueOverflow => Reason::QueueOverflow,
            Loss::NetworkError => Reason::NetworkError,
            Loss::SendError => Reason::SendError,
            Loss::RatelimitBackoff => Reason::RatelimitBackoff,
        };
        for i in envelope.items() {
            // Only the transactions were lost when the limit stops them;
            // the rest is sent (see `body_while_limited`).
            if loss != Loss::RatelimitBackoff || matches!(i, EnvelopeItem::Transaction(_)) {
                self.recorder.record_lost_data(i, reason);
            }
        }
        false
    }

    fn delivered(&self) {}
}

/// What both HTTP clients are built from.
#[derive(Debug, Clone)]
pub(crate) struct ClientSettings {
    /// Parsed once: reqwest parses a URL given as a string at every
    /// request.
    url: reqwest::Url,
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

    /// The senders' client: timeouts on every request.
    fn async_client(&self) -> Result<reqwest::Client, reqwest::Error> {
        let builder = reqwest::Client::builder()
            .timeout(self.timeout)
            .connect_timeout(self.connect_timeout);
        self.apply_async(builder).build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sender::LINGER;
    use std::time::Instant;

    /// A chunk sender to a loopback port, with `timeout` for connecting
    /// and for each request, and its counters.
    fn chunk_sender(port: u16, timeout: Duration) -> (Arc<ChunkSender>, Arc<DeliveryCounters>) {
        let counters = Arc::new(DeliveryCounters::default());
        let settings = ClientSettings {
            url: format!("http://127.0.0.1:{port}/api/1/envelope/")
                .parse()
                .unwrap(),
            auth: "Sentry sentry_key=public, sentry_version=7".into(),
            http_proxy: None,
            https_proxy: None,
            accept_invalid_certs: false,
            timeout,
            connect_timeout: timeout,
        };
        let sender = ChunkSender::start(
            Chunks {
                counters: Arc::clone(&counters),
            },
            CHUNK_BOUNDS,
            settings,
        );
        (sender, counters)
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
        let (sender, counters) = chunk_sender(port, Duration::from_millis(700));
        let started = Instant::now();
        let mut queued = 0;
        for _ in 0..CHUNK_BOUNDS.items + 4 {
            queued += usize::from(sender.submit(b"{}\n".to_vec()));
        }
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "submitting never waits for the network"
        );
        assert!(queued <= CHUNK_BOUNDS.items + 1, "{queued} queued");
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

    /// A loopback endpoint answering `200` to every request, keeping
    /// connections alive; returns its port.
    fn answering_endpoint() -> u16 {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        // One request: headers, then `content-length` bytes.
                        let request_end = loop {
                            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                let head = String::from_utf8_lossy(&buf[..at]).to_lowercase();
                                let len = head
                                    .lines()
                                    .find_map(|l| l.strip_prefix("content-length:"))
                                    .and_then(|v| v.trim().parse::<usize>().ok())
                                    .unwrap_or(0);
                                if buf.len() >= at + 4 + len {
                                    break at + 4 + len;
                                }
                            }
                            match conn.read(&mut chunk) {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        };
                        buf.drain(..request_end);
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                        if conn.write_all(ok).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        port
    }

    /// After a request the sender lingers without asking for a wake-up:
    /// an item queued then is still sent, a flush sends it before
    /// returning, and an item queued after the sender has parked wakes it.
    #[test]
    fn items_queued_while_the_sender_lingers_are_sent_and_flushed_at_once() {
        let port = answering_endpoint();
        let (sender, counters) = chunk_sender(port, Duration::from_secs(5));
        let delivered = |n: u64, within: Duration| {
            let deadline = Instant::now() + within;
            while counters.delivered.load(Ordering::Relaxed) < n && Instant::now() < deadline {
                std::thread::sleep(Duration::from_micros(200));
            }
            counters.delivered.load(Ordering::Relaxed) >= n
        };
        // The first item wakes the parked sender.
        assert!(sender.submit(b"{}\n".to_vec()));
        assert!(delivered(1, Duration::from_secs(5)), "first item sent");
        // Queued while it lingers: sent when the linger ends, with no
        // wake-up asked for.
        assert!(sender.submit(b"{}\n".to_vec()));
        assert!(
            delivered(2, Duration::from_secs(5)),
            "item queued in the linger sent"
        );
        // Queued while it lingers, then flushed (which cuts the linger
        // short): sent when the flush returns.
        assert!(sender.submit(b"{}\n".to_vec()));
        assert!(sender.flush(Duration::from_secs(5)));
        assert_eq!(counters.delivered.load(Ordering::Relaxed), 3);
        // Parked again (well past the linger): the next item wakes it.
        std::thread::sleep(LINGER * 5);
        assert!(sender.submit(b"{}\n".to_vec()));
        assert!(
            delivered(4, Duration::from_secs(5)),
            "item after parking sent"
        );
        assert!(sender.shutdown(Duration::from_secs(5)));
        assert_eq!(counters.send_failed.load(Ordering::Relaxed), 0);
    }
}
