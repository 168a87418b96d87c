//! Concurrent clients whose requests can be told apart in a profile.
//!
//! Client `k` sends its requests one after another and its handlers burn
//! CPU in a function of its own, `client_cpu_<k>` (see [`cpu`]). A sample
//! showing client k's function therefore belongs to client k's request in
//! flight; shown for another client's transaction it is misattributed. The
//! requests continue a `sentry-trace` whose trace id names client and
//! request number, so each transaction says whose it is.

use std::time::Duration;

use serde_json::Value;

use crate::{ChunkItem, functions_in_window, http_get_with, transaction_window};

/// Clients at most ([`cpu`] has this many functions).
pub const MAX_CLIENTS: u64 = 8;

/// Burns `ms` of this thread's CPU time (not wall time: on a loaded machine
/// the request still does the same work).
pub(crate) fn burn(ms: u64) -> u64 {
    let start = thread_cpu();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    while thread_cpu().saturating_sub(start) < Duration::from_millis(ms) {
        for i in 0..5_000u64 {
            x = std::hint::black_box(x.rotate_left(5) ^ i).wrapping_mul(0x100_0000_01b3);
        }
    }
    x
}

/// The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`).
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec and the clock id a
    // constant the kernel knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

macro_rules! cpu_functions {
    ($($k:literal => $name:ident),* $(,)?) => {
        $(
            #[inline(never)]
            fn $name(ms: u64) -> u64 {
                std::hint::black_box(burn(ms)) ^ $k
            }
        )*
        /// Burns `ms` of CPU time in client `k`'s function
        /// (`client_cpu_<k>`). Panics for `k >= MAX_CLIENTS`.
        pub fn cpu(k: u64, ms: u64) -> u64 {
            match k {
                $($k => $name(ms),)*
                _ => panic!("client {k} has no CPU function"),
            }
        }
    };
}

cpu_functions! {
    0 => client_cpu_0,
    1 => client_cpu_1,
    2 => client_cpu_2,
    3 => client_cpu_3,
    4 => client_cpu_4,
    5 => client_cpu_5,
    6 => client_cpu_6,
    7 => client_cpu_7,
}

/// Burns `ms` of CPU time in client `k`'s function in two slices, with a
/// `yield_now().await` after each: a request whose CPU runs across an
/// `.await`, as a handler's does.
pub async fn cpu_across_await(k: u64, ms: u64) -> u64 {
    let mut x = 0;
    for _ in 0..2 {
        x ^= cpu(k, ms / 2);
        tokio::task::yield_now().await;
    }
    x
}

/// The `sentry-trace` header of client `k`'s request `n`.
pub fn trace_header(k: u64, n: u64) -> String {
    format!("5eed{:020x}{k:04x}{n:04x}-{:016x}-1", 0, k * 1000 + n + 1)
}

/// The client and request number of a transaction (see [`trace_header`]).
pub fn client_of(tx: &Value) -> Option<(u64, u64)> {
    let id = tx.pointer("/contexts/trace/trace_id")?.as_str()?;
    Some((
        u64::from_str_radix(id.get(24..28)?, 16).ok()?,
        u64::from_str_radix(id.get(28..32)?, 16).ok()?,
    ))
}

/// The client whose CPU function a stack shows, if any.
pub fn cpu_client(stack: &[String]) -> Option<u64> {
    stack.iter().find_map(|f| {
        let at = f.find("client_cpu_")?;
        f[at + "client_cpu_".len()..]
            .chars()
            .next()?
            .to_digit(10)
            .map(u64::from)
    })
}

/// Of the samples Sentry shows for `tx` (its `profiler_id`, its
/// `thread.id`, inside its `[start, end]`), those that show its own
/// client's CPU function and those that show another client's.
pub fn own_and_other(tx: &Value, chunks: &[ChunkItem]) -> (usize, usize) {
    let Some((client, _)) = client_of(tx) else {
        return (0, 0);
    };
    let profiler_id = tx.pointer("/contexts/profile/profiler_id");
    let thread_id = tx
        .pointer("/contexts/trace/data/thread.id")
        .and_then(Value::as_str);
    let Some((start, end)) = transaction_window(tx) else {
        return (0, 0);
    };
    let (mut own, mut other) = (0, 0);
    for chunk in chunks
        .iter()
        .filter(|c| profiler_id.is_some() && c.payload.get("profiler_id") == profiler_id)
    {
        for stack in functions_in_window(chunk, thread_id, start, end) {
            match cpu_client(&stack) {
                Some(c) if c == client => own += 1,
                Some(_) => other += 1,
                None => {}
            }
        }
    }
    (own, other)
}

/// Asserts that all `requests` of a [`drive`] run were answered 200.
pub fn assert_every_request_succeeded(responses: &[String], requests: usize) {
    let ok = responses
        .iter()
        .filter(|r| r.starts_with("HTTP/1.1 200"))
        .count();
    assert_eq!(ok, requests, "every request succeeds");
}

