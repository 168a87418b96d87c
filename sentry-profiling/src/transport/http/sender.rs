//! One sender thread: a bounded queue the caller never waits on, one
//! request at a time with timeouts, the rate limits of one data category,
//! and every item not delivered counted, logged sparingly and reported.
//!
//! What is sent, and how a loss is reported, is the [`Kind`]'s business:
//! profile chunks report their own losses in a client report appended to a
//! later chunk; transactions report theirs through the SDK's client report
//! recorder, as the SDK's own transport does.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use super::ClientSettings;
use super::limits::{Loss, RateLimits, append_client_report};

/// What one sender carries.
pub(crate) trait Kind: Send + Sync + 'static {
    /// An item as queued: encoded on the sender thread, not the caller's.
    type Item: Send + 'static;
    /// The thread's name.
    const THREAD: &'static str;
    /// The data category whose rate limits stop the items.
    const CATEGORY: &'static str;
    /// Bodies at least this long are gzip-compressed.
    const GZIP_AT: usize;
    /// Bytes an item holds while queued (0 when only counted).
    fn size(item: &Self::Item) -> usize;
    /// The request body for `item`, with a client report of `unreported`
    /// losses (indexed like [`Loss::ALL`]) when the kind reports its own.
    /// What it leaves of `item` is what [`Kind::lost`] sees if the request
    /// fails.
    fn body(&self, item: &mut Self::Item, unreported: &[u64; 4]) -> Option<Vec<u8>>;
    /// The body to send instead while the category is rate limited: what
    /// of `item` the limit does not stop, if anything.
    fn body_while_limited(&self, item: &Self::Item) -> Option<Vec<u8>>;
    /// Counts and logs one item not delivered; `loss` is `None` when
    /// Sentry dropped it (and so recorded it itself). Returns whether the
    /// loss waits for the kind's own client report.
    fn lost(&self, item: Option<&Self::Item>, loss: Option<Loss>, why: &str) -> bool;
    /// Counts one item delivered.
    fn delivered(&self);
}

/// The sender's state, behind one lock.
struct Queue<T> {
    items: VecDeque<T>,
    bytes: usize,
    /// A request is in flight.
    busy: bool,
    /// No more items are taken; the thread ends once the queue is empty.
    closed: bool,
    /// Shutdown ran out of time: what is still queued is dropped unsent.
    abandoned: bool,
    /// Losses not yet reported to Sentry, indexed like [`Loss::ALL`].
    unreported: [u64; 4],
    /// Callers waiting in [`Sender::flush`]: only they need telling that
    /// an item was dealt with.
    flushing: usize,
    /// The thread waits for an item, and the next one queued must wake it
    /// (see [`Shared::next`]).
    parked: bool,
}

/// How long the thread waits after a request before it looks at the queue
/// again, without asking callers for a wake-up: items queued meanwhile are
/// found then, and the callers that queued them (an application's threads)
/// make no system call. At thousands of transactions a second the thread
/// wakes about a hundred times a second instead of once per transaction,
/// and no item waits longer than this for its request to start.
pub(super) const LINGER: Duration = Duration::from_millis(10);

/// How much a queue holds at most: `items`, and `bytes` (a single item
/// larger than that is still taken when the queue is empty).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub(crate) items: usize,
    pub(crate) bytes: usize,
}

struct Shared<K: Kind> {
    kind: K,
    bounds: Bounds,
    queue: Mutex<Queue<K::Item>>,
    /// Signalled when an item is queued or the sender is closed.
    work: Condvar,
    /// Signalled when an item has been dealt with.
    progress: Condvar,
}

impl<K: Kind> Shared<K> {
    fn lock(&self) -> MutexGuard<'_, Queue<K::Item>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops everything queued, each counted as lost for `why`.
    fn drop_queued(&self, queue: &mut Queue<K::Item>, why: &str) {
        while let Some(item) = queue.items.pop_front() {
            queue.bytes -= K::size(&item);
            self.lost(queue, Some(&item), Some(Loss::NetworkError), why);
        }
    }

