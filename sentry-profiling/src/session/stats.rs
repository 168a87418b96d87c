//! What a session counts: its own counters, the crate's delivery counters,
//! and the public snapshot of both ([`ProfilerStats`]).

use std::sync::atomic::{AtomicU64, Ordering};

use super::Session;
use crate::sampler::{SamplerControl, SamplerStats};

/// Counters of a session.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(super) chunks_sent: AtomicU64,
    pub(super) samples_sent: AtomicU64,
    pub(super) samples_single_thread: AtomicU64,
    pub(super) chunks_without_transport: AtomicU64,
    pub(super) lanes_tracked: AtomicU64,
    pub(super) lanes_tracked_max: AtomicU64,
    pub(super) lanes_expired: AtomicU64,
    pub(super) lanes_unlinked: AtomicU64,
    pub(super) lanes_capped: AtomicU64,
    pub(super) lane_fill_ins: AtomicU64,
    pub(super) lane_fill_ins_capped: AtomicU64,
    pub(super) lane_polls_lost: AtomicU64,
    pub(super) long_polls: AtomicU64,
    pub(super) blocking: crate::blocking::Counters,
    pub(super) chunks_cut_early: AtomicU64,
    pub(super) export_sent: AtomicU64,
    pub(super) export_failed: AtomicU64,
    pub(super) export_dropped: AtomicU64,
    pub(super) v1_sent: AtomicU64,
    pub(super) v1_dropped: [AtomicU64; 5],
}

/// What a profiling session has done so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProfilerStats {
    /// Whether this process's profiling session was sampled.
    pub session_sampled: bool,
    /// `profile_chunk` envelopes handed to the transport (with the crate's
    /// own delivery: taken into its send queue).
    pub chunks_sent: u64,
    /// Samples in those chunks.
    pub samples_sent: u64,
    /// Samples left out because their thread had only one sample in its
    /// chunk (Sentry's ingestion drops those).
    pub samples_single_thread: u64,
    /// Chunks that could not be sent because no client transport existed.
    pub chunks_without_transport: u64,
    /// Chunks the Sentry endpoint accepted (answered 2xx). Known only when
    /// the crate delivers chunks itself (the `http` feature, and no
    /// transport of the application's own); 0 otherwise.
    pub chunks_delivered: u64,
    /// Chunks the crate's own delivery dropped, by reason (all 0 when the
    /// application's transport carries chunks: it then counts its own).
    pub chunks_dropped: ChunkDrops,
    /// Lane start/finish events the lane queue refused. Lanes reserve their
    /// places, so this stays 0; it counts a broken invariant.
    pub lane_events_dropped: u64,
    /// Requests (sampled root spans) given a lane.
    pub lanes_registered: u64,
    /// Requests not given a lane because too many were in flight at once
    /// (their samples stay on their OS threads, and their transactions are
    /// tagged with the OS thread).
    pub lane_registrations_refused: u64,
    /// Lanes registered whose end the chunk thread has not read yet
    /// (requests in flight, plus those finished since its last read).
    pub lanes_in_flight: u64,
    /// Lanes the chunk thread holds now: open ones, and finished ones
    /// whose chunk is not written yet.
    pub lanes_tracked: u64,
    /// The most lanes the chunk thread held at once.
    pub lanes_tracked_max: u64,
    /// Lanes forgotten because they stayed open too long (10 minutes: a
    /// leaked root span, or a lost end).
    pub lanes_expired: u64,
    /// Lanes forgotten as soon as their transaction was known to last less
    /// than 19.8 ms, which Sentry never links to a profile (see
    /// [`crate::ProfilingIntegration::short_request_lanes`]): those
    /// requests' samples are filed under their OS threads.
    pub lanes_unlinked: u64,
    /// Finished lanes forgotten early because transaction profiles' history
    /// held more than its bound (only with `profiles_sample_rate`, at high
    /// request rates): samples of those requests that a later profile
    /// covers are filed under their OS threads.
    pub lanes_capped: u64,
    /// `(suspended)` fill-in and end samples added to lanes.
    pub lane_fill_ins: u64,
    /// Suspended ticks left without a fill-in because their chunk reached
    /// its bound of fill-ins.
    pub lane_fill_ins_capped: u64,
    /// Polls of requests whose start or end the chunk thread did not
    /// read in time (a thread changed requests more than 64 times between
    /// two reads), or beyond a lane's bound of polls: those requests are
    /// shown from their samples alone, without the exact edges of those
    /// polls.
    pub lane_polls_lost: u64,
    /// Polls of instrumented requests (`sentry-profiling-tracing`'s
    /// `http_layer()`, `spawn_in_span`, `.profiled()`) that ran longer than
    /// [`ProfilingIntegration::long_poll_threshold`](crate::ProfilingIntegration::long_poll_threshold)
    /// without yielding: each blocked its Tokio worker, and every task
    /// queued behind it, for that long.
    pub long_polls: u64,
    /// Blocking polls and the issue events made of them (see
    /// [`ProfilingIntegration::blocking_issues`](crate::ProfilingIntegration::blocking_issues)).
    pub blocking: crate::BlockingStats,
    /// Chunks written before their full duration because as many requests
    /// as one chunk holds had finished in them.
    pub chunks_cut_early: u64,
    /// Exports (OTLP requests, files) that succeeded.
    pub exports_sent: u64,
    /// Exports that failed (endpoint down, file not writable).
    pub exports_failed: u64,
    /// Samples left out of exports that reached their size bound.
    pub export_samples_dropped: u64,
    /// Transaction-based (V1) profiles sent with their transaction.
    pub transaction_profiles_sent: u64,
    /// V1 profiles not sent, by reason.
    pub transaction_profiles_dropped: super::v1::TransactionProfileDrops,
    /// The sampler's counters.
    pub sampler: SamplerStats,
}

