//! Samples at the edges of a request's polls, added to a chunk after its
//! export view is built: Sentry weights a sample by the time to the next
//! sample of its thread, so a request's stacks and its `(suspended)` time
//! are charged exactly from where each poll began and ended, not from the
//! sampling grid.

use std::sync::Arc;

use rustc_hash::FxHashMap as HashMap;

use super::table::{Held, Lanes, Poll, WaitingStacks};
use crate::chunk::Chunk;
use crate::frames::{QUEUED_FRAME, UNCAPTURED_FRAME};

impl Lanes {
    /// Adds samples at the edges of each poll of a lane that began at or
    /// after `from_ns` (and at or before `until_ns`): at the poll's start, a
    /// sample of its thread with the stack of the lane's first sample in
    /// that poll (a poll without one: `(running: no stack captured in
    /// time)`, unless it is shorter than a tenth of a period), and at its
    /// end a `(suspended)` fill-in, unless the request ends there or is
    /// polled again within a tenth of a period. Where a wake queued the
    /// request while it awaited, a `(queued)` sample; inside a long poll,
    /// a sample for each period its thread was left without one.
    ///
    /// Sentry weights a sample by the time to the next sample of its
    /// thread. With samples only on the sampling grid, a request's last
    /// stack of a poll was charged up to a period of the time it then
    /// waited, and a `(suspended)` sample before a poll up to a period of
    /// the time it ran (BENCHMARKS §4, "What Sentry shows: poll edges").
    /// Called after the export view is
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
        let open = self.open_polls();
        let mut scope = EdgeScope {
            period_ns,
            close: super::min_poll_ns(period_ns),
            from_ns,
            until_ns,
            uncaptured: chunk.stack_id(&Arc::from(&[UNCAPTURED_FRAME][..])),
            waiting: WaitingStacks::new(),
            thread_times: HashMap::default(),
        };
        // The samples of each thread that polled a request for longer than
        // one and a half periods (see `EdgeScope::long_poll_gaps`).
        scope.thread_times = self
            .lanes
            .values()
            .flat_map(|l| l.polls.iter())
            .chain(open.values().flatten())
            .filter(|p| scope.long(p))
            .map(|p| (p.tid, Vec::new()))
            .collect();
        if !scope.thread_times.is_empty() {
            for s in chunk.samples() {
                if let Some(times) = scope.thread_times.get_mut(&s.thread_id) {
                    times.push(s.timestamp_ns);
                }
            }
            for times in scope.thread_times.values_mut() {
                times.sort_unstable();
            }
        }
        let mut added = 0;
        for (lane, info) in self.lanes.iter() {
            let samples = own.get(&lane).map(Vec::as_slice).unwrap_or(&[]);
            let polls: Vec<Poll> = info
                .polls
                .iter()
                .chain(open.get(&lane).into_iter().flatten())
                .copied()
                .collect();
            added += scope.lane_edges(chunk, lane, info, &polls, samples);
        }
        added
    }
}

/// What the edges of every lane of a chunk share (see
/// [`Lanes::add_poll_edges`]).
struct EdgeScope {
    period_ns: u64,
    /// Polls shorter than this, and samples this close to a poll's start,
    /// need no edge of their own.
    close: u64,
    /// The polls whose edges are added began in this window.
    from_ns: u64,
    until_ns: u64,
    /// The chunk's `(running: no stack captured in time)` stack.
    uncaptured: u32,
    waiting: WaitingStacks,
    /// Each thread's sample times, sorted, for the threads with a long
    /// poll.
    thread_times: HashMap<u32, Vec<u64>>,
}

impl EdgeScope {
    /// Whether `p` lasted longer than one and a half periods (up to the
    /// window's end if it is still open).
    fn long(&self, p: &Poll) -> bool {
        p.end_ns.unwrap_or(self.until_ns).saturating_sub(p.start_ns)
            > self.period_ns + self.period_ns / 2
    }