    /// Counts, logs and remembers (for the next client report) one item
    /// that was not delivered.
    fn lost(
        &self,
        queue: &mut Queue<K::Item>,
        item: Option<&K::Item>,
        loss: Option<Loss>,
        why: &str,
    ) {
        if self.kind.lost(item, loss, why) {
            if let Some(i) = loss.and_then(|l| Loss::ALL.iter().position(|a| *a == l)) {
                queue.unreported[i] += 1;
            }
        }
    }
}

/// Sends one kind of envelope to the DSN's envelope endpoint from a thread
/// of its own.
pub(crate) struct Sender<K: Kind> {
    shared: Arc<Shared<K>>,
}

impl<K: Kind> std::fmt::Debug for Sender<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("thread", &K::THREAD)
            .finish_non_exhaustive()
    }
}

impl<K: Kind> Sender<K> {
    pub(crate) fn start(kind: K, bounds: Bounds, settings: ClientSettings) -> Arc<Self> {
        let shared = Arc::new(Shared {
            kind,
            bounds,
            queue: Mutex::new(Queue {
                items: VecDeque::new(),
                bytes: 0,
                busy: false,
                closed: false,
                abandoned: false,
                unreported: [0; 4],
                flushing: 0,
                parked: false,
            }),
            work: Condvar::new(),
            progress: Condvar::new(),
        });
        let worker = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name(K::THREAD.into())
            .spawn(move || run(&worker, &settings));
        if let Err(e) = spawned {
            eprintln!(
                "sentry-profiling: cannot start the {} thread: {e}",
                K::THREAD
            );
            shared.lock().closed = true;
        }
        Arc::new(Self { shared })
    }

    /// Queues an item; never waits for the network. Returns whether it was
    /// queued (a full queue drops it, counted).
    pub(crate) fn submit(&self, item: K::Item) -> bool {
        let shared = &self.shared;
        let mut q = shared.lock();
        let size = K::size(&item);
        let refused = if q.closed {
            Some((Loss::NetworkError, "the sender is shut down"))
        } else if q.items.len() >= shared.bounds.items
            || (!q.items.is_empty() && q.bytes + size > shared.bounds.bytes)
        {
            Some((
                Loss::QueueOverflow,
                "the send queue is full (the endpoint is slow or unreachable)",
            ))
        } else {
            None
        };
        if let Some((loss, why)) = refused {
            shared.lost(&mut q, Some(&item), Some(loss), why);
            return false;
        }
        // The thread asks for a wake-up only when it has found the queue
        // empty after lingering (see `Shared::next`); otherwise it is
        // sending, or lingering, and finds this item without a wake-up (a
        // system call) from here. Only the first item after it parked
        // wakes it.
        let wake = std::mem::take(&mut q.parked);
        q.bytes += size;
        q.items.push_back(item);
        drop(q);
        if wake {
            shared.work.notify_one();
        }
        true
    }

    /// Waits until every queued item has been dealt with, at most
    /// `timeout`. Returns whether it was.
    pub(crate) fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut q = self.shared.lock();
        q.flushing += 1;
        if !q.items.is_empty() {
            // Cuts a linger short.
            self.shared.work.notify_one();
        }
        let done = loop {
            if !q.busy && q.items.is_empty() {
                break true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break false;
            }
            q = self
                .shared
                .progress
                .wait_timeout(q, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        };
        q.flushing -= 1;
        done
    }

    /// Takes no more items; the thread ends once it has dealt with the
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
            self.shared
                .drop_queued(&mut q, "not sent before the shutdown timeout");
        }
        done
    }
}

