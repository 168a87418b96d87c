//! The chunk in progress on the chunk thread: the sampler thread's batches
//! go in (samples, and the context-word changes that make the lanes'
//! polls), and when the chunk is due (its duration, or as many finished
//! requests as one chunk holds) its lanes are filled in, it is encoded,
//! exported and handed to the session's sink.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Session;
use super::intake::Batch;
use super::lane_desk::LaneDesk;
use super::sink::Handed;
use super::v1::{V1_HISTORY, V1Context, V1Drop, V1State};
use crate::attribution::ThreadAttribution;
use crate::chunk::Chunk;
use crate::encode::sentry_chunk::{ChunkMeta, EncodedChunk, encode_chunk};
use crate::encode::view::ProfileView;
use crate::export::{ExportCounts, Exporter};
use crate::lanes::now_ns;
use crate::sampler::Sample;
use crate::symbolize::Symbolizer;
use crate::unwind::ModuleSet;

/// How far before a chunk's first sample lanes are filled in, at most.
const MAX_FILL_LEAD_NS: u64 = 2_000_000_000;

/// Finished lanes one chunk holds, at most: the chunk in progress is written
/// out early when more requests than that have finished in it. This bounds
/// the profiler's memory (the lanes, and their samples in the chunk) and the
/// chunk's size at any request rate; at low rates chunks last their full
/// duration.
const MAX_FINISHED_LANES_PER_CHUNK: usize = 4_096;

/// How long transaction profiling keeps sampling without an active root
/// span before it pauses the sampler.
const V1_IDLE: Duration = Duration::from_secs(1);

/// Most finished lanes kept for transaction profiles (their history is
/// half a minute; at 10,000 requests a second that would be 350,000).
const MAX_V1_FINISHED_LANES: usize = 16_384;

/// The chunk thread's chunk in progress, and the lane table.
pub(super) struct ChunkWriter<'a> {
    pub(super) session: &'a Session,
    pub(super) meta: ChunkMeta,
    pub(super) chunk: Chunk,
    pub(super) symbolizer: Option<Symbolizer>,
    pub(super) chunk_duration: Duration,
    pub(super) desk: LaneDesk,
    pub(super) attribution: ThreadAttribution,
    pub(super) period_ns: u64,
    /// Where the last chunk's lane fill-ins ended.
    pub(super) filled_until_ns: u64,
    /// Up to when the lanes' polls are known (the last batch's reading of
    /// the context words): a chunk's fill-ins end there.
    pub(super) known_until_ns: u64,
    pub(super) meter: crate::chunk::ProcessMeter,
    pub(super) exporters: Vec<Exporter>,
    pub(super) service_name: String,
    pub(super) v1: Option<V1State>,
    /// Since when no root span was active (transaction profiles).
    pub(super) idle_since: Option<Instant>,
}

