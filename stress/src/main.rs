//! The stress run (`cargo xtask stress [SECONDS] [HZ]`): the profiler, with
//! the real Sentry integration at up to 1000 Hz, beside everything that has
//! broken in-process profilers before, all at once:
//!
//! - threads that allocate and free heavily (a handler that touched the
//!   allocator would deadlock them);
//! - about 1000 thread spawns and exits a second, so thread ids are
//!   recycled every half minute or so (`pid_max` permitting);
//! - a shared library `dlopen`ed, run and `dlclose`d in a loop;
//! - a thread that blocks the profiling signal for a second at a time;
//! - a thread on a 32 KiB stack, without an alternate signal stack, working
//!   near the bottom of it;
//! - a thread that runs its work in a SIGUSR1 handler on an alternate
//!   signal stack in heap memory;
//! - Tokio workers serving HTTP to keep-alive clients over loopback.
//!
//! A watchdog aborts the run when any of them, or the sampler, makes no
//! progress for 10 s. At the end every chunk is held to Relay's rules and
//! every sample's thread id, name and time to the lives the threads
//! recorded themselves: no sample may be attributed to the thread that had
//! its id before or after.
//!
//! Usage: `stress [SECONDS] [HZ] [CHUNK_SECONDS]` (defaults 600, 1000, 60:
//! the library's default chunk length, longer than it takes about 1000
//! spawns a second to recycle thread ids under the kernel's default
//! `pid_max` of 32768, so a chunk holds threads that had the same id),
//! with the test library's path in `STRESS_CDYLIB` (default: next to this
//! executable). Exits non-zero on any failed check.

mod activities;
mod check;
// Shared with the end-to-end tests' helpers, by path: that crate's HTTP and
// TLS stack would triple this binary's release build.
#[path = "../../tests/src/relay.rs"]
#[expect(
    unreachable_pub,
    reason = "the file is a public module of sentry-profiling-tests"
)]
mod relay;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use activities::{Life, now_ns};
use sentry_profiling::ProfilingIntegration;

/// How long an activity may go without progress before the run is failed.
const STALL: Duration = Duration::from_secs(10);
/// How long stopping everything and sending the last chunk may take.
const SHUTDOWN_BOUND: Duration = Duration::from_secs(120);
/// The name of the thread that loads and unloads the test library.
const DLOPEN_THREAD: &str = "st-dlopen";
/// The name of the test library's file.
const CDYLIB_FILE: &str = "libstress_cdylib.so";

/// One watched activity.
struct Watched {
    name: &'static str,
    progress: Arc<AtomicU64>,
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T) -> T {
    args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default)
}

fn cdylib_path() -> String {
    if let Ok(p) = std::env::var("STRESS_CDYLIB") {
        return p;
    }
    let exe = std::env::current_exe().expect("current executable");
    let dir = exe.parent().expect("executable directory");
    dir.join(CDYLIB_FILE).to_string_lossy().into_owned()
}

/// Checks every second that each activity moved; aborts the process when one
/// has not for [`STALL`], or when the shutdown takes longer than
/// [`SHUTDOWN_BOUND`].
fn watchdog(watched: Vec<Watched>, stop: Arc<AtomicBool>, done: Arc<AtomicBool>) {
    let mut last: Vec<(u64, Instant)> = watched
        .iter()
        .map(|w| (w.progress.load(Ordering::Relaxed), Instant::now()))
        .collect();
    let mut stopping_since = None;
    while !done.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_secs(1));
        if stop.load(Ordering::Relaxed) {
            let since = *stopping_since.get_or_insert_with(Instant::now);
            if since.elapsed() > SHUTDOWN_BOUND {
                eprintln!("stress: FAILED: the shutdown did not finish within {SHUTDOWN_BOUND:?}");
                std::process::abort();
            }
            continue;
        }
        for (w, (value, at)) in watched.iter().zip(&mut last) {
            let now = w.progress.load(Ordering::Relaxed);
            if now != *value {
                *value = now;
                *at = Instant::now();
            } else if at.elapsed() >= STALL {
                eprintln!(
                    "stress: FAILED: `{}` made no progress for {:?} (stuck at {now}); \
                     profiler stats: {:?}",
                    w.name,
                    at.elapsed(),
                    sentry_profiling::stats()
                );
                std::process::abort();
            }
        }
    }
}

