//! The `tracing` layer: root-span tracking for the trace lifecycle, thread
//! tagging of Sentry transactions and spans, and the per-thread context word
//! that tells each sample which span was running.

use std::cell::RefCell;
use std::marker::PhantomData;

use sentry_core::protocol::Value;
use sentry_core::{Hub, TransactionOrSpan};
use tracing::Subscriber;
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

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
        _subscriber: PhantomData,
    }
}

/// See [`layer`].
pub struct ProfilingLayer<S> {
    _subscriber: PhantomData<fn(S)>,
}

impl<S> std::fmt::Debug for ProfilingLayer<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProfilingLayer").finish()
    }
}

/// What the layer remembers about a span (in its extensions).
#[derive(Debug, Clone, Copy)]
struct SpanState {
    /// This root span started the profiler (trace lifecycle) and must stop
    /// it when it closes.
    holds_profiler: bool,
}

thread_local! {
    /// Context words to restore on exit, innermost last.
    static CONTEXT_STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    /// The kernel name of this thread, read once.
    static THREAD_NAME: RefCell<Option<String>> = const { RefCell::new(None) };
}

fn thread_name() -> String {
    THREAD_NAME.with(|n| {
        n.borrow_mut()
            .get_or_insert_with(|| {
                std::fs::read_to_string(format!(
                    "/proc/self/task/{}/comm",
                    sentry_profiling::current_thread_id()
                ))
                .map(|s| s.trim_end().to_owned())
                .unwrap_or_default()
            })
            .clone()
    })
}

/// Tags a Sentry transaction or span with the current thread, as Sentry's
/// spec asks, so its UI finds the samples taken on this thread.
pub(crate) fn tag_with_thread(span: &TransactionOrSpan, profiler_id: &str) {
    span.set_data(
        "thread.id",
        Value::String(sentry_profiling::current_thread_id().to_string()),
    );
    span.set_data("thread.name", Value::String(thread_name()));
    if matches!(span, TransactionOrSpan::Span(_)) {
        span.set_data("profiler_id", Value::String(profiler_id.to_owned()));
    }
}

impl<S> Layer<S> for ProfilingLayer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, _attrs: &Attributes<'_>, _id: &Id, _ctx: Context<'_, S>) {}

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        let prev = sentry_profiling::set_thread_context(id.into_u64());
        CONTEXT_STACK.with(|s| s.borrow_mut().push(prev));

        let Some(span) = ctx.span(id) else { return };
        if span.extensions().get::<SpanState>().is_some() {
            return;
        }
        // First entry: decide once per span.
        let sentry_span = Hub::current().configure_scope(|scope| scope.get_span());
        let mut holds_profiler = false;
        if span.parent().is_none() {
            #[expect(
                deprecated,
                reason = "`true` reliably means the transaction will be sent, which is what the trace lifecycle needs"
            )]
            let sampled = sentry_span.as_ref().is_some_and(|s| s.is_sampled());
            if sampled {
                holds_profiler = sentry_profiling::hooks::root_span_started().is_some();
            }
        }
        if let (Some(s), Some(profiler_id)) =
            (&sentry_span, sentry_profiling::hooks::running_profiler_id())
        {
            tag_with_thread(s, &profiler_id);
        }
        span.extensions_mut().insert(SpanState { holds_profiler });
    }

    fn on_exit(&self, _id: &Id, _ctx: Context<'_, S>) {
        if let Some(prev) = CONTEXT_STACK.with(|s| s.borrow_mut().pop()) {
            sentry_profiling::set_thread_context(prev);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let holds = span
            .extensions()
            .get::<SpanState>()
            .is_some_and(|s| s.holds_profiler);
        if holds {
            sentry_profiling::hooks::root_span_finished();
        }
    }
}
