//! Getting chunks to Sentry: the `profile_chunk` envelope, the transport
//! wrapper that links transactions to the profiler and flushes the last
//! chunk before the transport stops, the crate's own HTTP delivery (when the
//! client has no transport of its own), and a local envelope-directory sink.

mod envelope_dir;
#[cfg(feature = "http")]
pub(crate) mod http;
mod retention;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sentry_core::protocol::{Context, Envelope, EnvelopeItem};
use sentry_core::{Transport, TransportFactory};

use crate::encode::envelope::chunk_envelope;
use crate::encode::sentry_chunk::EncodedChunk;
use crate::session::Session;
use crate::session::sink::{ChunkSink, Handed};
use crate::transaction_profile::Intercepted;

use crate::transaction_tags::{
    HandedLane, Handover, PollTotals, insert_lane, insert_totals_data, is_profiled, lane_window,
    profile_context, settle_lane, take_handed,
};
pub use crate::transaction_tags::{OS_THREAD_ID, OS_THREAD_NAME};
pub use envelope_dir::EnvelopeDirTransport;

/// The session's sink for chunks: the crate's chunk sender when there is
/// one (it never waits for the network; a full queue drops the chunk and
/// counts it in [`crate::ChunkDrops`]), else the client's transport.
struct SentrySink {
    transport: Arc<dyn Transport>,
    #[cfg(feature = "http")]
    chunks: Option<Arc<http::ChunkSender>>,
}

impl ChunkSink for SentrySink {
    fn send_chunk(&self, chunk: EncodedChunk) -> Handed {
        #[cfg(feature = "http")]
        if let Some(sender) = &self.chunks {
            return if sender.submit(crate::encode::envelope::chunk_envelope_bytes(chunk)) {
                Handed::Taken
            } else {
                Handed::Dropped
            };
        }
        self.transport.send_envelope(chunk_envelope(chunk));
        Handed::Taken
    }

    fn send_envelope(&self, envelope: Envelope) {
        self.transport.send_envelope(envelope);
    }
}

/// The transport a [`ProfilingTransportFactory`] wraps.
pub(crate) enum InnerFactory {
    /// The application's own (or the SDK default, without the `http`
    /// feature): chunks travel through it too.
    Client(Arc<dyn TransportFactory>),
    /// The crate's HTTP delivery, with this request timeout.
    #[cfg(feature = "http")]
    Http(Duration),
}

/// Wraps the client's transport factory (see
/// [`crate::ProfilingIntegration::apply`]).
pub(crate) struct ProfilingTransportFactory {
    pub(crate) inner: InnerFactory,
    pub(crate) runtime: Arc<Session>,
}

impl std::fmt::Debug for ProfilingTransportFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProfilingTransportFactory")
            .finish_non_exhaustive()
    }
}

impl TransportFactory for ProfilingTransportFactory {
    fn create_transport_with_options(
        &self,
        options: sentry_core::TransportOptions,
    ) -> Arc<dyn Transport> {
        let runtime = Arc::clone(&self.runtime);
        match &self.inner {
            InnerFactory::Client(factory) => {
                let inner = factory.create_transport_with_options(options);
                runtime.set_sink(Arc::new(SentrySink {
                    transport: Arc::clone(&inner),
                    #[cfg(feature = "http")]
                    chunks: None,
                }));
                Arc::new(ProfilingTransport {
                    warned_unprofiled: Default::default(),
                    inner,
                    #[cfg(feature = "http")]
                    senders: None,
                    #[cfg(feature = "http")]
                    flush_helpers: Default::default(),
                    runtime,
                })
            }
            #[cfg(feature = "http")]
            InnerFactory::Http(timeout) => {
                let delivery = http::create(
                    options,
                    *timeout,
                    runtime.delivery_counters(),
                    runtime.profiler_id_shared(),
                );
                runtime.set_sink(Arc::new(SentrySink {
                    transport: Arc::clone(&delivery.sdk),
                    chunks: Some(Arc::clone(&delivery.senders.chunks)),
                }));
                Arc::new(ProfilingTransport {
                    warned_unprofiled: Default::default(),
                    inner: delivery.sdk,
                    senders: Some(delivery.senders),
                    flush_helpers: Default::default(),
                    runtime,
                })
            }
        }
    }
}

