//! Project automation, run as `cargo xtask <command>`:
//!
//! - `test`: every test of the workspace, plus the unwinding test binaries
//!   again in the release profile (release code has no frame pointers, so
//!   DWARF unwinding is what is tested there, and a waiting thread's frames
//!   are laid out as in a service).
//! - `ci`: formatting, clippy with warnings denied (also for aarch64
//!   Linux), documentation with warnings denied, `test`, a smoke run of the
//!   benchmarks, the unsupported-platform variant's unit tests, and a 30 s
//!   stress run.
//! - `stress [SECONDS] [HZ] [CHUNK_SECONDS]` (default 600 s at 1000 Hz, 60 s
//!   chunks; `ci` uses 10 s chunks, to check several): builds the stress
//!   binary and its test library in release and runs them: the profiler
//!   beside thread churn, allocator pressure, `dlopen`/`dlclose`, a thread
//!   blocking the signal, small and alternate stacks and an HTTP service,
//!   failing on a crash, a hang (watchdog), a chunk Relay would reject or a
//!   sample filed under the wrong thread (see `stress/src/main.rs`).
//! - `bench [--quick]`: every benchmark in `benches/`, pprof-rs's framehop
//!   variant and the cost benchmark, with a report written to
//!   `target/benchmarks/report.md`; `--quick` is a smoke run of the benches
//!   and of the cost benchmark.
//! - `view [ENVELOPE_DIR]` (default `sentry-envelopes`): writes
//!   `ENVELOPE_DIR/profile.html`, the offline page that shows what Sentry
//!   will show for each transaction of a run (`sentry-profiling-preview`).
//! - `cost [ROUNDS]` (default 10): what a profiled request costs: the
//!   example's router with transactions through the SDK's HTTP transport to
//!   a loopback sink in another process, profiling off, on and pprof-rs in
//!   alternating rounds of a fixed number of requests, CPU per request of
//!   every thread group with 95 % confidence intervals, the profiler
//!   threads at fixed rates and with requests in flight but idle (see
//!   `xtask/src/cost.rs`).
//! - `instructions [REQUESTS]` (default 6000): the user-space instructions
//!   a `GET /` costs, profiling off and on, counted under valgrind's
//!   cachegrind rather than timed: a figure the machine's noise does not
//!   move (see `xtask/src/instructions.rs`).
//! - `soak [MINUTES]` (default 10): the example's resident memory every
//!   10 s at the maximum loopback rate with its pprof and OTLP files on,
//!   profiling off then on (see `xtask/src/soak.rs`).

mod bench;
mod cost;
mod instructions;
mod soak;

use std::process::{Command, ExitCode};

fn cargo(args: &[&str], env: &[(&str, &str)]) -> bool {
    eprintln!("xtask: cargo {}", args.join(" "));
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    match cmd.status() {
        Ok(s) => s.success(),
        Err(e) => {
            eprintln!("xtask: cannot run cargo: {e}");
            false
        }
    }
}

fn test() -> bool {
    cargo(&["test", "--workspace"], &[])
        && cargo(
            &[
                "test",
                "--release",
                "-p",
                "sentry-profiling",
                "--test",
                "sampler_unwind",
                "--test",
                "sampler_waiting_threads",
            ],
            &[],
        )
}

fn ci() -> bool {
    cargo(&["fmt", "--all", "--", "--check"], &[])
        && cargo(
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ],
            &[],
        )
        && cargo(
            &["doc", "--workspace", "--no-deps"],
            &[("RUSTDOCFLAGS", "-D warnings")],
        )
        && cargo(
            &[
                "clippy",
                "-p",
                "sentry-profiling",
                "--no-default-features",
                "--",
                "-D",
                "warnings",
            ],
            &[],
        )
        && aarch64()
        && test()
        && bench(true)
        && unsupported()
        && stress(CI_STRESS_SECONDS, 1000, 10)
}