/// The calling thread's name as the kernel holds it.
fn kernel_name() -> String {
    std::fs::read_to_string("/proc/thread-self/comm")
        .map(|s| s.trim_end().to_owned())
        .unwrap_or_default()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let seconds: u64 = arg(&args, 0, 600);
    let hz: u32 = arg(&args, 1, 1000);
    let chunk_secs: u64 = arg(&args, 2, 60);
    let lib = cdylib_path();
    if !std::path::Path::new(&lib).exists() {
        eprintln!(
            "stress: the test library {lib} does not exist (build it with \
             `cargo build -p sentry-profiling-stress-cdylib`, or set STRESS_CDYLIB)"
        );
        return ExitCode::FAILURE;
    }
    eprintln!("stress: {seconds} s at {hz} Hz, {chunk_secs} s chunks, library {lib}");
    let main_life = Life {
        name: kernel_name(),
        tid: sentry_profiling::hooks::current_thread_id() as u32,
        start_ns: now_ns(),
        end_ns: u64::MAX,
        spawned: false,
    };

    // The client: manual lifecycle, every session sampled, envelopes to the
    // checker thread.
    let (tx, rx) = std::sync::mpsc::channel();
    let checker = std::thread::Builder::new()
        .name("st-checker".into())
        .spawn(move || {
            let start_ns = now_ns();
            let digest = check::run_checker(rx);
            let life = Life {
                name: "st-checker".into(),
                tid: sentry_profiling::hooks::current_thread_id() as u32,
                start_ns,
                end_ns: now_ns(),
                spawned: false,
            };
            (life, digest)
        })
        .expect("checker thread");
    let transport = Arc::new(check::ForwardTransport(Mutex::new(tx.clone())));
    let mut options = sentry::ClientOptions::new();
    options.dsn = "https://public@sentry.invalid/1".parse().ok();
    options.release = Some("sentry-profiling-stress@0.1.0".into());
    options.transport = Some(Arc::new(transport));
    let guard = sentry::init(
        ProfilingIntegration::new()
            .profile_session_sample_rate(1.0)
            .frequency_hz(hz)
            .chunk_duration(Duration::from_secs(chunk_secs))
            .apply(options),
    );

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let counter = || Arc::new(AtomicU64::new(0));
    let (alloc0, alloc1, spawns, dl, blocked, small, alt, http) = (
        counter(),
        counter(),
        counter(),
        counter(),
        counter(),
        counter(),
        counter(),
        counter(),
    );
    let ticks = counter();

    // Allocated here, on the main thread's heap, as a program would.
    let alt_stack = vec![0u8; activities::ALT_STACK].into_boxed_slice();
    let alloc_thread = activities::long_lived("st-alloc-1", None, &stop, &alloc1, |s, p| {
        activities::hammer_allocator(0x5eed_0001, s, p)
    });
    let spawner = activities::long_lived(activities::SPAWNER, None, &stop, &spawns, |s, p| {
        activities::spawn_churn(1000, s, p)
    });
    let dl_thread = {
        let lib = lib.clone();
        activities::long_lived(DLOPEN_THREAD, None, &stop, &dl, move |s, p| {
            activities::dlopen_loop(&lib, s, p)
        })
    };
    let block_thread = activities::long_lived("st-sigblock", None, &stop, &blocked, |s, p| {
        activities::block_signals(s, p)
    });
    let small_thread = activities::long_lived(
        "st-smallstack",
        Some(activities::SMALL_STACK),
        &stop,
        &small,
        |s, p| activities::small_stack(s, p),
    );
    let alt_thread = activities::long_lived("st-altstack", None, &stop, &alt, move |s, p| {
        activities::alt_stack(alt_stack, s, p)
    });
    let tokio_lives: activities::TokioLives = Arc::default();
    let http_thread = {
        let lives = Arc::clone(&tokio_lives);
        activities::long_lived("st-http", None, &stop, &http, move |s, p| {
            activities::serve_http(lives, s, p)
        })
    };
    let watched: Vec<Watched> = [
        ("allocator (main thread)", &alloc0),
        ("allocator (st-alloc-1)", &alloc1),
        ("thread spawns", &spawns),
        ("dlopen/dlclose", &dl),
        ("signal-blocking thread", &blocked),
        ("small-stack thread", &small),
        ("alternate-stack thread", &alt),
        ("HTTP requests", &http),
        ("sampler ticks", &ticks),
    ]
    .into_iter()
    .map(|(name, progress)| Watched {
        name,
        progress: Arc::clone(progress),
    })
    .collect();
    let watchdog_thread = {
        let (stop, done) = (Arc::clone(&stop), Arc::clone(&done));
        std::thread::Builder::new()
            .name("st-watchdog".into())
            .spawn(move || {
                let start_ns = now_ns();
                watchdog(watched, stop, done);
                Life {
                    name: "st-watchdog".into(),
                    tid: sentry_profiling::hooks::current_thread_id() as u32,
                    start_ns,
                    end_ns: now_ns(),
                    spawned: false,
                }
            })
            .expect("watchdog thread")
    };

    sentry_profiling::start_profiler();
    let started = Instant::now();
    let run_for = Duration::from_secs(seconds);
    let mut next_report = Duration::from_secs(60);
    // The main thread hammers the allocator (the main arena) until time is
    // up, and feeds the watchdog the sampler's tick count.
    let ticker_life = {
        let ticks = Arc::clone(&ticks);
        let main_stop = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let ticker = std::thread::Builder::new().name("st-ticker".into());
            let ticker = ticker.spawn_scoped(scope, || {
                let start_ns = now_ns();
                while started.elapsed() < run_for {
                    std::thread::sleep(Duration::from_millis(200));
                    if let Some(s) = sentry_profiling::stats() {
                        ticks.store(s.sampler.ticks, Ordering::Relaxed);
                    }
                    if started.elapsed() >= next_report {
                        next_report += Duration::from_secs(60);
                        eprintln!(
                            "stress: {:?}: spawns {} dlopen {} requests {} stats {:?}",
                            started.elapsed(),
                            spawns.load(Ordering::Relaxed),
                            dl.load(Ordering::Relaxed),
                            http.load(Ordering::Relaxed),
                            sentry_profiling::stats().map(|s| s.sampler)
                        );
                    }
                }
                main_stop.store(true, Ordering::Relaxed);
                Life {
                    name: "st-ticker".into(),
                    tid: sentry_profiling::hooks::current_thread_id() as u32,
                    start_ns,
                    end_ns: now_ns(),
                    spawned: false,
                }
            });
            let ticker = ticker.expect("ticker thread");
            activities::hammer_allocator(0x5eed_0000, &main_stop, &alloc0);
            ticker.join().expect("the ticker panicked")
        })
    };

    eprintln!("stress: stopping");
    stop.store(true, Ordering::Relaxed);
    let mut lives = vec![main_life, ticker_life];
    let (l, _) = alloc_thread.join().expect("st-alloc-1 panicked");
    lives.push(l);
    let (l, churn) = spawner.join().expect("the spawner panicked");
    lives.push(l);
    lives.extend(churn.lives.iter().cloned());
    let (l, dl_counts) = dl_thread.join().expect("st-dlopen panicked");
    lives.push(l);
    let (l, block_counts) = block_thread.join().expect("st-sigblock panicked");
    lives.push(l);
    let (l, depth) = small_thread.join().expect("st-smallstack panicked");
    lives.push(l);
    let (l, alt_counts) = alt_thread.join().expect("st-altstack panicked");
    lives.push(l);
    let (l, ()) = http_thread.join().expect("st-http panicked");
    lives.push(l);
    lives.extend(tokio_lives.lock().unwrap().iter().cloned());

    sentry_profiling::stop_profiler();
    let flushed = sentry::Hub::current()
        .client()
        .is_some_and(|c| c.flush(Some(Duration::from_secs(10))));
    drop(guard);
    let _ = tx.send(check::Message::End);
    let (l, digest) = checker.join().expect("the checker panicked");
    lives.push(l);
    done.store(true, Ordering::Relaxed);
    lives.push(watchdog_thread.join().expect("the watchdog panicked"));
    let elapsed = started.elapsed();

    let stats = sentry_profiling::stats().unwrap_or_default();
    let attribution = check::check_attribution(&digest, &lives);
    let churned = churn.lives.len() as u64;
    let requests = http.load(Ordering::Relaxed);

    println!("stress summary ({elapsed:.1?}, {hz} Hz, {chunk_secs} s chunks)");
    println!(
        "  chunks received {} (largest {} KiB), samples {}, envelopes {}",
        digest.chunks,
        digest.largest_chunk_bytes / 1024,
        digest.samples.len(),
        digest.envelopes
    );
    println!(
        "  thread spawns {churned} ({:.0}/s, {} failed), thread ids held by more than one \
         thread {}, \
         churn threads sampled {} (of which on a recycled id {}), churn samples {} \
         (+{} under the parent's name)",
        churned as f64 / elapsed.as_secs_f64(),
        churn.spawn_failures,
        attribution.reused_tids,
        attribution.churn_threads_sampled,
        attribution.recycled_threads_sampled,
        attribution.churn_samples,
        attribution.parent_named
    );
    println!(
        "  samples verified {}, on short-lived threads' shared timelines {}, of unrecorded threads {}, misattributed {}",
        attribution.verified,
        attribution.short_lived,
        attribution.other_threads,
        attribution.wrong_count
    );
    println!(
        "  dlopen/dlclose cycles {} (unloaded after dlclose {}/{} checked), samples of the \
         loading thread {}, of which in the library {}",
        dl_counts.cycles,
        dl_counts.unmapped,
        dl_counts.checked,
        attribution.dlopen_samples,
        digest.cdylib_samples
    );
    println!(
        "  HTTP requests {requests}, allocator rounds {}, signal-blocked periods {} \
         (signal pending at unblock {}), alt-stack handler runs {} (on the alt stack {}), \
         small-stack recursion depth {depth}",
        alloc0.load(Ordering::Relaxed) + alloc1.load(Ordering::Relaxed),
        block_counts.periods,
        block_counts.pending_at_unblock,
        alt_counts.handler_runs,
        alt_counts.on_alt_stack
    );
    let s = &stats.sampler;
    println!(
        "  profiler: chunks sent {}, samples sent {}, single-thread samples left out {}, \
         ticks {} (skipped {}), signals sent {}, captured {}, idle {}, off-stack {}, late {}, \
         abandoned {}, threads seen {}, recycled {}, dropped: queue full {}, no slot {}, \
         signal failed {}; mean time in the handler {:.1} µs (wall clock, preemption \
         included), unwinding {:.1} µs",
        stats.chunks_sent,
        stats.samples_sent,
        stats.samples_single_thread,
        s.ticks,
        s.ticks_skipped,
        s.signals_sent,
        s.samples_captured,
        s.samples_idle,
        s.samples_off_stack,
        s.samples_late,
        s.signals_abandoned,
        s.threads_seen,
        s.threads_recycled,
        s.dropped_queue_full,
        s.dropped_no_slot,
        s.dropped_signal_failed,
        s.handler_ns as f64 / s.samples_captured.max(1) as f64 / 1e3,
        s.unwind_ns as f64 / s.samples_captured.max(1) as f64 / 1e3,
    );

    let mut failures = Vec::new();
    let mut require = |ok: bool, what: String| {
        if !ok {
            failures.push(what);
        }
    };
    for (v, n) in &digest.relay {
        require(false, format!("{n} chunks break Relay's rule: {v}"));
    }
    for u in digest.unreadable.iter().take(5) {
        require(false, format!("unreadable envelope: {u}"));
    }
    for w in &attribution.wrong {
        require(false, format!("misattributed: {w}"));
    }
    require(
        attribution.wrong_count == 0,
        format!("{} misattributed samples", attribution.wrong_count),
    );
    require(flushed, "the client's flush timed out".into());
    require(digest.chunks > 0, "no chunk was sent".into());
    require(
        digest.chunks == stats.chunks_sent && digest.samples.len() as u64 == stats.samples_sent,
        format!(
            "the profiler counted {} chunks with {} samples, the transport got {} with {}",
            stats.chunks_sent,
            stats.samples_sent,
            digest.chunks,
            digest.samples.len()
        ),
    );
    require(
        attribution.unsampled_long_lived.is_empty(),
        format!(
            "threads that ran throughout have no sample: {:?}",
            attribution.unsampled_long_lived
        ),
    );
    require(
        attribution.churn_threads_sampled > 0,
        "no churn thread was sampled: the attribution check saw none".into(),
    );
    require(
        dl_counts.unmapped > 0,
        "the test library never left the address space: dlclose did not unload it".into(),
    );
    require(
        alt_counts.handler_runs > 0 && alt_counts.on_alt_stack == alt_counts.handler_runs,
        format!(
            "the SIGUSR1 handler ran {} times, {} of them on the alternate stack",
            alt_counts.handler_runs, alt_counts.on_alt_stack
        ),
    );
    require(
        digest.cdylib_samples > 0,
        "no sample has a frame named in the dlopened library: its frames lost their module".into(),
    );
    require(
        block_counts.pending_at_unblock > 0,
        "the profiler never signalled the thread that blocks its signal".into(),
    );
    require(
        churn.spawn_failures == 0,
        format!("{} thread spawns failed", churn.spawn_failures),
    );
    if failures.is_empty() {
        println!("stress: OK");
        ExitCode::SUCCESS
    } else {
        for f in &failures {
            println!("stress: FAILED: {f}");
        }
        ExitCode::FAILURE
    }
}
