//! A run read back from its envelopes: transactions with their linking
//! data, and every profile chunk's samples merged into one timeline per
//! (profiler id, thread id), with stacks resolved to interned function
//! names (root first).

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use crate::envelope::{envelope_files, parse_envelope};

/// What a transaction carries that Sentry links a profile by.
#[derive(Debug, Clone)]
pub(crate) struct Transaction {
    pub(crate) name: String,
    pub(crate) op: String,
    pub(crate) status: String,
    pub(crate) start: f64,
    pub(crate) end: f64,
    /// `contexts.profile.profiler_id`.
    pub(crate) profiler_id: Option<String>,
    /// `contexts.trace.data["thread.id"]`.
    pub(crate) thread_id: Option<String>,
}

/// Function names, interned.
#[derive(Debug, Default)]
pub(crate) struct Names {
    pub(crate) list: Vec<String>,
    index: HashMap<String, u32>,
}

impl Names {
    pub(crate) fn intern(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        let i = self.list.len() as u32;
        self.list.push(name.to_owned());
        self.index.insert(name.to_owned(), i);
        i
    }
}

/// Everything read from an envelope directory.
#[derive(Debug, Default)]
pub(crate) struct Run {
    pub(crate) transactions: Vec<Transaction>,
    pub(crate) names: Names,
    /// Stacks as name ids, root first, over all chunks.
    pub(crate) stacks: Vec<Vec<u32>>,
    /// Samples `(timestamp, stack)` in time order, per (profiler id,
    /// thread id).
    pub(crate) timelines: HashMap<(String, String), Vec<(f64, u32)>>,
    /// Thread names from the chunks' `thread_metadata`.
    pub(crate) thread_names: HashMap<String, String>,
    pub(crate) envelope_files: usize,
    pub(crate) chunks: usize,
    pub(crate) samples: usize,
    /// Files or items that could not be read, each with why.
    pub(crate) problems: Vec<String>,
}

