//! Bad input and misuse: every invalid option gives a warning that names it
//! and says what was done (profiling disabled, or the value clamped), never
//! a panic; starting twice, stopping twice, stopping before starting, the
//! wrong lifecycle, and the tracing layer without `sentry::init` are
//! harmless.
//!
//! Each case runs in a child process of this binary (a fresh Sentry hub and
//! profiler, and a stderr of its own to read); the parent checks its exit
//! status, its warnings and the profiler state it reports.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sentry_profiling::{Error, ProfileLifecycle, ProfilingIntegration, Sampler, SamplerConfig};
use sentry_profiling_tests::CaptureTransport;

const CASE_ENV: &str = "SENTRY_PROFILING_BAD_INPUT_CASE";
/// A child that has not finished by then has hung.
const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

/// What a case's child process must report.
struct Expect {
    /// Substrings of its stderr.
    stderr: &'static [&'static str],
    /// The profiler state it prints on stdout.
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No profiling session exists (`stats()` is `None`).
    NoSession,
    /// A session exists but does not profile.
    NotProfiling,
    /// The profiler ran and captured samples.
    Profiled,
}

impl State {
    fn label(self) -> &'static str {
        match self {
            State::NoSession => "state: no session",
            State::NotProfiling => "state: not profiling",
            State::Profiled => "state: profiled",
        }
    }
}

const DISABLED: &str = "profiling disabled";

fn cases() -> Vec<(&'static str, Expect)> {
    let disabled = |stderr| Expect {
        stderr,
        state: State::NoSession,
    };
    vec![
        (
            "session_rate_nan",
            disabled(&["`profile_session_sample_rate` is NaN", DISABLED]),
        ),
        (
            "session_rate_negative",
            disabled(&["`profile_session_sample_rate` is -0.5", DISABLED]),
        ),
        (
            "session_rate_above_one",
            disabled(&["`profile_session_sample_rate` is 1.5", DISABLED]),
        ),
        (
            "profiles_rate_nan",
            disabled(&["`profiles_sample_rate` is NaN", DISABLED]),
        ),
        (
            "profiles_rate_above_one",
            disabled(&["`profiles_sample_rate` is 2", DISABLED]),
        ),
        (
            "profiles_sampler_garbage",
            Expect {
                stderr: &["`profiles_sampler`", "gave NaN", "profile nothing"],
                state: State::Profiled,
            },
        ),
        (
            "frequency_zero",
            disabled(&["invalid `frequency_hz`: 0 is outside 1..=1000", DISABLED]),
        ),
        (
            "frequency_above_max",
            disabled(&["invalid `frequency_hz`: 1001 is outside 1..=1000", DISABLED]),
        ),
        (
            "stack_copy_zero",
            disabled(&["invalid `stack_copy_bytes`: 0 is outside", DISABLED]),
        ),
        (
            "stack_copy_above_max",
            disabled(&["invalid `stack_copy_bytes`: 1048577 is outside", DISABLED]),
        ),
        (
            "signal_zero",
            disabled(&["invalid `signal`: 0 is not a signal", DISABLED]),
        ),
        (
            "signal_kill",
            disabled(&["invalid `signal`: 9 is not a signal", DISABLED]),
        ),
        (
            "signal_taken",
            Expect {
                stderr: &[
                    "`signal` 10 already has a handler",
                    "left alone",
                    DISABLED,
                    "application handler kept",
                ],
                state: State::NotProfiling,
            },
        ),
        (
            "chunk_duration_zero",
            Expect {
                stderr: &["`chunk_duration` 0ns is outside 1 s..=60 s; using 60s"],
                state: State::Profiled,
            },
        ),
        (
            "chunk_duration_short",
            Expect {
                stderr: &["`chunk_duration` 500ms is outside 1 s..=60 s; using 1s"],
                state: State::Profiled,
            },
        ),
        (
            "chunk_duration_long",
            Expect {
                stderr: &["`chunk_duration` 61s is outside 1 s..=60 s; using 60s"],
                state: State::Profiled,
            },
        ),
        (
            "manual_misuse",
            Expect {
                stderr: &[
                    "stop_profiler() has no effect: the profiler is not running",
                    "start_profiler() has no effect: the profiler is already running",
                    "misuse sequence done",
                ],
                state: State::Profiled,
            },
        ),
        (
            "trace_lifecycle_manual_calls",
            Expect {
                stderr: &[
                    "start_profiler() has no effect with the trace lifecycle",
                    "stop_profiler() has no effect with the trace lifecycle",
                ],
                state: State::NotProfiling,
            },
        ),
        (
            "no_dsn",
            Expect {
                stderr: &[
                    "sentry-profiling: profiling off: the Sentry client has no DSN",
                    "EnvelopeDirTransport::factory",
                ],
                state: State::NoSession,
            },
        ),
        (
            "layer_without_init",
            Expect {
                stderr: &["spans done without sentry::init"],
                state: State::NoSession,
            },
        ),
    ]
}