impl ChunkWriter<'_> {
    pub(super) fn push(&mut self, sample: &Sample, modules: &ModuleSet) {
        // A recycled thread id starts a new chunk, so each thread keeps its
        // own name. (Transaction profiles keep history instead of chunks;
        // their samples are filed by lane.)
        if !self
            .chunk
            .accepts(sample.timestamp_ns(), self.chunk_duration)
            || (self.v1.is_none() && self.chunk.holds_other_thread(sample))
        {
            self.finish_with(modules);
        }
        self.chunk.push(sample);
    }

    /// Takes a batch from the sampler thread: the lane queue's events and
    /// the batch's changes into the lane table, then its samples into the
    /// chunk. Leaves the batch empty, to be reused.
    pub(super) fn take(&mut self, batch: &mut Batch, modules: &ModuleSet) {
        self.desk.read(self.session, &batch.changes);
        batch.changes.clear();
        self.known_until_ns = self.known_until_ns.max(batch.read_until_ns);
        self.meter.measure_into(&mut self.chunk);
        for s in batch.samples.drain(..) {
            self.push(&s, modules);
        }
    }

    /// Takes the lane queue's events into the lane table (while no batch
    /// comes, and before a chunk or profile is written).
    pub(super) fn read_lane_events(&mut self) {
        self.desk.read(self.session, &[]);
    }

    /// Whether the writer holds nothing that time alone would make it
    /// write: no sample in the chunk, and no transaction profiles being
    /// made (their history is pruned and their profiles sent at the tick).
    pub(super) fn is_idle(&self) -> bool {
        self.chunk.is_empty() && self.v1.is_none()
    }

    /// Forgets the lanes that ended before `before` and those open too long
    /// (counted as expired, their places in the lane queue given back).
    fn prune_lanes(&mut self, before: u64) {
        let desk = &mut self.desk;
        let expired = desk.lanes.prune(before);
        self.session.lanes.released(expired);
        self.session
            .counters
            .lanes_expired
            .fetch_add(expired as u64, Ordering::Relaxed);
        desk.note_tracked(self.session);
    }

    pub(super) fn rotate_if_due(&mut self, modules: &ModuleSet) {
        if let Some(v1) = &self.v1 {
            // V1 mode sends no chunks: keep enough history for the longest
            // transaction still waiting, and the longest profile.
            let keep_from = now_ns().saturating_sub(V1_HISTORY.as_nanos() as u64);
            let oldest = v1
                .pending
                .iter()
                .map(|p| p.start_ns())
                .min()
                .unwrap_or(u64::MAX);
            self.chunk.retain_since(keep_from.min(oldest));
            // Lanes that ended before the history kept are no longer needed.
            self.prune_lanes(keep_from.min(oldest));
            let capped = self.desk.lanes.cap_finished(MAX_V1_FINISHED_LANES);
            self.session
                .counters
                .lanes_capped
                .fetch_add(capped as u64, Ordering::Relaxed);
            self.process_v1(modules, false);
            // No chunk ends in this mode: the sampler pauses once no root
            // span has been active for a while.
            if self.session.roots_active() {
                self.idle_since = None;
            } else if self.idle_since.get_or_insert_with(Instant::now).elapsed() >= V1_IDLE {
                self.session.pause_if_idle();
            }
            return;
        }
        let Some(first) = self.chunk.first_timestamp_ns() else {
            return;
        };
        let now = now_ns();
        let full = self.desk.lanes.finished() >= MAX_FINISHED_LANES_PER_CHUNK;
        if full || now.saturating_sub(first) >= self.chunk_duration.as_nanos() as u64 {
            if full {
                self.session
                    .counters
                    .chunks_cut_early
                    .fetch_add(1, Ordering::Relaxed);
            }
            self.finish_with(modules);
        }
    }

    fn record_exports(&self, counts: ExportCounts) {
        let c = &self.session.counters;
        c.export_sent.fetch_add(counts.sent, Ordering::Relaxed);
        c.export_failed.fetch_add(counts.failed, Ordering::Relaxed);
        c.export_dropped
            .fetch_add(counts.dropped, Ordering::Relaxed);
    }

    pub(super) fn finish_with(&mut self, modules: &ModuleSet) {
        if self.v1.is_some() {
            self.process_v1(modules, true);
            return;
        }
        self.read_lane_events();
        if self.chunk.is_empty() {
            return;
        }
        // The trace lifecycle's profiler stops at the end of the chunk in
        // which the last root span ended (however the chunk ends: its
        // duration, a full lane table, a recycled thread id, a flush).
        self.session.pause_if_idle();
        let mut chunk = self.chunk.take();
        // The lanes' polls are known up to the sampler thread's last
        // reading of the context words; no sample of the chunk is later.
        let now = self
            .known_until_ns
            .max(chunk.last_timestamp_ns().unwrap_or(0));
        let edges_from = self.filled_until_ns;
        if self.attribution == ThreadAttribution::Lanes {
            self.fill_lanes(&mut chunk, now);
        }
        if !self.exporters.is_empty() {
            self.export(&chunk, modules);
        }
        let lanes = &self.desk.lanes;
        if self.attribution == ThreadAttribution::Lanes {
            let edges = lanes.add_poll_edges(&mut chunk, self.period_ns, edges_from, now);
            self.session
                .counters
                .lane_fill_ins
                .fetch_add(edges as u64, Ordering::Relaxed);
        }
        let keys = lanes.thread_keys(&chunk, self.attribution);
        let keys = crate::encode::synthetic::mark_running_requests(&mut chunk, keys);
        let pieces = encode_chunk(
            &self.meta,
            &chunk,
            modules,
            self.symbolizer.as_mut(),
            &|i, _| keys[i].clone(),
        );
        self.prune_lanes(now);
        self.send_pieces(pieces);
    }

    /// Fills the chunk's lanes with their fill-ins up to `now`: from where
    /// the previous chunk's fill-ins ended (not from this chunk's first
    /// sample, which can come well after the root span that resumed the
    /// sampler), at most `MAX_FILL_LEAD` before the first sample so the
    /// chunk stays within Relay's span.
    fn fill_lanes(&mut self, chunk: &mut Chunk, now: u64) {
        let from = chunk
            .first_timestamp_ns()
            .map_or(now, |first| first.saturating_sub(MAX_FILL_LEAD_NS))
            .max(self.filled_until_ns);
        let filled = self
            .desk
            .lanes
            .fill_suspended_from(chunk, self.period_ns, from, now);
        self.filled_until_ns = now;
        let c = &self.session.counters;
        c.lane_fill_ins
            .fetch_add(filled.added as u64, Ordering::Relaxed);
        c.lane_fill_ins_capped
            .fetch_add(filled.capped as u64, Ordering::Relaxed);
    }

    /// Hands the chunk, resolved once, to every exporter (pprof, OTLP).
    fn export(&mut self, chunk: &Chunk, modules: &ModuleSet) {
        let view = ProfileView::build(
            chunk,
            &self.desk.lanes,
            modules,
            self.symbolizer.as_mut(),
            self.period_ns,
        );
        let mut counts = ExportCounts::default();
        for e in &mut self.exporters {
            e.export(&view, &self.service_name, &mut counts);
        }
        self.record_exports(counts);
    }

    /// Sends the encoded pieces of a chunk (one per Relay-sized part),
    /// counting what was sent and what had nowhere to go.
    fn send_pieces(&self, pieces: Vec<EncodedChunk>) {
        let c = &self.session.counters;
        c.samples_single_thread.fetch_add(
            pieces.iter().map(|p| p.dropped_single).sum::<usize>() as u64,
            Ordering::Relaxed,
        );
        for piece in pieces {
            let samples = piece.samples as u64;
            match self.session.send_profile_chunk(piece) {
                Handed::Taken => {
                    c.chunks_sent.fetch_add(1, Ordering::Relaxed);
                    c.samples_sent.fetch_add(samples, Ordering::Relaxed);
                }
                // Counted by the sender, by reason.
                #[cfg(feature = "http")]
                Handed::Dropped => {}
                Handed::NoTransport => {
                    c.chunks_without_transport.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// V1 mode: builds and sends the profiles of transactions whose samples
    /// have arrived (all of them with `force`).
    pub(super) fn process_v1(&mut self, modules: &ModuleSet, force: bool) {
        self.read_lane_events();
        let Some(v1) = self.v1.as_mut() else { return };
        v1.pending.extend(v1.requests.try_iter());
        if v1.pending.is_empty() {
            return;
        }
        let newest = self.chunk.last_timestamp_ns().unwrap_or(0);
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut v1.pending)
            .into_iter()
            .partition(|p| force || p.ready(newest));
        v1.pending = waiting;
        let release = self.meta.release.clone();
        let environment = self.meta.environment.clone();
        let ctx = V1Context {
            lanes: &self.desk.lanes,
            attribution: self.attribution,
            modules,
            period_ns: self.period_ns,
            release: &release,
            environment: environment.as_deref(),
            os_version: &v1.os_version,
        };
        let c = &self.session.counters;
        let mut symbolizer = self.symbolizer.as_mut();
        for p in ready {
            let (envelope, dropped) = p.finish(&self.chunk, &ctx, &mut symbolizer);
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
            self.session.send_envelope(envelope);
        }
    }
}
