//! The lane table and what feeds it, on the chunk thread: the lane queue's
//! events, read here, and the threads' context-word changes, which the
//! sampler thread read and handed on in a batch (see `intake`).

use std::sync::atomic::Ordering;

use super::Session;
use crate::lanes::registry::LaneReader;
use crate::lanes::{Change, Lanes};

/// The lane table and the lane queue's reading end.
pub(super) struct LaneDesk {
    pub(super) lanes: Lanes,
    events: LaneReader,
    /// Polls shorter than this are not kept (see `lanes::min_poll_ns`).
    min_poll_ns: u64,
}

impl LaneDesk {
    pub(super) fn new(lanes: Lanes, events: LaneReader, period_ns: u64) -> Self {
        Self {
            lanes,
            events,
            min_poll_ns: crate::lanes::min_poll_ns(period_ns),
        }
    }

    /// Takes the lane queue's events into the table, then `changes`: a
    /// thread publishes a request's word before it reports the lane's
    /// start, so the events read now name every lane those changes enter.
    pub(super) fn read(&mut self, session: &Session, changes: &[Change]) {
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
        self.note_tracked(session);
    }

    /// Publishes how many lanes the table holds.
    pub(super) fn note_tracked(&self, session: &Session) {
        let c = &session.counters;
        let n = self.lanes.len() as u64;
        c.lanes_tracked.store(n, Ordering::Relaxed);
        c.lanes_tracked_max.fetch_max(n, Ordering::Relaxed);
    }
}
