//! The `tracing` layer: root-span tracking for the trace lifecycle, lanes
//! for async attribution, thread tagging of Sentry transactions and spans,
//! and the per-thread context word that tells each sample which request was
//! running.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::sync::Arc;

use rustc_hash::{FxBuildHasher, FxHashSet};

use sentry_core::protocol::{SpanId, TraceId};
use sentry_core::{Hub, Transaction, TransactionOrSpan};
use sentry_profiling::hooks::{Request, RequestTimes, SessionRef};
use tracing::Subscriber;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

/// The field that marks the root span `http_layer()` opens (the transport
/// removes its Sentry span before sending).
pub(crate) const HTTP_ROOT_FIELD: &str = "sentry_profiling.http_root";

/// Creates the layer. Register it after `sentry_tracing`'s layer, if you use
/// that one, so that it sees the Sentry span of each tracing span:
///
/// ```no_run
/// use tracing_subscriber::prelude::*;
///
/// tracing_subscriber::registry()
///     .with(sentry_profiling_tracing::layer())
///     .init();
/// ```
pub fn layer<S>() -> ProfilingLayer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    ProfilingLayer {
        reach: Reach::of::<S>(),
        _subscriber: PhantomData,
    }
}

/// See [`layer`].
pub struct ProfilingLayer<S> {
    /// How code outside the layer reaches a span's request (see
    /// [`Reach`]).
    reach: Reach,
    _subscriber: PhantomData<fn(S)>,
}

/// What code outside the layer reaches through the subscriber the layer
/// runs in, by type, through `Dispatch::downcast_ref` (as
/// `tracing-opentelemetry` hands out its `WithContext`): the spawn helpers
/// and the middleware reach the request a span belongs to, and hand the
/// layer what they know of a span they just made, without a thread-local
/// hand-off.
#[derive(Clone, Copy)]
struct Reach {
    /// Calls the function it is given with the request of span `id`, if
    /// the span belongs to one.
    request_of: RequestOf,
    /// Gives `http_layer()`'s root span `id` what the middleware knows of
    /// it (see [`hand_http_root`]).
    hand_root: fn(&tracing::Dispatch, &Id, HttpRoot),
}

/// See [`Reach::request_of`].
type RequestOf = fn(&tracing::Dispatch, &Id, &mut dyn FnMut(&Request));

impl Reach {
    /// The functions for subscriber type `S`.
    fn of<S>() -> Self
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        Self {
            request_of: |dispatch, id, f| {
                let Some(subscriber) = dispatch.downcast_ref::<S>() else {
                    return;
                };
                let Some(span) = subscriber.span(id) else {
                    return;
                };
                let Some(root) = span.scope().from_root().next() else {
                    return;
                };
                if let Some(request) = root
                    .extensions()
                    .get::<SpanLane>()
                    .and_then(|l| l.request.as_ref())
                {
                    f(request);
                }
            },
            hand_root: |dispatch, id, root| {
                let Some(span) = dispatch.downcast_ref::<S>().and_then(|s| s.span(id)) else {
                    return;
                };
                let mut ext = span.extensions_mut();
                if ext.get_mut::<SpanLane>().is_some() {
                    // Handed once, right after the span was made.
                    return;
                }
                let request = Request::with_times(root.session, root.times);
                ext.insert(SpanLane {
                    lane: request.lane(),
                    request: Some(request),
                    session: None,
                    name: Some(root.name),
                    transaction: root.transaction,
                    ids: root.ids,
                    entered: false,
                });
            },
        }
    }
}

/// The times of the request `span` belongs to (see
/// `sentry_profiling::hooks::RequestTimes`): `None` outside a request, or
/// for one without a lane, or where the layer is not installed.
pub(crate) fn request_times(span: &tracing::Span) -> Option<Arc<RequestTimes>> {
    let mut times = None;
    span.with_subscriber(|(id, dispatch)| {
        if let Some(reach) = dispatch.downcast_ref::<Reach>() {
            (reach.request_of)(dispatch, id, &mut |request| {
                times = request.times().cloned();
            });
        }
    });
    times
}

impl<S> std::fmt::Debug for ProfilingLayer<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProfilingLayer").finish()
    }
}

