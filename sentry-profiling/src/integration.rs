//! The Sentry integration: options, the session sampling decision, and
//! wiring into `sentry::init`.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sentry_core::{ClientOptions, Integration};

use crate::attribution::ThreadAttribution;
use crate::export::{ExportTarget, FileRetention};
use crate::options::{
    DEFAULT_CHUNK_DURATION, DEFAULT_HTTP_TIMEOUT, DEFAULT_PROFILE_SESSION_SAMPLE_RATE,
    MAX_CHUNK_DURATION, ProfileLifecycle, SamplerConfig,
};
use crate::session::{Session, SessionConfig};
use crate::transaction_profile::{ProfilesSampler, V1Config};
use crate::transport::{InnerFactory, ProfilingTransportFactory};

/// Continuous profiling for Sentry.
///
/// Build it with the `#[must_use]` setters, then let it wrap your client
/// options with [`ProfilingIntegration::apply`] (which also adds it to
/// `integrations`), and pass those to `sentry::init`:
///
/// ```no_run
/// use sentry_profiling::{ProfileLifecycle, ProfilingIntegration};
///
/// let mut options = sentry::ClientOptions::new().traces_sample_rate(1.0);
/// options.release = sentry::release_name!();
/// let _guard = sentry::init(
///     ProfilingIntegration::new()
///         .profile_session_sample_rate(1.0)
///         .profile_lifecycle(ProfileLifecycle::Trace)
///         .apply(options),
/// );
/// ```
#[derive(Clone)]
pub struct ProfilingIntegration {
    session_sample_rate: f64,
    lifecycle: ProfileLifecycle,
    sampler: SamplerConfig,
    chunk_duration: Duration,
    symbolize: bool,
    attribution: ThreadAttribution,
    exports: Vec<ExportTarget>,
    file_retention: FileRetention,
    profiles_sample_rate: Option<f64>,
    profiles_sampler: Option<ProfilesSampler>,
    http_timeout: Duration,
    long_poll: Duration,
    short_request_lanes: bool,
    blocking_issues: bool,
    blocking_threshold: Duration,
    blocking_interval: Duration,
    /// Whether [`ProfilingIntegration::apply`] put this integration into the
    /// options (wrapping their transport); see [`NOT_APPLIED`].
    applied: bool,
    runtime: Arc<OnceLock<Arc<Session>>>,
}

/// The warning when the integration reaches `sentry::init` without
/// [`ProfilingIntegration::apply`] (through `ClientOptions::add_integration`
/// or `integrations`).
///
/// The client builds its transport before it calls `Integration::setup`, so
/// the integration cannot wrap it there, and nothing else it can reach in
/// sentry-core 0.49 sees transactions before they are sent (they skip
/// `before_send`; there is no `before_send_transaction`) or tells it that
/// the client closes. Transactions would then carry no `contexts.profile`
/// (a scope context cannot carry it: the SDK writes contexts it does not
/// know with `"type":"unknown"`, which Relay does not read as a profile
/// context), and the last chunk would be lost at shutdown. A profiler whose
/// profiles no transaction links to costs CPU for nothing, so it does not
/// start.
pub(crate) const NOT_APPLIED: &str = "sentry-profiling: profiling disabled: `ProfilingIntegration` was added with `add_integration` (or `integrations`), which cannot link transactions to profiles or send the last chunk at shutdown; pass the client options through `ProfilingIntegration::new()...apply(options)` instead";

/// Said on stderr (once a process) when the integration is set up on a
/// client without a DSN.
pub(crate) const NO_DSN: &str = "sentry-profiling: profiling off: the Sentry client has no DSN, so it sends nothing (no transactions, no profile chunks, whatever its transport) and the profiler does not start; set `dsn` (or SENTRY_DSN), or, to keep the envelopes on this machine, set any DSN (such as https://public@sentry.invalid/1) with `transport` = `sentry_profiling::EnvelopeDirTransport::factory(dir)`";

