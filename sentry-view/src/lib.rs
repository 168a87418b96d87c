//! What Sentry shows for a transaction, computed from the payloads this
//! crate sends: the profile chunks and the transaction.
//!
//! Sentry does not show a chunk as it was sent. When a user opens a
//! transaction's profile, Sentry reads every chunk of the transaction's
//! `profiler_id` that overlaps its time window, keeps the samples with
//! `start <= timestamp <= end` (vroom's `MergeSampleChunks`), and the
//! profile page selects the thread named by the transaction's
//! `contexts.trace.data["thread.id"]`. Each sample is then weighted by the
//! time to the next sample *on the same thread* (the frontend's
//! `ContinuousProfile`, and vroom's call trees: "skip last sample as it's
//! only used for timestamp"), so the last sample of a thread carries no
//! weight, and a gap in a thread's timeline is charged entirely to the
//! sample before it.
//!
//! [`what_sentry_shows`] computes exactly that, so the tests can assert what
//! users will see (not only what was sent), and a local preview can draw the
//! same flame graph without a Sentry account. Frames resolve to names
//! through [`ShownProfile::stack`]; synthetic frames (a suspended lane, a
//! worker running a request) are told apart by [`Frame::is_synthetic`].

use std::collections::HashMap;
use std::fmt;

use serde_json::Value;

pub use sentry_profiling::LANE_BASE;
pub use sentry_profiling::frames::{
    AWAITING_ADDRESS, AWAITING_FUNCTION, ESTIMATED_ADDRESS, ESTIMATED_FUNCTION, QUEUED_ADDRESS,
    QUEUED_FUNCTION, RUNNING_REQUEST_ADDRESS, RUNNING_REQUEST_FUNCTION, SIGNAL_HANDLER_ADDRESS,
    SIGNAL_HANDLER_FUNCTION, SUSPENDED_ADDRESS, SUSPENDED_FUNCTION, UNCAPTURED_ADDRESS,
    UNCAPTURED_FUNCTION, UNWOUND_NO_FURTHER_ADDRESS, UNWOUND_NO_FURTHER_FUNCTION,
    WAITING_FOR_CPU_ADDRESS, WAITING_FOR_CPU_FUNCTION, WAITING_UNREAD_ADDRESS,
    WAITING_UNREAD_FUNCTION,
};

/// Synthetic frames are written at addresses below this one, where Linux
/// never maps anything (see [`Frame::is_synthetic`]).
pub const SYNTHETIC_ADDRESS_LIMIT: u64 = 0x1000;

/// Why a payload could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PayloadError {
    /// What is missing or malformed.
    pub what: String,
}

impl fmt::Display for PayloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a usable Sentry payload: {}", self.what)
    }
}

impl std::error::Error for PayloadError {}

fn bad(what: impl Into<String>) -> PayloadError {
    PayloadError { what: what.into() }
}

/// A frame of a chunk.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Frame {
    /// The frame's `instruction_addr`.
    pub instruction_addr: Option<u64>,
    /// The function name the SDK resolved, if any (demangled).
    pub function: Option<String>,
    /// The frame's `in_app`, when the SDK set it (only synthetic frames).
    pub in_app: Option<bool>,
}

impl Frame {
    /// Whether this is one of the crate's synthetic frames (a suspended
    /// lane, a worker running a request): not in-app, at an address where
    /// no image can lie.
    pub fn is_synthetic(&self) -> bool {
        self.in_app == Some(false)
            && self
                .instruction_addr
                .is_some_and(|a| a < SYNTHETIC_ADDRESS_LIMIT)
    }

    /// A name to show: the function, or the address when unresolved.
    pub fn name(&self) -> String {
        match (&self.function, self.instruction_addr) {
            (Some(f), _) => f.clone(),
            (None, Some(a)) => format!("{a:#x}"),
            (None, None) => "<unknown>".to_owned(),
        }
    }
}

/// A sample of a chunk, as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RawSample {
    /// Nanoseconds since the Unix epoch.
    pub timestamp_ns: u64,
    /// The sample's `thread_id` (an OS thread, or a request's lane).
    pub thread_id: String,
    /// Index into [`ProfileChunk::stacks`].
    pub stack_id: usize,
}

/// A `profile_chunk` payload (sample format V2), parsed.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ProfileChunk {
    /// The profiler session.
    pub profiler_id: String,
    /// This chunk.
    pub chunk_id: String,
    /// Frames.
    pub frames: Vec<Frame>,
    /// Stacks as frame indices, leaf first.
    pub stacks: Vec<Vec<usize>>,
    /// Samples, in payload order.
    pub samples: Vec<RawSample>,
    /// `thread_metadata` names, by thread id.
    pub thread_names: HashMap<String, String>,
    /// Indices into `samples` by thread id, each list in time order.
    by_thread: HashMap<String, Vec<usize>>,
}