/// The sender thread: takes items one at a time until closed.
fn run<K: Kind>(shared: &Shared<K>, settings: &ClientSettings) {
    // Built (and dropped) on this thread: a runtime must not be dropped
    // inside another, and `sentry::init` may run in one.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!(
                "sentry-profiling: cannot start the {} thread: {e}",
                K::THREAD
            );
            let mut q = shared.lock();
            q.closed = true;
            shared.drop_queued(&mut q, "no sender thread");
            shared.progressed(&q);
            return;
        }
    };
    let http = match settings.async_client() {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!(
                "sentry-profiling: cannot build the HTTP client for the {} thread: {e}",
                K::THREAD
            );
            None
        }
    };
    // One `block_on` for the thread's life, as the SDK's own transport
    // does: waiting for work blocks the thread (nothing else runs on this
    // runtime between requests), and a request enters no runtime anew.
    runtime.block_on(serve(shared, settings, http.as_ref()));
}

/// The sender's loop (see [`run`]).
async fn serve<K: Kind>(
    shared: &Shared<K>,
    settings: &ClientSettings,
    http: Option<&reqwest::Client>,
) {
    let mut limits = RateLimits::new(K::CATEGORY);
    let mut done: Option<Done<K::Item>> = None;
    loop {
        let next = shared.next(done.as_ref(), &limits);
        // An item kept for its loss to be counted is dropped here, outside
        // the lock callers queue under.
        drop(done.take());
        let Some(Next {
            mut item,
            limited,
            reported,
        }) = next
        else {
            return;
        };
        let body = match limited {
            Some(_) => shared.kind.body_while_limited(&item),
            None => shared.kind.body(&mut item, &reported),
        };
        let outcome = match (http, body) {
            (_, None) => Outcome::Skipped,
            (Some(http), Some(body)) => post(http, settings, body, K::GZIP_AT, &mut limits).await,
            (None, Some(_)) => Outcome::Failed("no HTTP client".into()),
        };
        let lost = limited.is_none()
            && matches!(
                outcome,
                Outcome::RateLimited { .. } | Outcome::Status(_) | Outcome::Failed(_)
            );
        done = Some(Done {
            // Delivered: dropped now, outside the lock.
            item: lost.then_some(item),
            limited: limited.is_some(),
            reported,
            outcome,
        });
    }
}

/// An item taken from the queue to be sent.
struct Next<T> {
    item: T,
    /// The time left of a rate limit on the category, if any: the item
    /// itself is not sent (and counted as such), only what the limit lets
    /// through.
    limited: Option<Duration>,
    /// Losses reported with it (see [`Kind::body`]).
    reported: [u64; 4],
}

/// What became of the item sent last.
struct Done<T> {
    /// The item, when its loss is still to be counted.
    item: Option<T>,
    /// It was counted as rate limited when taken.
    limited: bool,
    reported: [u64; 4],
    outcome: Outcome,
}

