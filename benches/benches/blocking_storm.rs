//! A storm of blocking polls: thousands a second, for 30 s, from 24
//! blocking sites (each a function of its own that sleeps 1.2 ms on its
//! Tokio worker) beside a healthy probe, with blocking-poll issues on (1 ms
//! threshold, 1 s interval: every site wants an event a second) and off,
//! in turn, in this process.
//!
//! Requests go through the example's set-up (trace lifecycle,
//! `http_layer()`, the tracing layer) straight into the axum router, 64
//! at once on 16 workers, without sockets, so the service's cost is the
//! handlers', the layers' and the profiler's. Envelopes go to a transport
//! that counts events and drops the rest.
//!
//! What it shows, per mode: blocking polls read a second (those with an
//! application frame among their samples, and those without: a 1.2 ms
//! poll holds a sample about one time in eight at 101 Hz), and lost,
//! requests a second, events sent and dropped by the bound
//! (`MAX_BLOCKING_EVENTS_PER_MINUTE`, 20), the healthy probe's latency
//! (how long its 10 ms timer takes to run it again, median and p99: the
//! storm blocks the workers in both modes; the events must add nothing), the
//! process's CPU per request, and its resident
//! memory at each quarter of the run (flat: the watch's rings, pending
//! polls and windows are bounded). It fails if the events break the
//! bound, if no event is sent, or if the lane queue refused a request.
//!
//! `cargo bench -p sentry-profiling-benches --bench blocking_storm`
//! (`BLOCKING_STORM_SECS`, default 30); `-- --test` is the smoke run (3 s
//! per mode).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::get;
use sentry::protocol::{Envelope, EnvelopeItem};
use sentry::{ClientOptions, Transport};
use sentry_profiling::{MAX_BLOCKING_EVENTS_PER_MINUTE, ProfileLifecycle, ProfilingIntegration};
use tower_service::Service as _;

const BLOCK: Duration = Duration::from_micros(1_200);
const IN_FLIGHT: usize = 64;
const WORKERS: usize = 16;

macro_rules! sites {
    ($($name:ident),* $(,)?) => {
        $(
            #[inline(never)]
            fn $name(d: Duration) {
                std::thread::sleep(d);
            }
        )*
        const SITES: &[fn(Duration)] = &[$($name),*];
    };
}

sites!(
    storm_site_00,
    storm_site_01,
    storm_site_02,
    storm_site_03,
    storm_site_04,
    storm_site_05,
    storm_site_06,
    storm_site_07,
    storm_site_08,
    storm_site_09,
    storm_site_10,
    storm_site_11,
    storm_site_12,
    storm_site_13,
    storm_site_14,
    storm_site_15,
    storm_site_16,
    storm_site_17,
    storm_site_18,
    storm_site_19,
    storm_site_20,
    storm_site_21,
    storm_site_22,
    storm_site_23,
);

/// Counts the events it is given; drops everything.
#[derive(Default)]
struct CountEvents {
    events: AtomicU64,
}

impl Transport for CountEvents {
    fn send_envelope(&self, envelope: Envelope) {
        let n = envelope
            .items()
            .filter(|i| matches!(i, EnvelopeItem::Event(_)))
            .count();
        self.events.fetch_add(n as u64, Ordering::Relaxed);
    }
}

fn router() -> axum::Router {
    axum::Router::new()
        .route(
            "/block/{site}",
            get(
                |axum::extract::Path(site): axum::extract::Path<usize>| async move {
                    SITES[site % SITES.len()](BLOCK);
                    "blocked"
                },
            ),
        )
        .route("/ok", get(|| async { "ok" }))
        .layer(sentry_profiling_tracing::http_layer())
}

fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(0.0, |pages| pages * 4096.0 / (1024.0 * 1024.0))
}

