//! `cargo xtask cost`: what a profiled request costs, the way a service
//! pays it.
//!
//! The example's router (`service_twin`) sends its transactions through the
//! SDK's HTTP transport to a loopback sink in another process
//! (`sentry_sink`), so no envelope file is written in the measured process.
//! A load generator of our own (`load`) makes a fixed number of requests per
//! round over 8 keep-alive connections. Each round starts a fresh service in
//! one mode: profiling off (session rate 0), on (Trace lifecycle, 101 Hz),
//! or pprof-rs (100 Hz); modes alternate within every round, their order
//! turning by one from round to round. CPU comes from
//! the kernel's accounting of every thread of the service
//! (`/proc/<pid>/task/*/stat`), grouped as Tokio workers, the transport
//! threads (the SDK's and the crate's transaction sender), and the
//! profiler's own threads. A round's CPU is read once the sink has received
//! every transaction of the round (the twin queues them rather than
//! dropping them while its sender falls behind): every mode pays for
//! delivering the same transactions, and a round with one missing fails.
//!
//! Rounds run at the maximum rate (`GET /` and `GET /work/1`) and, for
//! `GET /`, at a fixed 5,000 requests per second, which the transaction
//! sender keeps up with in every mode (at the maximum rate it drains after
//! the load, and its kernel time per request then varies between rounds by
//! more than the profiler costs).
//!
//! Reported: the median over rounds with a 95 % confidence interval of the
//! median (bootstrap over rounds); the difference on − off per round,
//! paired, in all and by thread group;
//! the profiler threads' CPU per request at 100 and 1,000 requests per
//! second and at the maximum rate; and their CPU per second with 0, 8 and 200
//! requests in flight but idle (sleeping).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) const TWIN: &str = "target/release/service_twin";
pub(crate) const SINK: &str = "target/release/sentry_sink";
const LOAD: &str = "target/release/load";
/// A loopback port no one listens on now, chosen once per `name` and run:
/// two runs on one machine (two CI jobs) must not talk to each other's
/// service or sink.
pub(crate) fn free_port(name: &'static str) -> u16 {
    static PORTS: std::sync::Mutex<Vec<(&str, u16)>> = std::sync::Mutex::new(Vec::new());
    let mut ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, port)) = ports.iter().find(|(n, _)| *n == name) {
        return port;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_or(0, |a| a.port());
    ports.push((name, port));
    port
}

/// The sink's port (see [`free_port`]).
pub(crate) fn sink_port() -> u16 {
    free_port("sink")
}

/// The measured service's port (see [`free_port`]).
fn service_port() -> u16 {
    free_port("service")
}
const CONNECTIONS: u32 = 8;
/// Requests per second of the fixed-rate rounds: below what the
/// transaction sender delivers (about 11,000 a second here), so it keeps up
/// in every mode.
const FIXED_RATE: u32 = 5_000;

/// A mode of the service twin.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Mode {
    name: &'static str,
    arg: &'static str,
}

const OFF: Mode = Mode {
    name: "off",
    arg: "off",
};
const ON: Mode = Mode {
    name: "sentry-profiling",
    arg: "sentry-profiling",
};
const PPROF: Mode = Mode {
    name: "pprof-rs",
    arg: "pprof-rs",
};

/// CPU of one round, in microseconds per request, by thread group.
#[derive(Debug, Clone, Copy, Default)]
struct Round {
    total: f64,
    workers: f64,
    transport: f64,
    profiler: f64,
    other: f64,
    requests_per_sec: f64,
    p99_us: f64,
}

