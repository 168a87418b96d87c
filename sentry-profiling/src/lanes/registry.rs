//! Registering lanes from application threads, and reading them on the
//! profiler thread.
//!
//! An application thread (the tracing layer) reports a lane's start and end
//! through a bounded queue; it never blocks and never allocates beyond the
//! event. Each lane *reserves* two places when it registers (its start and
//! its end), so a lane whose start was taken can always report its end: no
//! finished request stays "open" collecting fill-ins. A request past the
//! bound is refused and stays on its OS threads (counted).
//!
//! The profiler thread reads the queue every sampling period while the
//! sampler runs or lanes are in flight ([`read_interval`]; a request wakes
//! nobody: the first root span after a pause resumes the sampler and wakes
//! the reader once), so
//! a finished request is known as
//! finished (and its places freed) within one period, except while a chunk
//! is being written; it also reads it before any chunk or profile is
//! written, so no chunk is ever written without the ends it covers.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::time::Duration;

use super::{LaneEvent, LaneLink, Lanes};

/// Lane events waiting for the profiler thread, at most.
pub(crate) const LANE_QUEUE: usize = 16_384;

/// Lanes registered whose end the profiler thread has not read yet, at
/// most. Each such lane holds two places in the lane queue (its start and
/// its end), so the queue never refuses an event. A request past this bound
/// (that many requests in flight at once) is not given a lane: its samples
/// stay on the OS threads that ran it (counted in
/// [`crate::ProfilerStats::lane_registrations_refused`]).
pub(crate) const MAX_LANES_IN_FLIGHT: usize = LANE_QUEUE / 2;

/// Ends read after which the reader gives their places back, at most.
const RELEASE_BATCH: usize = 256;

/// Lanes in flight from which the profiler thread is woken at once to read
/// the lane queue.
const LANES_HIGH_WATER: usize = MAX_LANES_IN_FLIGHT / 4;

/// How long the profiler thread may wait before it reads the lane queue
/// again: one sampling period while the sampler runs or any lane is in
/// flight (a finished request is then known within one period), else
/// `idle`.
pub(crate) fn read_interval(busy: bool, period: Duration, idle: Duration) -> Duration {
    if busy { period.min(idle) } else { idle }
}

/// The registry's counters (see [`crate::ProfilerStats`]).
#[derive(Debug, Default)]
pub(crate) struct RegistryCounters {
    /// Places given back (ends read, lanes expired): written by the reader
    /// only, so that registering a lane adds to no counter the
    /// application's threads share (see [`LaneRegistry::registered`]).
    released: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) events_dropped: AtomicU64,
}

/// The application threads' side of the lane queue, and its bound.
#[derive(Debug, Default)]
pub(crate) struct LaneRegistry {
    events: OnceLock<SyncSender<LaneEvent>>,
    /// Lanes holding places in the queue (see [`MAX_LANES_IN_FLIGHT`]):
    /// written at every registration, so on a line of its own.
    in_flight: crate::own_line::OwnLine<AtomicUsize>,
    /// The reader, woken when lanes pile up, or by the first lane after it
    /// began to doze.
    reader: OnceLock<std::thread::Thread>,
    /// The reader sleeps longer than a period (it found nothing to read for
    /// a while): the next lane wakes it.
    dozing: AtomicBool,
    pub(crate) counters: RegistryCounters,
}

impl LaneRegistry {
    /// Creates the queue (once per session) and returns its reading end.
    pub(crate) fn open(&self) -> Option<LaneReader> {
        let (tx, rx) = std::sync::mpsc::sync_channel(LANE_QUEUE);
        self.events.set(tx).ok()?;
        Some(LaneReader { events: rx })
    }

    /// Records the thread that reads the queue.
    pub(crate) fn set_reader(&self, thread: std::thread::Thread) {
        let _ = self.reader.set(thread);
    }