/// The lane a span belongs to: its root span's request's (see
/// `sentry_profiling::hooks::Request`), set when the span is created.
#[derive(Debug)]
struct SpanLane {
    lane: u64,
    /// The request a root span stands for (its lane, and what it holds of
    /// the profiler until the span closes); only on root spans.
    request: Option<Request>,
    /// The session a child span's request began in, kept (its request's
    /// one look-up, not repeated for each span); only on child spans.
    session: Option<SessionRef>,
    /// The root span's display name (its `otel.name` field, else its
    /// static name), shared with this thread's other requests of that name
    /// (see [`intern`]); only on root spans.
    name: Option<Arc<str>>,
    /// The Sentry transaction already on the scope when the root span was
    /// created (`sentry-tower`'s, for example, with tower-http's
    /// `TraceLayer` inside it); only on root spans.
    transaction: Option<Transaction>,
    /// That transaction's trace and span ids, when `http_layer()` knew them
    /// (see [`HttpRoot::ids`]); only on root spans.
    ids: Option<(TraceId, SpanId)>,
    /// Whether the layer decided at the span's first entry (see
    /// [`first_entry`]).
    entered: bool,
}

/// The spans entered on one thread that set its context word, innermost
/// last, as tracing-subscriber's registry keeps its span stack: a span's exit
/// removes that span's own entry, wherever it is, so guards dropped out of
/// order, or an exit without an entry here (a span that did not set the
/// word), never restore the wrong word.
#[derive(Debug)]
struct ContextStack {
    /// (span id, the context word it set).
    entries: Vec<(u64, u64)>,
    /// The thread's word before the first of them.
    base: u64,
}

impl ContextStack {
    const fn new() -> Self {
        Self {
            entries: Vec::new(),
            base: 0,
        }
    }

    /// Span `id` set the word to `word`; `previous` was the word before.
    fn push(&mut self, id: u64, word: u64, previous: u64) {
        if self.entries.is_empty() {
            self.base = previous;
        }
        self.entries.push((id, word));
    }

    /// Span `id`'s innermost entry changes its word to `word` (its lane was
    /// refused); returns the word the thread must have now.
    fn replace(&mut self, id: u64, word: u64) -> Option<u64> {
        let entry = self.entries.iter_mut().rev().find(|e| e.0 == id)?;
        entry.1 = word;
        self.entries.last().map(|e| e.1)
    }

    /// Span `id` exited: removes its innermost entry and returns the word
    /// the thread must have now; `None` when `id` is not on the stack
    /// (nothing to change).
    fn pop(&mut self, id: u64) -> Option<u64> {
        let i = self.entries.iter().rposition(|e| e.0 == id)?;
        self.entries.remove(i);
        Some(self.entries.last().map_or(self.base, |e| e.1))
    }

    fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// What `http_layer()` knows of the root span it creates, handed to the
/// layer so that it need not read it back on every request.
pub(crate) struct HttpRoot {
    /// The session the middleware looked up for the request (kept).
    pub(crate) session: SessionRef,
    /// The request's transaction (none when the request runs inside a
    /// span of another one).
    pub(crate) transaction: Option<Transaction>,
    /// The span's `otel.name`, interned (see [`intern`]): the layer would
    /// otherwise format the field again.
    pub(crate) name: Arc<str>,
    /// The transaction's trace and span ids, when known before it started
    /// (no incoming trace, which the SDK may reject and replace): the layer
    /// would otherwise copy the transaction's whole trace context for them.
    pub(crate) ids: Option<(TraceId, SpanId)>,
    /// The times the request measures into once its lane is registered,
    /// which the middleware reads at its end (see
    /// `sentry_profiling::hooks::Request::with_times`).
    pub(crate) times: Arc<RequestTimes>,
}

/// Hands what `http_layer()` knows of the root span it just created to the
/// layer, which makes the span's request of it (see `on_new_span`):
/// straight onto the span, through the subscriber (see [`Reach`]). Nothing
/// happens where the layer is not installed.
pub(crate) fn hand_http_root(span: &tracing::Span, root: HttpRoot) {
    let mut root = Some(root);
    span.with_subscriber(|(id, dispatch)| {
        if let (Some(reach), Some(root)) = (dispatch.downcast_ref::<Reach>(), root.take()) {
            (reach.hand_root)(dispatch, id, root);
        }
    });
}

thread_local! {
    /// The context words of the spans entered on this thread: tracing
    /// calls `on_enter` and `on_exit` on the thread that enters, and the
    /// word is that thread's, so the stack is too.
    static CONTEXT_STACK: RefCell<ContextStack> = const { RefCell::new(ContextStack::new()) };
    /// The root-span names this thread has seen (see [`intern`]).
    static NAMES: RefCell<FxHashSet<Arc<str>>> = const { RefCell::new(FxHashSet::with_hasher(FxBuildHasher)) };
    /// The buffer an `otel.name` field is formatted into before it is
    /// interned (taken out while in use, so a field whose formatting opens
    /// a span of its own finds it empty rather than borrowed).
    static NAME_BUFFER: Cell<String> = const { Cell::new(String::new()) };
}

/// Root-span names kept per thread, at most: past it the set starts over,
/// so a service whose names are unbounded (a route without a template)
/// keeps a bounded set and pays one allocation per name, as without it.
const MAX_INTERNED_NAMES: usize = 512;

/// A root span's name, shared: a request's name goes into its lane link
/// (which the chunk thread keeps until its chunk is written) and is
/// read again at its first entry, and a service has few distinct names, so
/// each thread keeps one copy of each instead of allocating it per request
/// (and having the chunk thread free it).
pub(crate) fn intern(name: &str) -> Arc<str> {
    NAMES.with_borrow_mut(|names| {
        if let Some(n) = names.get(name) {
            return Arc::clone(n);
        }
        if names.len() >= MAX_INTERNED_NAMES {
            names.clear();
        }
        let n: Arc<str> = Arc::from(name);
        names.insert(Arc::clone(&n));
        n
    })
}

/// Finds a span's `otel.name` field, written into `buf`.
struct OtelName<'a> {
    buf: &'a mut String,
    found: bool,
}

