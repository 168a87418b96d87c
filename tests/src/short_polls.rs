//! Work in polls of every length, and how much of it Sentry shows: the
//! example's `GET /work/{ms}/{slice_ms}` (`burn_cpu` in slices with an
//! `.await` between them) with slices of 1, 3, 6, 12 and 30 ms, each request
//! [`REQUEST_CPU_MS`] of CPU in all, at more connections than cores.
//!
//! For each slice length, over its requests, against the wall time the
//! requests spent inside `burn_cpu` (timed around each slice):
//! - what the transactions' profiles show as `burn_cpu` (what Sentry's
//!   flame graph of each transaction shows), bare and estimated (under the
//!   `(estimated from this request's samples)` frame);
//! - what Sentry's function metrics (vroomrs: each sample's weight to its
//!   leaf-most in-app frame) give `burn_cpu` in those requests' lanes, with
//!   the README's stack-trace rules;
//! - the time shown `(waiting for a CPU)` (the slices' wall time includes
//!   it: a preempted thread's wall clock runs on) and `(running: no stack
//!   captured in time)`.
//!
//! A capture stands for a period of CPU time, so a poll shorter than the
//! period gets one in proportion to its length; without the estimate, the
//! share of `burn_cpu` shown was the slice's length over the period (0.3 for
//! 3 ms slices).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use sentry_view::{ProfileChunk, TransactionWindow, transaction_profile};
use serde_json::Value;

use crate::sentry_functions::{Image, Rules, images, owner};
use crate::{http_get_with, local_settings, read_envelope_dir, relay_violations, run_service};

/// The slice lengths, in ms.
pub const SLICES_MS: [u64; 5] = [1, 3, 6, 12, 30];

/// Each request's CPU, in ms: enough that nearly every request gets
/// captures of its own (six periods at 101 Hz).
pub const REQUEST_CPU_MS: u64 = 60;

/// Wall time in `burn_cpu` per request, by the request's trace id. (Not the
/// thread's CPU clock: under load its read is a system call, and one per
/// slice would be a function of its own in the profile.)
static IN_BURN: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_nanos() as u64
}

/// The example's `work_in_slices`, timing each slice.
async fn timed_slices(
    axum::extract::Path((ms, slice_ms)): axum::extract::Path<(u64, u64)>,
    headers: http::HeaderMap,
) -> String {
    let trace = crate::trace_id_of(&headers);
    let mut left = ms;
    let mut acc = 0u64;
    // Summed here and filed once: a lock taken at every slice would be
    // contended under load, and its wait shown inside the request.
    let mut in_burn = 0u64;
    while left > 0 {
        let slice = left.min(slice_ms.max(1));
        let start = now_ns();
        acc ^= sentry_profiling_examples::burn_cpu(slice);
        in_burn += now_ns().saturating_sub(start);
        left -= slice;
        tokio::task::yield_now().await;
    }
    IN_BURN.lock().expect("timings").push((trace, in_burn));
    format!("worked {ms} ms ({acc:x})\n")
}

/// What one slice length's requests show, in ns summed over them.
#[derive(Debug, Default, Clone)]
pub struct SliceFigures {
    /// The slice length, ms.
    pub slice_ms: u64,
    /// How many of its requests' transactions were read that have a
    /// capture of their own (the figures below are theirs).
    pub requests: usize,
    /// Requests whose profile shows no capture of their own: left out of
    /// the figures (their running time shows no stack).
    pub without_capture: usize,
    /// Wall time inside `burn_cpu`.
    pub in_burn_ns: u64,
    /// `burn_cpu` shown in a bare stack.
    pub bare_ns: u64,
    /// `burn_cpu` shown under the estimated frame.
    pub estimated_ns: u64,
    /// `(waiting for a CPU)` shown.
    pub cpu_wait_ns: u64,
    /// `(running: no stack captured in time)` shown.
    pub uncaptured_ns: u64,
    /// `(waiting: where not read in time)` shown: time of the requests
    /// shown neither running nor waiting for a CPU (the requests never
    /// block, so inside their polls it is time the ledger lost).
    pub unread_ns: u64,
    /// The transactions' `tokio.polled` (the time their future was polled).
    pub polled_ns: u64,
    /// The transactions' `tokio.cpu_wait`.
    pub measured_cpu_wait_ns: u64,
    /// All the running time shown: every stack but those of waits
    /// (`burn_cpu`, the glue around it, and no stack captured).
    pub running_ns: u64,
    /// `burn_cpu`'s self time by Sentry's function metrics.
    pub function_ns: u64,
    /// The other running time shown, by the stack's leaf and root frames
    /// (for a failure's message): the largest first.
    pub other_running: Vec<(String, u64)>,
}

