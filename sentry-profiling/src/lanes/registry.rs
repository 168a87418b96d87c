//! Registering lanes from application threads, and reading them on the
//! chunk thread.
//!
//! An application thread (the tracing layer) reports a lane's start
//! through a bounded queue, and its end (and the transport its
//! transaction's window) through a ring of its own (see [`super::ring`]):
//! it never blocks, and allocates nothing beyond the start's event (and
//! its ring, once). Each lane *reserves* two places in the queue when it
//! registers (its start and its end), so a lane whose start was taken can
//! always report its end, in the queue when its thread's ring is full: no
//! finished request stays "open" collecting fill-ins. A request past the
//! bound is refused and stays on its OS threads (counted).
//!
//! The reader takes the rings' events before the queue's and applies them
//! after: an end it sees was written after its start (which was in the
//! queue by then), so no end comes before its lane's start.
//!
//! The threads' context words name lanes too, and are read after the
//! events; a thread publishes a root span's word just *before* it reports
//! the lane's start (the sampler, resumed by that root span, must find the
//! thread inside a request at its first tick, or it dozes through it). A
//! reader that takes the queue between the two, and the words after both,
//! sees the word of a lane it does not know yet: the lane table opens that
//! poll anyway ([`super::Lanes::apply_change`]), and files it under the
//! lane when the thread leaves it: a thread preempted between the two on a
//! busy machine keeps that window open for milliseconds, and the poll is
//! the request's. Starts stay in the queue: through the threads' rings they cost the
//! workers no less under `perf` (see BENCHMARKS.md).
//!
//! The chunk thread reads the queue each time the sampler thread hands it
//! a batch of samples (every 100 ms while it samples; at once when lanes
//! pile up) and before any chunk or profile is written, so no chunk is ever
//! written without the ends it covers. A request wakes nobody: only a
//! pile-up, a refusal, or the first lane while the sampler thread dozes
//! wakes it ([`LaneRegistry::set_wake`]).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Mutex, OnceLock};

use super::ring::{self, Writer};
use super::{LaneEvent, LaneLink, Lanes};

/// Lane events waiting for the chunk thread, at most.
pub(crate) const LANE_QUEUE: usize = 16_384;

/// Lanes registered whose end the chunk thread has not read yet, at
/// most. Each such lane holds two places in the lane queue (its start and
/// its end), so the queue never refuses an event. A request past this bound
/// (that many requests in flight at once) is not given a lane: its samples
/// stay on the OS threads that ran it (counted in
/// [`crate::ProfilerStats::lane_registrations_refused`]).
pub(crate) const MAX_LANES_IN_FLIGHT: usize = LANE_QUEUE / 2;

/// Events a thread's ring holds (see [`super::ring`]); past them, its
/// events wait in the shared queue.
const RING_LEN: usize = 256;

/// Ends read after which the reader gives their places back, at most.
const RELEASE_BATCH: usize = 256;

/// Lanes in flight from which the lane queue is read at once (the sampler
/// thread hands the chunk thread its batch at its next tick).
pub(crate) const LANES_HIGH_WATER: usize = MAX_LANES_IN_FLIGHT / 4;

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
    /// Wakes the sampler thread: when lanes pile up, or for the first lane
    /// while it dozes.
    wake: OnceLock<Wake>,
    /// The sampler thread dozes (the application idled): the next lane
    /// wakes it.
    asleep: AtomicBool,
    /// This registry's number (given when it is opened): a thread's ring
    /// belongs to one registry.
    number: OnceLock<u64>,
    /// Rings of threads that reported their first event, for the reader to
    /// take.
    new_rings: Mutex<Vec<ring::Reader<Closing>>>,
    new_rings_waiting: AtomicBool,
    pub(crate) counters: RegistryCounters,
}

/// How to wake the sampler thread (see [`LaneRegistry::set_wake`]).
struct Wake(Box<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for Wake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Wake")
    }
}