    /// Lanes registered so far: each holds its places until they are given
    /// back, so it is the places given back plus those held. Exact once no
    /// lane registers or ends meanwhile; otherwise off by the lanes that
    /// did between the two reads.
    pub(crate) fn registered(&self) -> u64 {
        let released = self.counters.released.load(Ordering::Relaxed);
        released + self.in_flight() as u64
    }

    /// Lanes registered whose end was not read yet.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Registers a lane; never blocks. Returns false (and counts it) when
    /// the lane cannot be tracked: too many lanes in flight, or no reader.
    /// The caller then leaves the request on its OS threads and must not
    /// report its end.
    pub(crate) fn started(&self, lane: u64, link: LaneLink, start_ns: u64) -> bool {
        let Some(tx) = self.events.get() else {
            return false;
        };
        let c = &self.counters;
        let reserved = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_LANES_IN_FLIGHT).then_some(n + 1)
            });
        let Ok(before) = reserved else {
            c.refused.fetch_add(1, Ordering::Relaxed);
            self.wake_reader();
            return false;
        };
        // The reader reads the queue every sampling period while requests
        // come and go, so a request wakes nobody; only a pile-up does, or
        // the first request after the reader found nothing for a while and
        // began to doze (one wake-up per quiet spell).
        if before + 1 == LANES_HIGH_WATER
            || (self.dozing.load(Ordering::Relaxed) && self.dozing.swap(false, Ordering::AcqRel))
        {
            self.wake_reader();
        }
        let event = LaneEvent::Started {
            lane,
            link,
            start_ns,
        };
        if tx.try_send(event).is_err() {
            // Only when the reader is gone (or the reservation invariant
            // broke): give the place back.
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            c.events_dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Reports the end of a lane for which [`LaneRegistry::started`]
    /// returned true; never blocks (its place in the queue is reserved).
    pub(crate) fn finished(&self, lane: u64, end_ns: u64) {
        if let Some(tx) = self.events.get() {
            if tx.try_send(LaneEvent::Finished { lane, end_ns }).is_err() {
                self.counters.events_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The reader is about to sleep past a period (`true`), or is awake
    /// again (`false`).
    pub(crate) fn set_dozing(&self, dozing: bool) {
        self.dozing.store(dozing, Ordering::Release);
    }

    /// Reports the window of the transaction of `lane` (see
    /// [`LaneEvent::Transaction`]). It has no place reserved: with the
    /// queue full it is counted in `events_dropped`, and the lane keeps its
    /// root span's window. Never blocks.
    pub(crate) fn transaction(&self, lane: u64, start_ns: u64, end_ns: u64) {
        if let Some(tx) = self.events.get() {
            let event = LaneEvent::Transaction {
                lane,
                start_ns,
                end_ns,
            };
            if tx.try_send(event).is_err() {
                self.counters.events_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The reader took the ends of `lanes` lanes, or forgot that many
    /// lanes open for too long (a root span never closed, a task that runs
    /// for good): their places are free again, so that a leaked span does
    /// not hold places for the life of the process.
    pub(crate) fn released(&self, lanes: usize) {
        self.counters
            .released
            .fetch_add(lanes as u64, Ordering::Relaxed);
        let _ = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_sub(lanes))
            });
    }

    /// Wakes the profiler thread (which reads the queue).
    pub(crate) fn wake_reader(&self) {
        if let Some(t) = self.reader.get() {
            t.unpark();
        }
    }
}

/// The profiler thread's side of the lane queue.
#[derive(Debug)]
pub(crate) struct LaneReader {
    events: Receiver<LaneEvent>,
}

impl LaneReader {
    /// Moves every event waiting into `lanes`, freeing the places of the
    /// lanes whose end it read. Returns how many events and how many ends
    /// it read.
    pub(crate) fn read_into(&self, registry: &LaneRegistry, lanes: &mut Lanes) -> (usize, usize) {
        let (mut events, mut ends, mut freed) = (0, 0, 0);
        for event in self.events.try_iter() {
            events += 1;
            if matches!(event, LaneEvent::Finished { .. }) {
                ends += 1;
            }
            if lanes.apply(event) {
                freed += 1;
            }
            // Places are given back in batches, not one write per end to
            // the count every registering thread updates (at thousands of
            // requests a second, each such write took its cache line from
            // the workers); a read that runs on gives them back as it goes.
            if freed == RELEASE_BATCH {
                registry.released(freed);
                freed = 0;
            }
        }
        if freed > 0 {
            registry.released(freed);
        }
        (events, ends)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ends_are_read_every_period_while_lanes_are_in_flight() {
        let period = Duration::from_millis(10);
        let idle = Duration::from_millis(100);
        assert_eq!(read_interval(false, period, idle), idle);
        assert_eq!(read_interval(true, period, idle), period);
        // A period longer than the idle tick never slows reading down.
        assert_eq!(read_interval(true, Duration::from_secs(1), idle), idle);
    }

    #[test]
    fn lanes_reserve_their_end_and_refuse_past_the_bound() {
        let registry = LaneRegistry::default();
        assert!(
            !registry.started(1, LaneLink::default(), 0),
            "no reader: no lane"
        );
        let reader = registry.open().expect("opened once");
        assert!(registry.open().is_none(), "and only once");
        let mut lanes = Lanes::default();
        for lane in 0..MAX_LANES_IN_FLIGHT as u64 {
            assert!(registry.started(lane, LaneLink::default(), lane));
        }
        assert!(!registry.started(u64::MAX, LaneLink::default(), 0));
        assert_eq!(registry.counters.refused.load(Ordering::Relaxed), 1);
        // Every end still fits: the queue holds a start and an end per lane.
        for lane in 0..MAX_LANES_IN_FLIGHT as u64 {
            registry.finished(lane, lane + 1);
        }
        assert_eq!(registry.counters.events_dropped.load(Ordering::Relaxed), 0);
        assert_eq!(registry.in_flight(), MAX_LANES_IN_FLIGHT);
        let (events, ends) = reader.read_into(&registry, &mut lanes);
        assert_eq!(events, 2 * MAX_LANES_IN_FLIGHT);
        assert_eq!(ends, MAX_LANES_IN_FLIGHT);
        assert_eq!(registry.in_flight(), 0);
        assert_eq!(lanes.finished(), MAX_LANES_IN_FLIGHT);
        assert!(
            registry.started(u64::MAX, LaneLink::default(), 0),
            "room again"
        );
    }

    #[test]
    fn a_lane_that_never_ends_gives_its_places_back_when_it_expires() {
        use crate::lanes::table::LANE_MAX_OPEN_NS;
        let registry = LaneRegistry::default();
        let reader = registry.open().expect("opened");
        let mut lanes = Lanes::default();
        // A root span that is never closed, and one that ends late.
        assert!(registry.started(1, LaneLink::default(), 0));
        assert!(registry.started(2, LaneLink::default(), 0));
        reader.read_into(&registry, &mut lanes);
        assert_eq!(registry.in_flight(), 2);
        let expired = lanes.prune(LANE_MAX_OPEN_NS + 1);
        assert_eq!(expired, 2);
        registry.released(expired);
        assert_eq!(registry.in_flight(), 0, "expired lanes hold no places");
        // Another request in flight, then the late end of an expired lane:
        // it frees nothing (its places went back at expiry).
        assert!(registry.started(3, LaneLink::default(), LANE_MAX_OPEN_NS + 2));
        registry.finished(2, LANE_MAX_OPEN_NS + 3);
        let (_, ends) = reader.read_into(&registry, &mut lanes);
        assert_eq!(ends, 1);
        assert_eq!(
            registry.in_flight(),
            1,
            "the request in flight keeps its places"
        );
        registry.finished(3, LANE_MAX_OPEN_NS + 4);
        reader.read_into(&registry, &mut lanes);
        assert_eq!(registry.in_flight(), 0);
    }
}