/// Lints the library for aarch64 Linux (its unwinding and call checks
/// differ there), in a target directory of its own. Needs the target's
/// standard library (`rustup target add aarch64-unknown-linux-gnu`) and a C
/// cross compiler for the TLS crate's build script (Debian's
/// `gcc-aarch64-linux-gnu`; `.ci/run` installs both).
fn aarch64() -> bool {
    let target = target_dir().join("aarch64");
    cargo(
        &[
            "clippy",
            "-p",
            "sentry-profiling",
            "--all-targets",
            "--target",
            "aarch64-unknown-linux-gnu",
            "--target-dir",
            &target.to_string_lossy(),
            "--",
            "-D",
            "warnings",
        ],
        &[],
    )
}

/// Cargo's target directory (`CARGO_TARGET_DIR`, or the workspace's
/// `target`).
fn target_dir() -> std::path::PathBuf {
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace");
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace.join("target"), std::path::PathBuf::from)
}

/// The stress run's length in `ci`.
const CI_STRESS_SECONDS: u64 = 30;

/// Builds the stress binary and the library it loads (release), and runs it.
fn stress(seconds: u64, hz: u32, chunk_seconds: u64) -> bool {
    if !cargo(
        &[
            "build",
            "--release",
            "-p",
            "sentry-profiling-stress",
            "-p",
            "sentry-profiling-stress-cdylib",
        ],
        &[],
    ) {
        return false;
    }
    let dir = target_dir().join("release");
    let exe = dir.join("stress");
    eprintln!("xtask: {} {seconds} {hz} {chunk_seconds}", exe.display());
    match Command::new(&exe)
        .args([
            seconds.to_string(),
            hz.to_string(),
            chunk_seconds.to_string(),
        ])
        .env("STRESS_CDYLIB", dir.join("libstress_cdylib.so"))
        .status()
    {
        Ok(s) => s.success(),
        Err(e) => {
            eprintln!("xtask: cannot run {}: {e}", exe.display());
            false
        }
    }
}

/// Builds and unit-tests the variant for platforms without a sampler.
fn unsupported() -> bool {
    cargo(
        &[
            "test",
            "-p",
            "sentry-profiling",
            "--lib",
            "--target-dir",
            "target/unsupported",
        ],
        &[("SENTRY_PROFILING_FORCE_UNSUPPORTED", "1")],
    )
}

fn bench(quick: bool) -> bool {
    if quick {
        cargo(
            &["bench", "-p", "sentry-profiling-benches", "--", "--test"],
            &[],
        ) && cost::run(1, true)
            .map_err(|e| eprintln!("xtask cost (smoke run): {e}"))
            .is_ok()
    } else {
        bench::full()
            .map_err(|e| eprintln!("xtask bench: {e}"))
            .is_ok()
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ok = match args.first().map(String::as_str) {
        Some("test") => test(),
        Some("ci") => ci(),
        Some("bench") => bench(args.iter().any(|a| a == "--quick")),
        Some("stress") => stress(
            args.get(1).and_then(|a| a.parse().ok()).unwrap_or(600),
            args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1000),
            args.get(3).and_then(|a| a.parse().ok()).unwrap_or(60),
        ),
        Some("view") => cargo(
            &[
                "run",
                "--quiet",
                "-p",
                "sentry-profiling-preview",
                "--",
                args.get(1).map_or("sentry-envelopes", String::as_str),
            ],
            &[],
        ),
        Some("soak") => {
            let minutes = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(10);
            soak::soak(minutes)
                .map_err(|e| eprintln!("xtask soak: {e}"))
                .is_ok()
        }
        Some("instructions") => {
            let requests = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(6000);
            instructions::run_all(requests)
                .map_err(|e| eprintln!("xtask instructions: {e}"))
                .is_ok()
        }
        Some("cost") => {
            let rounds = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(10);
            cost::run(rounds, false)
                .map_err(|e| eprintln!("xtask cost: {e}"))
                .is_ok()
        }
        _ => {
            eprintln!(
                "usage: cargo xtask <test|ci|bench [--quick]|stress [SECONDS] [HZ] [CHUNK_SECONDS]|cost [ROUNDS]|instructions [REQUESTS]|soak [MINUTES]|view [ENVELOPE_DIR]>"
            );
            false
        }
    };
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