impl<K: Kind> Shared<K> {
    /// Counts what became of the item sent last, if any, then waits for
    /// the next item to send (one lock for both): after a request, first
    /// [`LINGER`] without asking for a wake-up, then, the queue still
    /// empty, until the next item queued wakes it. `None` once closed and
    /// empty.
    fn next(&self, done: Option<&Done<K::Item>>, limits: &RateLimits) -> Option<Next<K::Item>> {
        let mut q = self.lock();
        let mut linger = done.is_some();
        if let Some(done) = done {
            self.settle(&mut q, done);
        }
        loop {
            if linger && q.items.is_empty() && !q.closed {
                // Callers do not wake the thread now (see `LINGER`); a
                // flush or a shutdown does.
                q = self
                    .work
                    .wait_timeout(q, LINGER)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            linger = false;
            while q.items.is_empty() && !q.closed {
                q.parked = true;
                q = self.work.wait(q).unwrap_or_else(|e| e.into_inner());
            }
            q.parked = false;
            let item = q.items.pop_front()?;
            q.bytes -= K::size(&item);
            if q.abandoned {
                self.lost(
                    &mut q,
                    Some(&item),
                    Some(Loss::NetworkError),
                    "not sent before the shutdown timeout",
                );
                self.progressed(&q);
                continue;
            }
            let limited = limits.limited(Instant::now());
            if let Some(left) = limited {
                let why = format!("rate limited by Sentry for another {} s", left.as_secs());
                self.lost(&mut q, Some(&item), Some(Loss::RatelimitBackoff), &why);
            }
            q.busy = true;
            return Some(Next {
                item,
                limited,
                reported: q.unreported,
            });
        }
    }

    /// Tells flushers, if any, that an item was dealt with.
    fn progressed(&self, q: &Queue<K::Item>) {
        if q.flushing > 0 {
            self.progress.notify_all();
        }
    }

    /// Counts what became of an item's request.
    fn settle(&self, q: &mut Queue<K::Item>, done: &Done<K::Item>) {
        q.busy = false;
        let report_sent = |q: &mut Queue<K::Item>| {
            for (u, r) in q.unreported.iter_mut().zip(done.reported) {
                *u = u.saturating_sub(r);
            }
        };
        let item = done.item.as_ref();
        match &done.outcome {
            Outcome::Skipped => {}
            // The item itself was counted as rate limited when taken; what
            // was sent instead took no report.
            _ if done.limited => {}
            Outcome::Delivered => {
                self.kind.delivered();
                report_sent(q);
            }
            Outcome::RateLimited { report_accepted } => {
                if *report_accepted {
                    report_sent(q);
                }
                self.lost(q, item, None, "rate limited by Sentry");
            }
            Outcome::Status(status) => {
                let why = format!("Sentry answered HTTP {status}");
                self.lost(q, item, Some(Loss::SendError), &why);
            }
            Outcome::Failed(e) => {
                let why = format!("request failed: {e}");
                self.lost(q, item, Some(Loss::NetworkError), &why);
            }
        }
        self.progressed(q);
    }
}

/// What became of one request.
#[derive(Debug)]
enum Outcome {
    Delivered,
    /// Nothing was left to send.
    Skipped,
    /// Sentry dropped the item for a rate limit: a `429`, or a `2xx` (the
    /// envelope's client report was taken) whose rate limits name the
    /// category.
    RateLimited {
        report_accepted: bool,
    },
    Status(u16),
    Failed(String),
}

/// Posts one envelope and learns the rate limits from the answer.
async fn post(
    http: &reqwest::Client,
    settings: &ClientSettings,
    body: Vec<u8>,
    gzip_at: usize,
    limits: &mut RateLimits,
) -> Outcome {
    let request = http
        .post(settings.url.clone())
        .header("X-Sentry-Auth", &settings.auth)
        .header("Content-Type", "application/x-sentry-envelope");
    // Chunk JSON repeats itself (sample records, frame records): gzip makes
    // it about ten times smaller, for a few milliseconds of this thread's
    // CPU per megabyte. Relay decodes `Content-Encoding: gzip`.
    let request = match (body.len() >= gzip_at).then(|| gzip(&body)).flatten() {
        Some(compressed) => request.header("Content-Encoding", "gzip").body(compressed),
        None => request.body(body),
    };
    let answer = async {
        let response = request.send().await?;
        let status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let rate_limits = header("x-sentry-rate-limits");
        let retry_after = header("retry-after");
        // Reading the (small) body lets the connection be reused; it is
        // bounded by the request timeout like the rest of the exchange.
        let _ = response.bytes().await;
        Ok::<_, reqwest::Error>((status, rate_limits, retry_after))
    }
    .await;
    let (status, rate_limits, retry_after) = match answer {
        Ok(a) => a,
        Err(e) => return Outcome::Failed(error_chain(&e)),
    };
    let now = Instant::now();
    limits.update(status, rate_limits.as_deref(), retry_after.as_deref(), now);
    match status {
        // Relay accepts an envelope whose other items pass and names the
        // limits it applied: a limit on the category means this item was
        // dropped.
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

/// Appends a client report of `counts` losses of `category` to `body`
/// (see [`append_client_report`]), stamped now.
pub(crate) fn with_report(mut body: Vec<u8>, category: &str, counts: &[u64; 4]) -> Vec<u8> {
    append_client_report(&mut body, category, counts, SystemTime::now());
    body
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
