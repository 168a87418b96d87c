//! One request's poll totals, as `sentry-profiling-tracing`'s
//! `http_layer()` puts them on its transaction (see [`PollTotals`]).

use sentry_view::timestamp_ns;
use serde_json::{Value, json};

// The data keys, as `sentry_profiling_tracing::data` names them. The page
// reads envelopes, which any version of the layer may have written, so it
// does not depend on the layer's crate for a few strings.
/// `data::POLLS`: how many times the request's future was polled.
const POLLS: &str = "tokio.polls";
/// `data::POLLED`: milliseconds inside those polls.
const POLLED: &str = "tokio.polled";
/// `data::QUEUED`: milliseconds from wakes to the polls they caused.
const QUEUED: &str = "tokio.queued";
/// `data::AWAITING`: milliseconds neither polled nor queued.
const AWAITING: &str = "tokio.awaiting";
/// `data::CPU_WAIT`: milliseconds of the polled time its threads were
/// shown waiting for a CPU (only on profiled requests).
const CPU_WAIT: &str = "tokio.cpu_wait";
/// `data::OFFLOADED`: milliseconds its offloaded work (`spawn_in_span`,
/// `spawn_blocking_in_span`) ran, beside the future's parts.
const OFFLOADED: &str = "tokio.offloaded";
/// `data::OFFLOADED_CPU_WAIT`: of that, shown waiting for a CPU.
const OFFLOADED_CPU_WAIT: &str = "tokio.offloaded_cpu_wait";
/// `data::OFFLOADED_QUEUED`: milliseconds its offloaded work waited to
/// start (a free blocking thread, a Tokio worker).
const OFFLOADED_QUEUED: &str = "tokio.offloaded_queued";
/// `data::LONGEST_POLL`: the longest poll, in milliseconds.
const LONGEST_POLL: &str = "tokio.longest_poll";
/// `data::LONG_POLLS`: polls at least the long-poll threshold long (only
/// when there were some).
const LONG_POLLS: &str = "tokio.long_polls";
/// `data::LONGEST_POLL_START`: when the longest poll began, in seconds
/// since the Unix epoch (only with long polls).
const LONGEST_POLL_START: &str = "tokio.longest_poll.start";

/// One request's poll totals.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PollTotals {
    pub(crate) polls: u64,
    pub(crate) polled_ms: f64,
    pub(crate) queued_ms: f64,
    pub(crate) awaiting_ms: f64,
    /// Of the time polled, waiting for a CPU (0 when not profiled).
    pub(crate) cpu_wait_ms: f64,
    /// Its offloaded work: ran, of that waiting for a CPU, and waiting to
    /// start (0 each when not profiled, or none).
    pub(crate) offloaded_ms: f64,
    pub(crate) offloaded_cpu_wait_ms: f64,
    pub(crate) offloaded_queued_ms: f64,
    pub(crate) longest_ms: f64,
    /// Polls at least the long-poll threshold long.
    pub(crate) long_polls: u64,
    /// When the longest poll began, ns since the Unix epoch; only
    /// transactions with long polls carry it.
    pub(crate) longest_start_ns: Option<u64>,
}

impl PollTotals {
    /// The totals of a `transaction` payload, from its trace data or, where
    /// that lacks a key, its `measurements` (a transaction another writer
    /// re-serialised may keep only one of the two); `None` when it has no
    /// poll count (the request was not instrumented, or never polled).
    pub(crate) fn from_transaction(tx: &Value) -> Option<Self> {
        let data = tx.pointer("/contexts/trace/data");
        let measurements = tx.get("measurements");
        let value = |key: &str| {
            data.and_then(|d| d.get(key))
                .or_else(|| measurements.and_then(|m| m.get(key)?.get("value")))
        };
        // A negative or non-finite number is no measurement; it counts as
        // missing rather than skewing a name's sums.
        let number = |key: &str| {
            value(key)
                .and_then(Value::as_f64)
                .filter(|v| v.is_finite() && *v >= 0.0)
        };
        let count = |key: &str| number(key).map(|v| v as u64);
        Some(Self {
            polls: count(POLLS)?,
            polled_ms: number(POLLED).unwrap_or(0.0),
            queued_ms: number(QUEUED).unwrap_or(0.0),
            awaiting_ms: number(AWAITING).unwrap_or(0.0),
            cpu_wait_ms: number(CPU_WAIT).unwrap_or(0.0),
            offloaded_ms: number(OFFLOADED).unwrap_or(0.0),
            offloaded_cpu_wait_ms: number(OFFLOADED_CPU_WAIT).unwrap_or(0.0),
            offloaded_queued_ms: number(OFFLOADED_QUEUED).unwrap_or(0.0),
            longest_ms: number(LONGEST_POLL).unwrap_or(0.0),
            long_polls: count(LONG_POLLS).unwrap_or(0),
            longest_start_ns: value(LONGEST_POLL_START).and_then(timestamp_ns),
        })
    }

    /// The page's row object: polls, polled, queued, awaiting, waiting for
    /// a CPU, longest poll, long polls, and the offloaded work's ran,
    /// waiting for a CPU and queued.
    pub(crate) fn to_json(self) -> Value {
        json!({
            "n": self.polls,
            "p": round_ms(self.polled_ms),
            "q": round_ms(self.queued_ms),
            "a": round_ms(self.awaiting_ms),
            "w": round_ms(self.cpu_wait_ms),
            "l": round_ms(self.longest_ms),
            "x": self.long_polls,
            "o": round_ms(self.offloaded_ms),
            "ow": round_ms(self.offloaded_cpu_wait_ms),
            "oq": round_ms(self.offloaded_queued_ms),
        })
    }
}

/// Milliseconds to the microsecond, as the page shows them.
pub(crate) fn round_ms(ms: f64) -> f64 {
    (ms * 1e3).round() / 1e3
}