impl Visit for OtelName<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "otel.name" {
            self.buf.clear();
            self.buf.push_str(value);
            self.found = true;
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "otel.name" {
            use std::fmt::Write;
            self.buf.clear();
            // Writing into a `String` fails only if the value's own
            // formatting does; whatever it wrote is kept, as `format!`
            // would have panicked instead.
            let _ = write!(self.buf, "{value:?}");
            self.found = true;
        }
    }
}

/// A root span's `otel.name` field, interned; `None` without one.
fn otel_name(attrs: &Attributes<'_>) -> Option<Arc<str>> {
    let mut buf = NAME_BUFFER.take();
    let mut name = OtelName {
        buf: &mut buf,
        found: false,
    };
    attrs.record(&mut name);
    let found = name.found.then(|| intern(&buf));
    NAME_BUFFER.set(buf);
    found
}

/// A request's span entered for the first time (it set the thread's
/// word): decided once per span. A root span seen sampled starts the
/// profiler (trace lifecycle) and registers its lane, or, without a lane,
/// stays on its OS threads (its word 0); then the Sentry span or
/// transaction it runs under is tagged with the profiler and thread (see
/// [`tag_entered`]).
fn first_entry<S>(span: &tracing_subscriber::registry::SpanRef<'_, S>, id: &Id, lane: u64)
where
    S: for<'a> LookupSpan<'a>,
{
    let ext = span.extensions();
    let own = ext.get::<SpanLane>();
    let shared_name = own.and_then(|l| l.name.as_ref());
    let lane_name = shared_name.map(|n| &**n);
    let outer = own.and_then(|l| l.transaction.as_ref());
    // Only `http_layer()`'s root spans carry them (see `HttpRoot`).
    let known_ids = own.and_then(|l| l.ids);
    // The span `http_layer()` opens under its transaction: its own
    // Sentry span (if `sentry-tracing` made one) is removed before
    // sending, so the transaction is all it needs, and reading the
    // scope (which `configure_scope` copies) is spared on every request.
    let http_root = span.metadata().fields().field(HTTP_ROOT_FIELD).is_some();
    let sentry_span = match outer {
        Some(tx) if http_root => Some(TransactionOrSpan::Transaction(tx.clone())),
        _ => Hub::current().configure_scope(|scope| scope.get_span()),
    };
    // Only root spans hold a request.
    let request = own.and_then(|l| l.request.as_ref());
    // The session its request began in (kept since its root span was
    // made, not looked up again).
    let session = match request {
        Some(request) => Some(request.session()),
        None => own.and_then(|l| l.session.as_ref()),
    };
    // Whether the profiler runs; its id is copied only to write it
    // (every thread shares it, and each copy touches its reference
    // count).
    let running = match request {
        Some(request) => start_root(sentry_span.as_ref(), request, shared_name, known_ids),
        None => false,
    };
    // A root span without a registered lane (not sampled, not profiled,
    // or refused because too many requests are in flight) stays on its
    // OS threads: its word is 0, and its later children are left alone.
    let lane = if request.is_some_and(|r| !r.holds_lane()) {
        let word = CONTEXT_STACK.with(|s| s.borrow_mut().replace(id.into_u64(), 0));
        if let Some(word) = word {
            sentry_profiling::hooks::set_thread_context(word);
        }
        0
    } else {
        lane
    };
    if let (Some(s), Some(session)) = (&sentry_span, session)
        && (running || request.is_none())
    {
        tag_entered(session, s, outer, http_root, lane, lane_name);
    }
    drop(ext);
    if let Some(l) = span.extensions_mut().get_mut::<SpanLane>() {
        if lane == 0 {
            l.lane = 0;
        }
        l.entered = true;
    }
}

/// A root span's first entry: begins its request (see
/// `sentry_profiling::hooks::Request::begin`), sampled if the Sentry span
/// or transaction it runs under is. Returns whether the profiler runs.
fn start_root(
    sentry_span: Option<&TransactionOrSpan>,
    request: &Request,
    shared_name: Option<&Arc<str>>,
    known_ids: Option<(TraceId, SpanId)>,
) -> bool {
    #[expect(
        deprecated,
        reason = "`true` reliably means the transaction will be sent, which is what the trace lifecycle needs"
    )]
    let sampled = sentry_span.is_some_and(|s| s.is_sampled());
    let unnamed: Arc<str>;
    let name = match shared_name {
        Some(name) => name,
        None => {
            unnamed = Arc::from("");
            &unnamed
        }
    };
    request.begin(sampled, name, || match (known_ids, sentry_span) {
        (Some(ids), _) => ids,
        // A child span's trace context is its transaction's: the link
        // names the transaction, the request's root span.
        (None, Some(s)) => {
            let ctx = s.get_trace_context();
            (ctx.trace_id, ctx.span_id)
        }
        (None, None) => Default::default(),
    })
}

