//! Blocking polls become Sentry issue events: a real axum service under
//! `http_layer()`, the real SDK with the crate's envelope directory, and
//! handlers that block their Tokio worker in each way a service does,
//! beside healthy handlers and CPU work on the blocking pool, all under
//! concurrent load (one client per route, the routes at once, on four
//! workers):
//!
//! | route | what it does | culprit | kind |
//! |---|---|---|---|
//! | `/cpu` | a CPU loop on the worker | `crunch_rows` | `cpu` |
//! | `/sleep` | `std::thread::sleep` | `nap_on_worker` | `syscall:` `nanosleep` or `clock_nanosleep` |
//! | `/fifo` | `std::fs::read` of a FIFO written 150 ms late | `read_slow_pipe` | `syscall:read` |
//! | `/lock` | a `std::sync::Mutex` another thread holds 150 ms past the handler's first wait for it | `take_shared_lock` | `lock` |
//! | `/healthy` | awaits a timer | none | |
//! | `/pool` | 150 ms of CPU in `spawn_blocking_in_span` | none | |
//!
//! With the default 60 s interval every blocking site makes exactly one
//! event, at shutdown, whose culprit names the site, whose kind is the
//! right one, whose trace id is one of that route's requests, whose count
//! is the long polls the route's transactions counted (`tokio.long_polls`,
//! with `long_poll_threshold` set to the blocking threshold; a poll none of
//! whose samples shows an application frame, which a saturated machine
//! can cause, is counted apart in `polls_without_stack`), and which
//! passes Relay's event rules (`event_violations`) with its frames' hex
//! addresses inside its debug images. The healthy and pool routes make
//! none. With a 1 s interval a steady stream of blocking polls makes one
//! event per window whose counts add up to the long polls; switched off,
//! none at all. The preview page lists the issues a run made.
//!
//! The runs take one lock: their Sentry hubs and profilers never overlap.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use axum::routing::get;
use sentry_profiling_tests::{
    event_violations, http_get, read_envelope_dir, run_service_on, split_items,
};
use serde_json::Value;

const BLOCK: Duration = Duration::from_millis(150);
const THRESHOLD: Duration = Duration::from_millis(50);
/// Requests per route.
const REQUESTS: usize = 6;

static SERIAL: Mutex<()> = Mutex::new(());
static SHARED: Mutex<u64> = Mutex::new(0);

/// A CPU loop, on the worker.
#[inline(never)]
fn crunch_rows(for_how_long: Duration) -> u64 {
    let until = Instant::now() + for_how_long;
    let mut n = 0u64;
    while Instant::now() < until {
        n = std::hint::black_box(n + 1);
    }
    n
}

/// The same loop, for the blocking pool.
#[inline(never)]
fn crunch_on_pool(for_how_long: Duration) -> u64 {
    let until = Instant::now() + for_how_long;
    let mut n = 0u64;
    while Instant::now() < until {
        n = std::hint::black_box(n + 1);
    }
    n
}

#[inline(never)]
fn nap_on_worker(for_how_long: Duration) {
    std::thread::sleep(for_how_long);
}

#[inline(never)]
fn read_slow_pipe(path: &Path) -> usize {
    std::fs::read(path).map_or(0, |b| b.len())
}

#[inline(never)]
fn take_shared_lock() -> u64 {
    let mut g = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    *g += 1;
    *g
}

/// The thread waiting in [`take_shared_lock`], for the holder to see.
static WAITER: AtomicI32 = AtomicI32::new(0);

