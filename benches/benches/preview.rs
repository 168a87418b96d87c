//! The preview page at the size of a busy run: one full 60 s chunk of 16
//! threads sampled at 101 Hz (96 960 samples, stacks 30 to 70 frames deep,
//! a few thousand distinct stacks) plus 5 000 transactions with their
//! lanes, written as envelopes. Measured:
//!
//! - building the page (`sentry_profiling_preview::write_page`) and its size;
//! - with Chromium installed, the time headless Chromium takes to load and
//!   render it (as opened, and with every flame graph of the first page,
//!   every transaction name and every thread opened: `#expand=all`), and the
//!   time the page's own script reports.
//!
//! `cargo bench -p sentry-profiling-benches --bench preview`; `-- --test`
//! runs a run a tenth the size (a smoke run). Nothing here asserts on a
//! figure.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use sentry_profiling_preview::envelope_bytes;
use sentry_profiling_tests::browser::{chromium, headless};

const THREADS: u64 = 16;
const HZ: u64 = 101;
const LANE_BASE: u64 = 1_000_000_000;

/// A deterministic generator (xorshift), so every run writes the same data.
struct Rng(u64);

impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Writes the run's envelopes into `dir`; returns (samples, transactions).
fn write_run(dir: &Path, seconds: u64, transactions: u64) -> (usize, usize) {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let profiler = "0123456789abcdef0123456789abcdef";
    // Frames: a runtime trunk, request-handling frames and leaves, named as
    // demangled Rust functions are.
    let mut frames = Vec::new();
    for i in 0..400 {
        frames.push(format!(
            "{{\"function\":\"<tokio::runtime::task::harness::Harness<app::service::Handler{i}<axum::routing::Route>,S> as core::future::future::Future>::poll\",\"instruction_addr\":\"0x{:x}\"}}",
            0x5000 + i * 16
        ));
    }
    frames.push("{\"function\":\"app::burn_cpu\",\"instruction_addr\":\"0x9000\"}".into());
    frames.push(
        "{\"function\":\"(suspended: awaiting or queued)\",\"instruction_addr\":\"0x1\"}".into(),
    );
    let burn = frames.len() - 2;
    let suspended = frames.len() - 1;
    // 3000 stacks: depth 30 to 70, leaf first, sharing their root half.
    let mut stacks = vec![format!("[{suspended}]")];
    for _ in 0..3000 {
        let depth = 30 + rng.next(41) as usize;
        let mut s: Vec<usize> = (0..depth)
            .map(|d| {
                if d < depth / 2 {
                    d
                } else {
                    rng.next(400) as usize
                }
            })
            .collect();
        if rng.next(2) == 0 {
            s.push(burn);
        }
        s.reverse();
        stacks.push(format!("{s:?}"));
    }
    let start = 1_800_000_000.0f64;
    let period = 1.0 / HZ as f64;
    let mut samples = String::new();
    let mut count = 0;
    let mut push = |samples: &mut String, ts: f64, tid: u64, stack: u64| {
        if count > 0 {
            samples.push(',');
        }
        count += 1;
        let _ = write!(
            samples,
            "{{\"timestamp\":{ts:.6},\"thread_id\":\"{tid}\",\"stack_id\":{stack}}}"
        );
    };
    for t in 0..THREADS {
        for i in 0..seconds * HZ {
            let stack = 1 + rng.next(3000);
            push(&mut samples, start + i as f64 * period, 4000 + t, stack);
        }
    }
    let mut tx_items = Vec::new();
    for k in 0..transactions {
        let lane = LANE_BASE + k;
        let begin = start + rng.next(seconds * 1000 - 200) as f64 / 1000.0;
        let len = 2 + rng.next(20);
        for i in 0..len {
            let stack = if rng.next(3) == 0 {
                0
            } else {
                1 + rng.next(3000)
            };
            push(&mut samples, begin + i as f64 * period, lane, stack);
        }
        let end = begin + len as f64 * period;
        tx_items.push(format!(
            "{{\"transaction\":\"GET /route/{}\",\"start_timestamp\":{begin:.6},\"timestamp\":{end:.6},\"contexts\":{{\"profile\":{{\"type\":\"profile\",\"profiler_id\":\"{profiler}\"}},\"trace\":{{\"op\":\"http.server\",\"status\":\"ok\",\"data\":{{\"thread.id\":\"{lane}\"}}}}}}}}",
            k % 20
        ));
    }
    let chunk = format!(
        "{{\"version\":\"2\",\"profiler_id\":\"{profiler}\",\"chunk_id\":\"c\",\"platform\":\"rust\",\"profile\":{{\"frames\":[{}],\"stacks\":[{}],\"samples\":[{samples}],\"thread_metadata\":{{}}}}}}",
        frames.join(","),
        stacks.join(",")
    );
    std::fs::write(
        dir.join("000000.envelope"),
        envelope_bytes(&[("profile_chunk", chunk.as_bytes())]),
    )
    .unwrap();
    for (i, tx) in tx_items.into_iter().enumerate() {
        std::fs::write(
            dir.join(format!("{:06}.envelope", i + 1)),
            envelope_bytes(&[("transaction", tx.as_bytes())]),
        )
        .unwrap();
    }
    (count, transactions as usize)
}

/// Loads the page in headless Chromium; returns the wall time and the
/// script time the page reports.
fn render(browser: &Path, page: &Path, fragment: &str, profile: &Path) -> (f64, Option<f64>) {
    let started = Instant::now();
    let url = format!("file://{}#{fragment}", page.display());
    let out = headless(browser, profile, &url, &["--dump-dom".into()])
        .output()
        .expect("run chromium");
    let wall = started.elapsed().as_secs_f64();
    let dom = String::from_utf8_lossy(&out.stdout);
    let script = dom
        .split("data-render-ms=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .and_then(|v| v.parse().ok());
    (wall, script)
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--test");
    let (seconds, transactions) = if smoke { (6, 500) } else { (60, 5_000) };
    let dir = std::env::temp_dir().join(format!("preview-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (samples, txs) = write_run(&dir, seconds, transactions);
    let started = Instant::now();
    let (page, summary) = sentry_profiling_preview::write_page(&dir).expect("page");
    let build = started.elapsed().as_secs_f64();
    let size = std::fs::metadata(&page).unwrap().len();
    println!(
        "run: {seconds} s chunk, {THREADS} threads at {HZ} Hz, {transactions} transactions: {samples} samples, {txs} transactions ({} with a flame graph)",
        summary.flame_graphs
    );
    println!("page: built in {build:.2} s, {:.1} MB", size as f64 / 1e6);
    match chromium() {
        Some(browser) => {
            let profile = dir.join("chromium-profile");
            // The smoke run only opens it: drawing every graph takes a while.
            let fragments: &[&str] = if smoke { &[""] } else { &["", "expand=all"] };
            for fragment in fragments {
                let (wall, script) = render(&browser, &page, fragment, &profile);
                println!(
                    "chromium, {}: {wall:.2} s to load and render (page script: {} ms)",
                    if fragment.is_empty() {
                        "as opened"
                    } else {
                        "#expand=all"
                    },
                    script.map_or_else(|| "?".into(), |s| format!("{s:.0}"))
                );
            }
        }
        None => {
            println!("chromium: not installed (apt-get install chromium); render time not measured")
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
