//! The chunk thread's [`Writer`]s (chunks, see `chunk_writer`;
//! transaction profiles, see `v1`), and the [`Desk`] both keep: the lane
//! table and what feeds it, and the samples so far.
//!
//! The lane queue's events are read here; the threads' context-word
//! changes were read by the sampler thread, which hands them on with its
//! samples in a [`Batch`] (see `intake`). A thread publishes a request's
//! word before it reports the lane's start, so the events read with a
//! batch name every lane its changes enter.

use std::sync::atomic::Ordering;

use super::Session;
use super::intake::Batch;
use crate::blocking::watch::Watch;
use crate::chunk::{Chunk, ProcessMeter};
use crate::lanes::registry::LaneReader;
use crate::lanes::{Change, Lanes};
use crate::unwind::ModuleSet;

/// What the chunk thread feeds with the sampler thread's batches: chunks
/// (`ChunkWriter`) or transaction profiles (`ProfileWriter`).
pub(super) trait Writer {
    /// Takes a batch: the lane queue's events and the batch's changes into
    /// the lane table, its samples after them. Leaves the batch empty, to
    /// be reused.
    fn take(&mut self, batch: &mut Batch, modules: &ModuleSet);
    /// Reads the lane queue (no batch came for a while).
    fn read_lane_events(&mut self);
    /// Whether it holds nothing that time alone would make it write.
    fn is_idle(&self) -> bool;
    /// Writes what is due now.
    fn write_due(&mut self, modules: &ModuleSet);
    /// Writes everything it holds (a flush, the end).
    fn write_all(&mut self, modules: &ModuleSet);
    /// Reads the blocking polls whose samples are in and sends the events
    /// of the windows due (every poll and window with `all`: the end).
    fn tend_blocking(&mut self, modules: &ModuleSet, all: bool);
}

/// The lane table, the lane queue's reading end, and the samples so far.
pub(super) struct Desk<'a> {
    pub(super) session: &'a Session,
    pub(super) lanes: Lanes,
    events: LaneReader,
    /// Polls shorter than this are not kept (see `lanes::min_poll_ns`).
    min_poll_ns: u64,
    /// The chunk in progress, or transaction profiles' history.
    pub(super) chunk: Chunk,
    meter: ProcessMeter,
    /// Up to when the lanes' polls are known: the sampler thread's last
    /// reading of the context words (no sample taken so far is later).
    pub(super) known_until_ns: u64,
    /// Blocking polls as issue events, when on.
    watch: Option<Watch>,
    /// The blocking polls taken from the lane table, on their way to the
    /// watch (kept to reuse its allocation).
    blocking_polls: Vec<crate::lanes::BlockingPoll>,
}

impl<'a> Desk<'a> {
    pub(super) fn new(
        session: &'a Session,
        lanes: Lanes,
        events: LaneReader,
        period_ns: u64,
    ) -> Self {
        Self {
            session,
            lanes,
            events,
            min_poll_ns: crate::lanes::min_poll_ns(period_ns),
            chunk: Chunk::new(),
            meter: ProcessMeter::default(),
            known_until_ns: 0,
            watch: None,
            blocking_polls: Vec::new(),
        }
    }

    /// Watches for blocking polls (the lane table must report them, see
    /// `Lanes::with_blocking_ns`).
    pub(super) fn watching(mut self, watch: Option<Watch>) -> Self {
        self.watch = watch;
        self
    }

    /// See [`Writer::tend_blocking`].
    pub(super) fn tend_blocking(&mut self, modules: &ModuleSet, all: bool) {
        let Some(watch) = &mut self.watch else {
            return;
        };
        let session = self.session;
        let counters = &session.counters.blocking;
        let lost = self.lanes.take_blocking(&mut self.blocking_polls);
        crate::blocking::Counters::add(&counters.polls_lost, lost);
        watch.take_polls(&mut self.blocking_polls, counters);
        // Transaction profiles (V1) have no continuous profile to link to.
        let profiler_id = session.profiler_id().filter(|_| session.v1().is_none());
        let events = watch.step(self.known_until_ns, modules, counters, profiler_id, all);
        for event in events {
            session.send_blocking_event(event);
        }
    }

    /// Takes a batch's lane events (read now) and changes into the lane
    /// table and measures the process; the batch's samples are left for
    /// the writer to push.
    pub(super) fn take(&mut self, batch: &mut Batch) {
        if let Some(watch) = &mut self.watch {
            watch.observe(&batch.samples);
        }
        self.read(&batch.changes);
        batch.changes.clear();
        self.known_until_ns = self.known_until_ns.max(batch.read_until_ns);
        self.meter.measure_into(&mut self.chunk);
    }

    /// Takes the lane queue's events into the lane table (while no batch
    /// comes, and before a chunk or profile is written).
    pub(super) fn read_lane_events(&mut self) {
        self.read(&[]);
    }

    fn read(&mut self, changes: &[Change]) {
        let session = self.session;
        self.events.read_into(&session.lanes, &mut self.lanes);
        let beyond_bound = changes
            .iter()
            .filter(|c| !self.lanes.apply_change(**c, self.min_poll_ns))
            .count() as u64;
        let c = &session.counters;
        if beyond_bound > 0 {
            c.lane_polls_lost.fetch_add(beyond_bound, Ordering::Relaxed);
        }
        let unlinked = self.lanes.take_dropped_unlinked();
        if unlinked > 0 {
            c.lanes_unlinked.fetch_add(unlinked, Ordering::Relaxed);
        }
        self.note_tracked();
    }

    /// Forgets the lanes that ended before `before` and those open too long
    /// (counted as expired, their places in the lane queue given back).
    pub(super) fn prune(&mut self, before: u64) {
        let expired = self.lanes.prune(before);
        self.session.lanes.released(expired);
        self.session
            .counters
            .lanes_expired
            .fetch_add(expired as u64, Ordering::Relaxed);
        self.note_tracked();
    }

    /// Publishes how many lanes the table holds.
    fn note_tracked(&self) {
        let c = &self.session.counters;
        let n = self.lanes.len() as u64;
        c.lanes_tracked.store(n, Ordering::Relaxed);
        c.lanes_tracked_max.fetch_max(n, Ordering::Relaxed);
    }
}
