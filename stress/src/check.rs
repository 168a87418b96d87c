//! Checking what the profiler sent: a transport that hands every envelope
//! to a checker thread, which holds each `profile_chunk` to Relay's rules
//! and keeps a compact record of its samples; and the final check of every
//! sample's thread against the lives the threads recorded themselves.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, Sender};

use serde_json::Value;

use crate::activities::{CHURN_PREFIX, Life, SPAWNER};
use crate::relay::{ChunkItem, relay_violations};

/// What the checker thread is sent.
#[derive(Debug)]
pub(crate) enum Message {
    Envelope(Vec<u8>),
    /// The client has closed: nothing more will come.
    End,
}

/// The client's transport: serialises each envelope and passes it on, never
/// blocking the sender.
#[derive(Debug)]
pub(crate) struct ForwardTransport(pub(crate) Mutex<Sender<Message>>);

impl sentry::Transport for ForwardTransport {
    fn send_envelope(&self, envelope: sentry::protocol::Envelope) {
        let mut bytes = Vec::new();
        if envelope.to_writer(&mut bytes).is_ok() {
            let _ = self.0.lock().unwrap().send(Message::Envelope(bytes));
        }
    }
}

/// One sample, compactly: thread, name (interned) and time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SampleRef {
    pub(crate) tid: u32,
    pub(crate) name: u32,
    pub(crate) ts_ns: u64,
}

/// Everything the checker learned from the envelopes.
#[derive(Debug, Default)]
pub(crate) struct Digest {
    pub(crate) envelopes: u64,
    pub(crate) chunks: u64,
    pub(crate) samples: Vec<SampleRef>,
    pub(crate) names: Vec<String>,
    /// Samples with a frame symbolised into the `dlopen`ed test library.
    pub(crate) cdylib_samples: u64,
    /// Relay-rule violations, by message, with the number of chunks.
    pub(crate) relay: HashMap<String, u64>,
    pub(crate) unreadable: Vec<String>,
    pub(crate) largest_chunk_bytes: usize,
}

impl Digest {
    fn intern(&mut self, index: &mut HashMap<String, u32>, name: &str) -> u32 {
        if let Some(&i) = index.get(name) {
            return i;
        }
        let i = self.names.len() as u32;
        self.names.push(name.to_owned());
        index.insert(name.to_owned(), i);
        i
    }
}

/// The checker thread's loop: runs until [`Message::End`] (or until every
/// sender is gone).
pub(crate) fn run_checker(rx: Receiver<Message>) -> Digest {
    let mut digest = Digest::default();
    let mut index = HashMap::new();
    while let Ok(Message::Envelope(bytes)) = rx.recv() {
        digest.envelopes += 1;
        match items(&bytes) {
            Ok(items) => {
                for (header, payload) in items {
                    if header.get("type").and_then(Value::as_str) != Some("profile_chunk") {
                        continue;
                    }
                    match serde_json::from_slice::<Value>(payload) {
                        Ok(json) => {
                            let chunk = ChunkItem {
                                header,
                                payload: json,
                                payload_len: payload.len(),
                            };
                            check_chunk(&chunk, &mut digest, &mut index);
                        }
                        Err(e) => digest.unreadable.push(format!("chunk payload: {e}")),
                    }
                }
            }
            Err(e) => digest.unreadable.push(e),
        }
    }
    digest
}

fn check_chunk(chunk: &ChunkItem, digest: &mut Digest, index: &mut HashMap<String, u32>) {
    digest.chunks += 1;
    digest.largest_chunk_bytes = digest.largest_chunk_bytes.max(chunk.payload_len);
    for v in relay_violations(chunk) {
        *digest.relay.entry(v).or_default() += 1;
    }
    let profile = &chunk.payload["profile"];
    let empty = Vec::new();
    let frames = profile["frames"].as_array().unwrap_or(&empty);
    let stacks = profile["stacks"].as_array().unwrap_or(&empty);
    let in_cdylib: Vec<bool> = frames
        .iter()
        .map(|f| {
            f["function"]
                .as_str()
                .is_some_and(|n| n.starts_with("stress_cdylib"))
        })
        .collect();
    let stack_in_cdylib: Vec<bool> = stacks
        .iter()
        .map(|s| {
            s.as_array().is_some_and(|ids| {
                ids.iter().any(|i| {
                    i.as_u64()
                        .and_then(|i| in_cdylib.get(i as usize))
                        .copied()
                        .unwrap_or(false)
                })
            })
        })
        .collect();
    let mut names_by_tid: HashMap<&str, u32> = HashMap::new();
    for (tid, meta) in profile["thread_metadata"].as_object().into_iter().flatten() {
        let name = meta["name"].as_str().unwrap_or("");
        names_by_tid.insert(tid.as_str(), digest.intern(index, name));
    }
    let unnamed = digest.intern(index, "");
    for s in profile["samples"].as_array().unwrap_or(&empty) {
        let tid_text = s["thread_id"].as_str().unwrap_or("");
        let (Ok(tid), Some(ts)) = (tid_text.parse::<u32>(), s["timestamp"].as_f64()) else {
            digest
                .unreadable
                .push(format!("sample without a numeric thread id or time: {s}"));
            continue;
        };
        let in_cdylib = s["stack_id"]
            .as_u64()
            .and_then(|i| stack_in_cdylib.get(i as usize))
            .copied()
            .unwrap_or(false);
        digest.cdylib_samples += u64::from(in_cdylib);
        digest.samples.push(SampleRef {
            tid,
            name: names_by_tid.get(tid_text).copied().unwrap_or(unnamed),
            ts_ns: (ts * 1e9) as u64,
        });
    }
}

