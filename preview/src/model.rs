//! A run read back from its envelopes: its transactions, and its profile
//! chunks parsed by `sentry_view`, whose
//! [`what_sentry_shows`] says what Sentry shows for a thread in a window.
//! Function names are interned, so flame graphs merge frames by name.

use std::collections::HashMap;
use std::path::Path;

use sentry_view::{
    ProfileChunk, TransactionWindow, WeightedSample, timestamp_ns, what_sentry_shows,
};
use serde_json::Value;

use crate::envelope::{envelope_files, parse_envelope};
use crate::totals::PollTotals;

/// A transaction as the page lists it.
#[derive(Debug, Clone)]
pub(crate) struct Transaction {
    pub(crate) name: String,
    pub(crate) op: String,
    pub(crate) status: String,
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
    /// What links it to a profile; `None` when it carries no
    /// `profiler_id` or `thread.id` (Sentry shows it no profile).
    pub(crate) window: Option<TransactionWindow>,
    /// `contexts.trace.trace_id`, to find the transaction in Sentry.
    pub(crate) trace_id: Option<String>,
    /// Its poll totals, when `http_layer()` recorded them.
    pub(crate) polls: Option<PollTotals>,
}

impl Transaction {
    pub(crate) fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// Function names, interned.
#[derive(Debug, Default)]
pub(crate) struct Names {
    pub(crate) list: Vec<String>,
    index: HashMap<String, u32>,
}

impl Names {
    fn intern(&mut self, name: String) -> u32 {
        if let Some(&i) = self.index.get(&name) {
            return i;
        }
        let i = self.list.len() as u32;
        self.list.push(name.clone());
        self.index.insert(name, i);
        i
    }
}

/// Everything read from an envelope directory.
/// Most envelope files the page reads (the newest).
pub(crate) const MAX_ENVELOPE_FILES: usize = 20_000;

#[derive(Debug, Default)]
pub(crate) struct Run {
    pub(crate) transactions: Vec<Transaction>,
    pub(crate) chunks: Vec<ProfileChunk>,
    pub(crate) names: Names,
    /// Each chunk's frames as name ids.
    frame_names: Vec<Vec<u32>>,
    pub(crate) envelope_files: usize,
    pub(crate) samples: usize,
    /// Files or items that could not be read, each with why.
    pub(crate) problems: Vec<String>,
    /// The blocking-poll issue events (see `crate::issues`).
    pub(crate) blocking: Vec<crate::issues::BlockingEvent>,
}

impl Run {
    /// Reads the envelopes of `dir`: the newest [`MAX_ENVELOPE_FILES`] (a
    /// directory a service wrote for days holds millions; the page is for
    /// the recent ones, and reading all would take as long).
    pub(crate) fn read(dir: &Path) -> std::io::Result<Self> {
        let (mut files, _other) = envelope_files(dir)?;
        let mut run = Run::default();
        if files.len() > MAX_ENVELOPE_FILES {
            run.problems.push(format!(
                "only the newest {MAX_ENVELOPE_FILES} of {} envelope files are read",
                files.len()
            ));
            files.drain(..files.len() - MAX_ENVELOPE_FILES);
        }
        for path in files {
            run.envelope_files += 1;
            let shown = path.file_name().map_or_else(
                || path.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            );
            let bytes = match std::fs::read(&path) {
                Ok(b) => b,
                Err(e) => {
                    run.problems.push(format!("{shown}: {e}"));
                    continue;
                }
            };
            let envelope = parse_envelope(&bytes);
            if let Some(p) = envelope.problem {
                run.problems.push(format!("{shown}: {p}"));
            }
            for item in envelope.items {
                let kind = item.kind().map(str::to_owned);
                let parsed = match kind.as_deref() {
                    Some("transaction") => serde_json::from_slice(&item.payload)
                        .map_err(|e| e.to_string())
                        .and_then(|v| run.add_transaction(&v)),
                    Some("profile_chunk") => ProfileChunk::from_json(&item.payload)
                        .map(|c| run.add_chunk(c))
                        .map_err(|e| e.to_string()),
                    Some("event") => serde_json::from_slice::<Value>(&item.payload)
                        .map(|v| {
                            run.blocking
                                .extend(crate::issues::BlockingEvent::from_event(&v))
                        })
                        .map_err(|e| e.to_string()),
                    _ => Ok(()),
                };
                if let Err(e) = parsed {
                    run.problems.push(format!(
                        "{shown}: a {} item could not be read: {e}",
                        kind.as_deref().unwrap_or("untyped")
                    ));
                }
            }
        }
        Ok(run)
    }

    fn add_transaction(&mut self, v: &Value) -> Result<(), String> {
        let time = |key: &str| {
            v.get(key)
                .and_then(timestamp_ns)
                .ok_or_else(|| format!("no valid `{key}`"))
        };
        let (start_ns, end_ns) = (time("start_timestamp")?, time("timestamp")?);
        let trace = v.pointer("/contexts/trace");
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
        self.transactions.push(Transaction {
            name: text(v.get("transaction")).unwrap_or_else(|| "(unnamed)".to_owned()),
            op: text(trace.and_then(|t| t.get("op"))).unwrap_or_default(),
            status: text(trace.and_then(|t| t.get("status"))).unwrap_or_else(|| "unknown".into()),
            start_ns,
            end_ns,
            window: TransactionWindow::from_value(v).ok(),
            trace_id: text(trace.and_then(|t| t.get("trace_id"))),
            polls: PollTotals::from_transaction(v),
        });
        Ok(())
    }

    fn add_chunk(&mut self, chunk: ProfileChunk) {
        let names: Vec<u32> = chunk
            .frames
            .iter()
            .map(|f| self.names.intern(f.name()))
            .collect();
        self.samples += chunk.samples.len();
        self.frame_names.push(names);
        self.chunks.push(chunk);
    }

    /// What Sentry shows for `thread_id` of `profiler_id` in `[start_ns,
    /// end_ns]`: its samples, weighted as Sentry weights them.
    pub(crate) fn shown(
        &self,
        profiler_id: &str,
        thread_id: &str,
        start_ns: u64,
        end_ns: u64,
    ) -> Vec<WeightedSample> {
        what_sentry_shows(&self.chunks, profiler_id, thread_id, start_ns, end_ns).samples
    }

    /// A sample's stack as name ids, root first, written into `out`.
    pub(crate) fn stack_names(&self, sample: &WeightedSample, out: &mut Vec<u32>) {
        out.clear();
        let names = &self.frame_names[sample.chunk];
        out.extend(
            self.chunks[sample.chunk].stacks[sample.stack_id]
                .iter()
                .rev()
                .map(|&f| names[f]),
        );
    }

    /// Every (profiler id, thread id) with samples, and the thread's name.
    pub(crate) fn threads(&self) -> Vec<(&str, &str, &str)> {
        let mut seen: HashMap<(&str, &str), &str> = HashMap::new();
        for c in &self.chunks {
            for tid in c.thread_ids() {
                let name = c.thread_names.get(tid).map_or("", String::as_str);
                let entry = seen.entry((c.profiler_id.as_str(), tid)).or_default();
                if entry.is_empty() {
                    *entry = name;
                }
            }
        }
        let mut out: Vec<_> = seen.into_iter().map(|((p, t), n)| (p, t, n)).collect();
        out.sort_unstable();
        out
    }
}
