//! `cargo xtask instructions`: the instructions a request costs, counted
//! rather than timed.
//!
//! The cost benchmark's CPU times move by tens of microseconds per request
//! between rounds on a shared machine, more than the profiler's few. This
//! counts user-space instructions instead, which do not depend on what else
//! the machine runs: the service twin runs under `valgrind
//! --tool=cachegrind`, once for a short run and once for a longer one of
//! `GET /` at a low fixed rate, and the difference between the two totals
//! over the difference in requests is the instructions per request, every
//! thread of the service counted, start-up and shutdown cancelled out.
//!
//! Profiling is on with sampling at 1 Hz: under valgrind a request takes
//! tens of times its CPU, so at the usual 101 Hz it would get tens of times
//! its samples. What is left is the per-request path (the tracing layer,
//! the lanes, the transaction's linking and writing, the profiler thread's
//! work per request); what sampling costs per request at full speed is the
//! cost benchmark's profiler-thread figure. Kernel time (the sockets) is
//! not counted, and neither are cache misses.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::cost::{
    TWIN, build, load, sink_port, sink_transactions, spawn_service, start_sink, stop_service,
    wait_for_transactions,
};

/// Requests of the short run; the long run adds the measured ones.
const BASE_REQUESTS: u64 = 1_000;
/// Requests per second: a request costs tens of times its CPU under
/// valgrind, so the service keeps up only at a low rate.
const RATE: u32 = 150;

/// Instructions of one run of `requests` requests.
fn run(mode: &str, hz: Option<u32>, requests: u64) -> Result<u64, String> {
    let log = std::env::temp_dir().join(format!("xtask-instructions-{}.log", std::process::id()));
    let mut cmd = Command::new("valgrind");
    cmd.args([
        "--tool=cachegrind",
        "--cache-sim=no",
        "--cachegrind-out-file=/dev/null",
    ])
    .arg(format!("--log-file={}", log.display()))
    .args([TWIN, mode])
    .stderr(Stdio::null());
    if let Some(hz) = hz {
        cmd.env("SENTRY_PROFILE_FREQUENCY_HZ", hz.to_string());
    }
    let before = sink_transactions()?;
    let service = spawn_service(cmd, Duration::from_secs(120))?;
    load("/", requests, 8, Some(RATE))?;
    wait_for_transactions(before + requests)?;
    stop_service(service);
    let text = std::fs::read_to_string(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let _ = std::fs::remove_file(&log);
    // `==PID== I   refs:      246,008,350`
    text.lines()
        .find_map(|l| {
            let (_, count) = l.split_once("I   refs:")?;
            count.trim().replace(',', "").parse().ok()
        })
        .ok_or_else(|| format!("no instruction count in valgrind's log: {text}"))
}

/// Instructions per request of `mode`: the slope between a run of
/// [`BASE_REQUESTS`] and one of `BASE_REQUESTS + requests`.
fn per_request(mode: &str, hz: Option<u32>, requests: u64) -> Result<f64, String> {
    let short = run(mode, hz, BASE_REQUESTS)?;
    let long = run(mode, hz, BASE_REQUESTS + requests)?;
    Ok((long as f64 - short as f64) / requests as f64)
}

/// Runs the comparison; returns the report.
pub(crate) fn run_all(requests: u64) -> Result<String, String> {
    let found = Command::new("valgrind")
        .arg("--version")
        .stdout(Stdio::null())
        .status();
    if !found.is_ok_and(|s| s.success()) {
        return Err("valgrind is needed (apt-get install valgrind)".into());
    }
    build()?;
    let _sink = start_sink(sink_port())?;
    std::thread::sleep(Duration::from_millis(200));
    let off = per_request("off", None, requests)?;
    eprintln!("off: {off:.0} instructions per request");
    let on = per_request("sentry-profiling", Some(1), requests)?;
    eprintln!("on: {on:.0} instructions per request");
    let report = format!(
        "`GET /` at {RATE}/s under cachegrind, instructions per request over {requests} requests, every thread:\n\n\
         | profiling | instructions per request | against off |\n|---|---|---|\n\
         | off | {off:.0} | |\n\
         | on (Trace lifecycle, sampling at 1 Hz) | {on:.0} | {:+.0} ({:+.1} %) |\n",
        on - off,
        (on / off - 1.0) * 100.0
    );
    println!("{report}");
    Ok(report)
}