/// Splits a serialised envelope into its items' headers and payloads.
fn items(bytes: &[u8]) -> Result<Vec<(Value, &[u8])>, String> {
    let mut rest = bytes;
    let line = |rest: &mut &[u8]| -> Option<Vec<u8>> {
        if rest.is_empty() {
            return None;
        }
        let end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
        let l = rest[..end].to_vec();
        *rest = rest.get(end + 1..).unwrap_or(&[]);
        Some(l)
    };
    line(&mut rest).ok_or("empty envelope")?;
    let mut out = Vec::new();
    while let Some(h) = line(&mut rest) {
        if h.is_empty() {
            continue;
        }
        let header: Value = serde_json::from_slice(&h).map_err(|e| format!("item header: {e}"))?;
        let payload = match header.get("length").and_then(Value::as_u64) {
            Some(len) => {
                let len = len as usize;
                let p = rest
                    .get(..len)
                    .ok_or_else(|| format!("item of {len} bytes truncated"))?;
                rest = rest.get(len..).unwrap_or(&[]);
                if rest.first() == Some(&b'\n') {
                    rest = &rest[1..];
                }
                p
            }
            None => {
                let end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
                let p = &rest[..end];
                rest = rest.get(end + 1..).unwrap_or(&[]);
                p
            }
        };
        out.push((header, payload));
    }
    Ok(out)
}

/// A sample may be stamped this long before its thread recorded its start
/// or after it recorded its end (thread start-up and exit, a starved
/// recorder). Far less than the time the kernel takes to hand the same
/// thread id out again.
pub(crate) const LIFETIME_SLACK_NS: u64 = 1_000_000_000;

/// The attribution check's findings.
#[derive(Debug, Default)]
pub(crate) struct Attribution {
    /// Samples whose thread id and time fall in exactly one recorded life,
    /// under that life's name.
    pub(crate) verified: u64,
    /// Of those, samples of churn threads.
    pub(crate) churn_samples: u64,
    /// Samples of churn threads filed under their parent's name (taken
    /// before std named the thread; the sampler re-reads names within a
    /// second).
    pub(crate) parent_named: u64,
    /// Samples of threads this run did not start (the main thread before
    /// it recorded itself, the SDK's and the profiler's own threads).
    pub(crate) other_threads: u64,
    /// Distinct churn threads with samples.
    pub(crate) churn_threads_sampled: usize,
    /// Thread ids held by more than one recorded thread over the run.
    pub(crate) reused_tids: usize,
    /// Recorded threads whose id was held by an earlier recorded thread and
    /// that have samples: the cases a stale thread table would get wrong.
    pub(crate) recycled_threads_sampled: usize,
    /// Samples of the `dlopen` thread.
    pub(crate) dlopen_samples: u64,
    /// Long-lived threads (by name) without a single sample.
    pub(crate) unsampled_long_lived: Vec<String>,
    /// Samples on the shared timelines of short-lived threads (profile
    /// thread ids from 500,000,000, named `"{name} (short-lived
    /// threads)"`) that a thread of that name, running at that time,
    /// accounts for.
    pub(crate) short_lived: u64,
    /// Misattributed samples (the first few, described) and their count.
    pub(crate) wrong: Vec<String>,
    pub(crate) wrong_count: u64,
}

/// The first profile thread id of the short-lived threads' shared
/// timelines, and the first lane id (the crate's `LANE_BASE`).
const SHORT_LIVED_BASE: u32 = 500_000_000;
const LANE_BASE: u32 = 1_000_000_000;
/// The suffix of a shared timeline's name.
const SHORT_LIVED_SUFFIX: &str = " (short-lived threads)";