/// The client's transport, seen through the profiler.
struct ProfilingTransport {
    /// Whether [`UNPROFILED`] has been reported.
    warned_unprofiled: std::sync::atomic::AtomicBool,
    inner: Arc<dyn Transport>,
    /// The chunk and transaction senders, when the crate delivers itself
    /// (transactions with their poll totals as measurements).
    #[cfg(feature = "http")]
    senders: Option<http::Senders>,
    /// Flush helper threads still running (see
    /// [`ProfilingTransport::inner_within`]).
    #[cfg(feature = "http")]
    flush_helpers: Arc<std::sync::atomic::AtomicUsize>,
    runtime: Arc<Session>,
}

/// Most flush helper threads at once: while the endpoint does not answer,
/// each waits up to a request timeout, and an application that flushes
/// every few seconds would otherwise pile them up.
#[cfg(feature = "http")]
const MAX_FLUSH_HELPERS: usize = 2;

/// The warning, given once, when a transaction reaches the transport
/// without a root span the profiler knows while it profiles (see
/// [`ProfilingTransport::warn_if_unprofiled`]).
pub(crate) const UNPROFILED: &str = "has no profiled root span, so no profile is linked to it (with the trace lifecycle the profiler does not even start for it); this happens when only sentry-tower's `SentryHttpLayer` makes transactions: add `sentry_profiling_tracing::http_layer()` to the router inside sentry-tower's layers (the `.layer(...)` call before theirs), or run the request in a `tracing` span (tower-http's `TraceLayer` inside sentry-tower's layers does) with `sentry_profiling_tracing::layer()` registered";

impl ProfilingTransport {
    /// Warns once when a transaction in `envelope` carries no `thread.id`
    /// although the session profiles and it should have one: with the
    /// trace lifecycle (only a profiled root span starts the profiler), or
    /// while the profiler runs (manual lifecycle). Such a setup would
    /// otherwise profile nothing, silently: typically `sentry-tower`'s
    /// transactions with no span the tracing layer sees.
    fn warn_if_unprofiled(&self, envelope: &Envelope) {
        use std::sync::atomic::Ordering;
        if self.warned_unprofiled.load(Ordering::Relaxed) {
            return;
        }
        let expected = self.runtime.lifecycle() == crate::options::ProfileLifecycle::Trace
            || self.runtime.is_running();
        if !expected {
            return;
        }
        let unprofiled = envelope.items().find_map(|i| match i {
            EnvelopeItem::Transaction(t) if !is_profiled(t) => Some(t),
            _ => None,
        });
        if let Some(tx) = unprofiled {
            if !self.warned_unprofiled.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "sentry-profiling: transaction `{}` {UNPROFILED}",
                    tx.name.as_deref().unwrap_or("?")
                );
            }
        }
    }

    /// Flushes or shuts down the inner transport, giving it until
    /// `deadline`.
    ///
    /// The SDK's HTTP transport can wait past its timeout: its flush queues
    /// a marker with a blocking send, which waits for room while the queue
    /// is full behind a request the endpoint does not answer. The crate's
    /// own delivery therefore calls it from a helper thread and stops
    /// waiting at the deadline (the helper ends when the request times
    /// out). While [`MAX_FLUSH_HELPERS`] are still waiting so, the transport
    /// is stuck behind them: a further flush reports failure at once rather
    /// than adding a thread. A transport of the application's own is called
    /// directly.
    fn inner_within(
        &self,
        deadline: Instant,
        op: impl FnOnce(&dyn Transport, Duration) -> bool + Send + 'static,
    ) -> bool {
        let left = deadline.saturating_duration_since(Instant::now());
        #[cfg(feature = "http")]
        if self.senders.is_some() {
            use std::sync::atomic::Ordering;
            let helpers = Arc::clone(&self.flush_helpers);
            let claimed = helpers
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < MAX_FLUSH_HELPERS).then_some(n + 1)
                })
                .is_ok();
            if !claimed {
                return false;
            }
            let inner = Arc::clone(&self.inner);
            let (tx, rx) = std::sync::mpsc::channel();
            let done = Arc::clone(&helpers);
            let spawned = std::thread::Builder::new()
                .name("sentry-profiler-flush".into())
                .spawn(move || {
                    let _ = tx.send(op(&*inner, left));
                    done.fetch_sub(1, Ordering::AcqRel);
                });
            return match spawned {
                Ok(_) => rx.recv_timeout(left).unwrap_or(false),
                Err(_) => {
                    helpers.fetch_sub(1, Ordering::AcqRel);
                    false
                }
            };
        }
        op(&*self.inner, left)
    }
}

