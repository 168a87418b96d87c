//! How a transaction carries the thread its profile is filed under: the
//! tracing layer tags it with its lane and records the OS thread beside it;
//! before sending, a transaction too short to have a lane of its own is
//! pointed back at its OS thread, and the OS-thread keys are removed. Used
//! by the transport (continuous profiling) and by transaction profiles (V1)
//! alike, so it sits below both.

use std::io::Write as _;
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

/// The lane a transaction is filed under (`handed` with it, or else its
/// `thread.id`, once [`settle_lane`] left it on a lane), and when the
/// transaction began and ended (nanoseconds since the Unix epoch).
pub(crate) fn lane_window(
    tx: &sentry_core::protocol::Transaction<'_>,
    handed: Option<u64>,
) -> Option<(u64, u64, u64)> {
    let lane = match handed {
        Some(lane) => lane,
        None => match tx.contexts.get("trace") {
            Some(Context::Trace(tc)) => tc.data.get("thread.id")?.as_str()?.parse::<u64>().ok()?,
            _ => return None,
        },
    };
    let ns = |t: std::time::SystemTime| {
        let d = t.duration_since(std::time::UNIX_EPOCH).ok()?;
        u64::try_from(d.as_nanos()).ok()
    };
    let (start, end) = (ns(tx.start_timestamp)?, ns(tx.timestamp?)?);
    (crate::attribution::is_lane(lane) && start <= end).then_some((lane, start, end))
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

/// The `profile` context of a transaction (`key` is `profiler_id` for a
/// continuous profile, `profile_id` for a transaction profile), as a typed
/// context the SDK serialises itself.
///
/// The SDK's `Context` enum has no profile variant: an unknown context is
/// `Context::Other` and serialises with `"type":"unknown"`, which Relay would
/// read as an unknown context rather than a profile context. The map carries
/// its own `"type":"profile"`, which serde writes after the enum's tag:
/// `{"type":"unknown","type":"profile","profiler_id":"…"}`. Relay (and
/// serde_json, and every JSON reader that keeps the last of duplicate keys)
/// reads the object as a map and keeps the last value, so the context is a
/// profile context; Relay writes it out normalised, with one `type`. This
/// keeps the transaction typed all the way to the transport (rate limits,
/// client reports, the application's own transport) at the price of one
/// duplicate key; the `contexts_profile_type` test pins both halves.
pub(crate) fn profile_context(key: &str, id: &str) -> Context {
    let mut ctx = Map::new();
    ctx.insert("type".into(), Value::String("profile".into()));
    ctx.insert(key.into(), Value::String(id.into()));
    Context::Other(ctx)
}

/// Data key: how many times the request's future was polled.
pub const POLLS: &str = "tokio.polls";
/// Data key: milliseconds spent inside those polls (running, or preempted
/// in them).
pub const POLLED: &str = "tokio.polled";
/// Data key: milliseconds from wakes to the polls they caused: waiting for
/// a Tokio worker.
pub const QUEUED: &str = "tokio.queued";
/// Data key: milliseconds neither polled nor queued: waiting for what it
/// awaited.
pub const AWAITING: &str = "tokio.awaiting";
/// Data key (only for a profiled request): milliseconds its future's own
/// polls were shown waiting for a CPU, runnable but not running (the
/// profile's `(waiting for a CPU)` in those polls, up to when its
/// transaction was finished): part of the time polled, and never more.
pub const CPU_WAIT: &str = "tokio.cpu_wait";
/// Data key (only for a profiled request): milliseconds its offloaded work
/// (closures of `spawn_blocking_in_span`, tasks of `spawn_in_span`) ran,
/// waiting for a CPU included: time beside its future's, not part of the
/// duration's three parts.
pub const OFFLOADED: &str = "tokio.offloaded";
/// Data key (only for a profiled request): milliseconds its offloaded work
/// was shown waiting for a CPU: part of [`OFFLOADED`].
pub const OFFLOADED_CPU_WAIT: &str = "tokio.offloaded_cpu_wait";
/// Data key (only for a profiled request): milliseconds its offloaded work
/// waited to start: a closure from its spawn to its start on a blocking
/// thread (the pool's limit reached), a task from its spawn to its first
/// poll and from its wakes to its polls.
pub const OFFLOADED_QUEUED: &str = "tokio.offloaded_queued";
/// Data key: the longest poll, in milliseconds.
pub const LONGEST_POLL: &str = "tokio.longest_poll";
/// Data key (only when there were some): polls at least the long-poll
/// threshold long.
pub const LONG_POLLS: &str = "tokio.long_polls";
/// Data key (only with long polls): when the longest poll began, in seconds
/// since the Unix epoch.
pub const LONGEST_POLL_START: &str = "tokio.longest_poll.start";

/// The poll totals `sentry-profiling-tracing` records on a request's
/// transaction, with the unit each has as a Sentry measurement: nine custom
/// measurements, all valid for Relay (names of letters, digits, `_` and
/// `.`, none a built-in one), within Sentry's default budget of ten per
/// transaction.
pub const TOKIO_MEASUREMENTS: [(&str, &str); 9] = [
    (AWAITING, "millisecond"),
    (CPU_WAIT, "millisecond"),
    (LONGEST_POLL, "millisecond"),
    (OFFLOADED, "millisecond"),
    (OFFLOADED_CPU_WAIT, "millisecond"),
    (OFFLOADED_QUEUED, "millisecond"),
    (POLLED, "millisecond"),
    (POLLS, "none"),
    (QUEUED, "millisecond"),
];

/// [`TOKIO_MEASUREMENTS`] as JSON around each value: the name and the
/// opening of its object, then the unit and the closing (a unit test checks
/// they match).
const MEASUREMENT_JSON: [(&str, &str); 9] = [
    (
        "\"tokio.awaiting\":{\"value\":",
        ",\"unit\":\"millisecond\"}",
    ),
    (
        "\"tokio.cpu_wait\":{\"value\":",
        ",\"unit\":\"millisecond\"}",
    ),
    (
        "\"tokio.longest_poll\":{\"value\":",
        ",\"unit\":\"millisecond\"}",
    ),
    (
        "\"tokio.offloaded\":{\"value\":",
        ",\"unit\":\"millisecond\"}",
    ),
    (
        "\"tokio.offloaded_cpu_wait\":{\"value\":",
        ",\"unit\":\"millisecond\"}",
    ),
    (
        "\"tokio.offloaded_queued\":{\"value\":",
        ",\"unit\":\"millisecond\"}",
    ),
    ("\"tokio.polled\":{\"value\":", ",\"unit\":\"millisecond\"}"),
    ("\"tokio.polls\":{\"value\":", ",\"unit\":\"none\"}"),
    ("\"tokio.queued\":{\"value\":", ",\"unit\":\"millisecond\"}"),
];

/// An instrumented future's poll totals, as its transaction or span
/// carries them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PollTotals {
    /// Polls.
    pub polls: u64,
    /// Time inside polls, ns.
    pub polled_ns: u64,
    /// Time from wakes to the polls they caused, ns.
    pub queued_ns: u64,
    /// Time neither polled nor queued, ns.
    pub awaiting_ns: u64,
    /// The longest poll, ns.
    pub longest_ns: u64,
    /// Polls at least the long-poll threshold long.
    pub long_polls: u64,
    /// When the longest poll began (`CLOCK_REALTIME`, ns).
    pub longest_start_ns: u64,
    /// Time its future's polls were shown waiting for a CPU, ns (see
    /// [`CPU_WAIT`]); `None` for a request not profiled.
    pub cpu_wait_ns: Option<u64>,
    /// Its offloaded work's totals (see [`OFFLOADED`]); `None` for a
    /// request not profiled.
    pub offloaded: Option<Offloaded>,
}

