//! Tower/axum middleware: every request runs inside a root `tracing` span and
//! a Sentry transaction named `METHOD /matched/route`, continuing incoming
//! `sentry-trace`/`baggage` headers and recording the status code.
//!
//! If a transaction already exists when the request is first polled (for
//! example `sentry-tower`'s `SentryHttpLayer` with transactions enabled,
//! placed outside this layer) it is reused: no second transaction.
//!
//! What it records of the request follows `sentry-tower`'s
//! `SentryHttpLayer`, so that moving between the two changes nothing in
//! Sentry: the method; the full URL (scheme `http` unless the request says
//! otherwise, host from the URI or else the `Host` header, path and query),
//! with any user name and password in it replaced; and the headers, less
//! the ones marked sensitive and, unless the client's `send_default_pii`
//! is set, less the ones Sentry counts as personal (cookies,
//! authorization, forwarded addresses). The request goes on the
//! transaction and on events captured while it runs.
//!
//! The root span exists for the profiler; `sentry-tracing` would make it
//! a Sentry child span (`http.request`) repeating the transaction, so it is
//! marked and the integration's transport leaves it out.
//!
//! The transaction's lane is settled before the handler first runs, so a
//! handler that panics in its first poll (with no catch-panic layer, the
//! server drops the request's future as the panic unwinds) still sends a
//! transaction, with status `internal_error`, linked to its samples. The
//! lane of the transaction this middleware started is not written on it:
//! it is handed to the integration's transport with the transaction, which
//! tags it there (see `RequestScope::poll`).
//!
//! The request ends with its response body, not with the handler: the
//! response's body is wrapped in a [`ProfilingBody`], polled inside the
//! root span as the handler's future is, and the root span (the lane) and
//! the transaction end when the body does (see `body.rs`). Layers that
//! rewrite the body (tower-http's compression) must be inside this one for
//! their work to be seen: added to the router before it. A transaction
//! reused from `sentry-tower` is finished by `sentry-tower` when the
//! handler's response is ready, so it does not cover the body; the lane
//! still does.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response, StatusCode};
use sentry_core::protocol::{self, SpanId, SpanStatus, TraceId, Value};
use sentry_core::{Hub, TransactionContext, TransactionOrSpan};
use tower_layer::Layer;
use tower_service::Service;

mod body;

pub use body::ProfilingBody;
use body::RequestScope;

/// The middleware's layer; see [`http_layer`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ProfilingHttpLayer;

/// Creates the middleware layer. With axum, add it with `Router::layer` so it
/// runs after routing and sees the matched route, and after any layer that
/// rewrites the response body (compression), so that layer's work is
/// polled inside the request (see [`ProfilingBody`]):
///
/// ```no_run
/// let app: axum::Router = axum::Router::new()
///     .route("/", axum::routing::get(|| async { "hi" }))
///     .layer(sentry_profiling_tracing::http_layer());
/// ```
pub fn http_layer() -> ProfilingHttpLayer {
    ProfilingHttpLayer
}

impl<S> Layer<S> for ProfilingHttpLayer {
    type Service = ProfilingHttpService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ProfilingHttpService { inner }
    }
}

/// The middleware's service.
#[derive(Debug, Clone)]
pub struct ProfilingHttpService<S> {
    inner: S,
}

/// What the first poll needs to start a transaction.
#[derive(Debug)]
struct Pending {
    name: String,
    route: String,
    method: String,
    request: protocol::Request,
    sentry_trace: Option<String>,
    baggage: Option<String>,
}

/// The request's absolute URL, as a browser would have asked for it: a
/// server sees an origin-form URI (`/path?query`), so the scheme defaults
/// to `http` and the host comes from the `Host` header. `None` without a
/// host, or when the parts do not make a URL.
fn request_url<B>(req: &Request<B>) -> Option<protocol::Url> {
    let mut parts = req.uri().clone().into_parts();
    if parts.scheme.is_none() {
        parts.scheme = Some(http::uri::Scheme::HTTP);
    }
    if parts.authority.is_none() {
        let host = req.headers().get(http::header::HOST)?.as_bytes();
        parts.authority = Some(http::uri::Authority::try_from(host).ok()?);
    }
    if parts.path_and_query.is_none() {
        parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
    }
    let url = http::Uri::from_parts(parts)
        .ok()?
        .to_string()
        .parse()
        .ok()?;
    Some(sentry_core::utils::scrub_pii_from_url(url))
}

/// The request as Sentry records it (see the module documentation).
/// `with_pii`: the client's `send_default_pii`.
fn sentry_request<B>(req: &Request<B>, with_pii: bool) -> protocol::Request {
    let headers = req
        .headers()
        .iter()
        .filter(|(name, value)| {
            !value.is_sensitive()
                && (with_pii || !sentry_core::utils::is_sensitive_header(name.as_str()))
        })
        .filter_map(|(name, value)| Some((name.to_string(), value.to_str().ok()?.to_owned())))
        .collect();
    protocol::Request {
        method: Some(req.method().as_str().to_owned()),
        url: request_url(req),
        headers,
        ..Default::default()
    }
}

