//! Transaction-based profiles (sample format V1), for Sentry installations
//! that predate continuous profiling.
//!
//! With `profiles_sample_rate` or `profiles_sampler` set, each sampled
//! transaction is profile-sampled when it starts; the one sampler runs while
//! any such transaction is active. When the transaction's envelope reaches
//! the transport, it is handed to the chunk thread (never blocking the
//! application), which waits until the samples up to the transaction's end
//! have arrived, cuts the transaction's window out of its rolling sample
//! buffer (filed by lane, as chunks are), validates the profile as Relay
//! would, and sends transaction and profile in one envelope.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sentry_core::protocol::{Context, Envelope, EnvelopeHeaders, EnvelopeItem, Transaction, Value};

use crate::attribution::ThreadAttribution;
use crate::chunk::Chunk;
use crate::encode::sentry_v1::{V1Meta, encode_v1};
use crate::symbolize::Symbolizer;

pub(crate) use crate::session::v1::ProfilesSampler;
pub(crate) use crate::session::v1::V1Config;
use crate::session::v1::{PendingProfile, V1Context, V1Drop};

/// Transaction data key marking a transaction to profile; removed before
/// sending.
pub(crate) const V1_MARKER: &str = "sentry_profiling.profile_v1";

/// Longest V1 profile Relay accepts.
pub(crate) const MAX_V1_DURATION: Duration = Duration::from_secs(30);
/// Largest V1 profile Relay accepts.
const MAX_V1_BYTES: usize = 50 * 1024 * 1024;
/// How long the chunk thread waits for samples up to a transaction's end.
pub(crate) const V1_SETTLE: Duration = Duration::from_millis(150);

/// A transaction envelope waiting for its profile.
pub(crate) struct V1Pending {
    headers: EnvelopeHeaders,
    others: Vec<EnvelopeItem>,
    tx: Box<Transaction<'static>>,
    start_ns: u64,
    end_ns: u64,
    received: Instant,
}

impl std::fmt::Debug for V1Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("V1Pending")
            .field("end_ns", &self.end_ns)
            .finish_non_exhaustive()
    }
}

fn ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn marked(tx: &Transaction<'_>) -> bool {
    matches!(tx.contexts.get("trace"), Some(Context::Trace(t)) if t.data.contains_key(V1_MARKER))
}

/// What [`intercept`] gives back: the envelope to profile, taken apart, or
/// the envelope unchanged.
pub(crate) enum Intercepted {
    /// A transaction to profile.
    Profile(V1Pending),
    /// Anything else.
    Pass(Envelope),
}

/// Takes the envelope apart if it carries a transaction to profile.
pub(crate) fn intercept(envelope: Envelope) -> Intercepted {
    if !envelope
        .items()
        .any(|i| matches!(i, EnvelopeItem::Transaction(t) if marked(t)))
    {
        return Intercepted::Pass(envelope);
    }
    let headers = envelope.headers().clone();
    let mut tx = None;
    let mut others = Vec::new();
    for item in envelope.into_items() {
        match item {
            EnvelopeItem::Transaction(t) if tx.is_none() && marked(&t) => tx = Some(t),
            other => others.push(other),
        }
    }
    let Some(tx) = tx else {
        // Unreachable (checked above), but never worth a panic.
        let mut envelope = Envelope::new().with_headers(headers);
        for item in others {
            envelope.add_item(item);
        }
        return Intercepted::Pass(envelope);
    };
    let start_ns = ns(tx.start_timestamp);
    let end_ns = tx.timestamp.map_or(start_ns, ns);
    Intercepted::Profile(V1Pending {
        headers,
        others,
        tx,
        start_ns,
        end_ns,
        received: Instant::now(),
    })
}

impl V1Pending {
    /// Whether the samples up to the transaction's end have (or should
    /// have) arrived.
    pub(crate) fn ready(&self, newest_sample_ns: u64) -> bool {
        newest_sample_ns >= self.end_ns || self.received.elapsed() >= V1_SETTLE
    }

    /// The envelope as it came, without a profile (the marker removed).
    pub(crate) fn without_profile(mut self) -> Envelope {
        if let Some(Context::Trace(t)) = self.tx.contexts.get_mut("trace") {
            t.data.remove(V1_MARKER);
        }
        let mut envelope = Envelope::new().with_headers(self.headers);
        envelope.add_item(EnvelopeItem::Transaction(self.tx));
        for item in self.others {
            envelope.add_item(item);
        }
        envelope
    }

    /// When the transaction started.
    pub(crate) fn start_ns(&self) -> u64 {
        self.start_ns
    }

    /// Builds the envelope: the transaction, linked to its profile when the
    /// profile is valid, and the profile.
    pub(crate) fn finish(
        mut self,
        buffer: &Chunk,
        ctx: &V1Context<'_>,
        symbolizer: &mut Option<&mut Symbolizer>,
    ) -> (Envelope, Option<V1Drop>) {
        crate::transaction_tags::settle_lane(&mut self.tx, Duration::from_nanos(ctx.period_ns));
        let mut active_thread = String::new();
        let mut trace_id = String::new();
        if let Some(Context::Trace(t)) = self.tx.contexts.get_mut("trace") {
            t.data.remove(V1_MARKER);
            if let Some(Value::String(id)) = t.data.get("thread.id") {
                active_thread = id.clone();
            }
            trace_id = t.trace_id.to_string();
        }
        let profile = self.profile(buffer, ctx, symbolizer, &active_thread, &trace_id);
        let (profile_item, dropped) = match profile {
            Ok((id, json)) => {
                self.tx.contexts.insert(
                    "profile".into(),
                    crate::transaction_tags::profile_context("profile_id", &id),
                );
                (Some(json), None)
            }
            Err(reason) => (None, Some(reason)),
        };
        let mut rest = Envelope::new().with_headers(self.headers);
        for item in self.others {
            rest.add_item(item);
        }
        let mut bytes = Vec::new();
        let _ = rest.to_writer(&mut bytes);
        // Writing to memory fails only for JSON serde cannot write (a map
        // with non-string keys), which the typed transaction has none of.
        let _ = crate::transaction_tags::write_transaction(&mut bytes, &self.tx, None, None, None);
        if let Some(json) = profile_item {
            crate::encode::envelope::append_item(
                &mut bytes,
                r#""type":"profile","platform":"rust""#,
                &json,
            );
        }
        (Envelope::from_bytes_raw(bytes).unwrap_or_default(), dropped)
    }

