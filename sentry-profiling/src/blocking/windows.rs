//! No flood: the blocking polls of one culprit (the blocking site) are
//! grouped into windows of the configured interval, each closed into one
//! event that stands for all of them (count, worst, median), of the kind
//! most of them were read as (its fingerprint: culprit and that kind), and
//! events are bounded per minute across sites. A poll the sampler's
//! evidence misreads (a lock wait read as CPU on a saturated machine) thus
//! joins its site's event, counted under its own kind there, rather than
//! opening a second issue. Pure: time is passed in (monotonic
//! nanoseconds), so the rules are unit-tested.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::BlockingPoll;
use super::classify::Verdict;

/// Sites with a window open at once, at most; a poll of another one is
/// counted as lost until one closes.
pub(crate) const MAX_OPEN_WINDOWS: usize = 256;
/// Durations kept per window for its median; past it, each new one
/// replaces a kept one in turn (the median is then of a sample of them).
const MAX_DURATIONS_KEPT: usize = 1024;
const MINUTE_NS: u64 = 60_000_000_000;

/// One blocking poll, read: the poll, what it was doing, and its thread.
#[derive(Debug, Clone)]
pub(crate) struct Occurrence {
    pub(crate) poll: BlockingPoll,
    pub(crate) verdict: Verdict,
    pub(crate) thread_name: Option<Arc<str>>,
}

/// The polls of one kind in a window: how many, and the worst of them.
#[derive(Debug)]
struct OfKind {
    label: String,
    count: u64,
    worst: Occurrence,
}

#[derive(Debug)]
struct Window {
    opened_ns: u64,
    count: u64,
    durations: Vec<u64>,
    worst_ns: u64,
    /// By kind, in the order first seen (a site has one, rarely more).
    kinds: Vec<OfKind>,
}

impl Window {
    fn add_kind(&mut self, occurrence: Occurrence) {
        let label = occurrence.verdict.kind.label();
        let d = occurrence.poll.duration_ns();
        match self.kinds.iter_mut().find(|k| k.label == label) {
            Some(k) => {
                k.count += 1;
                if d > k.worst.poll.duration_ns() {
                    k.worst = occurrence;
                }
            }
            None => self.kinds.push(OfKind {
                label,
                count: 1,
                worst: occurrence,
            }),
        }
    }
}

/// A closed window: what its event says.
#[derive(Debug, Clone)]
pub(crate) struct Closed {
    /// How many blocking polls it stands for.
    pub(crate) count: u64,
    pub(crate) worst_ns: u64,
    pub(crate) median_ns: u64,
    /// The worst poll of the kind most polls were read as: its kind,
    /// stack, request and trace are the event's.
    pub(crate) worst: Occurrence,
    /// How many polls were read as each kind, most first (one entry
    /// unless some were read otherwise).
    pub(crate) kinds: Vec<(String, u64)>,
}

/// What [`Windows::close_due`] did not turn into events.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dropped {
    pub(crate) events: u64,
    pub(crate) polls: u64,
}

/// The open windows, by culprit, and the events of the last minute.
#[derive(Debug)]
pub(crate) struct Windows {
    interval_ns: u64,
    per_minute: usize,
    open: HashMap<Arc<str>, Window>,
    /// When each event of the last minute was made (oldest first).
    made: VecDeque<u64>,
}

impl Windows {
    pub(crate) fn new(interval_ns: u64, per_minute: usize) -> Self {
        Self {
            interval_ns: interval_ns.max(1),
            per_minute,
            open: HashMap::new(),
            made: VecDeque::with_capacity(per_minute),
        }
    }

    /// Groups one blocking poll, read at `now_ns`. False (the poll is
    /// lost) when its site has no window and [`MAX_OPEN_WINDOWS`] are
    /// open.
    pub(crate) fn add(&mut self, occurrence: Occurrence, now_ns: u64) -> bool {
        let d = occurrence.poll.duration_ns();
        if let Some(w) = self.open.get_mut(&occurrence.verdict.culprit) {
            if w.durations.len() < MAX_DURATIONS_KEPT {
                w.durations.push(d);
            } else {
                let i = (w.count as usize) % MAX_DURATIONS_KEPT;
                w.durations[i] = d;
            }
            w.count += 1;
            w.worst_ns = w.worst_ns.max(d);
            w.add_kind(occurrence);
            return true;
        }
        if self.open.len() >= MAX_OPEN_WINDOWS {
            return false;
        }
        let mut w = Window {
            opened_ns: now_ns,
            count: 1,
            durations: vec![d],
            worst_ns: d,
            kinds: Vec::with_capacity(1),
        };
        let key = Arc::clone(&occurrence.verdict.culprit);
        w.add_kind(occurrence);
        self.open.insert(key, w);
        true
    }

