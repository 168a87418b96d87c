//! How a transaction carries the thread its profile is filed under: the
//! tracing layer tags it with its lane and records the OS thread beside it;
//! before sending, a transaction too short to have a lane of its own is
//! pointed back at its OS thread, and the OS-thread keys are removed. Used
//! by the transport (continuous profiling) and by transaction profiles (V1)
//! alike, so it sits below both.

use std::time::Duration;

use sentry_core::protocol::{Context, Map, Value};

/// Span and transaction data key under which the tracing layer records the
/// OS thread next to a lane's `thread.id`; removed before sending.
pub const OS_THREAD_ID: &str = "sentry_profiling.os_thread.id";
/// Like [`OS_THREAD_ID`], for the thread's name.
pub const OS_THREAD_NAME: &str = "sentry_profiling.os_thread.name";

/// Points a short transaction's lane tags at its OS thread, and removes the
/// OS-thread keys from every transaction and span.
pub(crate) fn settle_lane(tx: &mut sentry_core::protocol::Transaction<'_>, min_lane: Duration) {
    let duration = tx
        .timestamp
        .and_then(|end| end.duration_since(tx.start_timestamp).ok())
        .unwrap_or_default();
    let short = duration < min_lane;
    let mut lane = None;
    if let Some(Context::Trace(tc)) = tx.contexts.get_mut("trace") {
        lane = rewrite(&mut tc.data, short, None);
    }
    for span in &mut tx.spans {
        rewrite(&mut span.data, short, lane.as_ref());
    }
}

/// The lane a transaction is filed under (its `thread.id`, once
/// [`settle_lane`] left it on a lane), and when the transaction began and
/// ended (nanoseconds since the Unix epoch).
pub(crate) fn lane_window(tx: &sentry_core::protocol::Transaction<'_>) -> Option<(u64, u64, u64)> {
    let Some(Context::Trace(tc)) = tx.contexts.get("trace") else {
        return None;
    };
    let lane = tc.data.get("thread.id")?.as_str()?.parse::<u64>().ok()?;
    let ns = |t: std::time::SystemTime| {
        let d = t.duration_since(std::time::UNIX_EPOCH).ok()?;
        u64::try_from(d.as_nanos()).ok()
    };
    let (start, end) = (ns(tx.start_timestamp)?, ns(tx.timestamp?)?);
    (crate::lanes::is_lane(lane) && start <= end).then_some((lane, start, end))
}

/// Removes the OS-thread keys from `data`; when `short` (and the span's
/// `thread.id` is the transaction's lane, if given), moves them into
/// `thread.id`/`thread.name`. Returns the lane id that was replaced.
fn rewrite(data: &mut Map<String, Value>, short: bool, lane: Option<&Value>) -> Option<Value> {
    let os_id = data.remove(OS_THREAD_ID)?;
    let os_name = data.remove(OS_THREAD_NAME);
    let current = data.get("thread.id").cloned();
    if !short || lane.is_some_and(|l| current.as_ref() != Some(l)) {
        return None;
    }
    data.insert("thread.id".into(), os_id);
    match os_name {
        Some(name) => data.insert("thread.name".into(), name),
        None => data.remove("thread.name"),
    };
    current
}

/// Appends a transaction item to raw envelope bytes. A `profile` context
/// added as `Context::Other` is written with `"type":"profile"` instead of
/// the SDK's `"type":"unknown"`, which Relay would not read as a profile
/// context.
pub(crate) fn write_transaction(bytes: &mut Vec<u8>, tx: &sentry_core::protocol::Transaction<'_>) {
    let Ok(mut json) = serde_json::to_vec(tx) else {
        return;
    };
    const FROM: &[u8] = br#""profile":{"type":"unknown","#;
    const TO: &[u8] = br#""profile":{"type":"profile","#;
    if let Some(pos) = json.windows(FROM.len()).position(|w| w == FROM) {
        json[pos..pos + FROM.len()].copy_from_slice(TO);
    }
    bytes.extend_from_slice(
        format!("{{\"type\":\"transaction\",\"length\":{}}}\n", json.len()).as_bytes(),
    );
    bytes.extend_from_slice(&json);
    bytes.push(b'\n');
}