impl SliceFigures {
    /// The time `burn_cpu` ran by the clocks: its wall time less the time
    /// shown waiting for a CPU (nearly all of which falls inside it).
    pub fn ran_ns(&self) -> u64 {
        self.in_burn_ns.saturating_sub(self.cpu_wait_ns).max(1)
    }

    /// `burn_cpu` shown (bare or estimated) over the time it ran.
    pub fn shown_ratio(&self) -> f64 {
        (self.bare_ns + self.estimated_ns) as f64 / self.ran_ns() as f64
    }

    /// Sentry's function metrics for `burn_cpu` over the time it ran.
    pub fn function_ratio(&self) -> f64 {
        self.function_ns as f64 / self.ran_ns() as f64
    }

    /// The share of the running time shown that is `burn_cpu` (bare or
    /// estimated).
    pub fn burn_share_of_running(&self) -> f64 {
        (self.bare_ns + self.estimated_ns) as f64 / self.running_ns.max(1) as f64
    }

    /// The share of the running time shown with no stack.
    pub fn uncaptured_share(&self) -> f64 {
        self.uncaptured_ns as f64 / self.running_ns.max(1) as f64
    }

    /// The share of `burn_cpu`'s wall time shown waiting for a CPU.
    pub fn cpu_wait_share(&self) -> f64 {
        self.cpu_wait_ns as f64 / self.in_burn_ns.max(1) as f64
    }

    /// The share of the polled time shown `(waiting: where not read in
    /// time)`.
    pub fn unread_share(&self) -> f64 {
        self.unread_ns as f64 / self.polled_ns.max(1) as f64
    }

    /// The share of the polled time shown neither running nor waiting for
    /// a CPU (`(waiting: where not read in time)` included): time the
    /// ledger gave no request's poll, or another's. May be below zero where
    /// waits are shown outside the polls.
    pub fn unshown_share(&self) -> f64 {
        (self.polled_ns as f64 - self.running_ns as f64 - self.cpu_wait_ns as f64)
            / self.polled_ns.max(1) as f64
    }

    /// `tokio.cpu_wait` over the time shown waiting for a CPU.
    pub fn measured_cpu_wait_ratio(&self) -> f64 {
        self.measured_cpu_wait_ns as f64 / self.cpu_wait_ns.max(1) as f64
    }

    /// The header of the table whose rows are this type's `Display`.
    pub const TABLE_HEADER: &str = "slice  requests  in burn_cpu ms  cpu wait  shown  (estimated)  functions  of running  no stack  no capture  unread  unshown  tx cpu_wait";
}

impl std::fmt::Display for SliceFigures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:>3} ms  {:>8}  {:>14.1}  {:>8.3}  {:>5.3}  ({:>9.3})  {:>9.3}  {:>10.3}  {:>8.4}  {:>10}  {:>6.3}  {:>7.3}  {:>11.3}",
            self.slice_ms,
            self.requests,
            self.in_burn_ns as f64 / 1e6,
            self.cpu_wait_share(),
            self.shown_ratio(),
            self.estimated_ns as f64 / self.ran_ns() as f64,
            self.function_ratio(),
            self.burn_share_of_running(),
            self.uncaptured_share(),
            self.without_capture,
            self.unread_share(),
            self.unshown_share(),
            self.measured_cpu_wait_ratio(),
        )
    }
}

