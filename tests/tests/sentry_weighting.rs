//! What Sentry shows is right: durations as Sentry's weighting gives them.
//!
//! Sentry weights each sample by the time to the next sample on the same
//! thread (computed here by `sentry_view`, as vroom and the profile page
//! do). This test drives the example under concurrent `/work` and `/sleep`
//! load, records on which OS thread and when every request was polled, and
//! checks, from the envelopes alone:
//! - every transaction's lane covers its duration: the weighted wall time
//!   in its window is within one sampling period of the transaction's
//!   duration (the lane is widened to its transaction's window, which can
//!   begin before its root span and end after it);
//! - `/work/200` and `/work/300` show the time they spent in `burn_cpu`
//!   (N on an idle machine; more on a busy one, where a thread preempted
//!   just before `burn_cpu` checks its deadline stays in it longer) within
//!   15%, as `burn_cpu` or, for the periods their thread waited for a CPU
//!   or ran with no capture next to them, `(waiting for a CPU)` or
//!   `(running: no stack captured in time)` (on a busy machine most of it:
//!   those periods claim no function), never more `burn_cpu` than that
//!   time; and no `/work` request shows more `burn_cpu` than it was polled
//!   for (plus a period): each poll of a request gets samples at its edges,
//!   so Sentry's weighting starts and ends the poll's stack with the poll;
//! - on every OS thread, no sample's weight spans a moment at which the
//!   sampler caught that thread running a request (each such moment, and
//!   each poll's start, gets a `(running a request)` sample on the OS
//!   thread; without it, the whole stretch the worker spent on requests is
//!   charged to the OS-thread sample before it), and no sample carries
//!   more than two periods of the time the thread spent polling requests.
//!
//! Short requests (`/work/30`, `/work/40`: slices of 3 to 4 ms) on a busy
//! machine get a few milliseconds of CPU, and the CPU-time timer samples a
//! thread once per period of its CPU: some get no capture at all, and show
//! `(running: no stack captured in time)`. They are printed, not asserted.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

use sentry_profiling::DEFAULT_FREQUENCY_HZ;
use sentry_profiling_tests::{
    chunk_samples, http_get_with, local_settings, read_envelope_dir, relay_violations, run_service,
    split_items,
};
use sentry_view::{
    ProfileChunk, TransactionWindow, is_lane_thread_id, timestamp_ns, transaction_profile,
    what_sentry_shows,
};
use serde_json::Value;

/// One poll of a request's future: (OS thread, start, end, the request's
/// trace id).
type Poll1 = (u64, u64, u64, String);

/// Every poll of every request.
static POLLS: Mutex<Vec<Poll1>> = Mutex::new(Vec::new());

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// A layer around the whole router that records every poll of a request.
#[derive(Clone, Copy)]
struct RecordPolls;

impl<S> tower_layer::Layer<S> for RecordPolls {
    type Service = Recorded<S>;
    fn layer(&self, inner: S) -> Recorded<S> {
        Recorded(inner)
    }
}

#[derive(Clone)]
struct Recorded<S>(S);

impl<S: tower_service::Service<http::Request<B>>, B> tower_service::Service<http::Request<B>>
    for Recorded<S>
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = RecordedFuture<S::Future>;
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }
    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let trace = sentry_profiling_tests::trace_id_of(req.headers());
        RecordedFuture(Box::pin(self.0.call(req)), trace)
    }
}

struct RecordedFuture<F>(Pin<Box<F>>, String);

impl<F: Future> Future for RecordedFuture<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let start = now_ns();
        let out = self.0.as_mut().poll(cx);
        let end = now_ns();
        let trace = self.1.clone();
        POLLS.lock().unwrap().push((
            sentry_profiling::hooks::current_thread_id(),
            start,
            end,
            trace,
        ));
        out
    }
}

/// Wall time each request spent inside `burn_cpu`, by trace id: on a busy
/// machine a thread preempted just before `burn_cpu` checks its deadline
/// stays in it longer than asked, and Sentry rightly shows that time there.
static IN_BURN: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());