impl std::fmt::Debug for ProfilingIntegration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProfilingIntegration")
            .field("profile_session_sample_rate", &self.session_sample_rate)
            .field("profile_lifecycle", &self.lifecycle)
            .field("sampler", &self.sampler)
            .field("chunk_duration", &self.chunk_duration)
            .field("symbolize", &self.symbolize)
            .field("thread_attribution", &self.attribution)
            .field("exports", &self.exports)
            .field("file_retention", &self.file_retention)
            .field("profiles_sample_rate", &self.profiles_sample_rate)
            .field("profiles_sampler", &self.profiles_sampler.is_some())
            .field("http_timeout", &self.http_timeout)
            .field("long_poll_threshold", &self.long_poll)
            .field("blocking_issues", &self.blocking_issues)
            .field("blocking_threshold", &self.blocking_threshold)
            .field("blocking_interval", &self.blocking_interval)
            .field("short_request_lanes", &self.short_request_lanes)
            .finish_non_exhaustive()
    }
}

impl Default for ProfilingIntegration {
    fn default() -> Self {
        Self::new()
    }
}

impl ProfilingIntegration {
    /// Defaults: session sample rate 0 (off), manual lifecycle, 101 Hz,
    /// 64 KiB stack copies, 60 s chunks, local symbolication on.
    pub fn new() -> Self {
        Self {
            session_sample_rate: DEFAULT_PROFILE_SESSION_SAMPLE_RATE,
            lifecycle: ProfileLifecycle::default(),
            sampler: SamplerConfig::default(),
            chunk_duration: DEFAULT_CHUNK_DURATION,
            symbolize: true,
            attribution: ThreadAttribution::default(),
            exports: Vec::new(),
            file_retention: FileRetention::default(),
            profiles_sample_rate: None,
            profiles_sampler: None,
            http_timeout: DEFAULT_HTTP_TIMEOUT,
            long_poll: crate::options::DEFAULT_LONG_POLL_THRESHOLD,
            short_request_lanes: false,
            blocking_issues: true,
            blocking_threshold: crate::blocking::DEFAULT_BLOCKING_THRESHOLD,
            blocking_interval: crate::blocking::DEFAULT_BLOCKING_INTERVAL,
            applied: false,
            runtime: Arc::new(OnceLock::new()),
        }
    }

    /// Share of processes that profile, 0.0 to 1.0, decided once at init.
    /// Out-of-range values (NaN, negative, above 1) disable profiling with a
    /// warning.
    #[must_use]
    pub fn profile_session_sample_rate(mut self, rate: f64) -> Self {
        self.session_sample_rate = rate;
        self
    }

    /// When the profiler runs. Default [`ProfileLifecycle::Manual`].
    #[must_use]
    pub fn profile_lifecycle(mut self, lifecycle: ProfileLifecycle) -> Self {
        self.lifecycle = lifecycle;
        self
    }

    /// Sampling frequency in Hz, 1 to 1000. Default 101. Out of range
    /// disables profiling with a warning.
    #[must_use]
    pub fn frequency_hz(mut self, hz: u32) -> Self {
        self.sampler.frequency_hz = hz;
        self
    }

    /// Stack bytes copied per sample, 256 B to 1 MiB. Default 64 KiB. Out of
    /// range disables profiling with a warning.
    #[must_use]
    pub fn stack_copy_bytes(mut self, bytes: usize) -> Self {
        self.sampler.stack_copy_bytes = bytes;
        self
    }

    /// The signal to sample with. Default: a free real-time signal. A signal
    /// that cannot be caught, or that already has a handler (which is left
    /// alone), disables profiling with a warning.
    #[must_use]
    pub fn signal(mut self, signal: i32) -> Self {
        self.sampler.signal = Some(signal);
        self
    }

    /// Whether running threads are sampled by their own CPU-time timers.
    /// Default true; see [`SamplerConfig::cpu_timers`].
    #[must_use]
    pub fn cpu_timers(mut self, enabled: bool) -> Self {
        self.sampler.cpu_timers = enabled;
        self
    }

    /// Whether threads that live between two listings of the thread list
    /// are sampled by a process-wide CPU-time timer. Default true; see
    /// [`SamplerConfig::short_lived_threads`].
    #[must_use]
    pub fn short_lived_threads(mut self, enabled: bool) -> Self {
        self.sampler.short_lived_threads = enabled;
        self
    }

