//! Transaction-based profiles (sample format V1), for Sentry installations
//! that predate continuous profiling.
//!
//! With `profiles_sample_rate` or `profiles_sampler` set, each sampled
//! transaction is profile-sampled when it starts; the one sampler runs while
//! any such transaction is active. When the transaction's envelope reaches
//! the transport, it is handed to the profiler thread (never blocking the
//! application), which waits until the samples up to the transaction's end
//! have arrived, cuts the transaction's window out of its rolling sample
//! buffer (filed by lane, as chunks are), validates the profile as Relay
//! would, and sends transaction and profile in one envelope.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sentry_core::protocol::{
    Context, Envelope, EnvelopeHeaders, EnvelopeItem, Map, Transaction, Value,
};

use crate::attribution::{Lanes, ThreadAttribution};
use crate::chunk::Chunk;
use crate::encode::sentry_chunk::{V1Meta, encode_v1};
use crate::symbolize::Symbolizer;
use crate::unwind::ModuleSet;

/// Decides per transaction, by name, the share to profile (0.0 to 1.0).
pub(crate) type ProfilesSampler = Arc<dyn Fn(&str) -> f64 + Send + Sync>;

/// Transaction data key marking a transaction to profile; removed before
/// sending.
pub(crate) const V1_MARKER: &str = "sentry_profiling.profile_v1";

/// Longest V1 profile Relay accepts.
pub(crate) const MAX_V1_DURATION: Duration = Duration::from_secs(30);
/// Largest V1 profile Relay accepts.
const MAX_V1_BYTES: usize = 50 * 1024 * 1024;
/// How long the profiler thread waits for samples up to a transaction's end.
pub(crate) const V1_SETTLE: Duration = Duration::from_millis(150);

/// How V1 profiling samples transactions.
#[derive(Clone)]
pub(crate) struct V1Config {
    pub(crate) rate: Option<f64>,
    pub(crate) sampler: Option<ProfilesSampler>,
}

impl std::fmt::Debug for V1Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("V1Config")
            .field("rate", &self.rate)
            .field("sampler", &self.sampler.is_some())
            .finish()
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl V1Config {
    /// Whether the transaction of root span `lane` named `name` is
    /// profiled. A pure function of its inputs (and a per-process seed), so
    /// the layer and the middleware agree without sharing state.
    pub(crate) fn sampled(&self, lane: u64, name: &str) -> bool {
        static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        let p = match &self.sampler {
            Some(f) => f(name),
            None => self.rate.unwrap_or(0.0),
        };
        if !(0.0..=1.0).contains(&p) {
            static WARNED: std::sync::atomic::AtomicBool =
                std::sync::atomic::AtomicBool::new(false);
            if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                eprintln!(
                    "sentry-profiling: `profiles_sampler`/`profiles_sample_rate` gave {p} for {name:?}, outside 0.0..=1.0; NaN and negative values profile nothing, values above 1 profile everything (warned once)"
                );
            }
        }
        // NaN and non-positive rates profile nothing.
        if p.is_nan() || p <= 0.0 {
            return false;
        }
        let seed = *SEED.get_or_init(rand::random);
        (splitmix(lane ^ seed) as f64 / u64::MAX as f64) < p.min(1.0)
    }
}

/// Transaction-based (V1) profiles not sent, by reason (in
/// [`ProfilerStats::transaction_profiles_dropped`](crate::ProfilerStats)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransactionProfileDrops {
    /// The profile had fewer than 2 samples (Sentry rejects those).
    pub too_few_samples: u64,
    /// The transaction lasted longer than 30 s (Sentry's bound for V1).
    pub too_long: u64,
    /// The encoded profile was larger than 50 MiB.
    pub too_large: u64,
    /// Something a V1 profile requires was missing: the client's
    /// `release`, the transaction's name or trace id, or its thread.
    pub missing_metadata: u64,
    /// The queue of transactions waiting for their profile was full; the
    /// transaction was sent without one.
    pub queue_full: u64,
}

impl TransactionProfileDrops {
    /// From the runtime's counters, in the order of the fields.
    pub(crate) fn from_counts(c: [u64; 5]) -> Self {
        Self {
            too_few_samples: c[0],
            too_long: c[1],
            too_large: c[2],
            missing_metadata: c[3],
            queue_full: c[4],
        }
    }
}

/// Why a V1 profile was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum V1Drop {
    TooFewSamples,
    TooLong,
    TooLarge,
    MissingMetadata,
}

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
        crate::transport::settle_lane(&mut self.tx, Duration::from_nanos(ctx.period_ns));
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
                let mut p = Map::new();
                p.insert("profile_id".into(), Value::String(id));
                self.tx.contexts.insert("profile".into(), Context::Other(p));
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
        crate::transport::write_transaction(&mut bytes, &self.tx);
        if let Some(json) = profile_item {
            bytes.extend_from_slice(
                format!(
                    "{{\"type\":\"profile\",\"platform\":\"rust\",\"length\":{}}}\n",
                    json.len()
                )
                .as_bytes(),
            );
            bytes.extend_from_slice(&json);
            bytes.push(b'\n');
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
                .fill_suspended(&mut window, ctx.period_ns, self.end_ns);
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

/// What building a V1 profile needs from the profiler thread.
pub(crate) struct V1Context<'a> {
    pub(crate) lanes: &'a Lanes,
    pub(crate) attribution: ThreadAttribution,
    pub(crate) modules: &'a ModuleSet,
    pub(crate) period_ns: u64,
    pub(crate) release: &'a str,
    pub(crate) environment: Option<&'a str>,
    pub(crate) os_version: &'a str,
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
