//! OS threads a request starts, carrying the current span.
//!
//! Work a handler fans out to threads of its own (`std::thread::spawn`,
//! `std::thread::scope`, a `rayon` join or scope, a crossbeam scope) runs
//! in no span: the request's profile shows only its wait for the threads
//! (a `join`), and their CPU time is on their own OS threads. These helpers
//! enter the span current where they are called on the new threads while
//! the work runs, as [`spawn_blocking_in_span`](crate::spawn_blocking_in_span)
//! does for Tokio's blocking pool, so the work's samples are filed under
//! the request. Threads that outlive the request, and work handed to
//! threads without them, stay on their OS threads (a thread that lives
//! between two listings of the thread list is on the shared timeline of
//! its name's short-lived threads): visible, but not in the request.
//!
//! The span stays open while a thread holds it: a thread that outlives
//! the request keeps the request's transaction open.

use tracing::Span;

/// `std::thread::spawn(f)` with the current span entered while `f` runs on
/// the new thread, so its CPU shows in the request's profile, and the time
/// from the call to the thread's start shown as queued.
///
/// Panics like `std::thread::spawn` when the thread cannot be created.
pub fn thread_spawn_in_span<F, T>(f: F) -> std::thread::JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    std::thread::spawn(in_current_span(f))
}

/// `f`, made to run in the span current now, wherever it is called (on
/// another thread: a `rayon::spawn` or `rayon::join` closure, a crossbeam
/// scope's thread, a thread pool of a library), with the time from now to
/// its start shown as queued.
///
/// ```
/// use sentry_profiling_tracing::in_current_span;
///
/// let (a, b) = std::thread::scope(|s| {
///     let a = s.spawn(in_current_span(|| 1 + 1));
///     let b = s.spawn(in_current_span(|| 2 + 2));
///     (a.join().unwrap(), b.join().unwrap())
/// });
/// assert_eq!((a, b), (2, 4));
/// ```
pub fn in_current_span<F, T>(f: F) -> impl FnOnce() -> T + Send
where
    F: FnOnce() -> T + Send,
{
    in_span(Span::current(), f)
}

/// `f`, made to run in `span`, with the time from now to its start shown
/// as queued.
fn in_span<F, T>(span: Span, f: F) -> impl FnOnce() -> T + Send
where
    F: FnOnce() -> T + Send,
{
    let handed_ns = sentry_profiling::hooks::wall_ns();
    move || {
        // From the hand-over to the start on the other thread, the work
        // was queued; the word the span publishes carries that. The work
        // is offloaded: its waits for a CPU are not the future's own polls'.
        sentry_profiling::hooks::poll::set_handed_off_worker(handed_ns);
        let _entered = span.enter();
        sentry_profiling::hooks::poll::set_started(0, 0, false);
        f()
    }
}

/// `f`, a function called once per item (rayon's `par_iter().map(f)`,
/// `for_each`), made to run each call in the span current now, on whatever
/// thread calls it. Each call enters and leaves the span (a few
/// microseconds with the layers): give it items of more work than that.
///
/// ```
/// use sentry_profiling_tracing::with_current_span;
///
/// let square = with_current_span(|x: u64| x * x);
/// let squares: Vec<u64> = std::thread::scope(|s| {
///     let square = &square;
///     let handles: Vec<_> = (1..=3).map(|x| s.spawn(move || square(x))).collect();
///     handles.into_iter().map(|h| h.join().unwrap()).collect()
/// });
/// assert_eq!(squares, [1, 4, 9]);
/// ```
pub fn with_current_span<F, A, T>(f: F) -> impl Fn(A) -> T + Send + Sync
where
    F: Fn(A) -> T + Send + Sync,
{
    let span = Span::current();
    move |item| span.in_scope(|| f(item))
}

/// `std::thread::scope(f)`, whose threads, spawned with
/// [`ScopeInSpan::spawn`], run in the span current now, so their CPU shows
/// in the request's profile.
///
/// ```
/// use sentry_profiling_tracing::scope_in_span;
///
/// let data = [1u64, 2, 3, 4];
/// let sum: u64 = scope_in_span(|s| {
///     let halves: Vec<_> = data.chunks(2).map(|c| s.spawn(move || c.iter().sum::<u64>())).collect();
///     halves.into_iter().map(|h| h.join().unwrap()).sum()
/// });
/// assert_eq!(sum, 10);
/// ```
pub fn scope_in_span<'env, F, T>(f: F) -> T
where
    F: for<'scope> FnOnce(&ScopeInSpan<'scope, 'env>) -> T,
{
    let span = Span::current();
    std::thread::scope(|scope| f(&ScopeInSpan { scope, span }))
}

/// The scope [`scope_in_span`] passes: `spawn` runs the thread in the span
/// current where the scope was opened.
#[derive(Debug)]
pub struct ScopeInSpan<'scope, 'env: 'scope> {
    scope: &'scope std::thread::Scope<'scope, 'env>,
    span: Span,
}

impl<'scope, 'env> ScopeInSpan<'scope, 'env> {
    /// `Scope::spawn(f)` with the scope's span entered while `f` runs.
    pub fn spawn<F, T>(&self, f: F) -> std::thread::ScopedJoinHandle<'scope, T>
    where
        F: FnOnce() -> T + Send + 'scope,
        T: Send + 'scope,
    {
        self.scope.spawn(in_span(self.span.clone(), f))
    }

    /// The underlying `std::thread::Scope`, to spawn a thread outside the
    /// span (or with a `Builder`).
    pub fn scope(&self) -> &'scope std::thread::Scope<'scope, 'env> {
        self.scope
    }
}