fn hex(v: &Value) -> Option<u64> {
    let s = v.as_str()?;
    u64::from_str_radix(s.strip_prefix("0x")?, 16).ok()
}

fn secs_to_ns(secs: f64) -> Option<u64> {
    (secs.is_finite() && secs >= 0.0).then(|| (secs * 1e9).round() as u64)
}

impl ProfileChunk {
    /// Parses a `profile_chunk` item's payload.
    pub fn from_json(bytes: &[u8]) -> Result<Self, PayloadError> {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| bad(format!("JSON: {e}")))?;
        Self::from_value(&v)
    }

    /// [`ProfileChunk::from_json`] of an already parsed payload. Checks
    /// what Sentry needs to draw it: ids, and every stack and frame index in
    /// range.
    pub fn from_value(v: &Value) -> Result<Self, PayloadError> {
        let str_of = |key: &str| {
            v.get(key)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| bad(format!("no `{key}`")))
        };
        let profiler_id = str_of("profiler_id")?;
        let chunk_id = str_of("chunk_id")?;
        let p = v.get("profile").ok_or_else(|| bad("no `profile`"))?;
        let list = |key: &str| {
            p.get(key)
                .and_then(Value::as_array)
                .ok_or_else(|| bad(format!("no `profile.{key}`")))
        };
        let frames: Vec<Frame> = list("frames")?
            .iter()
            .map(|f| Frame {
                instruction_addr: f.get("instruction_addr").and_then(hex),
                function: f.get("function").and_then(Value::as_str).map(str::to_owned),
                in_app: f.get("in_app").and_then(Value::as_bool),
            })
            .collect();
        let mut stacks = Vec::new();
        for s in list("stacks")? {
            let ids = s
                .as_array()
                .ok_or_else(|| bad("a stack is not a list"))?
                .iter()
                .map(|i| {
                    i.as_u64()
                        .map(|i| i as usize)
                        .filter(|&i| i < frames.len())
                        .ok_or_else(|| bad("a stack names a frame that does not exist"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            stacks.push(ids);
        }
        let mut samples = Vec::new();
        for s in list("samples")? {
            let timestamp_ns = s
                .get("timestamp")
                .and_then(Value::as_f64)
                .and_then(secs_to_ns)
                .ok_or_else(|| bad("a sample without a valid `timestamp`"))?;
            let thread_id = s
                .get("thread_id")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("a sample without a string `thread_id`"))?
                .to_owned();
            let stack_id = s
                .get("stack_id")
                .and_then(Value::as_u64)
                .map(|i| i as usize)
                .filter(|&i| i < stacks.len())
                .ok_or_else(|| bad("a sample names a stack that does not exist"))?;
            samples.push(RawSample {
                timestamp_ns,
                thread_id,
                stack_id,
            });
        }
        let mut by_thread: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, s) in samples.iter().enumerate() {
            by_thread.entry(s.thread_id.clone()).or_default().push(i);
        }
        for list in by_thread.values_mut() {
            list.sort_by_key(|&i| samples[i].timestamp_ns);
        }
        let thread_names = p
            .get("thread_metadata")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.get("name")?.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        Ok(Self {
            profiler_id,
            chunk_id,
            frames,
            stacks,
            samples,
            thread_names,
            by_thread,
        })
    }

    /// The thread ids that have samples in this chunk (OS threads and
    /// lanes; see [`is_lane_thread_id`]).
    pub fn thread_ids(&self) -> impl Iterator<Item = &str> {
        self.by_thread.keys().map(String::as_str)
    }

    /// Earliest and latest sample timestamps (what Sentry indexes the chunk
    /// by), if it has samples.
    pub fn span_ns(&self) -> Option<(u64, u64)> {
        let min = self.samples.iter().map(|s| s.timestamp_ns).min()?;
        let max = self.samples.iter().map(|s| s.timestamp_ns).max()?;
        Some((min, max))
    }
}

/// What links a transaction to its profile: its `profiler_id`, its
/// `thread.id`, and its time window.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransactionWindow {
    /// The transaction's name.
    pub name: String,
    /// `contexts.profile.profiler_id`.
    pub profiler_id: String,
    /// `contexts.trace.data["thread.id"]`.
    pub thread_id: String,
    /// `start_timestamp`, nanoseconds since the Unix epoch.
    pub start_ns: u64,
    /// `timestamp`, nanoseconds since the Unix epoch.
    pub end_ns: u64,
    /// The trace context's `status` (`ok`, `internal_error`, ...), if set.
    pub status: Option<String>,
}