/// Another thread takes the shared lock, and holds it until `BLOCK` after
/// this one is found waiting for it in the kernel (its
/// `/proc/self/task/<tid>/syscall` shows `futex`), which it then is in
/// [`take_shared_lock`], in a poll of its own.
async fn contend_shared_lock() -> u64 {
    let (held_tx, held) = tokio::sync::oneshot::channel();
    let holder = std::thread::spawn(move || {
        let g = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        let _ = held_tx.send(());
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            let tid = WAITER.load(Ordering::Acquire);
            let waits = tid != 0
                && std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall"))
                    .is_ok_and(|s| s.split(' ').next() == Some(&libc::SYS_futex.to_string()));
            if waits {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(BLOCK);
        drop(g);
    });
    let _ = held.await;
    // SAFETY: `gettid` has no preconditions.
    WAITER.store(unsafe { libc::gettid() }, Ordering::Release);
    let n = take_shared_lock();
    WAITER.store(0, Ordering::Release);
    let _ = holder.join();
    n
}

/// A FIFO whose writing end (opened here, read and write, which never
/// waits) a thread of its own fills `BLOCK` later and closes: a reader of
/// it opens it at once and waits in `read` meanwhile.
fn slow_pipe(path: PathBuf) -> usize {
    let Ok(mut end) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
    else {
        return 0;
    };
    let writer = std::thread::spawn(move || {
        std::thread::sleep(BLOCK);
        let _ = end.write_all(b"rows\n");
    });
    let n = read_slow_pipe(&path);
    let _ = writer.join();
    n
}

fn router(fifo: PathBuf) -> axum::Router {
    axum::Router::new()
        .route(
            "/cpu",
            get(|| async {
                tokio::task::yield_now().await;
                crunch_rows(BLOCK).to_string()
            }),
        )
        .route(
            "/sleep",
            get(|| async {
                tokio::task::yield_now().await;
                nap_on_worker(BLOCK);
                "slept"
            }),
        )
        .route(
            "/fifo",
            get(move || {
                let fifo = fifo.clone();
                async move { slow_pipe(fifo).to_string() }
            }),
        )
        .route(
            "/lock",
            get(|| async { contend_shared_lock().await.to_string() }),
        )
        .route(
            "/healthy",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(5)).await;
                "ok"
            }),
        )
        .route(
            "/pool",
            get(|| async {
                sentry_profiling_tracing::spawn_blocking_in_span(|| crunch_on_pool(BLOCK))
                    .await
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            }),
        )
        .layer(sentry_profiling_tracing::http_layer())
}

fn make_fifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("a path");
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo {}", path.display());
}

fn options(
    dir: &Path,
    configure: impl FnOnce(
        sentry_profiling::ProfilingIntegration,
    ) -> sentry_profiling::ProfilingIntegration,
) -> sentry::ClientOptions {
    let _ = std::fs::remove_dir_all(dir);
    let mut options = sentry::ClientOptions::new().traces_sample_rate(1.0);
    options.dsn = sentry_profiling_examples::LOCAL_DSN.parse().ok();
    options.transport = Some(sentry_profiling::EnvelopeDirTransport::factory(dir).expect("dir"));
    options.shutdown_timeout = Duration::from_secs(30);
    configure(
        sentry_profiling::ProfilingIntegration::new()
            .profile_session_sample_rate(1.0)
            .profile_lifecycle(sentry_profiling::ProfileLifecycle::Trace)
            .long_poll_threshold(THRESHOLD)
            .blocking_threshold(THRESHOLD),
    )
    .apply(options)
}

/// What a run wrote: its events and transactions, and the profiler's
/// counters at the end of the load.
struct Written {
    events: Vec<Value>,
    /// The issues the preview page lists.
    preview_issues: usize,
    transactions: Vec<Value>,
    stats: sentry_profiling::ProfilerStats,
}