/// The most of `burn_cpu`'s wall time that may be shown waiting for a
/// CPU for [`check`] to hold the time shown against the clocks.
pub const QUIET_CPU_WAIT_SHARE: f64 = 0.05;

/// The bounds the `short_polls` test holds `figures` to, each slice
/// length's row printed first:
/// - of the running time the requests show, `burn_cpu` (bare or estimated)
///   is at least 0.85 and no stack at most 0.02: the requests run nothing
///   else but microseconds of glue per poll, and the estimate gives every
///   uncaptured poll of a request with captures a captured stack; but each
///   capture stands for its share of the running time, and beside CPU hogs
///   a slice length's requests get about a dozen captures in all, so one
///   that lands in the glue moves the share by up to 0.1;
///   Before the estimate, 3 ms slices showed `burn_cpu` for 0.3 of it.
///   This holds however busy the machine, which changes how much of the
///   time is shown waiting for a CPU, not what the running time shows;
/// - where the requests of a slice length waited little for a CPU (at
///   most [`QUIET_CPU_WAIT_SHARE`] of their time in `burn_cpu`, as on an
///   idle machine), `burn_cpu` shown and Sentry's function metrics are 0.9
///   to 1.1 of the time it ran by the clocks. On a busy machine that
///   figure rests on how the kernel's run delay is split between the polls
///   a worker interleaves (the sampler's ledger), and is measured by the
///   `short_polls` benchmark instead.
pub fn check(figures: &[SliceFigures]) {
    eprintln!("{}", SliceFigures::TABLE_HEADER);
    for f in figures {
        eprintln!("{f}");
    }
    for f in figures {
        let what = format!("{} ms slices", f.slice_ms);
        assert!(
            f.requests >= 2,
            "{what}: {} transactions with a capture ({} without)",
            f.requests,
            f.without_capture
        );
        assert!(
            f.burn_share_of_running() >= 0.85,
            "{what}: burn_cpu shown for {:.3} of the running time shown; the rest: {:?}",
            f.burn_share_of_running(),
            &f.other_running[..f.other_running.len().min(5)]
        );
        assert!(
            f.uncaptured_share() <= 0.02,
            "{what}: {:.3} of the running time shown has no stack",
            f.uncaptured_share()
        );
        if f.cpu_wait_share() > QUIET_CPU_WAIT_SHARE {
            eprintln!(
                "{what}: {:.2} of the time waited for a CPU; shown against the clocks not checked",
                f.cpu_wait_share()
            );
            continue;
        }
        assert!(
            (0.9..=1.1).contains(&f.shown_ratio()),
            "{what}: burn_cpu shown for {:.3} of the time it ran",
            f.shown_ratio()
        );
        assert!(
            (0.9..=1.1).contains(&f.function_ratio()),
            "{what}: Sentry's function metrics give burn_cpu {:.3} of the time it ran",
            f.function_ratio()
        );
    }
}

fn is_burn(name: Option<&str>) -> bool {
    name.is_some_and(|n| n.contains("burn_cpu"))
}