/// The totals of a request's offloaded work, ns each (see [`OFFLOADED`],
/// [`OFFLOADED_CPU_WAIT`], [`OFFLOADED_QUEUED`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Offloaded {
    /// Time it ran, waiting for a CPU included.
    pub ran_ns: u64,
    /// Time it was shown waiting for a CPU.
    pub cpu_wait_ns: u64,
    /// Time it waited to start.
    pub queued_ns: u64,
}

impl PollTotals {
    /// The values of [`TOKIO_MEASUREMENTS`], in its order and in their
    /// units: milliseconds, or a count (`None`: not known).
    fn measurements(&self) -> [Option<Amount>; 9] {
        let off = self.offloaded;
        [
            Some(Amount::Ms(self.awaiting_ns)),
            self.cpu_wait_ns.map(Amount::Ms),
            Some(Amount::Ms(self.longest_ns)),
            off.map(|o| Amount::Ms(o.ran_ns)),
            off.map(|o| Amount::Ms(o.cpu_wait_ns)),
            off.map(|o| Amount::Ms(o.queued_ns)),
            Some(Amount::Ms(self.polled_ns)),
            Some(Amount::Count(self.polls)),
            Some(Amount::Ms(self.queued_ns)),
        ]
    }

    /// The totals as data keys ([`POLLS`] and the rest; the two long-poll
    /// keys only when there were long polls, [`CPU_WAIT`] and the
    /// offloaded ones only when known).
    pub fn data(&self) -> impl Iterator<Item = (&'static str, Value)> + use<> {
        let ms = |ns: u64| Value::from(ns as f64 / 1e6);
        let long = self.long_polls > 0;
        [
            (POLLS, Some(Value::from(self.polls))),
            (POLLED, Some(ms(self.polled_ns))),
            (QUEUED, Some(ms(self.queued_ns))),
            (AWAITING, Some(ms(self.awaiting_ns))),
            (CPU_WAIT, self.cpu_wait_ns.map(ms)),
            (OFFLOADED, self.offloaded.map(|o| ms(o.ran_ns))),
            (
                OFFLOADED_CPU_WAIT,
                self.offloaded.map(|o| ms(o.cpu_wait_ns)),
            ),
            (OFFLOADED_QUEUED, self.offloaded.map(|o| ms(o.queued_ns))),
            (LONGEST_POLL, Some(ms(self.longest_ns))),
            (LONG_POLLS, long.then(|| Value::from(self.long_polls))),
            (
                LONGEST_POLL_START,
                long.then(|| Value::from(self.longest_start_ns as f64 / 1e9)),
            ),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
    }
}

/// A measurement's value, as it is written.
#[derive(Debug, Clone, Copy)]
enum Amount {
    /// Milliseconds, from nanoseconds: written exactly.
    Ms(u64),
    /// A count.
    Count(u64),
    /// A number read back from the transaction's data.
    Float(f64),
}

impl Amount {
    /// Writes the value as a JSON number: a decimal with a fraction, as
    /// serde writes a float. From nanoseconds it is the exact number of
    /// milliseconds, written with integer arithmetic only; below 2^53 ns
    /// (104 days) it reads back as the same `f64` as `ns as f64 / 1e6`
    /// (both are the nearest to the exact quotient).
    fn write(self, out: &mut Vec<u8>) -> std::io::Result<()> {
        let (whole, millionths) = match self {
            Amount::Ms(ns) => (ns / 1_000_000, ns % 1_000_000),
            Amount::Count(n) => (n, 0),
            Amount::Float(v) => return Ok(serde_json::to_writer(&mut *out, &v)?),
        };
        let mut digits = itoa::Buffer::new();
        out.extend_from_slice(digits.format(whole).as_bytes());
        out.push(b'.');
        if millionths == 0 {
            out.push(b'0');
            return Ok(());
        }
        // Six digits after the point, less the trailing zeros.
        let (mut fraction, mut width) = (millionths, 6);
        while fraction % 10 == 0 {
            fraction /= 10;
            width -= 1;
        }
        let fraction = digits.format(fraction).as_bytes();
        out.extend(std::iter::repeat_n(b'0', width - fraction.len()));
        out.extend_from_slice(fraction);
        Ok(())
    }
}

/// What a request hands the transport with its transaction (see
/// [`finish_handed`]).
#[derive(Debug, Default)]
pub struct Handover {
    /// The request's poll totals.
    pub totals: Option<PollTotals>,
    /// The lane the transaction is filed under, when the transaction was
    /// not tagged with it: the transport tags it.
    pub lane: Option<HandedLane>,
}

/// A lane handed with its transaction (see [`Handover`]), which names it:
/// the transaction's `thread.name` is its own name. (The lane's name, an
/// `Arc` its worker shares between requests, is not handed over: the
/// transport's thread dropping a copy of it at every request took its
/// reference count's cache line from the worker's core.)
#[derive(Debug)]
pub struct HandedLane {
    /// The lane id, the transaction's `thread.id`.
    pub id: u64,
}

thread_local! {
    /// What is handed to the transport with the transaction being
    /// finished on this thread (see [`finish_handed`]). Stays because the
    /// SDK's `Transaction::finish` carries nothing but the transaction to
    /// the transport, which it calls on this thread.
    static HANDED: std::cell::Cell<Option<Handover>> = const { std::cell::Cell::new(None) };
}

/// Runs `finish` (a transaction's `finish`) with `handed` given to the
/// transport, which the SDK calls on this thread, within `finish`, if the
/// transaction is sent. The transport writes it where it costs least: the
/// crate's transaction sender on its own thread (the totals as
/// measurements); any other transport on this thread, after the SDK has
/// copied the transaction's trace context, so the keys are made once and
/// not copied.
pub fn finish_handed(handed: Handover, finish: impl FnOnce()) {
    let _ = HANDED.try_with(|h| h.set(Some(handed)));
    finish();
    // Not sent (not sampled, or no client): nothing is left for the next.
    let _ = HANDED.try_with(|h| h.set(None));
}

/// What was handed with the transaction being sent, if anything (see
/// [`finish_handed`]).
pub(crate) fn take_handed() -> Option<Handover> {
    HANDED.try_with(std::cell::Cell::take).ok().flatten()
}

/// Tags a transaction with the lane handed with it, as the tracing layer
/// tags the spans it sees.
pub(crate) fn insert_lane(tx: &mut sentry_core::protocol::Transaction<'_>, lane: &HandedLane) {
    let name = tx.name.clone();
    if let Some(Context::Trace(trace)) = tx.contexts.get_mut("trace") {
        trace
            .data
            .insert("thread.id".into(), Value::String(lane.id.to_string()));
        match name {
            Some(name) => trace.data.insert("thread.name".into(), Value::String(name)),
            None => trace.data.remove("thread.name"),
        };
    }
}

/// Writes `totals` as data on every transaction of `tx`'s trace context.
pub(crate) fn insert_totals_data(
    tx: &mut sentry_core::protocol::Transaction<'_>,
    totals: &PollTotals,
) {
    if let Some(Context::Trace(trace)) = tx.contexts.get_mut("trace") {
        for (key, value) in totals.data() {
            trace.data.insert(key.to_owned(), value);
        }
    }
}

/// A transaction as JSON, with its poll totals (see [`TOKIO_MEASUREMENTS`])
/// copied into `measurements` as well and, given `profiler_id`, a
/// `profile` context naming it first among its contexts, appended to
/// `out`.
///
/// The SDK's typed transaction (sentry-types 0.49) has no `measurements`
/// field, so a transaction the SDK serialises carries the totals as trace
/// data only (Sentry keeps them as the transaction's attributes); where this
/// crate writes the transaction itself (its HTTP delivery's transaction
/// sender, transaction profiles, the envelope directory) they also become
/// measurements.
fn write_transaction_json(
    out: &mut Vec<u8>,
    tx: &sentry_core::protocol::Transaction<'_>,
    totals: Option<&PollTotals>,
    profiler_id: Option<&str>,
    lane: Option<&HandedLane>,
) -> std::io::Result<()> {
    if profiler_id.is_none() && lane.is_none() {
        serde_json::to_writer(&mut *out, tx)?;
    } else if !write_linked(out, tx, profiler_id, lane)?
        && let Some(lane) = lane
    {
        // No trace context data to write the lane into (the transport
        // hands a lane over only where there is): tagged the slow way.
        let mut tagged = tx.clone();
        insert_lane(&mut tagged, lane);
        return write_transaction_json(out, &tagged, totals, profiler_id, None);
    }
    append_measurements(out, tx, totals)
}

/// Writes `tx` with a `profile` context naming `profiler_id` and the lane's
/// keys in its trace context's data; `false` (nothing written) when `lane`
/// is given and the transaction has no trace context data to write it into.
fn write_linked(
    out: &mut Vec<u8>,
    tx: &sentry_core::protocol::Transaction<'_>,
    profiler_id: Option<&str>,
    lane: Option<&HandedLane>,
) -> std::io::Result<bool> {
    // The profile context is written as the transaction is, first
    // among its contexts, and the lane's keys first in its trace
    // context's data: nothing is copied, and nothing is allocated for
    // a profiler id of up to 80 bytes (the session's are 32 hex
    // digits) or a transaction name of up to 150 (longer ones are
    // written from the heap). A linked transaction is written as an unlinked
    // one is, so the sender allocates the same whether or not the
    // profiler runs (see BENCHMARKS.md).
    let (mut profile_stack, mut profile_spill) = ([0u8; 128], Vec::new());
    let profile = match profiler_id {
        Some(id) => Some(member_bytes(&mut profile_stack, &mut profile_spill, |w| {
            w.write_all(b"\"profile\":{\"type\":\"profile\",\"profiler_id\":")?;
            serde_json::to_writer(&mut *w, id)?;
            w.write_all(b"}")
        })?),
        None => None,
    };
    let (mut stack, mut spill) = ([0u8; 192], Vec::new());
    let lane_keys = match lane {
        Some(lane) => Some(member_bytes(&mut stack, &mut spill, |w| {
            w.write_all(b"\"thread.id\":\"")?;
            w.write_all(itoa::Buffer::new().format(lane.id).as_bytes())?;
            w.write_all(b"\"")?;
            if let Some(name) = &tx.name {
                w.write_all(b",\"thread.name\":")?;
                serde_json::to_writer(&mut *w, name)?;
            }
            Ok(())
        })?),
        None => None,
    };
    let start = out.len();
    let written = crate::json_link::write_with_members(
        out,
        tx,
        &crate::json_link::TRACE_DATA,
        &[profile, None, lane_keys],
    )?;
    if lane.is_some() && written & 0b100 == 0 {
        out.truncate(start);
        return Ok(false);
    }
    if profile.is_some() && written & 1 == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the transaction has no contexts to link",
        ));
    }
    Ok(true)
}