impl TransactionWindow {
    /// Reads a `transaction` item's payload; an error names what is
    /// missing (a transaction without a profile has no `profiler_id`).
    pub fn from_value(tx: &Value) -> Result<Self, PayloadError> {
        let name = tx
            .get("transaction")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let profiler_id = tx
            .pointer("/contexts/profile/profiler_id")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("{name}: no contexts.profile.profiler_id")))?
            .to_owned();
        let thread_id = tx
            .pointer("/contexts/trace/data/thread.id")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("{name}: no string thread.id in the trace context")))?
            .to_owned();
        let time = |key: &str| {
            tx.get(key)
                .and_then(timestamp_ns)
                .ok_or_else(|| bad(format!("{name}: no valid `{key}`")))
        };
        let start_ns = time("start_timestamp")?;
        let end_ns = time("timestamp")?;
        let status = tx
            .pointer("/contexts/trace/status")
            .and_then(Value::as_str)
            .map(str::to_owned);
        Ok(Self {
            name,
            profiler_id,
            thread_id,
            start_ns,
            end_ns,
            status,
        })
    }

    /// The transaction's duration.
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// A Sentry timestamp (Unix seconds as a number, or RFC 3339 in UTC as the
/// Rust SDK writes them) in nanoseconds since the Unix epoch.
pub fn timestamp_ns(v: &Value) -> Option<u64> {
    if let Some(secs) = v.as_f64() {
        return secs_to_ns(secs);
    }
    let s = v.as_str()?;
    let s = s.strip_suffix('Z').or_else(|| s.strip_suffix("+00:00"))?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-').map(str::parse::<i64>);
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut t = time.splitn(3, ':');
    let h: i64 = t.next()?.parse().ok()?;
    let min: i64 = t.next()?.parse().ok()?;
    let rest = t.next()?;
    let (sec, frac) = rest.split_once('.').unwrap_or((rest, ""));
    let sec: i64 = sec.parse().ok()?;
    if !(1..=12).contains(&m) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut nanos: u64 = 0;
    for (i, b) in frac.bytes().take(9).enumerate() {
        nanos += u64::from(b - b'0') * 10u64.pow(8 - i as u32);
    }
    // Days since the epoch of a proleptic Gregorian date.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3_600 + min * 60 + sec;
    u64::try_from(secs)
        .ok()?
        .checked_mul(1_000_000_000)?
        .checked_add(nanos)
}

/// A sample as Sentry weights it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WeightedSample {
    /// Nanoseconds since the Unix epoch.
    pub timestamp_ns: u64,
    /// Time to the next sample of the thread within the window; 0 for the
    /// last.
    pub weight_ns: u64,
    /// Index of its chunk in the slice given to [`what_sentry_shows`].
    pub chunk: usize,
    /// Index into that chunk's stacks.
    pub stack_id: usize,
}

/// One thread's samples in one window, weighted as Sentry weights them.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ShownProfile<'a> {
    chunks: &'a [ProfileChunk],
    /// The thread shown.
    pub thread_id: String,
    /// Its samples in time order.
    pub samples: Vec<WeightedSample>,
}

impl<'a> ShownProfile<'a> {
    /// A sample's frames, leaf first.
    pub fn stack(&self, sample: &WeightedSample) -> impl Iterator<Item = &'a Frame> + 'a {
        let chunk = &self.chunks[sample.chunk];
        chunk.stacks[sample.stack_id]
            .iter()
            .map(move |&f| &chunk.frames[f])
    }

    /// The sum of all weights: the wall time the thread's timeline covers.
    pub fn total_ns(&self) -> u64 {
        self.samples.iter().map(|s| s.weight_ns).sum()
    }

    /// The weight of the samples whose stack has a frame for which `pick`
    /// holds (each sample counted once): what a flame graph shows for it.
    pub fn weight_where(&self, mut pick: impl FnMut(&Frame) -> bool) -> u64 {
        self.samples
            .iter()
            .filter(|s| self.stack(s).any(&mut pick))
            .map(|s| s.weight_ns)
            .sum()
    }

    /// The thread's name from the chunks' `thread_metadata`, if any.
    pub fn thread_name(&self) -> Option<&'a str> {
        self.chunks
            .iter()
            .find_map(|c| c.thread_names.get(&self.thread_id))
            .map(String::as_str)
    }
}

