//! A request's time adds up, its offloaded work included: a service whose
//! handler runs on its own future, then in a closure of
//! `spawn_blocking_in_span` and a task of `spawn_in_span`, then awaits a
//! timer, under more concurrent requests than cores and a blocking pool
//! smaller than the concurrency. For every transaction: its future's CPU
//! wait is part of its polls, its three parts make its duration, and its
//! offloaded work's wait to start is the one the handler saw; over the run,
//! the CPU wait all requests carry is within the kernel's run delay of the
//! threads that ran them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use axum::extract::Path;
use sentry_profiling_tests::clients::captured_options_with;
use sentry_profiling_tests::{CaptureTransport, http_get, split_items, transaction_window};
use serde_json::Value;

/// Concurrent clients: three per core.
const CLIENTS: u64 = 6;
/// Requests each client makes, one after the other.
const REQUESTS: u64 = 4;
/// The blocking pool's threads: fewer than the requests in flight, so
/// closures wait for a free one.
const BLOCKING_THREADS: usize = 2;
/// What each request does: CPU on its own future, in its closure and in
/// its task (ms of wall time, busy), then a timer it awaits.
const OWN_MS: u64 = 3;
const CLOSURE_MS: u64 = 15;
const TASK_MS: u64 = 3;
const SLEEP_MS: u64 = 250;

fn now_ns() -> u64 {
    sentry_profiling::hooks::wall_ns()
}

#[inline(never)]
fn offloaded_busy(ms: u64) {
    let until = std::time::Instant::now() + Duration::from_millis(ms);
    let mut x = 0u64;
    while std::time::Instant::now() < until {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}

/// What the handler saw of request `id`'s offloaded work (ns): bounds of
/// its waits to start and the time it ran.
#[derive(Debug, Clone, Copy)]
struct Truth {
    /// The waits from each spawn's call returning to the work's first
    /// statement: no more than the helpers' own waits, by as much as
    /// their few instructions between their clock reads and the work.
    queued_lo: u64,
    /// The waits from just before each spawn call to the work's first
    /// statement: no less than the helpers' own waits.
    queued_hi: u64,
    /// The time the work's own code ran (inside the helpers' measure).
    ran: u64,
}

static TRUTH: Mutex<Option<HashMap<u64, Truth>>> = Mutex::new(None);

async fn work(Path(id): Path<u64>) -> &'static str {
    offloaded_busy(OWN_MS);
    let before = now_ns();
    let closure = sentry_profiling_tracing::spawn_blocking_in_span(|| {
        let start = now_ns();
        offloaded_busy(CLOSURE_MS);
        (start, now_ns())
    });
    let after = now_ns();
    let (closure_start, closure_end) = closure.await.expect("the closure ran");
    let task_before = now_ns();
    let task = sentry_profiling_tracing::spawn_in_span(async {
        let start = now_ns();
        offloaded_busy(TASK_MS);
        (start, now_ns())
    });
    let task_after = now_ns();
    let (task_start, task_end) = task.await.expect("the task ran");
    let truth = Truth {
        queued_lo: closure_start.saturating_sub(after) + task_start.saturating_sub(task_after),
        queued_hi: (closure_start - before) + (task_start - task_before),
        ran: (closure_end - closure_start) + (task_end - task_start),
    };
    TRUTH
        .lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .insert(id, truth);
    tokio::time::sleep(Duration::from_millis(SLEEP_MS)).await;
    "ok"
}

/// This thread's run delay so far (the second field of its `schedstat`):
/// the time it was runnable and not running, by the kernel's count, ns.
fn own_run_delay_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