/// Appends the transaction's poll totals as `measurements` (from `totals`
/// when handed, else from its trace data) to its JSON object in `out`.
fn append_measurements(
    out: &mut Vec<u8>,
    tx: &sentry_core::protocol::Transaction<'_>,
    totals: Option<&PollTotals>,
) -> std::io::Result<()> {
    let data = match tx.contexts.get("trace") {
        Some(Context::Trace(trace)) => Some(&trace.data),
        _ => None,
    };
    let handed = totals.map(PollTotals::measurements);
    let mut measurements = TOKIO_MEASUREMENTS
        .iter()
        .enumerate()
        .filter_map(|(i, &(name, _))| {
            // The same numbers as the data keys, from wherever they are.
            let value = match handed {
                Some(values) => values[i]?,
                None => {
                    let v = data?.get(name)?.as_f64()?;
                    Amount::Float(Some(v).filter(|v| v.is_finite() && *v >= 0.0)?)
                }
            };
            Some((i, value))
        })
        .peekable();
    // The typed transaction has no `measurements` of its own (a unit test
    // pins that), so its object closes with the last field: the
    // measurements go just before the closing brace, with no second pass
    // over the JSON.
    if measurements.peek().is_none() || out.last() != Some(&b'}') {
        return Ok(());
    }
    out.pop();
    out.extend_from_slice(b",\"measurements\":{");
    for (n, (i, value)) in measurements.enumerate() {
        if n > 0 {
            out.push(b',');
        }
        // The name and unit around the value, each written whole.
        let (before, after) = MEASUREMENT_JSON[i];
        out.extend_from_slice(before.as_bytes());
        value.write(out)?;
        out.extend_from_slice(after.as_bytes());
    }
    out.extend_from_slice(b"}}");
    Ok(())
}