impl Transport for ProfilingTransport {
    fn send_envelope(&self, envelope: Envelope) {
        // What was handed with the transaction being finished on this
        // thread (`sentry-profiling-tracing`'s requests): its poll totals,
        // and its lane when it is not tagged with it.
        let carries = carries_transaction(&envelope);
        let Handover { totals, lane } = carries.then(take_handed).flatten().unwrap_or_default();
        if crate::sys::in_forked_child() {
            // No profiler runs in a forked child: nothing to link or attach.
            let link = Link {
                totals,
                ..Link::default()
            };
            self.inner.send_envelope(link.apply(envelope, None));
            return;
        }
        if self.runtime.v1().is_some() {
            // Transaction-based profiling: the chunk thread attaches the
            // profile and sends the envelope on. (No lane is handed: the
            // tracing layer tags these transactions itself.)
            let link = Link {
                totals,
                ..Link::default()
            };
            let unprofiled = match crate::transaction_profile::intercept(link.apply(envelope, None))
            {
                Intercepted::Profile(p) => self.runtime.v1_enqueue(Box::new(p)),
                Intercepted::Pass(envelope) => Some(envelope),
            };
            if let Some(envelope) = unprofiled {
                self.inner.send_envelope(envelope);
            }
            return;
        }
        #[cfg(feature = "http")]
        let sender = self
            .senders
            .as_ref()
            .map(|s| &s.transactions)
            .filter(|_| carries);
        #[cfg(not(feature = "http"))]
        let sender: Option<()> = None;
        // Whether the transaction is linked. The id is lent to `Link` where
        // it is used, never copied: the crate's sender uses its own copy,
        // so no reference count every thread shares is touched here.
        let profiler_id = carries.then(|| self.runtime.profiler_id()).flatten();
        let linked = profiler_id.is_some();
        if linked {
            if lane.is_none() {
                self.warn_if_unprofiled(&envelope);
            }
            // Here, on the thread that finished the transaction, while the
            // lane's samples are still being taken: the chunk thread
            // must know the window before the lane's chunk is written.
            report_lane_windows(&self.runtime, &envelope, lane.as_ref().map(|l| l.id));
        }
        let link = Link {
            lane,
            // The crate's transaction sender writes the totals as
            // measurements; anywhere else they become data. The two
            // long-poll keys are data only.
            totals: totals.filter(|t| sender.is_none() || t.long_polls > 0),
        };
        #[cfg(feature = "http")]
        if let Some(sender) = sender {
            // Linked on the sender's thread, as it writes the transaction.
            sender.submit(http::Outgoing {
                envelope,
                totals,
                link,
                linked,
            });
            return;
        }
        self.inner.send_envelope(link.apply(envelope, profiler_id));
    }

    fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        self.runtime.flush(timeout);
        // The chunk sender works on while the client's transport is waited
        // for, so the two share the time rather than splitting it.
        let flushed = self.inner_within(deadline, |t, left| t.flush(left));
        #[cfg(feature = "http")]
        if let Some(senders) = &self.senders {
            return senders.flush(deadline) && flushed;
        }
        flushed
    }

    fn shutdown(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        self.runtime.shutdown(timeout);
        #[cfg(feature = "http")]
        if let Some(senders) = &self.senders {
            // The last chunk and transactions are queued by now; the
            // senders start on them while the client's transport shuts
            // down.
            senders.close();
        }
        let done = self.inner_within(deadline, |t, left| t.shutdown(left));
        #[cfg(feature = "http")]
        if let Some(senders) = &self.senders {
            return senders.shutdown(deadline) && done;
        }
        done
    }
}

/// Tracing field (and so, through `sentry-tracing`, Sentry span data key)
/// that marks the root span `http_layer()` opens for a request. That span
/// exists for the profiler (it gives the request its lane and drives the
/// trace lifecycle); as a Sentry span it would only repeat the transaction,
/// so the transport removes it (see [`Link::apply`]).
pub(crate) const HTTP_ROOT_SPAN_MARK: &str = "sentry_profiling.http_root";

/// What becomes of a transaction's envelope before it leaves: on the
/// application's thread that finished it, or, with the crate's transaction
/// sender, on the sender's thread (see [`Link::apply`]).
#[derive(Debug, Default)]
pub(crate) struct Link {
    /// The lane handed with the transaction, which it is tagged with.
    pub(crate) lane: Option<HandedLane>,
    /// Poll totals to write as the transaction's data.
    pub(crate) totals: Option<PollTotals>,
}

impl Link {
    /// `envelope`'s transactions tagged with the handed lane (if any),
    /// with the handed totals as data, without the spans marked
    /// [`HTTP_ROOT_SPAN_MARK`] (their children attached to the transaction
    /// itself), and, when profiled (tagged with a `thread.id` by the
    /// tracing layer, or a lane handed) while the session profiles (given
    /// its `profiler_id`), with their thread tags settled and
    /// `contexts.profile.profiler_id` added. The envelope is taken apart
    /// and rebuilt once for all of it, and passes unchanged when there is
    /// nothing to do.
    ///
    /// The transactions stay typed `EnvelopeItem::Transaction`s: the
    /// client's transport (the SDK's, or the application's own) sees them
    /// as transactions, so its rate limiter applies the `transaction`
    /// category to them and counts what it drops in the SDK's client
    /// reports. Nothing is serialised here (see
    /// [`crate::transaction_tags::profile_context`] for how the context
    /// keeps its type without that).
    ///
    /// Transactions keep their lane however short they are: the profiler
    /// thread gives every finished lane at least two samples (Sentry drops
    /// a thread with one), so only the OS-thread keys are removed here (see
    /// [`OS_THREAD_ID`]).
    pub(crate) fn apply(mut self, envelope: Envelope, profiler_id: Option<&str>) -> Envelope {
        self.prepare(envelope, profiler_id, true)
    }

    /// What [`Link::apply`] does, but for the `profile` context, which the
    /// crate's transaction sender writes into the transaction's JSON (see
    /// [`crate::transaction_tags::envelope_bytes`]): its contexts are left
    /// alone. A transaction that has a `profile` context already gets it
    /// replaced here, as [`Link::apply`] does. While the profiler runs, the
    /// handed lane stays in `self` too where the writer can write it (see
    /// [`lane_writable`]).
    #[cfg_attr(
        not(feature = "http"),
        expect(dead_code, reason = "the sender needs `http`")
    )]
    pub(crate) fn prepare_for_writing(
        &mut self,
        envelope: Envelope,
        profiler_id: Option<&str>,
    ) -> Envelope {
        self.prepare(envelope, profiler_id, false)
    }

    fn prepare(&mut self, envelope: Envelope, profiler_id: Option<&str>, insert: bool) -> Envelope {
        let Link { lane, totals } = self;
        let work = lane.is_some()
            || totals.is_some()
            || envelope.items().any(|i| {
                matches!(i, EnvelopeItem::Transaction(t)
                    if has_http_root_span(t) || (profiler_id.is_some() && is_profiled(t)))
            });
        if !work {
            return envelope;
        }
        let totals = totals.take();
        let mut kept = None;
        let envelope = map_transactions(envelope, |tx| {
            if let Some(totals) = &totals {
                insert_totals_data(tx, totals);
            }
            if let Some(handed) = lane.take() {
                if !insert && profiler_id.is_some() && lane_writable(tx) {
                    // The writer tags it as it writes it.
                    kept = Some(handed);
                } else {
                    insert_lane(tx, &handed);
                }
            }
            remove_http_root_spans(tx);
            let profiled = kept.is_some() || is_profiled(tx);
            let Some(id) = profiler_id.filter(|_| profiled) else {
                return;
            };
            settle_lane(tx, Duration::ZERO);
            if insert || tx.contexts.contains_key("profile") {
                tx.contexts
                    .insert("profile".into(), profile_context("profiler_id", id));
            }
        });
        *lane = kept;
        envelope
    }
}

