//! The lane table and what feeds it: the lane queue's events and the
//! threads' context words (each change a poll beginning or ending).
//!
//! Lane ends must be known within a sampling period while requests come and
//! go (a request's last samples are filed by them), so the table is read
//! every period. The sampler thread
//! wakes every period anyway: it reads the table at the end of each tick
//! (see [`crate::sampler::Sampler::set_tick_hook`]), and the profiler thread
//! then wakes only at its own tick, not every period as well: a timed
//! wake-up costs more than reading the table, so this halves the
//! profiler's wake-ups while requests are in flight. While the sampler does
//! not tick (paused, or dozing while the application idles), the profiler
//! thread reads the table itself, every period, as before.
//!
//! Both threads take the desk's lock. The sampler thread only tries it: while
//! the profiler thread holds it (writing a chunk), the tick reads nothing,
//! and the chunk writer reads the queue itself before it writes.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::Session;
use crate::lanes::registry::LaneReader;
use crate::lanes::{ChangeCursor, Lanes};

/// The lane table, the lane queue's reading end, and where the reading of
/// context words left off.
pub(super) struct LaneDesk {
    pub(super) lanes: Lanes,
    events: LaneReader,
    changes: ChangeCursor,
    /// Polls shorter than this are not kept (see `lanes::min_poll_ns`).
    min_poll_ns: u64,
}

/// The desk, shared by the profiler thread and the sampler thread.
pub(super) type SharedDesk = Arc<Mutex<LaneDesk>>;

impl LaneDesk {
    pub(super) fn new(lanes: Lanes, events: LaneReader, period_ns: u64) -> Self {
        Self {
            lanes,
            events,
            changes: ChangeCursor::starting_now(),
            min_poll_ns: crate::lanes::min_poll_ns(period_ns),
        }
    }

    /// Takes the lane queue's events and the context-word changes into the
    /// table. Returns how many events and changes it read: none means
    /// nothing happened since the last read.
    pub(super) fn read(&mut self, session: &Session) -> u64 {
        let (events, _) = self.events.read_into(&session.lanes, &mut self.lanes);
        let polls = crate::lanes::read_polls(&mut self.changes, &mut self.lanes, self.min_poll_ns);
        if polls.lost > 0 {
            session
                .counters
                .lane_polls_lost
                .fetch_add(polls.lost, Ordering::Relaxed);
        }
        let unlinked = self.lanes.take_dropped_unlinked();
        if unlinked > 0 {
            session
                .counters
                .lanes_unlinked
                .fetch_add(unlinked, Ordering::Relaxed);
        }
        self.note_tracked(session);
        events as u64 + polls.changes
    }

    /// Publishes how many lanes the table holds.
    pub(super) fn note_tracked(&self, session: &Session) {
        let c = &session.counters;
        let n = self.lanes.len() as u64;
        c.lanes_tracked.store(n, Ordering::Relaxed);
        c.lanes_tracked_max.fetch_max(n, Ordering::Relaxed);
    }
}

/// The desk, locked (a panic while it was held leaves a usable table).
pub(super) fn lock(desk: &SharedDesk) -> MutexGuard<'_, LaneDesk> {
    desk.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the sampler thread runs after each tick: reads the desk unless the
/// profiler thread holds it, or the session is gone. Returns whether it
/// read an event or a poll, or could not read because the desk was busy
/// (what waits there is unknown).
pub(super) fn tick_reader(
    session: Weak<Session>,
    desk: SharedDesk,
) -> impl Fn() -> bool + Send + Sync {
    move || {
        let Some(session) = session.upgrade() else {
            return false;
        };
        match desk.try_lock() {
            Ok(mut d) => d.read(&session) > 0,
            // A panic while it was held leaves a usable table (see `lock`).
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner().read(&session) > 0,
            Err(std::sync::TryLockError::WouldBlock) => true,
        }
    }
}
