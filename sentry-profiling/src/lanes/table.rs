//! The chunk thread's table of lanes: each lane's window (start, and end
//! once known), expiry of lanes left open, `(suspended)` fill-ins and end
//! samples with their caps, and the thread key each sample of a chunk is
//! filed under. Pure data: the chunk thread owns it, nothing else
//! touches it, and every rule here is unit-tested without a sampler.

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

use super::{Change, LaneEvent, LaneLink, NOT_WOKEN};
use crate::attribution::{ThreadAttribution, is_lane};
use crate::chunk::{Chunk, ChunkSample};
use crate::frames::{AWAITING_FRAME, QUEUED_FRAME, SUSPENDED_FRAME};

#[derive(Debug, Clone)]
pub(super) struct Lane {
    pub(super) link: Arc<LaneLink>,
    pub(super) start_ns: u64,
    pub(super) end_ns: Option<u64>,
    /// The end of the lane's transaction, once reported (see
    /// [`LaneEvent::Transaction`]; 0 before): the lane ends then.
    pub(super) transaction_end_ns: u64,
    /// The finished polls of the request's future (the stretches in which
    /// a thread published the lane as its context word) long enough to be
    /// kept (see [`Lanes::apply_change`]).
    pub(super) polls: Vec<Poll>,
    /// Whether any thread was seen entering the lane: its polls are known
    /// (those too short to be kept were short).
    pub(super) polls_known: bool,
    /// The stretches in which an instrumented future of the request was
    /// woken and waited for a worker to poll it (wake to poll start), long
    /// enough to be kept (see [`Lanes::apply_change`]).
    pub(super) queued: Vec<(u64, u64)>,
    /// Whether the request's futures say when they are woken (the
    /// instrumented ones do): its time between polls is then either queued
    /// or awaiting, not the undivided `(suspended)`.
    pub(super) wakes_known: bool,
    /// Whether its transaction is known to be one Sentry never links to a
    /// profile (see [`super::SHORTEST_LINKED_NS`]).
    pub(super) unlinked: bool,
}

impl Lane {
    /// A lane that started at `start_ns`, nothing else known of it yet.
    pub(super) fn started(link: Arc<LaneLink>, start_ns: u64) -> Self {
        Self {
            link,
            start_ns,
            end_ns: None,
            transaction_end_ns: 0,
            polls: Vec::new(),
            polls_known: false,
            queued: Vec::new(),
            wakes_known: false,
            unlinked: false,
        }
    }

    /// The frame a fill-in at `t`, a moment the request was not polled,
    /// shows: queued if an instrumented future of it was woken and not yet
    /// polled then, awaiting if its wakes are known and none was pending,
    /// and the undivided `(suspended)` otherwise.
    pub(super) fn waiting_frame(&self, queued: &Held, t: u64) -> u64 {
        if !self.wakes_known {
            SUSPENDED_FRAME
        } else if queued.holds(t) {
            QUEUED_FRAME
        } else {
            AWAITING_FRAME
        }
    }

    /// The lane's queued stretches, for [`Lane::waiting_frame`].
    pub(super) fn queued_stretches(&self) -> Held {
        Held::new(self.queued.clone())
    }
}

/// The one-frame stacks of a waiting lane's samples (see
/// [`Lane::waiting_frame`]), made once per fill.
pub(super) struct WaitingStacks([Arc<[u64]>; 3]);

impl WaitingStacks {
    pub(super) fn new() -> Self {
        Self([SUSPENDED_FRAME, QUEUED_FRAME, AWAITING_FRAME].map(|frame| Arc::from(&[frame][..])))
    }

    /// The stack of `frame`, one of the three waiting frames.
    pub(super) fn of(&self, frame: u64) -> &Arc<[u64]> {
        self.0.iter().find(|s| s[0] == frame).unwrap_or(&self.0[0])
    }
}

/// One poll of a request: thread `tid` ran it from `start_ns` to `end_ns`
/// (`None`: still running it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Poll {
    pub(super) tid: u32,
    pub(super) start_ns: u64,
    pub(super) end_ns: Option<u64>,
}

/// Most polls kept per lane between two chunks; later ones are counted
/// (see [`Lanes::apply_change`]) and the lane falls back to its samples.
pub(crate) const MAX_POLLS_PER_LANE: usize = 4096;

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

/// Stretches of time in which a lane ran: its polls, or where they are not
/// known, the stretches in which it held a thread (see
/// [`Lanes::held_stretches`]). Sorted by their start, with the latest end
/// of any stretch up to each one, so whether a moment lies inside one is a
/// binary search.
#[derive(Debug)]
pub(super) struct Held {
    starts: Vec<u64>,
    ends_so_far: Vec<u64>,
}

impl Held {
    pub(super) fn new(mut stretches: Vec<(u64, u64)>) -> Self {
        stretches.sort_unstable();
        let mut latest = 0;
        let ends_so_far = stretches
            .iter()
            .map(|&(_, end)| {
                latest = latest.max(end);
                latest
            })
            .collect();
        Self {
            starts: stretches.into_iter().map(|(start, _)| start).collect(),
            ends_so_far,
        }
    }

    /// Whether `t` lies inside a stretch.
    pub(super) fn holds(&self, t: u64) -> bool {
        let i = self.starts.partition_point(|&start| start <= t);
        i > 0 && self.ends_so_far[i - 1] >= t
    }
}

/// The lanes the chunk thread knows about.
#[derive(Debug, Default)]
pub(crate) struct Lanes {
    pub(super) lanes: super::lane_map::LaneMap<Lane>,
    /// The poll each thread is in: its lane, and since when.
    pub(super) open: HashMap<u32, (u64, u64)>,
    /// Lanes whose end is known (still kept until the chunk holding their
    /// end is written).
    pub(super) finished: usize,
    /// A poll at least this long is a long poll (see [`Lanes::long_polls`];
    /// 0: the default threshold).
    long_poll_ns: u64,
    /// Whether a lane is forgotten as soon as its transaction is known to
    /// be one Sentry never links (see [`Lanes::drop_unlinked`]).
    drop_unlinked: bool,
    /// Lanes forgotten so, since [`Lanes::take_dropped_unlinked`] last took
    /// the count.
    dropped_unlinked: u64,
    /// A finished poll at least this long is a blocking poll (0: none is;
    /// see [`Lanes::with_blocking_ns`]).
    blocking_ns: u64,
    /// The blocking polls found since [`Lanes::take_blocking`] last took
    /// them, at most [`super::MAX_BLOCKING_POLLS`].
    blocking: Vec<super::BlockingPoll>,
    /// Blocking polls past that bound, since the last take.
    blocking_lost: u64,
    /// The threads whose open poll runs work handed off the request (see
    /// `Change::off_worker`): not a worker's, never a blocking poll.
    off_worker: rustc_hash::FxHashSet<u32>,
}