fn route_of<B>(req: &Request<B>) -> String {
    #[cfg(feature = "axum")]
    if let Some(path) = req.extensions().get::<axum::extract::MatchedPath>() {
        return path.as_str().to_owned();
    }
    req.uri().path().to_owned()
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for ProfilingHttpService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Response = Response<ProfilingBody<ResBody>>;
    type Error = S::Error;
    type Future = ProfilingHttpFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let route = route_of(&req);
        let method = req.method().as_str().to_owned();
        let name = format!("{method} {route}");
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let with_pii = Hub::current()
            .client()
            .is_some_and(|c| c.options().send_default_pii);
        let pending = Pending {
            name,
            request: sentry_request(&req, with_pii),
            sentry_trace: header("sentry-trace"),
            baggage: header("baggage"),
            route,
            method,
        };
        ProfilingHttpFuture {
            inner: self.inner.call(req),
            pending: Some(pending),
            request: None,
            outer: None,
        }
    }
}

pin_project_lite::pin_project! {
    /// The middleware's response future. Its response's body is a
    /// [`ProfilingBody`], which carries the request on until the body ends.
    pub struct ProfilingHttpFuture<F> {
        #[pin]
        inner: F,
        pending: Option<Pending>,
        // The root span, hub and transaction, from the first poll until
        // the response is ready; then the response's body holds them.
        request: Option<RequestScope>,
        // A transaction that was already on the scope, which its owner
        // finishes when the response is ready.
        outer: Option<TransactionOrSpan>,
    }

    impl<F> PinnedDrop for ProfilingHttpFuture<F> {
        fn drop(this: Pin<&mut Self>) {
            // Dropped before completion: the client went away, or the
            // handler panicked and the server drops the future as the panic
            // unwinds. Finish it so the trace lifecycle and Sentry both see
            // it end; the root span closes first, as on completion.
            if let Some(request) = this.project().request.take() {
                request.end(Some(if std::thread::panicking() {
                    SpanStatus::InternalError
                } else {
                    SpanStatus::Aborted
                }));
            }
        }
    }
}

impl<F> std::fmt::Debug for ProfilingHttpFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProfilingHttpFuture")
            .finish_non_exhaustive()
    }
}

impl<F, ResBody, E> Future for ProfilingHttpFuture<F>
where
    F: Future<Output = Result<Response<ResBody>, E>>,
{
    type Output = Result<Response<ProfilingBody<ResBody>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Some(p) = this.pending.take() {
            let request = start_request(p);
            if request.transaction.is_none() {
                this.outer.clone_from(&request.untagged);
            }
            *this.request = Some(request);
        }
        let Some(request) = this.request.as_mut() else {
            // Polled again after completion: the inner future says what
            // that means.
            return this
                .inner
                .poll(cx)
                .map_ok(|response| response.map(|body| ProfilingBody::new(body, None)));
        };
        let inner = this.inner;
        let poll = request.poll(cx, |cx| inner.poll(cx));
        let Poll::Ready(result) = poll else {
            return Poll::Pending;
        };
        let Some(request) = this.request.take() else {
            unreachable!("the request was there before the poll");
        };
        Poll::Ready(match result {
            Ok(response) => {
                let code = response.status();
                request
                    .span
                    .record("http.response.status_code", code.as_u16());
                if let Some(tx) = &request.transaction {
                    tx.set_data("http.response.status_code", Value::from(code.as_u16()));
                    tx.set_status(map_status(code));
                } else if let Some(outer) = this.outer.take() {
                    // A transaction reused from sentry-tower ends when this
                    // returns: it gets the handler's polls.
                    request.record_polls(&outer);
                }
                // The request goes on while the server polls the body: the
                // body now holds the root span and the transaction, and
                // ends them with it.
                Ok(response.map(|body| ProfilingBody::new(body, Some(request))))
            }
            Err(e) => {
                request.end(Some(SpanStatus::InternalError));
                Err(e)
            }
        })
    }
}