fn main() {
    if let Ok(case) = std::env::var(CASE_ENV) {
        run_case(&case);
        return;
    }
    sampler_config_errors_name_the_option();
    let mut failures = Vec::new();
    for (name, expect) in cases() {
        match check_case(name, &expect) {
            Ok(()) => println!("bad_input {name} ... ok"),
            Err(e) => {
                println!("bad_input {name} ... FAILED\n{e}");
                failures.push(name);
            }
        }
    }
    assert!(failures.is_empty(), "failed cases: {failures:?}");
    println!("bad_input: {} cases ok", cases().len());
}

/// `Sampler::start` (without Sentry) refuses invalid configurations with an
/// error naming the option, before touching any signal.
fn sampler_config_errors_name_the_option() {
    let invalid = [
        (SamplerConfig::default().frequency_hz(0), "frequency_hz"),
        (SamplerConfig::default().frequency_hz(5000), "frequency_hz"),
        (
            SamplerConfig::default().stack_copy_bytes(0),
            "stack_copy_bytes",
        ),
        (
            SamplerConfig::default().stack_copy_bytes(sentry_profiling::MAX_STACK_COPY_BYTES + 1),
            "stack_copy_bytes",
        ),
        (SamplerConfig::default().queue_capacity(0), "queue_capacity"),
        (SamplerConfig::default().signal(-3), "signal"),
        (SamplerConfig::default().signal(libc::SIGSTOP), "signal"),
        (SamplerConfig::default().signal(100_000), "signal"),
    ];
    for (config, option) in invalid {
        match Sampler::start(config.clone()) {
            Err(Error::InvalidOption { option: named, .. }) => {
                assert_eq!(named, option, "{config:?}")
            }
            other => panic!("{config:?}: expected InvalidOption({option}), got {other:?}"),
        }
    }
    println!("bad_input sampler_config_errors_name_the_option ... ok");
}

