//! The example axum service, as a library: the router, the CPU-burning
//! handler, and Sentry + tracing + profiler set-up exactly as the README
//! tells users to write it. `axum_service.rs` runs it; the end-to-end tests
//! drive the same router on a loopback socket.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Path;
use axum::routing::get;
use sentry_profiling::{EnvelopeDirTransport, ProfileLifecycle, ProfilingIntegration};
pub use sentry_profiling_preview::{EnvelopeItem, ParsedEnvelope, parse_envelope};
use tracing_subscriber::prelude::*;

/// Burns about `ms` milliseconds of CPU on the calling thread.
#[inline(never)]
pub fn burn_cpu(ms: u64) -> u64 {
    let until = Instant::now() + Duration::from_micros(ms * 1000);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    while Instant::now() < until {
        for i in 0..2_000u64 {
            x = std::hint::black_box(x.rotate_left(5) ^ i).wrapping_mul(0x100_0000_01b3);
        }
    }
    x
}

/// `GET /work/{ms}`: `ms` milliseconds of CPU in ten slices, yielding to the
/// runtime between slices as real handlers interleave work and awaits.
pub async fn work(Path(ms): Path<u64>) -> String {
    let ms = ms.min(10_000);
    let mut acc = 0u64;
    for i in 0..10 {
        // Spread the remainder so the slices add up to `ms`.
        let slice = ms / 10 + u64::from(i < ms % 10);
        acc ^= burn_cpu(slice);
        tokio::task::yield_now().await;
    }
    format!("worked {ms} ms ({acc:x})\n")
}

/// `GET /work/{ms}/{slice_ms}`: `ms` milliseconds of CPU in slices of
/// `slice_ms` (the last one shorter if it does not divide), yielding to the
/// runtime between slices: how polls of every length, from one
/// millisecond up, are shown.
pub async fn work_in_slices(Path((ms, slice_ms)): Path<(u64, u64)>) -> String {
    let (ms, slice_ms) = (ms.min(10_000), slice_ms.clamp(1, 10_000));
    let mut acc = 0u64;
    let mut left = ms;
    while left > 0 {
        let slice = left.min(slice_ms);
        acc ^= burn_cpu(slice);
        left -= slice;
        tokio::task::yield_now().await;
    }
    format!("worked {ms} ms in slices of {slice_ms} ms ({acc:x})\n")
}

/// `GET /sleep/{ms}`: an async sleep.
pub async fn sleep(Path(ms): Path<u64>) -> String {
    let ms = ms.min(60_000);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    format!("slept {ms} ms\n")
}

/// A query for the database thread: how long it runs, and where its
/// answer goes.
struct Query {
    ms: u64,
    reply: tokio::sync::oneshot::Sender<u64>,
}

/// The database: one OS thread of its own that runs queries from a channel,
/// one at a time, as sqlx's SQLite driver runs each connection on a worker
/// thread behind a `flume` channel. Between queries it waits in the
/// channel's receive, a thread the service has beside Tokio's workers.
fn database() -> &'static flume::Sender<Query> {
    static DATABASE: std::sync::OnceLock<flume::Sender<Query>> = std::sync::OnceLock::new();
    DATABASE.get_or_init(|| {
        let (tx, rx) = flume::unbounded::<Query>();
        let spawned = std::thread::Builder::new()
            .name("example-db".into())
            .spawn(move || {
                for query in rx.iter() {
                    let _ = query.reply.send(run_query(query.ms));
                }
            });
        if let Err(e) = spawned {
            eprintln!("example: no database thread: {e}");
        }
        tx
    })
}

/// Runs a query: about `ms` milliseconds of CPU on the database thread.
#[inline(never)]
pub fn run_query(ms: u64) -> u64 {
    burn_cpu(ms)
}

