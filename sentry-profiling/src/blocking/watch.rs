//! The chunk thread's watch over blocking polls: each thread's recent
//! samples of requests, the blocking polls waiting for theirs, the
//! windows, and the events that come out of them.
//!
//! A thread's samples leave the sampler in time order, so once a sample
//! of the poll's thread later than the poll's end has arrived, every
//! sample of the poll has (or the sampler had none to give: a poll whose
//! thread is never sampled again is read a second after its end, by the
//! sampler's reading of the context words, or at shutdown). Each thread
//! keeps its last [`RING_SAMPLES`] samples taken inside requests (about
//! 2.5 s at 101 Hz): a longer poll is read from its last 2.5 s.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use super::classify::{NO_CULPRIT, Names, PollSample, classify};
use super::event::{EventContext, build};
use super::windows::{Occurrence, Windows};
use super::{
    BlockingConfig, BlockingPoll, Counters, MAX_BLOCKING_EVENTS_PER_MINUTE, MAX_PENDING_POLLS,
};
use crate::attribution::is_lane;
use crate::sampler::Sample;
use crate::symbolize::Symbolizer;
use crate::unwind::ModuleSet;

/// Samples of requests kept per thread.
pub(crate) const RING_SAMPLES: usize = 256;
/// How long after its end a poll waits for a later sample of its thread.
const RESOLVE_WAIT_NS: u64 = 1_000_000_000;
/// Threads whose samples are kept, past which those not sampled for
/// [`THREAD_FORGET_NS`] are forgotten.
const MAX_THREADS_KEPT: usize = 256;
const THREAD_FORGET_NS: u64 = 10_000_000_000;

#[derive(Debug)]
struct Kept {
    timestamp_ns: u64,
    context: u64,
    frames: Arc<[u64]>,
    captured: bool,
}

#[derive(Debug)]
struct Ring {
    name: Arc<str>,
    /// The newest sample of the thread, of a request or not.
    newest_ns: u64,
    samples: VecDeque<Kept>,
}

/// Function names from the watch's own symbolizer (kept apart from the
/// chunk writer's, which `symbolize(false)` turns off: a culprit needs
/// names).
struct Resolve<'a> {
    symbolizer: &'a mut Symbolizer,
    modules: &'a ModuleSet,
}

impl Names for Resolve<'_> {
    fn function(&mut self, addr: u64) -> Option<Arc<str>> {
        self.symbolizer.function(self.modules, addr)
    }

    fn module(&self, addr: u64) -> Option<&str> {
        self.modules.find(addr).map(|m| m.path.as_str())
    }
}

/// See the module's doc.
#[derive(Debug)]
pub(crate) struct Watch {
    config: BlockingConfig,
    epoch: Instant,
    rings: HashMap<u32, Ring>,
    pending: Vec<BlockingPoll>,
    windows: Windows,
    symbolizer: Symbolizer,
}

impl Watch {
    pub(crate) fn new(config: BlockingConfig) -> Self {
        Self {
            config,
            epoch: Instant::now(),
            rings: HashMap::new(),
            pending: Vec::new(),
            windows: Windows::new(
                u64::try_from(config.interval.as_nanos()).unwrap_or(u64::MAX),
                MAX_BLOCKING_EVENTS_PER_MINUTE,
            ),
            symbolizer: Symbolizer::new(),
        }
    }

    /// Keeps the samples of requests of a batch, by thread.
    pub(crate) fn observe(&mut self, samples: &[Sample]) {
        for s in samples {
            let ring = self.rings.entry(s.thread_id()).or_insert_with(|| Ring {
                name: s.thread_name().clone(),
                newest_ns: 0,
                samples: VecDeque::with_capacity(RING_SAMPLES),
            });
            ring.newest_ns = ring.newest_ns.max(s.timestamp_ns());
            if !is_lane(s.context()) {
                continue;
            }
            if ring.samples.len() == RING_SAMPLES {
                ring.samples.pop_front();
            }
            if !Arc::ptr_eq(&ring.name, s.thread_name()) {
                ring.name = s.thread_name().clone();
            }
            ring.samples.push_back(Kept {
                timestamp_ns: s.timestamp_ns(),
                context: s.context(),
                frames: s.frames().clone(),
                captured: !s.is_repeated(),
            });
        }
    }

    /// Takes the blocking polls the lane table found, within the bound.
    pub(crate) fn take_polls(&mut self, polls: &mut Vec<BlockingPoll>, counters: &Counters) {
        let room = MAX_PENDING_POLLS.saturating_sub(self.pending.len());
        let lost = polls.len().saturating_sub(room);
        Counters::add(&counters.polls_lost, lost as u64);
        self.pending.extend(polls.drain(..).take(room));
    }