fn check_case(name: &str, expect: &Expect) -> Result<(), String> {
    let mut child = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
        .env(CASE_ENV, name)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    let deadline = Instant::now() + CHILD_TIMEOUT;
    loop {
        if child.try_wait().map_err(|e| e.to_string())?.is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("hung for {CHILD_TIMEOUT:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let show = || format!("--- stdout\n{stdout}--- stderr\n{stderr}");
    if !out.status.success() {
        return Err(format!("exited with {}\n{}", out.status, show()));
    }
    if stderr.contains("panicked") {
        return Err(format!("a panic was reported\n{}", show()));
    }
    for want in expect.stderr {
        if !stderr.contains(want) {
            return Err(format!("stderr lacks {want:?}\n{}", show()));
        }
    }
    if !stdout.lines().any(|l| l == expect.state.label()) {
        return Err(format!("expected {:?}\n{}", expect.state, show()));
    }
    Ok(())
}

#[inline(never)]
fn bad_input_busy(d: Duration) {
    let until = Instant::now() + d;
    let mut x = 0u64;
    while Instant::now() < until {
        x = std::hint::black_box(x.wrapping_mul(7).wrapping_add(3));
    }
}

/// Prints the profiler's state for the parent.
fn report_state() {
    let state = match sentry_profiling::stats() {
        None => State::NoSession,
        Some(s) if s.session_sampled && s.sampler.samples_captured > 0 => State::Profiled,
        Some(_) => State::NotProfiling,
    };
    println!("{}", state.label());
}

/// Initialises Sentry with `integration` and an in-memory transport.
fn init(
    integration: ProfilingIntegration,
    lifecycle_debug: bool,
) -> (sentry::ClientInitGuard, Arc<CaptureTransport>) {
    let capture = CaptureTransport::new();
    let mut options = sentry::ClientOptions::new().traces_sample_rate(1.0);
    options.dsn = sentry_profiling_examples::LOCAL_DSN.parse().ok();
    options.transport = Some(capture.factory());
    options.debug = lifecycle_debug;
    (sentry::init(integration.apply(options)), capture)
}

/// Runs the manual profiler for a moment with a busy thread, as an
/// application would, then reports the state.
fn profile_briefly_and_report(integration: ProfilingIntegration) {
    let (guard, _capture) = init(integration, false);
    sentry_profiling::start_profiler();
    bad_input_busy(Duration::from_millis(300));
    wait_for_samples();
    sentry_profiling::stop_profiler();
    report_state();
    drop(guard);
}

/// Waits (generously) for a running profiler's first samples.
fn wait_for_samples() {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        match sentry_profiling::stats() {
            Some(s) if s.session_sampled && s.sampler.samples_captured == 0 => {
                bad_input_busy(Duration::from_millis(50))
            }
            _ => return,
        }
    }
}

fn on() -> ProfilingIntegration {
    ProfilingIntegration::new().profile_session_sample_rate(1.0)
}

fn run_case(case: &str) {
    match case {
        "session_rate_nan" => {
            profile_briefly_and_report(on().profile_session_sample_rate(f64::NAN))
        }
        "session_rate_negative" => {
            profile_briefly_and_report(on().profile_session_sample_rate(-0.5))
        }
        "session_rate_above_one" => {
            profile_briefly_and_report(on().profile_session_sample_rate(1.5))
        }
        "profiles_rate_nan" => profile_briefly_and_report(on().profiles_sample_rate(f64::NAN)),
        "profiles_rate_above_one" => profile_briefly_and_report(on().profiles_sample_rate(2.0)),
        "profiles_sampler_garbage" => profiles_sampler_garbage(),
        "frequency_zero" => profile_briefly_and_report(on().frequency_hz(0)),
        "frequency_above_max" => profile_briefly_and_report(on().frequency_hz(1001)),
        "stack_copy_zero" => profile_briefly_and_report(on().stack_copy_bytes(0)),
        "stack_copy_above_max" => profile_briefly_and_report(
            on().stack_copy_bytes(sentry_profiling::MAX_STACK_COPY_BYTES + 1),
        ),
        "signal_zero" => profile_briefly_and_report(on().signal(0)),
        "signal_kill" => profile_briefly_and_report(on().signal(libc::SIGKILL)),
        "signal_taken" => signal_taken(),
        "chunk_duration_zero" => profile_briefly_and_report(on().chunk_duration(Duration::ZERO)),
        "chunk_duration_short" => {
            profile_briefly_and_report(on().chunk_duration(Duration::from_millis(500)))
        }
        "chunk_duration_long" => {
            profile_briefly_and_report(on().chunk_duration(Duration::from_secs(61)))
        }
        "manual_misuse" => manual_misuse(),
        "trace_lifecycle_manual_calls" => trace_lifecycle_manual_calls(),
        "layer_without_init" => layer_without_init(),
        "no_dsn" => no_dsn(),
        other => panic!("unknown case {other}"),
    }
}

/// A transport set without a DSN: the client sends nothing, the profiler
/// does not start, and stderr says so and how to keep envelopes locally.
fn no_dsn() {
    // SAFETY: set before any other thread of this child exists.
    unsafe { std::env::remove_var("SENTRY_DSN") };
    let capture = CaptureTransport::new();
    let mut options = sentry::ClientOptions::new().traces_sample_rate(1.0);
    options.transport = Some(capture.factory());
    let guard = sentry::init(on().apply(options));
    report_state();
    drop(guard);
}

/// A `profiles_sampler` returning NaN, negative and huge values: warned
/// once; the profiler runs, and NaN or negative profile nothing.
fn profiles_sampler_garbage() {
    let (guard, _capture) = init(
        ProfilingIntegration::new().profiles_sampler(|name| match name {
            "nan" => f64::NAN,
            "negative" => -1.0,
            _ => 7.0,
        }),
        false,
    );
    let profiled = |lane, name| {
        sentry_profiling::hooks::session()
            .unwrap()
            .transaction_profiled(lane, name)
    };
    assert!(!profiled(1, "nan"));
    assert!(!profiled(2, "negative"));
    assert!(profiled(3, "huge"));
    // Transaction-based mode samples whenever a profiled root is active.
    let request =
        sentry_profiling::hooks::Request::new(&sentry_profiling::hooks::session().unwrap());
    assert!(request.begin(true, &std::sync::Arc::from("huge"), Default::default,));
    bad_input_busy(Duration::from_millis(300));
    wait_for_samples();
    request.finish();
    report_state();
    drop(guard);
}

extern "C" fn app_usr1(_: libc::c_int) {}

fn usr1_handler() -> usize {
    // SAFETY: a null new action only reads the current one into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGUSR1, std::ptr::null(), &mut old);
        old.sa_sigaction
    }
}