thread_local! {
    static STARTED_DELAY: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The run delay of the runtime's threads (workers and blocking threads)
/// over their lives, and how many there were.
static THREADS_DELAY: Mutex<(u64, u64)> = Mutex::new((0, 0));

fn ms(v: &Value, key: &str) -> Option<f64> {
    v.pointer(&format!("/contexts/trace/data/{key}"))
        .or_else(|| v.pointer(&format!("/measurements/{key}/value")))
        .and_then(Value::as_f64)
}

#[test]
fn a_requests_parts_add_up_and_its_offloaded_work_is_its_own() {
    let capture = CaptureTransport::new();
    let options = captured_options_with(&capture, |p| {
        p.frequency_hz(sentry_profiling::DEFAULT_FREQUENCY_HZ)
    });
    let guard = sentry::init(options);
    sentry_profiling_examples::init_tracing();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(BLOCKING_THREADS)
        .on_thread_start(|| STARTED_DELAY.set(own_run_delay_ns()))
        .on_thread_stop(|| {
            let lived = own_run_delay_ns().saturating_sub(STARTED_DELAY.get());
            let mut t = THREADS_DELAY.lock().unwrap();
            t.0 += lived;
            t.1 += 1;
        })
        .enable_all()
        .build()
        .expect("runtime");
    let app = axum::Router::new()
        .route("/work/{id}", axum::routing::get(work))
        .layer(sentry_profiling_tracing::http_layer());
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stop_rx.await;
                })
                .await
        });
        let clients: Vec<_> = (0..CLIENTS)
            .map(|k| {
                tokio::spawn(async move {
                    for n in 0..REQUESTS {
                        let response = http_get(addr, format!("/work/{}", k * REQUESTS + n)).await;
                        assert!(response.ends_with("ok"), "{response}");
                    }
                })
            })
            .collect();
        for c in clients {
            c.await.expect("client");
        }
        let _ = stop_tx.send(());
        server.await.expect("server task").expect("server");
    });
    println!("profiler: {:?}", sentry_profiling::stats());
    // Every thread of the runtime stops here, and reads its run delay.
    drop(runtime);
    drop(guard);

    let (threads_delay_ns, threads) = *THREADS_DELAY.lock().unwrap();
    let truth = TRUTH.lock().unwrap().take().unwrap_or_default();
    let (_, transactions) = split_items(&capture.envelopes());
    assert_eq!(
        transactions.len() as u64,
        CLIENTS * REQUESTS,
        "one transaction per request"
    );
    let mut carried_cpu_wait_ms = 0.0;
    let mut failures = Vec::new();
    for tx in &transactions {
        let url = tx
            .pointer("/request/url")
            .and_then(Value::as_str)
            .unwrap_or("");
        let id: u64 = url
            .rsplit('/')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("a request id in {url}"));
        let t = truth[&id];
        let (start, end) = transaction_window(tx).expect("a window");
        let duration_ms = (end - start) * 1e3;
        let read = |key: &str| ms(tx, key).unwrap_or_else(|| panic!("{url}: no {key}"));
        let (polled, queued, awaiting) = (
            read("tokio.polled"),
            read("tokio.queued"),
            read("tokio.awaiting"),
        );
        let (cpu_wait, offloaded, offloaded_cpu_wait, offloaded_queued) = (
            read("tokio.cpu_wait"),
            read("tokio.offloaded"),
            read("tokio.offloaded_cpu_wait"),
            read("tokio.offloaded_queued"),
        );
        carried_cpu_wait_ms += cpu_wait + offloaded_cpu_wait;
        println!(
            "{url}: {duration_ms:.3} ms = polled {polled:.3} + queued {queued:.3} + awaiting \
             {awaiting:.3}; cpu wait {cpu_wait:.3}; offloaded {offloaded:.3} (cpu wait \
             {offloaded_cpu_wait:.3}, queued {offloaded_queued:.3}); the handler saw queued \
             {:.3}..{:.3}, ran {:.3}",
            t.queued_lo as f64 / 1e6,
            t.queued_hi as f64 / 1e6,
            t.ran as f64 / 1e6,
        );
        // The future's waits for a CPU are shown only in its own polls.
        if cpu_wait > polled {
            failures.push(format!("{url}: cpu_wait {cpu_wait} > polled {polled}"));
        }
        // The parts run from the first poll to the end of the last one,
        // inside the transaction, which the middleware starts just before
        // that poll and finishes just after: the gaps are its own few
        // microseconds of bookkeeping, and 1 % of a request that awaits a
        // 250 ms timer is 2.5 ms.
        let parts = polled + queued + awaiting;
        if parts > duration_ms + 0.001 || duration_ms - parts > duration_ms * 0.01 {
            failures.push(format!(
                "{url}: parts {parts:.3} ms against a duration of {duration_ms:.3} ms"
            ));
        }
        // The helpers read the clock at the spawn (between the handler's
        // `before` and `after`) and as the work starts (before its first
        // statement): their wait is within the handler's bounds, less the
        // few instructions between their read and the work's own (1 ms).
        let (lo, hi) = (t.queued_lo as f64 / 1e6, t.queued_hi as f64 / 1e6);
        if offloaded_queued > hi + 0.001 || offloaded_queued < lo - 1.0 {
            failures.push(format!(
                "{url}: offloaded_queued {offloaded_queued:.3} ms, the handler saw {lo:.3}..{hi:.3}"
            ));
        }
        // Its run holds the work's own code.
        if offloaded + 0.001 < t.ran as f64 / 1e6 || offloaded_cpu_wait > offloaded {
            failures.push(format!(
                "{url}: offloaded {offloaded:.3} ms (cpu wait {offloaded_cpu_wait:.3}), \
                 the work ran {:.3} ms",
                t.ran as f64 / 1e6
            ));
        }
    }
    // The sampler shows a thread waiting for a CPU a period at a time,
    // where the kernel's run delay says it waited (half a period or more
    // since the last such fill, the rest carried over): over a thread's
    // life the fills pass its run delay by half a period at most.
    let period_ms = 1e3 / f64::from(sentry_profiling::DEFAULT_FREQUENCY_HZ);
    let allowed_ms = threads_delay_ns as f64 / 1e6 + threads as f64 * period_ms / 2.0;
    println!(
        "the requests carry {carried_cpu_wait_ms:.1} ms of CPU wait; the runtime's {threads} \
         threads' run delay is {:.1} ms",
        threads_delay_ns as f64 / 1e6
    );
    if carried_cpu_wait_ms > allowed_ms {
        failures.push(format!(
            "the requests carry {carried_cpu_wait_ms:.1} ms of CPU wait, more than the \
             {allowed_ms:.1} ms their threads can have shown"
        ));
    }
    // Six clients on two cores wait for a CPU for many periods: some of
    // it inside the requests, where the sampler must add it to their
    // totals (a consumer between the sampler and the session that did not
    // pass the waits on left every total at 0, which the bound above
    // lets through).
    if threads_delay_ns as f64 / 1e6 > 20.0 * period_ms && carried_cpu_wait_ms <= 0.0 {
        failures.push(format!(
            "the runtime's threads waited {:.1} ms for a CPU, and the requests carry none of it",
            threads_delay_ns as f64 / 1e6
        ));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
