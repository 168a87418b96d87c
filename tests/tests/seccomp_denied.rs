//! The example service under a seccomp policy that refuses the system calls
//! the sampler samples with (`EPERM`), as locked-down container profiles
//! can: `timer_create`, `timer_settime`, `timer_gettime`, `timer_delete`,
//! `rt_tgsigqueueinfo` and `process_vm_readv` each in turn; `timer_create`, `rt_tgsigqueueinfo` and
//! `process_vm_readv` together; and those three refused only once the
//! service already runs.
//!
//! A seccomp filter cannot be removed, and applies to the thread that
//! installs it and the threads it creates afterwards; so each case runs in a
//! child process of its own (this binary again, with the case named in an
//! environment variable), which installs a raw BPF filter (after
//! `PR_SET_NO_NEW_PRIVS`: no privilege needed) before Sentry and the
//! profiler start, or, for the late case, on every thread at once
//! (`SECCOMP_FILTER_FLAG_TSYNC`) between two rounds of requests. The child
//! serves requests, writes the preview, and reports on stdout; the parent
//! checks, per case, that every request got a 200, that stderr holds the
//! expected line exactly once (a notice for a degradation, the warning when
//! running code cannot be sampled) and nothing else of the kind, that the
//! counters of refused calls are non-zero for the calls refused and zero
//! for the others, that stacks of `burn_cpu` are still captured where the
//! sampler can fall back, and that none are where it cannot.

use std::io::Read as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sentry_profiling_tests::{
    functions_in_window, http_get, local_settings, read_envelope_dir, run_service_with,
    split_items, transaction_window,
};
use serde_json::{Value, json};

const CASE_ENV: &str = "SENTRY_PROFILING_SECCOMP_CASE";
/// A child that has not finished by then has hung.
const CHILD_TIMEOUT: Duration = Duration::from_secs(180);
/// How long the late case waits for the sampler to meet the new policy
/// (it does when it pauses, a second after the last request, or when it
/// next sets a timer).
const LATE_DENIAL_WAIT: Duration = Duration::from_secs(60);
/// The client's shutdown timeout, which bounds the wait for the last chunk.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

const BURN_CPU: &str = "sentry_profiling_examples::burn_cpu";
/// The frame of a request's time with no stack captured in it.
const NO_STACK: &str = "(running: no stack captured in time)";
const WARNING: &str = "sentry-profiling: cannot sample";
const NOTICE: &str = "sentry-profiling: sampling degraded";

/// One case: what is refused, and what must be said about it.
struct Case {
    name: &'static str,
    /// The system calls the filter refuses.
    denied: &'static [Syscall],
    /// Whether the filter is installed once the service already runs.
    late: bool,
    /// The one line of the kind stderr must hold, if any (its start, up to
    /// what varies).
    expected: Option<&'static str>,
    /// What that line must also say.
    naming: &'static [&'static str],
    /// Which of `[signals_denied, timers_denied, vm_read_denied]` must be
    /// non-zero (the others must be zero).
    counted: [bool; 3],
    /// Whether running code can still be sampled (`burn_cpu` shows up in
    /// the `/work` requests).
    samples_running_code: bool,
}

#[derive(Debug, Clone, Copy)]
enum Syscall {
    TimerCreate,
    TimerSettime,
    TimerGettime,
    TimerDelete,
    RtTgsigqueueinfo,
    ProcessVmReadv,
}

impl Syscall {
    fn nr(self) -> libc::c_long {
        match self {
            Self::TimerCreate => libc::SYS_timer_create,
            Self::TimerSettime => libc::SYS_timer_settime,
            Self::TimerGettime => libc::SYS_timer_gettime,
            Self::TimerDelete => libc::SYS_timer_delete,
            Self::RtTgsigqueueinfo => libc::SYS_rt_tgsigqueueinfo,
            Self::ProcessVmReadv => libc::SYS_process_vm_readv,
        }
    }
}

const ALL: &[Syscall] = &[
    Syscall::TimerCreate,
    Syscall::RtTgsigqueueinfo,
    Syscall::ProcessVmReadv,
];

