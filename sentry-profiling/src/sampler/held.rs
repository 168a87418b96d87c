//! A thread's held samples: what waits to leave its ledger, in time order.
//!
//! A thread's samples leave in time order: a fill is held until the thread
//! is known alive at its time (no sample outlives its thread) and where it
//! stands is known, and the samples after it wait with it. This is the
//! queue's own concern: its order, the time up to which the thread is
//! known alive, and the time of the latest sample that left, after which
//! every later one is stamped. Which slot a sample takes is placement's
//! (`slots.rs`); what a fill shows when it leaves, the ledger's
//! (`ledger.rs`).

use std::collections::VecDeque;

use super::Sample;
use super::periods::AtTick;

/// Most samples a thread may hold; more means the oldest is written out.
pub(super) const MAX_PENDING: usize = 256;

/// A thread's sample waiting to be emitted.
#[derive(Debug)]
pub(super) enum Pending {
    /// A tick at which the thread was not captured, to be recorded with the
    /// stack it waits in (and the context word captured with that stack)
    /// once the thread is known alive at or after it; `at_tick` is what the
    /// thread's published context word said at the tick.
    Fill {
        timestamp_ns: u64,
        /// The context word the thread published at the fill's moment
        /// (see `periods::standing`).
        word: Option<Option<u64>>,
        at_tick: AtTick,
    },
    /// A sample of running code.
    Sample(Sample),
}

impl Pending {
    pub(super) fn timestamp_ns(&self) -> u64 {
        match self {
            Self::Fill { timestamp_ns, .. } => *timestamp_ns,
            Self::Sample(s) => s.timestamp_ns(),
        }
    }
}

/// One thread's held samples (see the module doc).
#[derive(Debug, Default)]
pub(super) struct Held {
    /// In time order.
    pending: VecDeque<Pending>,
    /// The time up to which the thread is known to have been alive.
    alive_ns: u64,
    /// The newest timestamp of the samples that left so far.
    emitted_ns: u64,
}

impl Held {
    /// The time up to which the thread is known to have been alive.
    pub(super) fn alive_ns(&self) -> u64 {
        self.alive_ns
    }

    /// The thread is known to have been alive at `ns`.
    pub(super) fn alive_at(&mut self, ns: u64) {
        self.alive_ns = self.alive_ns.max(ns);
    }

    /// The thread is known alive up to `ns` and no later (set anew, as
    /// when its held samples were dropped).
    pub(super) fn alive_until(&mut self, ns: u64) {
        self.alive_ns = ns;
    }

    /// The newest timestamp of the samples that left so far.
    pub(super) fn emitted_ns(&self) -> u64 {
        self.emitted_ns
    }

    /// Queues a sample of running code in time order. One older than a
    /// sample that already left (a capture harvested a tick late) is moved
    /// just after it: a thread's samples leave in time order. Returns the
    /// time it is queued at.
    pub(super) fn push_sample(&mut self, sample: Sample) -> u64 {
        let sample = if sample.timestamp_ns() <= self.emitted_ns {
            sample.at(self.emitted_ns + 1)
        } else {
            sample
        };
        let ts = sample.timestamp_ns();
        self.alive_at(ts);
        self.insert(Pending::Sample(sample));
        ts
    }

    /// Queues a fill for the slot `slot` (moved after the samples that
    /// already left, if it is not).
    pub(super) fn push_fill(&mut self, slot: u64, word: Option<Option<u64>>, at_tick: AtTick) {
        let timestamp_ns = slot.max(self.emitted_ns + 1);
        self.insert(Pending::Fill {
            timestamp_ns,
            word,
            at_tick,
        });
    }

    fn insert(&mut self, item: Pending) {
        let ts = item.timestamp_ns();
        let at = self
            .pending
            .iter()
            .rposition(|p| p.timestamp_ns() <= ts)
            .map_or(0, |i| i + 1);
        self.pending.insert(at, item);
    }

    /// The slots of the fills held, oldest first.
    pub(super) fn fills(&self) -> Vec<u64> {
        self.pending
            .iter()
            .filter_map(|p| match p {
                Pending::Fill { timestamp_ns, .. } => Some(*timestamp_ns),
                Pending::Sample(_) => None,
            })
            .collect()
    }

    /// How many fills are held.
    pub(super) fn fill_count(&self) -> usize {
        self.pending
            .iter()
            .filter(|p| matches!(p, Pending::Fill { .. }))
            .count()
    }

    /// How many samples of running code are held.
    pub(super) fn samples_queued(&self) -> usize {
        self.pending
            .iter()
            .filter(|p| matches!(p, Pending::Sample(_)))
            .count()
    }

    /// Whether a fill is held later than `after_ns` and no later than
    /// `up_to_ns`.
    pub(super) fn any_fill_within(&self, after_ns: u64, up_to_ns: u64) -> bool {
        self.pending.iter().any(|p| {
            matches!(p, Pending::Fill { timestamp_ns, .. }
                if *timestamp_ns > after_ns && *timestamp_ns <= up_to_ns)
        })
    }

    /// How many fills up to `up_to_ns` stand where the thread's word does
    /// not say (outside any request, or not known): their place is a
    /// guess.
    pub(super) fn guessed_fills_up_to(&self, up_to_ns: u64) -> usize {
        self.pending
            .iter()
            .filter(|p| {
                matches!(p, Pending::Fill { timestamp_ns, at_tick: AtTick::Outside | AtTick::Unknown, .. }
                    if *timestamp_ns <= up_to_ns)
            })
            .count()
    }

