//! See a run's profiles without Sentry: an offline HTML page, built from a
//! directory of Sentry envelopes, that shows for every transaction the
//! flame graph Sentry would show for it.
//!
//! Sentry shows a transaction's profile as the samples of the chunks with
//! its `profiler_id`, on its `thread.id`, inside its `[start, end]` window,
//! each weighted by the time to the next sample on that thread. The page
//! applies exactly that rule, so what it shows for a request is what the
//! transaction's "Profile" view in Sentry will show once the envelopes are
//! sent, and a request whose profile would be empty in Sentry is empty
//! here too.
//!
//! The page lists the transactions, slowest first, with name, duration,
//! status, samples and time spent waiting (suspended at an `.await` or
//! queued for a worker, drawn grey), each with its flame graph; one flame
//! graph per transaction name (all its transactions merged, as Sentry's
//! aggregate flame graph); one per OS thread; and the profiler's counters.
//! Requests instrumented by `sentry-profiling-tracing`'s `http_layer()`
//! carry their poll totals: the page shows each one's time polled, queued
//! for a Tokio worker and awaiting, the same summed per transaction name
//! (much time queued: the runtime is short of workers; much awaiting: the
//! requests wait on I/O), and the run's longest polls, each with the
//! stacks its request's lane shows during it.
//! It has no external resources: the data is embedded, and a few hundred
//! lines of inline script draw the flame graphs as SVG when they are
//! opened.
//!
//! ```no_run
//! let dir = std::path::Path::new("sentry-envelopes");
//! match sentry_profiling_preview::write_page(dir) {
//!     Ok((path, summary)) => println!("{} ({} transactions)", path.display(), summary.transactions),
//!     Err(e) => eprintln!("no preview: {e}"),
//! }
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(unsafe_op_in_unsafe_fn)]

mod envelope;
mod flame;
mod issues;
mod model;
mod names;
mod polls;
mod totals;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

pub use envelope::{EnvelopeItem, ParsedEnvelope, envelope_bytes, parse_envelope};

use flame::Flame;
use model::Run;
use polls::{MAX_LONGEST_POLLS, NameTotals};
use sentry_view::is_lane_thread_id;
use totals::PollTotals;

/// The page's file name in the envelope directory.
pub const PAGE_FILE: &str = "profile.html";

/// A file of counters (one JSON object of numbers) that a run may leave
/// beside its envelopes; the page shows them as the profiler's counters.
/// Its key [`WARNINGS_KEY`], if any, is not a counter: an array of lines
/// the page shows at its top. The example service writes
/// `sentry_profiling::stats()` there, with a warning when the kernel
/// refused the sampler the system calls it samples with.
pub const STATS_FILE: &str = "profiler-stats.json";

/// The key of [`STATS_FILE`] that holds warnings about the run (an array
/// of strings), shown at the top of the page and in [`Summary::warnings`].
pub const WARNINGS_KEY: &str = "warnings";

/// Whether `name` is a frame of the fill-in samples of a request that
/// waits: `(suspended: awaiting or queued)` for a request whose wakes are
/// not tracked, `(queued for a Tokio worker)` and `(awaiting)` for one
/// whose are (the names `sentry_profiling`'s lanes give them).
fn is_waiting(name: &str) -> bool {
    name.starts_with("(suspended") || name == "(queued for a Tokio worker)" || name == "(awaiting)"
}

/// Transactions that get a flame graph of their own, at most (the slowest
/// ones); the rest are listed, and counted in their name's flame graph.
const MAX_TRANSACTION_FLAMES: usize = 2_000;

/// Bytes of flame graph data the page may embed, at most: it keeps the page
/// under 20 MB and quick to open however long the run.
const MAX_FLAME_BYTES: usize = 12 * 1024 * 1024;

/// Nodes narrower than this share of their graph are left out (their
/// weight stays in the parent): they would be under a pixel wide.
const MIN_NODE_SHARE: f64 = 0.0005;