    /// Closes the windows open for an interval by `now_ns` (all of them
    /// with `all`, at shutdown) into `out`, oldest first, within the bound
    /// on events per minute; returns what the bound dropped.
    pub(crate) fn close_due(&mut self, now_ns: u64, all: bool, out: &mut Vec<Closed>) -> Dropped {
        let mut due: Vec<(u64, Arc<str>)> = self
            .open
            .iter()
            .filter(|(_, w)| all || now_ns.saturating_sub(w.opened_ns) >= self.interval_ns)
            .map(|(k, w)| (w.opened_ns, k.clone()))
            .collect();
        due.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        let mut dropped = Dropped::default();
        for (_, key) in due {
            let Some(w) = self.open.remove(&key) else {
                continue;
            };
            while self
                .made
                .front()
                .is_some_and(|&t| now_ns.saturating_sub(t) >= MINUTE_NS)
            {
                self.made.pop_front();
            }
            if self.made.len() >= self.per_minute {
                dropped.events += 1;
                dropped.polls += w.count;
                continue;
            }
            self.made.push_back(now_ns);
            let mut kinds = w.kinds;
            // Most polls first; between equals, the one with the worse poll.
            kinds.sort_by(|a, b| {
                b.count
                    .cmp(&a.count)
                    .then_with(|| b.worst.poll.duration_ns().cmp(&a.worst.poll.duration_ns()))
            });
            let tally = kinds.iter().map(|k| (k.label.clone(), k.count)).collect();
            let Some(first) = kinds.into_iter().next() else {
                continue;
            };
            out.push(Closed {
                count: w.count,
                worst_ns: w.worst_ns,
                median_ns: median(w.durations),
                worst: first.worst,
                kinds: tally,
            });
        }
        dropped
    }

    /// Windows open now.
    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        self.open.len()
    }
}

/// The median of `values` (the lower of the two middle ones).
fn median(mut values: Vec<u64>) -> u64 {
    if values.is_empty() {
        return 0;
    }
    let mid = (values.len() - 1) / 2;
    *values.select_nth_unstable(mid).1
}

#[cfg(test)]
mod tests {
    use super::super::classify::Kind;
    use super::*;
    use crate::lanes::LaneLink;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000 * MS;

    fn occurrence(culprit: &str, kind: Kind, ms: u64) -> Occurrence {
        Occurrence {
            poll: BlockingPoll {
                lane: 1,
                tid: 2,
                start_ns: 10 * S,
                end_ns: 10 * S + ms * MS,
                link: Arc::new(LaneLink::default()),
            },
            verdict: Verdict {
                kind,
                culprit: Arc::from(culprit),
                stack: Arc::from(&[1u64][..]),
            },
            thread_name: None,
        }
    }

    #[test]
    fn one_event_per_site_per_interval_with_count_worst_median() {
        let mut w = Windows::new(60 * S, 20);
        for (i, ms) in [120, 80, 300, 90, 100].into_iter().enumerate() {
            assert!(w.add(occurrence("crunch", Kind::Cpu, ms), i as u64 * S));
        }
        // Same culprit, read as another kind (worse, but alone): the
        // same site's event, counted under its kind there.
        assert!(w.add(occurrence("crunch", Kind::Lock, 400), 2 * S));
        // Another site opens its own window.
        assert!(w.add(occurrence("export", Kind::Cpu, 60), 2 * S));
        let mut out = Vec::new();
        assert_eq!(w.close_due(59 * S, false, &mut out), Dropped::default());
        assert!(out.is_empty(), "nothing is due before the interval");
        w.close_due(60 * S, false, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].count, 6);
        assert_eq!(out[0].worst_ns, 400 * MS);
        assert_eq!(out[0].median_ns, 100 * MS);
        assert_eq!(out[0].worst.verdict.kind, Kind::Cpu, "most polls' kind");
        assert_eq!(out[0].worst.poll.duration_ns(), 300 * MS);
        assert_eq!(
            out[0].kinds,
            vec![(Kind::Cpu.label(), 5), (Kind::Lock.label(), 1)]
        );
        // A poll after the window closed opens the next one.
        assert!(w.add(occurrence("crunch", Kind::Cpu, 70), 61 * S));
        w.close_due(62 * S, false, &mut out);
        assert_eq!(out.len(), 2, "the other site's window closes at 62 s");
        assert_eq!(w.open(), 1);
        w.close_due(62 * S, true, &mut out);
        assert_eq!(out.len(), 3, "shutdown closes every window");
        assert_eq!(out[2].count, 1);
    }

    #[test]
    fn a_global_bound_per_minute_drops_and_counts() {
        let mut w = Windows::new(S, 3);
        let mut out = Vec::new();
        let mut dropped = Dropped::default();
        for second in 0..10u64 {
            for site in ["a", "b"] {
                w.add(occurrence(site, Kind::Cpu, 60), second * S);
                w.add(occurrence(site, Kind::Cpu, 60), second * S);
            }
            let d = w.close_due((second + 1) * S, false, &mut out);
            dropped.events += d.events;
            dropped.polls += d.polls;
        }
        assert_eq!(out.len(), 3, "at most three in the first minute");
        assert_eq!(dropped.events, 17);
        assert_eq!(dropped.polls, 34);
        // A minute later the budget is back.
        w.add(occurrence("a", Kind::Cpu, 60), 70 * S);
        w.close_due(71 * S, false, &mut out);
        assert_eq!(out.len(), 4);
    }

    #[test]
    fn open_windows_are_bounded() {
        let mut w = Windows::new(S, 20);
        for i in 0..MAX_OPEN_WINDOWS {
            assert!(w.add(occurrence(&format!("f{i}"), Kind::Cpu, 60), 0));
        }
        assert!(!w.add(occurrence("one more", Kind::Cpu, 60), 0));
        assert!(
            w.add(occurrence("f0", Kind::Cpu, 60), 0),
            "an open one still takes polls"
        );
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![]), 0);
        assert_eq!(median(vec![5]), 5);
        assert_eq!(median(vec![9, 1, 5, 7]), 5);
    }
}