    /// How many held fills `counts` counts, from their time and where they
    /// stand.
    pub(super) fn count_fills(&self, counts: impl Fn(u64, &AtTick) -> bool) -> usize {
        self.pending
            .iter()
            .filter(|p| match p {
                Pending::Fill {
                    timestamp_ns,
                    at_tick,
                    ..
                } => counts(*timestamp_ns, at_tick),
                Pending::Sample(_) => false,
            })
            .count()
    }

    /// The latest queued sample of running code before `t` (0: none).
    /// Those are never cancelled: a gap checked against them and the
    /// samples already emitted stays checked whatever fills are cancelled
    /// later.
    pub(super) fn running_before(&self, t: u64) -> u64 {
        self.pending
            .iter()
            .filter_map(|p| match p {
                Pending::Sample(s) if s.timestamp_ns() < t => Some(s.timestamp_ns()),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// The earliest queued sample of running code after `t`.
    pub(super) fn running_after(&self, t: u64) -> Option<u64> {
        self.pending
            .iter()
            .filter_map(|p| match p {
                Pending::Sample(s) if s.timestamp_ns() > t => Some(s.timestamp_ns()),
                _ => None,
            })
            .min()
    }

    /// The held fills strictly between `after_ns` and `before_ns`: their
    /// time, the word the thread published then, and where they stand
    /// (to be rewritten).
    pub(super) fn fills_between(
        &mut self,
        after_ns: u64,
        before_ns: u64,
    ) -> impl Iterator<Item = (u64, Option<Option<u64>>, &mut AtTick)> {
        self.pending.iter_mut().filter_map(move |p| match p {
            Pending::Fill {
                timestamp_ns,
                word,
                at_tick,
            } if *timestamp_ns > after_ns && *timestamp_ns < before_ns => {
                Some((*timestamp_ns, *word, at_tick))
            }
            _ => None,
        })
    }

    /// Cancels the held fills of these slots.
    pub(super) fn cancel(&mut self, slots: &[u64]) {
        if slots.is_empty() {
            return;
        }
        self.pending.retain(
            |p| !matches!(p, Pending::Fill { timestamp_ns, .. } if slots.contains(timestamp_ns)),
        );
    }

    /// Forgets the held samples (those after the thread was last known
    /// alive, when it is dropped from sampling).
    pub(super) fn clear(&mut self) {
        self.pending.clear();
    }

    /// The oldest held sample.
    pub(super) fn front(&self) -> Option<&Pending> {
        self.pending.front()
    }

    /// Takes the oldest held sample out.
    pub(super) fn pop_front(&mut self) -> Option<Pending> {
        self.pending.pop_front()
    }

    /// Whether more than [`MAX_PENDING`] are held: the oldest then leaves
    /// whatever it waits for.
    pub(super) fn overfull(&self) -> bool {
        self.pending.len() > MAX_PENDING
    }

    /// The time a sample leaving now at `timestamp_ns` is stamped with:
    /// strictly after what left before (two queued at one moment).
    pub(super) fn stamp(&mut self, timestamp_ns: u64) -> u64 {
        self.emitted_ns = timestamp_ns.max(self.emitted_ns + 1);
        self.emitted_ns
    }

    /// A queue whose latest sample left at `emitted_ns` (for the tests of
    /// placement, which start a story there).
    #[cfg(test)]
    pub(super) fn emitted_at(emitted_ns: u64) -> Self {
        Self {
            emitted_ns,
            ..Self::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn sample(ts: u64) -> Sample {
        Sample::new(ts, 7, Arc::from("t"), Arc::from(&[1u64][..]), 0, false)
    }

    #[test]
    fn samples_and_fills_are_held_in_time_order_and_never_before_what_left() {
        let mut h = Held::default();
        h.push_sample(sample(300));
        h.push_fill(100, None, AtTick::Unknown);
        h.push_fill(200, None, AtTick::Outside);
        assert_eq!(h.fills(), [100, 200]);
        assert_eq!(h.alive_ns(), 300, "a capture shows the thread alive");
        let order: Vec<u64> = std::iter::from_fn(|| h.pop_front())
            .map(|p| p.timestamp_ns())
            .collect();
        assert_eq!(order, [100, 200, 300]);
        // Something left at 300: a late capture and a late fill are queued
        // after it, and stamped strictly after one another.
        assert_eq!(h.stamp(300), 300);
        assert_eq!(h.push_sample(sample(250)), 301);
        h.push_fill(260, None, AtTick::Unknown);
        assert_eq!(h.fills(), [301]);
        assert_eq!(h.stamp(301), 301);
        assert_eq!(h.stamp(301), 302);
    }

    #[test]
    fn running_samples_around_a_fill_and_the_guessed_fills() {
        let mut h = Held::default();
        h.push_sample(sample(100));
        h.push_fill(200, None, AtTick::Outside);
        h.push_fill(300, Some(Some(5)), AtTick::InRequest(5));
        h.push_sample(sample(400));
        assert_eq!(h.running_before(200), 100);
        assert_eq!(h.running_before(100), 0);
        assert_eq!(h.running_after(300), Some(400));
        assert_eq!(h.running_after(400), None);
        assert_eq!((h.fill_count(), h.samples_queued()), (2, 2));
        assert_eq!(h.guessed_fills_up_to(1_000), 1);
        assert!(h.any_fill_within(250, 300) && !h.any_fill_within(300, 1_000));
        let between: Vec<u64> = h.fills_between(100, 300).map(|f| f.0).collect();
        assert_eq!(between, [200]);
        h.cancel(&[200]);
        assert_eq!(h.fills(), [300]);
    }
}