/// The first poll of a request: reuses the transaction on the scope, or
/// starts one, and opens the request's root span.
fn start_request(p: Pending) -> RequestScope {
    // The request's first poll begins now: its transaction starts at this
    // moment, and its parts are counted from it.
    let begun_ns = sentry_profiling::hooks::wall_ns();
    // The request's one look-up of the session, kept for its life (by its
    // scope here, and by its root span's request).
    let session = sentry_profiling::hooks::session().map(|s| s.keep());
    // Its times, shared with its root span's request (see `RequestScope`).
    let times = session
        .as_ref()
        .map(|_| Arc::new(sentry_profiling::hooks::RequestTimes::default()));
    let parent = Hub::current();
    let hub = Arc::new(Hub::new_from_top(&parent));
    // The transaction to tag with the request's thread: ours, or one that
    // was already on the scope (from `sentry-tower`).
    let (untagged, transaction, ids) = match parent.configure_scope(|s| s.get_span()) {
        Some(TransactionOrSpan::Transaction(tx)) => {
            (Some(TransactionOrSpan::Transaction(tx)), None, None)
        }
        Some(TransactionOrSpan::Span(_)) => (None, None, None),
        None => {
            let (tx, ids) = start_transaction(&p, &hub, begun_ns);
            (Some(tx.clone().into()), Some(tx), ids)
        }
    };
    let name = crate::layer::intern(&p.name);
    let root = session.as_ref().zip(times.as_ref());
    let span = root_span(&p, &hub, &name, untagged.as_ref(), ids, root);
    let request = p.request;
    hub.configure_scope(|s| {
        s.add_event_processor(move |mut event| {
            if event.request.is_none() {
                event.request = Some(request.clone());
            }
            Some(event)
        })
    });
    // Wakes and poll totals while a profiling session runs.
    let tracker = session
        .as_ref()
        .map(|s| crate::poll::PollTracker::new(s, true).begun_at(begun_ns));
    RequestScope {
        span,
        hub,
        transaction,
        tracker,
        untagged,
        name,
        lane: None,
        times,
        session,
    }
}

/// Starts the request's transaction on `hub`, continuing the incoming
/// trace; with no incoming trace, also returns its trace and span ids (the
/// SDK starts the transaction with them as they are, where an incoming one
/// it may reject and replace).
fn start_transaction(
    p: &Pending,
    hub: &Arc<Hub>,
    begun_ns: u64,
) -> (sentry_core::Transaction, Option<(TraceId, SpanId)>) {
    let headers = [
        ("sentry-trace", p.sentry_trace.as_deref()),
        ("baggage", p.baggage.as_deref()),
    ];
    let ctx = TransactionContext::continue_from_headers(
        &p.name,
        "http.server",
        headers.iter().filter_map(|(k, v)| Some((*k, (*v)?))),
    );
    let ids =
        (p.sentry_trace.is_none() && p.baggage.is_none()).then(|| (ctx.trace_id(), ctx.span_id()));
    // Started at `begun_ns`, the start of the parts. (The SDK's
    // `Hub::start_transaction_with_timestamp` starts it with the current
    // hub's client; `hub` is made from the current hub, so the client is
    // the same.)
    let start = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(begun_ns);
    let tx = hub.start_transaction_with_timestamp(ctx, start);
    tx.set_origin("auto.http.sentry_profiling");
    tx.set_request(p.request.clone());
    hub.configure_scope(|s| s.set_span(Some(tx.clone().into())));
    (tx, ids)
}

/// Opens the request's root span under the request's hub, so that a
/// `sentry-tracing` layer makes it a child of the transaction instead of a
/// second transaction. That child would only repeat the transaction: it is
/// marked `sentry_profiling.http_root`, and the integration's transport
/// removes it (its children become the transaction's).
fn root_span(
    p: &Pending,
    hub: &Arc<Hub>,
    name: &Arc<str>,
    untagged: Option<&TransactionOrSpan>,
    ids: Option<(TraceId, SpanId)>,
    session: Option<(
        &sentry_profiling::hooks::SessionRef,
        &Arc<sentry_profiling::hooks::RequestTimes>,
    )>,
) -> tracing::Span {
    let span = Hub::run(Arc::clone(hub), || {
        tracing::info_span!(
            parent: None,
            "http.request",
            otel.name = %p.name,
            http.request.method = %p.method,
            http.route = %p.route,
            http.response.status_code = tracing::field::Empty,
            sentry_profiling.http_root = true,
        )
    });
    // Without a session, the layer tracks nothing.
    if let Some((session, times)) = session {
        let transaction = match untagged {
            Some(TransactionOrSpan::Transaction(tx)) => Some(tx.clone()),
            _ => None,
        };
        crate::layer::hand_http_root(
            &span,
            crate::layer::HttpRoot {
                session: session.keep(),
                transaction,
                name: Arc::clone(name),
                ids,
                times: Arc::clone(times),
            },
        );
    }
    span
}

fn map_status(code: StatusCode) -> SpanStatus {
    match code.as_u16() {
        200..=399 => SpanStatus::Ok,
        401 => SpanStatus::Unauthenticated,
        403 => SpanStatus::PermissionDenied,
        404 => SpanStatus::NotFound,
        409 => SpanStatus::AlreadyExists,
        429 => SpanStatus::ResourceExhausted,
        499 => SpanStatus::Cancelled,
        400..=499 => SpanStatus::InvalidArgument,
        501 => SpanStatus::Unimplemented,
        503 => SpanStatus::Unavailable,
        504 => SpanStatus::DeadlineExceeded,
        _ => SpanStatus::InternalError,
    }
}
