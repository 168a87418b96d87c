//! Whether the stacks of a service's threads are true, on a service with
//! more threads than Tokio's workers: the example's router (`service_twin
//! sentry-profiling`, the README's set-up, envelopes to a directory) under
//! a mixed load of CPU in handlers (`/work`), queries on its database
//! thread (`/db`, a thread waiting in a `flume` receive between queries),
//! CPU on the blocking pool (`/render`), sleeps and trivial requests.
//!
//! Over the OS threads' samples that have a real stack (lanes and synthetic
//! stacks left out), each weighted as Sentry weights it (time to the
//! thread's next sample, at most 0.1 s):
//! - **rooted**: the share whose stack reaches the thread's root (std's
//!   `thread_start` under libc's thread start, or `_start`);
//! - **cut**: the share ending in `(rest of the stack not unwound)`;
//! - **ruled out**: the share with a (callee, caller) pair that the machine
//!   code rules out (the caller follows no call, or a direct call to a
//!   function that cannot reach the callee), checked against the module
//!   files by the tests' oracle (`sentry-profiling/tests/support/callchain.rs`).
//!
//! And the service's "slowest functions" as Sentry computes them
//! (vroomrs' function metrics over every thread of a chunk, lanes
//! included: each sample's time goes to its leaf-most in-app frame that is
//! not the root; in-app is the executable's code, less what the README's
//! stack-trace rules mark `-app`; functions seen in one sample are
//! dropped), with the README's rules and with none.
//!
//! `cargo bench -p sentry-profiling-benches --bench truth`
//! (`TRUTH_BENCH_SECS`, default 30, the load's length; `TRUTH_BENCH_KEEP`,
//! a directory to keep the envelopes in, for `shared/tools/callchain_check.py`);
//! `-- --test` is the smoke run (4 s).

#[path = "../../sentry-profiling/tests/support/callchain.rs"]
mod callchain;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use callchain::{CallChainCheck, Located, Verdict};
use sentry_profiling_tests::sentry_functions::{
    Image, Rules, images, locate_in, slowest_functions,
};
use sentry_profiling_tests::{read_envelope_dir, split_items};
use sentry_view::{ProfileChunk, is_lane_thread_id};

/// (path, requests per second, connections) of the load.
const MIX: [(&str, u32, u32); 5] = [
    ("/work/20", 10, 2),
    ("/db/10", 20, 2),
    ("/render/10", 20, 2),
    ("/sleep/30", 20, 2),
    ("/", 200, 2),
];

/// The longest weight a sample gets (a thread's last sample, a gap).
const MAX_WEIGHT_NS: u64 = 100_000_000;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn start_service(dir: &Path, addr: SocketAddr) -> Child {
    let child = Command::new(env!("CARGO_BIN_EXE_service_twin"))
        .arg("sentry-profiling")
        .env("ADDR", addr.to_string())
        .env("SENTRY_ENVELOPE_DIR", dir)
        .env("TWIN_STATS", "1")
        .env_remove("SENTRY_DSN")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("service_twin starts");
    let started = Instant::now();
    while TcpStream::connect(addr).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "service_twin did not start listening"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// Stops the service; returns the sampler's (blocked threads read, and
/// nanoseconds spent unwinding) from the counters it prints.
fn stop_service(child: Child) -> (u64, u64) {
    // SAFETY: a plain system call on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().expect("service_twin exits");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "service_twin ended with {}:\n{stderr}",
        out.status
    );
    let counter = |name: &str| {
        stderr
            .lines()
            .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(": "))
            .and_then(|v| v.trim_end_matches(',').parse::<u64>().ok())
            .unwrap_or(0)
    };
    (counter("waits_read"), counter("unwind_ns"))
}

/// Runs the mix for `secs` against `addr`.
fn load(addr: SocketAddr, secs: u64) {
    let loads: Vec<Child> = MIX
        .iter()
        .map(|&(path, rate, conns)| {
            Command::new(env!("CARGO_BIN_EXE_load"))
                .args([
                    addr.to_string(),
                    path.to_owned(),
                    (u64::from(rate) * secs).to_string(),
                    conns.to_string(),
                    rate.to_string(),
                ])
                .stdout(Stdio::null())
                .spawn()
                .expect("load starts")
        })
        .collect();
    for mut l in loads {
        let _ = l.wait();
    }
}