/// Why no page was made.
#[derive(Debug)]
#[non_exhaustive]
pub enum PreviewError {
    /// The directory could not be read.
    Read {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The directory holds no `*.envelope` file.
    NoEnvelopes {
        /// The directory.
        dir: PathBuf,
    },
    /// The envelopes hold no profile chunk (profiling was off, not
    /// sampled, or the run sent no chunk yet).
    NoChunks {
        /// The directory.
        dir: PathBuf,
        /// Transactions found.
        transactions: usize,
        /// Files or items that could not be read.
        problems: Vec<String>,
    },
    /// The page could not be written.
    Write {
        /// The page's path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl std::fmt::Display for PreviewError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Read { dir, source } => write!(f, "cannot read {}: {source}", dir.display()),
            Self::NoEnvelopes { dir } => write!(
                f,
                "{} holds no *.envelope file: point it at the directory a run wrote its envelopes to",
                dir.display()
            ),
            Self::NoChunks {
                dir,
                transactions,
                problems,
            } => {
                write!(
                    f,
                    "{} holds no profile chunk ({transactions} transactions): was the profiling session sampled, and did the run shut down cleanly?",
                    dir.display()
                )?;
                for p in problems.iter().take(5) {
                    write!(f, "\n  unreadable: {p}")?;
                }
                Ok(())
            }
            Self::Write { path, source } => {
                write!(f, "cannot write {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for PreviewError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Read { source, .. } | Self::Write { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// What a page shows, in numbers.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Summary {
    /// Transactions found.
    pub transactions: usize,
    /// Transactions whose window shows at least one sample of their
    /// profiler and thread, as Sentry selects them.
    pub linked: usize,
    /// Transactions with a flame graph of their own on the page.
    pub flame_graphs: usize,
    /// Profile chunks read.
    pub chunks: usize,
    /// Samples in them.
    pub samples: usize,
    /// Files or items that could not be read, each with why.
    pub problems: Vec<String>,
    /// The run's warnings, from [`STATS_FILE`] (see [`WARNINGS_KEY`]).
    pub warnings: Vec<String>,
    /// Blocking-poll issues (one per fingerprint, as Sentry groups their
    /// events).
    pub blocking_issues: usize,
}

/// A built page.
#[derive(Debug, Clone)]
pub struct Preview {
    html: String,
    summary: Summary,
}

impl Preview {
    /// The page, one self-contained HTML document.
    pub fn html(&self) -> &str {
        &self.html
    }

    /// What it shows, in numbers.
    pub fn summary(&self) -> &Summary {
        &self.summary
    }
}

/// Builds the page for the envelopes in `dir`.
pub fn build(dir: &Path) -> Result<Preview, PreviewError> {
    let run = Run::read(dir).map_err(|source| PreviewError::Read {
        dir: dir.to_owned(),
        source,
    })?;
    if run.envelope_files == 0 {
        return Err(PreviewError::NoEnvelopes {
            dir: dir.to_owned(),
        });
    }
    if run.chunks.is_empty() {
        return Err(PreviewError::NoChunks {
            dir: dir.to_owned(),
            transactions: run.transactions.len(),
            problems: run.problems,
        });
    }
    let stats = read_stats(&dir.join(STATS_FILE));
    let (data, summary) = page_data(&run, stats, dir);
    Ok(Preview {
        html: render(&data),
        summary,
    })
}

/// Builds the page for `dir` and writes it there as [`PAGE_FILE`].
pub fn write_page(dir: &Path) -> Result<(PathBuf, Summary), PreviewError> {
    let preview = build(dir)?;
    let path = dir.join(PAGE_FILE);
    std::fs::write(&path, preview.html()).map_err(|source| PreviewError::Write {
        path: path.clone(),
        source,
    })?;
    Ok((path, preview.summary))
}

/// The counters file, if there is a readable one.
fn read_stats(path: &Path) -> Option<Map<String, Value>> {
    let bytes = std::fs::read(path).ok()?;
    match serde_json::from_slice::<Value>(&bytes).ok()? {
        Value::Object(m) => Some(m),
        _ => None,
    }
}

fn page_data(run: &Run, mut stats: Option<Map<String, Value>>, dir: &Path) -> (String, Summary) {
    let waiting: Vec<u32> = run
        .names
        .list
        .iter()
        .enumerate()
        .filter(|(_, n)| is_waiting(n))
        .map(|(i, _)| i as u32)
        .collect();
    let mut summary = Summary {
        transactions: run.transactions.len(),
        chunks: run.chunks.len(),
        samples: run.samples,
        problems: run.problems.clone(),
        warnings: stats
            .as_mut()
            .and_then(|m| m.remove(WARNINGS_KEY))
            .and_then(|w| match w {
                Value::Array(lines) => Some(
                    lines
                        .into_iter()
                        .filter_map(|l| l.as_str().map(str::to_owned))
                        .collect(),
                ),
                _ => None,
            })
            .unwrap_or_default(),
        ..Summary::default()
    };
    let mut stack = Vec::new();

    // Each transaction's flame graph, by Sentry's rule, and per name all of
    // its transactions merged (as Sentry's aggregate flame graph) and their
    // poll totals summed.
    let mut routes: BTreeMap<&str, (usize, Flame, NameTotals)> = BTreeMap::new();
    let mut rows: Vec<(&model::Transaction, Flame)> = Vec::with_capacity(run.transactions.len());
    for tx in &run.transactions {
        let route = routes.entry(tx.name.as_str()).or_default();
        route.0 += 1;
        if let Some(totals) = &tx.polls {
            route.2.add(totals, tx.duration_ns());
        }
        let mut flame = Flame::default();
        if let Some(w) = &tx.window {
            for s in run.shown(&w.profiler_id, &w.thread_id, w.start_ns, w.end_ns) {
                run.stack_names(&s, &mut stack);
                flame.add(&stack, s.weight_ns);
                route.1.add(&stack, s.weight_ns);
            }
        }
        rows.push((tx, flame));
    }
    summary.linked = rows.iter().filter(|(_, f)| f.samples() > 0).count();
    rows.sort_by_key(|(tx, _)| std::cmp::Reverse(tx.duration_ns()));

    let mut tx_out: Vec<String> = Vec::with_capacity(rows.len());
    let mut budget = MAX_FLAME_BYTES;
    for (tx, flame) in &rows {
        let mut tree = String::from("null");
        if flame.samples() > 0 && summary.flame_graphs < MAX_TRANSACTION_FLAMES {
            let t = flame.to_json(MIN_NODE_SHARE);
            if t.len() <= budget {
                budget -= t.len();
                summary.flame_graphs += 1;
                tree = t;
            }
        }
        let waited: u64 = waiting.iter().map(|&n| flame.weight_of(n)).sum();
        let row = json!({
            "n": tx.name,
            "op": tx.op,
            "d": ms(tx.duration_ns()),
            "s": tx.status,
            "c": flame.samples(),
            "w": ms(waited),
            "t": tx.window.as_ref().map(|w| w.thread_id.as_str()),
            "p": tx.polls.map(PollTotals::to_json),
        });
        tx_out.push(with_tree(&row, &tree));
    }
    let mut routes: Vec<(&str, (usize, Flame, NameTotals))> = routes.into_iter().collect();
    routes.sort_by_key(|(_, (_, f, _))| std::cmp::Reverse(f.total()));
    let routes_out: Vec<String> = routes
        .into_iter()
        .map(|(name, (count, flame, totals))| {
            let row = json!({
                "n": name,
                "k": count,
                "c": flame.samples(),
                "d": ms(flame.total()),
                "p": totals.to_json(),
            });
            with_tree(&row, &flame.to_json(MIN_NODE_SHARE))
        })
        .collect();

    // The run's longest polls. Their trees cover one poll each (a handful
    // of samples), so they stay out of the flame graph budget.
    let polls_out: Vec<String> = polls::longest_polls(run, MAX_LONGEST_POLLS)
        .into_iter()
        .map(|p| {
            let (stack, weight) = p.heaviest.unwrap_or_default();
            let row = json!({
                "n": p.tx.name,
                "id": p.tx.trace_id,
                "t": p.tx.window.as_ref().map(|w| w.thread_id.as_str()),
                "d": ms(p.end_ns - p.start_ns),
                "x": p.totals.long_polls,
                "at": ms(p.start_ns.saturating_sub(p.tx.start_ns)),
                "td": ms(p.tx.duration_ns()),
                "c": p.flame.samples(),
                "s": stack,
                "w": ms(weight),
            });
            with_tree(&row, &p.flame.to_json(MIN_NODE_SHARE))
        })
        .collect();

    // OS threads over the whole run (lanes are shown by their transactions).
    let mut threads: Vec<(&str, &str, Flame)> = Vec::new();
    for (profiler, tid, name) in run.threads() {
        if is_lane_thread_id(tid) {
            continue;
        }
        let mut flame = Flame::default();
        for s in run.shown(profiler, tid, 0, u64::MAX) {
            run.stack_names(&s, &mut stack);
            flame.add(&stack, s.weight_ns);
        }
        threads.push((tid, name, flame));
    }
    threads.sort_by(|a, b| b.2.total().cmp(&a.2.total()).then(a.0.cmp(b.0)));
    let threads_out: Vec<String> = threads
        .into_iter()
        .map(|(tid, name, flame)| {
            let row = json!({
                "id": tid,
                "n": name,
                "c": flame.samples(),
                "d": ms(flame.total()),
            });
            with_tree(&row, &flame.to_json(MIN_NODE_SHARE))
        })
        .collect();

    let short: Vec<String> = run
        .names
        .list
        .iter()
        .map(|n| names::short_name(n))
        .collect();
    let full: Map<String, Value> = run
        .names
        .list
        .iter()
        .zip(&short)
        .enumerate()
        .filter(|(_, (f, s))| f != s)
        .map(|(i, (f, _))| (i.to_string(), Value::from(f.as_str())))
        .collect();
    // The blocking-poll issues, as Sentry's issue stream lists them.
    let issues_out: Vec<String> = issues::issue_rows(&run.blocking)
        .iter()
        .map(Value::to_string)
        .collect();
    summary.blocking_issues = issues_out.len();
    let counters = stats.unwrap_or_else(|| {
        let mut m = Map::new();
        m.insert("chunks".into(), run.chunks.len().into());
        m.insert("samples".into(), run.samples.into());
        m
    });
    let data = json!({
        "dir": dir.display().to_string(),
        "names": short,
        "full": full,
        "counters": counters,
        "summary": {
            "transactions": summary.transactions,
            "linked": summary.linked,
            "flame_graphs": summary.flame_graphs,
            "chunks": summary.chunks,
            "samples": summary.samples,
            "envelope_files": run.envelope_files,
        },
        "problems": summary.problems,
        "warnings": summary.warnings,
    });
    // The rows, each with its tree, go in as written (a page can hold
    // millions of tree nodes: no `Value` for each).
    let mut data = data.to_string();
    data.pop();
    for (key, rows) in [
        ("tx", tx_out),
        ("routes", routes_out),
        ("polls", polls_out),
        ("issues", issues_out),
        ("threads", threads_out),
    ] {
        let _ = write!(data, ",\"{key}\":[{}]", rows.join(","));
    }
    data.push('}');
    (data, summary)
}

/// Milliseconds, to the microsecond.
fn ms(ns: u64) -> f64 {
    (ns / 1_000) as f64 / 1e3
}

/// A row object (`{...}`, serialised) with its flame graph tree added as
/// `f` (`null` or a tree written by [`Flame::write_json`]).
fn with_tree(row: &Value, tree: &str) -> String {
    let mut out = row.to_string();
    out.pop();
    out.push_str(",\"f\":");
    out.push_str(tree);
    out.push('}');
    out
}

/// The page: the template with the data embedded as JSON (every `<`
/// escaped, so no string in it can close the script element).
fn render(data: &str) -> String {
    let json = data.replace('<', "\\u003c");
    PAGE.replace("/*DATA*/", &json)
}

const PAGE: &str = include_str!("page.html");

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("preview-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn envelope(items: &[(&str, String)]) -> Vec<u8> {
        let items: Vec<(&str, &[u8])> = items.iter().map(|(k, p)| (*k, p.as_bytes())).collect();
        envelope_bytes(&items)
    }

    fn chunk(profiler: &str, samples: &[(f64, &str, u32)]) -> String {
        let samples: Vec<Value> = samples
            .iter()
            .map(|(ts, tid, stack)| json!({"timestamp": ts, "thread_id": tid, "stack_id": stack}))
            .collect();
        json!({
            "version": "2", "profiler_id": profiler, "chunk_id": "c", "platform": "rust",
            "profile": {
                "frames": [{"function": "main", "instruction_addr": "0x10"},
                           {"function": "app::burn_cpu", "instruction_addr": "0x20"},
                           {"function": "(suspended: awaiting or queued)", "instruction_addr": "0x1"}],
                "stacks": [[1, 0], [2]],
                "samples": samples,
                "thread_metadata": {"1000000000": {"name": "GET /work"}, "77": {"name": "tokio-rt-worker"}},
            }
        })
        .to_string()
    }

    fn transaction(profiler: &str, tid: &str, start: f64, end: f64) -> String {
        json!({
            "transaction": "GET /work", "start_timestamp": start, "timestamp": end,
            "contexts": {"profile": {"type": "profile", "profiler_id": profiler},
                         "trace": {"op": "http.server", "status": "ok", "data": {"thread.id": tid}}},
        })
        .to_string()
    }

    #[test]
    fn a_transaction_shows_its_threads_samples_in_its_window_weighted_as_sentry_does() {
        let dir = temp_dir("weights");
        let p = "a".repeat(32);
        let samples = [
            (10.00, "1000000000", 0),
            (10.01, "1000000000", 0),
            (10.02, "1000000000", 1),
            (10.03, "1000000000", 0),
            (10.50, "1000000000", 0),
            (10.00, "77", 0),
            (10.05, "77", 0),
        ];
        std::fs::write(
            dir.join("1.envelope"),
            envelope(&[
                ("profile_chunk", chunk(&p, &samples)),
                ("transaction", transaction(&p, "1000000000", 10.0, 10.03)),
            ]),
        )
        .unwrap();
        let warning = "cannot sample: <the kernel refused it>";
        std::fs::write(
            dir.join(STATS_FILE),
            json!({"samples_captured": 0, WARNINGS_KEY: [warning]}).to_string(),
        )
        .unwrap();
        let preview = build(&dir).unwrap();
        let s = preview.summary();
        assert_eq!(
            (s.transactions, s.linked, s.chunks, s.samples),
            (1, 1, 1, 7)
        );
        assert_eq!(s.warnings, [warning]);
        let html = preview.html();
        // 4 samples in the window; 30 ms of weight, 10 of them waiting.
        assert!(html.contains("\"c\":4"), "{html}");
        assert!(
            html.contains("\"d\":30.0") && html.contains("\"w\":10.0"),
            "{html}"
        );
        assert!(
            !html.contains("</script><"),
            "data cannot close its script element"
        );
        assert!(
            html.contains("\"warnings\":[\"cannot sample: \\u003cthe kernel refused it>\"]"),
            "the warning is shown, not as a counter: {html}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `tx` (from [`transaction`]) named `name`, with `totals` in its trace
    /// data and `measured` as its `measurements`.
    fn with_totals(tx: &str, name: &str, totals: Value, measured: Value) -> String {
        let mut tx: Value = serde_json::from_str(tx).unwrap();
        tx["transaction"] = name.into();
        for (k, v) in totals.as_object().unwrap() {
            tx["contexts"]["trace"]["data"][k] = v.clone();
        }
        tx["measurements"] = measured;
        tx.to_string()
    }

    /// The data the page embeds.
    fn page_json(html: &str) -> Value {
        let start = html.find("id=\"data\">").unwrap() + "id=\"data\">".len();
        let end = start + html[start..].find("</script>").unwrap();
        serde_json::from_str(&html[start..end]).unwrap()
    }

    #[test]
    fn poll_totals_are_shown_per_transaction_and_summed_per_name() {
        let dir = temp_dir("totals");
        let p = "d".repeat(32);
        let lane = "1000000000";
        let tx = |start: f64, end: f64| transaction(&p, lane, start, end);
        let measured =
            |value: f64| json!({"tokio.queued": {"value": value, "unit": "millisecond"}});
        let items = [
            (
                "profile_chunk",
                chunk(&p, &[(10.0, lane, 0), (10.1, lane, 1)]),
            ),
            // Two requests of `GET /db` that await, one carrying its
            // queued time as a measurement only, and one of it without
            // totals (not counted in the means).
            (
                "transaction",
                with_totals(
                    &tx(10.0, 10.1),
                    "GET /db",
                    json!({"tokio.polls": 3, "tokio.polled": 10.0, "tokio.queued": 2.0,
                           "tokio.awaiting": 88.0, "tokio.longest_poll": 6.0,
                           "tokio.cpu_wait": 1.5, "tokio.offloaded": 60.0,
                           "tokio.offloaded_cpu_wait": 5.0, "tokio.offloaded_queued": 20.0}),
                    Value::Null,
                ),
            ),
            (
                "transaction",
                with_totals(
                    &tx(10.0, 10.3),
                    "GET /db",
                    json!({"tokio.polls": 5, "tokio.polled": 20.0, "tokio.awaiting": 272.0,
                           "tokio.longest_poll": 14.0, "tokio.long_polls": 1,
                           "tokio.longest_poll.start": 10.1}),
                    measured(8.0),
                ),
            ),
            (
                "transaction",
                with_totals(&tx(10.0, 10.05), "GET /db", json!({}), Value::Null),
            ),
            // A request of `GET /cpu` that mostly waited for a worker.
            (
                "transaction",
                with_totals(
                    &tx(10.0, 10.1),
                    "GET /cpu",
                    json!({"tokio.polls": 2, "tokio.polled": 30.0, "tokio.queued": 60.0,
                           "tokio.awaiting": 10.0, "tokio.longest_poll": 25.0,
                           "tokio.long_polls": 1, "tokio.longest_poll.start": 10.0}),
                    measured(1.0),
                ),
            ),
        ];
        std::fs::write(dir.join("1.envelope"), envelope(&items)).unwrap();
        let data = page_json(build(&dir).unwrap().html());
        let _ = std::fs::remove_dir_all(&dir);

        let route = |name: &str| {
            data["routes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["n"] == name)
                .unwrap()["p"]
                .clone()
        };
        // Trace data wins over a measurement of the same key.
        assert_eq!(
            route("GET /db"),
            json!({"k": 2, "d": 400.0, "n": 8, "p": 30.0, "q": 10.0, "a": 360.0,
                   "w": 1.5, "l": 14.0, "x": 1, "qs": 0.025,
                   "o": 60.0, "ow": 5.0, "oq": 20.0})
        );
        assert_eq!(route("GET /cpu")["qs"], 0.6);
        let untracked = data["tx"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["p"].is_null())
            .count();
        assert_eq!(untracked, 1, "a transaction without totals shows none");

        // The longest polls, slowest first, each with its transaction.
        let polls = data["polls"].as_array().unwrap();
        let listed: Vec<(&str, f64)> = polls
            .iter()
            .map(|p| (p["n"].as_str().unwrap(), p["d"].as_f64().unwrap()))
            .collect();
        assert_eq!(listed, [("GET /cpu", 25.0), ("GET /db", 14.0)]);
        assert_eq!(polls[1]["at"], 100.0, "it began 100 ms into its request");
    }

    #[test]
    fn a_requests_waits_count_as_waiting_whether_or_not_its_wakes_are_tracked() {
        for name in [
            "(suspended: awaiting or queued)",
            "(queued for a Tokio worker)",
            "(awaiting)",
        ] {
            assert!(is_waiting(name), "{name}");
        }
        assert!(!is_waiting("(running: no stack captured in time)"));
    }

    #[test]
    fn bad_directories_get_a_clear_error_and_bad_files_are_listed() {
        let dir = temp_dir("bad");
        let missing = dir.join("missing");
        assert!(matches!(build(&missing), Err(PreviewError::Read { .. })));
        std::fs::write(dir.join("notes.txt"), "not an envelope").unwrap();
        let e = build(&dir).unwrap_err();
        assert!(matches!(e, PreviewError::NoEnvelopes { .. }), "{e}");
        assert!(e.to_string().contains("no *.envelope"), "{e}");

        let p = "b".repeat(32);
        std::fs::write(
            dir.join("1.envelope"),
            envelope(&[("transaction", transaction(&p, "1", 1.0, 2.0))]),
        )
        .unwrap();
        let e = build(&dir).unwrap_err();
        assert!(
            matches!(
                e,
                PreviewError::NoChunks {
                    transactions: 1,
                    ..
                }
            ),
            "{e}"
        );

        let mut truncated =
            envelope(&[("profile_chunk", chunk(&p, &[(1.0, "1", 0), (1.5, "1", 0)]))]);
        truncated.truncate(truncated.len() / 2);
        std::fs::write(dir.join("2.envelope"), truncated).unwrap();
        std::fs::write(dir.join("3.envelope"), b"\x00\xffgarbage").unwrap();
        std::fs::write(
            dir.join("4.envelope"),
            envelope(&[("profile_chunk", "{\"profile\":{}}".into())]),
        )
        .unwrap();
        std::fs::write(
            dir.join("5.envelope"),
            envelope(&[("profile_chunk", chunk(&p, &[(1.0, "1", 0), (1.5, "1", 9)]))]),
        )
        .unwrap();
        let e = build(&dir).unwrap_err();
        let PreviewError::NoChunks { problems, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(
            problems[0].starts_with("2.envelope") && problems[0].contains("cut short"),
            "{problems:?}"
        );
        assert!(
            problems[3].contains("stack that does not exist"),
            "{problems:?}"
        );

        std::fs::write(
            dir.join("6.envelope"),
            envelope(&[("profile_chunk", chunk(&p, &[(1.0, "1", 0), (1.5, "1", 0)]))]),
        )
        .unwrap();
        let (page, summary) = write_page(&dir).unwrap();
        assert_eq!(
            (summary.chunks, summary.transactions, summary.linked),
            (1, 1, 1)
        );
        assert_eq!(summary.problems.len(), 4);
        assert!(std::fs::read_to_string(page).unwrap().contains("cut short"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