/// The long polls of the lanes: by (lane, thread), the stretches in which
/// that thread polled that request for at least the long-poll threshold.
#[derive(Debug, Default)]
pub(crate) struct LongPolls {
    by_poller: HashMap<(u64, u32), Vec<(u64, u64)>>,
}

impl LongPolls {
    /// Whether thread `tid`, at `t`, was inside a long poll of `lane`.
    pub(crate) fn holds(&self, lane: u64, tid: u32, t: u64) -> bool {
        self.by_poller
            .get(&(lane, tid))
            .is_some_and(|polls| polls.iter().any(|&(from, to)| from <= t && t <= to))
    }
}

impl Lanes {
    /// An empty table whose long polls are those of `long_poll_ns` or more.
    pub(crate) fn with_long_poll_ns(long_poll_ns: u64) -> Self {
        Self {
            long_poll_ns,
            ..Self::default()
        }
    }

    /// Forget each lane as soon as both its end and its transaction's
    /// window are known and that transaction lasted less than
    /// [`super::SHORTEST_LINKED_NS`]: Sentry (Relay) unlinks such a
    /// transaction from every profile, so its lane's samples would show
    /// nowhere. The request's samples of running code are then filed under
    /// the OS threads that took them, its waits get no fill-in, and it does
    /// not count towards a chunk's finished lanes. For chunks sent to
    /// Sentry only: the exports label samples with their request whatever
    /// its length, and transaction profiles (V1) are not unlinked so.
    pub(crate) fn drop_unlinked(mut self, on: bool) -> Self {
        self.drop_unlinked = on;
        self
    }

    /// Report each finished poll at least `blocking_ns` long of a known
    /// lane (0: none) for [`Lanes::take_blocking`]: the blocking polls
    /// that become issue events (see `crate::blocking`). Found here, where
    /// the polls' ends are read from the context words on the chunk
    /// thread: the request's worker does nothing more for it.
    pub(crate) fn with_blocking_ns(mut self, blocking_ns: u64) -> Self {
        self.blocking_ns = blocking_ns;
        self
    }

    /// Moves the blocking polls found since the last call into `out`;
    /// returns how many were past the bound.
    pub(crate) fn take_blocking(&mut self, out: &mut Vec<super::BlockingPoll>) -> u64 {
        out.append(&mut self.blocking);
        std::mem::take(&mut self.blocking_lost)
    }

    /// Lanes forgotten by [`Lanes::drop_unlinked`] since the last call.
    pub(crate) fn take_dropped_unlinked(&mut self) -> u64 {
        std::mem::take(&mut self.dropped_unlinked)
    }

    /// With [`Lanes::drop_unlinked`], forgets `lane` if it is finished and
    /// known to be unlinked.
    fn forget_if_unlinked(&mut self, lane: u64) {
        if !self.drop_unlinked {
            return;
        }
        if self
            .lanes
            .get(&lane)
            .is_some_and(|l| l.unlinked && l.end_ns.is_some())
            && self.lanes.remove(lane).is_some()
        {
            self.finished = self.finished.saturating_sub(1);
            self.dropped_unlinked += 1;
        }
    }

    /// Lanes known: open ones and finished ones not yet written out.
    pub(crate) fn len(&self) -> usize {
        self.lanes.len()
    }

    /// Whether the lane of `id` is held.
    pub(crate) fn knows(&self, id: u64) -> bool {
        self.lanes.contains_key(&id)
    }

    /// Of those, the finished ones.
    pub(crate) fn finished(&self) -> usize {
        self.finished
    }

    /// Takes one lane event. Returns whether it was the end of a lane still
    /// open here, whose places in the lane queue are then free; the end of
    /// a lane already expired (see [`Lanes::prune`]), whose places were
    /// given back when it expired, returns false.
    pub(crate) fn apply(&mut self, event: LaneEvent) -> bool {
        match event {
            LaneEvent::Started {
                lane,
                link,
                start_ns,
            } => {
                // Allocated here, and freed here once the lane is
                // forgotten: the request's worker allocates nothing for the
                // link, and no block of its glibc arena comes back from
                // this thread (see BENCHMARKS.md, "Allocations that cross
                // threads").
                self.lanes
                    .insert(lane, Lane::started(Arc::new(link), start_ns));
                false
            }
            LaneEvent::Transaction {
                lane,
                start_ns,
                end_ns,
            } => {
                if let Some(l) = self.lanes.get_mut(&lane) {
                    // A microsecond inside the transaction: its timestamps
                    // travel as floating-point seconds, and a sample on
                    // its very edge could round outside it.
                    let inside = 1_000.min(end_ns.saturating_sub(start_ns) / 4);
                    l.start_ns = l.start_ns.min(start_ns + inside);
                    l.transaction_end_ns = end_ns.saturating_sub(inside);
                    l.unlinked = end_ns.saturating_sub(start_ns) < super::SHORTEST_LINKED_NS;
                    if let Some(end) = &mut l.end_ns {
                        *end = l.transaction_end_ns;
                    }
                }
                self.forget_if_unlinked(lane);
                false
            }
            LaneEvent::Finished { lane, end_ns } => {
                let Some(l) = self.lanes.get_mut(&lane) else {
                    return false;
                };
                // Once the transaction's window is known, the lane ends
                // with it, earlier or later than the root span closed.
                let end_ns = if l.transaction_end_ns > 0 {
                    l.transaction_end_ns
                } else {
                    end_ns
                };
                let was_open = l.end_ns.replace(end_ns).is_none();
                self.finished += usize::from(was_open);
                self.forget_if_unlinked(lane);
                was_open
            }
        }
    }