/// Runs `rounds` rounds of one request per slice length, `connections` of
/// them at a time, against the example's router on two Tokio workers, and
/// reads what Sentry shows. The stack-trace rules come from `readme`.
pub fn measure(rounds: u64, connections: usize, readme: &str) -> Vec<SliceFigures> {
    IN_BURN.lock().expect("timings").clear();
    let settings = local_settings("short-polls");
    let dir = settings.envelope_dir.clone();
    let app = axum::Router::new()
        .route("/work/{ms}/{slice_ms}", axum::routing::get(timed_slices))
        .layer(sentry_profiling_tracing::http_layer());
    run_service(&settings, app, |addr, _shutdown| async move {
        let mut queue = Vec::new();
        let mut id = 0u64;
        for _ in 0..rounds {
            for slice in SLICES_MS {
                id += 1;
                // The trace id names the request: its slice length and a
                // serial number.
                let header = format!("{:032x}-{:016x}-1", slice * 1_000_000 + id, id);
                queue.push((format!("/work/{REQUEST_CPU_MS}/{slice}"), header));
            }
        }
        let queue = std::sync::Arc::new(Mutex::new(queue));
        let mut clients = Vec::new();
        for _ in 0..connections {
            let queue = queue.clone();
            clients.push(tokio::spawn(async move {
                loop {
                    let next = queue.lock().expect("queue").pop();
                    let Some((path, header)) = next else { break };
                    let response =
                        http_get_with(addr, path, &[("sentry-trace", header.as_str())]).await;
                    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
                }
            }));
        }
        for c in clients {
            c.await.expect("a client");
        }
        // Let the last requests' transactions and samples settle.
        tokio::time::sleep(Duration::from_millis(50)).await;
    });
    let (chunks, transactions) = crate::split_items(&read_envelope_dir(&dir));
    let _ = std::fs::remove_dir_all(&dir);
    for c in &chunks {
        let violations = relay_violations(c);
        assert!(
            violations.is_empty(),
            "Relay rejects a chunk: {violations:?}"
        );
    }
    let parsed: Vec<(ProfileChunk, Vec<Image>)> = chunks
        .iter()
        .map(|c| {
            (
                ProfileChunk::from_value(&c.payload).expect("a chunk Sentry reads"),
                images(&c.payload),
            )
        })
        .collect();
    let only: Vec<ProfileChunk> = parsed.iter().map(|(c, _)| c.clone()).collect();
    let rules = Rules::from_readme(readme);
    assert!(!rules.is_empty(), "no stack-trace rules in the README");
    let in_burn = std::mem::take(&mut *IN_BURN.lock().expect("timings"));
    let mut by_slice: HashMap<u64, SliceFigures> = SLICES_MS
        .iter()
        .map(|&s| {
            (
                s,
                SliceFigures {
                    slice_ms: s,
                    ..SliceFigures::default()
                },
            )
        })
        .collect();
    for tx in &transactions {
        let Some(trace) = trace_of(tx) else { continue };
        let Ok(window) = TransactionWindow::from_value(tx) else {
            continue;
        };
        let Some(fig) = u128::from_str_radix(&trace, 16)
            .ok()
            .map(|n| (n / 1_000_000) as u64)
            .and_then(|s| by_slice.get_mut(&s))
        else {
            continue;
        };
        let shown = transaction_profile(&only, &window);
        // This request's figures, added to its slice length's only if it
        // has a capture of its own (a request with none keeps no stack, as
        // the README's limits say; counted apart).
        let mut mine = SliceFigures::default();
        let mut captured = false;
        for s in &shown.samples {
            let names: Vec<Option<&str>> = shown.stack(s).map(|f| f.function.as_deref()).collect();
            let estimated = names.contains(&Some(sentry_view::ESTIMATED_FUNCTION));
            let waiting = shown.stack(s).next().is_some_and(|leaf| {
                leaf.is_synthetic()
                    && leaf.function.as_deref() != Some(sentry_view::UNCAPTURED_FUNCTION)
            });
            if !waiting {
                mine.running_ns += s.weight_ns;
            }
            if !waiting && !names.iter().any(|&n| is_burn(n)) {
                let name =
                    |n: Option<&Option<&str>>| n.copied().flatten().unwrap_or("?").to_owned();
                let key = format!("{} .. {}", name(names.first()), name(names.last()));
                match mine.other_running.iter_mut().find(|o| o.0 == key) {
                    Some(o) => o.1 += s.weight_ns,
                    None => mine.other_running.push((key, s.weight_ns)),
                }
            }
            if names.iter().any(|&n| is_burn(n)) {
                if estimated {
                    mine.estimated_ns += s.weight_ns;
                } else {
                    mine.bare_ns += s.weight_ns;
                    captured = true;
                }
            } else if names.first() == Some(&Some(sentry_view::WAITING_FOR_CPU_FUNCTION)) {
                mine.cpu_wait_ns += s.weight_ns;
            } else if names.first() == Some(&Some(sentry_view::UNCAPTURED_FUNCTION)) {
                mine.uncaptured_ns += s.weight_ns;
            } else if names.first() == Some(&Some(sentry_view::WAITING_UNREAD_FUNCTION)) {
                mine.unread_ns += s.weight_ns;
            }
        }
        if !captured {
            fig.without_capture += 1;
            continue;
        }
        fig.requests += 1;
        for b in in_burn.iter().filter(|b| b.0 == trace) {
            fig.in_burn_ns += b.1;
        }
        fig.running_ns += mine.running_ns;
        fig.bare_ns += mine.bare_ns;
        fig.estimated_ns += mine.estimated_ns;
        fig.cpu_wait_ns += mine.cpu_wait_ns;
        fig.uncaptured_ns += mine.uncaptured_ns;
        fig.unread_ns += mine.unread_ns;
        fig.polled_ns += measurement_ns(tx, "tokio.polled");
        fig.measured_cpu_wait_ns += measurement_ns(tx, "tokio.cpu_wait");
        for (key, ns) in mine.other_running {
            match fig.other_running.iter_mut().find(|o| o.0 == key) {
                Some(o) => o.1 += ns,
                None => fig.other_running.push((key, ns)),
            }
        }
        fig.other_running.sort_by_key(|o| std::cmp::Reverse(o.1));
        fig.function_ns += function_time(&parsed, &rules, &window);
    }
    SLICES_MS.iter().map(|s| by_slice[s].clone()).collect()
}

