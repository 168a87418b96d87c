//! `fork()` in a profiled process: the child inherits the profiler's memory
//! but none of its threads. Every public call in the child is a harmless
//! no-op, its envelopes pass through unchanged, flush and shutdown do not
//! wait for the parent's threads, and the parent keeps profiling. Spawning
//! commands (fork+exec and posix_spawn) keeps working while sampling.

use std::os::unix::process::CommandExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sentry::protocol::Value;
use sentry_profiling::{EnvelopeDirTransport, ProfilingIntegration};
use sentry_profiling_tests::{chunk_samples, read_envelope_dir, split_items};
use tracing_subscriber::prelude::*;

/// How long the parent waits for the child before killing it.
const CHILD_WATCHDOG: Duration = Duration::from_secs(20);

#[inline(never)]
fn fork_busy(stop: &AtomicBool) -> u64 {
    let mut x = 0u64;
    while !stop.load(Ordering::Relaxed) {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
    }
    x
}

fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// What the child checks; an `Err` names the first thing that went wrong.
fn child_checks(dir: &std::path::Path) -> Result<(), String> {
    if sentry_profiling::stats().is_some() {
        return Err("stats() in the child reports the parent's session".into());
    }
    // The child's only thread has an id of its own, although its
    // thread-locals are the forking thread's, which kept that thread's id.
    // SAFETY: gettid has no preconditions and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as u64;
    let told = sentry_profiling::hooks::current_thread_id();
    if told != tid {
        return Err(format!(
            "current_thread_id() in the child is {told}, its thread is {tid}"
        ));
    }
    // Every lifecycle call is a no-op here, in any order.
    sentry_profiling::start_profiler();
    sentry_profiling::start_profiler();
    sentry_profiling::stop_profiler();
    sentry_profiling::stop_profiler();
    sentry_profiling::start_profiler();
    if sentry_profiling::hooks::session()
        .and_then(|s| s.running_profiler_id())
        .is_some()
    {
        return Err("the child believes a profiler runs".into());
    }
    // A root span through the tracing layer becomes a transaction that is
    // sent unchanged: no profile context, no lane.
    let name = format!("forked child {}", std::process::id());
    tracing::info_span!("child root", sentry.name = name.as_str()).in_scope(|| {
        let stop = AtomicBool::new(false);
        let until = Instant::now() + Duration::from_millis(30);
        while Instant::now() < until {
            std::hint::black_box(stop.load(Ordering::Relaxed));
        }
    });
    let client = sentry::Hub::current()
        .client()
        .ok_or("no Sentry client in the child")?;
    let started = Instant::now();
    if !client.flush(Some(Duration::from_secs(5))) {
        return Err("flush in the child timed out".into());
    }
    if !client.close(Some(Duration::from_secs(5))) {
        return Err("shutdown in the child timed out".into());
    }
    if started.elapsed() > Duration::from_secs(4) {
        return Err(format!(
            "flush and shutdown took {:?}: they waited for something",
            started.elapsed()
        ));
    }
    sentry_profiling::stop_profiler();
    let (_, transactions) = split_items(&read_envelope_dir(dir));
    let mine: Vec<_> = transactions
        .iter()
        .filter(|t| t.get("transaction").and_then(Value::as_str) == Some(name.as_str()))
        .collect();
    let [tx] = mine.as_slice() else {
        return Err(format!(
            "{} transactions named {name:?} on disk, expected 1",
            mine.len()
        ));
    };
    if tx.pointer("/contexts/profile").is_some() {
        return Err(format!(
            "the child's transaction has a profile context: {tx}"
        ));
    }
    if tx.pointer("/contexts/trace/data/thread.id").is_some() {
        return Err(format!("the child's transaction was given a lane: {tx}"));
    }
    Ok(())
}

/// Runs in the forked child; never returns.
fn child_main(dir: &std::path::Path) -> ! {
    let result = std::panic::catch_unwind(|| child_checks(dir));
    let code = match result {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            eprintln!("fork child: {e}");
            1
        }
        Err(_) => {
            eprintln!("fork child: panicked");
            2
        }
    };
    // SAFETY: `_exit` ends the child at once, without running the parent's
    // copied atexit handlers or returning into the test harness.
    unsafe { libc::_exit(code) }
}