/// Serves the router on four workers, runs `drive`, and reads what was
/// written (the client closed, so every window was sent).
fn run<F, Fut>(tag: &str, configure: F, drive: impl FnOnce(std::net::SocketAddr) -> Fut) -> Written
where
    F: FnOnce(sentry_profiling::ProfilingIntegration) -> sentry_profiling::ProfilingIntegration,
    Fut: std::future::Future<Output = ()>,
{
    let dir = std::env::temp_dir().join(format!("sp-blocking-{tag}-{}", std::process::id()));
    let fifo = std::env::temp_dir().join(format!("sp-blocking-{tag}-{}.fifo", std::process::id()));
    make_fifo(&fifo);
    run_service_on(
        4,
        options(&dir, configure),
        router(fifo.clone()),
        |addr, _| drive(addr),
    );
    let stats = sentry_profiling::stats().expect("a session ran");
    let envelopes = read_envelope_dir(&dir);
    let (_, transactions) = split_items(&envelopes);
    let events = envelopes
        .iter()
        .flat_map(|e| &e.items)
        .filter(|i| i.kind() == Some("event"))
        .map(|i| serde_json::from_slice(&i.payload).expect("an event is JSON"))
        .collect();
    let preview_issues = sentry_profiling_preview::build(&dir)
        .map(|p| p.summary().blocking_issues)
        .expect("the preview page builds");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&fifo);
    Written {
        events,
        preview_issues,
        transactions,
        stats,
    }
}

/// Sends `n` requests to `path`, one after the other.
async fn client(addr: std::net::SocketAddr, path: &str, n: usize) {
    for _ in 0..n {
        let r = http_get(addr, path).await;
        assert!(r.starts_with("HTTP/1.1 200"), "{path}: {r}");
    }
}

/// The long polls the transactions named `name` counted.
fn long_polls_of(transactions: &[Value], name: &str) -> u64 {
    named(transactions, name)
        .filter_map(|tx| tx.pointer("/contexts/trace/data/tokio.long_polls"))
        .filter_map(Value::as_u64)
        .sum()
}

fn named<'a>(transactions: &'a [Value], name: &'a str) -> impl Iterator<Item = &'a Value> {
    transactions
        .iter()
        .filter(move |tx| tx.get("transaction").and_then(Value::as_str) == Some(name))
}

fn culprit(e: &Value) -> &str {
    e.get("culprit").and_then(Value::as_str).unwrap_or("")
}