/// `burn_cpu`'s self time by Sentry's function metrics in the lane of
/// `window`: each of the lane's samples in the window, weighted by the time
/// to the lane's next sample of its chunk, charged to its leaf-most in-app
/// frame.
fn function_time(
    chunks: &[(ProfileChunk, Vec<Image>)],
    rules: &Rules,
    window: &TransactionWindow,
) -> u64 {
    let mut total = 0;
    for (chunk, images) in chunks {
        let mut lane: Vec<(u64, usize)> = chunk
            .samples
            .iter()
            .filter(|s| s.thread_id == window.thread_id)
            .map(|s| (s.timestamp_ns, s.stack_id))
            .collect();
        lane.sort_unstable();
        for pair in lane.windows(2) {
            let (ts, stack) = pair[0];
            if ts < window.start_ns || ts > window.end_ns {
                continue;
            }
            let Some(stack) = chunk.stacks.get(stack) else {
                continue;
            };
            if charged_to_burn(chunk, images, rules, stack) {
                total += pair[1].0.saturating_sub(ts);
            }
        }
    }
    total
}

/// Whether Sentry's function metrics charge a sample of `stack` to
/// `burn_cpu`: its owner (see [`owner`]) is `burn_cpu`, or, in a build
/// that keeps the standard library's generic helpers as frames of their own
/// (a debug build: `<u64 as core::iter::range::Step>::forward_unchecked`,
/// which no stack-trace rule can mark `-app` without also marking a user's
/// own trait impls), a function called by `burn_cpu` that is not this
/// workspace's code. In a release build, where those are inlined, this is
/// exactly Sentry's figure.
fn charged_to_burn(chunk: &ProfileChunk, images: &[Image], rules: &Rules, stack: &[usize]) -> bool {
    let Some(name) = owner(chunk, images, rules, stack) else {
        return false;
    };
    if is_burn(Some(&name)) {
        return true;
    }
    let name_of = |f: &usize| chunk.frames.get(*f).and_then(|f| f.function.as_deref());
    let at = stack.iter().position(|f| name_of(f) == Some(name.as_str()));
    !name.starts_with("sentry_profiling")
        && at.is_some_and(|k| stack[k + 1..].iter().any(|f| is_burn(name_of(f))))
}

/// A transaction's measurement `key` (in ms), in ns; 0 if it has none.
fn measurement_ns(tx: &Value, key: &str) -> u64 {
    tx.pointer(&format!("/measurements/{key}/value"))
        .and_then(Value::as_f64)
        .map_or(0, |ms| (ms * 1e6) as u64)
}

fn trace_of(tx: &Value) -> Option<String> {
    tx.pointer("/contexts/trace/trace_id")
        .and_then(Value::as_str)
        .map(str::to_owned)
}