/// `GET /db/{ms}`: a query of `ms` milliseconds on the database thread; the
/// request awaits its answer.
pub async fn db(Path(ms): Path<u64>) -> String {
    let ms = ms.min(10_000);
    let (reply, answer) = tokio::sync::oneshot::channel();
    if database().send(Query { ms, reply }).is_err() {
        return "no database\n".to_owned();
    }
    match answer.await {
        Ok(rows) => format!("queried {ms} ms ({rows:x})\n"),
        Err(_) => "the database went away\n".to_owned(),
    }
}

/// Renders a page: about `ms` milliseconds of CPU.
#[inline(never)]
pub fn render_page(ms: u64) -> u64 {
    burn_cpu(ms)
}

/// `GET /render/{ms}`: `ms` milliseconds of CPU on Tokio's blocking pool
/// (as template rendering is often moved off the workers), attributed to
/// the request with `spawn_blocking_in_span`.
pub async fn render(Path(ms): Path<u64>) -> String {
    let ms = ms.min(10_000);
    match sentry_profiling_tracing::spawn_blocking_in_span(move || render_page(ms)).await {
        Ok(page) => format!("rendered {ms} ms ({page:x})\n"),
        Err(e) => format!("render failed: {e}\n"),
    }
}

/// The service's router, with every handler wrapped in a transaction.
pub fn router() -> Router {
    Router::new()
        .route(
            "/",
            get(|| async {
                "sentry-profiling example: try /work/50, /sleep/50, /db/20 or /render/20\n"
            }),
        )
        .route("/work/{ms}", get(work))
        .route("/work/{ms}/{slice_ms}", get(work_in_slices))
        .route("/sleep/{ms}", get(sleep))
        .route("/db/{ms}", get(db))
        .route("/render/{ms}", get(render))
        .layer(sentry_profiling_tracing::http_layer())
}

/// Serves the example router on `addr` until Ctrl-C or SIGTERM, then shuts
/// down gracefully: in-flight requests finish before this returns (and the
/// runtime, with its worker threads, is gone). `on_listening` is told the
/// bound address.
pub fn serve_until_signal(
    addr: SocketAddr,
    on_listening: impl FnOnce(SocketAddr),
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        on_listening(listener.local_addr()?);
        axum::serve(listener, router())
            .with_graceful_shutdown(shutdown_signal())
            .await
    })
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        () = term => {},
    }
}

/// Settings read from the environment.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `ADDR`, default `127.0.0.1:3000`.
    pub addr: SocketAddr,
    /// `SENTRY_DSN`; without it envelopes go to `envelope_dir`.
    pub dsn: Option<String>,
    /// `SENTRY_ENVELOPE_DIR`, default `./sentry-envelopes`.
    pub envelope_dir: PathBuf,
    /// `SENTRY_TRACES_SAMPLE_RATE`, default 1.0.
    pub traces_sample_rate: f32,
    /// `SENTRY_PROFILE_SESSION_SAMPLE_RATE`, default 1.0.
    pub profile_session_sample_rate: f64,
    /// `SENTRY_PROFILE_FREQUENCY_HZ`: samples per second per thread, 1 to
    /// 1000, default 101.
    pub profile_frequency_hz: u32,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (`http://host:port`): also post
    /// profiles to this OpenTelemetry collector.
    pub otlp_endpoint: Option<String>,
    /// `SENTRY_PROFILE_EXPORT_DIR`: where the pprof and OTLP files go (see
    /// [`Settings::export_dir`]); with no DSN they go beside the envelopes
    /// unless this says otherwise.
    pub profile_export_dir: Option<PathBuf>,
}

