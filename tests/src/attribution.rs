//! A harness that knows the truth about which request ran where, and
//! measures how well the profile Sentry would show for each transaction
//! matches it.
//!
//! The truth comes from instrumentation outside the profiler: a tower layer
//! placed outside everything else records, for every poll of every request's
//! future, the OS thread and the wall-clock interval. A sample taken on
//! thread T at time t belongs to the request being polled on T at t, if its
//! stack shows request code (a sample that stands for time a thread spent
//! waiting shows where it waits, and belongs to no request).
//!
//! What Sentry shows for a transaction is what its UI selects: the chunk
//! samples whose `thread_id` equals the transaction's `thread.id` and whose
//! timestamp is inside the transaction's `[start, end]`. Precision is the
//! share of those that belong to the request; recall is the share of the
//! request's samples that are shown. Synthetic samples (fill-ins of
//! suspended lanes, a worker's "running a request") are not samples the
//! sampler took and are left out of both.
//!
//! A sample filed under a lane does not say which thread took it; it belongs
//! to the lane's request when that request was being polled at that moment
//! (on any thread: a request is polled on one thread at a time).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::routing::get;
use sentry_profiling::ThreadAttribution;
use sentry_profiling::{ProfileLifecycle, ProfilingIntegration};
use serde_json::Value;

use crate::{CaptureTransport, http_get_with, split_items, transaction_window};

/// CPU hogs in other processes, two per core at normal priority, so that
/// a test runs on a contended machine as services do; killed on drop (also
/// when the test fails).
#[derive(Debug)]
pub struct CpuHogs(Vec<std::process::Child>);

impl CpuHogs {
    /// Starts two spinning `python3` processes per available core.
    pub fn start() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let hogs = (0..2 * cores)
            .map(|_| {
                std::process::Command::new("python3")
                    .args(["-c", "while True: pass"])
                    .stdin(std::process::Stdio::null())
                    .spawn()
                    .expect("python3 starts (a CPU hog)")
            })
            .collect();
        // Let them reach the CPU before anything is measured.
        std::thread::sleep(Duration::from_millis(200));
        Self(hogs)
    }

    /// How many hogs are still running (none may have died early).
    pub fn running(&mut self) -> usize {
        let mut n = 0;
        for child in &mut self.0 {
            if matches!(child.try_wait(), Ok(None)) {
                n += 1;
            }
        }
        n
    }
}

impl Drop for CpuHogs {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One poll of a request's future.
#[derive(Debug, Clone, Copy)]
struct Poll1 {
    tid: u64,
    start: f64,
    end: f64,
}

/// Poll intervals by request id.
type Truth = Arc<Mutex<HashMap<u64, Vec<Poll1>>>>;

fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The outermost layer: records every poll of every request.
#[derive(Clone)]
struct TruthLayer(Truth);

impl<S> tower_layer::Layer<S> for TruthLayer {
    type Service = TruthService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        TruthService {
            inner,
            truth: self.0.clone(),
        }
    }
}

#[derive(Clone)]
struct TruthService<S> {
    inner: S,
    truth: Truth,
}

impl<S, B> tower_service::Service<http::Request<B>> for TruthService<S>
where
    S: tower_service::Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let id = req
            .uri()
            .query()
            .and_then(|q| q.strip_prefix("id="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(u64::MAX);
        let truth = self.truth.clone();
        let mut fut = Box::pin(self.inner.call(req));
        Box::pin(std::future::poll_fn(move |cx| {
            let start = now_secs();
            let out = fut.as_mut().poll(cx);
            let p = Poll1 {
                tid: sentry_profiling::hooks::current_thread_id(),
                start,
                end: now_secs(),
            };
            truth.lock().unwrap().entry(id).or_default().push(p);
            out
        }))
    }
}

/// Accuracy of one attribution mode over one run.
#[derive(Debug, Clone)]
pub struct Accuracy {
    /// The mode measured.
    pub mode: ThreadAttribution,
    /// Requests with at least 3 samples of their own (the ones scored).
    pub requests: usize,
    /// Mean precision over those requests.
    pub precision: f64,
    /// Mean recall over those requests.
    pub recall: f64,
    /// Worst precision.
    pub min_precision: f64,
    /// Worst recall.
    pub min_recall: f64,
    /// Samples the sampler took that appear in the chunks.
    pub samples: usize,
    /// The request of the worst precision: what it was shown that is not
    /// its own, and where its own samples went.
    pub worst: String,
}

impl std::fmt::Display for Accuracy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?}: {} requests, precision {:.3} (worst {:.3}), recall {:.3} (worst {:.3}), {} samples",
            self.mode,
            self.requests,
            self.precision,
            self.min_precision,
            self.recall,
            self.min_recall,
            self.samples
        )
    }
}