    /// Reads the polls whose samples are in (all of them with `all`),
    /// groups them, and returns the events of the windows that closed.
    /// `known_until_ns`: the sampler's last reading of the context words.
    pub(crate) fn step(
        &mut self,
        known_until_ns: u64,
        modules: &ModuleSet,
        counters: &Counters,
        profiler_id: Option<&str>,
        all: bool,
    ) -> Vec<sentry_core::protocol::Event<'static>> {
        let mut symbolizer = std::mem::take(&mut self.symbolizer);
        let mut names = Resolve {
            symbolizer: &mut symbolizer,
            modules,
        };
        let events = self.step_with(
            known_until_ns,
            modules,
            counters,
            profiler_id,
            all,
            &mut names,
        );
        self.symbolizer = symbolizer;
        events
    }

    /// [`Watch::step`], with function names from `names`.
    fn step_with(
        &mut self,
        known_until_ns: u64,
        modules: &ModuleSet,
        counters: &Counters,
        profiler_id: Option<&str>,
        all: bool,
        names: &mut dyn Names,
    ) -> Vec<sentry_core::protocol::Event<'static>> {
        let now = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.forget_threads(known_until_ns);
        let mut i = 0;
        let (mut read, mut lost, mut without_stack) = (0u64, 0u64, 0u64);
        while i < self.pending.len() {
            let p = &self.pending[i];
            let ring = self.rings.get(&p.tid);
            let complete = all
                || ring.is_some_and(|r| r.newest_ns > p.end_ns)
                || known_until_ns >= p.end_ns.saturating_add(RESOLVE_WAIT_NS);
            if !complete {
                i += 1;
                continue;
            }
            let poll = self.pending.swap_remove(i);
            let samples: Vec<PollSample> = ring
                .map(|r| {
                    r.samples
                        .iter()
                        .filter(|k| {
                            k.context == poll.lane
                                && k.timestamp_ns >= poll.start_ns
                                && k.timestamp_ns <= poll.end_ns
                        })
                        .map(|k| PollSample {
                            frames: Arc::clone(&k.frames),
                            captured: k.captured,
                        })
                        .collect()
                })
                .unwrap_or_default();
            let thread_name = ring.map(|r| Arc::clone(&r.name));
            let verdict = classify(&samples, names);
            if &*verdict.culprit == NO_CULPRIT {
                without_stack += 1;
                continue;
            }
            let occurrence = Occurrence {
                poll,
                verdict,
                thread_name,
            };
            if self.windows.add(occurrence, now) {
                read += 1;
            } else {
                lost += 1;
            }
        }
        Counters::add(&counters.polls, read);
        Counters::add(&counters.polls_lost, lost);
        Counters::add(&counters.polls_without_stack, without_stack);
        let mut closed = Vec::new();
        let dropped = self.windows.close_due(now, all, &mut closed);
        Counters::add(&counters.events_dropped, dropped.events);
        Counters::add(&counters.polls_in_dropped_events, dropped.polls);
        let ctx = EventContext {
            profiler_id,
            interval: self.config.interval,
        };
        closed
            .iter()
            .map(|c| build(c, &ctx, modules, names))
            .collect()
    }

    /// Forgets threads not sampled for a while once many are kept (threads
    /// that exited).
    fn forget_threads(&mut self, known_until_ns: u64) {
        if self.rings.len() <= MAX_THREADS_KEPT {
            return;
        }
        let before = known_until_ns.saturating_sub(THREAD_FORGET_NS);
        let pending: Vec<u32> = self.pending.iter().map(|p| p.tid).collect();
        self.rings
            .retain(|tid, r| r.newest_ns >= before || pending.contains(tid));
    }

    /// Polls waiting for their samples.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lanes::LaneLink;
    use std::time::Duration;

    const LANE: u64 = crate::attribution::LANE_BASE + 5;
    const MS: u64 = 1_000_000;

    fn sample(ts: u64, tid: i32, frames: &[u64], context: u64, repeated: bool) -> Sample {
        Sample::new(
            ts,
            tid,
            Arc::from("tokio-runtime-worker"),
            Arc::from(frames),
            context,
            repeated,
        )
    }

    fn poll(tid: u32, start_ns: u64, end_ns: u64) -> BlockingPoll {
        BlockingPoll {
            lane: LANE,
            tid,
            start_ns,
            end_ns,
            link: Arc::new(LaneLink {
                name: Arc::from("GET /crunch"),
                ..LaneLink::default()
            }),
        }
    }

    /// Every address is a function of the application's.
    struct AppNames;

    impl Names for AppNames {
        fn function(&mut self, addr: u64) -> Option<Arc<str>> {
            (addr >= 0x1000).then(|| Arc::from(format!("my_service::f{addr:x}").as_str()))
        }
        fn module(&self, _: u64) -> Option<&str> {
            None
        }
    }

    impl Watch {
        fn step_test(&mut self, known_until_ns: u64, counters: &Counters, all: bool) -> usize {
            self.step_with(
                known_until_ns,
                &ModuleSet::default(),
                counters,
                Some("ab"),
                all,
                &mut AppNames,
            )
            .len()
        }
    }

    fn config() -> BlockingConfig {
        BlockingConfig {
            enabled: true,
            threshold: Duration::from_millis(50),
            interval: Duration::from_secs(60),
        }
    }

    #[test]
    fn a_poll_waits_for_its_samples_then_joins_a_window() {
        let counters = Counters::default();
        let mut w = Watch::new(config());
        let modules = ModuleSet::default();
        let stack = [0x1234u64, 0x5678];
        w.observe(&[
            sample(100 * MS, 7, &stack, LANE, false),
            sample(110 * MS, 7, &stack, LANE, false),
            // Another request's sample on another thread.
            sample(110 * MS, 8, &[0x9], LANE + 1, false),
        ]);
        w.take_polls(&mut vec![poll(7, 95 * MS, 160 * MS)], &counters);
        assert_eq!(w.step_test(0, &counters, false), 0);
        assert_eq!(w.pending(), 1, "no sample of thread 7 after the poll yet");
        w.observe(&[
            sample(120 * MS, 7, &stack, LANE, false),
            sample(170 * MS, 7, &[0x42], 0, false),
        ]);
        assert_eq!(w.step_test(0, &counters, false), 0);
        assert_eq!(w.pending(), 0);
        assert_eq!(counters.snapshot().polls, 1);
        // Shutdown closes the window: one event.
        let events = w.step_with(0, &modules, &counters, Some("ab"), true, &mut AppNames);
        assert_eq!(events.len(), 1);
        let e = &events[0];
        assert_eq!(e.level, sentry_core::Level::Warning);
        assert_eq!(e.transaction.as_deref(), Some("GET /crunch"));
        let frames = &e.threads.values[0].stacktrace.as_ref().unwrap().frames;
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[1].instruction_addr, Some(0x1234.into()));
    }

    #[test]
    fn a_poll_whose_thread_goes_quiet_is_read_a_second_later() {
        let counters = Counters::default();
        let mut w = Watch::new(config());
        w.observe(&[sample(10 * MS, 9, &[0x1234], LANE, false)]);
        w.take_polls(&mut vec![poll(9, 0, 60 * MS)], &counters);
        w.step_test(500 * MS, &counters, false);
        assert_eq!(w.pending(), 1);
        w.step_test(1_100 * MS, &counters, false);
        assert_eq!(w.pending(), 0);
        assert_eq!(counters.snapshot().polls, 1);
    }

    #[test]
    fn a_poll_with_no_application_frame_is_counted_and_makes_no_event() {
        let counters = Counters::default();
        let mut w = Watch::new(config());
        let modules = ModuleSet::default();
        w.observe(&[
            sample(
                10 * MS,
                9,
                &[crate::frames::WAITING_UNREAD_FRAME],
                LANE,
                true,
            ),
            sample(70 * MS, 9, &[0x42], 0, false),
        ]);
        w.take_polls(&mut vec![poll(9, 0, 60 * MS)], &counters);
        assert!(w.step(0, &modules, &counters, None, true).is_empty());
        let s = counters.snapshot();
        assert_eq!((s.polls, s.polls_without_stack), (0, 1));
    }

    #[test]
    fn pending_polls_are_bounded() {
        let counters = Counters::default();
        let mut w = Watch::new(config());
        let mut many: Vec<_> = (0..MAX_PENDING_POLLS + 10)
            .map(|i| poll(1, i as u64, i as u64 + 60 * MS))
            .collect();
        w.take_polls(&mut many, &counters);
        assert!(many.is_empty());
        assert_eq!(w.pending(), MAX_PENDING_POLLS);
        assert_eq!(counters.snapshot().polls_lost, 10);
    }

    #[test]
    fn rings_keep_the_last_samples_of_requests_only() {
        let mut w = Watch::new(config());
        let samples: Vec<Sample> = (0..RING_SAMPLES as u64 + 20)
            .map(|i| sample(i * MS, 3, &[1], if i % 2 == 0 { LANE } else { 0 }, false))
            .collect();
        w.observe(&samples);
        let ring = &w.rings[&3];
        assert_eq!(ring.samples.len(), (RING_SAMPLES + 20) / 2);
        assert!(ring.samples.iter().all(|k| k.context == LANE));
        assert_eq!(ring.newest_ns, (RING_SAMPLES as u64 + 19) * MS);
    }
}