    /// Records a change of a thread's context word (see
    /// [`super::read_changes`]): the thread stopped polling the request it
    /// left, and began polling the one it entered. A finished poll shorter
    /// than `min_poll_ns` is not kept: its edges would move what Sentry
    /// shows by less than that, and a request that only hands work on (a
    /// few polls of microseconds) costs no memory. Returns false if a poll
    /// could not be kept (the lane has [`MAX_POLLS_PER_LANE`]).
    pub(crate) fn apply_change(&mut self, change: Change, min_poll_ns: u64) -> bool {
        let Change {
            tid,
            from,
            to,
            at_ns,
            woken_ns,
            off_worker,
        } = change;
        let left_off_worker = self.off_worker.remove(&tid);
        if off_worker && is_lane(to) {
            self.off_worker.insert(tid);
        }
        // Without the word before (it was lost), when the thread left the
        // poll it was in is not known: that poll is forgotten.
        let left = self.open.remove(&tid).filter(|_| from.is_some());
        let mut kept = true;
        if let Some((lane, start_ns)) = left
            && self.blocking_ns > 0
            && !left_off_worker
            && at_ns.saturating_sub(start_ns) >= self.blocking_ns
            && let Some(l) = self.lanes.get(&lane)
        {
            if self.blocking.len() < super::MAX_BLOCKING_POLLS {
                self.blocking.push(super::BlockingPoll {
                    lane,
                    tid,
                    start_ns,
                    end_ns: at_ns,
                    link: Arc::clone(&l.link),
                });
            } else {
                self.blocking_lost += 1;
            }
        }
        if let Some((lane, start_ns)) = left
            && at_ns.saturating_sub(start_ns) >= min_poll_ns
            && let Some(l) = self.lanes.get_mut(&lane)
        {
            if l.polls.len() < MAX_POLLS_PER_LANE {
                // Its start may have been opened before the lane was known
                // (see below).
                l.polls_known = true;
                l.polls.push(Poll {
                    tid,
                    start_ns,
                    end_ns: Some(at_ns),
                });
            } else {
                kept = false;
            }
        }
        if let Some(l) = self.lanes.get_mut(&to) {
            l.polls_known = true;
            self.open.insert(tid, (to, at_ns));
            if woken_ns != 0 {
                l.wakes_known = true;
            }
            // The future waited for a worker from its wake to this poll; a
            // wait shorter than `min_poll_ns` moves no fill-in of a period
            // grid, and is not kept.
            if woken_ns > NOT_WOKEN && at_ns.saturating_sub(woken_ns) >= min_poll_ns {
                if l.queued.len() < MAX_POLLS_PER_LANE {
                    l.queued.push((woken_ns, at_ns));
                } else {
                    kept = false;
                }
            }
        } else if is_lane(to) {
            // A lane whose start is not read yet: the tracing layer
            // publishes a root span's word on its first entry just before
            // it reports the lane's start, and the reader may take the
            // word between the two (on a busy machine, with the thread
            // preempted there, for milliseconds). The poll is opened
            // anyway: when the thread leaves it the lane is known, and the
            // request's first poll (which may be the one that blocks) is
            // kept, not lost.
            self.open.insert(tid, (to, at_ns));
        }
        kept
    }

    /// The polls at least the long-poll threshold long: finished ones, and
    /// running ones from their start up to now (a poll still running counts
    /// once it has run that long).
    pub(crate) fn long_polls(&self) -> LongPolls {
        let threshold = if self.long_poll_ns == 0 {
            crate::options::DEFAULT_LONG_POLL_THRESHOLD.as_nanos() as u64
        } else {
            self.long_poll_ns
        };
        let now = super::now_ns();
        let mut long = LongPolls::default();
        let finished = self.lanes.iter().flat_map(|(lane, l)| {
            l.polls
                .iter()
                .filter_map(move |p| Some((lane, p.tid, p.start_ns, p.end_ns?)))
        });
        let open = self
            .open
            .iter()
            .map(|(&tid, &(lane, start))| (lane, tid, start, now));
        for (lane, tid, start, end) in finished.chain(open) {
            if end.saturating_sub(start) >= threshold {
                long.by_poller
                    .entry((lane, tid))
                    .or_default()
                    .push((start, end));
            }
        }
        long
    }

    /// The polls of each lane still running (a thread is in it now).
    pub(super) fn open_polls(&self) -> HashMap<u64, Vec<Poll>> {
        let mut by_lane: HashMap<u64, Vec<Poll>> = HashMap::default();
        for (&tid, &(lane, start_ns)) in &self.open {
            by_lane.entry(lane).or_default().push(Poll {
                tid,
                start_ns,
                end_ns: None,
            });
        }
        by_lane
    }