/// The bytes `write` writes, in `stack` when they fit, else in `spill`.
fn member_bytes<'b>(
    stack: &'b mut [u8],
    spill: &'b mut Vec<u8>,
    write: impl Fn(&mut dyn std::io::Write) -> std::io::Result<()>,
) -> std::io::Result<&'b [u8]> {
    let room = stack.len();
    let mut cursor = &mut stack[..];
    match write(&mut cursor) {
        Ok(()) => {
            let len = room - cursor.len();
            Ok(&stack[..len])
        }
        Err(_) => {
            spill.clear();
            write(spill)?;
            Ok(&spill[..])
        }
    }
}

/// Whether a transaction is filed under a thread: its trace context's data
/// has a `thread.id`.
pub(crate) fn is_profiled(tx: &sentry_core::protocol::Transaction<'_>) -> bool {
    matches!(tx.contexts.get("trace"), Some(Context::Trace(t)) if t.data.contains_key("thread.id"))
}

/// An envelope's bytes as the SDK writes them, except that its
/// transactions are written by this crate: straight into the envelope's
/// buffer (the SDK writes each item to a buffer of its own, grown as it
/// goes, and copies it over), with their poll totals (as data, or `totals`
/// handed with it) as measurements too, tagged with the `lane` handed over
/// with the first (which makes it profiled), and linked to `profiler_id`
/// when profiled (see [`write_transaction_json`]). An envelope without a
/// transaction is the SDK's.
pub(crate) fn envelope_bytes(
    envelope: &sentry_core::Envelope,
    totals: Option<&PollTotals>,
    profiler_id: Option<&str>,
    mut lane: Option<&HandedLane>,
) -> std::io::Result<Vec<u8>> {
    use sentry_core::protocol::EnvelopeItem;
    // Room for a typical transaction: its bytes grow without a copy.
    let mut bytes = Vec::with_capacity(2048);
    if !envelope
        .items()
        .any(|i| matches!(i, EnvelopeItem::Transaction(_)))
    {
        envelope.to_writer(&mut bytes)?;
        return Ok(bytes);
    }
    serde_json::to_writer(&mut bytes, envelope.headers())?;
    bytes.push(b'\n');
    let mut rest = sentry_core::Envelope::new();
    for item in envelope.items() {
        match item {
            EnvelopeItem::Transaction(tx) => {
                // A lane handed over goes to the first transaction.
                let lane = lane.take();
                let id = profiler_id.filter(|_| {
                    (lane.is_some() || is_profiled(tx)) && !tx.contexts.contains_key("profile")
                });
                write_transaction(&mut bytes, tx, totals, id, lane)?;
            }
            // Typically the SDK's client report: written by the SDK, less
            // its (empty) header line.
            other => rest.add_item(other.clone()),
        }
    }
    if rest.items().next().is_some() {
        let mut others = Vec::new();
        rest.to_writer(&mut others)?;
        let body = others.iter().position(|b| *b == b'\n').map_or(0, |i| i + 1);
        bytes.extend_from_slice(&others[body..]);
    }
    Ok(bytes)
}