/// The example's `GET /work/{ms}` (ten slices of `burn_cpu`, yielding
/// between them), timing each slice.
async fn timed_work(
    axum::extract::Path(ms): axum::extract::Path<u64>,
    headers: http::HeaderMap,
) -> String {
    let trace = sentry_profiling_tests::trace_id_of(&headers);
    let mut acc = 0u64;
    for i in 0..10 {
        let slice = ms / 10 + u64::from(i < ms % 10);
        let start = now_ns();
        acc ^= sentry_profiling_examples::burn_cpu(slice);
        let spent = now_ns().saturating_sub(start);
        IN_BURN.lock().unwrap().push((trace.clone(), spent));
        tokio::task::yield_now().await;
    }
    format!("worked {ms} ms ({acc:x})\n")
}

/// The example's routes, with [`timed_work`] for `/work`.
fn router() -> axum::Router {
    axum::Router::new()
        .route("/work/{ms}", axum::routing::get(timed_work))
        .route(
            "/sleep/{ms}",
            axum::routing::get(sentry_profiling_examples::sleep),
        )
        .layer(sentry_profiling_tracing::http_layer())
}

/// The time between a transaction's start and its root span's, and
/// between the root span's end and the transaction's.
fn root_span_offsets(tx: &Value, window: &TransactionWindow) -> (u64, u64) {
    let root = tx["spans"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["op"] == "http.request" || s["description"] == "http.request");
    let Some(root) = root else { return (0, 0) };
    let start = root.get("start_timestamp").and_then(timestamp_ns);
    let end = root.get("timestamp").and_then(timestamp_ns);
    (
        start.map_or(0, |s| s.saturating_sub(window.start_ns)),
        end.map_or(0, |e| window.end_ns.saturating_sub(e)),
    )
}

/// A /work transaction: N, burn_cpu shown, time in burn_cpu, time shown
/// with no stack captured, and what its polled time not shown as burn_cpu
/// is shown as (the largest first).
/// A `/work/N` request: N, `burn_cpu` shown, time spent in it, polled time
/// shown with no function known, the other frames its polled time shows.
type WorkSeen = (u64, u64, u64, u64, Vec<(String, String)>);