    /// Longest chunk, 1 s to 60 s. Default 60 s. Zero means the default;
    /// other values outside the range are clamped to it, with a warning.
    #[must_use]
    pub fn chunk_duration(mut self, duration: Duration) -> Self {
        self.chunk_duration = duration;
        self
    }

    /// Whether frames carry function names resolved in-process from symbol
    /// tables. Default true; Sentry symbolicates from uploaded debug files
    /// either way.
    #[must_use]
    pub fn symbolize(mut self, on: bool) -> Self {
        self.symbolize = on;
        self
    }

    /// How samples and transactions are tied to threads. Default
    /// [`ThreadAttribution::Lanes`]: each request's samples follow it across
    /// `.await` hops between workers. [`ThreadAttribution::OsThreads`] is the
    /// behaviour Sentry's spec describes.
    #[must_use]
    pub fn thread_attribution(mut self, attribution: ThreadAttribution) -> Self {
        self.attribution = attribution;
        self
    }

    /// Also writes every chunk's profile as a gzipped pprof file (readable
    /// by `go tool pprof`, Pyroscope, Grafana), with
    /// `span_id`/`span_name`/`trace_id` labels. Each chunk is written when it
    /// finishes (every [`Self::chunk_duration`], and at shutdown) to `path`,
    /// and the one before it moves to `<path>.1`, the one before that to
    /// `<path>.2`, as log files rotate: see [`Self::export_files_kept`] and
    /// [`Self::export_files_max_bytes`]. Memory does not grow with the
    /// process's uptime, and a process killed mid-run keeps every chunk
    /// finished before. `go tool pprof path path.1 path.2` merges several.
    #[must_use]
    pub fn pprof_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.exports.push(ExportTarget::PprofFile(path.into()));
        self
    }

    /// Also writes every chunk's profile as an OTLP profiles export request
    /// (protobuf) when it finishes, rotated as [`Self::pprof_file`] is.
    #[must_use]
    pub fn otlp_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.exports.push(ExportTarget::OtlpFile(path.into()));
        self
    }

    /// How many files each file export keeps: the newest chunk and
    /// `kept - 1` rotated ones (older ones are deleted). Default 10 (with
    /// 60 s chunks, the last ten minutes); 0 means 1.
    #[must_use]
    pub fn export_files_kept(mut self, kept: usize) -> Self {
        self.file_retention.kept = kept.max(1);
        self
    }

    /// Most bytes each file export keeps on disk, all its files together:
    /// the oldest rotated files are deleted beyond it (the newest chunk's
    /// file always stays). Default 256 MiB.
    #[must_use]
    pub fn export_files_max_bytes(mut self, bytes: u64) -> Self {
        self.file_retention.max_bytes = bytes;
        self
    }

    /// Also posts every chunk to an OTLP/HTTP collector (`http://host:port`,
    /// path `/v1development/profiles` unless given), protobuf-encoded.
    #[must_use]
    pub fn otlp_endpoint(mut self, url: impl Into<String>) -> Self {
        self.exports.push(ExportTarget::OtlpHttp(url.into()));
        self
    }

    /// Transaction-based profiling (sample format V1, deprecated by Sentry
    /// but the only kind older self-hosted Sentry accepts): the share of
    /// sampled transactions that get a profile, sent with the transaction.
    /// Setting it switches continuous profiling off
    /// (`profile_session_sample_rate` then has no effect).
    #[must_use]
    pub fn profiles_sample_rate(mut self, rate: f64) -> Self {
        self.profiles_sample_rate = Some(rate);
        self
    }

    /// Like [`ProfilingIntegration::profiles_sample_rate`], decided per
    /// transaction name by `sampler` (returning 0.0 to 1.0).
    #[must_use]
    pub fn profiles_sampler(
        mut self,
        sampler: impl Fn(&str) -> f64 + Send + Sync + 'static,
    ) -> Self {
        self.profiles_sampler = Some(Arc::new(sampler));
        self
    }

    /// The longest a request to Sentry may take, connecting included (at
    /// most 10 s of it), when the crate delivers envelopes itself (the
    /// `http` feature, and no `transport` of your own in the options).
    /// Default 30 s ([`DEFAULT_HTTP_TIMEOUT`]). An endpoint that accepts a
    /// connection and never answers then costs one request timeout per
    /// envelope, not a transport stuck for good.
    #[must_use]
    pub fn http_timeout(mut self, timeout: Duration) -> Self {
        self.http_timeout = timeout;
        self
    }

    /// The shortest poll of an instrumented request (`sentry-profiling-tracing`'s
    /// `http_layer()`, `spawn_in_span`, `.profiled()`) counted as a long
    /// poll: one that kept its Tokio worker from every other task for that
    /// long. Counted in [`crate::ProfilerStats::long_polls`] and in each
    /// request's `tokio.long_polls` data. Default 10 ms
    /// ([`crate::DEFAULT_LONG_POLL_THRESHOLD`]); zero is taken as
    /// the default.
    #[must_use]
    pub fn long_poll_threshold(mut self, threshold: Duration) -> Self {
        self.long_poll = threshold;
        self
    }

    /// Whether a poll of a request that blocks its Tokio worker for at least
    /// [`ProfilingIntegration::blocking_threshold`] becomes a Sentry issue
    /// event (level warning, grouped by the code that blocked and how:
    /// on the CPU, in the kernel in a named call, waiting on a lock; at
    /// most one event per blocking site per
    /// [`ProfilingIntegration::blocking_interval`], and
    /// [`crate::MAX_BLOCKING_EVENTS_PER_MINUTE`] in all). Default true:
    /// see the README's "Blocking polls as issues" for why, and for what
    /// the events count against. Found on the profiler's chunk thread
    /// from what the profile already holds: no request pays for it.
    #[must_use]
    pub fn blocking_issues(mut self, on: bool) -> Self {
        self.blocking_issues = on;
        self
    }

    /// The shortest poll that becomes a blocking-poll issue event (see
    /// [`ProfilingIntegration::blocking_issues`]). Default 50 ms
    /// ([`crate::DEFAULT_BLOCKING_THRESHOLD`]); zero is taken as the
    /// default, and shorter than [`crate::MIN_BLOCKING_THRESHOLD`] (1 ms)
    /// as that.
    #[must_use]
    pub fn blocking_threshold(mut self, threshold: Duration) -> Self {
        self.blocking_threshold = threshold;
        self
    }

    /// How long the blocking polls of one site (culprit and kind) are
    /// gathered into one event, which carries their count, worst and
    /// median durations and the worst one's stack and trace. Default 60 s
    /// ([`crate::DEFAULT_BLOCKING_INTERVAL`]); zero is taken as the
    /// default, and shorter than [`crate::MIN_BLOCKING_INTERVAL`] (1 s) as
    /// that. The windows still open at shutdown are sent then.
    #[must_use]
    pub fn blocking_interval(mut self, interval: Duration) -> Self {
        self.blocking_interval = interval;
        self
    }

    /// Whether a request whose transaction lasts less than 19.8 ms keeps a
    /// lane of its own in the chunks sent to Sentry. Default false: Sentry
    /// (Relay) removes the `profiler_id` of such a transaction, so no
    /// profile view ever shows its lane, and at thousands of requests a
    /// second those lanes (each with its `(awaiting)` and queued fill-ins
    /// and a thread entry in the chunk) were most of what the profiler
    /// thread did and sent. Without them a short request's samples of
    /// running code stay on the OS thread that took them, where Sentry's
    /// thread and aggregate views show them. Transactions of 19.8 ms or
    /// more keep their lanes either way, as do all requests when a pprof or
    /// OTLP export is set (their samples carry the request's labels) or
    /// with transaction profiles. Counted in
    /// [`crate::ProfilerStats::lanes_unlinked`].
    #[must_use]
    pub fn short_request_lanes(mut self, keep: bool) -> Self {
        self.short_request_lanes = keep;
        self
    }

    /// Adds this integration to `options` and wraps their transport, so that
    /// transactions carry the profile context and the last chunk is sent at
    /// shutdown. Applies `sentry::apply_defaults` first (as `sentry::init`
    /// would).
    ///
    /// With the `http` feature (on by default) and no `transport` set in
    /// `options`, the crate delivers envelopes itself: the SDK's reqwest
    /// transport, with request timeouts ([`Self::http_timeout`]), carries
    /// what the SDK sends, and a sender of the crate's own carries profile
    /// chunks, honouring Sentry's `profile_chunk` rate limits (see
    /// [`crate::ChunkDrops`]). With a transport of your own, chunks travel
    /// through it, and rate limits and failures are its business.
    ///
    /// This is the only way in: an integration added with
    /// `ClientOptions::add_integration` (sentry-rust's usual way) sees the
    /// options only after the client has built its transport, so it could
    /// neither link transactions nor send the last chunk; profiling then
    /// stays off, with one warning that names `apply`.
    pub fn apply(mut self, options: ClientOptions) -> ClientOptions {
        self.applied = true;
        let own_transport = options.transport.is_some();
        let mut options = sentry::apply_defaults(options);
        // Defaults are applied; a second application in `sentry::init` must
        // not add the default integrations twice.
        options.default_integrations = false;
        let runtime = Arc::clone(self.runtime.get_or_init(Session::new));
        let inner = if own_transport {
            options.transport.take().map(InnerFactory::Client)
        } else {
            self.default_transport(options.transport.take())
        };
        if let Some(inner) = inner {
            options.transport = Some(Arc::new(ProfilingTransportFactory { inner, runtime }));
        }
        options.integrations.push(Arc::new(self));
        options
    }

    /// The transport when the application brings none: the crate's own
    /// HTTP delivery.
    #[cfg(feature = "http")]
    fn default_transport(
        &self,
        _sdk_default: Option<Arc<dyn sentry_core::TransportFactory>>,
    ) -> Option<InnerFactory> {
        let timeout = if self.http_timeout.is_zero() {
            eprintln!(
                "sentry-profiling: `http_timeout` of 0 would fail every request; using {DEFAULT_HTTP_TIMEOUT:?}"
            );
            DEFAULT_HTTP_TIMEOUT
        } else {
            self.http_timeout
        };
        Some(InnerFactory::Http(timeout))
    }

    /// The transport when the application brings none: the SDK's default,
    /// if it has one.
    #[cfg(not(feature = "http"))]
    fn default_transport(
        &self,
        sdk_default: Option<Arc<dyn sentry_core::TransportFactory>>,
    ) -> Option<InnerFactory> {
        sdk_default.map(InnerFactory::Client)
    }

    fn settle(&self, options: &ClientOptions) -> Option<SessionConfig> {
        let rate = if self.profiles_sample_rate.is_some() || self.profiles_sampler.is_some() {
            // Transaction-based: every process runs the profiler; each
            // transaction is sampled on its own.
            0.0
        } else {
            self.session_sample_rate
        };
        if !(0.0..=1.0).contains(&rate) {
            eprintln!(
                "sentry-profiling: profiling disabled: `profile_session_sample_rate` is {rate}, it must be between 0.0 and 1.0"
            );
            return None;
        }
        let sampler = match self.sampler.clone().validated() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("{e}; profiling disabled");
                return None;
            }
        };
        let chunk_duration = settle_chunk_duration(self.chunk_duration);
        if self.lifecycle == ProfileLifecycle::Trace
            && matches!(
                options.traces_sampling_strategy,
                sentry_core::TracesSamplingStrategy::Disabled
            )
        {
            eprintln!(
                "sentry-profiling: `profile_lifecycle` is Trace but tracing is disabled (set `traces_sample_rate` or `traces_sampler`): the profiler will never start"
            );
        }
        Some(SessionConfig {
            sampler,
            lifecycle: self.lifecycle,
            chunk_duration,
            symbolize: self.symbolize,
            release: options.release.as_deref().unwrap_or("unknown").to_owned(),
            environment: options.environment.as_deref().map(str::to_owned),
            debug: options.debug,
            attribution: self.attribution,
            exports: self.exports.clone(),
            file_retention: self.file_retention,
            v1: self.v1_config()?,
            long_poll: if self.long_poll.is_zero() {
                crate::options::DEFAULT_LONG_POLL_THRESHOLD
            } else {
                self.long_poll
            },
            short_request_lanes: self.short_request_lanes,
            blocking: crate::blocking::BlockingConfig {
                enabled: self.blocking_issues,
                threshold: settle_at_least(
                    self.blocking_threshold,
                    crate::blocking::DEFAULT_BLOCKING_THRESHOLD,
                    crate::blocking::MIN_BLOCKING_THRESHOLD,
                    "blocking_threshold",
                ),
                interval: settle_at_least(
                    self.blocking_interval,
                    crate::blocking::DEFAULT_BLOCKING_INTERVAL,
                    crate::blocking::MIN_BLOCKING_INTERVAL,
                    "blocking_interval",
                ),
            },
            service_name: std::env::current_exe()
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_else(|| "unknown_service".into()),
        })
    }
}