/// Tags the Sentry span or transaction `s` a request's span was first
/// entered under with the running profiler and the thread (or lane).
/// The span `http_layer()` opens (`http_root`): its transaction is tagged
/// by the middleware, which hands its own transaction's lane to the
/// transport rather than writing it (see `http::body::RequestScope::poll`);
/// its Sentry span, if `sentry-tracing` made one, is removed before sending
/// (it only repeats the transaction). So it needs the profiler id only
/// under a transaction that was already there (`outer`). A root span seen
/// while the profiler did not run is not tagged (the caller's check).
fn tag_entered(
    session: &SessionRef,
    s: &TransactionOrSpan,
    outer: Option<&Transaction>,
    http_root: bool,
    lane: u64,
    lane_name: Option<&str>,
) {
    use crate::tag::{Target, tag};
    if !http_root {
        tag(session, s, Target::Entered, lane, lane_name);
    }
    // The root span is a child of a transaction that was already there
    // (tower-http's `TraceLayer` inside `sentry-tower`): the transaction
    // carries the thread, or Sentry finds no profile. The first such root
    // span of a transaction names it (a handler may open more than one).
    if let (TransactionOrSpan::Span(_), Some(tx)) = (s, outer) {
        let tx = TransactionOrSpan::Transaction(tx.clone());
        tag(session, &tx, Target::Reused, lane, lane_name);
    }
}

impl<S> ProfilingLayer<S> {
    /// A span outside any request entered: while a request's span is
    /// entered on this thread, its samples are not the request's.
    fn enter_outside_requests(&self, id: &Id) {
        CONTEXT_STACK.with(|s| {
            let mut s = s.borrow_mut();
            if !s.is_empty() {
                let prev = sentry_profiling::hooks::set_thread_context(0);
                s.push(id.into_u64(), 0, prev);
            }
        });
    }
}