/// A child process killed when dropped.
pub(crate) struct Killed(pub(crate) Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn clock_ticks_per_sec() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// CPU time of every thread of `pid` in nanoseconds, by group: (workers,
/// transport, profiler, other). Read from each thread's `schedstat` (time
/// on the CPU, in nanoseconds), finer than `stat`'s clock ticks.
fn thread_ns(pid: u32) -> [u64; 4] {
    let mut out = [0u64; 4];
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let Ok(name) = std::fs::read_to_string(t.path().join("comm")) else {
            continue;
        };
        let Some(ns) = std::fs::read_to_string(t.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        else {
            continue;
        };
        let group = if name.starts_with("tokio-rt-worker") {
            0
        } else if name.starts_with("sentry-transpor") || name.starts_with("reqwest") {
            1
        } else if name.starts_with("sentry-profiler") {
            2
        } else {
            3
        };
        out[group] += ns;
    }
    out
}

/// CPU time of the process (all threads, including those that exited) in
/// nanoseconds, from `stat`'s clock ticks.
fn process_ns(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    let Some(close) = stat.rfind(')') else {
        return 0;
    };
    let f: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    let ticks = f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (ticks as f64 / clock_ticks_per_sec() * 1e9) as u64
}

fn start_service(mode: Mode) -> Result<Killed, String> {
    let mut cmd = Command::new(TWIN);
    cmd.arg(mode.arg).stderr(Stdio::null());
    spawn_service(cmd, Duration::from_secs(10))
}

/// Starts `cmd` (the service twin, or a tool running it) against the sink,
/// and waits up to `patience` until the service listens.
pub(crate) fn spawn_service(mut cmd: Command, patience: Duration) -> Result<Killed, String> {
    let child = cmd
        .env("ADDR", format!("127.0.0.1:{}", service_port()))
        .env(
            "SENTRY_DSN",
            format!("http://public@127.0.0.1:{}/1", sink_port()),
        )
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
    let mut service = Killed(child);
    let until = Instant::now() + patience;
    while std::net::TcpStream::connect(("127.0.0.1", service_port())).is_err() {
        if Instant::now() > until || matches!(service.0.try_wait(), Ok(Some(_))) {
            return Err(format!("{cmd:?} did not start listening"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(service)
}

/// Stops the service as an operator would (SIGINT), waiting for it.
pub(crate) fn stop_service(mut service: Killed) {
    let _ = Command::new("kill")
        .args(["-INT", &service.0.id().to_string()])
        .status();
    let until = Instant::now() + Duration::from_secs(15);
    while Instant::now() < until {
        if let Ok(Some(_)) = service.0.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs the load generator; returns (answered, seconds, p99 µs).
pub(crate) fn load(
    path: &str,
    requests: u64,
    conns: u32,
    rate: Option<u32>,
) -> Result<(f64, f64, f64), String> {
    let mut cmd = Command::new(LOAD);
    cmd.args([
        format!("127.0.0.1:{}", service_port()),
        path.to_owned(),
        requests.to_string(),
        conns.to_string(),
    ]);
    if let Some(r) = rate {
        cmd.arg(r.to_string());
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {LOAD}: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let f: Vec<f64> = text
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    match f.as_slice() {
        [n, secs, _p50, p99, failures] if *failures == 0.0 && *n > 0.0 => Ok((*n, *secs, *p99)),
        _ => Err(format!("load failed: {text}")),
    }
}

/// Transactions the sink has received so far.
pub(crate) fn sink_transactions() -> Result<u64, String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", sink_port()))
        .map_err(|e| format!("cannot reach the sink: {e}"))?;
    s.write_all(b"GET /count HTTP/1.1\r\nHost: sink\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("cannot ask the sink: {e}"))?;
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut answer = String::new();
    s.read_to_string(&mut answer)
        .map_err(|e| format!("no answer from the sink: {e}"))?;
    // `<envelopes> <transactions> <chunks> <bytes>` after the headers.
    answer
        .split("\r\n\r\n")
        .nth(1)
        .and_then(|body| body.split_whitespace().nth(1)?.parse().ok())
        .ok_or_else(|| format!("unexpected answer from the sink: {answer:?}"))
}

/// Waits until the sink has received `count` transactions: the service's
/// transport may still be sending them after the load ends, and its CPU
/// for that belongs to the round. An error if they do not all arrive.
pub(crate) fn wait_for_transactions(count: u64) -> Result<(), String> {
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let got = sink_transactions()?;
        if got >= count {
            return Ok(());
        }
        if Instant::now() > until {
            return Err(format!(
                "the sink received {got} transactions of {count}: the service dropped some"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One round: a warm-up, then `requests` requests measured, from before
/// their load until the sink has received every one of their transactions.
fn run_round(mode: Mode, path: &str, requests: u64, rate: Option<u32>) -> Result<Round, String> {
    let service = start_service(mode)?;
    let pid = service.0.id();
    let sent_before = sink_transactions()?;
    // Warm up: connections, allocator, the sampler's module list.
    let warm_up = (requests / 10).max(50);
    load(path, warm_up, CONNECTIONS, rate)?;
    wait_for_transactions(sent_before + warm_up)?;
    let (t0, p0) = (thread_ns(pid), process_ns(pid));
    let (n, secs, p99) = load(path, requests, CONNECTIONS, rate)?;
    wait_for_transactions(sent_before + warm_up + requests)?;
    let (t1, p1) = (thread_ns(pid), process_ns(pid));
    stop_service(service);
    let us = |ns: u64| ns as f64 / 1e3 / n;
    Ok(Round {
        total: us(p1.saturating_sub(p0)),
        workers: us(t1[0].saturating_sub(t0[0])),
        transport: us(t1[1].saturating_sub(t0[1])),
        profiler: us(t1[2].saturating_sub(t0[2])),
        other: us(t1[3].saturating_sub(t0[3])),
        requests_per_sec: n / secs,
        p99_us: p99,
    })
}

/// Median, and a 95 % confidence interval of the median by bootstrap over
/// the values (a fixed-seed generator: the same rounds give the same
/// interval).
fn median_ci(values: &[f64]) -> (f64, f64, f64) {
    fn median(v: &mut [f64]) -> f64 {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    }
    if values.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut medians = Vec::with_capacity(2000);
    let mut sample = vec![0.0; values.len()];
    for _ in 0..2000 {
        for s in sample.iter_mut() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            *s = values[(seed % values.len() as u64) as usize];
        }
        medians.push(median(&mut sample));
    }
    medians.sort_by(f64::total_cmp);
    (
        median(&mut values.to_vec()),
        medians[medians.len() * 25 / 1000],
        medians[medians.len() * 975 / 1000],
    )
}

fn fmt_ci(v: &[f64], digits: usize) -> String {
    let (m, lo, hi) = median_ci(v);
    format!("{m:.digits$} [{lo:.digits$}, {hi:.digits$}]")
}

/// The profiler threads' CPU per second, in milliseconds, over `secs`.
fn profiler_ms_per_sec(pid: u32, secs: u64) -> f64 {
    let before = thread_ns(pid)[2];
    std::thread::sleep(Duration::from_secs(secs));
    let after = thread_ns(pid)[2];
    after.saturating_sub(before) as f64 / 1e6 / secs as f64
}

/// Builds the binaries the benchmark runs.
pub(crate) fn build() -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .args(["build", "--release", "-p", "sentry-profiling-benches"])
        .args([
            "--bin",
            "service_twin",
            "--bin",
            "sentry_sink",
            "--bin",
            "load",
        ])
        .status()
        .map_err(|e| e.to_string())?;
    if status.success() {
        Ok(())
    } else {
        Err("building the benchmark's binaries failed".into())
    }
}

/// Starts the loopback Sentry sink on `port` (killed when dropped).
pub(crate) fn start_sink(port: u16) -> Result<Killed, String> {
    Command::new(SINK)
        .arg(port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Killed)
        .map_err(|e| format!("cannot start {SINK}: {e}"))
}

/// Runs the benchmark; returns (and prints) its Markdown report. `quick`
/// makes every part small (a smoke run for CI).
pub(crate) fn run(rounds: usize, quick: bool) -> Result<String, String> {
    build()?;
    let sink = start_sink(sink_port())?;
    std::thread::sleep(Duration::from_millis(200));
    let scale = if quick { 20 } else { 1 };
    let mut report = String::new();

    // CPU per request at the maximum rate, alternating modes.
    // The maximum rate, then `GET /` at a rate the transaction sender keeps
    // up with in every mode: at the maximum rate it falls behind and
    // drains after the load, and the kernel's cost of each request it
    // sends then varies by microseconds between rounds, more than the
    // profiler's cost.
    for (path, requests, rate) in [
        ("/", 60_000u64, None),
        ("/", 30_000, Some(FIXED_RATE)),
        ("/work/1", 6_000, None),
    ] {
        let requests = requests / scale;
        let modes = [OFF, ON, PPROF];
        let mut rounds_by_mode: Vec<Vec<Round>> = vec![Vec::new(); modes.len()];
        for round in 0..rounds {
            // The order of the modes turns by one every round, so that none
            // is always the first after a fresh start or the last before
            // the next round: a drift of the machine within rounds falls
            // on every mode alike.
            for k in 0..modes.len() {
                let i = (round + k) % modes.len();
                let mode = modes[i];
                let r = run_round(mode, path, requests, rate)?;
                eprintln!(
                    "GET {path} round {} {:<16} {:>7.1} µs/request (workers {:.1}, transport {:.1}, profiler {:.1}, other {:.1}) {:>7.0} req/s",
                    round + 1,
                    mode.name,
                    r.total,
                    r.workers,
                    r.transport,
                    r.profiler,
                    r.other,
                    r.requests_per_sec
                );
                rounds_by_mode[i].push(r);
            }
        }
        report.push_str(&format!(
            "\n`GET {path}`, {requests} requests per round over {CONNECTIONS} connections{}, {rounds} rounds per mode; median [95 % CI]:\n\n\
             | mode | CPU µs/request, all threads | Tokio workers | transport threads | profiler threads | req/s | p99 µs |\n\
             |---|---|---|---|---|---|---|\n",
            rate.map_or(String::new(), |r| format!(" at {r} requests per second"))
        ));
        for (mode, rs) in modes.iter().zip(&rounds_by_mode) {
            let col =
                |f: fn(&Round) -> f64, d: usize| fmt_ci(&rs.iter().map(f).collect::<Vec<_>>(), d);
            report.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} |\n",
                mode.name,
                col(|r| r.total, 1),
                col(|r| r.workers, 1),
                col(|r| r.transport, 1),
                col(|r| r.profiler, 2),
                col(|r| r.requests_per_sec, 0),
                col(|r| r.p99_us, 0),
            ));
        }
        let off = &rounds_by_mode[0];
        for (i, mode) in modes.iter().enumerate().skip(1) {
            let rs = &rounds_by_mode[i];
            let paired = |f: fn(&Round) -> f64| {
                fmt_ci(
                    &rs.iter()
                        .zip(off)
                        .map(|(r, o)| f(r) - f(o))
                        .collect::<Vec<_>>(),
                    1,
                )
            };
            let ratio: Vec<f64> = rs.iter().zip(off).map(|(r, o)| r.total / o.total).collect();
            let thr: Vec<f64> = rs
                .iter()
                .zip(off)
                .map(|(r, o)| r.requests_per_sec / o.requests_per_sec)
                .collect();
            report.push_str(&format!(
                "\n{} − off, paired by round: CPU per request {} µs (workers {}, transport {}, profiler {}), ratio {}; throughput ratio {}\n",
                mode.name,
                paired(|r| r.total),
                paired(|r| r.workers),
                paired(|r| r.transport),
                paired(|r| r.profiler),
                fmt_ci(&ratio, 3),
                fmt_ci(&thr, 3),
            ));
        }
    }

    // The profiler threads at fixed request rates.
    report.push_str(
        "\nProfiler threads at a fixed rate (`GET /`, 10 s per run, 3 runs; median):\n\n\
         | rate | profiler threads µs/request | profiler threads % of a core | all threads µs/request |\n|---|---|---|---|\n",
    );
    for rate in [100u32, 1000] {
        let secs = if quick { 1 } else { 10 };
        let mut per_req = Vec::new();
        let mut share = Vec::new();
        let mut total = Vec::new();
        for _ in 0..3 {
            let r = run_round(ON, "/", u64::from(rate) * secs, Some(rate))?;
            per_req.push(r.profiler);
            share.push(r.profiler * f64::from(rate) / 1e4);
            total.push(r.total);
        }
        report.push_str(&format!(
            "| {rate}/s | {} | {} | {} |\n",
            fmt_ci(&per_req, 2),
            fmt_ci(&share, 3),
            fmt_ci(&total, 1)
        ));
    }

    // The profiler threads while requests are in flight but idle.
    report.push_str(
        "\nProfiler threads with requests in flight but sleeping (`GET /sleep/…`), CPU per second (ms of CPU per s = ‰ of a core):\n\n\
         | requests in flight | profiler threads ms/s |\n|---|---|\n",
    );
    let measure_secs = if quick { 1 } else { 10 };
    {
        let service = start_service(ON)?;
        std::thread::sleep(Duration::from_secs(1));
        let ms = profiler_ms_per_sec(service.0.id(), measure_secs);
        report.push_str(&format!(
            "| 0 (no request yet: sampler paused) | {ms:.3} |\n"
        ));
        load("/", 1, 1, None)?;
        std::thread::sleep(Duration::from_millis(500));
        let ms = profiler_ms_per_sec(service.0.id(), measure_secs);
        report.push_str(&format!(
            "| 0 (after a request, until its chunk ends) | {ms:.3} |\n"
        ));
        stop_service(service);
    }
    for inflight in [8u32, 200] {
        let service = start_service(ON)?;
        let sleep_path = format!("/sleep/{}", (measure_secs + 4) * 1000);
        let holder =
            std::thread::spawn(move || load(&sleep_path, u64::from(inflight), inflight, None));
        std::thread::sleep(Duration::from_secs(2));
        let ms = profiler_ms_per_sec(service.0.id(), measure_secs);
        let _ = holder.join();
        stop_service(service);
        report.push_str(&format!("| {inflight} | {ms:.3} |\n"));
    }
    drop(sink);
    print!("{report}");
    Ok(report)
}