    /// The edges of `lane`'s `polls` (`samples`: its samples, by time);
    /// returns how many samples were added.
    fn lane_edges(
        &self,
        chunk: &mut Chunk,
        lane: u64,
        info: &super::table::Lane,
        polls: &[Poll],
        samples: &[(u64, u32, u32)],
    ) -> usize {
        let lane_end = info.end_ns.unwrap_or(u64::MAX);
        let ends = |p: &Poll| p.end_ns.unwrap_or(lane_end).min(lane_end).max(p.start_ns);
        let polled = Held::new(polls.iter().map(|p| (p.start_ns, ends(p))).collect());
        let queued = info.queued_stretches();
        let mut added = 0;
        // Where each queued stretch begins (a wake while the request was
        // awaiting), a `(queued)` sample, so that Sentry splits the time
        // between two polls at the wake. A wake during a poll queues the
        // request from that poll's end, whose edge below already shows it.
        for &(woken, _) in &info.queued {
            if woken >= self.from_ns.max(info.start_ns)
                && woken <= self.until_ns
                && woken < lane_end
                && !polled.holds(woken)
            {
                chunk.push_synthetic(woken, lane, self.waiting.of(QUEUED_FRAME));
                added += 1;
            }
        }
        for p in polls {
            if p.start_ns < self.from_ns.max(info.start_ns) || p.start_ns > self.until_ns {
                continue;
            }
            let end = ends(p);
            let i = samples.partition_point(|s| s.0 < p.start_ns);
            let first = samples[i..]
                .iter()
                .take_while(|s| s.0 <= end)
                .find(|s| s.1 == p.tid);
            let stack = match first {
                Some(&(ts, _, _)) if ts.saturating_sub(p.start_ns) < self.close => None,
                Some(&(_, _, stack)) => Some(stack),
                // A very short poll no sample caught changes what Sentry
                // shows by less than a tenth of a period: left to the
                // sampling grid, so requests that only hand work on do not
                // double their samples.
                None if end.saturating_sub(p.start_ns) < self.close => continue,
                // A poll between samples: no stack of it was captured.
                // Another poll's stack would show code that had not begun,
                // or had returned.
                None => Some(self.uncaptured),
            };
            if let Some(stack) = stack {
                chunk.push_copy(p.start_ns, p.tid, stack, lane);
                added += 1;
            }
            if self.long(p) {
                added += self.long_poll_gaps(chunk, lane, p, end);
            }
            // Polled again soon after (or still, by another thread running
            // a task of the same request): no gap to show.
            if end < lane_end
                && end <= self.until_ns
                && !polled.holds(end.saturating_add(self.close))
            {
                chunk.push_synthetic(end, lane, self.waiting.of(info.waiting_frame(&queued, end)));
                added += 1;
            }
        }
        added
    }

    /// Inside a long poll `p` of `lane` (ending at `end`), every period in
    /// which the sampler left its thread without a sample (its ticks late
    /// on a busy machine) gets one saying no stack was captured: the
    /// thread was in the request then (running, or preempted in it), and
    /// without it the thread's OS-thread timeline charged the whole gap to
    /// one `(running a request)` sample. The request's latest stack would
    /// show code that may have returned. Returns how many were added.
    fn long_poll_gaps(&self, chunk: &mut Chunk, lane: u64, p: &Poll, end: u64) -> usize {
        let (period_ns, half) = (self.period_ns, self.period_ns / 2);
        let times = self.thread_times.get(&p.tid).map_or(&[][..], Vec::as_slice);
        let mut added = 0;
        let mut t = p.start_ns.saturating_add(period_ns);
        while t.saturating_add(half) < end && t <= self.until_ns {
            let j = times.partition_point(|&x| x < t.saturating_sub(half));
            let sampled = times.get(j).is_some_and(|&x| x <= t + half);
            if !sampled {
                chunk.push_copy(t, p.tid, self.uncaptured, lane);
                added += 1;
            }
            t = t.saturating_add(period_ns);
        }
        added
    }
}