fn count(e: &Value) -> u64 {
    e.pointer("/contexts/blocking_poll/count")
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

/// Each real frame's address lies in one of the event's debug images,
/// and the culprit is one of its frames.
fn frames_hold_their_addresses(e: &Value) {
    let hex = |v: &Value| {
        v.as_str()
            .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
    };
    let images: Vec<(u64, u64)> = e
        .pointer("/debug_meta/images")
        .and_then(Value::as_array)
        .map(|ims| {
            ims.iter()
                .filter_map(|im| {
                    let start = hex(&im["image_addr"])?;
                    Some((start, start + im["image_size"].as_u64()?))
                })
                .collect()
        })
        .unwrap_or_default();
    let frames = e
        .pointer("/threads/values/0/stacktrace/frames")
        .and_then(Value::as_array)
        .expect("the blocked stack");
    for f in frames {
        let addr = hex(&f["instruction_addr"]).expect("a hex address");
        if addr >= 0x1000 {
            assert!(
                images.iter().any(|&(s, end)| (s..end).contains(&addr)),
                "frame {f} lies in no debug image of {images:x?}"
            );
        }
    }
    assert!(
        frames
            .iter()
            .any(|f| f["function"].as_str() == Some(culprit(e))),
        "the culprit {} is a frame of the stack",
        culprit(e)
    );
}

/// A route, the function that blocks in it, and which kinds are right.
type Site = (&'static str, &'static str, fn(&str) -> bool);

#[test]
fn each_blocking_site_is_one_issue_naming_it_with_its_request_and_count() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let w = run(
        "sites",
        |i| i,
        |addr| async move {
            tokio::join!(
                client(addr, "/cpu", REQUESTS),
                client(addr, "/sleep", REQUESTS),
                client(addr, "/fifo", REQUESTS),
                client(addr, "/lock", REQUESTS),
                client(addr, "/healthy", 4 * REQUESTS),
                client(addr, "/pool", REQUESTS),
            );
        },
    );
    for e in &w.events {
        let v = event_violations(e);
        assert!(v.is_empty(), "Relay would change or reject {e}: {v:?}");
    }
    let sites: [Site; 4] = [
        ("/cpu", "crunch_rows", |k| k == "cpu"),
        ("/sleep", "nap_on_worker", |k| {
            k == "syscall:nanosleep" || k == "syscall:clock_nanosleep"
        }),
        ("/fifo", "read_slow_pipe", |k| k == "syscall:read"),
        ("/lock", "take_shared_lock", |k| k == "lock"),
    ];
    // Each poll's kind is read from its samples; on a saturated machine
    // the sampler may misread one (it found the thread blocked fewer
    // times than it captured it waking): such a poll is counted in its
    // site's one event under its own kind (`kinds`), which is the kind
    // most of the site's polls were read as. One per site is tolerated.
    for (route, site, kind_ok) in sites {
        let name = format!("GET {route}");
        let of_site: Vec<&Value> = w
            .events
            .iter()
            .filter(|e| culprit(e).ends_with(site))
            .collect();
        let all = || {
            w.events
                .iter()
                .map(|e| (culprit(e), &e["tags"], count(e)))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            of_site.len(),
            1,
            "{route}: one event for {site}; events: {:#?}",
            all()
        );
        let e = of_site[0];
        let kind = e["tags"]["blocking.kind"].as_str().unwrap_or("");
        assert!(kind_ok(kind), "{route}: kind {kind}; events: {:#?}", all());
        let misread: u64 = e
            .pointer("/contexts/blocking_poll/kinds")
            .and_then(Value::as_object)
            .map(|kinds| {
                kinds
                    .iter()
                    .filter(|(k, _)| !kind_ok(k))
                    .filter_map(|(_, n)| n.as_u64())
                    .sum()
            })
            .unwrap_or(0);
        assert!(
            misread <= 1,
            "{route}: {misread} polls read as another kind; events: {:#?}",
            all()
        );
        assert_eq!(e["level"], "warning");
        assert_eq!(e["transaction"].as_str(), Some(name.as_str()));
        assert_eq!(e["tags"]["route"].as_str(), Some(route));
        assert_eq!(
            e["fingerprint"],
            serde_json::json!(["tokio-blocking-poll", culprit(e), kind])
        );
        let title = e["message"].as_str().unwrap_or("");
        assert!(
            title.starts_with("Tokio worker blocked for ")
                && title.ends_with(&format!("in {site}")),
            "{route}: title {title}"
        );
        let long_polls = long_polls_of(&w.transactions, &name);
        assert_eq!(
            long_polls, REQUESTS as u64,
            "{route}: one long poll per request"
        );
        // A poll whose samples show no application frame (the sampler did
        // not read where its thread waited in time: a saturated machine)
        // is counted apart and makes no event.
        let unseen = w.stats.blocking.polls_without_stack;
        assert!(
            count(e) <= long_polls && count(e) + unseen >= long_polls,
            "{route}: the event counts every long poll ({unseen} without a stack); events: {:#?}",
            w.events
                .iter()
                .map(|e| (culprit(e), &e["tags"], count(e), &e["threads"]))
                .collect::<Vec<_>>()
        );
        let worst = e
            .pointer("/contexts/blocking_poll/worst_ms")
            .and_then(Value::as_f64)
            .unwrap_or(0.0);
        assert!(worst >= 140.0, "{route}: worst {worst} ms");
        let trace = e["contexts"]["trace"]["trace_id"].as_str().unwrap_or("");
        assert!(
            named(&w.transactions, &name)
                .any(|tx| tx["contexts"]["trace"]["trace_id"].as_str() == Some(trace)),
            "{route}: trace {trace} is one of its requests'"
        );
        assert!(
            e.pointer("/contexts/profile/profiler_id").is_some(),
            "{route}: links the profile"
        );
        frames_hold_their_addresses(e);
    }
    // The healthy and blocking-pool routes block no worker; on an
    // overloaded machine one of their polls may still be preempted past
    // the threshold (a long poll its transaction counts): then, and only
    // then, it may make an event, never one naming the pool's work.
    let mut extra = 0;
    for route in ["/healthy", "/pool"] {
        let name = format!("GET {route}");
        let long_polls = long_polls_of(&w.transactions, &name);
        let counted: u64 = w
            .events
            .iter()
            .filter(|e| e["transaction"].as_str() == Some(name.as_str()))
            .map(|e| {
                extra += 1;
                count(e)
            })
            .sum();
        assert!(
            counted <= long_polls,
            "{route}: {counted} polls in events, {long_polls} long polls"
        );
    }
    assert!(
        !w.events
            .iter()
            .any(|e| culprit(e).contains("crunch_on_pool")),
        "work on the blocking pool blocks no worker"
    );
    assert_eq!(w.events.len(), 4 + extra, "one event per site");
    assert_eq!(
        w.preview_issues,
        w.events.len(),
        "the preview page lists the issues"
    );
    assert_eq!(
        w.events.iter().map(count).sum::<u64>() + w.stats.blocking.polls_without_stack,
        w.stats.long_polls,
        "every long poll is in an event or counted without a stack"
    );
    assert!(
        w.stats.blocking.polls_without_stack <= REQUESTS as u64 / 2,
        "most polls show their stack: {:?}",
        w.stats.blocking
    );
    assert_eq!(
        w.stats.blocking.polls + w.stats.blocking.polls_without_stack,
        w.stats.long_polls
    );
    assert_eq!(w.stats.blocking.events_sent, w.events.len() as u64);
    assert_eq!(w.stats.blocking.polls_lost, 0);
    assert_eq!(w.stats.blocking.events_dropped, 0);
}