impl Settings {
    /// Reads the settings, reporting any value that does not parse.
    pub fn from_env() -> Result<Self, String> {
        fn var<T: std::str::FromStr>(name: &str, default: T) -> Result<T, String> {
            match std::env::var(name) {
                Ok(v) if !v.is_empty() => {
                    v.parse().map_err(|_| format!("{name}={v:?} is not valid"))
                }
                _ => Ok(default),
            }
        }
        Ok(Self {
            addr: var("ADDR", SocketAddr::from(([127, 0, 0, 1], 3000)))?,
            dsn: std::env::var("SENTRY_DSN").ok().filter(|s| !s.is_empty()),
            envelope_dir: var("SENTRY_ENVELOPE_DIR", PathBuf::from("sentry-envelopes"))?,
            traces_sample_rate: var("SENTRY_TRACES_SAMPLE_RATE", 1.0)?,
            profile_session_sample_rate: var("SENTRY_PROFILE_SESSION_SAMPLE_RATE", 1.0)?,
            profile_frequency_hz: var(
                "SENTRY_PROFILE_FREQUENCY_HZ",
                sentry_profiling::DEFAULT_FREQUENCY_HZ,
            )?,
            otlp_endpoint: std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
                .ok()
                .filter(|s| !s.is_empty()),
            profile_export_dir: std::env::var_os("SENTRY_PROFILE_EXPORT_DIR")
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
        })
    }

    /// The directory of the pprof and OTLP files, if any: the one set, else
    /// the envelope directory when there is no DSN.
    pub fn export_dir(&self) -> Option<&std::path::Path> {
        match (&self.profile_export_dir, &self.dsn) {
            (Some(dir), _) => Some(dir),
            (None, None) => Some(&self.envelope_dir),
            (None, Some(_)) => None,
        }
    }
}

/// The pprof file in the export directory ([`Settings::export_dir`]):
/// each chunk's profile, the newest at this name, older ones rotated to
/// `profile.pb.gz.1`, `.2`, …
pub const PPROF_FILE: &str = "profile.pb.gz";
/// The OTLP profiles file in the export directory, rotated as
/// [`PPROF_FILE`] is.
pub const OTLP_FILE: &str = "profile.otlp.pb";

/// The DSN used with the local envelope directory: the client needs one to
/// send anything, and nothing ever connects to it.
pub const LOCAL_DSN: &str = "https://public@sentry.invalid/1";

/// Sentry client options with profiling, as the README shows.
pub fn sentry_options(settings: &Settings) -> Result<sentry::ClientOptions, String> {
    let mut options = sentry::ClientOptions::new().traces_sample_rate(settings.traces_sample_rate);
    options.release = sentry::release_name!();
    // The last chunk is finished, exported and written at shutdown: on a
    // busy machine that can take longer than the SDK's default 2 s (2.1 s
    // was seen for a debug build beside four CPU hogs). Shutdown returns as
    // soon as it is done.
    options.shutdown_timeout = std::time::Duration::from_secs(10);
    let mut profiling = ProfilingIntegration::new()
        .profile_session_sample_rate(settings.profile_session_sample_rate)
        .profile_lifecycle(ProfileLifecycle::Trace)
        .frequency_hz(settings.profile_frequency_hz);
    if let Some(endpoint) = &settings.otlp_endpoint {
        profiling = profiling.otlp_endpoint(endpoint.trim_end_matches('/'));
    }
    match &settings.dsn {
        Some(dsn) => options.dsn = Some(dsn.parse().map_err(|e| format!("SENTRY_DSN: {e}"))?),
        None => {
            options.dsn = LOCAL_DSN.parse().ok();
            options.transport = Some(
                EnvelopeDirTransport::factory(&settings.envelope_dir)
                    .map_err(|e| format!("{}: {e}", settings.envelope_dir.display()))?,
            );
        }
    }
    if let Some(dir) = settings.export_dir() {
        // Every chunk as pprof and OTLP files (the last ten kept).
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        profiling = profiling
            .pprof_file(dir.join(PPROF_FILE))
            .otlp_file(dir.join(OTLP_FILE));
    }
    Ok(profiling.apply(options))
}

/// Installs the tracing subscriber: logs to stderr, Sentry spans, and the
/// profiler's layer (after Sentry's, so it sees each span's Sentry span).
pub fn init_tracing() {
    let _ = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "warn".into()),
                ),
        )
        .with(sentry::integrations::tracing::SpanLayer::new())
        .with(sentry_profiling_tracing::layer())
        .try_init();
}