const CASES: &[Case] = &[
    Case {
        name: "none",
        denied: &[],
        late: false,
        expected: None,
        naming: &[],
        counted: [false, false, false],
        samples_running_code: true,
    },
    Case {
        name: "timer_create",
        denied: &[Syscall::TimerCreate],
        late: false,
        expected: Some(
            "sentry-profiling: sampling degraded: CPU timers denied (timer_create: EPERM): threads are signalled by the sampler thread instead",
        ),
        naming: &[],
        counted: [false, true, false],
        samples_running_code: true,
    },
    Case {
        name: "timer_settime",
        denied: &[Syscall::TimerSettime],
        late: false,
        expected: Some(
            "sentry-profiling: sampling degraded: CPU timers denied (timer_settime: EPERM): threads are signalled by the sampler thread instead",
        ),
        naming: &[],
        counted: [false, true, false],
        samples_running_code: true,
    },
    Case {
        name: "timer_gettime",
        denied: &[Syscall::TimerGettime],
        late: false,
        expected: Some(
            "sentry-profiling: sampling degraded: CPU timers denied (timer_gettime: EPERM): threads are signalled by the sampler thread instead",
        ),
        naming: &[],
        counted: [false, true, false],
        samples_running_code: true,
    },
    // Timers that cannot be deleted would be left behind by every thread
    // that ends: none is created.
    Case {
        name: "timer_delete",
        denied: &[Syscall::TimerDelete],
        late: false,
        expected: Some(
            "sentry-profiling: sampling degraded: CPU timers denied (timer_delete: EPERM): threads are signalled by the sampler thread instead",
        ),
        naming: &[],
        counted: [false, true, false],
        samples_running_code: true,
    },
    Case {
        name: "rt_tgsigqueueinfo",
        denied: &[Syscall::RtTgsigqueueinfo],
        late: false,
        expected: Some(
            "sentry-profiling: sampling degraded: cannot signal threads (rt_tgsigqueueinfo: EPERM): running threads are still sampled by their CPU timers",
        ),
        naming: &[],
        counted: [true, false, false],
        samples_running_code: true,
    },
    Case {
        name: "process_vm_readv",
        denied: &[Syscall::ProcessVmReadv],
        late: false,
        expected: Some(
            "sentry-profiling: sampling degraded: process_vm_readv denied (EPERM): the stacks of threads blocked in the kernel are read from /proc/self/mem instead",
        ),
        naming: &[],
        counted: [false, false, true],
        samples_running_code: true,
    },
    Case {
        name: "all",
        denied: ALL,
        late: false,
        expected: Some(
            "sentry-profiling: cannot sample: no stack of running code can be captured: CPU timers denied (timer_create: EPERM), and cannot signal threads (rt_tgsigqueueinfo: EPERM); where threads blocked in the kernel wait is still read, from /proc/self/mem (process_vm_readv: EPERM)",
        ),
        naming: &[],
        counted: [true, true, true],
        samples_running_code: false,
    },
    Case {
        name: "all_late",
        denied: ALL,
        late: true,
        // The sampler meets the policy at `timer_settime` (a timer it
        // re-arms, disarms or brings forward) or `timer_create` (a new
        // thread), whichever comes first, then probes the others.
        expected: Some(
            "sentry-profiling: cannot sample: no stack of running code can be captured any more, but on threads whose CPU timer was set before, until it must be set again: CPU timers denied (timer_",
        ),
        naming: &[
            ": EPERM), and cannot signal threads (rt_tgsigqueueinfo: EPERM); where threads blocked in the kernel wait is still read, from /proc/self/mem (process_vm_readv: EPERM)",
        ],
        counted: [true, true, true],
        // Sampled before the policy, and after it on the threads whose
        // timers were set before.
        samples_running_code: true,
    },
];

fn main() {
    if let Ok(name) = std::env::var(CASE_ENV) {
        let case = CASES.iter().find(|c| c.name == name).expect("a known case");
        child(case);
        return;
    }
    let started = Instant::now();
    for case in CASES {
        check(case);
    }
    println!(
        "seccomp_denied: {} cases passed ({:?})",
        CASES.len(),
        started.elapsed()
    );
}

/// The audit architecture of this build, as `seccomp_data.arch` holds it.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

/// `SECCOMP_FILTER_FLAG_TSYNC`: every thread of the process gets the filter.
const SECCOMP_FILTER_FLAG_TSYNC: libc::c_ulong = 1;