#[test]
fn a_steady_stream_makes_one_event_per_interval() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let w = run(
        "interval",
        |i| i.blocking_interval(Duration::from_secs(1)),
        |addr| async move {
            let until = Instant::now() + Duration::from_millis(3_500);
            while Instant::now() < until {
                client(addr, "/cpu", 1).await;
            }
        },
    );
    let ran = started.elapsed().as_secs_f64();
    let events: Vec<&Value> = w
        .events
        .iter()
        .filter(|e| culprit(e).ends_with("crunch_rows"))
        .collect();
    assert_eq!(
        events.len(),
        w.events.len(),
        "only the CPU loop blocks: {:#?}",
        w.events
            .iter()
            .map(|e| (culprit(e), &e["tags"], count(e), &e["threads"]))
            .collect::<Vec<_>>()
    );
    let long_polls = long_polls_of(&w.transactions, "GET /cpu");
    assert!(long_polls >= 10, "{long_polls} long polls");
    assert_eq!(
        events.iter().map(|e| count(e)).sum::<u64>() + w.stats.blocking.polls_without_stack,
        long_polls,
        "the events together count every long poll (or it is counted without a stack)"
    );
    assert!(
        events.len() >= 3 && events.len() as f64 <= ran + 2.0,
        "{} events in {ran:.1} s with a 1 s interval",
        events.len()
    );
    assert_eq!(w.stats.blocking.events_sent, events.len() as u64);
}

#[test]
fn switched_off_no_event() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let w = run(
        "off",
        |i| i.blocking_issues(false),
        |addr| async move {
            tokio::join!(client(addr, "/cpu", 3), client(addr, "/sleep", 3));
        },
    );
    assert!(w.events.is_empty(), "{:?}", w.events);
    assert_eq!(w.preview_issues, 0);
    assert_eq!(w.stats.blocking, sentry_profiling::BlockingStats::default());
    assert_eq!(w.stats.long_polls, 6, "long polls are still counted");
}