impl Run {
    /// Reads every envelope of `dir`.
    pub(crate) fn read(dir: &Path) -> std::io::Result<Self> {
        let (files, _other) = envelope_files(dir)?;
        let mut run = Run::default();
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
                    Some("profile_chunk") => serde_json::from_slice(&item.payload)
                        .map_err(|e| e.to_string())
                        .and_then(|v| run.add_chunk(&v)),
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
        for timeline in run.timelines.values_mut() {
            timeline.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        Ok(run)
    }

    fn add_transaction(&mut self, v: &Value) -> Result<(), String> {
        let (start, end) = transaction_window(v).ok_or("no start_timestamp or timestamp")?;
        let contexts = v.get("contexts");
        let trace = contexts.and_then(|c| c.get("trace"));
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
        self.transactions.push(Transaction {
            name: text(v.get("transaction")).unwrap_or_else(|| "(unnamed)".to_owned()),
            op: text(trace.and_then(|t| t.get("op"))).unwrap_or_default(),
            status: text(trace.and_then(|t| t.get("status"))).unwrap_or_else(|| "unknown".into()),
            start,
            end,
            profiler_id: text(
                contexts
                    .and_then(|c| c.get("profile"))
                    .and_then(|p| p.get("profiler_id")),
            ),
            thread_id: text(
                trace
                    .and_then(|t| t.get("data"))
                    .and_then(|d| d.get("thread.id")),
            ),
        });
        Ok(())
    }

    fn add_chunk(&mut self, v: &Value) -> Result<(), String> {
        let profiler_id = v
            .get("profiler_id")
            .and_then(Value::as_str)
            .ok_or("no profiler_id")?
            .to_owned();
        let profile = v.get("profile").ok_or("no profile")?;
        let list = |key: &str| -> Result<&Vec<Value>, String> {
            profile
                .get(key)
                .and_then(Value::as_array)
                .ok_or_else(|| format!("no profile.{key}"))
        };
        let frames: Vec<u32> = list("frames")?
            .iter()
            .map(|f| {
                let name = f.get("function").and_then(Value::as_str).map_or_else(
                    || {
                        f.get("instruction_addr")
                            .and_then(Value::as_str)
                            .unwrap_or("(unknown)")
                            .to_owned()
                    },
                    str::to_owned,
                );
                self.names.intern(&name)
            })
            .collect();
        let base = self.stacks.len() as u32;
        for stack in list("stacks")? {
            // Sentry's stacks list the leaf first.
            let ids = stack.as_array().ok_or("a stack is not a list")?;
            let mut out = Vec::with_capacity(ids.len());
            for id in ids.iter().rev() {
                let i = id.as_u64().ok_or("a frame index is not a number")? as usize;
                out.push(*frames.get(i).ok_or("a stack names a missing frame")?);
            }
            self.stacks.push(out);
        }
        let stacks_here = self.stacks.len() as u32 - base;
        for s in list("samples")? {
            let ts = s
                .get("timestamp")
                .and_then(Value::as_f64)
                .ok_or("a sample has no timestamp")?;
            let stack = s
                .get("stack_id")
                .and_then(Value::as_u64)
                .filter(|&i| i < u64::from(stacks_here))
                .ok_or("a sample names a missing stack")? as u32;
            let thread = s
                .get("thread_id")
                .and_then(Value::as_str)
                .ok_or("a sample has no string thread_id")?;
            self.timelines
                .entry((profiler_id.clone(), thread.to_owned()))
                .or_default()
                .push((ts, base + stack));
            self.samples += 1;
        }
        if let Some(meta) = profile.get("thread_metadata").and_then(Value::as_object) {
            for (tid, m) in meta {
                if let Some(name) = m.get("name").and_then(Value::as_str) {
                    self.thread_names.insert(tid.clone(), name.to_owned());
                }
            }
        }
        self.chunks += 1;
        Ok(())
    }
}

/// A Sentry timestamp as Unix seconds: a number, or an RFC 3339 UTC string
/// (`2026-01-02T03:04:05.678Z`); the SDK writes both.
pub fn timestamp_secs(v: &Value) -> Option<f64> {
    if let Some(f) = v.as_f64() {
        return Some(f);
    }
    let s = v.as_str()?.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut t = time.splitn(3, ':');
    let (h, min) = (
        t.next()?.parse::<i64>().ok()?,
        t.next()?.parse::<i64>().ok()?,
    );
    let sec: f64 = t.next()?.parse().ok()?;
    // Days since the epoch of a proleptic Gregorian date.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + h * 3_600 + min * 60) as f64 + sec)
}

/// A transaction's `[start, end]` in Unix seconds.
pub fn transaction_window(tx: &Value) -> Option<(f64, f64)> {
    Some((
        timestamp_secs(tx.get("start_timestamp")?)?,
        timestamp_secs(tx.get("timestamp")?)?,
    ))
}

/// The samples Sentry shows for a thread between `start` and `end`: those
/// of `timeline` inside the window (inclusive, as vroom's merge keeps
/// them), each weighted by the time to the next one on the same thread;
/// the last one in the window gets no weight, as in Sentry's flame graphs.
pub(crate) fn weighted(timeline: &[(f64, u32)], start: f64, end: f64) -> Vec<(u32, f64)> {
    let from = timeline.partition_point(|s| s.0 < start);
    let to = timeline.partition_point(|s| s.0 <= end);
    let window = &timeline[from..to.max(from)];
    window
        .iter()
        .enumerate()
        .map(|(i, &(ts, stack))| {
            let next = window.get(i + 1).map_or(ts, |n| n.0);
            (stack, (next - ts).max(0.0))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_timestamp_forms() {
        assert_eq!(timestamp_secs(&Value::from(12.5)), Some(12.5));
        let t = timestamp_secs(&Value::from("2026-11-22T11:56:33.797392362Z")).unwrap();
        assert!((t - 1_795_348_593.797_392).abs() < 1e-3, "{t}");
    }

    #[test]
    fn weights_are_the_time_to_the_next_sample_in_the_window() {
        let tl = [(0.5, 0), (1.0, 1), (1.25, 2), (2.0, 3), (3.0, 4)];
        let w = weighted(&tl, 1.0, 2.0);
        assert_eq!(w, vec![(1, 0.25), (2, 0.75), (3, 0.0)]);
        assert!(weighted(&tl, 5.0, 6.0).is_empty());
    }
}
