//! Samples at the edges of a request's polls, added to a chunk after its
//! export view is built: Sentry weights a sample by the time to the next
//! sample of its thread, so a request's stacks and its `(suspended)` time
//! are charged exactly from where each poll began and ended, not from the
//! sampling grid.

use std::sync::Arc;

use rustc_hash::FxHashMap as HashMap;

use super::table::{Held, Lanes, Poll, WaitingStacks};
use super::{QUEUED_FRAME, UNCAPTURED_FRAME};
use crate::chunk::Chunk;

/// The stack of the sample of `samples` (a lane's, by time: time, thread,
/// stack) nearest to `[from_ns, to_ns]` whose stack is not `uncaptured`.
fn nearest_captured(
    samples: &[(u64, u32, u32)],
    from_ns: u64,
    to_ns: u64,
    uncaptured: u32,
) -> Option<u32> {
    let i = samples.partition_point(|s| s.0 < from_ns);
    let before = samples[..i].iter().rev().find(|s| s.2 != uncaptured);
    let after = samples[i..]
        .iter()
        .find(|s| s.0 > to_ns && s.2 != uncaptured);
    let nearest = match (before, after) {
        (Some(b), Some(a)) => {
            if from_ns - b.0 <= a.0 - to_ns {
                b
            } else {
                a
            }
        }
        (b, a) => b.or(a)?,
    };
    Some(nearest.2)
}

