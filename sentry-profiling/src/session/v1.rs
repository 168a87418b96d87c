//! Transaction-based (V1) profiling's part of the session: which
//! transactions are profiled ([`V1Config`]), the queue of transactions
//! waiting for their samples, and their writer on the chunk thread
//! ([`ProfileWriter`], in place of the chunk writer), which builds their
//! profiles. The Sentry glue (`transaction_profile`) intercepts transaction
//! envelopes and hands them over as [`PendingProfile`]s; the session never
//! looks inside an envelope.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use sentry_core::protocol::Envelope;

use super::desk::{Desk, Writer};
use super::intake::Batch;
use crate::attribution::ThreadAttribution;
use crate::chunk::Chunk;
use crate::lanes::{Lanes, now_ns};
use crate::symbolize::Symbolizer;
use crate::unwind::ModuleSet;

/// Transactions waiting for their V1 profile, at most.
pub(super) const V1_QUEUE: usize = 256;
/// How much sample history V1 mode keeps (the longest profile, and slack).
const V1_HISTORY: Duration = Duration::from_secs(35);

/// How long transaction profiling keeps sampling without an active root
/// span before it pauses the sampler.
const V1_IDLE: Duration = Duration::from_secs(1);

/// Most finished lanes kept for transaction profiles (their history is
/// half a minute; at 10,000 requests a second that would be 350,000).
const MAX_V1_FINISHED_LANES: usize = 16_384;

/// Decides per transaction, by name, the share to profile (0.0 to 1.0).
pub(crate) type ProfilesSampler = Arc<dyn Fn(&str) -> f64 + Send + Sync>;

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

/// A transaction waiting for its profile (built by the Sentry glue from
/// the transaction's envelope).
pub(crate) trait PendingProfile: Send + std::fmt::Debug {
    /// When the transaction started.
    fn start_ns(&self) -> u64;
    /// Whether the samples up to the transaction's end have (or should
    /// have) arrived, given the newest sample's time.
    fn ready(&self, newest_sample_ns: u64) -> bool;
    /// The envelope as it came, without a profile.
    fn without_profile(self: Box<Self>) -> Envelope;
    /// The envelope with its profile (or without, and why).
    fn finish(
        self: Box<Self>,
        buffer: &Chunk,
        ctx: &V1Context<'_>,
        symbolizer: &mut Option<&mut Symbolizer>,
    ) -> (Envelope, Option<V1Drop>);
}

/// What building a V1 profile needs from its writer.
pub(crate) struct V1Context<'a> {
    pub(crate) lanes: &'a Lanes,
    pub(crate) attribution: ThreadAttribution,
    pub(crate) modules: &'a ModuleSet,
    pub(crate) period_ns: u64,
    pub(crate) release: &'a str,
    pub(crate) environment: Option<&'a str>,
    pub(crate) os_version: &'a str,
}

/// Transaction profiles' writer on the chunk thread: keeps a rolling
/// history of samples instead of sending chunks, and builds each
/// transaction's profile once samples up to its end have arrived.
pub(super) struct ProfileWriter<'a> {
    pub(super) desk: Desk<'a>,
    pub(super) symbolizer: Option<Symbolizer>,
    pub(super) attribution: ThreadAttribution,
    pub(super) period_ns: u64,
    pub(super) release: String,
    pub(super) environment: Option<String>,
    pub(super) os_version: String,
    /// Transactions handed over by the Sentry glue.
    pub(super) requests: Receiver<Box<dyn PendingProfile>>,
    /// Those waiting for their samples.
    pub(super) pending: Vec<Box<dyn PendingProfile>>,
    /// Since when no root span was active.
    pub(super) idle_since: Option<Instant>,
}

impl Writer for ProfileWriter<'_> {
    fn take(&mut self, batch: &mut Batch, _modules: &ModuleSet) {
        self.desk.take(batch);
        for s in batch.samples.drain(..) {
            self.desk.chunk.push(&s);
        }
    }

    fn read_lane_events(&mut self) {
        self.desk.read_lane_events();
    }

    fn tend_blocking(&mut self, modules: &ModuleSet, all: bool) {
        self.desk.tend_blocking(modules, all);
    }

    /// Never: the history is pruned, and profiles sent, as time passes.
    fn is_idle(&self) -> bool {
        false
    }

    fn write_due(&mut self, modules: &ModuleSet) {
        // Keep enough history for the longest transaction still waiting,
        // and the longest profile.
        let keep_from = now_ns().saturating_sub(V1_HISTORY.as_nanos() as u64);
        let oldest = self.pending.iter().map(|p| p.start_ns()).min();
        let keep_from = oldest.map_or(keep_from, |o| o.min(keep_from));
        self.desk.chunk.retain_since(keep_from);
        // Lanes that ended before the history kept are no longer needed.
        self.desk.prune(keep_from);
        let capped = self.desk.lanes.cap_finished(MAX_V1_FINISHED_LANES);
        let session = self.desk.session;
        session
            .counters
            .lanes_capped
            .fetch_add(capped as u64, Ordering::Relaxed);
        self.send(modules, false);
        // No chunk ends in this mode: the sampler pauses once no root span
        // has been active for a while.
        if session.roots_active() {
            self.idle_since = None;
        } else if self.idle_since.get_or_insert_with(Instant::now).elapsed() >= V1_IDLE {
            session.pause_if_idle();
        }
    }

    fn write_all(&mut self, modules: &ModuleSet) {
        self.send(modules, true);
    }
}

impl ProfileWriter<'_> {
    /// Builds and sends the profiles of transactions whose samples have
    /// arrived (all of them with `force`).
    fn send(&mut self, modules: &ModuleSet, force: bool) {
        self.desk.read_lane_events();
        self.pending.extend(self.requests.try_iter());
        if self.pending.is_empty() {
            return;
        }
        let newest = self.desk.chunk.last_timestamp_ns().unwrap_or(0);
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|p| force || p.ready(newest));
        self.pending = waiting;
        let ctx = V1Context {
            lanes: &self.desk.lanes,
            attribution: self.attribution,
            modules,
            period_ns: self.period_ns,
            release: &self.release,
            environment: self.environment.as_deref(),
            os_version: &self.os_version,
        };
        let session = self.desk.session;
        let c = &session.counters;
        let mut symbolizer = self.symbolizer.as_mut();
        for p in ready {
            let (envelope, dropped) = p.finish(&self.desk.chunk, &ctx, &mut symbolizer);
            match dropped {
                None => c.v1_sent.fetch_add(1, Ordering::Relaxed),
                Some(reason) => {
                    let i = match reason {
                        V1Drop::TooFewSamples => 0,
                        V1Drop::TooLong => 1,
                        V1Drop::TooLarge => 2,
                        V1Drop::MissingMetadata => 3,
                    };
                    c.v1_dropped[i].fetch_add(1, Ordering::Relaxed)
                }
            };
            session.send_envelope(envelope);
        }
    }
}