/// Waits for `pid`, killing it after [`CHILD_WATCHDOG`]; returns its raw
/// wait status.
fn wait_with_watchdog(pid: libc::pid_t) -> Result<libc::c_int, String> {
    let deadline = Instant::now() + CHILD_WATCHDOG;
    loop {
        let mut status = 0;
        // SAFETY: `pid` is our child and `status` a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Ok(status);
        }
        if r < 0 {
            return Err(format!("waitpid: {}", std::io::Error::last_os_error()));
        }
        if Instant::now() > deadline {
            // SAFETY: killing and reaping our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return Err(format!(
                "the child hung for {CHILD_WATCHDOG:?} and was killed"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn forked_child_is_harmless_and_parent_keeps_profiling() {
    let dir = std::env::temp_dir().join(format!("sentry-profiling-fork-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut options = sentry::ClientOptions::new().traces_sample_rate(1.0);
    options.dsn = sentry_profiling_examples::LOCAL_DSN.parse().ok();
    options.transport = Some(EnvelopeDirTransport::factory(&dir).expect("envelope dir"));
    let guard = sentry::init(
        ProfilingIntegration::new()
            .profile_session_sample_rate(1.0)
            .frequency_hz(250)
            .chunk_duration(Duration::from_secs(1))
            .apply(options),
    );
    tracing_subscriber::registry()
        .with(sentry::integrations::tracing::SpanLayer::new())
        .with(sentry_profiling_tracing::layer())
        .init();
    sentry_profiling::start_profiler();

    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let busy = std::thread::Builder::new()
        .name("fork-busy".into())
        .spawn(move || fork_busy(&flag))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while sentry_profiling::stats().unwrap().sampler.samples_captured < 20 {
        assert!(Instant::now() < deadline, "the profiler never sampled");
        std::thread::sleep(Duration::from_millis(20));
    }

    // The forking thread's id is kept before the fork (see the child's
    // check).
    // SAFETY: gettid has no preconditions and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as u64;
    assert_eq!(sentry_profiling::hooks::current_thread_id(), tid);
    assert_eq!(sentry_profiling::hooks::current_thread_id(), tid);
    // SAFETY: the child only runs `child_main`, which ends in `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        child_main(&dir);
    }
    let status = wait_with_watchdog(pid).unwrap();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the forked child failed (wait status {status:#x}; its reason is on stderr)"
    );
    let after_child = now_secs();
    let captured_at_child_exit = sentry_profiling::stats().unwrap().sampler.samples_captured;

    // fork+exec (`pre_exec` makes std fork instead of posix_spawn) and a
    // plain spawn both work while threads are being signalled.
    for round in 0..5 {
        let mut forked = std::process::Command::new("sh");
        forked.args(["-c", "exit 7"]);
        // SAFETY: the hook does nothing, which is async-signal-safe.
        unsafe { forked.pre_exec(|| Ok(())) };
        let status = forked.status().expect("fork+exec sh");
        assert_eq!(status.code(), Some(7), "round {round}: fork+exec");
        let out = std::process::Command::new("echo")
            .arg("spawned")
            .output()
            .expect("spawn echo");
        assert_eq!(out.stdout, b"spawned\n", "round {round}: spawn");
    }

    // The parent's profiling carries on: more samples, and chunks with
    // samples taken after the child exited.
    std::thread::sleep(Duration::from_millis(1500));
    let stats = sentry_profiling::stats().unwrap();
    assert!(
        stats.sampler.samples_captured > captured_at_child_exit + 20,
        "sampling stalled after the fork: {stats:?}"
    );
    sentry_profiling::stop_profiler();
    stop.store(true, Ordering::Relaxed);
    busy.join().unwrap();
    drop(guard);

    let (chunks, _) = split_items(&read_envelope_dir(&dir));
    let late_samples = chunks
        .iter()
        .flat_map(chunk_samples)
        .filter(|s| s["timestamp"].as_f64().is_some_and(|t| t > after_child))
        .count();
    assert!(
        late_samples > 20,
        "{} chunks, only {late_samples} samples after the child exited",
        chunks.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
