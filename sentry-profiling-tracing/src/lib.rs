//! Links Sentry transactions to `sentry-profiling`'s continuous profiles.
//!
//! Two pieces:
//!
//! - [`layer()`], a `tracing_subscriber` layer. It drives the trace
//!   lifecycle (the profiler runs while at least one root span whose Sentry
//!   transaction is sampled is active), tags every Sentry transaction and
//!   span with the `thread.id` / `thread.name` (and `profiler_id`) that
//!   Sentry uses to find their samples (a transaction that was already
//!   there when a root span opened inside it, such as sentry-tower's with
//!   tower-http's `TraceLayer` inside, is tagged too), and keeps each thread's context word
//!   (the entered span) up to date so every sample says which span was
//!   running. Register it after `sentry-tracing`'s `SpanLayer` if you use
//!   that, so it sees each span's Sentry span. The work per span entry and
//!   exit is a thread-local store and a push or pop on a thread-local stack.
//! - [`http_layer()`], tower middleware for axum (or any `http` service):
//!   each request runs in a root span and a Sentry transaction named
//!   `METHOD /matched/route`, continuing incoming `sentry-trace` and
//!   `baggage` headers, with the response status recorded. The request
//!   lasts until its response body has been sent: the body
//!   ([`ProfilingBody`]) is polled inside the request's span, so work done
//!   while sending it (compression inside this layer, streamed bodies) is
//!   in the request's profile. An existing transaction (from
//!   `sentry-tower`) is reused rather than duplicated; `sentry-tower`
//!   finishes it before the body is sent.
//!
//! Work a request hands to another task or to Tokio's blocking pool shows
//! in its profile only if the span goes with it: use [`spawn_in_span`] and
//! [`spawn_blocking_in_span`] (feature `tokio`, on by default) where you
//! would call `tokio::spawn` and `tokio::task::spawn_blocking`. The same
//! holds for OS threads a request starts: [`thread_spawn_in_span`] for
//! `std::thread::spawn`, [`scope_in_span`] for `std::thread::scope`, and
//! [`in_current_span`] / [`with_current_span`] to wrap closures handed to
//! `rayon` (`join`, `scope`, `par_iter().map`) or another pool.
//!
//! ```no_run
//! use tracing_subscriber::prelude::*;
//!
//! # fn options() -> sentry_core::ClientOptions { sentry_core::ClientOptions::new() }
//! // sentry::init(ProfilingIntegration::new()...apply(options)) first; then:
//! tracing_subscriber::registry()
//!     .with(sentry_profiling_tracing::layer())
//!     .init();
//! let app: axum::Router = axum::Router::new()
//!     .route("/", axum::routing::get(|| async { "hello" }))
//!     .layer(sentry_profiling_tracing::http_layer());
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(unsafe_op_in_unsafe_fn)]

mod http;
mod layer;
mod poll;
mod profiled;
#[cfg(feature = "tokio")]
mod spawn;
mod tag;
mod threads;

/// The data keys of an instrumented request's poll totals, on its
/// transaction (and on the child span of a [`ProfiledExt::profiled`]
/// future): why it waited, in milliseconds, and how it was polled.
pub mod data {
    pub use sentry_profiling::hooks::keys::{
        AWAITING, CPU_WAIT, LONG_POLLS, LONGEST_POLL, LONGEST_POLL_START, POLLED, POLLS, QUEUED,
    };
}

pub use http::{
    ProfilingBody, ProfilingHttpFuture, ProfilingHttpLayer, ProfilingHttpService, http_layer,
};
pub use layer::{ProfilingLayer, layer};
pub use profiled::{Profiled, ProfiledExt};
#[cfg(feature = "tokio")]
pub use spawn::{spawn_blocking_in_span, spawn_in_span};
pub use threads::{
    ScopeInSpan, in_current_span, scope_in_span, thread_spawn_in_span, with_current_span,
};
