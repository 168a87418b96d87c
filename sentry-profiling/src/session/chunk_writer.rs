//! The continuous profiler's writer on the chunk thread: the sampler
//! thread's batches go in, and when the chunk in progress is due (its
//! duration, or as many finished requests as one chunk holds) its lanes are
//! filled in, it is encoded, exported and handed to the session's sink.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::desk::{Desk, Writer};
use super::intake::Batch;
use super::sink::Handed;
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

/// The chunk in progress and where it goes.
pub(super) struct ChunkWriter<'a> {
    pub(super) desk: Desk<'a>,
    pub(super) meta: ChunkMeta,
    pub(super) symbolizer: Option<Symbolizer>,
    pub(super) chunk_duration: Duration,
    pub(super) attribution: ThreadAttribution,
    pub(super) period_ns: u64,
    /// Where the last chunk's lane fill-ins ended.
    pub(super) filled_until_ns: u64,
    pub(super) exporters: Vec<Exporter>,
    pub(super) service_name: String,
}

impl Writer for ChunkWriter<'_> {
    fn take(&mut self, batch: &mut Batch, modules: &ModuleSet) {
        self.desk.take(batch);
        for s in batch.samples.drain(..) {
            self.push(&s, modules);
        }
    }

    fn read_lane_events(&mut self) {
        self.desk.read_lane_events();
    }

    fn is_idle(&self) -> bool {
        self.desk.chunk.is_empty()
    }

    fn write_due(&mut self, modules: &ModuleSet) {
        let Some(first) = self.desk.chunk.first_timestamp_ns() else {
            return;
        };
        let full = self.desk.lanes.finished() >= MAX_FINISHED_LANES_PER_CHUNK;
        if full || now_ns().saturating_sub(first) >= self.chunk_duration.as_nanos() as u64 {
            if full {
                self.desk
                    .session
                    .counters
                    .chunks_cut_early
                    .fetch_add(1, Ordering::Relaxed);
            }
            self.write_all(modules);
        }
    }

    fn tend_blocking(&mut self, modules: &ModuleSet, all: bool) {
        self.desk.tend_blocking(modules, all);
    }

    fn write_all(&mut self, modules: &ModuleSet) {
        self.desk.read_lane_events();
        if self.desk.chunk.is_empty() {
            return;
        }
        let session = self.desk.session;
        // The trace lifecycle's profiler stops at the end of the chunk in
        // which the last root span ended (however the chunk ends: its
        // duration, a full lane table, a recycled thread id, a flush).
        session.pause_if_idle();
        let mut chunk = self.desk.chunk.take();
        // The lanes' polls are known up to the sampler thread's last
        // reading of the context words; no sample of the chunk is later.
        let now = self
            .desk
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
            // Once every sample of the lanes is in: the requests' running
            // time with no capture of its own takes their captures' stacks,
            // marked as estimated (`lanes::estimate`).
            lanes.estimate_uncaptured(&mut chunk);
            session
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
        self.desk.prune(now);
        self.send_pieces(pieces);
    }
}

impl ChunkWriter<'_> {
    fn push(&mut self, sample: &Sample, modules: &ModuleSet) {
        // A recycled thread id starts a new chunk, so each thread keeps its
        // own name.
        let chunk = &self.desk.chunk;
        if !chunk.accepts(sample.timestamp_ns(), self.chunk_duration)
            || chunk.holds_other_thread(sample)
        {
            self.write_all(modules);
        }
        self.desk.chunk.push(sample);
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
        let c = &self.desk.session.counters;
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
        let c = &self.desk.session.counters;
        c.export_sent.fetch_add(counts.sent, Ordering::Relaxed);
        c.export_failed.fetch_add(counts.failed, Ordering::Relaxed);
        c.export_dropped
            .fetch_add(counts.dropped, Ordering::Relaxed);
    }

    /// Sends the encoded pieces of a chunk (one per Relay-sized part),
    /// counting what was sent and what had nowhere to go.
    fn send_pieces(&self, pieces: Vec<EncodedChunk>) {
        let session = self.desk.session;
        let c = &session.counters;
        c.samples_single_thread.fetch_add(
            pieces.iter().map(|p| p.dropped_single).sum::<usize>() as u64,
            Ordering::Relaxed,
        );
        for piece in pieces {
            let samples = piece.samples as u64;
            match session.send_profile_chunk(piece) {
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
}
