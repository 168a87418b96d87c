//! The profiler thread's table of lanes: each lane's window (start, and end
//! once known), expiry of lanes left open, `(suspended)` fill-ins and end
//! samples with their caps, and the thread key each sample of a chunk is
//! filed under. Pure data: the profiler thread owns it, nothing else
//! touches it, and every rule here is unit-tested without a sampler.

use std::collections::HashMap;
use std::sync::Arc;

use super::{LaneEvent, LaneLink, SUSPENDED_FRAME, ThreadAttribution};
use crate::chunk::{Chunk, ChunkSample};
#[derive(Debug, Clone)]
struct Lane {
    link: Arc<LaneLink>,
    start_ns: u64,
    end_ns: Option<u64>,
}

/// How long a lane may stay open before it is taken to be lost (its root
/// span leaked, or its end was never reported) and forgotten, so that it
/// stops receiving fill-ins.
pub(crate) const LANE_MAX_OPEN_NS: u64 = 10 * 60 * 1_000_000_000;

/// Fill-in samples added to one chunk, at most; lanes past it are left with
/// their own samples (and the two every finished lane keeps).
pub(crate) const MAX_FILLS_PER_CHUNK: usize = 200_000;

/// What one [`Lanes::fill_suspended_from`] call added.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Filled {
    /// Fill-in samples added.
    pub(crate) added: usize,
    /// Suspended ticks left without a fill-in because the chunk reached
    /// [`MAX_FILLS_PER_CHUNK`].
    pub(crate) capped: usize,
}

/// The lanes the profiler thread knows about.
#[derive(Debug, Default)]
pub(crate) struct Lanes {
    lanes: HashMap<u64, Lane>,
    /// Lanes whose end is known (still kept until the chunk holding their
    /// end is written).
    finished: usize,
}

impl Lanes {
    /// Lanes known: open ones and finished ones not yet written out.
    pub(crate) fn len(&self) -> usize {
        self.lanes.len()
    }

    /// Of those, the finished ones.
    pub(crate) fn finished(&self) -> usize {
        self.finished
    }

    pub(crate) fn apply(&mut self, event: LaneEvent) {
        match event {
            LaneEvent::Started {
                lane,
                link,
                start_ns,
            } => {
                self.lanes.insert(
                    lane,
                    Lane {
                        link,
                        start_ns,
                        end_ns: None,
                    },
                );
            }
            LaneEvent::Finished { lane, end_ns } => {
                if let Some(l) = self.lanes.get_mut(&lane) {
                    if l.end_ns.replace(end_ns).is_none() {
                        self.finished += 1;
                    }
                }
            }
        }
    }

    /// Adds a fill-in sample for every tick (`period_ns` grid from the
    /// lane's start, or from the chunk's first sample for a lane that
    /// started earlier) at which a lane active during the chunk has no
    /// sample of its own within half a period. `until_ns` bounds lanes
    /// still open.
    pub(crate) fn fill_suspended(
        &self,
        chunk: &mut Chunk,
        period_ns: u64,
        until_ns: u64,
    ) -> Filled {
        let Some(chunk_start) = chunk.first_timestamp_ns() else {
            return Filled::default();
        };
        self.fill_suspended_from(chunk, period_ns, chunk_start, until_ns)
    }