#[derive(Default)]
struct Figures {
    weight: u64,
    rooted: u64,
    cut: u64,
    ruled_out: u64,
    unknown: u64,
    samples: usize,
    worst_unrooted: HashMap<String, u64>,
    worst_pairs: HashMap<String, u64>,
    per_thread: HashMap<String, (u64, u64)>,
}

fn analyse(dir: &Path) -> (Figures, Vec<(ProfileChunk, Vec<Image>)>) {
    let envelopes = read_envelope_dir(dir);
    let (chunks, transactions) = split_items(&envelopes);
    eprintln!(
        "truth: {} chunks, {} transactions",
        chunks.len(),
        transactions.len()
    );
    let mut check = CallChainCheck::default();
    let mut f = Figures::default();
    let mut parsed = Vec::new();
    for item in &chunks {
        let payload = &item.payload;
        let chunk = ProfileChunk::from_value(payload).expect("a chunk that parses");
        let images = images(payload);
        let locate =
            |addr: u64| -> Located { locate_in(&images, addr).map(|(p, b)| (p.clone(), b)) };
        let mut by_thread: HashMap<&str, Vec<(u64, usize)>> = HashMap::new();
        for s in &chunk.samples {
            if !is_lane_thread_id(&s.thread_id) {
                by_thread
                    .entry(&s.thread_id)
                    .or_default()
                    .push((s.timestamp_ns, s.stack_id));
            }
        }
        let mut verdicts: HashMap<usize, (bool, bool, Verdict, String)> = HashMap::new();
        for (tid, mut samples) in by_thread {
            samples.sort_unstable();
            let name = chunk.thread_names.get(tid).cloned().unwrap_or_default();
            for (i, &(ts, stack_id)) in samples.iter().enumerate() {
                let w = samples
                    .get(i + 1)
                    .map_or(0, |&(next, _)| next.saturating_sub(ts))
                    .min(MAX_WEIGHT_NS);
                let Some(stack) = chunk.stacks.get(stack_id) else {
                    continue;
                };
                let frames: Vec<_> = stack.iter().filter_map(|&i| chunk.frames.get(i)).collect();
                if frames.iter().all(|fr| fr.is_synthetic()) {
                    continue;
                }
                let (rooted, cut, verdict, shown) = verdicts.entry(stack_id).or_insert_with(|| {
                    let cut = frames.last().is_some_and(|fr| {
                        fr.function.as_deref() == Some(sentry_view::UNWOUND_NO_FURTHER_FUNCTION)
                    });
                    let names: Vec<String> = frames.iter().map(|fr| fr.name()).collect();
                    let n = names.len();
                    let in_libc = |fr: Option<&&sentry_view::Frame>| {
                        fr.and_then(|fr| fr.instruction_addr)
                            .and_then(locate)
                            .is_some_and(|(path, _)| path.contains("libc"))
                    };
                    let thread_root = names
                        .iter()
                        .rposition(|n| n.ends_with("thread_start"))
                        .is_some_and(|i| i + 3 >= n)
                        && in_libc(frames.last());
                    let main_root = names.last().is_some_and(|n| n == "_start");
                    let mut verdict = Verdict::Possible;
                    let addrs: Vec<u64> = frames
                        .iter()
                        .filter(|fr| !fr.is_synthetic())
                        .filter_map(|fr| fr.instruction_addr)
                        .collect();
                    for pair in addrs.windows(2) {
                        if pair[0] == pair[1] {
                            continue;
                        }
                        match check.pair(locate, pair[0], pair[1]) {
                            Verdict::RuledOut => {
                                verdict = Verdict::RuledOut;
                                break;
                            }
                            Verdict::Unknown => verdict = Verdict::Unknown,
                            Verdict::Possible => {}
                        }
                    }
                    let shown = names
                        .iter()
                        .take(6)
                        .map(|n| n.chars().take(60).collect::<String>())
                        .collect::<Vec<_>>()
                        .join(" < ");
                    (!cut && (thread_root || main_root), cut, verdict, shown)
                });
                f.samples += 1;
                f.weight += w;
                let entry = f.per_thread.entry(name.clone()).or_default();
                entry.0 += w;
                if *rooted {
                    f.rooted += w;
                    entry.1 += w;
                } else {
                    *f.worst_unrooted
                        .entry(format!("[{name}] {shown}"))
                        .or_default() += w;
                }
                if *cut {
                    f.cut += w;
                }
                match verdict {
                    Verdict::RuledOut => {
                        f.ruled_out += w;
                        *f.worst_pairs
                            .entry(format!("[{name}] {shown}"))
                            .or_default() += w;
                    }
                    Verdict::Unknown => f.unknown += w,
                    Verdict::Possible => {}
                }
            }
        }
        parsed.push((chunk, images));
    }
    (f, parsed)
}