/// `requested`, or `default` when zero, or `min` (with a warning) when
/// shorter.
fn settle_at_least(requested: Duration, default: Duration, min: Duration, name: &str) -> Duration {
    if requested.is_zero() {
        default
    } else if requested < min {
        eprintln!("sentry-profiling: `{name}` {requested:?} is below {min:?}; {min:?} is used");
        min
    } else {
        requested
    }
}

/// The chunk duration to use for `requested`: zero means the default, other
/// values outside 1 s..=60 s are clamped to the nearer bound, with a warning.
fn settle_chunk_duration(requested: Duration) -> Duration {
    let min = Duration::from_secs(1);
    let used = if requested.is_zero() {
        DEFAULT_CHUNK_DURATION
    } else {
        requested.clamp(min, MAX_CHUNK_DURATION)
    };
    if used != requested {
        eprintln!(
            "sentry-profiling: `chunk_duration` {requested:?} is outside 1 s..=60 s; using {used:?}"
        );
    }
    used
}

impl ProfilingIntegration {
    /// Transaction-based settings: `Ok(None)` in continuous mode, `Err` when
    /// they are invalid (profiling is then off).
    fn v1_config_checked(&self) -> Result<Option<V1Config>, ()> {
        if self.profiles_sample_rate.is_none() && self.profiles_sampler.is_none() {
            return Ok(None);
        }
        if let Some(rate) = self.profiles_sample_rate {
            if !(0.0..=1.0).contains(&rate) {
                eprintln!(
                    "sentry-profiling: profiling disabled: `profiles_sample_rate` is {rate}, it must be between 0.0 and 1.0"
                );
                return Err(());
            }
        }
        if self.session_sample_rate > 0.0 {
            eprintln!(
                "sentry-profiling: `profile_session_sample_rate` has no effect: `profiles_sample_rate`/`profiles_sampler` select transaction-based profiling"
            );
        }
        Ok(Some(V1Config {
            rate: self.profiles_sample_rate,
            sampler: self.profiles_sampler.clone(),
        }))
    }

    fn v1_config(&self) -> Option<Option<V1Config>> {
        self.v1_config_checked().ok()
    }
}

impl Integration for ProfilingIntegration {
    fn name(&self) -> &'static str {
        "profiling"
    }

    fn setup(&self, options: &mut ClientOptions) {
        if !self.applied {
            eprintln!("{NOT_APPLIED}");
            return;
        }
        let runtime = Arc::clone(self.runtime.get_or_init(Session::new));
        let Some(config) = self.settle(options) else {
            return;
        };
        if options.dsn.is_none() {
            // The client sends nothing without a DSN; neither do we. Said
            // once a process: a transport set without a DSN gets nothing,
            // which is not what its author expects.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| eprintln!("{NO_DSN}"));
            return;
        }
        let sampled = config.v1.is_some()
            || self.session_sample_rate >= 1.0
            || (self.session_sample_rate > 0.0 && rand::random::<f64>() < self.session_sample_rate);
        if config.debug {
            eprintln!(
                "[sentry] sentry-profiling: session {} (rate {}), lifecycle {:?}",
                if sampled { "sampled" } else { "not sampled" },
                self.session_sample_rate,
                config.lifecycle
            );
        }
        runtime.activate(config, sampled);
    }
}