/// Runs `clients` concurrent clients of `per_client` requests each against
/// `addr`; client k's request n asks for `path(k, n)` with
/// [`trace_header`]`(k, n)`. Every client's request 0 is a warm-up: all are
/// sent together, and the others wait until all have been answered (the
/// trace lifecycle starts the profiler with the first request, and pools
/// start their threads). Returns every whole response.
pub async fn drive(
    addr: std::net::SocketAddr,
    clients: u64,
    per_client: u64,
    path: fn(u64, u64) -> String,
) -> Vec<String> {
    assert!(clients <= MAX_CLIENTS, "at most {MAX_CLIENTS} clients");
    let warm = std::sync::Arc::new(tokio::sync::Barrier::new(clients as usize));
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..clients {
        let warm = warm.clone();
        tasks.spawn(async move {
            let mut out = Vec::new();
            for n in 0..per_client {
                let header = trace_header(k, n);
                out.push(
                    http_get_with(addr, path(k, n), &[("sentry-trace", header.as_str())]).await,
                );
                if n == 0 {
                    warm.wait().await;
                }
            }
            out
        });
    }
    let mut all = Vec::new();
    while let Some(r) = tasks.join_next().await {
        all.extend(r.expect("client task"));
    }
    all
}

/// Client options for these tests: every transaction sampled, envelopes
/// captured by `capture`, profiling applied with the trace lifecycle at
/// 500 Hz, and a 30 s shutdown timeout. The whole run is one chunk,
/// encoded and handed over at shutdown; on a loaded machine, in a debug
/// build, that takes longer than the SDK's default 2 s (after which the
/// chunk would be dropped by design).
pub fn captured_options(
    capture: &std::sync::Arc<crate::CaptureTransport>,
) -> sentry::ClientOptions {
    captured_options_with(capture, |p| p)
}

/// [`captured_options`] with the profiling integration changed by `adjust`.
pub fn captured_options_with(
    capture: &std::sync::Arc<crate::CaptureTransport>,
    adjust: impl FnOnce(
        sentry_profiling::ProfilingIntegration,
    ) -> sentry_profiling::ProfilingIntegration,
) -> sentry::ClientOptions {
    let mut options = sentry::ClientOptions::new().traces_sample_rate(1.0);
    options.dsn = sentry_profiling_examples::LOCAL_DSN.parse().ok();
    options.transport = Some(capture.factory());
    options.shutdown_timeout = Duration::from_secs(30);
    adjust(
        sentry_profiling::ProfilingIntegration::new()
            .profile_session_sample_rate(1.0)
            .profile_lifecycle(sentry_profiling::ProfileLifecycle::Trace)
            .frequency_hz(500),
    )
    .apply(options)
}

/// One transaction as Sentry's UI shows it, scored against its client.
#[derive(Debug, Clone)]
pub struct Shown {
    /// The transaction's name.
    pub name: String,
    /// Its client and request number (see [`trace_header`]).
    pub client: u64,
    /// See [`Shown::client`].
    pub request: u64,
    /// Why Sentry would find no profile for it (`link_problem`), if so.
    pub link_problem: Option<String>,
    /// The shown time (each sample weighted by the time to the next sample
    /// of its thread, as Sentry weights them) of samples showing the
    /// client's own CPU function, in nanoseconds.
    pub own_ns: u64,
    /// The same for samples showing another client's CPU function.
    pub other_ns: u64,
    /// Samples shown with the client's own CPU function.
    pub own_samples: usize,
    /// Samples shown with another client's CPU function.
    pub other_samples: usize,
    /// All the time shown for it, and the parts shown as a synthetic
    /// frame: suspended (awaiting or queued), and request time whose stack
    /// was not captured in time.
    pub total_ns: u64,
    /// See [`Shown::total_ns`].
    pub suspended_ns: u64,
    /// See [`Shown::total_ns`].
    pub uncaptured_ns: u64,
    /// The heaviest stacks shown that show no client's CPU function
    /// (synthetic frames included): their innermost few function names, and
    /// their shown time in nanoseconds, heaviest first (at most three).
    pub instead: Vec<(String, u64)>,
}