fn trace_id(id: u64) -> String {
    format!(
        "{:032x}",
        0xabc0_0000_0000_0000_u64 as u128 * 0x1_0000_0000 + u128::from(id)
    )
}

/// Runs the example's mix (concurrent `/work` in slices with `yield_now`,
/// and `/sleep`, on a two-worker runtime) with profiling in `mode`, and
/// scores what Sentry would show for each transaction.
pub fn measure(mode: ThreadAttribution, rounds: usize) -> Accuracy {
    static TRACING: OnceLock<()> = OnceLock::new();
    TRACING.get_or_init(|| {
        use tracing_subscriber::prelude::*;
        let _ = tracing_subscriber::registry()
            .with(sentry::integrations::tracing::SpanLayer::new())
            .with(sentry_profiling_tracing::layer())
            .try_init();
    });
    let capture = CaptureTransport::new();
    let mut options = sentry::ClientOptions::new().traces_sample_rate(1.0);
    options.dsn = "https://public@sentry.invalid/1".parse().ok();
    options.transport = Some(capture.factory());
    let guard = sentry::init(
        ProfilingIntegration::new()
            .profile_session_sample_rate(1.0)
            .profile_lifecycle(ProfileLifecycle::Trace)
            .thread_attribution(mode)
            .apply(options),
    );
    let truth: Truth = Truth::default();
    let app = axum::Router::new()
        .route("/work/{ms}", get(sentry_profiling_examples::work))
        .route("/sleep/{ms}", get(sentry_profiling_examples::sleep))
        .layer(sentry_profiling_tracing::http_layer())
        .layer(TruthLayer(truth.clone()));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let mut id = 0u64;
        for _ in 0..rounds {
            let mut tasks = Vec::new();
            for k in 0..6u64 {
                id += 1;
                let path = if k % 3 == 2 {
                    format!("/sleep/{}?id={id}", 30 + 10 * k)
                } else {
                    format!("/work/{}?id={id}", 40 + 10 * k)
                };
                let header = format!("{}-{:016x}-1", trace_id(id), id);
                tasks.push(tokio::spawn(async move {
                    http_get_with(addr, path, &[("sentry-trace", header.as_str())]).await
                }));
            }
            for t in tasks {
                let _ = t.await;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        server.abort();
    });
    drop(runtime);
    drop(guard);

    let (chunks, transactions) = split_items(&capture.envelopes());
    let truth = truth.lock().unwrap().clone();
    score(mode, &chunks, &transactions, &truth)
}

/// One chunk sample, as the scorer needs it.
struct Shown {
    thread: String,
    ts: f64,
    /// Whether its stack is in request-handling code (see [`REQUEST_CODE`]).
    work: bool,
    names: String,
}

/// Function-name fragments of the code a request's future runs when polled:
/// a sample taken while a request was polled shows one of them, a sample of
/// a thread waiting (a worker parked in the runtime) shows none.
const REQUEST_CODE: [&str; 5] = [
    "sentry_profiling_examples::",
    "sentry_profiling_tests::attribution",
    "axum::",
    "hyper::",
    "tower",
];

