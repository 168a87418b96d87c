//! Transaction-based (V1) profiling's part of the session: which
//! transactions are profiled ([`V1Config`]), the queue of transactions
//! waiting for their samples, and building their profiles on the profiler
//! thread. The Sentry glue (`transaction_profile`) intercepts transaction
//! envelopes and hands them over as [`PendingProfile`]s; the session never
//! looks inside an envelope.

use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use sentry_core::protocol::Envelope;

use crate::attribution::ThreadAttribution;
use crate::chunk::Chunk;
use crate::lanes::Lanes;
use crate::symbolize::Symbolizer;
use crate::unwind::ModuleSet;

/// Transactions waiting for their V1 profile, at most.
pub(super) const V1_QUEUE: usize = 256;
/// How much sample history V1 mode keeps (the longest profile, and slack).
pub(super) const V1_HISTORY: Duration = Duration::from_secs(35);

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

/// What building a V1 profile needs from the chunk thread.
pub(crate) struct V1Context<'a> {
    pub(crate) lanes: &'a Lanes,
    pub(crate) attribution: ThreadAttribution,
    pub(crate) modules: &'a ModuleSet,
    pub(crate) period_ns: u64,
    pub(crate) release: &'a str,
    pub(crate) environment: Option<&'a str>,
    pub(crate) os_version: &'a str,
}

/// The chunk thread's transaction-based (V1) work.
pub(super) struct V1State {
    pub(super) requests: Receiver<Box<dyn PendingProfile>>,
    pub(super) pending: Vec<Box<dyn PendingProfile>>,
    pub(super) os_version: String,
}