/// Why chunks were not delivered (see [`ProfilerStats::chunks_dropped`]).
/// The first drop of each kind, and ever more sparingly the later ones
/// (the 10th, 100th, … then every 100,000th), is also logged to stderr, and the drops are reported to Sentry as `profile_chunk` client
/// reports once the endpoint accepts a chunk again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChunkDrops {
    /// The send queue was full (the endpoint is slower than the profiler,
    /// or unreachable): the chunk was dropped without waiting.
    pub queue_full: u64,
    /// The request failed: connection refused or reset, timed out (an
    /// endpoint that accepts and never answers), or still queued when the
    /// shutdown timeout ran out.
    pub send_failed: u64,
    /// The endpoint answered with an error status other than `429`.
    pub http_error: u64,
    /// Sentry rate-limited profile chunks: answered `429`, or the chunk
    /// was dropped unsent while an earlier answer's `X-Sentry-Rate-Limits`
    /// (category `profile_chunk`, or all) or `Retry-After` was in force.
    pub rate_limited: u64,
}

/// What became of the chunks handed to the crate's own chunk sender (see
/// [`crate::ChunkDrops`]).
#[derive(Debug, Default)]
pub(crate) struct DeliveryCounters {
    pub(crate) delivered: AtomicU64,
    pub(crate) queue_full: AtomicU64,
    pub(crate) send_failed: AtomicU64,
    pub(crate) http_error: AtomicU64,
    pub(crate) rate_limited: AtomicU64,
}

impl Session {
    /// Counters so far.
    pub(crate) fn stats(&self) -> ProfilerStats {
        let c = &self.counters;
        let lanes = &self.lanes.counters;
        ProfilerStats {
            session_sampled: self.session_sampled.load(Ordering::Acquire),
            chunks_sent: c.chunks_sent.load(Ordering::Relaxed),
            samples_sent: c.samples_sent.load(Ordering::Relaxed),
            samples_single_thread: c.samples_single_thread.load(Ordering::Relaxed),
            chunks_without_transport: c.chunks_without_transport.load(Ordering::Relaxed),
            chunks_delivered: self.delivery.delivered.load(Ordering::Relaxed),
            chunks_dropped: ChunkDrops {
                queue_full: self.delivery.queue_full.load(Ordering::Relaxed),
                send_failed: self.delivery.send_failed.load(Ordering::Relaxed),
                http_error: self.delivery.http_error.load(Ordering::Relaxed),
                rate_limited: self.delivery.rate_limited.load(Ordering::Relaxed),
            },
            lane_events_dropped: lanes.events_dropped.load(Ordering::Relaxed),
            lanes_registered: self.lanes.registered(),
            lane_registrations_refused: lanes.refused.load(Ordering::Relaxed),
            lanes_in_flight: self.lanes.in_flight() as u64,
            lanes_tracked: c.lanes_tracked.load(Ordering::Relaxed),
            lanes_tracked_max: c.lanes_tracked_max.load(Ordering::Relaxed),
            lanes_expired: c.lanes_expired.load(Ordering::Relaxed),
            lanes_unlinked: c.lanes_unlinked.load(Ordering::Relaxed),
            lanes_capped: c.lanes_capped.load(Ordering::Relaxed),
            lane_fill_ins: c.lane_fill_ins.load(Ordering::Relaxed),
            lane_fill_ins_capped: c.lane_fill_ins_capped.load(Ordering::Relaxed),
            lane_polls_lost: c.lane_polls_lost.load(Ordering::Relaxed),
            long_polls: c.long_polls.load(Ordering::Relaxed),
            blocking: c.blocking.snapshot(),
            chunks_cut_early: c.chunks_cut_early.load(Ordering::Relaxed),
            exports_sent: c.export_sent.load(Ordering::Relaxed),
            exports_failed: c.export_failed.load(Ordering::Relaxed),
            export_samples_dropped: c.export_dropped.load(Ordering::Relaxed),
            transaction_profiles_sent: c.v1_sent.load(Ordering::Relaxed),
            transaction_profiles_dropped: super::v1::TransactionProfileDrops::from_counts(
                std::array::from_fn(|i| c.v1_dropped[i].load(Ordering::Relaxed)),
            ),
            sampler: self
                .control
                .get()
                .map(SamplerControl::stats)
                .unwrap_or_else(|| {
                    self.last_sampler_stats
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .clone()
                }),
        }
    }
}
