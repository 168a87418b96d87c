//! Whether a function is shown where it did not run: a service whose named
//! CPU functions time every call of theirs in-process (start, end, thread,
//! request), under more concurrent requests than cores, profiled as the
//! README says; then, for each function, the time Sentry shows in it (every
//! thread and lane of every chunk, each sample weighted by the time to its
//! thread's next sample, as Sentry weights it) and the part of that time
//! whose sample stands at a moment when no call of it was running where the
//! sample says: on that OS thread, or, for a request's lane, in that
//! request.
//!
//! A sample of running code stands within half a period of its capture
//! (its period slot), so a sample counts as phantom only when no such call
//! overlaps half a period and a millisecond either side of it. What is
//! left is time shown in a function that had returned, or not begun, there:
//! a stack repeated after the code moved on, or another moment's or
//! another thread's stack.
//!
//! The functions: [`phantom_first`] and [`phantom_second`] run in a handler
//! on Tokio's workers, a `yield_now` between them; [`phantom_blocking`] on
//! the blocking pool (`spawn_blocking_in_span`); [`phantom_query`] on a
//! database thread of the service's own behind a channel, as sqlx's SQLite
//! worker.

use std::sync::Mutex;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use std::collections::HashMap;

use axum::extract::Path;
use sentry_view::{
    ProfileChunk, TransactionWindow, WAITING_FOR_CPU_FUNCTION, is_lane_thread_id, what_sentry_shows,
};

use crate::clients::{burn, client_of, trace_header};
use crate::{CaptureTransport, http_get_with, run_service_on, split_items};

/// The timed functions, by the name their frames carry.
pub const FUNCTIONS: [&str; 4] = [
    "phantom_first",
    "phantom_second",
    "phantom_blocking",
    "phantom_query",
];

/// One call of a timed function.
#[derive(Debug, Clone, Copy)]
struct Call {
    /// Its index in [`FUNCTIONS`].
    function: usize,
    /// The request it ran for (see [`request_key`]).
    request: u64,
    /// The OS thread it ran on.
    tid: u64,
    /// Start and end, in ns since the Unix epoch.
    start_ns: u64,
    end_ns: u64,
    /// The time its thread waited for a CPU during it, by the kernel's
    /// count (its run delay), in ns.
    run_delay_ns: u64,
}

/// Every call of a timed function.
static CALLS: Mutex<Vec<Call>> = Mutex::new(Vec::new());