/// What an application thread reports through its ring.
#[derive(Debug)]
enum Closing {
    /// See [`LaneEvent::Finished`].
    Finished { lane: u64, end_ns: u64 },
    /// See [`LaneEvent::Transaction`].
    Transaction {
        lane: u64,
        start_ns: u64,
        end_ns: u64,
    },
}

impl Closing {
    fn lane(&self) -> u64 {
        match *self {
            Closing::Finished { lane, .. } | Closing::Transaction { lane, .. } => lane,
        }
    }
}

impl From<Closing> for LaneEvent {
    fn from(c: Closing) -> Self {
        match c {
            Closing::Finished { lane, end_ns } => LaneEvent::Finished { lane, end_ns },
            Closing::Transaction {
                lane,
                start_ns,
                end_ns,
            } => LaneEvent::Transaction {
                lane,
                start_ns,
                end_ns,
            },
        }
    }
}

thread_local! {
    /// This thread's ring, and the registry it belongs to.
    static RING: RefCell<Option<(u64, Writer<Closing>)>> = const { RefCell::new(None) };
}

/// The new rings, whether or not a thread panicked holding them (a push
/// or a take cannot leave the list half done).
fn lock(
    rings: &Mutex<Vec<ring::Reader<Closing>>>,
) -> std::sync::MutexGuard<'_, Vec<ring::Reader<Closing>>> {
    rings
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Numbers registries as they open.
static REGISTRIES: AtomicU64 = AtomicU64::new(1);

impl LaneRegistry {
    /// Creates the queue (once per session) and returns its reading end.
    pub(crate) fn open(&self) -> Option<LaneReader> {
        let (tx, rx) = std::sync::mpsc::sync_channel(LANE_QUEUE);
        self.events.set(tx).ok()?;
        let _ = self.number.set(REGISTRIES.fetch_add(1, Ordering::Relaxed));
        Some(LaneReader {
            events: rx,
            rings: Vec::new(),
            taken: Vec::new(),
        })
    }

    /// Reports `event` through this thread's ring (made on its first
    /// event), or through the queue when the ring is full or cannot be
    /// had (the thread is exiting). Returns false if neither took it.
    fn report(&self, event: Closing) -> bool {
        let (Some(&number), Some(tx)) = (self.number.get(), self.events.get()) else {
            return false;
        };
        let mut event = Some(event);
        // Nothing is done when this thread's locals are gone (it is
        // exiting) or in use (an event reported from inside this one): the
        // event goes to the queue.
        let _ = RING.try_with(|ring| {
            let Ok(mut ring) = ring.try_borrow_mut() else {
                return;
            };
            let writer = match &mut *ring {
                Some((n, writer)) if *n == number => writer,
                _ => {
                    let (writer, reader) = ring::ring(RING_LEN);
                    lock(&self.new_rings).push(reader);
                    self.new_rings_waiting.store(true, Ordering::Release);
                    &mut ring.insert((number, writer)).1
                }
            };
            if let Some(e) = event.take() {
                event = writer.push(e).err();
            }
        });
        match event {
            None => true,
            Some(event) => tx.try_send(event.into()).is_ok(),
        }
    }