/// Installs a seccomp filter that makes `denied` fail with `EPERM` and
/// allows everything else: on the calling thread and those it creates
/// afterwards, or with `all_threads` on every thread of the process.
fn deny(denied: &[Syscall], all_threads: bool) {
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let n = denied.len() as u8;
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    // Offsets in `struct seccomp_data`: the system call number, then the
    // architecture.
    let mut prog = vec![
        stmt(load, 4),
        // Calls under another architecture's numbers (the test makes none)
        // are let through.
        jump(AUDIT_ARCH, 0, n + 1),
        stmt(load, 0),
    ];
    for (i, call) in denied.iter().enumerate() {
        // To the EPERM return after the allow, else the next comparison.
        prog.push(jump(call.nr() as u32, n - i as u8, 0));
    }
    prog.push(stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW));
    prog.push(stmt(
        libc::BPF_RET | libc::BPF_K,
        libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
    ));
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: prctl with PR_SET_NO_NEW_PRIVS takes plain integers.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    assert_eq!(
        rc,
        0,
        "PR_SET_NO_NEW_PRIVS: {}",
        std::io::Error::last_os_error()
    );
    let flags = if all_threads {
        SECCOMP_FILTER_FLAG_TSYNC
    } else {
        0
    };
    // SAFETY: `fprog` points at `prog`, a valid BPF program of `len`
    // instructions that lives for the call (the kernel copies it).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER as libc::c_ulong,
            flags,
            std::ptr::from_ref(&fprog),
        )
    };
    assert_eq!(rc, 0, "seccomp: {}", std::io::Error::last_os_error());
}

/// One round of requests: CPU-bound `/work` and sleeping `/sleep`, a few at
/// a time. Returns the status lines.
async fn round(addr: std::net::SocketAddr) -> Vec<String> {
    let mut tasks = Vec::new();
    for i in 0..4u64 {
        tasks.push(tokio::spawn(http_get(addr, "/work/60")));
        tasks.push(tokio::spawn(http_get(
            addr,
            format!("/sleep/{}", 30 + 10 * i),
        )));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        let response = t.await.expect("request task");
        statuses.push(response.lines().next().unwrap_or("").to_owned());
    }
    statuses
}