/// Client `k`'s request `n`, as one number.
fn request_key(k: u64, n: u64) -> u64 {
    k << 32 | n
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The calling thread's run delay: the time it spent runnable but waiting
/// for a CPU since it started, by the kernel's count, in ns.
pub fn own_run_delay_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

thread_local! {
    /// The calling thread's latest call of a timed function, until
    /// [`noted`] files it.
    static LAST_CALL: std::cell::Cell<Option<Call>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` as a call of `FUNCTIONS[function]` for `request`. The call's
/// interval covers all the time the timed function is on the stack (its
/// own reads of the clock and of the run delay included): it is kept in a
/// thread-local cell, and filed by [`noted`] after the function returned,
/// so that a lock taken to file it is not shown inside the function.
fn timed(function: usize, request: u64, f: impl FnOnce() -> u64) -> u64 {
    let start_ns = now_ns();
    let delay_before = own_run_delay_ns();
    let out = f();
    let run_delay_ns = own_run_delay_ns().saturating_sub(delay_before);
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u64;
    let end_ns = now_ns();
    LAST_CALL.set(Some(Call {
        function,
        request,
        tid,
        start_ns,
        end_ns,
        run_delay_ns,
    }));
    out
}

/// Files the calling thread's latest timed call (see [`timed`]); returns
/// `out`, the value the call returned.
fn noted<T>(out: T) -> T {
    if let Some(call) = LAST_CALL.take() {
        CALLS.lock().unwrap_or_else(|e| e.into_inner()).push(call);
    }
    out
}

/// `ms` of CPU, first in its handler.
#[inline(never)]
pub fn phantom_first(request: u64, ms: u64) -> u64 {
    timed(0, request, || std::hint::black_box(burn(ms)))
}

/// `ms` of CPU, in its handler after a `yield_now`.
#[inline(never)]
pub fn phantom_second(request: u64, ms: u64) -> u64 {
    timed(1, request, || std::hint::black_box(burn(ms)) ^ 1)
}

/// `ms` of CPU on Tokio's blocking pool.
#[inline(never)]
pub fn phantom_blocking(request: u64, ms: u64) -> u64 {
    timed(2, request, || std::hint::black_box(burn(ms)) ^ 2)
}

/// `ms` of CPU on the database thread.
#[inline(never)]
pub fn phantom_query(request: u64, ms: u64) -> u64 {
    timed(3, request, || std::hint::black_box(burn(ms)) ^ 3)
}

/// CPU per call of each timed function, in ms of the thread's CPU time.
pub const CPU_MS: u64 = 15;

async fn handler(Path((k, n)): Path<(u64, u64)>) -> String {
    let request = request_key(k, n);
    let a = noted(phantom_first(request, CPU_MS));
    tokio::task::yield_now().await;
    format!("{:x}\n", a ^ noted(phantom_second(request, CPU_MS)))
}

async fn blocking(Path((k, n)): Path<(u64, u64)>) -> String {
    let request = request_key(k, n);
    let x = sentry_profiling_tracing::spawn_blocking_in_span(move || {
        noted(phantom_blocking(request, CPU_MS))
    })
    .await;
    format!("{:x}\n", x.unwrap_or(0))
}

/// A query: its request, and where its answer goes.
type Query = (u64, tokio::sync::oneshot::Sender<u64>);

/// The database thread: runs queries one at a time from a channel.
fn database() -> mpsc::Sender<Query> {
    let (tx, rx) = mpsc::channel::<Query>();
    std::thread::Builder::new()
        .name("phantom-db".into())
        .spawn(move || {
            for (request, reply) in rx {
                let _ = reply.send(noted(phantom_query(request, CPU_MS)));
            }
        })
        .expect("database thread");
    tx
}

/// One function's figures.
#[derive(Debug, Clone, Default)]
pub struct Shown {
    /// The function's name.
    pub function: &'static str,
    /// Calls timed.
    pub calls: usize,
    /// Time shown in it on OS threads and on requests' lanes, in ns.
    pub shown_ns: [u64; 2],
    /// The part of `shown_ns` at moments no call of it ran there.
    pub phantom_ns: [u64; 2],
}

impl Shown {
    /// The phantom share over threads and lanes together.
    pub fn phantom_share(&self) -> f64 {
        let shown: u64 = self.shown_ns.iter().sum();
        self.phantom_ns.iter().sum::<u64>() as f64 / shown.max(1) as f64
    }

    /// The phantom share on OS threads (0) or lanes (1).
    pub fn phantom_share_on(&self, on: usize) -> f64 {
        self.phantom_ns[on] as f64 / self.shown_ns[on].max(1) as f64
    }

    /// The header of the table whose rows are [`Shown`]'s `Display`.
    pub const TABLE_HEADER: &str =
        "function            calls threads shown ms   lanes shown ms  threads    lanes  phantom";
}

/// One row of the table headed by [`Shown::TABLE_HEADER`].
impl std::fmt::Display for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:<18} {:>6} {:>16.1} {:>16.1} {:>7.1}% {:>7.1}% {:>7.1}%",
            self.function,
            self.calls,
            self.shown_ns[0] as f64 / 1e6,
            self.shown_ns[1] as f64 / 1e6,
            self.phantom_share_on(0) * 100.0,
            self.phantom_share_on(1) * 100.0,
            self.phantom_share() * 100.0
        )
    }
}

/// The time requests waited for a CPU: as Sentry shows it, and as the
/// kernel counted it.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuWait {
    /// Time shown in `(waiting for a CPU)` on requests' lanes, in ns.
    pub shown_ns: u64,
    /// The run delay of the threads that ran the timed functions in
    /// requests (all but [`phantom_query`]) during those calls, in ns:
    /// the requests' CPU time is almost all theirs.
    pub kernel_ns: u64,
    /// The requests' `tokio.cpu_wait` and `tokio.offloaded_cpu_wait`
    /// totals, summed, in ns.
    pub measured_ns: u64,
    /// How many transactions carry a `tokio.cpu_wait`.
    pub measured: usize,
}

impl CpuWait {
    /// Shown over counted by the kernel.
    pub fn ratio(&self) -> f64 {
        self.shown_ns as f64 / self.kernel_ns.max(1) as f64
    }
}

impl std::fmt::Display for CpuWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "waiting for a CPU in requests: shown {:.1} ms, the kernel's run delay in the timed calls {:.1} ms: {:.2}; \
             tokio.cpu_wait {:.1} ms on {} transactions",
            self.shown_ns as f64 / 1e6,
            self.kernel_ns as f64 / 1e6,
            self.ratio(),
            self.measured_ns as f64 / 1e6,
            self.measured,
        )
    }
}

/// What [`measure`] found.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    /// Each timed function's figures.
    pub shown: Vec<Shown>,
    /// Requests served.
    pub requests: usize,
    /// The requests' waits for a CPU.
    pub cpu_wait: CpuWait,
}

/// Runs the service at `hz` with `clients` concurrent clients for `run`,
/// each sending `/handler`, `/blocking` and `/query` requests in turn, and
/// measures each timed function (see the module docs) and the requests'
/// waits for a CPU.
pub fn measure(hz: u32, clients: usize, run: Duration) -> Measured {
    CALLS.lock().unwrap_or_else(|e| e.into_inner()).clear();
    let capture = CaptureTransport::new();
    let options = crate::clients::captured_options_with(&capture, |p| p.frequency_hz(hz));
    let db = database();
    let app = axum::Router::new()
        .route("/handler/{k}/{n}", axum::routing::get(handler))
        .route("/blocking/{k}/{n}", axum::routing::get(blocking))
        .route(
            "/query/{k}/{n}",
            axum::routing::get(move |Path((k, n)): Path<(u64, u64)>| {
                let db = db.clone();
                async move {
                    let (reply, answer) = tokio::sync::oneshot::channel();
                    if db.send((request_key(k, n), reply)).is_err() {
                        return "no database\n".to_owned();
                    }
                    format!("{:x}\n", answer.await.unwrap_or(0))
                }
            }),
        )
        .layer(sentry_profiling_tracing::http_layer());
    let requests = run_service_on(2, options, app, |addr, _| async move {
        let until = Instant::now() + run;
        let mut tasks = tokio::task::JoinSet::new();
        for k in 0..clients as u64 {
            tasks.spawn(async move {
                let mut n = 0u64;
                while Instant::now() < until {
                    let path = ["handler", "blocking", "query"][((n + k) % 3) as usize];
                    let header = trace_header(k, n);
                    http_get_with(
                        addr,
                        format!("/{path}/{k}/{n}"),
                        &[("sentry-trace", header.as_str())],
                    )
                    .await;
                    n += 1;
                }
                n as usize
            });
        }
        let mut n = 0;
        while let Some(r) = tasks.join_next().await {
            n += r.expect("client task");
        }
        n
    });
    let (chunks, transactions) = split_items(&capture.envelopes());
    let chunks: Vec<ProfileChunk> = chunks
        .iter()
        .map(|c| ProfileChunk::from_value(&c.payload).expect("a readable chunk"))
        .collect();
    // Each request's lane and window.
    let lanes: Vec<(String, u64, u64, u64)> = transactions
        .iter()
        .filter_map(|tx| {
            let (k, n) = client_of(tx)?;
            let w = TransactionWindow::from_value(tx).ok()?;
            Some((w.thread_id, w.start_ns, w.end_ns, request_key(k, n)))
        })
        .collect();
    let calls = std::mem::take(&mut *CALLS.lock().unwrap_or_else(|e| e.into_inner()));
    let tolerance_ns = 500_000_000 / u64::from(hz.max(1)) + 1_000_000;
    // A request's waits are its future's own (`tokio.cpu_wait`) and its
    // offloaded work's (`tokio.offloaded_cpu_wait`): the lane shows both.
    let read = |tx: &serde_json::Value, key: &str| {
        let data = tx.pointer(&format!("/contexts/trace/data/{key}"));
        let m = tx.pointer(&format!("/measurements/{key}/value"));
        data.or(m)?.as_f64()
    };
    let measured: Vec<f64> = transactions
        .iter()
        .filter_map(|tx| {
            Some(read(tx, "tokio.cpu_wait")? + read(tx, "tokio.offloaded_cpu_wait").unwrap_or(0.0))
        })
        .collect();
    let cpu_wait = CpuWait {
        measured_ns: (measured.iter().sum::<f64>() * 1e6) as u64,
        measured: measured.len(),
        shown_ns: shown_waiting_on_lanes(&chunks),
        kernel_ns: calls
            .iter()
            .filter(|c| FUNCTIONS[c.function] != "phantom_query")
            .map(|c| c.run_delay_ns)
            .sum(),
    };
    Measured {
        shown: score(&chunks, &calls, &lanes, tolerance_ns),
        requests,
        cpu_wait,
    }
}

/// The time shown in `(waiting for a CPU)` on requests' lanes, weighted as
/// Sentry weights samples.
fn shown_waiting_on_lanes(chunks: &[ProfileChunk]) -> u64 {
    let mut total = 0;
    for (profiler, thread) in threads_of(chunks) {
        if !is_lane_thread_id(&thread) {
            continue;
        }
        let profile = what_sentry_shows(chunks, &profiler, &thread, 0, u64::MAX);
        for sample in &profile.samples {
            if profile
                .stack(sample)
                .any(|f| f.name() == WAITING_FOR_CPU_FUNCTION)
            {
                total += sample.weight_ns;
            }
        }
    }
    total
}

/// Every (profiler id, thread id) of `chunks`, once.
fn threads_of(chunks: &[ProfileChunk]) -> Vec<(String, String)> {
    let mut threads: Vec<(String, String)> = chunks
        .iter()
        .flat_map(|c| {
            c.thread_ids()
                .map(|t| (c.profiler_id.clone(), t.to_owned()))
        })
        .collect();
    threads.sort();
    threads.dedup();
    threads
}

/// The calls of one function, for "did any run near this moment".
struct Intervals {
    /// Starts, sorted.
    starts: Vec<u64>,
    /// The latest end among the calls up to each index.
    max_end: Vec<u64>,
}

impl Intervals {
    fn new(mut calls: Vec<(u64, u64)>) -> Self {
        calls.sort_unstable();
        let mut max_end = Vec::with_capacity(calls.len());
        let mut m = 0;
        for &(_, end) in &calls {
            m = m.max(end);
            max_end.push(m);
        }
        Self {
            starts: calls.iter().map(|c| c.0).collect(),
            max_end,
        }
    }

    /// Whether a call overlaps `[from, to]`.
    fn any_overlaps(&self, from: u64, to: u64) -> bool {
        let n = self.starts.partition_point(|&s| s <= to);
        n > 0 && self.max_end[n - 1] >= from
    }
}

/// Each function's shown and phantom time over every thread and lane of
/// `chunks`; `lanes` holds each request's (lane, start, end, request key).
fn score(
    chunks: &[ProfileChunk],
    calls: &[Call],
    lanes: &[(String, u64, u64, u64)],
    tolerance_ns: u64,
) -> Vec<Shown> {
    // Calls by (function, thread) and by (function, request).
    let mut by_thread: HashMap<(usize, u64), Vec<(u64, u64)>> = HashMap::new();
    let mut by_request: HashMap<(usize, u64), Vec<(u64, u64)>> = HashMap::new();
    for c in calls {
        let span = (c.start_ns, c.end_ns);
        by_thread.entry((c.function, c.tid)).or_default().push(span);
        by_request
            .entry((c.function, c.request))
            .or_default()
            .push(span);
    }
    let by_thread: HashMap<_, _> = by_thread
        .into_iter()
        .map(|(k, v)| (k, Intervals::new(v)))
        .collect();
    let by_request: HashMap<_, _> = by_request
        .into_iter()
        .map(|(k, v)| (k, Intervals::new(v)))
        .collect();
    let mut out: Vec<Shown> = FUNCTIONS
        .iter()
        .enumerate()
        .map(|(f, &function)| Shown {
            function,
            calls: calls.iter().filter(|c| c.function == f).count(),
            ..Shown::default()
        })
        .collect();
    for (profiler, thread) in &threads_of(chunks) {
        let lane = is_lane_thread_id(thread);
        let tid = thread.parse::<u64>().unwrap_or(0);
        let profile = what_sentry_shows(chunks, profiler, thread, 0, u64::MAX);
        for sample in &profile.samples {
            let t = sample.timestamp_ns;
            let (from, to) = (
                t.saturating_sub(tolerance_ns),
                t.saturating_add(tolerance_ns),
            );
            // The request whose lane this is at `t`, if a lane.
            // (The one whose window holds `t`, or else one within the
            // tolerance: a lane's id is used again by a later request.)
            let request = lane
                .then(|| {
                    let mine = lanes.iter().filter(|l| l.0 == *thread);
                    mine.clone()
                        .find(|l| l.1 <= t && t <= l.2)
                        .or_else(|| mine.clone().find(|l| l.1 <= to && from <= l.2))
                        .map(|l| l.3)
                })
                .flatten();
            let names: Vec<String> = profile.stack(sample).map(|f| f.name()).collect();
            // An estimated stack (a request's running time no capture of its
            // own saw, shown with its other captures' stacks) says it was
            // inferred: only bare stacks claim their function ran then, and
            // only they are scored.
            if names.iter().any(|n| n == sentry_view::ESTIMATED_FUNCTION) {
                continue;
            }
            for (f, shown) in out.iter_mut().enumerate() {
                if !names.iter().any(|n| n.contains(FUNCTIONS[f])) {
                    continue;
                }
                let on = usize::from(lane);
                shown.shown_ns[on] += sample.weight_ns;
                let calls = if lane {
                    request.and_then(|r| by_request.get(&(f, r)))
                } else {
                    by_thread.get(&(f, tid))
                };
                if !calls.is_some_and(|c| c.any_overlaps(from, to)) {
                    shown.phantom_ns[on] += sample.weight_ns;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::Intervals;

    #[test]
    fn a_moment_is_covered_only_by_a_call_that_overlaps_it() {
        let calls = Intervals::new(vec![(100, 200), (150, 160), (400, 500)]);
        assert!(calls.any_overlaps(190, 195));
        assert!(calls.any_overlaps(195, 250));
        assert!(!calls.any_overlaps(201, 399));
        assert!(calls.any_overlaps(350, 400));
        assert!(!calls.any_overlaps(0, 99));
        assert!(!calls.any_overlaps(501, 900));
    }
}