/// Counts what a directory of envelopes holds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EnvelopeSummary {
    /// Envelope files.
    pub files: usize,
    /// `profile_chunk` items.
    pub chunks: usize,
    /// `transaction` items.
    pub transactions: usize,
}

/// Reads every `*.envelope` file in `dir` and counts its items by type.
pub fn summarize_envelopes(dir: &std::path::Path) -> EnvelopeSummary {
    let mut summary = EnvelopeSummary::default();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return summary;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "envelope") {
            continue;
        }
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        summary.files += 1;
        for item in parse_envelope(&bytes).items {
            match item.header.get("type").and_then(|t| t.as_str()) {
                Some("profile_chunk") => summary.chunks += 1,
                Some("transaction") => summary.transactions += 1,
                _ => {}
            }
        }
    }
    summary
}

/// What the profiler's counters say about system calls the kernel refused
/// the sampler (a seccomp policy can forbid them), in one line for the
/// summary and the preview page; `None` when nothing was refused. The
/// profiler said it on stderr as it happened, more precisely (which call,
/// which `errno`); this is the reminder at the end of the run.
pub fn sampling_problem(stats: &sentry_profiling::ProfilerStats) -> Option<String> {
    let s = &stats.sampler;
    let refused: Vec<String> = [
        ("rt_tgsigqueueinfo", s.signals_denied),
        ("timer_create/timer_settime", s.timers_denied),
        ("process_vm_readv", s.vm_read_denied),
    ]
    .into_iter()
    .filter(|(_, calls)| *calls > 0)
    .map(|(call, calls)| {
        let plural = if calls == 1 { "" } else { "s" };
        format!("{call} ({calls} call{plural})")
    })
    .collect();
    let refused = match refused.as_slice() {
        [] => return None,
        [one] => one.clone(),
        [first @ .., last] => format!("{} and {last}", first.join(", ")),
    };
    // The example samples with CPU-time timers: without them and without
    // signals, no running code can be captured.
    Some(if s.signals_denied > 0 && s.timers_denied > 0 {
        format!(
            "cannot sample: the kernel refused {refused}, so no stack of running code could be captured once they were refused ({} captured in all): requests show synthetic frames; see the warning on stderr",
            s.samples_captured
        )
    } else {
        format!(
            "sampling degraded: the kernel refused {refused}; the sampler fell back and captured {} stacks; see the notice on stderr",
            s.samples_captured
        )
    })
}

/// Writes the profiler's counters beside the envelopes (as
/// [`sentry_profiling_preview::STATS_FILE`], with [`sampling_problem`] as a
/// warning) and the preview page, which shows for each transaction of the
/// run what Sentry will show for it. Returns the page's path.
pub fn write_preview(
    dir: &std::path::Path,
    stats: Option<&sentry_profiling::ProfilerStats>,
) -> Result<PathBuf, String> {
    if let Some(s) = stats {
        let counters = serde_json::json!({
            "session_sampled": s.session_sampled,
            "chunks_sent": s.chunks_sent,
            "samples_sent": s.samples_sent,
            "samples_captured": s.sampler.samples_captured,
            "samples_dropped_queue_full": s.sampler.dropped_queue_full,
            "samples_single_thread": s.samples_single_thread,
            "chunks_without_transport": s.chunks_without_transport,
            "lane_events_dropped": s.lane_events_dropped,
            "exports_sent": s.exports_sent,
            "exports_failed": s.exports_failed,
            "signals_denied": s.sampler.signals_denied,
            "timers_denied": s.sampler.timers_denied,
            "vm_read_denied": s.sampler.vm_read_denied,
            sentry_profiling_preview::WARNINGS_KEY: sampling_problem(s).into_iter().collect::<Vec<_>>(),
        });
        let path = dir.join(sentry_profiling_preview::STATS_FILE);
        std::fs::write(&path, counters.to_string())
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    sentry_profiling_preview::write_page(dir)
        .map(|(path, _)| path)
        .map_err(|e| e.to_string())
}