/// The child: installs the filter, runs the service, and reports as JSON on
/// stdout.
fn child(case: &Case) {
    if !case.late && !case.denied.is_empty() {
        // Before Sentry, the profiler or the runtime start a thread.
        deny(case.denied, false);
    }
    let settings = local_settings(&format!("seccomp-{}", case.name));
    let dir = settings.envelope_dir.clone();
    let mut options = sentry_profiling_examples::sentry_options(&settings).expect("options");
    // Room for the last chunk on a busy machine (the default is 2 s).
    options.shutdown_timeout = SHUTDOWN_TIMEOUT;
    let router = sentry_profiling_examples::router();
    let statuses = run_service_with(options, router, |addr, _shutdown| async move {
        let mut statuses = round(addr).await;
        if case.late {
            deny(case.denied, true);
            let until = Instant::now() + LATE_DENIAL_WAIT;
            while sentry_profiling::stats().is_none_or(|s| s.sampler.timers_denied == 0)
                && Instant::now() < until
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        statuses.extend(round(addr).await);
        statuses.extend(round(addr).await);
        statuses
    });
    let stats = sentry_profiling::stats().expect("the profiler ran");

    let envelopes = read_envelope_dir(&dir);
    let (chunks, transactions) = split_items(&envelopes);
    let work: Vec<&Value> = transactions
        .iter()
        .filter(|t| t["transaction"] == "GET /work/{ms}")
        .collect();
    let work_with_burn = work
        .iter()
        .filter(|tx| {
            let Some((start, end)) = transaction_window(tx) else {
                return false;
            };
            chunks.iter().any(|c| {
                functions_in_window(c, None, start, end)
                    .iter()
                    .any(|stack| stack.iter().any(|f| f == BURN_CPU))
            })
        })
        .count();
    let samples_with = |function: &str| -> usize {
        chunks
            .iter()
            .map(|c| {
                functions_in_window(c, None, 0.0, f64::MAX)
                    .iter()
                    .filter(|stack| stack.iter().any(|f| f == function))
                    .count()
            })
            .sum()
    };

    let problem = sentry_profiling_examples::sampling_problem(&stats);
    let page = sentry_profiling_examples::write_preview(&dir, Some(&stats))
        .ok()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default();
    let s = &stats.sampler;
    let report = json!({
        "statuses": statuses,
        "denied": [s.signals_denied, s.timers_denied, s.vm_read_denied],
        "samples_captured": s.samples_captured,
        "samples_emitted": s.samples_emitted,
        "work": work.len(),
        "work_with_burn": work_with_burn,
        "burn_samples": samples_with(BURN_CPU),
        "no_stack_samples": samples_with(NO_STACK),
        "problem": problem,
        "page_shows_problem": problem.as_ref().is_some_and(|p| page.contains(p.as_str())),
        "stats": format!("{stats:?}"),
    });
    println!("REPORT {report}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `case` in a child process and checks what it reports.
fn check(case: &Case) {
    let started = Instant::now();
    let mut child = Command::new(std::env::current_exe().expect("current exe"))
        .env(CASE_ENV, case.name)
        .env_remove("SENTRY_DSN")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the child");
    let mut stdout_pipe = child.stdout.take().expect("stdout");
    let mut stderr_pipe = child.stderr.take().expect("stderr");
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout_pipe.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr_pipe.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break status;
        }
        if started.elapsed() > CHILD_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "case {}: the child hung ({CHILD_TIMEOUT:?}); stderr:\n{}",
                case.name,
                err_reader.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    let context = format!(
        "case {}: {status}\n--- stdout\n{stdout}--- stderr\n{stderr}",
        case.name
    );
    assert!(status.success(), "the child failed: {context}");
    let report: Value = stdout
        .lines()
        .find_map(|l| l.strip_prefix("REPORT "))
        .and_then(|r| serde_json::from_str(r).ok())
        .unwrap_or_else(|| panic!("no report: {context}"));

    // The service keeps serving.
    let statuses = report["statuses"].as_array().expect("statuses");
    assert_eq!(statuses.len(), 24, "{context}");
    assert!(
        statuses
            .iter()
            .all(|s| s.as_str().is_some_and(|s| s.starts_with("HTTP/1.1 200"))),
        "every request got a 200: {context}"
    );

    // Said once, and nothing else of the kind.
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with(WARNING) || l.starts_with(NOTICE))
        .collect();
    match case.expected {
        None => assert!(said.is_empty(), "nothing to say: {context}"),
        Some(line) => {
            assert_eq!(said.len(), 1, "one line: {context}");
            assert!(said[0].starts_with(line), "expected {line:?}: {context}");
            for part in case.naming {
                assert!(said[0].contains(part), "expected {part:?}: {context}");
            }
        }
    }

    // Counted for the calls refused, and only for them.
    let denied: Vec<u64> = report["denied"]
        .as_array()
        .expect("denied")
        .iter()
        .map(|v| v.as_u64().unwrap_or(0))
        .collect();
    for (i, name) in ["signals_denied", "timers_denied", "vm_read_denied"]
        .iter()
        .enumerate()
    {
        assert_eq!(
            denied[i] > 0,
            case.counted[i],
            "{name} is {}: {context}",
            denied[i]
        );
    }

    // The summary's line and the preview page say it too.
    match report["problem"].as_str() {
        None => assert!(case.expected.is_none(), "the summary says it: {context}"),
        Some(problem) => {
            let warned = case.expected.is_some_and(|l| l.starts_with(WARNING));
            assert_eq!(
                problem.starts_with("cannot sample"),
                warned,
                "the summary's line: {context}"
            );
            assert_eq!(
                report["page_shows_problem"], true,
                "the preview page says it: {context}"
            );
        }
    }

    // Running code: still sampled with real stacks where the sampler falls
    // back, never where it cannot sample.
    let work = report["work"].as_u64().unwrap_or(0);
    let with_burn = report["work_with_burn"].as_u64().unwrap_or(0);
    assert_eq!(
        work, 12,
        "every /work request has its transaction: {context}"
    );
    if case.samples_running_code {
        assert!(
            with_burn > 0 && report["samples_captured"].as_u64().unwrap_or(0) > 0,
            "burn_cpu is captured: {context}"
        );
    } else {
        assert_eq!(report["samples_captured"], 0, "{context}");
        assert_eq!(report["burn_samples"], 0, "no burn_cpu: {context}");
        assert!(
            report["no_stack_samples"].as_u64().unwrap_or(0) > 0,
            "requests show {NO_STACK}: {context}"
        );
        assert!(
            report["samples_emitted"].as_u64().unwrap_or(0) > 0,
            "blocked threads are still sampled: {context}"
        );
    }
    println!(
        "case {}: ok in {:?}: {} of {work} /work requests show burn_cpu ({} samples; {} with no stack captured), refused calls {denied:?}",
        case.name,
        started.elapsed(),
        with_burn,
        report["burn_samples"],
        report["no_stack_samples"]
    );
}