/// CPU seconds of this process's threads, split into the Tokio workers'
/// (named `tokio-rt-worker`, or `tokio-runtime-worker` shown truncated, by
/// older Tokio versions) and the others.
fn thread_cpu_secs() -> (f64, f64) {
    // SAFETY: `sysconf` has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let (mut workers, mut others) = (0.0, 0.0);
    for task in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        // utime and stime are the 14th and 15th fields of the line, the
        // 12th and 13th after the command's closing parenthesis.
        let secs = (ticks(11) + ticks(12)) / hz;
        if head.contains("(tokio-rt-worker") || head.contains("(tokio-runtime-w") {
            workers += secs;
        } else {
            others += secs;
        }
    }
    (workers, others)
}

fn cpu_secs() -> f64 {
    // SAFETY: `usage` is a valid, writable `rusage` for the call.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF has no other precondition.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

async fn request(app: &axum::Router, path: &str) {
    let req = http::Request::get(path)
        .body(axum::body::Body::empty())
        .expect("a request");
    let _ = app.clone().call(req).await;
}

/// What one mode measured.
#[derive(Debug)]
struct Outcome {
    requests: u64,
    secs: f64,
    blocking: sentry_profiling::BlockingStats,
    long_polls: u64,
    events_seen: u64,
    refused: u64,
    probe_ms: (f64, f64),
    cpu_us_per_request: f64,
    /// The workers' CPU per request, and the other threads' (the
    /// profiler's, the transport's) per blocking poll read.
    worker_us_per_request: f64,
    others_ms_per_sec: f64,
    rss_mib: Vec<f64>,
}

fn run(on: bool, secs: f64) -> Outcome {
    let counter = Arc::new(CountEvents::default());
    let mut options = ClientOptions::new().traces_sample_rate(1.0);
    options.dsn = sentry_profiling_examples::LOCAL_DSN.parse().ok();
    let transport: Arc<dyn Transport> = counter.clone();
    options.transport = Some(Arc::new(move |_: &ClientOptions| Arc::clone(&transport)));
    options.shutdown_timeout = Duration::from_secs(30);
    let guard = sentry::init(
        ProfilingIntegration::new()
            .profile_session_sample_rate(1.0)
            .profile_lifecycle(ProfileLifecycle::Trace)
            .blocking_issues(on)
            .blocking_threshold(Duration::from_millis(1))
            .blocking_interval(Duration::from_secs(1))
            .apply(options),
    );
    sentry::Hub::main().bind_client(sentry::Hub::current().client());
    sentry_profiling_examples::init_tracing();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_all()
        .build()
        .expect("runtime");
    let app = router();
    let done = Arc::new(AtomicU64::new(0));
    let probe = Arc::new(Mutex::new(Vec::new()));
    let mut rss = Vec::new();
    let cpu_before = cpu_secs();
    let others_before = thread_cpu_secs().1;
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(secs);
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for c in 0..IN_FLIGHT {
            let (app, done) = (app.clone(), Arc::clone(&done));
            tasks.push(tokio::spawn(async move {
                let mut i = c;
                while Instant::now() < until {
                    request(&app, &format!("/block/{i}")).await;
                    done.fetch_add(1, Ordering::Relaxed);
                    // A connection's next request comes through the
                    // runtime's I/O: the task gives its worker back.
                    tokio::task::yield_now().await;
                    i += IN_FLIGHT;
                }
            }));
        }
        let (app, probe) = (app.clone(), Arc::clone(&probe));
        tasks.push(tokio::spawn(async move {
            // How long a healthy request's 10 ms timer takes to give it a
            // worker back: the storm's polls hold the workers in both
            // modes; the events must add nothing to it.
            while Instant::now() < until {
                let slept = Instant::now();
                tokio::time::sleep(Duration::from_millis(10)).await;
                let late = slept.elapsed();
                request(&app, "/ok").await;
                probe.lock().unwrap().push(late.as_secs_f64() * 1e3);
            }
        }));
        for quarter in 1..=4 {
            let at = started + Duration::from_secs_f64(secs * f64::from(quarter) / 4.0);
            tokio::time::sleep_until(at.into()).await;
            rss.push(rss_mib());
        }
        for t in tasks {
            let _ = t.await;
        }
    });
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_secs() - cpu_before;
    let (workers_cpu, others_cpu) = thread_cpu_secs();
    drop(runtime);
    drop(guard);
    let stats = sentry_profiling::stats().expect("a session ran");
    let mut p = probe.lock().unwrap().clone();
    p.sort_by(f64::total_cmp);
    let at = |q: f64| {
        p.get(((p.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    let requests = done.load(Ordering::Relaxed);
    Outcome {
        requests,
        secs: elapsed,
        blocking: stats.blocking,
        long_polls: stats.long_polls,
        events_seen: counter.events.load(Ordering::Relaxed),
        refused: stats.lane_registrations_refused,
        probe_ms: (at(0.5), at(0.99)),
        cpu_us_per_request: cpu / requests.max(1) as f64 * 1e6,
        worker_us_per_request: workers_cpu / requests.max(1) as f64 * 1e6,
        others_ms_per_sec: (others_cpu - others_before) / elapsed * 1e3,
        rss_mib: rss,
    }
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--test");
    let secs: f64 = if smoke {
        3.0
    } else {
        std::env::var("BLOCKING_STORM_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(30.0)
    };
    println!(
        "blocking_storm: {} s per mode, {IN_FLIGHT} requests in flight on {WORKERS} workers, \
         {} sites sleeping {BLOCK:?}",
        secs,
        SITES.len()
    );
    println!(
        "| mode | requests/s | blocking polls read/s (with a stack, without) | lost | events sent | dropped (polls in them) | healthy probe's 10 ms timer, median / p99 ms | CPU µs/request (workers) | other threads' CPU ms/s | RSS MiB at 1/4, 1/2, 3/4, end |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut failures = Vec::new();
    for on in [true, false] {
        let o = run(on, secs);
        println!(
            "| {} | {:.0} | {:.0} ({:.0}, {:.0}) | {} | {} | {} ({}) | {:.2} / {:.2} | {:.1} ({:.1}) | {:.0} | {} |",
            if on { "on" } else { "off" },
            o.requests as f64 / o.secs,
            (o.blocking.polls + o.blocking.polls_without_stack) as f64 / o.secs,
            o.blocking.polls as f64 / o.secs,
            o.blocking.polls_without_stack as f64 / o.secs,
            o.blocking.polls_lost,
            o.blocking.events_sent,
            o.blocking.events_dropped,
            o.blocking.polls_in_dropped_events,
            o.probe_ms.0,
            o.probe_ms.1,
            o.cpu_us_per_request,
            o.worker_us_per_request,
            o.others_ms_per_sec,
            o.rss_mib
                .iter()
                .map(|m| format!("{m:.1}"))
                .collect::<Vec<_>>()
                .join(", "),
        );
        println!("  long polls counted by the requests: {}", o.long_polls);
        // The bound holds over any minute; the run (and the windows sent
        // at its end) fits in ceil(secs / 60) minutes.
        let bound = MAX_BLOCKING_EVENTS_PER_MINUTE as u64 * (o.secs / 60.0).ceil().max(1.0) as u64;
        if on {
            if o.blocking.events_sent > bound || o.events_seen > bound {
                failures.push(format!(
                    "{} events sent ({} seen) past the bound of {bound}",
                    o.blocking.events_sent, o.events_seen
                ));
            }
            if o.events_seen == 0 {
                failures.push("no event reached the transport".into());
            }
            if o.blocking.polls + o.blocking.polls_without_stack == 0 {
                failures.push("no blocking poll was read".into());
            }
        } else if o.events_seen != 0 || o.blocking != sentry_profiling::BlockingStats::default() {
            failures.push(format!("switched off, yet {o:?}"));
        }
        if o.refused != 0 {
            failures.push(format!("the lane queue refused {} requests", o.refused));
        }
    }
    if !failures.is_empty() {
        eprintln!("blocking_storm failed: {failures:#?}");
        std::process::exit(1);
    }
}