/// What Sentry shows for `thread_id` of profiler `profiler_id` between
/// `start_ns` and `end_ns` (inclusive): the samples of that thread in the
/// chunks of that profiler, each weighted by the time to the next sample of
/// the thread in the window, the last one by nothing.
pub fn what_sentry_shows<'a>(
    chunks: &'a [ProfileChunk],
    profiler_id: &str,
    thread_id: &str,
    start_ns: u64,
    end_ns: u64,
) -> ShownProfile<'a> {
    let mut samples: Vec<WeightedSample> = Vec::new();
    for (ci, chunk) in chunks.iter().enumerate() {
        if chunk.profiler_id != profiler_id {
            continue;
        }
        let Some(list) = chunk.by_thread.get(thread_id) else {
            continue;
        };
        let from = list.partition_point(|&i| chunk.samples[i].timestamp_ns < start_ns);
        for &i in &list[from..] {
            let s = &chunk.samples[i];
            if s.timestamp_ns > end_ns {
                break;
            }
            samples.push(WeightedSample {
                timestamp_ns: s.timestamp_ns,
                weight_ns: 0,
                chunk: ci,
                stack_id: s.stack_id,
            });
        }
    }
    // Relay sorts each chunk's samples by time; vroom keeps that order
    // when it merges chunks.
    samples.sort_by_key(|s| s.timestamp_ns);
    for i in 1..samples.len() {
        samples[i - 1].weight_ns = samples[i]
            .timestamp_ns
            .saturating_sub(samples[i - 1].timestamp_ns);
    }
    ShownProfile {
        chunks,
        thread_id: thread_id.to_owned(),
        samples,
    }
}

/// What Sentry shows for a transaction: [`what_sentry_shows`] of its
/// profiler, its `thread.id` and its window.
pub fn transaction_profile<'a>(
    chunks: &'a [ProfileChunk],
    tx: &TransactionWindow,
) -> ShownProfile<'a> {
    what_sentry_shows(
        chunks,
        &tx.profiler_id,
        &tx.thread_id,
        tx.start_ns,
        tx.end_ns,
    )
}

/// Whether a chunk `thread_id` is a request's lane (not an OS thread).
pub fn is_lane_thread_id(thread_id: &str) -> bool {
    thread_id.parse::<u64>().is_ok_and(|id| id >= LANE_BASE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chunk() -> ProfileChunk {
        ProfileChunk::from_value(&json!({
            "profiler_id": "p", "chunk_id": "c",
            "profile": {
                "frames": [
                    {"instruction_addr": "0x1000", "function": "work"},
                    {"instruction_addr": "0x1", "function": SUSPENDED_FUNCTION, "in_app": false}
                ],
                "stacks": [[0], [1]],
                "samples": [
                    {"timestamp": 10.00, "thread_id": "7", "stack_id": 0},
                    {"timestamp": 10.01, "thread_id": "8", "stack_id": 0},
                    {"timestamp": 10.02, "thread_id": "7", "stack_id": 1},
                    {"timestamp": 10.05, "thread_id": "7", "stack_id": 0},
                    {"timestamp": 10.09, "thread_id": "7", "stack_id": 0}
                ],
                "thread_metadata": {"7": {"name": "GET /x"}}
            }
        }))
        .unwrap()
    }

    #[test]
    fn weights_by_the_time_to_the_next_sample_of_the_thread_in_the_window() {
        let chunks = [chunk()];
        let shown = what_sentry_shows(&chunks, "p", "7", 10_000_000_000, 10_060_000_000);
        let w: Vec<u64> = shown
            .samples
            .iter()
            .map(|s| s.weight_ns / 1_000_000)
            .collect();
        // The sample at 10.09 is outside the window: the one at 10.05 is the
        // last, and carries nothing.
        assert_eq!(w, vec![20, 30, 0]);
        assert_eq!(shown.total_ns() / 1_000_000, 50);
        assert_eq!(shown.weight_where(|f| f.is_synthetic()) / 1_000_000, 30);
        assert_eq!(shown.thread_name(), Some("GET /x"));
        let mut ids: Vec<&str> = chunks[0].thread_ids().collect();
        ids.sort_unstable();
        assert_eq!(ids, vec!["7", "8"]);
        assert!(
            what_sentry_shows(&chunks, "q", "7", 0, u64::MAX)
                .samples
                .is_empty()
        );
    }

    #[test]
    fn rejects_dangling_indices_and_reads_both_timestamp_forms() {
        let bad = json!({"profiler_id": "p", "chunk_id": "c", "profile": {
            "frames": [], "stacks": [[0]], "samples": []}});
        assert!(ProfileChunk::from_value(&bad).is_err());
        assert_eq!(
            timestamp_ns(&json!("2026-11-22T11:56:33.797392362Z")),
            Some(1_795_348_593_797_392_362)
        );
        assert_eq!(
            timestamp_ns(&json!("1970-01-01T00:00:01Z")),
            Some(1_000_000_000)
        );
        assert_eq!(timestamp_ns(&json!(1.5)), Some(1_500_000_000));
        assert_eq!(timestamp_ns(&json!("yesterday")), None);
        assert!(is_lane_thread_id("1000000001") && !is_lane_thread_id("4242"));
    }
}