    /// [`Lanes::fill_suspended`] from `from_ns` instead of the chunk's first
    /// sample: the profiler thread passes the end of what its previous chunk
    /// covered, so a lane that started while the sampler was still getting
    /// its first samples (a busy machine can take many milliseconds) is
    /// filled from its own start, as it would be at any later moment.
    pub(crate) fn fill_suspended_from(
        &self,
        chunk: &mut Chunk,
        period_ns: u64,
        from_ns: u64,
        until_ns: u64,
    ) -> Filled {
        let mut filled = Filled::default();
        if chunk.is_empty() {
            return filled;
        }
        let chunk_start = from_ns;
        let period_ns = period_ns.max(1);
        let mut own: HashMap<u64, Vec<u64>> = HashMap::new();
        for s in chunk.samples() {
            if self.lanes.contains_key(&s.context) {
                own.entry(s.context).or_default().push(s.timestamp_ns);
            }
        }
        for v in own.values_mut() {
            v.sort_unstable();
        }
        let stack: Arc<[u64]> = Arc::from(&[SUSPENDED_FRAME][..]);
        for (&lane, info) in &self.lanes {
            let end = info.end_ns.unwrap_or(until_ns).min(until_ns);
            let times = own.get(&lane).map(Vec::as_slice).unwrap_or(&[]);
            // The grid starts where both the lane and the chunk have begun.
            // Anchoring it at the chunk's start (rather than at the next
            // point of the lane's own grid) matters for a lane older than
            // the chunk: one period after the chunk's start it already has
            // its two samples, where the lane's grid could leave it one, and
            // Sentry drops single-sample threads.
            let mut t = info.start_ns.max(chunk_start);
            let mut pushed = 0;
            let mut last = None;
            while t <= end {
                // A sample from before the lane began (stamped before its
                // start was) does not cover its first tick.
                let from = t.saturating_sub(period_ns / 2).max(info.start_ns);
                let i = times.partition_point(|&x| x < from);
                let covered = times.get(i).is_some_and(|&x| x <= t + period_ns / 2);
                if !covered {
                    if filled.added >= MAX_FILLS_PER_CHUNK {
                        filled.capped += 1;
                    } else {
                        chunk.push_synthetic(t, lane, &stack);
                        filled.added += 1;
                        pushed += 1;
                        last = Some(t);
                    }
                }
                t = t.saturating_add(period_ns);
            }
            // Every lane that ended within the chunk gets a sample at its
            // end, and keeps at least two samples. Sentry weights each
            // sample by the time to the next one of its thread, so the end
            // sample gives the lane's last sample its duration; and Sentry
            // drops a thread with a single sample, after which the
            // transaction would link to nothing. A request shorter than a
            // period has at most one sample of its own (or one fill-in), so
            // it also gets one at its start (or just after its end).
            // These are never capped: they are what links the transaction.
            //
            // A lane can also end before `chunk_start`: its end was stamped
            // just before the previous chunk was written but read just
            // after, so that chunk took it for open (and gave it one
            // fill-in, perhaps, which a lane needs two of to be filed). It
            // gets its samples here, inside its own window.
            if let Some(lane_end) = info.end_ns.filter(|&e| e <= until_ns) {
                let mut count = times.len() + pushed;
                let start = if lane_end >= chunk_start {
                    info.start_ns.max(chunk_start)
                } else {
                    info.start_ns
                };
                let mut end_sampled = false;
                for t in [lane_end, start, lane_end.saturating_add(1)] {
                    if count >= 2 && end_sampled {
                        break;
                    }
                    let taken = last == Some(t) || times.binary_search(&t).is_ok();
                    if !taken {
                        chunk.push_synthetic(t, lane, &stack);
                        filled.added += 1;
                        count += 1;
                        last = Some(t);
                    }
                    end_sampled = true;
                }
            }
        }
        filled
    }

    /// The root span a lane stands for, if known.
    pub(crate) fn link(&self, lane: u64) -> Option<&Arc<LaneLink>> {
        self.lanes.get(&lane).map(|l| &l.link)
    }

    /// Forgets lanes that ended before `ns`, and lanes open for longer than
    /// [`LANE_MAX_OPEN_NS`] (returns how many of those expired).
    pub(crate) fn prune(&mut self, ns: u64) -> usize {
        let oldest = ns.saturating_sub(LANE_MAX_OPEN_NS);
        let mut expired = 0;
        let mut finished = 0;
        self.lanes.retain(|_, l| match l.end_ns {
            Some(e) => {
                let keep = e >= ns;
                finished += usize::from(keep);
                keep
            }
            None => {
                let keep = l.start_ns >= oldest;
                expired += usize::from(!keep);
                keep
            }
        });
        self.finished = finished;
        expired
    }