fn score(
    mode: ThreadAttribution,
    chunks: &[crate::ChunkItem],
    transactions: &[Value],
    truth: &HashMap<u64, Vec<Poll1>>,
) -> Accuracy {
    let mut samples = Vec::new();
    for c in chunks {
        let p = &c.payload["profile"];
        let frames = p["frames"].as_array().cloned().unwrap_or_default();
        let stacks = p["stacks"].as_array().cloned().unwrap_or_default();
        for s in p["samples"].as_array().into_iter().flatten() {
            let stack = &stacks[s["stack_id"].as_u64().unwrap_or(0) as usize];
            // Synthetic samples (a suspended lane's fill-in, a worker's
            // "running a request") have one frame, marked not in-app.
            let frame = |i: &Value| &frames[i.as_u64().unwrap_or(0) as usize];
            // An estimated stack (under the root frame `(estimated from this
            // request's samples)`) says it was inferred, not seen: like a
            // fill-in, it is not judged.
            let fill_in = stack.as_array().is_some_and(|f| {
                (f.len() == 1 && frame(&f[0])["in_app"] == false)
                    || f.last().is_some_and(|root| {
                        frame(root)["function"] == sentry_view::ESTIMATED_FUNCTION
                    })
            });
            if !fill_in {
                let names: Vec<&str> = stack
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|i| {
                        frames[i.as_u64().unwrap_or(0) as usize]
                            .get("function")
                            .and_then(Value::as_str)
                    })
                    .collect();
                // A stack without any named frame (an unwind that stopped at
                // once, a program counter outside known code) cannot be
                // judged, and counts as work.
                let work = names.is_empty()
                    || names
                        .iter()
                        .any(|name| REQUEST_CODE.iter().any(|m| name.contains(m)));
                samples.push(Shown {
                    thread: s["thread_id"].as_str().unwrap_or_default().to_owned(),
                    ts: s["timestamp"].as_f64().unwrap_or(0.0),
                    work,
                    names: names
                        .iter()
                        .take(6)
                        .map(|n| n.chars().take(50).collect::<String>())
                        .collect::<Vec<_>>()
                        .join(" < "),
                });
            }
        }
    }
    // Which request each transaction is, by the trace id the client sent.
    let mut tx_by_id: HashMap<u64, (String, f64, f64)> = HashMap::new();
    for tx in transactions {
        let Some(trace) = tx
            .pointer("/contexts/trace/trace_id")
            .and_then(Value::as_str)
        else {
            continue;
        };
        let Some(id) = (1..10_000u64).find(|&i| trace_id(i) == trace) else {
            continue;
        };
        let thread = tx
            .pointer("/contexts/trace/data/thread.id")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if let Some((start, end)) = transaction_window(tx) {
            tx_by_id.insert(id, (thread, start, end));
        }
    }
    let lane_owner: HashMap<&str, u64> = tx_by_id
        .iter()
        .map(|(id, (t, _, _))| (t.as_str(), *id))
        .collect();
    let polled_at = |id: u64, tid: Option<u64>, ts: f64| {
        truth.get(&id).is_some_and(|polls| {
            polls
                .iter()
                .any(|p| p.start <= ts && ts <= p.end && tid.is_none_or(|t| t == p.tid))
        })
    };
    // The true owner of each sample: the request polled where and when it
    // was taken, if it shows that request's code running. A sample that
    // stands for time its thread spent waiting (recorded with the stack it
    // waits in) belongs to no request.
    let owner: Vec<Option<u64>> = samples
        .iter()
        .map(|s| {
            if !s.work {
                return None;
            }
            let n: u64 = s.thread.parse().unwrap_or(0);
            if sentry_profiling::hooks::is_lane(n) {
                let id = *lane_owner.get(s.thread.as_str())?;
                polled_at(id, None, s.ts).then_some(id)
            } else {
                truth
                    .keys()
                    .copied()
                    .find(|&id| polled_at(id, Some(n), s.ts))
            }
        })
        .collect();
    let mut precisions = Vec::new();
    let mut recalls = Vec::new();
    let mut worst: Option<(f64, String)> = None;
    for (&id, (thread, start, end)) in &tx_by_id {
        let own = owner.iter().filter(|o| **o == Some(id)).count();
        if own < 3 {
            continue;
        }
        let shown: Vec<usize> = (0..samples.len())
            .filter(|&i| {
                samples[i].thread == *thread && samples[i].ts >= *start && samples[i].ts <= *end
            })
            .collect();
        let hits = shown.iter().filter(|&&i| owner[i] == Some(id)).count();
        precisions.push(if shown.is_empty() {
            0.0
        } else {
            hits as f64 / shown.len() as f64
        });
        recalls.push(hits as f64 / own as f64);
        // What went wrong for this request: the samples shown that are
        // not its own, and its own samples shown elsewhere. Kept for the
        // worst request (a failing check prints it); `ATTRIBUTION_DEBUG=1`
        // prints it for every request.
        let mut detail = format!(
            "{mode:?} req {id} thread {thread} [{start:.3},{end:.3}]: {} shown, {hits} its own, {own} own in all",
            shown.len()
        );
        for &i in &shown {
            if owner[i] != Some(id) {
                detail.push_str(&format!(
                    "\n  foreign: ts {:.3} work {} polled_any {} stack {}",
                    samples[i].ts,
                    samples[i].work,
                    polled_at(id, None, samples[i].ts),
                    samples[i].names
                ));
            }
        }
        for (i, o) in owner.iter().enumerate() {
            if *o == Some(id) && !shown.contains(&i) {
                detail.push_str(&format!(
                    "\n  missed: thread {} ts {:.3} in_window {} stack {}",
                    samples[i].thread,
                    samples[i].ts,
                    samples[i].ts >= *start && samples[i].ts <= *end,
                    samples[i].names
                ));
            }
        }
        if std::env::var_os("ATTRIBUTION_DEBUG").is_some() {
            eprintln!("{detail}");
        }
        let precision = precisions.last().copied().unwrap_or(1.0);
        if worst.as_ref().is_none_or(|(p, _)| precision < *p) {
            worst = Some((precision, detail));
        }
    }
    let mean = |v: &[f64]| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let min = |v: &[f64]| v.iter().copied().fold(1.0, f64::min);
    Accuracy {
        mode,
        requests: precisions.len(),
        precision: mean(&precisions),
        recall: mean(&recalls),
        min_precision: min(&precisions),
        min_recall: min(&recalls),
        samples: samples.len(),
        worst: worst.map(|(_, d)| d).unwrap_or_default(),
    }
}