impl<S> Layer<S> for ProfilingLayer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let lane = match span.parent() {
            // A child of a span outside any request (or of a request whose
            // lane was refused) is left alone: no extension, nothing on entry.
            Some(parent) => match parent.extensions().get::<SpanLane>() {
                Some(l) if l.lane != 0 => {
                    let session = match (&l.request, &l.session) {
                        (Some(request), _) => request.session().keep(),
                        (None, Some(session)) => session.keep(),
                        (None, None) => return,
                    };
                    (l.lane, session)
                }
                _ => return,
            },
            None => {
                let meta = attrs.metadata();
                if meta.fields().field(HTTP_ROOT_FIELD).is_some() {
                    // `http_layer()` hands its root span's request (in the
                    // session it looked up), transaction, name and ids
                    // over right after creating it (see `hand_http_root`),
                    // sparing a second look-up, the copy of the scope
                    // `configure_scope` makes and the formatting of the
                    // name.
                    return;
                }
                let Some(session) = sentry_profiling::hooks::session() else {
                    // No profiling session: nothing to track.
                    return;
                };
                // Only a span that declares `otel.name` is visited.
                let name = if meta.fields().field("otel.name").is_some() {
                    otel_name(attrs)
                } else {
                    None
                };
                // A `sentry-tracing` layer makes this span a child of that
                // transaction, and the child is what the scope holds once
                // the span is entered; Sentry links the transaction by its
                // own `thread.id`, so it is kept to be tagged too.
                let transaction = match Hub::current().configure_scope(|s| s.get_span()) {
                    Some(TransactionOrSpan::Transaction(tx)) => Some(tx),
                    _ => None,
                };
                let request = Request::new(&session);
                span.extensions_mut().insert(SpanLane {
                    lane: request.lane(),
                    request: Some(request),
                    session: None,
                    name: Some(name.unwrap_or_else(|| intern(meta.name()))),
                    transaction,
                    ids: None,
                    entered: false,
                });
                return;
            }
        };
        let (lane, session) = lane;
        span.extensions_mut().insert(SpanLane {
            lane,
            request: None,
            session: Some(session),
            name: None,
            transaction: None,
            ids: None,
            entered: false,
        });
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        // One look at the extensions on the path every entry takes.
        let (lane, decided) = {
            let ext = span.extensions();
            let Some(l) = ext.get::<SpanLane>() else {
                drop(ext);
                // Not part of a request: it only sets the word to 0 if a
                // request's span is entered on this thread.
                self.enter_outside_requests(id);
                return;
            };
            (l.lane, l.entered)
        };
        let set = CONTEXT_STACK.with(|s| {
            let mut s = s.borrow_mut();
            if lane == 0 && s.is_empty() {
                // Not part of a request, and none is entered here: the word
                // stays as it is.
                return false;
            }
            let prev = sentry_profiling::hooks::set_thread_context(lane);
            s.push(id.into_u64(), lane, prev);
            true
        });
        if decided || !set {
            return;
        }
        first_entry(&span, id, lane);
    }

    fn on_exit(&self, id: &Id, _ctx: Context<'_, S>) {
        if let Some(word) = CONTEXT_STACK.with(|s| s.borrow_mut().pop(id.into_u64())) {
            sentry_profiling::hooks::set_thread_context(word);
        }
    }

    // Declared `unsafe` by the trait: the caller casts the pointer back to
    // the type it asked for, so each pointer returned points to a value of
    // exactly the type whose id was asked (here, no unsafe operation).
    unsafe fn downcast_raw(&self, id: std::any::TypeId) -> Option<*const ()> {
        if id == std::any::TypeId::of::<Self>() {
            Some(std::ptr::from_ref(self).cast())
        } else if id == std::any::TypeId::of::<Reach>() {
            Some(std::ptr::from_ref(&self.reach).cast())
        } else {
            None
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        if let Some(request) = span
            .extensions()
            .get::<SpanLane>()
            .and_then(|l| l.request.as_ref())
        {
            request.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ContextStack;

    #[test]
    fn nested_spans_restore_their_parents_word() {
        let mut s = ContextStack::new();
        s.push(1, 10, 0);
        s.push(2, 10, 10);
        s.push(3, 20, 10);
        assert_eq!(s.pop(3), Some(10));
        assert_eq!(s.pop(2), Some(10));
        assert_eq!(s.pop(1), Some(0));
        assert!(s.is_empty());
    }

    #[test]
    fn guards_dropped_out_of_order_keep_the_innermost_word() {
        let mut s = ContextStack::new();
        s.push(1, 10, 7);
        s.push(2, 20, 10);
        // The outer span exits first: the inner one is still entered.
        assert_eq!(s.pop(1), Some(20));
        assert_eq!(s.pop(2), Some(7), "back to the word before both");
    }

    #[test]
    fn an_exit_without_an_entry_changes_nothing() {
        let mut s = ContextStack::new();
        s.push(1, 10, 0);
        assert_eq!(s.pop(5), None, "span 5 never set the word");
        assert_eq!(s.pop(1), Some(0));
        assert_eq!(s.pop(1), None);
    }

    #[test]
    fn a_span_entered_twice_pops_its_innermost_entry() {
        let mut s = ContextStack::new();
        s.push(1, 10, 0);
        s.push(2, 20, 10);
        s.push(1, 10, 20);
        assert_eq!(s.pop(1), Some(20));
        assert_eq!(s.pop(2), Some(10));
        assert_eq!(s.pop(1), Some(0));
    }

    #[test]
    fn a_refused_lane_is_replaced_by_the_os_thread_word() {
        let mut s = ContextStack::new();
        s.push(1, 10, 0);
        assert_eq!(s.replace(1, 0), Some(0));
        assert_eq!(s.replace(9, 0), None);
        assert_eq!(s.pop(1), Some(0));
    }
}