    /// Adds a fill-in sample for every tick (`period_ns` grid from the
    /// lane's start, or from the chunk's first sample for a lane that
    /// started earlier) at which a lane active during the chunk has no
    /// sample of its own within half a period. `until_ns` bounds lanes
    /// still open.
    #[cfg(test)]
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
    /// sample: the chunk thread passes the end of what its previous chunk
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
        self.fill(chunk, period_ns, from_ns, until_ns, false)
    }

    /// [`Lanes::fill_suspended`] for a transaction profile's window: only
    /// the lanes that overlap it (a transaction profile is cut from a
    /// history holding every lane of the last half minute).
    pub(crate) fn fill_window(&self, window: &mut Chunk, period_ns: u64, until_ns: u64) -> Filled {
        let Some(from) = window.first_timestamp_ns() else {
            return Filled::default();
        };
        self.fill(window, period_ns, from, until_ns, true)
    }

    fn fill(
        &self,
        chunk: &mut Chunk,
        period_ns: u64,
        from_ns: u64,
        until_ns: u64,
        overlapping_only: bool,
    ) -> Filled {
        let mut filled = Filled::default();
        if chunk.is_empty() {
            return filled;
        }
        let chunk_start = from_ns;
        let period_ns = period_ns.max(1);
        let mut own: HashMap<u64, Vec<u64>> = HashMap::default();
        for s in chunk.samples() {
            if self.lanes.contains_key(&s.context) {
                own.entry(s.context).or_default().push(s.timestamp_ns);
            }
        }
        for v in own.values_mut() {
            v.sort_unstable();
        }
        let held = self.held_stretches(chunk);
        let open = self.open_polls();
        let stacks = WaitingStacks::new();
        for (lane, info) in self.lanes.iter() {
            if overlapping_only
                && (info.end_ns.is_some_and(|e| e < from_ns) || info.start_ns > until_ns)
            {
                continue;
            }
            let end = info.end_ns.unwrap_or(until_ns).min(until_ns);
            let times = own.get(&lane).map(Vec::as_slice).unwrap_or(&[]);
            // Where the polls of the request are known, they say when it
            // ran (those long enough to be kept, which get their own edges,
            // see `add_poll_edges`); otherwise its threads' samples do.
            let polled = info.polls_known.then(|| {
                Held::new(
                    info.polls
                        .iter()
                        .chain(open.get(&lane).into_iter().flatten())
                        .map(|p| (p.start_ns, p.end_ns.unwrap_or(end).max(p.start_ns)))
                        .collect(),
                )
            });
            let fills = LaneFills {
                lane,
                info,
                times,
                held: polled.as_ref().or(held.get(&lane)),
                queued: info.queued_stretches(),
                stacks: &stacks,
            };
            let (pushed, last) = fills.on_grid(
                chunk,
                &mut filled,
                info.start_ns.max(chunk_start),
                end,
                period_ns,
            );
            fills.at_ends(chunk, &mut filled, chunk_start, until_ns, pushed, last);
        }
        filled
    }

    /// For each lane, the stretches in which it held an OS thread: between
    /// two consecutive samples of one thread that are both the lane's. The
    /// thread was polling the request at both ends and the sampler saw it
    /// do nothing else in between, so a grid tick inside such a stretch is
    /// not a moment the request was suspended, however far the sampler
    /// spaced those two samples (a thread's samples can be up to two
    /// periods apart, more on a starved machine). Without this, a
    /// `(suspended)` fill-in landed in the middle of a poll, and Sentry,
    /// which weights a sample by the time to the next one of its thread,
    /// showed part of the request's running time as suspended.
    fn held_stretches(&self, chunk: &Chunk) -> HashMap<u64, Held> {
        if self.lanes.values().all(|l| l.polls_known) {
            // Every lane's polls are known: they are used instead.
            return HashMap::default();
        }
        let mut per_thread: HashMap<u32, Vec<(u64, u64)>> = HashMap::default();
        for s in chunk.samples() {
            // Thread 0 holds the fill-ins, which belong to no thread.
            if s.thread_id != 0 {
                per_thread
                    .entry(s.thread_id)
                    .or_default()
                    .push((s.timestamp_ns, s.context));
            }
        }
        let mut held: HashMap<u64, Vec<(u64, u64)>> = HashMap::default();
        for samples in per_thread.values_mut() {
            samples.sort_unstable();
            for pair in samples.windows(2) {
                let ((from, lane), (to, next)) = (pair[0], pair[1]);
                if lane == next && to > from && self.lanes.contains_key(&lane) {
                    held.entry(lane).or_default().push((from, to));
                }
            }
        }
        held.into_iter()
            .map(|(lane, stretches)| (lane, Held::new(stretches)))
            .collect()
    }

    /// The root span a lane stands for, if known.
    pub(crate) fn link(&self, lane: u64) -> Option<&Arc<LaneLink>> {
        self.lanes.get(&lane).map(|l| &l.link)
    }

    /// Forgets the finished lanes that ended first until at most `keep`
    /// finished lanes are left; returns how many it forgot. (Transaction
    /// profiles keep the lanes of the last half minute, which at a high
    /// request rate is more than a profile needs.)
    pub(crate) fn cap_finished(&mut self, keep: usize) -> usize {
        let excess = self.finished.saturating_sub(keep);
        if excess == 0 {
            return 0;
        }
        let mut ends: Vec<u64> = self.lanes.values().filter_map(|l| l.end_ns).collect();
        let (_, &mut cut, _) = ends.select_nth_unstable(excess - 1);
        let mut forgotten = 0;
        self.lanes.retain(|_, l| match l.end_ns {
            Some(e) if e <= cut && forgotten < excess => {
                forgotten += 1;
                false
            }
            _ => true,
        });
        self.finished -= forgotten;
        let lanes = &self.lanes;
        self.open.retain(|_, (lane, _)| lanes.contains_key(lane));
        forgotten
    }

    /// Forgets lanes that ended before `ns`, and lanes open for longer than
    /// [`LANE_MAX_OPEN_NS`] (returns how many of those expired: the caller
    /// gives their places in the lane queue back, since their end, if it
    /// ever comes, frees nothing, see [`Lanes::apply`]).
    pub(crate) fn prune(&mut self, ns: u64) -> usize {
        let oldest = ns.saturating_sub(LANE_MAX_OPEN_NS);
        let mut expired = 0;
        let mut finished = 0;
        for lane in self.lanes.values_mut() {
            // Polls that ended before `ns` are behind every chunk still to
            // be written.
            lane.polls.retain(|p| p.end_ns.is_some_and(|e| e >= ns));
            lane.queued.retain(|&(_, polled)| polled >= ns);
        }
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
        // A thread that exited inside a request left its poll open.
        let lanes = &self.lanes;
        self.open.retain(|_, (lane, _)| lanes.contains_key(lane));
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
        let mut per_lane: HashMap<u64, usize> = HashMap::default();
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

/// One lane's fill-ins in a chunk (see [`Lanes::fill_suspended`]).
struct LaneFills<'a> {
    lane: u64,
    info: &'a Lane,
    /// The lane's own samples' times, sorted.
    times: &'a [u64],
    /// When it ran (its polls, or the stretches it held a thread).
    held: Option<&'a Held>,
    queued: Held,
    stacks: &'a WaitingStacks,
}