/// Appends a transaction item to raw envelope bytes (see
/// [`write_transaction_json`]).
pub(crate) fn write_transaction(
    bytes: &mut Vec<u8>,
    tx: &sentry_core::protocol::Transaction<'_>,
    totals: Option<&PollTotals>,
    profiler_id: Option<&str>,
    lane: Option<&HandedLane>,
) -> std::io::Result<()> {
    let start = bytes.len();
    write_transaction_json(bytes, tx, totals, profiler_id, lane)?;
    let len = bytes.len() - start;
    let mut header = [0u8; 64];
    let mut cursor = &mut header[..];
    cursor.write_all(b"{\"type\":\"transaction\",\"length\":")?;
    serde_json::to_writer(&mut cursor, &len)?;
    cursor.write_all(b"}\n")?;
    let written = 64 - cursor.len();
    let header = &header[..written];
    // The item header goes before the JSON, whose length it gives: the
    // JSON moves up by one copy.
    let end = bytes.len();
    bytes.extend_from_slice(header);
    bytes.copy_within(start..end, start + header.len());
    bytes[start..start + header.len()].copy_from_slice(header);
    bytes.push(b'\n');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SDK writes the profile context with the enum's `"type":"unknown"`
    /// first and the map's `"type":"profile"` after it; a reader that keeps
    /// the last of duplicate keys (Relay's `Value` is a `BTreeMap` filled
    /// in order, as is serde_json's) sees a profile context.
    #[test]
    fn poll_totals_become_measurements_where_the_crate_writes_the_transaction() {
        let mut tx = sentry_core::protocol::Transaction::default();
        let mut trace = sentry_core::protocol::TraceContext::default();
        trace.data.insert("tokio.polls".into(), Value::from(3));
        trace.data.insert("tokio.queued".into(), Value::from(1.5));
        trace
            .data
            .insert("tokio.awaiting".into(), Value::from(-1.0));
        trace.data.insert("other".into(), Value::from(7));
        tx.contexts
            .insert("trace".into(), Context::Trace(Box::new(trace)));
        let mut bytes = Vec::new();
        write_transaction_json(&mut bytes, &tx, None, None, None).unwrap();
        // The typed transaction writes no `measurements` of its own (were a
        // newer sentry-types to add them, the key would appear twice).
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert_eq!(text.matches("\"measurements\"").count(), 1, "{text}");
        let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let m = &json["measurements"];
        assert_eq!(
            m["tokio.polls"],
            serde_json::json!({"value": 3.0, "unit": "none"})
        );
        assert_eq!(
            m["tokio.queued"],
            serde_json::json!({"value": 1.5, "unit": "millisecond"})
        );
        assert!(
            m.get("tokio.awaiting").is_none(),
            "a negative value is left out"
        );
        assert!(m.get("other").is_none());
        // The data stays as it was.
        assert_eq!(json["contexts"]["trace"]["data"]["tokio.polls"], 3);
        // Without totals, the SDK's own serialisation.
        let plain = sentry_core::protocol::Transaction::default();
        let mut bytes = Vec::new();
        write_transaction_json(&mut bytes, &plain, None, None, None).unwrap();
        assert_eq!(bytes, serde_json::to_vec(&plain).unwrap());
    }

    #[test]
    fn the_measurements_json_names_each_measurement_with_its_unit() {
        for ((name, unit), (before, after)) in TOKIO_MEASUREMENTS.iter().zip(MEASUREMENT_JSON) {
            let json: serde_json::Value =
                serde_json::from_str(&format!("{{{before}1.5{after}}}")).unwrap();
            assert_eq!(
                json,
                serde_json::json!({*name: {"value": 1.5, "unit": unit}})
            );
        }
    }

    /// Milliseconds from nanoseconds are written exactly, and read back
    /// as the same number a float division gives; counts are written as
    /// serde writes a float.
    #[test]
    fn amounts_read_back_as_the_floats_they_stand_for() {
        let written = |a: Amount| {
            let mut out = Vec::new();
            a.write(&mut out).unwrap();
            String::from_utf8(out).unwrap()
        };
        assert_eq!(written(Amount::Ms(20_300)), "0.0203");
        assert_eq!(written(Amount::Ms(0)), "0.0");
        assert_eq!(written(Amount::Ms(3_000_000)), "3.0");
        assert_eq!(written(Amount::Ms(1_000_001)), "1.000001");
        assert_eq!(written(Amount::Count(2)), "2.0");
        assert_eq!(written(Amount::Float(1.5)), "1.5");
        // Every duration below 2^53 ns (104 days), read by a correctly
        // rounding parser.
        let mut ns = 1u64;
        while ns < 1 << 53 {
            for v in [ns, ns + 1, ns * 7 / 3, ns - 1] {
                let text = written(Amount::Ms(v));
                let back: f64 = text.parse().unwrap();
                assert_eq!(back, v as f64 / 1e6, "{v} ns written {text}");
            }
            ns = ns * 3 + 1;
        }
    }

    /// Every transaction goes through the crate's writer; one with nothing
    /// to add comes out as the SDK writes it, whatever else the envelope
    /// holds.
    #[test]
    fn a_transaction_with_nothing_to_add_is_written_as_the_sdk_writes_it() {
        use sentry_core::protocol::{Attachment, ClientSdkInfo, EnvelopeItem, Transaction};
        let tx = Transaction {
            name: Some("GET /quote\"d".into()),
            sdk: Some(std::borrow::Cow::Owned(ClientSdkInfo {
                name: "sentry.rust".into(),
                version: "0.49.0".into(),
                integrations: vec![],
                packages: vec![],
            })),
            ..Default::default()
        };
        let mut envelope = sentry_core::Envelope::new();
        envelope.add_item(EnvelopeItem::Transaction(Box::new(tx)));
        envelope.add_item(EnvelopeItem::Attachment(Attachment {
            buffer: b"after the transaction".to_vec(),
            filename: "notes.txt".into(),
            ..Default::default()
        }));
        let mut sdk = Vec::new();
        envelope.to_writer(&mut sdk).unwrap();
        assert_eq!(
            String::from_utf8(envelope_bytes(&envelope, None, None, None).unwrap()).unwrap(),
            String::from_utf8(sdk).unwrap()
        );
    }

    /// Totals handed with a transaction (the transaction sender's case)
    /// become the same measurements as the data keys they would be, each
    /// under its own name, and the item header gives the JSON's length.
    #[test]
    fn handed_totals_are_written_as_their_data_values() {
        let totals = PollTotals {
            polls: 7,
            polled_ns: 1_250_000,
            queued_ns: 2_500_000,
            awaiting_ns: 3_750_000,
            longest_ns: 500_000,
            long_polls: 0,
            longest_start_ns: 0,
            cpu_wait_ns: Some(620_000),
            offloaded: Some(Offloaded {
                ran_ns: 4_000_000,
                cpu_wait_ns: 250_000,
                queued_ns: 1_500_000,
            }),
        };
        let mut bytes = b"head\n".to_vec();
        let tx = sentry_core::protocol::Transaction::default();
        write_transaction(&mut bytes, &tx, Some(&totals), None, None).unwrap();
        let text = std::str::from_utf8(&bytes).unwrap();
        let mut lines = text.strip_prefix("head\n").unwrap().lines();
        let header: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
        let body = lines.next().unwrap();
        assert_eq!(header["type"], "transaction");
        assert_eq!(header["length"], body.len());
        assert!(text.ends_with('\n'));
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        let data: std::collections::HashMap<_, _> = totals.data().collect();
        for (name, unit) in TOKIO_MEASUREMENTS {
            let m = &json["measurements"][name];
            assert_eq!(m["value"].as_f64(), data[name].as_f64(), "{name}");
            assert_eq!(m["unit"], unit, "{name}");
        }
        assert_eq!(json["measurements"]["tokio.cpu_wait"]["value"], 0.62);
        // A request not profiled has no time waiting for a CPU to show.
        let unprofiled = PollTotals {
            cpu_wait_ns: None,
            offloaded: None,
            ..totals
        };
        let mut bytes = Vec::new();
        write_transaction_json(&mut bytes, &tx, Some(&unprofiled), None, None).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert!(json["measurements"].get("tokio.cpu_wait").is_none());
        assert!(json["measurements"].get("tokio.polled").is_some());
        assert!(!unprofiled.data().any(|(k, _)| k == CPU_WAIT));
    }

    #[test]
    fn contexts_profile_type() {
        let mut tx = sentry_core::protocol::Transaction::default();
        tx.contexts.insert(
            "profile".into(),
            profile_context("profiler_id", "0123456789abcdef0123456789abcdef"),
        );
        let json = serde_json::to_string(&tx).unwrap();
        let unknown = json.find(r#""type":"unknown""#).expect(&json);
        let profile = json.find(r#""type":"profile""#).expect(&json);
        assert!(unknown < profile, "the map's type comes last: {json}");
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["contexts"]["profile"]["type"], "profile");
        assert_eq!(
            v["contexts"]["profile"]["profiler_id"],
            "0123456789abcdef0123456789abcdef"
        );
    }
}