/// The application handles SIGUSR1 and asks the profiler to use it: the
/// profiler refuses, and the application's handler stays.
fn signal_taken() {
    // SAFETY: installs a handler that does nothing (async-signal-safe).
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = app_usr1 as *const () as usize;
        libc::sigemptyset(&mut action.sa_mask);
        assert_eq!(
            libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut()),
            0
        );
    }
    profile_briefly_and_report(on().signal(libc::SIGUSR1));
    if usr1_handler() == app_usr1 as *const () as usize {
        eprintln!("application handler kept");
    }
}

/// Stop before start, start twice, stop twice: logged no-ops in debug mode;
/// the profiler still runs between the first start and stop.
fn manual_misuse() {
    let (guard, _capture) = init(on(), true);
    sentry_profiling::stop_profiler();
    sentry_profiling::start_profiler();
    sentry_profiling::start_profiler();
    bad_input_busy(Duration::from_millis(300));
    wait_for_samples();
    sentry_profiling::stop_profiler();
    sentry_profiling::stop_profiler();
    // A tick that had begun when the sampler was paused may still finish.
    std::thread::sleep(Duration::from_millis(200));
    let ticks = sentry_profiling::stats().unwrap().sampler.ticks;
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        sentry_profiling::stats().unwrap().sampler.ticks,
        ticks,
        "the profiler kept ticking after stop"
    );
    eprintln!("misuse sequence done");
    report_state();
    drop(guard);
    // After the client closed, everything is still a no-op.
    sentry_profiling::start_profiler();
    sentry_profiling::stop_profiler();
}

/// Manual calls with the trace lifecycle do nothing (and say so).
fn trace_lifecycle_manual_calls() {
    let (guard, _capture) = init(on().profile_lifecycle(ProfileLifecycle::Trace), true);
    sentry_profiling::start_profiler();
    bad_input_busy(Duration::from_millis(200));
    sentry_profiling::stop_profiler();
    report_state();
    drop(guard);
}

/// The tracing layer without `sentry::init`: spans entered and exited on
/// several Tokio tasks and workers, nothing panics and nothing is sent.
fn layer_without_init() {
    use tracing::Instrument;
    use tracing_subscriber::prelude::*;
    tracing_subscriber::registry()
        .with(sentry::integrations::tracing::SpanLayer::new())
        .with(sentry_profiling_tracing::layer())
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                tokio::spawn(
                    async move {
                        for step in 0..5 {
                            let inner = tracing::info_span!("step", step);
                            async {
                                bad_input_busy(Duration::from_millis(1));
                                tokio::task::yield_now().await;
                            }
                            .instrument(inner)
                            .await;
                            tokio::time::sleep(Duration::from_millis(2)).await;
                        }
                        i
                    }
                    .instrument(tracing::info_span!("request", i)),
                )
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
    assert!(sentry::Hub::current().client().is_none());
    assert!(
        sentry_profiling::hooks::session()
            .and_then(|s| s.running_profiler_id())
            .is_none()
    );
    sentry_profiling::start_profiler();
    sentry_profiling::stop_profiler();
    eprintln!("spans done without sentry::init");
    report_state();
}
