//! The `tracing` layer: root-span tracking for the trace lifecycle, lanes
//! for async attribution, thread tagging of Sentry transactions and spans,
//! and the per-thread context word that tells each sample which request was
//! running.

use std::cell::RefCell;
use std::marker::PhantomData;

use sentry_core::protocol::Value;
use sentry_core::{Hub, TransactionOrSpan};
use sentry_profiling::attribution::{LaneLink, ThreadAttribution, is_lane, new_lane};
use tracing::Subscriber;
use tracing::field::{Field, Visit};
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

/// The lane a span belongs to: its root span's (see
/// `sentry_profiling::attribution`), set when the span is created.
#[derive(Debug)]
struct SpanLane {
    lane: u64,
    /// The root span's display name (its `otel.name` field, else its name);
    /// only on root spans.
    name: Option<Box<str>>,
}

/// What the layer decided at a span's first entry.
#[derive(Debug, Clone, Copy)]
struct SpanState {
    /// This root span started the profiler (trace lifecycle); it must stop
    /// it when it closes.
    holds_profiler: bool,
    /// This root span registered its lane; it must end it when it closes.
    holds_lane: bool,
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

/// Tags a Sentry transaction or span with the thread its samples are filed
/// under, as Sentry's spec asks, so its UI finds them: the request's lane
/// when lanes are on and `lane` is one, otherwise the current OS thread.
pub(crate) fn tag_with_thread(
    span: &TransactionOrSpan,
    profiler_id: &str,
    lane: u64,
    lane_name: Option<&str>,
) {
    let lanes = sentry_profiling::hooks::attribution() == Some(ThreadAttribution::Lanes);
    let (id, name) = if lanes && is_lane(lane) {
        (lane, lane_name.map(str::to_owned))
    } else {
        (sentry_profiling::current_thread_id(), Some(thread_name()))
    };
    span.set_data("thread.id", Value::String(id.to_string()));
    if let Some(name) = name {
        span.set_data("thread.name", Value::String(name));
    }
    if lanes && is_lane(lane) {
        // For the transport: a request too short for its lane to get two
        // samples is linked by this OS thread instead.
        span.set_data(
            sentry_profiling::OS_THREAD_ID,
            Value::String(sentry_profiling::current_thread_id().to_string()),
        );
        span.set_data(
            sentry_profiling::OS_THREAD_NAME,
            Value::String(thread_name()),
        );
    }
    match span {
        TransactionOrSpan::Span(_) => {
            span.set_data("profiler_id", Value::String(profiler_id.to_owned()));
        }
        TransactionOrSpan::Transaction(_) => {
            if sentry_profiling::hooks::transaction_profiled(lane, lane_name.unwrap_or_default()) {
                span.set_data(
                    sentry_profiling::hooks::TRANSACTION_PROFILE_MARKER,
                    Value::Bool(true),
                );
            }
        }
    }
}

/// Finds a span's `otel.name` field.
struct OtelName(Option<String>);

impl Visit for OtelName {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "otel.name" {
            self.0 = Some(value.to_owned());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "otel.name" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

impl<S> Layer<S> for ProfilingLayer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let lane = match span.parent() {
            Some(parent) => parent.extensions().get::<SpanLane>().map_or(0, |l| l.lane),
            None => {
                let mut name = OtelName(None);
                attrs.record(&mut name);
                let name = name.0.unwrap_or_else(|| attrs.metadata().name().to_owned());
                span.extensions_mut().insert(SpanLane {
                    lane: new_lane(),
                    name: Some(name.into_boxed_str()),
                });
                return;
            }
        };
        span.extensions_mut().insert(SpanLane { lane, name: None });
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        // One look at the extensions on the path every entry takes.
        let (lane, decided) = {
            let ext = span.extensions();
            (
                ext.get::<SpanLane>().map_or(0, |l| l.lane),
                ext.get::<SpanState>().is_some(),
            )
        };
        let prev = sentry_profiling::set_thread_context(lane);
        CONTEXT_STACK.with(|s| s.borrow_mut().push(prev));

        if decided {
            return;
        }
        // First entry: decide once per span.
        let sentry_span = Hub::current().configure_scope(|scope| scope.get_span());
        let mut state = SpanState {
            holds_profiler: false,
            holds_lane: false,
        };
        let ext = span.extensions();
        let lane_name = ext.get::<SpanLane>().and_then(|l| l.name.as_deref());
        let running = sentry_profiling::hooks::running_profiler_id();
        if span.parent().is_none() {
            #[expect(
                deprecated,
                reason = "`true` reliably means the transaction will be sent, which is what the trace lifecycle needs"
            )]
            let sampled = sentry_span.as_ref().is_some_and(|s| s.is_sampled());
            state.holds_profiler = sampled
                && sentry_profiling::hooks::root_span_started(lane, lane_name.unwrap_or_default())
                    .is_some();
            // Either lifecycle: a sampled root span seen while the profiler
            // runs gets its lane.
            if sampled && (state.holds_profiler || running.is_some()) {
                state.holds_lane = true;
                if let Some(s) = &sentry_span {
                    // A child span's trace context is its transaction's: the
                    // link names the transaction, the request's root span.
                    let ctx = s.get_trace_context();
                    sentry_profiling::hooks::lane_started(
                        lane,
                        LaneLink {
                            name: lane_name.unwrap_or_default().into(),
                            trace_id: ctx.trace_id.to_string(),
                            span_id: ctx.span_id.to_string(),
                        },
                    );
                }
            }
        }
        let running = running.or_else(sentry_profiling::hooks::running_profiler_id);
        if let (Some(s), Some(profiler_id)) = (&sentry_span, running) {
            tag_with_thread(s, &profiler_id, lane, lane_name);
        }
        drop(ext);
        span.extensions_mut().insert(state);
    }

    fn on_exit(&self, _id: &Id, _ctx: Context<'_, S>) {
        if let Some(prev) = CONTEXT_STACK.with(|s| s.borrow_mut().pop()) {
            sentry_profiling::set_thread_context(prev);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let ext = span.extensions();
        let Some(state) = ext.get::<SpanState>() else {
            return;
        };
        if state.holds_lane {
            if let Some(l) = ext.get::<SpanLane>() {
                sentry_profiling::hooks::lane_finished(l.lane);
            }
        }
        if state.holds_profiler {
            sentry_profiling::hooks::root_span_finished();
        }
    }
}
