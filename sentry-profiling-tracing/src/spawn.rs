//! Tokio's spawns, carrying the current span.
//!
//! Every sample says which span its thread had entered (the layer keeps
//! each thread's context word), and a request's lane gathers the samples of
//! its spans. A task started with `tokio::spawn`, or a closure run by
//! `tokio::task::spawn_blocking`, enters no span of its own: its samples
//! belong to no request, and the request's profile shows only `(suspended)`
//! while it waits for that work. Passing the span on (`.instrument(span)`,
//! `span.in_scope(f)`) fixes that; these helpers make it the one-word
//! change from Tokio's own calls.

use crate::ProfiledExt;

/// `tokio::spawn(future)` with the current span entered around every poll
/// of `future`, so its CPU shows in the request's profile, and its wakes
/// noted, so the time it waits for a worker shows as queued (see
/// [`ProfiledExt::profiled`]).
///
/// The span stays open until the task finishes, so a task that outlives the
/// request keeps the request's transaction open (Sentry sends a
/// transaction when its span closes): use plain `tokio::spawn` for
/// background work that should not count as part of the request.
///
/// Panics like `tokio::spawn` outside a Tokio runtime.
pub fn spawn_in_span<F>(future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(future.profiled().offloaded())
}

/// `tokio::task::spawn_blocking(f)` with the current span entered while
/// `f` runs on the blocking pool, so its CPU shows in the request's
/// profile, and the time it waited for a blocking thread shown as queued.
/// The request's transaction gets the time `f` waited to start and ran
/// (`tokio.offloaded_queued`, `tokio.offloaded`).
///
/// Panics like `tokio::task::spawn_blocking` outside a Tokio runtime.
pub fn spawn_blocking_in_span<F, R>(f: F) -> tokio::task::JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    let spawned_ns = sentry_profiling::hooks::wall_ns();
    let span = tracing::Span::current();
    let times = crate::layer::request_times(&span);
    tokio::task::spawn_blocking(move || {
        // From the spawn to the start on a blocking thread, the work was
        // queued; the word the span publishes carries that.
        sentry_profiling::hooks::poll::set_handed_off_worker(spawned_ns);
        let _entered = span.enter();
        sentry_profiling::hooks::poll::set_started(0, 0, false);
        // Its start is read last, right before it: its wait to start is
        // then the pool's and this thread's, not the span's entry.
        // Counted when the closure ends, or unwinds.
        let _ran = times.map(|times| Ran {
            times,
            spawned_ns,
            start_ns: sentry_profiling::hooks::wall_ns(),
        });
        f()
    })
}

/// A closure of [`spawn_blocking_in_span`] running: adds its wait to start
/// and its run to its request's times when it ends.
struct Ran {
    times: std::sync::Arc<sentry_profiling::hooks::RequestTimes>,
    spawned_ns: u64,
    start_ns: u64,
}

impl Drop for Ran {
    fn drop(&mut self) {
        let end_ns = sentry_profiling::hooks::wall_ns();
        self.times.offloaded(
            self.start_ns.saturating_sub(self.spawned_ns),
            end_ns.saturating_sub(self.start_ns),
        );
    }
}