impl LaneFills<'_> {
    fn push(&self, chunk: &mut Chunk, t: u64) {
        let frame = self.info.waiting_frame(&self.queued, t);
        chunk.push_synthetic(t, self.lane, self.stacks.of(frame));
    }

    /// A fill-in at every point of the sampling grid from `from` to `end`
    /// that no sample of the lane covers and the lane did not run at (up
    /// to the chunk's cap); returns how many were added, and the last.
    ///
    /// The grid starts where both the lane and the chunk have begun.
    /// Anchoring it at the chunk's start (rather than at the next point of
    /// the lane's own grid) matters for a lane older than the chunk: one
    /// period after the chunk's start it already has its two samples,
    /// where the lane's grid could leave it one, and Sentry drops
    /// single-sample threads.
    fn on_grid(
        &self,
        chunk: &mut Chunk,
        filled: &mut Filled,
        from: u64,
        end: u64,
        period_ns: u64,
    ) -> (usize, Option<u64>) {
        let (mut pushed, mut last) = (0, None);
        let mut t = from;
        while t <= end {
            // A sample from before the lane began (stamped before its start
            // was) does not cover its first tick.
            let from = t.saturating_sub(period_ns / 2).max(self.info.start_ns);
            let i = self.times.partition_point(|&x| x < from);
            let covered = self.times.get(i).is_some_and(|&x| x <= t + period_ns / 2)
                || self.held.is_some_and(|h| h.holds(t));
            if !covered {
                if filled.added >= MAX_FILLS_PER_CHUNK {
                    filled.capped += 1;
                } else {
                    self.push(chunk, t);
                    filled.added += 1;
                    pushed += 1;
                    last = Some(t);
                }
            }
            t = t.saturating_add(period_ns);
        }
        (pushed, last)
    }

    /// Every lane that ended within the chunk (by `until_ns`) gets a sample
    /// at its end, and keeps at least two samples (with `pushed` fill-ins
    /// already, the last at `last`). Sentry weights each sample by the time
    /// to the next one of its thread, so the end sample gives the lane's
    /// last sample its duration; and Sentry drops a thread with a single
    /// sample, after which the transaction would link to nothing. A
    /// request shorter than a period has at most one sample of its own (or
    /// one fill-in), so it also gets one at its start (or just after its
    /// end). These are never capped: they are what links the transaction.
    ///
    /// A lane can also end before `chunk_start`: its end was stamped just
    /// before the previous chunk was written but read just after, so that
    /// chunk took it for open (and gave it one fill-in, perhaps, which a
    /// lane needs two of to be filed). It gets its samples here, inside its
    /// own window.
    fn at_ends(
        &self,
        chunk: &mut Chunk,
        filled: &mut Filled,
        chunk_start: u64,
        until_ns: u64,
        pushed: usize,
        mut last: Option<u64>,
    ) {
        let Some(lane_end) = self.info.end_ns.filter(|&e| e <= until_ns) else {
            return;
        };
        let mut count = self.times.len() + pushed;
        let start = if lane_end >= chunk_start {
            self.info.start_ns.max(chunk_start)
        } else {
            self.info.start_ns
        };
        let mut end_sampled = false;
        for t in [lane_end, start, lane_end.saturating_add(1)] {
            if count >= 2 && end_sampled {
                break;
            }
            let taken = last == Some(t) || self.times.binary_search(&t).is_ok();
            if !taken {
                self.push(chunk, t);
                filled.added += 1;
                count += 1;
                last = Some(t);
            }
            end_sampled = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frames::UNCAPTURED_FRAME;
    use crate::lanes::next_lane as new_lane;
    use crate::sampler::Sample;

    fn sample(ts: u64, tid: i32, context: u64) -> Sample {
        sample_at(ts, tid, &[1, 2], context)
    }

    /// The chunk's samples from index `from` on (those a call added), as
    /// (time, thread, stack), sorted.
    fn samples_from(chunk: &Chunk, from: usize) -> Vec<(u64, u32, Vec<u64>)> {
        let mut samples: Vec<_> = chunk.samples()[from..]
            .iter()
            .map(|s| {
                let stack = chunk.stacks()[s.stack as usize].to_vec();
                (s.timestamp_ns, s.thread_id, stack)
            })
            .collect();
        samples.sort();
        samples
    }

    /// A sample of thread `tid` with the stack `frames`.
    fn sample_at(ts: u64, tid: i32, frames: &[u64], context: u64) -> Sample {
        Sample::new(ts, tid, Arc::from("w"), Arc::from(frames), context, false)
    }

    #[test]
    fn a_lane_sentry_never_links_is_forgotten_once_its_end_and_window_are_known() {
        const MS: u64 = 1_000_000;
        // (transaction window, whether its end is read before the window).
        let cases = [
            ((0, 5 * MS), true, true),
            ((0, 5 * MS), false, true),
            ((0, 19_699_999), true, true),
            ((0, 19_700_000), true, false),
            ((0, 40 * MS), false, false),
        ];
        for ((tx_start, tx_end), end_first, forgotten) in cases {
            let mut lanes = Lanes::default().drop_unlinked(true);
            let lane = started(&mut lanes, tx_start + 10);
            let mut chunk = Chunk::new();
            chunk.push(&sample(tx_start + MS, 7, lane));
            chunk.push(&sample(tx_start + 2 * MS, 8, lane));
            let end = LaneEvent::Finished {
                lane,
                end_ns: tx_end - 10,
            };
            let window = LaneEvent::Transaction {
                lane,
                start_ns: tx_start,
                end_ns: tx_end,
            };
            let (first, second) = if end_first {
                (end, window)
            } else {
                (window, end)
            };
            lanes.apply(first);
            assert_eq!(lanes.len(), 1, "kept until both are known");
            lanes.apply(second);
            let case = format!("window {tx_start}..{tx_end}, end first: {end_first}");
            assert_eq!(lanes.len(), usize::from(!forgotten), "{case}");
            assert_eq!(lanes.finished(), usize::from(!forgotten), "{case}");
            assert_eq!(
                lanes.take_dropped_unlinked(),
                u64::from(forgotten),
                "{case}"
            );
            lanes.fill_suspended(&mut chunk, MS, 100 * MS);
            let keys = lanes.thread_keys(&chunk, ThreadAttribution::Lanes);
            if forgotten {
                assert_eq!(chunk.len(), 2, "{case}: no fill-in or end sample");
                assert_eq!(keys, vec![Some((7, None)), Some((8, None))], "{case}");
            } else {
                assert!(chunk.len() > 2, "{case}: its lane is filled in");
                assert!(keys.iter().flatten().all(|(k, _)| *k == lane), "{case}");
            }
        }
        // Without the rule (exports, transaction profiles), every lane stays.
        let mut lanes = Lanes::default();
        let lane = started(&mut lanes, 0);
        lanes.apply(LaneEvent::Finished { lane, end_ns: MS });
        lanes.apply(LaneEvent::Transaction {
            lane,
            start_ns: 0,
            end_ns: MS,
        });
        assert_eq!((lanes.len(), lanes.take_dropped_unlinked()), (1, 0));
    }

    #[test]
    fn files_lane_samples_under_the_lane_and_fills_suspended_ticks() {
        let lane = new_lane();
        assert!(is_lane(lane) && !is_lane(4_194_304));
        let mut lanes = Lanes::default();
        lanes.apply(LaneEvent::Started {
            lane,
            link: LaneLink {
                name: Arc::from("GET /x"),
                ..Default::default()
            },
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
    fn a_lane_that_held_its_thread_between_two_samples_is_not_suspended_between_them() {
        // The sampler spaced two samples of worker 7 three periods
        // apart, both in the request: the worker polled it throughout, and
        // the ticks in between get no `(suspended)` fill-in. The same gap
        // with the request moving to worker 8, or with worker 7 seen in
        // another request in between, is suspended time.
        let period = 10_000;
        let run = |samples: &[(u64, i32, bool)]| {
            let lane = new_lane();
            let mut lanes = Lanes::default();
            lanes.apply(LaneEvent::Started {
                lane,
                link: LaneLink::default(),
                start_ns: 1_000,
            });
            let mut chunk = Chunk::new();
            for &(ts, tid, in_lane) in samples {
                chunk.push(&sample(ts, tid, if in_lane { lane } else { 0 }));
            }
            lanes.apply(LaneEvent::Finished {
                lane,
                end_ns: 31_000,
            });
            lanes.fill_suspended(&mut chunk, period, 1_000_000);
            let mut fills: Vec<u64> = chunk
                .samples()
                .iter()
                .filter(|s| s.thread_id == 0)
                .map(|s| s.timestamp_ns)
                .collect();
            fills.sort_unstable();
            fills
        };
        assert_eq!(
            run(&[(1_000, 7, true), (31_000, 7, true)]),
            Vec::<u64>::new(),
            "held throughout; the end is sampled"
        );
        assert_eq!(
            run(&[(1_000, 7, true), (31_000, 8, true)]),
            vec![11_000, 21_000],
            "moved to another worker: suspended in between"
        );
        assert_eq!(
            run(&[(1_000, 7, true), (12_000, 7, false), (31_000, 7, true)]),
            vec![11_000, 21_000],
            "its worker ran something else in between"
        );
    }

    fn poll_change(tid: u32, from: u64, to: u64, at_ns: u64) -> Change {
        woken_change(tid, from, to, at_ns, 0)
    }

    /// A poll of an instrumented future, woken at `woken_ns`.
    fn woken_change(tid: u32, from: u64, to: u64, at_ns: u64, woken_ns: u64) -> Change {
        Change {
            tid,
            from: Some(from),
            to,
            at_ns,
            woken_ns,
            off_worker: false,
        }
    }

    fn started(lanes: &mut Lanes, start_ns: u64) -> u64 {
        let lane = new_lane();
        lanes.apply(LaneEvent::Started {
            lane,
            link: LaneLink::default(),
            start_ns,
        });
        lane
    }

    /// The reader may take a thread's word naming a new lane before that
    /// lane's start (the layer publishes the word first): a request whose
    /// first polls are read so still has the poll it was in when its start
    /// arrived, however long that poll runs (`tokio_waits`' blocking
    /// request, whose long poll went unlabelled when it was lost).
    #[test]
    fn a_poll_begun_before_its_lane_is_known_is_kept() {
        let mut lanes = Lanes::default();
        let lane = new_lane();
        let min = 5;
        // Its first poll (a yield), and the start of the one that blocks,
        // both read before the start.
        assert!(lanes.apply_change(poll_change(7, 0, lane, 10), min));
        assert!(lanes.apply_change(poll_change(7, lane, 0, 11), min));
        assert!(lanes.apply_change(poll_change(7, 0, lane, 12), min));
        lanes.apply(LaneEvent::Started {
            lane,
            link: LaneLink::default(),
            start_ns: 9,
        });
        let open = Poll {
            tid: 7,
            start_ns: 12,
            end_ns: None,
        };
        assert_eq!(lanes.open_polls()[&lane], vec![open]);
        assert!(lanes.apply_change(poll_change(7, lane, 0, 112), min));
        let l = &lanes.lanes[&lane];
        assert!(l.polls_known);
        assert_eq!(
            l.polls,
            vec![Poll {
                end_ns: Some(112),
                ..open
            }]
        );
        assert!(lanes.open_polls().is_empty());
    }

    #[test]
    fn context_changes_open_and_close_polls() {
        let mut lanes = Lanes::default();
        let (a, b) = (started(&mut lanes, 0), started(&mut lanes, 0));
        let min = 5;
        assert!(lanes.apply_change(poll_change(7, 0, a, 10), min));
        // Straight from one request to another.
        assert!(lanes.apply_change(poll_change(7, a, b, 20), min));
        assert!(lanes.apply_change(poll_change(8, 0, a, 25), min));
        assert!(lanes.apply_change(poll_change(7, b, 0, 30), min));
        // Too short to be kept.
        assert!(lanes.apply_change(poll_change(7, 0, b, 31), min));
        assert!(lanes.apply_change(poll_change(7, b, 0, 33), min));
        let polls = |lanes: &Lanes, l: u64| lanes.lanes[&l].polls.clone();
        let poll = |tid, start_ns, end_ns| Poll {
            tid,
            start_ns,
            end_ns,
        };
        assert_eq!(polls(&lanes, a), vec![poll(7, 10, Some(20))]);
        assert_eq!(polls(&lanes, b), vec![poll(7, 20, Some(30))]);
        // Thread 8 is still in `a`.
        assert_eq!(lanes.open_polls()[&a], vec![poll(8, 25, None)]);
        // Thread 8's earlier words were lost: when it left `a` is unknown,
        // so that poll is forgotten rather than guessed.
        let lost = Change {
            tid: 8,
            from: None,
            to: b,
            at_ns: 50,
            woken_ns: 0,
            off_worker: false,
        };
        assert!(lanes.apply_change(lost, min));
        assert_eq!(polls(&lanes, a), vec![poll(7, 10, Some(20))]);
        assert_eq!(lanes.open_polls()[&b], vec![poll(8, 50, None)]);
        assert!(!lanes.open_polls().contains_key(&a));
        // A word that is no known lane is no poll.
        assert!(lanes.apply_change(poll_change(9, 0, 12_345, 60), min));
        assert!(lanes.open_polls().values().flatten().all(|p| p.tid != 9));
        // Bounded per lane; the next chunk's pruning makes room again.
        for i in 0..MAX_POLLS_PER_LANE as u64 {
            lanes.apply_change(poll_change(9, 0, a, 100 + 10 * i), min);
            lanes.apply_change(poll_change(9, a, 0, 100 + 10 * i + 5), min);
        }
        assert!(lanes.apply_change(poll_change(9, 0, a, 1_000_000), min));
        assert!(!lanes.apply_change(poll_change(9, a, 0, 1_000_010), min));
        lanes.prune(1_000_000);
        assert!(lanes.lanes[&a].polls.is_empty());
        assert!(lanes.apply_change(poll_change(9, 0, a, 1_000_020), min));
        assert!(lanes.apply_change(poll_change(9, a, 0, 1_000_030), min));
        assert_eq!(polls(&lanes, a).len(), 1);
    }

    #[test]
    fn polls_get_samples_at_their_edges() {
        // Worker 7 polls the request over [1_000, 26_000] (sampled once, at
        // 12_000), [41_000, 46_000] and [56_000, 61_000] (not sampled); the
        // request ends at 61_000. Sentry weights a sample by the time to
        // the next one: the poll's stack must start with the poll, and the
        // suspension with its end.
        let period = 10_000;
        let mut lanes = Lanes::default();
        let lane = started(&mut lanes, 1_000);
        for (from, to, at) in [
            (0, lane, 1_000),
            (lane, 0, 26_000),
            (0, lane, 41_000),
            (lane, 0, 46_000),
            (0, lane, 56_000),
            (lane, 0, 61_000),
        ] {
            assert!(lanes.apply_change(poll_change(7, from, to, at), period / 10));
        }
        let mut chunk = Chunk::new();
        chunk.push(&sample_at(12_000, 7, &[0xabc], lane));
        chunk.push(&sample(30_000, 7, 0));
        lanes.apply(LaneEvent::Finished {
            lane,
            end_ns: 61_000,
        });
        lanes.fill_suspended(&mut chunk, period, 1_000_000);
        let fills: Vec<u64> = chunk
            .samples()
            .iter()
            .filter(|s| s.thread_id == 0)
            .map(|s| s.timestamp_ns)
            .collect();
        // The grid starts at the chunk's first sample (12_000, sampled);
        // tick 22_000 falls inside the first poll, 42_000 inside the second:
        // no `(suspended)` there.
        assert_eq!(fills, vec![32_000, 52_000, 61_000]);
        let before = chunk.len();
        let added = lanes.add_poll_edges(&mut chunk, period, 0, 1_000_000);
        let edges = samples_from(&chunk, before);
        assert_eq!(added, edges.len());
        assert_eq!(
            edges,
            vec![
                // The poll's own stack from its start, on its thread.
                (1_000, 7, vec![0xabc]),
                (26_000, 0, vec![SUSPENDED_FRAME]),
                // A poll no sample caught: no stack of it is known (the
                // other poll's code may have returned by then).
                (41_000, 7, vec![UNCAPTURED_FRAME]),
                (46_000, 0, vec![SUSPENDED_FRAME]),
                // The last poll ends with the request, whose end sample
                // is there already: no `(suspended)` after it.
                (56_000, 7, vec![UNCAPTURED_FRAME]),
            ]
        );
        // Filed under the lane.
        let keys = lanes.thread_keys(&chunk, ThreadAttribution::Lanes);
        assert!(
            keys[before..]
                .iter()
                .all(|k| k.as_ref().is_some_and(|(id, _)| *id == lane))
        );
    }

    #[test]
    fn finished_polls_past_the_blocking_threshold_are_reported_once() {
        let mut lanes = Lanes::with_long_poll_ns(4_000).with_blocking_ns(50_000);
        let lane = started(&mut lanes, 1_000);
        for (tid, from, to, at) in [
            // 49 µs: under the threshold.
            (7, 0, lane, 1_000),
            (7, lane, 0, 50_000),
            // 60 µs: a blocking poll.
            (8, 0, lane, 100_000),
            (8, lane, 0, 160_000),
            // Still running: not reported until it ends.
            (7, 0, lane, 200_000),
        ] {
            assert!(lanes.apply_change(woken_change(tid, from, to, at, 0), 1_000));
        }
        let mut out = Vec::new();
        assert_eq!(lanes.take_blocking(&mut out), 0);
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].lane, out[0].tid), (lane, 8));
        assert_eq!((out[0].start_ns, out[0].end_ns), (100_000, 160_000));
        out.clear();
        lanes.take_blocking(&mut out);
        assert!(out.is_empty(), "taken once");
        // Work handed to the blocking pool blocks no worker.
        let handed = Change {
            off_worker: true,
            ..woken_change(9, 0, lane, 300_000, 250_000)
        };
        lanes.apply_change(handed, 1_000);
        lanes.apply_change(woken_change(9, lane, 0, 900_000, 0), 1_000);
        lanes.take_blocking(&mut out);
        assert!(out.is_empty(), "{out:?}");
        // Off: nothing is reported.
        let mut off = Lanes::with_long_poll_ns(4_000);
        let lane = started(&mut off, 1_000);
        off.apply_change(woken_change(8, 0, lane, 100_000, 0), 1_000);
        off.apply_change(woken_change(8, lane, 0, 10_000_000, 0), 1_000);
        off.take_blocking(&mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn an_instrumented_request_splits_its_waits_into_queued_and_awaiting() {
        // An instrumented request: polled by worker 7 over [1_000, 6_000]
        // (its first poll, not woken), then awaiting until its wake at
        // 30_000, queued until worker 8 polls it at 52_000 (to 57_000), and
        // woken during that poll, so queued from its end until worker 7
        // polls it at 75_000 (to 80_000); it ends at 80_000.
        let period = 10_000;
        let mut lanes = Lanes::with_long_poll_ns(4_000);
        let lane = started(&mut lanes, 1_000);
        for (tid, from, to, at, woken) in [
            (7, 0, lane, 1_000, NOT_WOKEN),
            (7, lane, 0, 6_000, 0),
            (8, 0, lane, 52_000, 30_000),
            (8, lane, 0, 57_000, 0),
            (7, 0, lane, 75_000, 57_000),
            (7, lane, 0, 80_000, 0),
        ] {
            assert!(lanes.apply_change(woken_change(tid, from, to, at, woken), period / 10));
        }
        lanes.apply(LaneEvent::Finished {
            lane,
            end_ns: 80_000,
        });
        let mut chunk = Chunk::new();
        chunk.push(&sample_at(1_000, 7, &[0xabc], lane));
        chunk.push(&sample_at(53_000, 8, &[0xdef], lane));
        lanes.fill_suspended(&mut chunk, period, 1_000_000);
        let fills: Vec<(u64, u32, Vec<u64>)> = samples_from(&chunk, 2);
        assert_eq!(
            fills,
            vec![
                (11_000, 0, vec![AWAITING_FRAME]),
                (21_000, 0, vec![AWAITING_FRAME]),
                (31_000, 0, vec![QUEUED_FRAME]),
                (41_000, 0, vec![QUEUED_FRAME]),
                (61_000, 0, vec![QUEUED_FRAME]),
                (71_000, 0, vec![QUEUED_FRAME]),
                (80_000, 0, vec![AWAITING_FRAME]),
            ]
        );
        let before = chunk.len();
        lanes.add_poll_edges(&mut chunk, period, 0, 1_000_000);
        let edges: Vec<(u64, u32, Vec<u64>)> = samples_from(&chunk, before)
            .into_iter()
            .filter(|s| s.1 == 0)
            .collect();
        assert_eq!(
            edges,
            vec![
                // The first poll's end: nothing had woken it.
                (6_000, 0, vec![AWAITING_FRAME]),
                // The wake, between two polls.
                (30_000, 0, vec![QUEUED_FRAME]),
                // Woken during the poll: queued from its end.
                (57_000, 0, vec![QUEUED_FRAME]),
            ]
        );
        // Every poll here is at least 4_000 long: long polls, by thread.
        let long = lanes.long_polls();
        assert!(long.holds(lane, 7, 3_000));
        assert!(long.holds(lane, 8, 55_000));
        assert!(!long.holds(lane, 7, 55_000));
        assert!(!long.holds(lane, 8, 3_000));
    }

    #[test]
    fn a_request_whose_wakes_are_not_known_stays_suspended() {
        let period = 10_000;
        let mut lanes = Lanes::default();
        let lane = started(&mut lanes, 1_000);
        assert!(lanes.apply_change(poll_change(7, 0, lane, 1_000), period / 10));
        assert!(lanes.apply_change(poll_change(7, lane, 0, 2_000), period / 10));
        let mut chunk = Chunk::new();
        chunk.push(&sample_at(1_000, 7, &[0xabc], lane));
        lanes.fill_suspended(&mut chunk, period, 30_000);
        assert!(
            samples_from(&chunk, 1)
                .iter()
                .all(|s| s.2 == vec![SUSPENDED_FRAME])
        );
    }

    #[test]
    fn a_long_poll_keeps_a_sample_of_its_thread_every_period() {
        // Worker 7 polls the request over [0, 50_000]; the sampler caught
        // it at 10_000 and 40_000 only (a busy machine). The periods at
        // 20_000 and 30_000 get samples of worker 7 in the request, saying
        // no stack was captured (its latest may have returned), so neither
        // timeline carries the gap on one sample.
        let period = 10_000;
        let mut lanes = Lanes::default();
        let lane = started(&mut lanes, 0);
        assert!(lanes.apply_change(poll_change(7, 0, lane, 0), period / 10));
        assert!(lanes.apply_change(poll_change(7, lane, 0, 50_000), period / 10));
        let mut chunk = Chunk::new();
        for (ts, pc) in [(10_000, 0xa), (40_000, 0xb)] {
            chunk.push(&sample_at(ts, 7, &[pc], lane));
        }
        let before = chunk.len();
        lanes.add_poll_edges(&mut chunk, period, 0, 1_000_000);
        assert_eq!(
            samples_from(&chunk, before),
            vec![
                (0, 7, vec![0xa]),
                (20_000, 7, vec![UNCAPTURED_FRAME]),
                (30_000, 7, vec![UNCAPTURED_FRAME]),
                (50_000, 0, vec![SUSPENDED_FRAME]),
            ],
            "the poll's start, the two periods the sampler missed, and its end"
        );
    }

    #[test]
    fn a_period_filed_before_the_requests_first_capture_shows_no_other_moments_stack() {
        let period = 10_000;
        let mut lanes = Lanes::default();
        let lane = started(&mut lanes, 0);
        assert!(lanes.apply_change(poll_change(7, 0, lane, 0), period / 10));
        let mut chunk = Chunk::new();
        for (ts, pc) in [(1_000, UNCAPTURED_FRAME), (9_000, 0xa), (12_000, 0xb)] {
            chunk.push(&sample_at(ts, 7, &[pc], lane));
        }
        lanes.add_poll_edges(&mut chunk, period, 0, 13_000);
        let stacks: Vec<Vec<u64>> = chunk.samples()[..3]
            .iter()
            .map(|s| chunk.stacks()[s.stack as usize].to_vec())
            .collect();
        // Not the capture 8_000 later: its code may not have begun at
        // 1_000.
        assert_eq!(stacks, vec![vec![UNCAPTURED_FRAME], vec![0xa], vec![0xb]]);
    }

    #[test]
    fn a_lane_covers_its_whole_transaction_and_ends_with_it() {
        // The transaction began 12 ms before its root span's lane, and
        // ended 12 ms after the span closed or 25 ms before it (a preempted
        // thread between the tracing layers' callbacks, or between the
        // transaction's end and the span's close), reported before or after
        // the lane's end. The lane's samples stay inside the transaction.
        for (span_end_ns, report_first) in [
            (80_000_000, false),
            (80_000_000, true),
            (117_000_000, false),
            (117_000_000, true),
        ] {
            let mut lanes = Lanes::default();
            let lane = started(&mut lanes, 20_000_000);
            let window = LaneEvent::Transaction {
                lane,
                start_ns: 8_000_000,
                end_ns: 92_000_000,
            };
            if report_first {
                lanes.apply(window.clone());
            }
            lanes.apply(LaneEvent::Finished {
                lane,
                end_ns: span_end_ns,
            });
            if !report_first {
                lanes.apply(window);
            }
            let mut chunk = Chunk::new();
            chunk.push(&sample(5_000_000, 9, 0));
            lanes.fill_suspended(&mut chunk, 10_000_000, 130_000_000);
            let mut own: Vec<u64> = chunk
                .samples()
                .iter()
                .filter(|s| s.context == lane)
                .map(|s| s.timestamp_ns)
                .collect();
            own.sort_unstable();
            let case = (span_end_ns, report_first);
            // A microsecond inside each edge of the transaction.
            assert_eq!(own.first(), Some(&8_001_000), "{case:?}: {own:?}");
            assert_eq!(own.last(), Some(&91_999_000), "{case:?}: {own:?}");
        }
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
            link: LaneLink::default(),
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
            link: LaneLink::default(),
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
            link: LaneLink {
                name: Arc::from("GET /"),
                ..Default::default()
            },
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
                link: LaneLink::default(),
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
            link: LaneLink::default(),
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
            link: LaneLink::default(),
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
            link: LaneLink::default(),
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

    #[test]
    fn a_transaction_window_fills_only_the_lanes_it_overlaps() {
        let mut lanes = Lanes::default();
        // Ended ten seconds before the window.
        let old = started(&mut lanes, 1_000);
        lanes.apply(LaneEvent::Finished {
            lane: old,
            end_ns: 2_000,
        });
        let current = started(&mut lanes, 10_000_000_000);
        lanes.apply(LaneEvent::Finished {
            lane: current,
            end_ns: 10_050_000_000,
        });
        let mut window = Chunk::new();
        window.push(&sample(10_000_000_000, 9, 0));
        window.push(&sample(10_050_000_000, 9, 0));
        lanes.fill_window(&mut window, 10_000_000, 10_050_000_000);
        let lanes_in_window: std::collections::HashSet<u64> =
            window.samples().iter().map(|s| s.context).collect();
        assert!(lanes_in_window.contains(&current));
        assert!(
            !lanes_in_window.contains(&old),
            "a lane that ended before the window gets no samples in it"
        );
    }

    #[test]
    fn transaction_profiles_keep_a_bounded_number_of_finished_lanes() {
        let mut lanes = Lanes::default();
        let open = started(&mut lanes, 0);
        let ended: Vec<u64> = (0..10u64)
            .map(|i| {
                let lane = started(&mut lanes, i);
                lanes.apply(LaneEvent::Finished {
                    lane,
                    end_ns: 100 + i,
                });
                lane
            })
            .collect();
        assert_eq!(lanes.cap_finished(4), 6);
        assert_eq!(lanes.finished(), 4);
        assert!(lanes.lanes.contains_key(&open), "open lanes stay");
        for (i, lane) in ended.iter().enumerate() {
            assert_eq!(
                lanes.lanes.contains_key(lane),
                i >= 6,
                "the latest ends stay"
            );
        }
        assert_eq!(lanes.cap_finished(4), 0);
    }
}