    /// Records how to wake the sampler thread (set once).
    pub(crate) fn set_wake(&self, wake: Box<dyn Fn() + Send + Sync>) {
        let _ = self.wake.set(Wake(wake));
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
            self.wake();
            return false;
        };
        // The sampler thread reads the threads' words every period while it
        // ticks, so a request wakes nobody; only a pile-up does, or the
        // first request while it dozes (one wake-up per quiet spell). The
        // flag is read after the reservation above, a full barrier, and so
        // after this thread published the request's word: a sampler that
        // raised it after this read finds the word (see
        // `LaneRegistry::set_asleep`).
        if before + 1 == LANES_HIGH_WATER
            || (self.asleep.load(Ordering::SeqCst) && self.asleep.swap(false, Ordering::AcqRel))
        {
            self.wake();
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
        if self.events.get().is_some() && !self.report(Closing::Finished { lane, end_ns }) {
            self.counters.events_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The sampler thread is about to doze (`true`), or is awake again
    /// (`false`). After raising the flag it reads the threads' words again:
    /// a lane registered before the flag was seen had its word published
    /// by then.
    pub(crate) fn set_asleep(&self, asleep: bool) {
        self.asleep.store(asleep, Ordering::SeqCst);
        if asleep {
            std::sync::atomic::fence(Ordering::SeqCst);
        }
    }

    /// Reports the window of the transaction of `lane` (see
    /// [`LaneEvent::Transaction`]). It has no place reserved: with the
    /// queue full it is counted in `events_dropped`, and the lane keeps its
    /// root span's window. Never blocks.
    pub(crate) fn transaction(&self, lane: u64, start_ns: u64, end_ns: u64) {
        let event = Closing::Transaction {
            lane,
            start_ns,
            end_ns,
        };
        if self.events.get().is_some() && !self.report(event) {
            self.counters.events_dropped.fetch_add(1, Ordering::Relaxed);
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

    /// Wakes the sampler thread.
    fn wake(&self) {
        if let Some(wake) = self.wake.get() {
            (wake.0)();
        }
    }
}

/// The chunk thread's side of the lane queue.
#[derive(Debug)]
pub(crate) struct LaneReader {
    events: Receiver<LaneEvent>,
    /// The application threads' rings.
    rings: Vec<ring::Reader<Closing>>,
    /// Events taken from the rings, with their lane and the order taken
    /// (see [`LaneReader::read_into`]); emptied by each read.
    taken: Vec<(u64, u32, Option<Closing>)>,
}

impl LaneReader {
    /// Moves every event waiting into `lanes`, freeing the places of the
    /// lanes whose end it read. Returns how many events and how many ends
    /// it read.
    pub(crate) fn read_into(
        &mut self,
        registry: &LaneRegistry,
        lanes: &mut Lanes,
    ) -> (usize, usize) {
        if registry.new_rings_waiting.swap(false, Ordering::Acquire) {
            self.rings.append(&mut lock(&registry.new_rings));
        }
        // The rings first: an end taken here was written after its lane's
        // start went into the queue, which is read next.
        let mut order = 0u32;
        self.rings.retain_mut(|ring| {
            let finished = ring.is_finished();
            while let Some(event) = ring.pop() {
                self.taken.push((event.lane(), order, Some(event)));
                order = order.wrapping_add(1);
            }
            !finished
        });
        // By lane, each lane's in the order taken: a start read from the
        // queue finds its lane's end here, and the two are applied one
        // after the other, so each lane's memory is freed before the next
        // is allocated (every start before every end keeps the allocator
        // on its slow paths).
        self.taken
            .sort_unstable_by_key(|&(lane, order, _)| (lane, order));
        let mut tally = Tally::default();
        // The ends of lanes started before this read first.
        for (lane, _, event) in &mut self.taken {
            if lanes.knows(*lane)
                && let Some(event) = event.take()
            {
                tally.apply(event.into(), lanes, registry);
            }
        }
        for event in self.events.try_iter() {
            let started = match &event {
                LaneEvent::Started { lane, .. } => Some(*lane),
                _ => None,
            };
            tally.apply(event, lanes, registry);
            if let Some(lane) = started {
                let from = self.taken.partition_point(|t| t.0 < lane);
                for (l, _, event) in &mut self.taken[from..] {
                    if *l != lane {
                        break;
                    }
                    if let Some(event) = event.take() {
                        tally.apply(event.into(), lanes, registry);
                    }
                }
            }
        }
        // Those of lanes not (or no longer) known: counted as read.
        for (_, _, event) in self.taken.drain(..) {
            if let Some(event) = event {
                tally.apply(event.into(), lanes, registry);
            }
        }
        let Tally {
            events,
            ends,
            freed,
        } = tally;
        if freed > 0 {
            registry.released(freed);
        }
        (events, ends)
    }
}

/// What a read of the lane events applied.
#[derive(Default)]
struct Tally {
    events: usize,
    ends: usize,
    /// Places freed and not yet given back.
    freed: usize,
}

impl Tally {
    fn apply(&mut self, event: LaneEvent, lanes: &mut Lanes, registry: &LaneRegistry) {
        self.events += 1;
        if matches!(event, LaneEvent::Finished { .. }) {
            self.ends += 1;
        }
        if lanes.apply(event) {
            self.freed += 1;
        }
        // Places are given back in batches, not one write per end to the
        // count every registering thread updates (at thousands of requests
        // a second, each such write took its cache line from the workers);
        // a read that runs on gives them back as it goes.
        if self.freed == RELEASE_BATCH {
            registry.released(self.freed);
            self.freed = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_reserve_their_end_and_refuse_past_the_bound() {
        let registry = LaneRegistry::default();
        assert!(
            !registry.started(1, LaneLink::default(), 0),
            "no reader: no lane"
        );
        let mut reader = registry.open().expect("opened once");
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
    fn ends_reported_on_other_threads_are_never_read_before_their_starts() {
        // Each lane starts on one thread and ends on another (a task moved
        // at an `.await`), while the reader reads all along: every end
        // finds its lane, and every place comes back.
        const LANES: u64 = 20_000;
        let registry = std::sync::Arc::new(LaneRegistry::default());
        let mut reader = registry.open().expect("opened");
        let (hand_tx, hand_rx) = std::sync::mpsc::channel::<u64>();
        let starter = {
            let registry = std::sync::Arc::clone(&registry);
            std::thread::spawn(move || {
                for lane in 0..LANES {
                    while !registry.started(lane, LaneLink::default(), lane) {
                        std::thread::yield_now();
                    }
                    hand_tx.send(lane).unwrap();
                }
            })
        };
        let enders: Vec<_> = {
            let hand_rx = std::sync::Arc::new(std::sync::Mutex::new(hand_rx));
            (0..3)
                .map(|_| {
                    let registry = std::sync::Arc::clone(&registry);
                    let hand_rx = std::sync::Arc::clone(&hand_rx);
                    std::thread::spawn(move || {
                        loop {
                            let next = hand_rx.lock().unwrap().recv();
                            let Ok(lane) = next else { break };
                            registry.finished(lane, lane + 1);
                        }
                    })
                })
                .collect()
        };
        let mut lanes = Lanes::default();
        let mut ends = 0;
        while ends < LANES as usize {
            ends += reader.read_into(&registry, &mut lanes).1;
        }
        starter.join().unwrap();
        for e in enders {
            e.join().unwrap();
        }
        assert_eq!(lanes.finished(), LANES as usize);
        assert_eq!(registry.in_flight(), 0);
        assert_eq!(registry.counters.events_dropped.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn the_end_reported_by_a_thread_that_exited_is_read_and_its_ring_forgotten() {
        let registry = std::sync::Arc::new(LaneRegistry::default());
        let mut reader = registry.open().expect("opened");
        let mut lanes = Lanes::default();
        assert!(registry.started(7, LaneLink::default(), 1));
        let r = std::sync::Arc::clone(&registry);
        std::thread::spawn(move || r.finished(7, 2)).join().unwrap();
        assert_eq!(reader.read_into(&registry, &mut lanes), (2, 1));
        assert_eq!(lanes.finished(), 1);
        assert_eq!(registry.in_flight(), 0);
        reader.read_into(&registry, &mut lanes);
        assert!(reader.rings.is_empty(), "the exited thread's ring is gone");
    }

    #[test]
    fn a_lane_that_never_ends_gives_its_places_back_when_it_expires() {
        use crate::lanes::table::LANE_MAX_OPEN_NS;
        let registry = LaneRegistry::default();
        let mut reader = registry.open().expect("opened");
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