fn top(map: &HashMap<String, u64>, n: usize) -> Vec<(String, u64)> {
    let mut v: Vec<_> = map.iter().map(|(k, w)| (k.clone(), *w)).collect();
    v.sort_by_key(|e| std::cmp::Reverse(e.1));
    v.truncate(n);
    v
}

fn main() {
    let quick = std::env::args().any(|a| a == "--test");
    let secs: u64 = if quick {
        4
    } else {
        std::env::var("TRUTH_BENCH_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(30)
    };
    let dir: PathBuf = std::env::temp_dir().join(format!("truth-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("envelope directory");
    let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let service = start_service(&dir, addr);
    load(addr, secs);
    let (waits_read, unwind_ns) = stop_service(service);
    let (f, chunks) = analyse(&dir);
    match std::env::var_os("TRUTH_BENCH_KEEP") {
        Some(keep) => {
            let _ = std::fs::remove_dir_all(&keep);
            std::fs::rename(&dir, &keep).expect("envelopes kept");
        }
        None => {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    let share = |x: u64| x as f64 / f.weight.max(1) as f64;
    println!(
        "truth: {secs} s of load; {} samples of OS threads with a real stack, {:.1} s weighted",
        f.samples,
        f.weight as f64 / 1e9
    );
    println!("  rooted share        {:.4}", share(f.rooted));
    println!("  cut share           {:.4}", share(f.cut));
    println!("  ruled-out share     {:.4}", share(f.ruled_out));
    println!("  unknown share       {:.4}", share(f.unknown));
    println!(
        "  sampler: {waits_read} blocked threads read; unwinding (all stacks) {:.1} ms in all",
        unwind_ns as f64 / 1e6
    );
    let mut threads: Vec<_> = f.per_thread.iter().collect();
    threads.sort_by_key(|t| std::cmp::Reverse(t.1.0));
    for (name, (w, rooted)) in threads.iter().take(12) {
        println!(
            "  thread {name:<20} {:6.2} s, rooted {:.3}",
            *w as f64 / 1e9,
            *rooted as f64 / (*w).max(1) as f64
        );
    }
    for (k, w) in top(&f.worst_unrooted, 8) {
        println!("  unrooted {:6.2} s  {k}", w as f64 / 1e9);
    }
    for (k, w) in top(&f.worst_pairs, 8) {
        println!("  ruled out {:6.2} s  {k}", w as f64 / 1e9);
    }
    let readme = Rules::from_readme(include_str!("../../README.md"));
    for (title, rules) in [
        (format!("the README's {} rules", readme.len()), &readme),
        ("no rules".to_owned(), &Rules::default()),
    ] {
        println!("  slowest functions, {title}:");
        for (function, secs) in slowest_functions(&chunks, rules).iter().take(8) {
            let function: String = function.chars().take(100).collect();
            println!("    {secs:8.2} s  {function}");
        }
    }
    assert!(f.samples > 0, "no samples of OS threads");
    assert!(
        !readme.is_empty(),
        "no stack-trace rules found in the README"
    );
}