/// Scores every transaction as Sentry shows it, with
/// `sentry_view`: the samples of its `profiler_id` on its
/// `thread.id` inside its `[start, end]`, weighted by the time to the next
/// sample of that thread. Transactions without a client in their trace id
/// are skipped.
pub fn shown(transactions: &[Value], chunks: &[ChunkItem]) -> Vec<Shown> {
    use sentry_view::{ProfileChunk, TransactionWindow, transaction_profile};
    let parsed: Vec<ProfileChunk> = chunks
        .iter()
        .map(|c| ProfileChunk::from_value(&c.payload).expect("a readable chunk"))
        .collect();
    let mut index = crate::SampleIndex::default();
    for c in chunks {
        index.add_chunk(c);
    }
    let mut out = Vec::new();
    for tx in transactions {
        let Some((client, request)) = client_of(tx) else {
            continue;
        };
        let mut s = Shown {
            name: tx["transaction"].as_str().unwrap_or("?").to_owned(),
            client,
            request,
            link_problem: index.link_problem(tx),
            own_ns: 0,
            other_ns: 0,
            own_samples: 0,
            other_samples: 0,
            total_ns: 0,
            suspended_ns: 0,
            uncaptured_ns: 0,
            instead: Vec::new(),
        };
        if let Ok(window) = TransactionWindow::from_value(tx) {
            let profile = transaction_profile(&parsed, &window);
            s.total_ns = profile.total_ns();
            s.suspended_ns = profile
                .weight_where(|f| f.instruction_addr == Some(sentry_view::SUSPENDED_ADDRESS));
            s.uncaptured_ns = profile
                .weight_where(|f| f.instruction_addr == Some(sentry_view::UNCAPTURED_ADDRESS));
            for sample in &profile.samples {
                let names: Vec<String> = profile
                    .stack(sample)
                    .filter_map(|f| f.function.clone())
                    .collect();
                match cpu_client(&names) {
                    Some(c) if c == client => {
                        s.own_ns += sample.weight_ns;
                        s.own_samples += 1;
                    }
                    Some(_) => {
                        s.other_ns += sample.weight_ns;
                        s.other_samples += 1;
                    }
                    None => {
                        let innermost: Vec<&str> =
                            names.iter().take(4).map(String::as_str).collect();
                        let key = innermost.join(" < ");
                        match s.instead.iter_mut().find(|(k, _)| *k == key) {
                            Some((_, ns)) => *ns += sample.weight_ns,
                            None => s.instead.push((key, sample.weight_ns)),
                        }
                    }
                }
            }
            s.instead.sort_by_key(|b| std::cmp::Reverse(b.1));
            s.instead.truncate(3);
        }
        out.push(s);
    }
    out
}

/// The share of scored transactions that must show their own CPU
/// function (see [`assert_shown`]).
pub const MIN_SHOWING_OWN: f64 = 0.75;

/// The bar every integration-style test sets, on what Sentry shows: every
/// request after the warm-up round (request 0 of each client, see
/// [`drive`]) has a linked transaction; of the CPU time shown under all
/// transactions (warm-ups included) at least 99 % is the transaction's own
/// (precision); and at least [`MIN_SHOWING_OWN`] of the linked
/// transactions show their own CPU function at all.
///
/// Why not every one: on a loaded machine (the tests run beside CPU hogs)
/// a request of 20 to 30 ms of CPU can get no stack capture of its own,
/// and Sentry then shows its time as `(running: no stack captured in
/// time)` or suspended, never as another request's code (a known sampler
/// gap, see the README's limitations; idle, every transaction shows its
/// own function). Every shortfall is printed with what it shows instead;
/// panics, naming `what`, below the bar.
pub fn assert_shown(what: &str, shown: &[Shown]) {
    let scored: Vec<&Shown> = shown.iter().filter(|s| s.request > 0).collect();
    let mut unlinked = 0;
    let mut without_own = 0;
    for s in &scored {
        if let Some(p) = &s.link_problem {
            println!(
                "{what}: not linked: {p} (client {} request {})",
                s.client, s.request
            );
            unlinked += 1;
        } else if s.own_ns == 0 {
            println!(
                "{what}: {} (client {} request {}) shows none of its own CPU time: {:.1} ms shown, {:.1} suspended, {:.1} with no stack captured in time",
                s.name,
                s.client,
                s.request,
                s.total_ns as f64 / 1e6,
                s.suspended_ns as f64 / 1e6,
                s.uncaptured_ns as f64 / 1e6,
            );
            for (stack, ns) in &s.instead {
                println!("    {:.1} ms shown as {stack}", *ns as f64 / 1e6);
            }
            without_own += 1;
        }
    }
    let warmup_unlinked = shown
        .iter()
        .filter(|s| s.request == 0 && s.link_problem.is_some())
        .count();
    let own_ns: u64 = shown.iter().map(|s| s.own_ns).sum();
    let other_ns: u64 = shown.iter().map(|s| s.other_ns).sum();
    let own_samples: usize = shown.iter().map(|s| s.own_samples).sum();
    let other_samples: usize = shown.iter().map(|s| s.other_samples).sum();
    let precision = own_ns as f64 / (own_ns + other_ns).max(1) as f64;
    println!(
        "{what}: {} transactions scored ({warmup_unlinked} warm-ups unlinked), {} linked, {} show their own CPU function; own CPU shown {:.1} ms in {own_samples} samples, other requests' {:.1} ms in {other_samples}; precision {precision:.4}",
        scored.len(),
        scored.len() - unlinked,
        scored.len() - unlinked - without_own,
        own_ns as f64 / 1e6,
        other_ns as f64 / 1e6,
    );
    assert!(!scored.is_empty(), "{what}: no transaction to score");
    assert_eq!(unlinked, 0, "{what}: {unlinked} transactions not linked");
    let showing_own = scored.len() - unlinked - without_own;
    assert!(
        showing_own as f64 >= MIN_SHOWING_OWN * scored.len() as f64,
        "{what}: only {showing_own} of {} transactions show their own CPU function (at least {MIN_SHOWING_OWN} required)",
        scored.len()
    );
    assert!(own_ns > 0, "{what}: no own CPU time shown at all");
    assert!(precision >= 0.99, "{what}: precision {precision:.4} < 0.99");
}
