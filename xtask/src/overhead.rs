//! `cargo xtask overhead`: the example service under `wrk` on loopback, in
//! alternating rounds with profiling off and on, reporting CPU time per
//! request (from the process's own accounting), throughput and latency, each
//! as a ratio to "off" (median over rounds, with min and max).

use std::process::{Command, Stdio};
use std::time::Duration;

/// One measured round.
#[derive(Debug, Clone, Copy)]
struct Round {
    cpu_us_per_request: f64,
    requests_per_sec: f64,
    p99_ms: f64,
}

/// A profiling mode of the service twin (`benches/src/bin/service_twin.rs`).
#[derive(Debug, Clone, Copy)]
struct Mode {
    name: &'static str,
    /// The twin's mode argument.
    arg: &'static str,
    /// Which build of the twin: the default one, or pprof-rs with its
    /// framehop unwinder.
    framehop_build: bool,
}

const MODES: [Mode; 4] = [
    Mode {
        name: "off",
        arg: "off",
        framehop_build: false,
    },
    Mode {
        name: "sentry-profiling 101 Hz",
        arg: "sentry-profiling",
        framehop_build: false,
    },
    Mode {
        name: "pprof-rs 100 Hz (backtrace-rs)",
        arg: "pprof-rs",
        framehop_build: false,
    },
    Mode {
        name: "pprof-rs 100 Hz (framehop)",
        arg: "pprof-rs",
        framehop_build: true,
    },
];

const TWIN: &str = "target/release/service_twin";
const TWIN_FRAMEHOP: &str = "target/pprof-framehop/release/service_twin";

fn clock_ticks_per_sec() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat; `rest` starts at field 3.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn parse_duration_ms(s: &str) -> Option<f64> {
    let (num, unit) = s.split_at(s.find(|c: char| c.is_ascii_alphabetic())?);
    let v: f64 = num.parse().ok()?;
    Some(match unit {
        "us" => v / 1000.0,
        "ms" => v,
        "s" => v * 1000.0,
        _ => return None,
    })
}

fn run_round(mode: Mode, port: u16, secs: u32, path: &str) -> Result<Round, String> {
    let dir = std::env::temp_dir().join(format!("sp-overhead-{}-{port}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let bin = if mode.framehop_build {
        TWIN_FRAMEHOP
    } else {
        TWIN
    };
    let mut child = Command::new(bin)
        .arg(mode.arg)
        .env("ADDR", format!("127.0.0.1:{port}"))
        .env("SENTRY_ENVELOPE_DIR", &dir)
        .env_remove("SENTRY_DSN")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {bin}: {e}"))?;
    std::thread::sleep(Duration::from_millis(800));
    let before = cpu_ticks(child.id()).ok_or("cannot read the service's CPU time")?;
    let out = Command::new("wrk")
        .args(["-t2", "-c16", &format!("-d{secs}s"), "--latency"])
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .map_err(|e| format!("cannot run wrk (apt-get install wrk): {e}"))?;
    let after = cpu_ticks(child.id()).ok_or("cannot read the service's CPU time")?;
    // SIGINT for a graceful shutdown, as an operator would.
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);

    let text = String::from_utf8_lossy(&out.stdout);
    let requests: f64 = text
        .lines()
        .find(|l| l.contains("requests in"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("unexpected wrk output:\n{text}"))?;
    let p99_ms = text
        .lines()
        .find(|l| l.trim_start().starts_with("99%"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(parse_duration_ms)
        .ok_or_else(|| format!("no p99 in wrk output:\n{text}"))?;
    let cpu_s = (after - before) as f64 / clock_ticks_per_sec();
    Ok(Round {
        cpu_us_per_request: cpu_s * 1e6 / requests,
        requests_per_sec: requests / f64::from(secs),
        p99_ms,
    })
}

fn stats(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (
        values[values.len() / 2],
        values[0],
        values[values.len() - 1],
    )
}

/// Runs the comparison; returns (and prints) a Markdown table.
pub(crate) fn run(rounds: usize, secs: u32, path: &str) -> Result<String, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let build = |extra: &[&str]| {
        Command::new(&cargo)
            .args([
                "build",
                "--release",
                "-p",
                "sentry-profiling-benches",
                "--bin",
                "service_twin",
            ])
            .args(extra)
            .status()
            .map_err(|e| e.to_string())
            .and_then(|s| {
                if s.success() {
                    Ok(())
                } else {
                    Err("building the service twin failed".into())
                }
            })
    };
    build(&[])?;
    let framehop = build(&[
        "--features",
        "pprof-framehop",
        "--target-dir",
        "target/pprof-framehop",
    ]);
    if let Err(e) = &framehop {
        eprintln!(
            "xtask overhead: pprof-rs with framehop does not build here ({e}); skipping that mode"
        );
    }
    let mut results: Vec<Vec<Round>> = vec![Vec::new(); MODES.len()];
    for round in 0..rounds {
        for (i, mode) in MODES.iter().enumerate() {
            if mode.framehop_build && framehop.is_err() {
                continue;
            }
            let r = run_round(*mode, 3300 + i as u16, secs, path)?;
            eprintln!(
                "round {} {:<26} {:>8.1} µs CPU/request {:>9.0} req/s p99 {:>6.2} ms",
                round + 1,
                mode.name,
                r.cpu_us_per_request,
                r.requests_per_sec,
                r.p99_ms
            );
            results[i].push(r);
        }
    }
    let mut table = String::from(
        "| mode | CPU/request vs off (median [min, max]) | throughput vs off | p99 vs off |\n|---|---|---|---|\n",
    );
    let off = &results[0];
    for (mode, rs) in MODES.iter().zip(&results) {
        if rs.is_empty() {
            continue;
        }
        let ratio = |f: fn(&Round) -> f64| {
            let mut v: Vec<f64> = rs.iter().zip(off).map(|(r, o)| f(r) / f(o)).collect();
            stats(&mut v)
        };
        let (c, c0, c1) = ratio(|r| r.cpu_us_per_request);
        let (t, t0, t1) = ratio(|r| r.requests_per_sec);
        let (p, p0, p1) = ratio(|r| r.p99_ms);
        table.push_str(&format!(
            "| {} | {c:.3} [{c0:.3}, {c1:.3}] | {t:.3} [{t0:.3}, {t1:.3}] | {p:.3} [{p0:.3}, {p1:.3}] |\n",
            mode.name
        ));
    }
    print!("{table}");
    Ok(table)
}
