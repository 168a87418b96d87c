//! The blocking-poll issues of a run, as Sentry's issue stream lists
//! them: the `event` items whose fingerprint begins with
//! `tokio-blocking-poll`, grouped by fingerprint (one issue per blocking
//! site and kind), each with its events, the polls they stand for, the
//! worst and the last event's title, request and stack.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// The first element of a blocking-poll event's fingerprint.
const FINGERPRINT_TAG: &str = "tokio-blocking-poll";

/// One blocking-poll event, as the page needs it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BlockingEvent {
    fingerprint: Vec<String>,
    title: String,
    culprit: String,
    kind: String,
    transaction: String,
    trace_id: String,
    count: u64,
    worst_ms: f64,
    median_ms: f64,
    /// Function names (or addresses), leaf last.
    stack: Vec<String>,
}

impl BlockingEvent {
    /// The event, if `v` is a blocking-poll event.
    pub(crate) fn from_event(v: &Value) -> Option<Self> {
        let fingerprint: Vec<String> = v
            .get("fingerprint")?
            .as_array()?
            .iter()
            .filter_map(|f| f.as_str().map(str::to_owned))
            .collect();
        if fingerprint.first().map(String::as_str) != Some(FINGERPRINT_TAG) {
            return None;
        }
        let text = |p: &str| {
            v.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let num = |p: &str| v.pointer(p).and_then(Value::as_f64).unwrap_or(0.0);
        let stack = v
            .pointer("/threads/values/0/stacktrace/frames")
            .and_then(Value::as_array)
            .map(|frames| {
                frames
                    .iter()
                    .map(|f| {
                        f.get("function")
                            .and_then(Value::as_str)
                            .or_else(|| f.get("instruction_addr").and_then(Value::as_str))
                            .unwrap_or("?")
                            .to_owned()
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(Self {
            fingerprint,
            title: text("/message"),
            culprit: text("/culprit"),
            kind: text("/tags/blocking.kind"),
            transaction: text("/transaction"),
            trace_id: text("/contexts/trace/trace_id"),
            count: v
                .pointer("/contexts/blocking_poll/count")
                .and_then(Value::as_u64)
                .unwrap_or(1),
            worst_ms: num("/contexts/blocking_poll/worst_ms"),
            median_ms: num("/contexts/blocking_poll/median_ms"),
            stack,
        })
    }
}

/// The page's rows: one per issue (fingerprint), most polls first.
pub(crate) fn issue_rows(events: &[BlockingEvent]) -> Vec<Value> {
    let mut by_fingerprint: BTreeMap<&[String], Vec<&BlockingEvent>> = BTreeMap::new();
    for e in events {
        by_fingerprint.entry(&e.fingerprint).or_default().push(e);
    }
    let mut rows: Vec<(u64, Value)> = by_fingerprint
        .values()
        .map(|evs| {
            let last = evs[evs.len() - 1];
            let polls: u64 = evs.iter().map(|e| e.count).sum();
            let worst = evs.iter().map(|e| e.worst_ms).fold(0.0, f64::max);
            (
                polls,
                json!({
                    "title": last.title,
                    "culprit": last.culprit,
                    "kind": last.kind,
                    "events": evs.len(),
                    "polls": polls,
                    "worst": worst,
                    "median": last.median_ms,
                    "tx": last.transaction,
                    "trace": last.trace_id,
                    "stack": last.stack,
                }),
            )
        })
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.0));
    rows.into_iter().map(|(_, r)| r).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(culprit: &str, kind: &str, count: u64, worst: f64) -> Value {
        json!({
            "message": format!("Tokio worker blocked for {worst} ms in {culprit}"),
            "culprit": culprit,
            "fingerprint": [FINGERPRINT_TAG, culprit, kind],
            "transaction": "GET /items",
            "tags": {"blocking.kind": kind},
            "contexts": {
                "trace": {"trace_id": "ab"},
                "blocking_poll": {"count": count, "worst_ms": worst, "median_ms": 60.0},
            },
            "threads": {"values": [{"stacktrace": {"frames": [
                {"instruction_addr": "0x1"},
                {"instruction_addr": "0x5000", "function": culprit},
            ]}}]},
        })
    }

    #[test]
    fn events_group_into_one_issue_per_fingerprint() {
        let events: Vec<BlockingEvent> = [
            event("app::crunch", "cpu", 3, 120.0),
            event("app::crunch", "cpu", 4, 150.0),
            event("app::nap", "syscall:clock_nanosleep", 9, 70.0),
            json!({"message": "an error", "fingerprint": ["{{ default }}"]}),
        ]
        .iter()
        .filter_map(BlockingEvent::from_event)
        .collect();
        assert_eq!(events.len(), 3, "the error event is not a blocking poll");
        let rows = issue_rows(&events);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0]["culprit"], "app::nap", "most polls first");
        assert_eq!(rows[1]["events"], 2);
        assert_eq!(rows[1]["polls"], 7);
        assert_eq!(rows[1]["worst"], 150.0);
        assert_eq!(rows[1]["stack"], json!(["0x1", "app::crunch"]));
    }
}