/// Whether the crate's writer can tag `tx` with a lane as it writes it
/// (see [`crate::transaction_tags::envelope_bytes`]): its trace context has
/// data the writer writes the lane's keys into (data left with only the
/// OS-thread keys, which are removed, is not written), and neither of
/// those keys, which would stand after them.
fn lane_writable(tx: &sentry_core::protocol::Transaction<'_>) -> bool {
    matches!(tx.contexts.get("trace"), Some(Context::Trace(t))
        if !t.data.contains_key("thread.id")
            && !t.data.contains_key("thread.name")
            && t.data.keys().any(|k| k != OS_THREAD_ID && k != OS_THREAD_NAME))
}

/// `envelope` with `f` applied to each of its transactions.
fn map_transactions(
    envelope: Envelope,
    mut f: impl FnMut(&mut sentry_core::protocol::Transaction<'static>),
) -> Envelope {
    let mut out = Envelope::new().with_headers(envelope.headers().clone());
    for item in envelope.into_items() {
        match item {
            EnvelopeItem::Transaction(mut tx) => {
                f(&mut tx);
                out.add_item(EnvelopeItem::Transaction(tx));
            }
            other => out.add_item(other),
        }
    }
    out
}

/// Whether `envelope` holds a transaction.
fn carries_transaction(envelope: &Envelope) -> bool {
    envelope
        .items()
        .any(|i| matches!(i, EnvelopeItem::Transaction(_)))
}

/// Whether a transaction holds a span marked [`HTTP_ROOT_SPAN_MARK`].
fn has_http_root_span(tx: &sentry_core::protocol::Transaction<'_>) -> bool {
    tx.spans
        .iter()
        .any(|s| s.data.contains_key(HTTP_ROOT_SPAN_MARK))
}

/// Removes a transaction's spans marked [`HTTP_ROOT_SPAN_MARK`], attaching
/// their children to the transaction itself (see [`Link::apply`]).
fn remove_http_root_spans(tx: &mut sentry_core::protocol::Transaction<'_>) {
    let removed: Vec<_> = tx
        .spans
        .iter()
        .filter(|s| s.data.contains_key(HTTP_ROOT_SPAN_MARK))
        .map(|s| (s.span_id, s.parent_span_id))
        .collect();
    if removed.is_empty() {
        return;
    }
    let root = match tx.contexts.get("trace") {
        Some(Context::Trace(tc)) => Some(tc.span_id),
        _ => None,
    };
    // The marked spans are known by id now: the data of each span is not
    // searched a second time.
    tx.spans
        .retain(|s| !removed.iter().any(|(id, _)| *id == s.span_id));
    for span in &mut tx.spans {
        if let Some((_, parent)) = removed
            .iter()
            .find(|(id, _)| Some(*id) == span.parent_span_id)
        {
            span.parent_span_id = parent.or(root);
        }
    }
}

/// Tells the chunk thread the window of each profiled transaction in
/// `envelope` (its lane `handed` with it, or the lane it is tagged with):
/// the transaction may begin before its lane and end after it (on a busy
/// machine, many milliseconds), and Sentry shows the lane over the
/// transaction's whole window. To this transport's own session, the one
/// its lanes were registered with (never looked up again: after the SDK is
/// initialised again, another one runs).
fn report_lane_windows(session: &Session, envelope: &Envelope, handed: Option<u64>) {
    if crate::sys::in_forked_child() {
        // The chunk thread stayed in the parent: nobody reads the windows.
        return;
    }
    for item in envelope.items() {
        if let EnvelopeItem::Transaction(tx) = item {
            if let Some((lane, start_ns, end_ns)) = lane_window(tx, handed) {
                session.lane_transaction(lane, start_ns, end_ns);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sentry_core::protocol::{Span, SpanId, TraceContext, Transaction, Value};

    fn span(id: SpanId, parent: SpanId, marked: bool) -> Span {
        let mut s = Span {
            span_id: id,
            parent_span_id: Some(parent),
            ..Default::default()
        };
        if marked {
            s.data.insert(HTTP_ROOT_SPAN_MARK.into(), Value::Bool(true));
        }
        s
    }

    /// An envelope holding one transaction with root span `root`, trace
    /// data `data` and `spans`.
    fn envelope_of(root: SpanId, data: &[(&str, &str)], spans: Vec<Span>) -> Envelope {
        let mut trace = TraceContext {
            span_id: root,
            ..Default::default()
        };
        for (k, v) in data {
            trace.data.insert((*k).into(), Value::String((*v).into()));
        }
        let mut tx = Transaction::default();
        tx.contexts
            .insert("trace".into(), Context::Trace(Box::new(trace)));
        tx.spans = spans;
        let mut envelope = Envelope::new();
        envelope.add_item(tx);
        envelope
    }

    /// The (span, parent) pairs of `out`'s transaction.
    fn span_links(out: &Envelope) -> Vec<(SpanId, Option<SpanId>)> {
        let Some(EnvelopeItem::Transaction(tx)) = out.items().next() else {
            panic!("the transaction is kept");
        };
        tx.spans
            .iter()
            .map(|s| (s.span_id, s.parent_span_id))
            .collect()
    }

    #[test]
    fn http_root_span_is_dropped_and_its_children_reparented() {
        let (root, marked, child, grandchild) = (
            SpanId::default(),
            SpanId::default(),
            SpanId::default(),
            SpanId::default(),
        );
        assert!(root != marked && marked != child && child != grandchild);
        let envelope = envelope_of(
            root,
            &[],
            vec![
                span(marked, root, true),
                span(child, marked, false),
                span(grandchild, child, false),
            ],
        );
        let spans = span_links(&Link::default().apply(envelope, None));
        assert_eq!(spans, vec![(child, Some(root)), (grandchild, Some(child))]);
    }

    #[test]
    fn linking_also_drops_the_http_root_span() {
        let (root, marked, child) = (SpanId::default(), SpanId::default(), SpanId::default());
        let envelope = envelope_of(
            root,
            &[("thread.id", "1000000007")],
            vec![span(marked, root, true), span(child, marked, false)],
        );
        let out = Link::default().apply(envelope, Some("0123456789abcdef0123456789abcdef"));
        let spans = span_links(&out);
        let Some(EnvelopeItem::Transaction(tx)) = out.items().next() else {
            panic!("the transaction is kept");
        };
        assert_eq!(spans, vec![(child, Some(root))]);
        assert!(
            matches!(tx.contexts.get("profile"), Some(Context::Other(m)) if m.get("profiler_id").is_some())
        );
    }

    /// A transaction whose lane was handed with it (not tagged on it) is
    /// tagged with it and linked; with no profiler running it is tagged but
    /// not linked.
    #[test]
    fn a_handed_lane_tags_and_links_the_transaction() {
        let lane = || Some(HandedLane { id: 1_000_000_042 });
        let thread = |out: &Envelope| {
            let Some(EnvelopeItem::Transaction(tx)) = out.items().next() else {
                panic!("the transaction is kept");
            };
            let Some(Context::Trace(trace)) = tx.contexts.get("trace") else {
                panic!("the trace context is kept");
            };
            let linked = matches!(tx.contexts.get("profile"),
                Some(Context::Other(m)) if m.get("profiler_id") == Some(&Value::from("0123456789abcdef0123456789abcdef")));
            (
                trace.data.get("thread.id").cloned(),
                trace.data.get("thread.name").cloned(),
                linked,
            )
        };
        // Named as `http_layer()` names a transaction and its lane.
        let named = || {
            let mut envelope = Envelope::new();
            for item in envelope_of(SpanId::default(), &[], vec![]).into_items() {
                if let EnvelopeItem::Transaction(mut tx) = item {
                    tx.name = Some("GET /users/{id}".into());
                    envelope.add_item(EnvelopeItem::Transaction(tx));
                }
            }
            envelope
        };
        let linked = Link {
            lane: lane(),
            totals: None,
        }
        .apply(named(), Some("0123456789abcdef0123456789abcdef"));
        let tagged = (
            Some(Value::from("1000000042")),
            Some(Value::from("GET /users/{id}")),
        );
        assert_eq!(thread(&linked), (tagged.0.clone(), tagged.1.clone(), true));
        let unlinked = Link {
            lane: lane(),
            ..Link::default()
        }
        .apply(named(), None);
        assert_eq!(thread(&unlinked), (tagged.0.clone(), tagged.1, false));
        // A transaction without a name gives its lane none, whoever
        // writes it.
        let id = Some("0123456789abcdef0123456789abcdef");
        let unnamed = Link {
            lane: lane(),
            totals: None,
        }
        .apply(envelope_of(SpanId::default(), &[], vec![]), id);
        assert_eq!(thread(&unnamed), (tagged.0.clone(), None, true));
        let mut sender = Link {
            lane: lane(),
            totals: None,
        };
        let prepared =
            sender.prepare_for_writing(envelope_of(SpanId::default(), &[("k", "v")], vec![]), id);
        assert!(sender.lane.is_some(), "the writer tags it");
        let written = transaction_json(
            &crate::transaction_tags::envelope_bytes(&prepared, None, id, sender.lane.as_ref())
                .unwrap(),
        );
        let trace_data = &written["contexts"]["trace"]["data"];
        assert_eq!(trace_data["thread.id"], "1000000042");
        assert!(trace_data.get("thread.name").is_none(), "{written}");
    }

    #[test]
    fn envelopes_without_the_mark_pass_unchanged() {
        let tx = Transaction {
            spans: vec![span(SpanId::default(), SpanId::default(), false)],
            ..Default::default()
        };
        let mut envelope = Envelope::new();
        envelope.add_item(tx.clone());
        let out = Link::default().apply(envelope, None);
        assert!(
            matches!(out.items().next(), Some(EnvelopeItem::Transaction(t)) if t.spans == tx.spans)
        );
    }

    /// The JSON of the (single) transaction in envelope `bytes`.
    fn transaction_json(bytes: &[u8]) -> serde_json::Value {
        let mut lines = bytes.splitn(3, |b| *b == b'\n');
        lines.next().expect("an envelope header");
        let header: serde_json::Value =
            serde_json::from_slice(lines.next().expect("an item header")).unwrap();
        assert_eq!(header["type"], "transaction");
        let rest = lines.next().expect("a payload");
        let len = header["length"].as_u64().unwrap() as usize;
        assert_eq!(rest.get(len), Some(&b'\n'), "the length is the payload's");
        serde_json::from_slice(&rest[..len]).unwrap()
    }

    /// A transaction made to trip a writer that looked for its keys in the
    /// bytes: `contexts`, `trace` and `data` keys nested in its extra data
    /// (serialised before its contexts), and strings with quotes, braces
    /// and escapes.
    fn awkward_transaction(text: &str, data: &[(&str, &str)], profile: bool) -> Envelope {
        let mut envelope = envelope_of(SpanId::default(), data, vec![]);
        let Some(EnvelopeItem::Transaction(tx)) = envelope.items().next().cloned() else {
            unreachable!()
        };
        let mut tx = *tx;
        tx.name = Some(format!("GET /{text}"));
        let nested = serde_json::json!({"contexts": {"trace": {"data": {}}, "x": text}});
        tx.extra.insert("contexts".into(), nested.clone());
        tx.extra.insert(text.into(), Value::String(text.into()));
        // Inside the transaction's own contexts too, after the trace
        // context: the last `"contexts":{` of the JSON is this one.
        let mut custom = sentry_core::protocol::Map::new();
        custom.insert("contexts".into(), nested);
        tx.contexts
            .insert("zz".into(), sentry_core::protocol::Context::Other(custom));
        tx.tags.insert("t".into(), text.into());
        let mut request = sentry_core::protocol::Request::default();
        request.headers.insert("contexts".into(), text.into());
        request.data = Some(format!("\"contexts\":{{{text}"));
        tx.request = Some(request);
        if profile {
            tx.contexts
                .insert("profile".into(), profile_context("profiler_id", "old"));
        }
        envelope = Envelope::new();
        envelope.add_item(tx);
        envelope
    }

    /// (text, trace data, lane handed, profiler running, profile context
    /// there)
    type Case = (
        &'static str,
        &'static [(&'static str, &'static str)],
        bool,
        bool,
        bool,
    );

    /// What the transaction sender writes (the link added to the SDK's JSON,
    /// see `Link::prepare_for_writing`) reads as what `Link::apply` makes
    /// by inserting into the transaction's maps, for every case the two
    /// paths know: the lane into existing data, into data made for it, or
    /// inserted because its keys are there already; the profile context
    /// alone, with no profiler id, or replacing one that was there.
    #[test]
    fn the_link_written_into_the_json_reads_as_the_one_inserted() {
        let lane = || HandedLane { id: 1_000_000_042 };
        let id: Arc<str> = Arc::from("0123456789abcdef0123456789abcdef");
        let cases: [Case; 9] = [
            ("a", &[("other", "1")], true, true, false),
            ("b", &[], true, true, false),
            ("c", &[("thread.id", "7")], false, true, false),
            (
                "d",
                &[("thread.id", "7"), ("thread.name", "w")],
                true,
                true,
                false,
            ),
            ("e", &[("thread.name", "w")], true, true, false),
            ("f", &[], true, false, false),
            ("g", &[("other", "1")], true, true, true),
            ("h", &[], false, true, false),
            (
                "\"contexts\":{\"trace\":{\\}}\u{2028}",
                &[("k", "\"}")],
                true,
                true,
                false,
            ),
        ];
        for (text, data, handed, running, profile) in cases {
            let link = || Link {
                lane: handed.then(lane),
                totals: None,
            };
            let profiler_id = running.then_some(&*id);
            let base = awkward_transaction(text, data, profile);
            let inserted = link().apply(base.clone(), profiler_id);
            let expected = transaction_json(
                &crate::transaction_tags::envelope_bytes(&inserted, None, None, None).unwrap(),
            );
            let mut sender = link();
            let prepared = sender.prepare_for_writing(base, profiler_id);
            let written = crate::transaction_tags::envelope_bytes(
                &prepared,
                None,
                profiler_id,
                sender.lane.as_ref(),
            )
            .unwrap();
            let got = transaction_json(&written);
            assert_eq!(got, expected, "case {text:?}");
            // The link is there when it should be.
            let linked = running && (handed || data.iter().any(|(k, _)| *k == "thread.id"));
            assert_eq!(
                got["contexts"]["profile"]["profiler_id"] == *id,
                linked,
                "case {text:?}: {got}"
            );
            if linked {
                assert_eq!(got["contexts"]["profile"]["type"], "profile");
            }
            // Nested look-alikes are untouched.
            assert_eq!(
                got["extra"]["contexts"],
                serde_json::json!({"contexts": {"trace": {"data": {}}, "x": text}})
            );
        }
    }
}