    /// How each sample of `chunk` is filed: under its lane (lane mode, known
    /// lane, at least two samples in the chunk), or under its OS thread; a
    /// fill-in sample of a lane that is not filed is left out.
    pub(crate) fn thread_keys(
        &self,
        chunk: &Chunk,
        mode: ThreadAttribution,
    ) -> Vec<Option<(u64, Option<Arc<str>>)>> {
        let mut per_lane: HashMap<u64, usize> = HashMap::new();
        if mode == ThreadAttribution::Lanes {
            for s in chunk.samples() {
                if self.lanes.contains_key(&s.context) {
                    *per_lane.entry(s.context).or_default() += 1;
                }
            }
        }
        chunk
            .samples()
            .iter()
            .map(|s: &ChunkSample| {
                if per_lane.get(&s.context).is_some_and(|&n| n >= 2) {
                    let name = self.lanes.get(&s.context).map(|l| l.link.name.clone());
                    Some((s.context, name))
                } else if s.thread_id == 0 {
                    None
                } else {
                    Some((u64::from(s.thread_id), None))
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Sample;
    use crate::lanes::{is_lane, new_lane};

    fn sample(ts: u64, tid: i32, context: u64) -> Sample {
        Sample::new(
            ts,
            tid,
            Arc::from("w"),
            Arc::from(&[1u64, 2][..]),
            context,
            false,
        )
    }

    #[test]
    fn files_lane_samples_under_the_lane_and_fills_suspended_ticks() {
        let lane = new_lane();
        assert!(is_lane(lane) && !is_lane(4_194_304));
        let mut lanes = Lanes::default();
        lanes.apply(LaneEvent::Started {
            lane,
            link: Arc::new(LaneLink {
                name: Arc::from("GET /x"),
                ..Default::default()
            }),
            start_ns: 1_000,
        });
        let mut chunk = Chunk::new();
        // Running at ticks 0 and 1 on two different workers, then suspended
        // for ticks 2..=4, and a sample of another thread outside any lane.
        chunk.push(&sample(1_000, 7, lane));
        chunk.push(&sample(1_000 + 10_000, 8, lane));
        chunk.push(&sample(1_000 + 10_000, 9, 0));
        chunk.push(&sample(1_000 + 20_000, 9, 0));
        lanes.apply(LaneEvent::Finished {
            lane,
            end_ns: 1_000 + 45_000,
        });
        lanes.fill_suspended(&mut chunk, 10_000, 1_000_000);
        assert_eq!(
            chunk.len(),
            4 + 3 + 1,
            "ticks 2, 3 and 4 were filled in, and the lane's end"
        );
        let end = chunk.samples().iter().map(|s| s.timestamp_ns).max();
        assert_eq!(end, Some(1_000 + 45_000), "a sample at the lane's end");
        let keys = lanes.thread_keys(&chunk, ThreadAttribution::Lanes);
        let lane_samples = keys.iter().flatten().filter(|(k, _)| *k == lane).count();
        assert_eq!(lane_samples, 6);
        assert_eq!(keys[2], Some((9, None)), "outside a lane: its OS thread");
        let os = lanes.thread_keys(&chunk, ThreadAttribution::OsThreads);
        assert_eq!(os[0], Some((7, None)));
        assert_eq!(
            os.iter().filter(|k| k.is_none()).count(),
            4,
            "fill-ins (and the end sample) need lanes"
        );
    }

    #[test]
    fn a_lane_older_than_the_chunk_is_filled_from_the_chunk_start() {
        // The request began half a period before the sampler's first sample
        // and slept throughout: 1.3 periods of it are inside the chunk, and
        // it gets two fill-ins (the lane's own grid would have given one),
        // and a sample at its end.
        let lane = new_lane();
        let mut lanes = Lanes::default();
        lanes.apply(LaneEvent::Started {
            lane,
            link: Arc::new(LaneLink::default()),
            start_ns: 1_000,
        });
        let mut chunk = Chunk::new();
        chunk.push(&sample(6_000, 9, 0));
        chunk.push(&sample(16_000, 9, 0));
        lanes.apply(LaneEvent::Finished {
            lane,
            end_ns: 19_000,
        });
        lanes.fill_suspended(&mut chunk, 10_000, 1_000_000);
        let keys = lanes.thread_keys(&chunk, ThreadAttribution::Lanes);
        assert_eq!(keys.iter().flatten().filter(|(k, _)| *k == lane).count(), 3);
    }

    #[test]
    fn a_lane_just_under_a_period_gets_a_second_sample_at_its_end() {
        // The transaction enclosing this lane may be just over a period long,
        // so the transport keeps its lane: it must have two samples.
        let lane = new_lane();
        let mut lanes = Lanes::default();
        lanes.apply(LaneEvent::Started {
            lane,
            link: Arc::new(LaneLink::default()),
            start_ns: 1_000,
        });
        let mut chunk = Chunk::new();
        chunk.push(&sample(500, 9, 0));
        chunk.push(&sample(30_000, 9, 0));
        lanes.apply(LaneEvent::Finished {
            lane,
            end_ns: 1_000 + 9_900,
        });
        lanes.fill_suspended(&mut chunk, 10_000, 1_000_000);
        let keys = lanes.thread_keys(&chunk, ThreadAttribution::Lanes);
        assert_eq!(keys.iter().flatten().filter(|(k, _)| *k == lane).count(), 2);
    }

    #[test]
    fn a_finished_lane_shorter_than_a_period_keeps_two_samples() {
        let lane = new_lane();
        let mut lanes = Lanes::default();
        lanes.apply(LaneEvent::Started {
            lane,
            link: Arc::new(LaneLink {
                name: Arc::from("GET /"),
                ..Default::default()
            }),
            start_ns: 5,
        });
        let mut chunk = Chunk::new();
        chunk.push(&sample(5, 7, lane));
        lanes.apply(LaneEvent::Finished { lane, end_ns: 6 });
        lanes.fill_suspended(&mut chunk, 10_000, 100);
        assert_eq!(chunk.len(), 2, "the sample and a fill-in at the lane's end");
        let keys = lanes.thread_keys(&chunk, ThreadAttribution::Lanes);
        assert!(
            keys.iter()
                .all(|k| k.as_ref().is_some_and(|(id, _)| *id == lane)),
            "both filed under the lane: {keys:?}"
        );
    }

    #[test]
    fn fill_ins_stop_at_the_chunk_cap_but_end_samples_do_not() {
        let mut lanes = Lanes::default();
        let period = 10_000;
        // Enough long-suspended lanes to pass the cap twice over.
        let ticks = 1_000;
        let n = (2 * MAX_FILLS_PER_CHUNK).div_ceil(ticks);
        let ids: Vec<u64> = (0..n).map(|_| new_lane()).collect();
        for &lane in &ids {
            lanes.apply(LaneEvent::Started {
                lane,
                link: Arc::new(LaneLink::default()),
                start_ns: 0,
            });
            lanes.apply(LaneEvent::Finished {
                lane,
                end_ns: (ticks as u64 - 1) * period + 5,
            });
        }
        assert_eq!((lanes.len(), lanes.finished()), (n, n));
        let mut chunk = Chunk::new();
        chunk.push(&sample(0, 9, 0));
        let filled = lanes.fill_suspended(&mut chunk, period, u64::MAX);
        assert!(filled.capped >= MAX_FILLS_PER_CHUNK - n, "{filled:?}");
        assert!(filled.added <= MAX_FILLS_PER_CHUNK + 2 * n, "{filled:?}");
        let keys = lanes.thread_keys(&chunk, ThreadAttribution::Lanes);
        for &lane in &ids {
            let own = keys.iter().flatten().filter(|(k, _)| *k == lane).count();
            assert!(own >= 2, "lane {lane} kept {own} samples");
        }
        assert_eq!(lanes.prune(u64::MAX), 0);
        assert_eq!((lanes.len(), lanes.finished()), (0, 0));
    }

    #[test]
    fn a_lane_whose_end_was_read_after_its_chunk_is_still_filed() {
        // The lane ran 5 µs before the first chunk was written at 20_000;
        // its end (at 16_000) was read only afterwards, so that chunk took
        // it for open and gave it a single fill-in, which is not filed.
        let lane = new_lane();
        let mut lanes = Lanes::default();
        lanes.apply(LaneEvent::Started {
            lane,
            link: Arc::new(LaneLink::default()),
            start_ns: 15_000,
        });
        let mut first = Chunk::new();
        first.push(&sample(10_000, 9, 0));
        first.push(&sample(19_000, 9, 0));
        lanes.fill_suspended_from(&mut first, 10_000, 0, 20_000);
        let keys = lanes.thread_keys(&first, ThreadAttribution::Lanes);
        assert_eq!(keys.iter().flatten().filter(|(k, _)| *k == lane).count(), 0);
        lanes.apply(LaneEvent::Finished {
            lane,
            end_ns: 16_000,
        });
        // The next chunk gives it two samples inside [start, end].
        let mut next = Chunk::new();
        next.push(&sample(25_000, 9, 0));
        lanes.fill_suspended_from(&mut next, 10_000, 20_000, 40_000);
        let keys = lanes.thread_keys(&next, ThreadAttribution::Lanes);
        let own: Vec<u64> = next
            .samples()
            .iter()
            .zip(&keys)
            .filter(|(_, k)| k.as_ref().is_some_and(|(id, _)| *id == lane))
            .map(|(s, _)| s.timestamp_ns)
            .collect();
        assert_eq!(own.len(), 2, "{own:?}");
        assert!(
            own.iter().all(|&t| (15_000..=16_000).contains(&t)),
            "{own:?}"
        );
        assert_eq!(lanes.prune(40_000), 0);
        assert_eq!(lanes.len(), 0);
    }

    #[test]
    fn lanes_open_too_long_expire() {
        let mut lanes = Lanes::default();
        let lane = new_lane();
        lanes.apply(LaneEvent::Started {
            lane,
            link: Arc::new(LaneLink::default()),
            start_ns: 1,
        });
        assert_eq!(lanes.prune(LANE_MAX_OPEN_NS), 0, "not yet");
        assert_eq!(lanes.len(), 1);
        assert_eq!(lanes.prune(LANE_MAX_OPEN_NS + 2), 1);
        assert_eq!(lanes.len(), 0);
    }

    #[test]
    fn an_open_lane_with_one_sample_falls_back_to_its_thread() {
        let lane = new_lane();
        let mut lanes = Lanes::default();
        lanes.apply(LaneEvent::Started {
            lane,
            link: Arc::new(LaneLink::default()),
            start_ns: 5,
        });
        let mut chunk = Chunk::new();
        chunk.push(&sample(5, 7, lane));
        lanes.fill_suspended(&mut chunk, 10_000, 6);
        assert_eq!(
            lanes.thread_keys(&chunk, ThreadAttribution::Lanes),
            vec![Some((7, None))]
        );
    }
}