    fn profile(
        &self,
        buffer: &Chunk,
        ctx: &V1Context<'_>,
        symbolizer: &mut Option<&mut Symbolizer>,
        active_thread: &str,
        trace_id: &str,
    ) -> Result<(String, Vec<u8>), V1Drop> {
        let name = self.tx.name.clone().unwrap_or_default();
        if ctx.release.is_empty()
            || name.is_empty()
            || trace_id.is_empty()
            || active_thread.is_empty()
        {
            return Err(V1Drop::MissingMetadata);
        }
        if self.end_ns.saturating_sub(self.start_ns) > MAX_V1_DURATION.as_nanos() as u64 {
            return Err(V1Drop::TooLong);
        }
        let mut window = buffer.window(self.start_ns, self.end_ns);
        if ctx.attribution == ThreadAttribution::Lanes {
            ctx.lanes
                .fill_window(&mut window, ctx.period_ns, self.end_ns);
            ctx.lanes
                .add_poll_edges(&mut window, ctx.period_ns, self.start_ns, self.end_ns);
            ctx.lanes.estimate_uncaptured(&mut window);
        }
        let keys = ctx.lanes.thread_keys(&window, ctx.attribution);
        // As in chunks: a worker's OS thread shows `(running a request)`
        // where it polled requests, so no gap is charged to its last stack.
        let keys = crate::encode::synthetic::mark_running_requests(&mut window, keys);
        let keyed: Vec<(u64, Option<Arc<str>>)> = keys
            .iter()
            .map(|k| k.clone().unwrap_or((0, None)))
            .collect();
        let mut order: Vec<usize> = (0..window.len()).filter(|&i| keyed[i].0 != 0).collect();
        order.sort_by_key(|&i| window.samples()[i].timestamp_ns);
        if order.len() < 2 {
            return Err(V1Drop::TooFewSamples);
        }
        let meta = V1Meta {
            release: ctx.release.to_owned(),
            environment: ctx.environment.map(str::to_owned),
            transaction_id: self.tx.event_id.simple().to_string(),
            transaction_name: name,
            trace_id: trace_id.to_owned(),
            active_thread_id: active_thread.to_owned(),
            start_rfc3339: rfc3339(self.start_ns),
            start_ns: self.start_ns,
            os_version: ctx.os_version.to_owned(),
        };
        let (id, json) = encode_v1(&meta, &window, ctx.modules, symbolizer, &keyed, &order);
        if json.len() > MAX_V1_BYTES {
            return Err(V1Drop::TooLarge);
        }
        Ok((id, json))
    }
}

/// RFC 3339 UTC with microseconds, from nanoseconds since the epoch.
pub(crate) fn rfc3339(ns: u64) -> String {
    let secs = (ns / 1_000_000_000) as i64;
    let micros = (ns % 1_000_000_000) / 1000;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since the epoch (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

impl PendingProfile for V1Pending {
    fn start_ns(&self) -> u64 {
        V1Pending::start_ns(self)
    }

    fn ready(&self, newest_sample_ns: u64) -> bool {
        V1Pending::ready(self, newest_sample_ns)
    }

    fn without_profile(self: Box<Self>) -> Envelope {
        V1Pending::without_profile(*self)
    }

    fn finish(
        self: Box<Self>,
        buffer: &Chunk,
        ctx: &V1Context<'_>,
        symbolizer: &mut Option<&mut Symbolizer>,
    ) -> (Envelope, Option<V1Drop>) {
        V1Pending::finish(*self, buffer, ctx, symbolizer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            rfc3339(1_795_348_593_797_392_362),
            "2026-11-22T11:56:33.797392Z"
        );
        assert_eq!(
            rfc3339(951_782_400_000_000_000),
            "2000-02-29T00:00:00.000000Z"
        );
    }

    #[test]
    fn sampling_is_deterministic_per_lane_and_follows_the_rate() {
        let c = V1Config {
            rate: Some(0.25),
            sampler: None,
        };
        let hits = (0..10_000u64).filter(|&l| c.sampled(l, "x")).count();
        assert!((2_000..3_000).contains(&hits), "{hits}");
        assert_eq!(c.sampled(42, "x"), c.sampled(42, "x"));
        let by_name = V1Config {
            rate: None,
            sampler: Some(Arc::new(
                |name: &str| if name == "GET /slow" { 1.0 } else { 0.0 },
            )),
        };
        assert!(by_name.sampled(7, "GET /slow") && !by_name.sampled(7, "GET /fast"));
        let nan = V1Config {
            rate: Some(f64::NAN),
            sampler: None,
        };
        assert!(!nan.sampled(1, "x"));
    }
}