/// Checks every sample against the recorded lives: a sample of thread id
/// `t` at time `ts` must carry the name of the thread that held `t` at
/// `ts` (or, for a churn thread, its parent's name); a sample that no life
/// covers must not carry the name of a recorded thread.
pub(crate) fn check_attribution(digest: &Digest, lives: &[Life]) -> Attribution {
    let mut by_tid: HashMap<u32, Vec<usize>> = HashMap::new();
    for (i, l) in lives.iter().enumerate() {
        by_tid.entry(l.tid).or_default().push(i);
    }
    for v in by_tid.values_mut() {
        v.sort_by_key(|&i| lives[i].start_ns);
    }
    let recorded_names: std::collections::HashSet<&str> = lives
        .iter()
        .filter(|l| !l.spawned)
        .map(|l| l.name.as_str())
        .collect();
    let mut out = Attribution {
        reused_tids: by_tid.values().filter(|v| v.len() > 1).count(),
        ..Attribution::default()
    };
    let mut sampled = vec![0u64; lives.len()];
    let wrong = |out: &mut Attribution, what: String| {
        out.wrong_count += 1;
        if out.wrong.len() < 20 {
            out.wrong.push(what);
        }
    };
    let mut by_name: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, l) in lives.iter().enumerate() {
        by_name.entry(l.name.as_str()).or_default().push(i);
    }
    let alive_then = |i: usize, ts_ns: u64| {
        let l = &lives[i];
        ts_ns + LIFETIME_SLACK_NS >= l.start_ns
            && ts_ns <= l.end_ns.saturating_add(LIFETIME_SLACK_NS)
    };
    for s in &digest.samples {
        let name = digest.names[s.name as usize].as_str();
        // A short-lived thread's capture, filed on its name's shared
        // timeline: some thread of that name (or a churn thread not named
        // yet, under its parent's) must have been alive then.
        if (SHORT_LIVED_BASE..LANE_BASE).contains(&s.tid) {
            let base = name.strip_suffix(SHORT_LIVED_SUFFIX).unwrap_or(name);
            let named = by_name
                .get(base)
                .is_some_and(|v| v.iter().any(|&i| alive_then(i, s.ts_ns)));
            let unnamed_child = base == SPAWNER
                && lives
                    .iter()
                    .enumerate()
                    .any(|(i, l)| l.spawned && alive_then(i, s.ts_ns));
            if name.ends_with(SHORT_LIVED_SUFFIX) && (named || unnamed_child) {
                out.short_lived += 1;
            } else {
                wrong(
                    &mut out,
                    format!(
                        "sample of shared timeline {} at {} named {name:?}, but no thread \
                         of that name was alive then",
                        s.tid, s.ts_ns
                    ),
                );
            }
            continue;
        }
        let covering: Vec<usize> = by_tid
            .get(&s.tid)
            .into_iter()
            .flatten()
            .copied()
            .filter(|&i| {
                let l = &lives[i];
                s.ts_ns + LIFETIME_SLACK_NS >= l.start_ns
                    && s.ts_ns <= l.end_ns.saturating_add(LIFETIME_SLACK_NS)
            })
            .collect();
        match covering.as_slice() {
            [] => {
                if name.starts_with(CHURN_PREFIX) || recorded_names.contains(name) {
                    wrong(
                        &mut out,
                        format!(
                            "sample of tid {} at {} named {name:?}, but no thread of that \
                             name held tid {} then",
                            s.tid, s.ts_ns, s.tid
                        ),
                    );
                } else {
                    out.other_threads += 1;
                }
            }
            [i] => {
                let l = &lives[*i];
                if name == l.name {
                    out.verified += 1;
                    out.dlopen_samples += u64::from(l.name == crate::DLOPEN_THREAD);
                    sampled[*i] += 1;
                    if l.spawned {
                        out.churn_samples += 1;
                    }
                } else if l.spawned && name == SPAWNER {
                    out.parent_named += 1;
                    sampled[*i] += 1;
                } else {
                    wrong(
                        &mut out,
                        format!(
                            "sample of tid {} at {} named {name:?}, but tid {} was {:?} \
                             ({}..{})",
                            s.tid, s.ts_ns, s.tid, l.name, l.start_ns, l.end_ns
                        ),
                    );
                }
            }
            many => wrong(
                &mut out,
                format!(
                    "sample of tid {} at {} is within {} recorded lives of that id; the \
                     slack is too wide to tell",
                    s.tid,
                    s.ts_ns,
                    many.len()
                ),
            ),
        }
    }
    out.churn_threads_sampled = lives
        .iter()
        .zip(&sampled)
        .filter(|(l, n)| l.spawned && **n > 0)
        .count();
    out.recycled_threads_sampled = by_tid
        .values()
        .flat_map(|v| v.iter().skip(1))
        .filter(|&&i| sampled[i] > 0)
        .count();
    out.unsampled_long_lived = lives
        .iter()
        .zip(&sampled)
        .filter(|(l, n)| !l.spawned && **n == 0)
        .map(|(l, _)| l.name.clone())
        .collect();
    out
}