impl Lanes {
    /// Adds samples at the edges of each poll of a lane that began at or
    /// after `from_ns` (and at or before `until_ns`): at the poll's start, a
    /// sample of its thread with the stack of the lane's first sample in
    /// that poll (or, a poll without one, the lane's sample nearest to it,
    /// or `(running: no stack captured in time)`), and at its end a
    /// `(suspended)` fill-in, unless the request ends there or is polled
    /// again within a tenth of a period.
    ///
    /// Sentry weights a sample by the time to the next sample of its
    /// thread. With samples only on the sampling grid, a request's last
    /// stack of a poll was charged up to a period of the time it then
    /// waited, and a `(suspended)` sample before a poll up to a period of
    /// the time it ran (measured: a /work request's `burn_cpu` time off by
    /// 20 to 44 % on a busy machine). Called after the export view is
    /// built: the edges shape Sentry's durations and are not samples of a
    /// period (pprof and OTLP count those).
    pub(crate) fn add_poll_edges(
        &self,
        chunk: &mut Chunk,
        period_ns: u64,
        from_ns: u64,
        until_ns: u64,
    ) -> usize {
        let period_ns = period_ns.max(1);
        let close = super::min_poll_ns(period_ns);
        // Each lane's samples by the thread that took them: (time, thread,
        // stack).
        let mut own: HashMap<u64, Vec<(u64, u32, u32)>> = HashMap::default();
        for s in chunk.samples() {
            if s.thread_id != 0 && self.lanes.get(&s.context).is_some_and(|l| l.polls_known) {
                own.entry(s.context)
                    .or_default()
                    .push((s.timestamp_ns, s.thread_id, s.stack));
            }
        }
        for v in own.values_mut() {
            v.sort_unstable();
        }
        let uncaptured = chunk.stack_id(&Arc::from(&[UNCAPTURED_FRAME][..]));
        // A period the sampler filed under a request before any stack of
        // that request was captured (on a starved machine, the first
        // capture can come 100 ms or more later) shows the request's
        // nearest captured stack, as a poll no sample caught does.
        let mut by_index: Vec<(usize, u64, u64)> = chunk
            .samples()
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.thread_id != 0 && s.stack == uncaptured && own.contains_key(&s.context)
            })
            .map(|(i, s)| (i, s.context, s.timestamp_ns))
            .collect();
        by_index.sort_unstable_by_key(|&(_, lane, ts)| (lane, ts));
        for (i, lane, ts) in by_index {
            let samples = &own[&lane];
            if let Some(stack) = nearest_captured(samples, ts, ts, uncaptured) {
                chunk.set_stack(i, stack);
            }
        }
        let open = self.open_polls();
        // The samples of each thread that polled a request for longer than
        // one and a half periods (see below).
        let long = |p: &Poll| {
            p.end_ns.unwrap_or(until_ns).saturating_sub(p.start_ns) > period_ns + period_ns / 2
        };
        let mut thread_times: HashMap<u32, Vec<u64>> = self
            .lanes
            .values()
            .flat_map(|l| l.polls.iter())
            .chain(open.values().flatten())
            .filter(|p| long(p))
            .map(|p| (p.tid, Vec::new()))
            .collect();
        if !thread_times.is_empty() {
            for s in chunk.samples() {
                if let Some(times) = thread_times.get_mut(&s.thread_id) {
                    times.push(s.timestamp_ns);
                }
            }
            for times in thread_times.values_mut() {
                times.sort_unstable();
            }
        }
        let waiting = WaitingStacks::new();
        let mut added = 0;
        for (lane, info) in self.lanes.iter() {
            let lane_end = info.end_ns.unwrap_or(u64::MAX);
            let samples = own.get(&lane).map(Vec::as_slice).unwrap_or(&[]);
            let ends = |p: &Poll| p.end_ns.unwrap_or(lane_end).min(lane_end).max(p.start_ns);
            let polls: Vec<Poll> = info
                .polls
                .iter()
                .chain(open.get(&lane).into_iter().flatten())
                .copied()
                .collect();
            let polled = Held::new(polls.iter().map(|p| (p.start_ns, ends(p))).collect());
            let queued = info.queued_stretches();
            // Where each queued stretch begins (a wake while the request
            // was awaiting), a `(queued)` sample, so that Sentry splits the
            // time between two polls at the wake. A wake during a poll
            // queues the request from that poll's end, whose edge below
            // already shows it.
            for &(woken, _) in &info.queued {
                if woken >= from_ns.max(info.start_ns)
                    && woken <= until_ns
                    && woken < lane_end
                    && !polled.holds(woken)
                {
                    chunk.push_synthetic(woken, lane, waiting.of(QUEUED_FRAME));
                    added += 1;
                }
            }
            for p in &polls {
                if p.start_ns < from_ns.max(info.start_ns) || p.start_ns > until_ns {
                    continue;
                }
                let end = ends(p);
                let i = samples.partition_point(|s| s.0 < p.start_ns);
                let first = samples[i..]
                    .iter()
                    .take_while(|s| s.0 <= end)
                    .find(|s| s.1 == p.tid);
                let stack = match first {
                    Some(&(ts, _, _)) if ts.saturating_sub(p.start_ns) < close => None,
                    Some(&(ts, _, stack)) if stack == uncaptured => {
                        Some(nearest_captured(samples, ts, ts, uncaptured).unwrap_or(uncaptured))
                    }
                    Some(&(_, _, stack)) => Some(stack),
                    // A very short poll no sample caught changes what Sentry
                    // shows by less than a tenth of a period: left to the
                    // sampling grid, so requests that only hand work on do
                    // not double their samples.
                    None if end.saturating_sub(p.start_ns) < close => continue,
                    // A poll between samples: the request's stack nearest to
                    // it in time, as the sampler records a period in which a
                    // thread was preempted inside a request; with no stack
                    // of the request at all, a frame that says so.
                    None => Some(
                        nearest_captured(samples, p.start_ns, end, uncaptured)
                            .unwrap_or(uncaptured),
                    ),
                };
                if let Some(stack) = stack {
                    chunk.push_copy(p.start_ns, p.tid, stack, lane);
                    added += 1;
                }
                // Inside a long poll, every period in which the sampler
                // left its thread without a sample (a busy machine: 20 to
                // 27 ms were seen) gets one, with the request's latest
                // stack: the thread was in the request then (running, or
                // preempted in it), and without it the thread's OS-thread
                // timeline charged the whole gap to one `(running a
                // request)` sample.
                if long(p) {
                    let times = thread_times.get(&p.tid).map_or(&[][..], Vec::as_slice);
                    let mut t = p.start_ns.saturating_add(period_ns);
                    while t.saturating_add(period_ns / 2) < end && t <= until_ns {
                        let j = times.partition_point(|&x| x < t.saturating_sub(period_ns / 2));
                        let sampled = times.get(j).is_some_and(|&x| x <= t + period_ns / 2);
                        let latest = samples[..samples.partition_point(|s| s.0 <= t)]
                            .last()
                            .map(|s| s.2)
                            .or(stack);
                        if let (false, Some(latest)) = (sampled, latest) {
                            chunk.push_copy(t, p.tid, latest, lane);
                            added += 1;
                        }
                        t = t.saturating_add(period_ns);
                    }
                }
                // Polled again soon after (or still, by another thread
                // running a task of the same request): no gap to show.
                if end < lane_end && end <= until_ns && !polled.holds(end.saturating_add(close)) {
                    chunk.push_synthetic(end, lane, waiting.of(info.waiting_frame(&queued, end)));
                    added += 1;
                }
            }
        }
        added
    }
}