#[test]
fn sentry_weighting_shows_each_request_and_each_worker_as_they_ran() {
    let settings = local_settings("weighting");
    let dir = settings.envelope_dir.clone();
    let app = router().layer(RecordPolls);
    run_service(&settings, app, |addr, _shutdown| async move {
        let mut tasks = Vec::new();
        let mut id = 0u64;
        for round in 0..3u64 {
            for (ms, route) in [
                (200u64, "work"),
                (300, "work"),
                (40, "work"),
                (30, "work"),
                (60, "sleep"),
                (90, "sleep"),
                (120, "sleep"),
            ] {
                // The trace id names the request: N, and a serial number.
                id += 1;
                let header = format!("{:032x}-{:016x}-1", ms * 1000 + id, id);
                let path = format!("/{route}/{}", ms + 10 * round * u64::from(route == "sleep"));
                tasks.push(tokio::spawn(async move {
                    http_get_with(addr, path, &[("sentry-trace", &header)]).await
                }));
            }
            tokio::time::sleep(Duration::from_millis(120)).await;
        }
        for t in tasks {
            assert!(t.await.unwrap().starts_with("HTTP/1.1 200"));
        }
    });
    let period_ns = 1_000_000_000 / u64::from(DEFAULT_FREQUENCY_HZ);
    let (chunks, transactions) = split_items(&read_envelope_dir(&dir));
    for c in &chunks {
        assert!(relay_violations(c).is_empty());
    }
    eprintln!("profiler: {:?}", sentry_profiling::stats());

    // Chunk measurements: process CPU and resident memory about every
    // 100 ms while samples were taken.
    let mut cpu_seen = 0.0f64;
    for c in &chunks {
        let m = &c.payload["measurements"];
        assert_eq!(m["cpu_usage"]["unit"], "percent");
        assert_eq!(m["memory_footprint"]["unit"], "byte");
        let memory = m["memory_footprint"]["values"].as_array().unwrap();
        let times: Vec<f64> = memory
            .iter()
            .map(|v| v["timestamp"].as_f64().unwrap())
            .collect();
        let ts = |s: &Value| s["timestamp"].as_f64().unwrap();
        let (first, last) = chunk_samples(c)
            .iter()
            .map(ts)
            .fold((f64::MAX, f64::MIN), |(a, b), t| (a.min(t), b.max(t)));
        let span = last - first;
        eprintln!(
            "chunk of {span:.2} s: {} memory values, {} cpu values",
            times.len(),
            m["cpu_usage"]["values"].as_array().unwrap().len()
        );
        assert!(
            times.len() as f64 >= span / 0.1 * 0.5,
            "{} measurements over {span:.2} s",
            times.len()
        );
        for w in times.windows(2) {
            assert!(w[1] > w[0] && w[1] - w[0] < 1.0, "measurement times {w:?}");
        }
        for v in memory {
            assert!(v["value"].as_f64().unwrap() > 1024.0 * 1024.0);
        }
        for v in m["cpu_usage"]["values"].as_array().unwrap() {
            let cpu = v["value"].as_f64().unwrap();
            assert!((0.0..=100.0 * 64.0).contains(&cpu), "cpu_usage {cpu}");
            cpu_seen = cpu_seen.max(cpu);
        }
    }
    // An idle process reads 0; with CPU hogs beside it, the process gets a
    // small share of the machine's 2 cores.
    assert!(
        cpu_seen >= 10.0,
        "the /work load shows in cpu_usage ({cpu_seen})"
    );

    let parsed: Vec<ProfileChunk> = chunks
        .iter()
        .map(|c| ProfileChunk::from_value(&c.payload).unwrap())
        .collect();
    assert_eq!(transactions.len(), 21);
    let polls = std::mem::take(&mut *POLLS.lock().unwrap());
    let in_burn_all = std::mem::take(&mut *IN_BURN.lock().unwrap());

    let mut profiler_id = String::new();
    // Lane thread id -> the request's trace id.
    let mut lane_trace: HashMap<String, String> = HashMap::new();
    let mut burn_ratios = Vec::new();
    let mut work_seen: Vec<WorkSeen> = Vec::new();
    for tx in &transactions {
        let window = TransactionWindow::from_value(tx).unwrap();
        profiler_id.clone_from(&window.profiler_id);
        let trace = tx
            .pointer("/contexts/trace/trace_id")
            .and_then(Value::as_str)
            .unwrap()
            .to_owned();
        lane_trace.insert(window.thread_id.clone(), trace.clone());
        let shown = transaction_profile(&parsed, &window);
        let duration = window.duration_ns();
        let weighted = shown.total_ns();
        let slack = period_ns;
        eprintln!(
            "{} on {}: {} samples, duration {:.1} ms, weighted {:.1} ms (slack {:.1} ms)",
            window.name,
            window.thread_id,
            shown.samples.len(),
            duration as f64 / 1e6,
            weighted as f64 / 1e6,
            slack as f64 / 1e6
        );
        assert!(
            shown.samples.len() >= 2,
            "{}: Sentry shows {} samples",
            window.name,
            shown.samples.len()
        );
        assert!(
            duration.abs_diff(weighted) <= slack,
            "{} (thread {}): Sentry would show {:.1} ms of a {:.1} ms transaction \
             (root span {:.1} ms after its start, {:.1} ms before its end); its samples, \
             ms from its start: {:?}",
            window.name,
            window.thread_id,
            weighted as f64 / 1e6,
            duration as f64 / 1e6,
            root_span_offsets(tx, &window).0 as f64 / 1e6,
            root_span_offsets(tx, &window).1 as f64 / 1e6,
            shown
                .samples
                .iter()
                .map(|s| {
                    let frame = shown.stack(s).next().map(|f| f.name()).unwrap_or_default();
                    let at = s.timestamp_ns.saturating_sub(window.start_ns) as f64 / 1e6;
                    format!("{at:.1} {}", frame.chars().take(24).collect::<String>())
                })
                .collect::<Vec<_>>()
        );
        if window.name == "GET /work/{ms}" {
            let n = u64::from_str_radix(&trace, 16).unwrap() / 1000;
            let burn = shown.weight_where(|f| {
                f.function
                    .as_deref()
                    .is_some_and(|n| n.contains("burn_cpu"))
            });
            // How long the request's future was actually being polled
            // (burn_cpu and the little around it), on whichever thread.
            let polled: u64 = polls
                .iter()
                .filter(|p| p.3 == trace)
                .map(|p| p.2 - p.1)
                .sum();
            let in_burn: u64 = in_burn_all
                .iter()
                .filter(|b| b.0 == trace)
                .map(|b| b.1)
                .sum();
            let uncaptured = shown
                .weight_where(|f| f.function.as_deref() == Some(sentry_view::UNCAPTURED_FUNCTION));
            let ratio = burn as f64 / (n * 1_000_000) as f64;
            eprintln!(
                "  burn_cpu {:.1} ms of {n} ms ({:.0}%), in burn_cpu {:.1} ms, polled {:.1} ms, no stack captured {:.1} ms",
                burn as f64 / 1e6,
                ratio * 100.0,
                in_burn as f64 / 1e6,
                polled as f64 / 1e6,
                uncaptured as f64 / 1e6,
            );
            // Where the shown time lies against the polls: burn_cpu shown
            // while the request was not polled, and time inside its polls
            // shown as something else.
            let my_polls: Vec<(u64, u64)> = polls
                .iter()
                .filter(|p| p.3 == trace)
                .map(|p| (p.1, p.2))
                .collect();
            let overlap = |from: u64, to: u64| -> u64 {
                my_polls
                    .iter()
                    .map(|&(a, b)| to.min(b).saturating_sub(from.max(a)))
                    .sum()
            };
            let (mut burn_out, mut other_in, mut unknown_in) = (0u64, 0u64, 0u64);
            // What the polled time not shown as burn_cpu is shown as: the
            // stack's leaf and root-most frames, and where the sample is.
            let mut other_frames: Vec<(String, u64)> = Vec::new();
            for smp in &shown.samples {
                let is_burn = shown.stack(smp).any(|f| {
                    f.function
                        .as_deref()
                        .is_some_and(|n| n.contains("burn_cpu"))
                });
                let inside = overlap(smp.timestamp_ns, smp.timestamp_ns + smp.weight_ns);
                let unknown = shown.stack(smp).all(|f| {
                    let name = f.function.as_deref();
                    name == Some(sentry_view::WAITING_FOR_CPU_FUNCTION)
                        || name == Some(sentry_view::UNCAPTURED_FUNCTION)
                        || name == Some(sentry_view::WAITING_UNREAD_FUNCTION)
                });
                if is_burn {
                    burn_out += smp.weight_ns - inside;
                } else if unknown {
                    unknown_in += inside;
                } else {
                    other_in += inside;
                    if inside > 0 {
                        let names: Vec<String> = shown.stack(smp).map(|f| f.name()).collect();
                        let at = smp.timestamp_ns.saturating_sub(window.start_ns) as f64 / 1e6;
                        other_frames.push((
                            format!(
                                "{at:.1} ms: {} .. {}",
                                names.first().cloned().unwrap_or_default(),
                                names.last().cloned().unwrap_or_default()
                            ),
                            inside,
                        ));
                    }
                }
            }
            other_frames.sort_by_key(|f| std::cmp::Reverse(f.1));
            other_frames.truncate(6);
            let other: Vec<(String, String)> = other_frames
                .into_iter()
                .map(|(name, ns)| (name, format!("{:.1} ms", ns as f64 / 1e6)))
                .collect();
            work_seen.push((n, burn, in_burn, unknown_in, other));
            eprintln!(
                "  burn_cpu shown while not polled {:.1} ms; polled time shown as other frames {:.1} ms",
                burn_out as f64 / 1e6,
                other_in as f64 / 1e6
            );
            if std::env::var_os("WEIGHTING_DEBUG").is_some()
                && (uncaptured > 0 || burn * 100 < in_burn * 85 || burn > polled + 2 * period_ns)
            {
                // Every sample of the lane and of the threads that polled
                // the request, in its window.
                let tids: Vec<String> = polls
                    .iter()
                    .filter(|p| p.3 == trace)
                    .map(|p| p.0.to_string())
                    .collect();
                for p in polls.iter().filter(|p| p.3 == trace) {
                    eprintln!("    poll on {} {}..{}", p.0, p.1, p.2);
                }
                for c in &parsed {
                    for smp in &c.samples {
                        if (smp.thread_id == window.thread_id || tids.contains(&smp.thread_id))
                            && window.start_ns <= smp.timestamp_ns
                            && smp.timestamp_ns <= window.end_ns
                        {
                            let names: Vec<String> = c.stacks[smp.stack_id]
                                .iter()
                                .take(2)
                                .map(|&f| c.frames[f].name())
                                .collect();
                            eprintln!(
                                "    {} {} {}",
                                smp.timestamp_ns,
                                smp.thread_id,
                                names.join(" < ")
                            );
                        }
                    }
                }
            }
            burn_ratios.push(ratio);
            // Where the rest went: samples of burn_cpu the sampler filed
            // under the OS thread (no request) while that thread was
            // polling this request.
            let misfiled = parsed
                .iter()
                .flat_map(|c| c.samples.iter().map(move |smp| (c, smp)))
                .filter(|(c, smp)| {
                    !is_lane_thread_id(&smp.thread_id)
                        && c.stacks[smp.stack_id].iter().any(|&f| {
                            c.frames[f]
                                .function
                                .as_deref()
                                .is_some_and(|n| n.contains("burn_cpu"))
                        })
                        && smp.thread_id.parse::<u64>().is_ok_and(|tid| {
                            polls.iter().any(|p| {
                                p.0 == tid
                                    && p.3 == trace
                                    && p.1 <= smp.timestamp_ns
                                    && smp.timestamp_ns <= p.2
                            })
                        })
                })
                .count();
            eprintln!(
                "  {misfiled} burn_cpu samples of this request filed under its worker's OS thread"
            );
            // Never more burn_cpu than the request was being polled: each
            // poll ends with a `(suspended)` sample, so a poll's stack is
            // weighted up to the poll's end and no further. One period of
            // slack, for a sample the sampler placed in a period at whose
            // start the thread was still polling (or already was).
            // Beyond that, another request's work would be in this one.
            // (Not N: on a starved machine burn_cpu(N) overruns N by the
            // time its thread waits for a core inside a slice.)
            assert!(
                burn <= polled + period_ns,
                "/work/{n}: Sentry would show {:.1} ms in burn_cpu of a request polled for {:.1} ms \
                 ({:.1} ms of it while not polled)",
                burn as f64 / 1e6,
                polled as f64 / 1e6,
                burn_out as f64 / 1e6
            );
        }
    }
    // burn_cpu shown against the time the request really spent in it
    // (N on an idle machine; more on a busy one, where a thread preempted
    // just before burn_cpu checks its deadline stays in it longer), for the
    // requests long enough for sampling to resolve (20 to 30 periods of
    // CPU). Measured beside 4 CPU hogs on 2 cores: 0.90 to 1.05 (it was
    // 0.50 to 1.02 before polls got samples at their edges). Short requests
    // (/work/30, /work/40) are printed: see the module docs.
    burn_ratios.sort_by(f64::total_cmp);
    eprintln!("burn_cpu shown / N: {burn_ratios:.2?}");
    let mut of_time_in_burn: Vec<f64> = Vec::new();
    let mut short_without = 0;
    for (n, burn, in_burn, unknown, other) in &work_seen {
        let (n, burn, in_burn, unknown) = (*n, *burn, *in_burn, *unknown);
        if n >= 200 {
            let ratio = (burn + unknown) as f64 / in_burn.max(1) as f64;
            of_time_in_burn.push(ratio);
            assert!(
                (0.85..=1.15).contains(&ratio),
                "/work/{n}: Sentry would show {:.1} ms in burn_cpu and {:.1} ms with no function \
                 known of {:.1} ms spent in it; polled time shown as other frames: {other:?}",
                burn as f64 / 1e6,
                unknown as f64 / 1e6,
                in_burn as f64 / 1e6
            );
            assert!(
                burn as f64 <= in_burn as f64 * 1.15,
                "/work/{n}: Sentry would show {:.1} ms in burn_cpu, more than the {:.1} ms spent in it",
                burn as f64 / 1e6,
                in_burn as f64 / 1e6
            );
        } else if burn == 0 {
            short_without += 1;
        }
    }
    of_time_in_burn.sort_by(f64::total_cmp);
    eprintln!(
        "burn_cpu and no function known shown / time in burn_cpu, /work/200 and /work/300: {of_time_in_burn:.2?}; \
         short /work requests showing no burn_cpu: {short_without} of {}",
        work_seen.iter().filter(|w| w.0 < 200).count()
    );

    // Every OS thread that polled requests.
    let mut workers: Vec<u64> = polls.iter().map(|p| p.0).collect();
    workers.sort_unstable();
    workers.dedup();
    assert!(!workers.is_empty());
    let polled_on = |tid: u64, trace: &str, t: u64| {
        polls
            .iter()
            .any(|p| p.0 == tid && p.3 == trace && p.1 <= t && t <= p.2)
    };
    for tid in workers {
        let tid_str = tid.to_string();
        assert!(!is_lane_thread_id(&tid_str));
        let shown = what_sentry_shows(&parsed, &profiler_id, &tid_str, 0, u64::MAX);
        // The sampler's own samples of this thread that were filed under a
        // request's lane: taken while this thread polled that request.
        let mut on_lanes: Vec<u64> = Vec::new();
        for c in &parsed {
            for smp in &c.samples {
                let Some(trace) = lane_trace.get(&smp.thread_id) else {
                    continue;
                };
                let stack = &c.stacks[smp.stack_id];
                let synthetic = stack.len() == 1 && c.frames[stack[0]].is_synthetic();
                if !synthetic && polled_on(tid, trace, smp.timestamp_ns) {
                    on_lanes.push(smp.timestamp_ns);
                }
            }
        }
        on_lanes.sort_unstable();
        let spans: Vec<(u64, u64)> = polls
            .iter()
            .filter(|p| p.0 == tid)
            .map(|p| (p.1, p.2))
            .collect();
        let mut most_polling = (0, String::new(), 0, 0);
        for s in &shown.samples {
            let (a, b) = (s.timestamp_ns, s.timestamp_ns + s.weight_ns);
            let names: Vec<String> = shown.stack(s).map(|f| f.name()).take(2).collect();
            // No sample of this thread may carry a moment at which the
            // sampler caught it running a request.
            let i = on_lanes.partition_point(|&t| t <= a);
            assert!(
                on_lanes.get(i).is_none_or(|&t| t >= b),
                "OS thread {tid}: the sample at {a} ({}) carries {:.1} ms across a moment the thread ran a request",
                names.join(" < "),
                s.weight_ns as f64 / 1e6
            );
            let polling: u64 = spans
                .iter()
                .map(|&(x, y)| y.min(b).saturating_sub(x.max(a)))
                .sum();
            if polling > most_polling.0 {
                most_polling = (polling, names.join(" < "), a, b);
            }
        }
        // No sample carries more than two periods of the time the thread
        // spent polling requests: each poll's start, and each period of a
        // long poll the sampler left without a sample, gets a sample of
        // the thread (14 to 19 ms measured beside 4 CPU hogs; 20 to 44 ms
        // before).
        eprintln!(
            "OS thread {tid}: {} samples, {} taken on lanes; most polling time under one sample {:.1} ms ({})",
            shown.samples.len(),
            on_lanes.len(),
            most_polling.0 as f64 / 1e6,
            most_polling.1,
        );
        if most_polling.0 > 2 * period_ns {
            // What the chunks hold of this thread and of the lanes around
            // that sample, to tell where the thread's samples went.
            let (from, to) = (most_polling.2 - 30_000_000, most_polling.3 + 30_000_000);
            for p in polls
                .iter()
                .filter(|p| p.0 == tid && p.2 >= from && p.1 <= to)
            {
                eprintln!("    poll on {} {}..{} ({})", p.0, p.1, p.2, p.3);
            }
            for c in &parsed {
                for smp in &c.samples {
                    let id = smp.thread_id.to_string();
                    if (smp.thread_id == tid_str || is_lane_thread_id(&id))
                        && (from..=to).contains(&smp.timestamp_ns)
                    {
                        let names: Vec<String> = c.stacks[smp.stack_id]
                            .iter()
                            .take(2)
                            .map(|&f| c.frames[f].name())
                            .collect();
                        eprintln!("    {} {} {}", smp.timestamp_ns, id, names.join(" < "));
                    }
                }
            }
        }
        assert!(
            most_polling.0 <= 2 * period_ns,
            "OS thread {tid}: one sample ({}) carries {:.1} ms of the time it polled requests",
            most_polling.1,
            most_polling.0 as f64 / 1e6
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
