//! Each thread's ledger of sampling periods: its three concerns put
//! together, and what a fill shows when it leaves.
//!
//! - placement (`slots.rs`): which period slots a thread's samples take,
//!   and which get fills;
//! - the held queue (`held.rs`): its samples waiting to leave, in time
//!   order, until the thread is known alive at their time and where it
//!   stands is known;
//! - the balances of the kernel's counts (`balance.rs`): the run delay and
//!   CPU time counted that its samples do not show yet.
//!
//! Here, the rules that join them: when a held fill may leave, and what it
//! shows then (where the thread stood, or what the kernel counted, see
//! [`Ledger::drain`]). What the kernel counted goes first to the fills
//! standing in a request's poll, where a worker runs or waits for a CPU
//! (one blocked in a request is found there), then to the others in time
//! order; a fill in a poll that the counts do not cover yet shows what they
//! are least behind on, owed, never a wait whose place was not read (see
//! `Ledger::spare`, `Balance::settle`). Every period a sample stands for
//! is accounted for in the thread's [`Account`] (`period.rs`), whose
//! invariants (a period's parts add up to it; the wait for a CPU shown
//! from the counts never exceeds the run delay counted, over any interval
//! from a reading on) are checked in debug builds.
//!
//! Everything here is decided from its arguments (no clock, no system
//! call), so the unit tests below pin every case down, and the timelines
//! (`ledger/timelines.rs`) draw a thread's story period by period.

use std::sync::Arc;

use super::Sample;
use super::balance::{Balance, Guess, Reading, Settled};
use super::held::{Held, Pending};
use super::period::{Account, Spent};
use super::periods::AtTick;
use super::slots::{Placement, Slots};

/// Where a thread's fills stand when they leave, unless their
/// [`AtTick`] says otherwise (see [`Ledger::drain`]).
#[derive(Debug, Default)]
pub(super) struct FillPlace {
    /// The stack they show (none known: they are dropped).
    pub(super) stack: Option<Arc<[u64]>>,
    /// The context word they are filed under.
    pub(super) context: u64,
    /// Whether the thread is known to stand there now.
    pub(super) known: bool,
    /// Whether it ran since it was last found anywhere (its place is a
    /// guess, or not known).
    pub(super) ran: bool,
    /// When the thread was first captured running after it was last found
    /// where `stack` shows: it had left that place then, so no fill later
    /// than this shows `stack` (they show what the kernel counted, see
    /// [`Ledger::settle`], or that it waited where it was not read).
    pub(super) left_ns: Option<u64>,
}

/// What leaves a thread's ledger.
#[derive(Debug)]
pub(super) enum Out {
    /// A sample of running code.
    Sample(Sample),
    /// A fill: a period the thread spent not running, or running without a
    /// capture of its own.
    Fill {
        timestamp_ns: u64,
        stack: Arc<[u64]>,
        context: u64,
    },
}

/// What [`Ledger::drain`] needs to know of the thread.
#[derive(Debug)]
pub(super) struct DrainView {
    /// Where its fills stand.
    pub(super) place: FillPlace,
    /// A question about where it waits is awaited (its fills wait for the
    /// answer).
    pub(super) asking: bool,
    /// The thread is leaving the ledger's hands (the sampler pauses or
    /// stops): fills leave with what is known.
    pub(super) force: bool,
    /// The thread was found running now, and the kernel's counts were read
    /// then: it ran at the end of the time they cover (see
    /// [`Ledger::blocked_first`]).
    pub(super) ran_last: bool,
    /// The sampling period, ns: the time one fill stands for.
    pub(super) period_ns: u64,
}

/// One thread's ledger (see the module doc).
#[derive(Debug, Default)]
pub(super) struct Ledger {
    /// Where its samples go.
    slots: Slots,
    /// What waits to leave.
    held: Held,
    /// What the kernel counted that its samples do not show yet.
    balance: Balance,
    /// What the periods that left stood for.
    account: Account,
}

impl Ledger {
    /// Whether the kernel's counts must be read before the held fills
    /// leave to `place`: it is a guess (the thread ran since it was last
    /// found anywhere), and a fill that may leave now (the thread is known
    /// alive at its time) is later than the latest reading. Read then, the
    /// counts show what the thread ran and waited for a CPU in that fill's
    /// period, and the guess is left only for time it was blocked.
    pub(super) fn wants_counts(&self, place: &FillPlace) -> bool {
        place.ran
            && self
                .held
                .any_fill_within(self.balance.counted_to_ns(), self.held.alive_ns())
    }

    /// The thread is known to have been alive at `ns`.
    pub(super) fn alive_at(&mut self, ns: u64) {
        self.held.alive_at(ns);
    }

    /// The thread is known alive up to `ns` and no later (set anew, after
    /// its held samples were dropped).
    pub(super) fn alive_until(&mut self, ns: u64) {
        self.held.alive_until(ns);
    }

    /// The latest moment the thread is known to have been alive: at its
    /// latest sample or look, or the latest reading of its counts.
    pub(super) fn known_alive_ns(&self) -> u64 {
        self.held.alive_ns().max(self.balance.counted_to_ns())
    }

    /// The thread's period slots at a tick (see `slots::thread_slots`):
    /// `periods` ending at `slot_end`, carried on to its latest capture
    /// `latest_ns`, by at most `max_extra`.
    pub(super) fn slots_of_tick(
        &mut self,
        periods: u32,
        slot_end: u64,
        period_ns: u64,
        latest_ns: Option<u64>,
        max_extra: u32,
    ) -> Vec<u64> {
        self.slots
            .of_tick(periods, slot_end, period_ns, latest_ns, max_extra)
    }

    /// Places one tick's samples of running code (already queued) on the
    /// tick's `slots` and the held fills' (see `Slots::place_tick`); the
    /// free slots of the placement returned get fills.
    pub(super) fn place_tick(
        &mut self,
        slots: Vec<u64>,
        running: &[u64],
        half_ns: u64,
        period_ns: u64,
    ) -> Placement {
        self.slots
            .place_tick(&mut self.held, slots, running, half_ns, period_ns)
    }

    /// Queues a sample of running code in time order (see
    /// `Held::push_sample`): it shows a period of CPU time. Returns the
    /// time it is queued at.
    pub(super) fn push_sample(&mut self, sample: Sample) -> u64 {
        self.balance.ran_a_period();
        self.held.push_sample(sample)
    }

    /// Queues a fill for the slot `slot`; `word` is the context word the
    /// thread published then, `at_tick` where it stands.
    pub(super) fn push_fill(&mut self, slot: u64, word: Option<Option<u64>>, at_tick: AtTick) {
        self.held.push_fill(slot, word, at_tick);
    }

    /// A capture at `ts` of `stack` in the request of `context`: the held
    /// fills since the previous capture, if the two are close, show the
    /// nearer one's stack (see `Slots::captured`).
    pub(super) fn captured(
        &mut self,
        ts: u64,
        stack: &Arc<[u64]>,
        context: u64,
        ran_within_ns: u64,
    ) {
        self.slots
            .captured(&mut self.held, ts, stack, context, ran_within_ns);
    }

    /// A reading of the kernel's counts of the thread (see
    /// `Balance::read`): the fills then show the run delay and CPU time
    /// counted, at one period per fill, never more than the fills held now
    /// (and one) can show.
    pub(super) fn kernel_read(&mut self, reading: Reading, period_ns: u64) {
        let held = self.held.fill_count() as i64;
        let span_ns = reading.at_ns.saturating_sub(self.balance.counted_to_ns());
        self.balance.read(reading, period_ns, held);
        if let Some((cpu_ns, run_delay_ns)) = reading.since {
            let counted = (span_ns, cpu_ns, run_delay_ns);
            self.account.read(counted, self.balance.carried_wait_ns());
        }
    }

    /// The stack a fill shows once the kernel's counts are settled (see
    /// `Balance::settle`; `in_poll`: it stands in a request's poll;
    /// `spare`: whether what they owe may go to this fill), its context, and what the thread spent its period doing (for
    /// its account): `stack`, which shows running code if `ran`, or a
    /// synthetic frame in its place. A wait the kernel counted, shown in a
    /// fill outside any request (`context` 0), is filed under the request
    /// the thread waited in: never shown as the stack of a thread parked
    /// after it.
    fn settle(
        &mut self,
        (stack, mut context): (Arc<[u64]>, u64),
        (ran, in_poll): (bool, bool),
        spare: bool,
        period_ns: u64,
    ) -> (Arc<[u64]>, u64, Spent) {
        let frame = (stack.len() == 1).then(|| stack[0]);
        let fill = Guess {
            waiting: frame == Some(crate::frames::WAITING_FOR_CPU_FRAME),
            running: ran || frame == Some(crate::frames::UNCAPTURED_FRAME),
            ran,
            synthetic: frame.is_some(),
            in_poll,
        };
        let synthetic = super::periods::synthetic;
        match self.balance.settle(fill, spare, period_ns) {
            Settled::AsIs => {
                let spent = Spent::of_fill(&stack, ran);
                (stack, context, spent)
            }
            Settled::WaitingForCpu => {
                if context == 0 {
                    context = self.balance.wait_lane();
                }
                let frame = synthetic(crate::frames::WAITING_FOR_CPU_FRAME);
                (frame, context, Spent::WaitingForCpu { counted: true })
            }
            Settled::WaitingUnread => {
                let frame = synthetic(crate::frames::WAITING_UNREAD_FRAME);
                (frame, context, Spent::NotKnown)
            }
            Settled::WaitingInPoll => {
                let frame = synthetic(crate::frames::WAITING_FOR_CPU_FRAME);
                (frame, context, Spent::WaitingForCpu { counted: false })
            }
            Settled::Uncaptured => {
                let frame = synthetic(crate::frames::UNCAPTURED_FRAME);
                (frame, context, Spent::OnCpu)
            }
        }
    }

    /// Whether what the kernel's counts owe may go to a fill leaving now
    /// that does not stand in a request's poll (see `in_poll` in
    /// [`Ledger::drain`]): only what the fills held after it in a poll,
    /// and covered by the counts, do not need. The run delay and CPU time
    /// of a worker that polls requests between parking fell in its polls,
    /// where it ran or waited for a CPU, not where it parked: given in
    /// time order, a wait counted after the worker parked went to the
    /// period it parked in, and a poll's period showed a wait not read
    /// (a request's polls showed less than its time).
    fn spare(&self, in_poll: &impl Fn(u64, &AtTick) -> bool, period_ns: u64) -> bool {
        let owed = self.balance.owed_periods(period_ns);
        if owed <= 0 {
            return true;
        }
        let covered_to = self.balance.counted_to_ns();
        let needed = self
            .held
            .count_fills(|ts, at_tick| ts <= covered_to && in_poll(ts, at_tick));
        owed > needed as i64
    }

    /// How many of the fills leaving now filed under no request show where
    /// the thread waits before the kernel's counts are settled on the
    /// rest. When the time the counts cover began with the thread found
    /// waiting, and it was found running at its end, it was blocked first,
    /// then ran or waited for a CPU: what it ran and waited for a CPU goes
    /// to the latest of those fills, and the earlier ones show where it
    /// waited. Otherwise (it ran, then blocked) the earliest take it.
    fn blocked_first(&self, view: &DrainView) -> usize {
        if !self.balance.began_waiting() || !(view.place.ran || view.ran_last) || view.force {
            return 0;
        }
        let covered_to = self.held.alive_ns().min(self.balance.counted_to_ns());
        let covered = self.held.guessed_fills_up_to(covered_to) as i64;
        let owed = self.balance.owed_periods(view.period_ns);
        (covered - owed).max(0) as usize
    }

    /// Forgets the held samples (those after the thread was last known
    /// alive, when it is dropped from sampling).
    pub(super) fn clear(&mut self) {
        self.held.clear();
    }

    /// Whether a held fill (of the slot at `timestamp_ns`, standing
    /// `at_tick`, where the thread stands at `place`) may leave now, as far
    /// as what is known of it goes (see [`Ledger::drain`]; `later_samples`:
    /// samples of running code queued after it). Not past the moment the
    /// thread was last known alive. A fill known to stand in a request, or
    /// inside one and where the thread stands is known by now (waiting for
    /// a CPU, blocked), may leave. Inside one and not known yet, it waits
    /// for the next look, as a fill of an unknown place does: a thread that
    /// blocked early in a poll shows where it blocked, not that no stack
    /// was captured. So may one the kernel's count of the thread's waits
    /// for a CPU covers.
    fn fill_may_leave(
        &self,
        (timestamp_ns, at_tick): (u64, &AtTick),
        place: &FillPlace,
        view: &DrainView,
        later_samples: usize,
    ) -> bool {
        let standing = matches!(at_tick, AtTick::In(..) | AtTick::Ran(..))
            || (matches!(at_tick, AtTick::InRequest(_)) && place.known)
            || (place.ran && self.balance.owes_wait(view.period_ns));
        let blocked = timestamp_ns > self.held.alive_ns()
            || (!standing && (view.asking || (!place.known && !view.force && later_samples == 0)));
        !blocked
    }

    /// Lets the held samples leave from the oldest while they may: a sample
    /// of running code always; a fill once the thread is known alive at its
    /// time and where it stands is known (not being asked), or a later
    /// sample of running code is queued (it then leaves with the place last
    /// learned, filed under no request). A fill later than the thread's
    /// first capture since it was found where `view.place` shows
    /// (`FillPlace::left_ns`) does not show that place: where it stands is
    /// not known. With more than `MAX_PENDING` held, the oldest leaves
    /// whatever it waits for. A fill without any stack to show is dropped.
    pub(super) fn drain(&mut self, view: &DrainView, mut out: impl FnMut(Out)) {
        let force = view.force;
        let left = view.place.left_ns.map(|at| (at, FillPlace::unknown()));
        let place_at = |timestamp_ns: u64| match &left {
            Some((at, moved)) if *at < timestamp_ns => (moved, true),
            _ => (&view.place, false),
        };
        let mut later_samples = if (view.place.known && left.is_none()) || force {
            0
        } else {
            self.held.samples_queued()
        };
        let mut blocked_first = self.blocked_first(view);
        // A fill standing in a request whose place there is not known: the
        // thread was in the request's poll, running or runnable (one
        // blocked in a request is found there: it is looked at every tick
        // it stands in one).
        let in_poll = |timestamp_ns: u64, at_tick: &AtTick| match at_tick {
            AtTick::InRequest(context) => {
                let place = place_at(timestamp_ns).0;
                !(place.known && place.context == *context)
            }
            _ => false,
        };
        while let Some(front) = self.held.front() {
            let overfull = self.held.overfull();
            if let Pending::Fill {
                timestamp_ns,
                at_tick,
                ..
            } = front
                && !self.fill_may_leave(
                    (*timestamp_ns, at_tick),
                    place_at(*timestamp_ns).0,
                    view,
                    later_samples,
                )
                && !overfull
            {
                break;
            }
            let Some(item) = self.held.pop_front() else {
                break;
            };
            let (timestamp_ns, at_tick) = match item {
                Pending::Sample(sample) => {
                    later_samples = later_samples.saturating_sub(1);
                    let ts = self.held.stamp(sample.timestamp_ns());
                    self.account.shown(Spent::OnCpu, view.period_ns);
                    out(Out::Sample(sample.at(ts)));
                    continue;
                }
                Pending::Fill {
                    timestamp_ns,
                    at_tick,
                    ..
                } => (timestamp_ns, at_tick),
            };
            let guessed = matches!(at_tick, AtTick::Outside | AtTick::Unknown);
            let (place, stale) = place_at(timestamp_ns);
            let poll = in_poll(timestamp_ns, &at_tick);
            let spare = poll || self.spare(&in_poll, view.period_ns);
            let shown = shown_in_fill(at_tick, place, force);
            let Some((stack, context, ran)) = shown else {
                continue;
            };
            let (stack, context, spent) = if guessed && !stale && blocked_first > 0 {
                // Blocked where it last waited, before it ran.
                blocked_first -= 1;
                let spent = Spent::of_fill(&stack, ran);
                (stack, context, spent)
            } else {
                self.settle((stack, context), (ran, poll), spare, view.period_ns)
            };
            self.account.shown(spent, view.period_ns);
            out(Out::Fill {
                timestamp_ns: self.held.stamp(timestamp_ns),
                stack,
                context,
            });
        }
    }
}

impl FillPlace {
    /// Where a thread stands that ran since it was last found anywhere
    /// and has no known wait to guess (never found waiting, or it left the
    /// place it was found in, see [`FillPlace::left_ns`]): not known; its
    /// fills show what the kernel counted, never a stack.
    pub(super) fn unknown() -> Self {
        Self {
            stack: Some(super::periods::synthetic(crate::frames::UNCAPTURED_FRAME)),
            context: 0,
            known: false,
            ran: true,
            left_ns: None,
        }
    }
}

/// What a fill standing `at_tick` shows when it leaves, where the thread
/// stands at `place` (`force`: it leaves with what is known, the thread
/// gone or the sampler pausing): a stack, its context word, and whether
/// the stack shows running code; `None`: nothing (no place known to show).
fn shown_in_fill(
    at_tick: AtTick,
    place: &FillPlace,
    force: bool,
) -> Option<(Arc<[u64]>, u64, bool)> {
    match at_tick {
        AtTick::In(stack, context) => Some((stack, context, false)),
        AtTick::Ran(stack, context) => Some((stack, context, true)),
        // Where the thread is found standing in the request now (waiting
        // for a CPU, blocked), or else the period stays the request's with
        // a frame saying no stack of it was captured: a stack of another
        // moment (its own latest, or the request's on another thread)
        // would show code that may have returned.
        AtTick::InRequest(context) if place.known && place.context == context => {
            place.stack.clone().map(|s| (s, context, false))
        }
        AtTick::InRequest(context) => Some((
            super::periods::synthetic(crate::frames::UNCAPTURED_FRAME),
            context,
            false,
        )),
        AtTick::Outside => place.stack.clone().map(|s| (s, 0, false)),
        AtTick::Unknown => {
            let context = if place.known || force {
                place.context
            } else {
                0
            };
            place.stack.clone().map(|s| (s, context, false))
        }
    }
}

#[cfg(test)]
mod timelines;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::held::MAX_PENDING;
    use crate::sampler::slots::{stand_in_times, tick_span};

    /// Readings of the kernel's counts as the tests below write them.
    impl Ledger {
        /// A reading of `cpu` ns of CPU time and `delay` ns of run delay
        /// since the one before, at the time of the one before.
        fn kernel_counted(&mut self, cpu: u64, delay: u64, period_ns: u64, lane_now: u64) {
            self.reading(lane_now, Some((cpu, delay)), period_ns);
        }

        /// The first reading.
        fn counting_from_now(&mut self, lane_now: u64) {
            self.reading(lane_now, None, P);
        }

        fn reading(&mut self, lane_now: u64, since: Option<(u64, u64)>, period_ns: u64) {
            let reading = Reading {
                at_ns: self.balance.counted_to_ns(),
                began_waiting: self.balance.began_waiting(),
                lane_now,
                since,
            };
            self.kernel_read(reading, period_ns);
        }

        /// The counts were last read at `at_ns`.
        fn read_at(&mut self, at_ns: u64) {
            let began_waiting = self.balance.began_waiting();
            self.balance.was_read(at_ns, began_waiting);
        }

        /// A ledger whose thread was found waiting when its counts were
        /// last read.
        fn found_waiting() -> Self {
            let mut l = Self::default();
            l.balance.was_read(0, true);
            l
        }
    }

    #[test]
    fn a_request_fill_shows_where_its_thread_stands_in_it_and_no_other_moment() {
        let waiting: Arc<[u64]> = Arc::from(&[0x10_u64, 0x20][..]);
        let place = |known: bool| FillPlace {
            stack: Some(waiting.clone()),
            context: 7,
            known,
            ran: false,
            left_ns: None,
        };
        // In the request the thread is found standing in: where it stands.
        let shown = shown_in_fill(AtTick::InRequest(7), &place(true), false);
        assert_eq!(shown, Some((waiting.clone(), 7, false)));
        // In another request (or not known yet): that request's, with no
        // stack of another moment, only the frame that says so.
        for p in [place(true), place(false)] {
            let (stack, context, ran) = shown_in_fill(AtTick::InRequest(9), &p, false).unwrap();
            assert_eq!(&*stack, &[crate::frames::UNCAPTURED_FRAME]);
            assert_eq!((context, ran), (9, false));
        }
        // Outside any request: where it stands, under no request.
        let shown = shown_in_fill(AtTick::Outside, &place(true), false);
        assert_eq!(shown, Some((waiting.clone(), 0, false)));
        // No word published: under the place's request only once where it
        // stands is known, or it leaves with what is known.
        let context =
            |known, force| shown_in_fill(AtTick::Unknown, &place(known), force).map(|s| s.1);
        assert_eq!(context(false, false), Some(0));
        assert_eq!(context(true, false), Some(7));
        assert_eq!(context(false, true), Some(7));
        // A capture's stack next to it is running code.
        let shown = shown_in_fill(AtTick::Ran(waiting.clone(), 3), &place(false), false);
        assert_eq!(shown, Some((waiting.clone(), 3, true)));
        // No place known at all: nothing to show.
        let none = FillPlace::default();
        assert_eq!(shown_in_fill(AtTick::Outside, &none, true), None);
    }

    const P: u64 = 100;
    const HALF: u64 = P / 2;

    fn stack(a: u64) -> Arc<[u64]> {
        Arc::from(&[a][..])
    }

    /// The waiting-for-a-CPU frame.
    const WAITING: u64 = crate::frames::WAITING_FOR_CPU_FRAME;

    fn sample(ts: u64, frame: u64, context: u64) -> Sample {
        Sample::new(ts, 7, Arc::from("t"), stack(frame), context, false)
    }

    fn view(place: FillPlace) -> DrainView {
        DrainView {
            place,
            asking: false,
            force: false,
            ran_last: false,
            period_ns: 100,
        }
    }

    fn known(frame: u64, context: u64) -> FillPlace {
        FillPlace {
            stack: Some(stack(frame)),
            context,
            known: true,
            ran: false,
            left_ns: None,
        }
    }

    /// Where a thread never found waiting, that ran since, stands: not
    /// known (as `Whereabouts::fill_place` says).
    fn ran() -> FillPlace {
        FillPlace::unknown()
    }

    /// Drains and returns (timestamp, first frame, context, fill?).
    fn drain(l: &mut Ledger, v: &DrainView) -> Vec<(u64, u64, u64, bool)> {
        let mut got = Vec::new();
        l.drain(v, |o| match o {
            Out::Sample(s) => got.push((s.timestamp_ns(), s.frames()[0], s.context(), false)),
            Out::Fill {
                timestamp_ns,
                stack,
                context,
            } => got.push((timestamp_ns, stack[0], context, true)),
        });
        got
    }

    /// Runs a thread through `ticks` ticks one period `p` apart, each
    /// running late by `late(k)` and reaching the thread `preempted(k)`
    /// after it began (the sampler thread preempted in the middle of the
    /// tick), whose captures (in time order) are `captures`; returns the
    /// timestamps of what leaves its ledger.
    fn simulate(
        p: u64,
        ticks: u64,
        late: impl Fn(u64) -> u64,
        preempted: impl Fn(u64) -> u64,
        captures: &[u64],
    ) -> Vec<u64> {
        let mut l = Ledger::default();
        let mut out = Vec::new();
        let mut next = 0;
        let mut deadline = p;
        let mut owed = 0;
        for k in 1..=ticks {
            let now = deadline + late(k);
            // A tick so late that later deadlines passed stands for those
            // too, and one that overran its period stands the next for the
            // deadlines it overran (as the sampler's run loop does).
            let (periods, passed, slot_end) = tick_span(owed, now - deadline, p, now, 100);
            deadline += p * (1 + u64::from(passed));
            let harvest = now + preempted(k);
            owed = 0;
            if deadline <= harvest {
                let missed = (harvest - deadline) / p + 1;
                deadline += missed * p;
                owed = missed as u32;
            }
            // The thread's two capture slots keep the oldest two captures
            // since the tick before; the kernel counts the rest as missed,
            // and they stand in right after the latest capture.
            let mut taken = Vec::new();
            let mut missed = 0;
            while next < captures.len() && captures[next] <= harvest {
                if taken.len() < 2 {
                    taken.push(captures[next]);
                } else {
                    missed += 1;
                }
                next += 1;
            }
            let slots = l.slots_of_tick(periods, slot_end, p, taken.last().copied(), 100);
            let mut running: Vec<u64> = taken
                .iter()
                .map(|&c| l.push_sample(sample(c, 1, 0)))
                .collect();
            for ts in stand_in_times(running.last().copied(), missed, periods, true) {
                running.push(l.push_sample(sample(ts, 1, 0)));
            }
            let placed = l.place_tick(slots, &running, p / 2, p);
            for slot in placed.free {
                l.push_fill(slot, None, AtTick::In(stack(9), 0));
            }
            if running.is_empty() {
                // Its clock was read and had moved: alive, but the tick's
                // own fill waits a tick (as a thread's tick does, see `step`).
                l.alive_at(slot_end - 1);
            }
            l.drain(&view(known(9, 0)), |o| {
                out.push(match o {
                    Out::Sample(s) => s.timestamp_ns(),
                    Out::Fill { timestamp_ns, .. } => timestamp_ns,
                })
            });
        }
        out
    }

    #[test]
    fn a_simulated_thread_gets_a_sample_every_period_and_no_more() {
        const P: u64 = 9_900;
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let lateness: Vec<u64> = (0..1_000).map(|_| rand(P * 9 / 10)).collect();
        let jittery = |k: u64| lateness[k as usize % lateness.len()];
        // The sampler thread stalled now and then, up to four periods (not
        // given a core on a busy machine).
        let stalls: Vec<u64> = (0..1_000)
            .map(|k| {
                if k % 37 == 5 {
                    P + rand(3 * P)
                } else {
                    lateness[k] / 4
                }
            })
            .collect();
        let stalled = |k: u64| stalls[k as usize % stalls.len()];
        // The sampler thread preempted in the middle of a tick now and
        // then, for up to four periods: it harvests captures taken after
        // the tick began.
        let preempts: Vec<u64> = (0..1_000)
            .map(|k| if k % 29 == 11 { P + rand(3 * P) } else { 0 })
            .collect();
        let never = |_: u64| 0u64;
        let preempting = |k: u64| preempts[k as usize % preempts.len()];
        // One sample per period (the last few still held). A busy
        // thread's stand-ins for periods it ran through while the sampler
        // thread stalled sit right after a capture, and the fills of those
        // periods' slots may stay too: up to 6 % more here, with a stall
        // of up to four periods every 29 or 37 ticks.
        let per_period = |out: &[u64]| {
            let periods = out.last().unwrap() / P;
            assert!(
                (periods.saturating_sub(10)..=periods + periods / 12 + 5)
                    .contains(&(out.len() as u64)),
                "{} samples for {periods} periods",
                out.len()
            );
        };
        // A busy thread: its timer fires at the first 4 ms scheduler tick
        // after each period of CPU time, at any phase against the ticks.
        for phase in [0, 1_300, 2_500, 4_000, 4_900, 5_000, 7_700, 9_800] {
            let captures: Vec<u64> = (1..1_000u64)
                .map(|i| (phase + i * P).div_ceil(4_000) * 4_000)
                .collect();
            for late in [&never as &dyn Fn(u64) -> u64, &jittery, &stalled] {
                for preempted in [&never as &dyn Fn(u64) -> u64, &preempting] {
                    let out = simulate(P, 900, late, preempted, &captures);
                    let gaps = out.windows(2).map(|w| w[1] - w[0]);
                    assert!(
                        out.windows(2).all(|w| w[1] > w[0]),
                        "phase {phase}: time order"
                    );
                    let max = gaps.max().unwrap();
                    assert!(max <= 2 * P, "phase {phase}: a gap of {max}");
                    per_period(&out);
                }
            }
        }
        // A thread running a third of the time: a capture every three
        // periods, fills between. The measured defect: a tick that ran
        // two periods late harvested a capture taken during the stall,
        // and the fills of the deadlines it passed, given by the next
        // tick, left after that capture: 22 ms without a sample.
        // Then a thread that runs two and a half periods and sleeps as
        // long: its timer fires after every period of CPU time. The second
        // measured defect: the sampler thread, preempted in the middle of
        // a tick, harvested a capture taken after the tick began; the
        // fills of the deadlines before it, given by the next tick, left
        // after it: 45 ms without a sample.
        let mut bursts = Vec::new();
        let mut cpu = 0;
        for t in (0..1_000 * P).step_by(100) {
            if t % (5 * P) < 5 * P / 2 {
                cpu += 100;
                if cpu % P == 0 {
                    bursts.push(t);
                }
            }
        }
        let thirds: Vec<Vec<u64>> = [1_234, 5_000, 9_000]
            .iter()
            .map(|phase| (1..400u64).map(|i| i * 3 * P + phase).collect())
            .collect();
        for (i, late) in [&jittery as &dyn Fn(u64) -> u64, &stalled]
            .into_iter()
            .enumerate()
        {
            for preempted in [&never as &dyn Fn(u64) -> u64, &preempting] {
                for captures in thirds.iter().chain([&bursts]) {
                    let out = simulate(P, 900, late, preempted, captures);
                    let max = out.windows(2).map(|w| w[1] - w[0]).max().unwrap();
                    assert!(
                        out.windows(2).all(|w| w[1] > w[0]) && max <= 2 * P,
                        "lateness {i}: a gap of {max}"
                    );
                    per_period(&out);
                }
            }
        }
    }

    /// One tick of a thread: its new `slots`, its `captures`; free slots
    /// get fills. Returns the placement.
    fn tick(l: &mut Ledger, slots: &[u64], captures: &[u64]) -> Placement {
        let given = l.slots_of_tick(slots.len() as u32, slots[slots.len() - 1], P, None, 0);
        assert_eq!(given, slots, "the tick's slots");
        let running: Vec<u64> = captures
            .iter()
            .map(|&c| l.push_sample(sample(c, 1, 0)))
            .collect();
        let p = l.place_tick(slots.to_vec(), &running, HALF, P);
        for &f in &p.free {
            l.push_fill(f, None, AtTick::Unknown);
        }
        p
    }

    #[test]
    fn a_capture_drifting_against_the_ticks_takes_the_free_slot_before_it() {
        // Captures 80 and 120 apart (a timer firing at the scheduler's
        // tick): the capture at 1_060 is 60 from the slot at 1_000 and
        // none is nearer; the sample before that slot (the capture at 940)
        // is close enough for it to take the slot.
        let mut l = Ledger::default();
        l.push_sample(sample(940, 1, 0));
        let p = tick(&mut l, &[1_000], &[1_060]);
        assert_eq!((p.free.len(), p.extra.len()), (0, 0));
        // Nothing for 250 before the slot: taking it would leave a gap of
        // more than two periods before the capture; the slot gets a fill,
        // and the capture, after it, waits for the next tick's slot.
        let mut l = Ledger {
            held: Held::emitted_at(750),
            ..Ledger::default()
        };
        let p = tick(&mut l, &[1_000], &[1_060]);
        assert_eq!(p.free, [1_000]);
        assert!(p.extra.is_empty());
        let p = tick(&mut l, &[1_100], &[]);
        assert!(p.free.is_empty() && p.extra.is_empty(), "{p:?}");
        // A held fill is the free slot before it: cancelled.
        let mut l = Ledger::default();
        l.push_sample(sample(900, 1, 0));
        l.push_fill(1_000, None, AtTick::Unknown);
        let p = tick(&mut l, &[1_200], &[1_070]);
        assert_eq!(p.cancelled, [1_000]);
        assert_eq!(p.free, [1_200]);
        assert!(l.held.fills() == [1_200]);
    }

    #[test]
    fn a_thread_with_more_samples_than_slots_gives_up_fills_between_close_captures() {
        // The slot at 900 is taken by the capture at 890; the one at 940
        // is 60 from the slot at 1_000, which gets a fill.
        let mut l = Ledger {
            slots: Slots::after(800),
            ..Ledger::default()
        };
        tick(&mut l, &[900], &[890, 940]);
        let p = tick(&mut l, &[1_000], &[]);
        assert_eq!(p.free, [1_000]);
        // The next capture, at 1_060, takes the slot at 1_100: one sample
        // too many, and the fill at 1_000 has captures 120 apart around it.
        let p = tick(&mut l, &[1_100], &[1_060]);
        assert_eq!(p.cancelled, [1_000]);
        assert!(p.free.is_empty() && p.extra.is_empty());
        // Had the next capture come 250 after it, the fill stays (it would
        // leave a gap of more than two periods).
        let mut l = Ledger {
            slots: Slots::after(800),
            ..Ledger::default()
        };
        tick(&mut l, &[900], &[890, 940]);
        tick(&mut l, &[1_000], &[]);
        let p = tick(&mut l, &[1_100], &[1_190]);
        assert!(p.cancelled.is_empty(), "{p:?}");
    }

    #[test]
    fn a_capture_carried_to_the_next_tick_makes_no_surplus() {
        // The capture at 1_121 finds no slot near it (1_070 is 51 before
        // it, and the sample before that slot 300 before it): it waits for
        // the next tick's slot. Counted as a sample beyond the slots given
        // now, it made a surplus that cancelled the held fill at 770 (the
        // thread then had no sample of its own for that period).
        let mut l = Ledger {
            held: Held::emitted_at(670),
            slots: Slots::after(770),
            ..Ledger::default()
        };
        l.push_fill(770, None, AtTick::Unknown);
        let p = tick(&mut l, &[870, 970, 1_070], &[821, 1_121]);
        assert!(p.cancelled.is_empty(), "{p:?}");
        assert_eq!(l.held.fills(), [770, 970, 1_070]);
        // The next tick's slot is its own.
        let p = tick(&mut l, &[1_170], &[]);
        assert!(p.free.is_empty() && p.cancelled.is_empty(), "{p:?}");
        assert_eq!(l.held.fills(), [770, 970, 1_070]);
    }

    #[test]
    fn samples_leave_in_time_order() {
        let mut l = Ledger::default();
        l.push_sample(sample(100, 1, 0));
        l.push_fill(50, None, AtTick::In(stack(9), 0));
        l.alive_at(100);
        let got = drain(&mut l, &view(known(9, 0)));
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), [50, 100]);
        // A capture harvested a tick late, older than what already left,
        // leaves just after it; so does a fill.
        l.push_sample(sample(90, 2, 0));
        l.push_fill(95, None, AtTick::In(stack(9), 0));
        l.alive_at(200);
        let got = drain(&mut l, &view(known(9, 0)));
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), [101, 102]);
    }

    #[test]
    fn a_fill_waits_until_the_thread_is_known_alive_at_its_time() {
        let mut l = Ledger::default();
        l.push_fill(100, None, AtTick::Unknown);
        l.push_fill(200, None, AtTick::Unknown);
        l.alive_at(150);
        let got = drain(&mut l, &view(known(9, 4)));
        assert_eq!(got, [(100, 9, 4, true)]);
        // The thread exited: what was held after it was last alive is
        // dropped with it.
        l.clear();
        l.alive_at(u64::MAX);
        assert!(drain(&mut l, &view(known(9, 4))).is_empty());
    }

    #[test]
    fn a_fill_of_an_unknown_place_waits_for_it_or_for_a_later_capture() {
        let place = || FillPlace {
            stack: Some(stack(9)),
            context: 4,
            known: false,
            ran: true,
            left_ns: None,
        };
        let mut l = Ledger::default();
        l.push_fill(100, None, AtTick::Unknown);
        l.alive_at(1_000);
        assert!(drain(&mut l, &view(place())).is_empty());
        // Asked where it waits: the fill waits for the answer.
        let mut asking = view(known(9, 4));
        asking.asking = true;
        assert!(drain(&mut l, &asking).is_empty());
        // A later capture: the fill leaves with the place last learned,
        // filed under no request.
        l.push_sample(sample(150, 1, 4));
        let got = drain(&mut l, &view(place()));
        assert_eq!(got, [(100, 9, 0, true), (150, 1, 4, false)]);
    }

    #[test]
    fn a_fill_in_a_request_shows_where_the_thread_stands_in_it_or_that_no_stack_was_captured() {
        let mut l = Ledger::default();
        l.push_fill(100, None, AtTick::InRequest(5));
        l.alive_at(500);
        // Found waiting for a CPU (or blocked) in request 5 by the time it
        // leaves: that.
        let got = drain(&mut l, &view(known(WAITING, 5)));
        assert_eq!(got, [(100, WAITING, 5, true)]);
        // Standing in another request, or not known: the period stays
        // request 5's, no stack of any other moment shown.
        l.push_fill(200, None, AtTick::InRequest(5));
        let got = drain(&mut l, &view(known(WAITING, 6)));
        assert_eq!(got, [(200, crate::frames::UNCAPTURED_FRAME, 5, true)]);
        // Not known yet where it stands: the fill waits for the next look
        // (found blocked in request 5: there)...
        l.push_fill(300, None, AtTick::InRequest(5));
        assert!(drain(&mut l, &view(FillPlace::default())).is_empty());
        let got = drain(&mut l, &view(known(9, 5)));
        assert_eq!(got, [(300, 9, 5, true)]);
        // ...or for a later capture, and then shows that no stack of it was
        // captured.
        l.push_fill(400, None, AtTick::InRequest(5));
        l.push_sample(sample(450, 1, 5));
        let got = drain(&mut l, &view(FillPlace::default()));
        assert_eq!(
            got,
            [
                (400, crate::frames::UNCAPTURED_FRAME, 5, true),
                (450, 1, 5, false)
            ]
        );
    }

    #[test]
    fn fills_show_the_waits_for_a_cpu_the_kernel_counted_and_no_more() {
        // Period 100. A thread in request 5 not found anywhere through
        // four periods, and the kernel counts 230 of them waiting for a
        // CPU and none running: two fills show that wait (the rest rounds
        // off under half a period), the others that it waited where the
        // sampler did not read (not that it ran).
        let mut l = Ledger::default();
        for slot in [100, 200, 300, 400] {
            l.push_fill(slot, None, AtTick::InRequest(5));
        }
        l.alive_at(500);
        l.kernel_counted(0, 230, 100, 0);
        let got = drain(&mut l, &view(ran()));
        assert_eq!(got, [(100, WAITING, 5, true), (200, WAITING, 5, true)]);
        // (The others wait for a look, or a later capture.)
        l.push_sample(sample(450, 1, 5));
        let got = drain(&mut l, &view(ran()));
        let unread = crate::frames::WAITING_UNREAD_FRAME;
        assert_eq!(
            got,
            [
                (300, unread, 5, true),
                (400, unread, 5, true),
                (450, 1, 5, false)
            ]
        );
        // Outside any request too: not the place it last waited in.
        l.push_fill(600, None, AtTick::Outside);
        l.alive_at(700);
        // (The capture at 450 ran its period.)
        l.kernel_counted(100, 100, 100, 0);
        let got = drain(&mut l, &view(ran()));
        assert_eq!(got, [(600, WAITING, 0, true)]);
        // Never more than the fills held (and one) can show: a long wait
        // counted while captures showed the thread running does not leak
        // into later periods.
        l.kernel_counted(0, 10_000, 100, 0);
        for slot in [800, 900, 1000] {
            l.push_fill(slot, None, AtTick::InRequest(6));
        }
        l.push_sample(sample(1050, 1, 6));
        let got = drain(&mut l, &view(ran()));
        assert_eq!(got.iter().filter(|g| g.1 == WAITING).count(), 1, "{got:?}");
        assert_eq!(got.len(), 4);
        // A thread found blocked in the kernel since shows the wait for a
        // CPU it was counted, then where it blocks.
        l.push_fill(1200, None, AtTick::Outside);
        l.push_fill(1300, None, AtTick::Outside);
        l.kernel_counted(0, 100, 100, 0);
        l.alive_at(1400);
        let got = drain(&mut l, &view(known(9, 0)));
        assert_eq!(got, [(1200, WAITING, 0, true), (1300, 9, 0, true)]);
        // Fills shown waiting for a CPU before the kernel counted it
        // (found runnable and not running) are not shown twice once it
        // does.
        let mut l = Ledger::default();
        for slot in [100, 200] {
            l.push_fill(slot, None, AtTick::InRequest(5));
        }
        l.alive_at(300);
        assert_eq!(drain(&mut l, &view(known(WAITING, 5))).len(), 2);
        // (The kernel counted the capture's period running and no more:
        // the fill is not shown running either.)
        l.push_fill(300, None, AtTick::InRequest(5));
        l.push_sample(sample(350, 1, 5));
        l.kernel_counted(100, 200, 100, 0);
        let got = drain(&mut l, &view(ran()));
        assert_eq!(got, [(300, unread, 5, true), (350, 1, 5, false)]);
    }

    /// A wait counted only after the thread left the request it waited in
    /// (and parked) is shown under that request, not as the parked thread
    /// waiting for a CPU.
    #[test]
    fn a_wait_counted_after_the_request_is_the_requests() {
        let mut l = Ledger::default();
        l.counting_from_now(5);
        l.push_fill(100, None, AtTick::Outside);
        l.alive_at(200);
        l.kernel_counted(0, 80, 100, 0);
        let got = drain(&mut l, &view(known(9, 0)));
        assert_eq!(got, [(100, WAITING, 5, true)]);
        // The next wait, counted from a reading outside any request, is the
        // thread's own.
        l.push_fill(300, None, AtTick::Outside);
        l.alive_at(400);
        l.kernel_counted(0, 80, 100, 0);
        let got = drain(&mut l, &view(known(9, 0)));
        assert_eq!(got, [(300, WAITING, 0, true)]);
    }

    #[test]
    fn fills_show_cpu_time_no_sample_shows_as_run_without_a_stack() {
        // Period 100. A thread found waiting at every look (in 9) ran 230
        // of CPU time in bursts no timer caught, and one capture shows 100
        // of it: one fill of four shows that it ran (the rest rounds off
        // under half a period), the others where it waits.
        let unc = crate::frames::UNCAPTURED_FRAME;
        let mut l = Ledger::default();
        l.push_sample(sample(50, 1, 0));
        for slot in [100, 200, 300, 400] {
            l.push_fill(slot, None, AtTick::Outside);
        }
        l.alive_at(500);
        l.kernel_counted(230, 0, 100, 0);
        let got = drain(&mut l, &view(known(9, 0)));
        assert_eq!(
            got,
            [
                (50, 1, 0, false),
                (100, unc, 0, true),
                (200, 9, 0, true),
                (300, 9, 0, true),
                (400, 9, 0, true)
            ]
        );
        // Fills showing the code of a capture next to them show running
        // time: no more is owed for it.
        let mut l = Ledger::default();
        l.push_fill(100, None, AtTick::Ran(stack(1), 0));
        l.push_fill(200, None, AtTick::Outside);
        l.alive_at(300);
        l.kernel_counted(100, 0, 100, 0);
        let got = drain(&mut l, &view(known(9, 0)));
        assert_eq!(got, [(100, 1, 0, true), (200, 9, 0, true)]);
        // Owed both, the larger goes first.
        let mut l = Ledger::default();
        for slot in [100, 200, 300] {
            l.push_fill(slot, None, AtTick::Outside);
        }
        l.alive_at(400);
        l.kernel_counted(100, 200, 100, 0);
        let got = drain(&mut l, &view(known(9, 0)));
        let frames: Vec<u64> = got.iter().map(|g| g.1).collect();
        assert_eq!(frames, [WAITING, WAITING, unc]);
    }

    #[test]
    fn a_thread_woken_from_its_wait_shows_the_wait_then_what_it_ran() {
        // Period 100. A thread found waiting in 9 at the reading before,
        // found running at this one (it woke and ran 200 of CPU time, no
        // capture): the four fills show the wait first, then that it ran.
        let unc = crate::frames::UNCAPTURED_FRAME;
        let fills = |l: &mut Ledger| {
            for slot in [100, 200, 300, 400] {
                l.push_fill(slot, None, AtTick::Outside);
            }
            l.alive_at(500);
            l.read_at(500);
            l.kernel_counted(200, 0, 100, 0);
        };
        let mut l = Ledger::found_waiting();
        fills(&mut l);
        let woke = DrainView {
            ran_last: true,
            ..view(known(9, 0))
        };
        let got = drain(&mut l, &woke);
        let frames: Vec<u64> = got.iter().map(|g| g.1).collect();
        assert_eq!(frames, [9, 9, unc, unc]);
        // Not found waiting at the reading before (it ran, then blocked
        // where it is found now): what it ran comes first.
        let mut l = Ledger::default();
        fills(&mut l);
        let got = drain(&mut l, &view(known(9, 0)));
        let frames: Vec<u64> = got.iter().map(|g| g.1).collect();
        assert_eq!(frames, [unc, unc, 9, 9]);
    }

    #[test]
    fn a_guessed_place_waits_for_the_kernels_counts_of_its_moment() {
        let mut l = Ledger::default();
        l.push_fill(100, None, AtTick::Outside);
        l.alive_at(50);
        // Not known alive at the fill yet: nothing to read for.
        assert!(!l.wants_counts(&ran()));
        l.alive_at(150);
        assert!(l.wants_counts(&ran()));
        // Where it waits is current: no guess to correct.
        assert!(!l.wants_counts(&known(9, 0)));
        // Counts read after the fill cover it.
        l.read_at(120);
        assert!(!l.wants_counts(&ran()));
    }

    #[test]
    fn fills_between_captures_close_together_show_the_running_code() {
        let waiting = known(9, 0);
        let mut l = Ledger::default();
        let (a, b) = (stack(1), stack(2));
        l.captured(100, &a, 4, 150);
        // A fill the next capture is too far from to take, 120 after the
        // previous one: the thread ran through it.
        l.push_fill(150, Some(Some(4)), AtTick::Unknown);
        l.push_fill(350, Some(Some(4)), AtTick::Unknown);
        l.captured(220, &b, 4, 150);
        // The next capture 200 later: the thread also waited in between,
        // the fill keeps where it stood.
        l.push_sample(sample(420, 3, 4));
        l.captured(420, &stack(3), 4, 150);
        l.alive_at(1_000);
        let got = drain(&mut l, &view(waiting));
        assert_eq!(
            got,
            [(150, 1, 4, true), (350, 9, 0, true), (420, 3, 4, false)]
        );
        // A thread never found waiting, captured far apart: neither
        // capture's code is known to have been on its stack between them.
        let mut l = Ledger::default();
        l.captured(100, &a, 0, 150);
        l.push_fill(300, None, AtTick::Unknown);
        l.captured(500, &b, 0, 150);
        l.alive_at(1_000);
        let got = drain(&mut l, &view(known(WAITING, 0)));
        assert_eq!(got, [(300, WAITING, 0, true)]);
    }

    #[test]
    fn a_fill_after_a_capture_newer_than_the_wait_never_shows_that_wait() {
        // Found waiting in 9 before 100; woke, was captured running at 200
        // (it returned from the wait), ran 100 of CPU time more and
        // blocked. Its place is the old wait, a guess.
        let unc = crate::frames::UNCAPTURED_FRAME;
        let unread = crate::frames::WAITING_UNREAD_FRAME;
        let guess = || FillPlace {
            stack: Some(stack(9)),
            context: 0,
            known: true,
            ran: true,
            left_ns: Some(200),
        };
        let story = || {
            let mut l = Ledger::found_waiting();
            l.counting_from_now(0);
            l.push_fill(100, None, AtTick::Outside);
            l.push_sample(sample(200, 1, 0));
            l.captured(200, &stack(1), 0, 150);
            for slot in [300, 400, 500] {
                l.push_fill(slot, None, AtTick::Outside);
            }
            l.alive_at(600);
            l.read_at(600);
            l.kernel_counted(200, 0, P, 0);
            l
        };
        let frames = |got: Vec<(u64, u64, u64, bool)>| got.iter().map(|g| g.1).collect::<Vec<_>>();
        // Before the capture, the wait it was found in may stand; after
        // it, where it stands is not known: those fills wait for a look.
        let mut l = story();
        assert_eq!(frames(drain(&mut l, &view(guess()))), [9, 1]);
        // Found blocked in 7 then: what it ran, then that wait.
        assert_eq!(frames(drain(&mut l, &view(known(7, 0)))), [unc, 7, 7]);
        // Gone before a look (what it held leaves, what it ran first):
        // after the capture, a wait whose place was not read. Never the old
        // wait: its code had returned.
        let leaving = DrainView {
            force: true,
            ..view(guess())
        };
        let got = frames(drain(&mut story(), &leaving));
        assert_eq!(got, [unc, 1, unread, unread, unread]);
        // Found waiting there again after the capture: shown there.
        let mut l = Ledger::default();
        l.captured(200, &stack(1), 0, 150);
        l.push_fill(300, None, AtTick::Outside);
        l.alive_at(600);
        assert_eq!(drain(&mut l, &view(known(9, 0))), [(300, 9, 0, true)]);
    }

    #[test]
    fn too_many_held_samples_write_out_the_oldest() {
        let mut l = Ledger::default();
        for i in 0..=MAX_PENDING as u64 {
            l.push_fill(100 + i, None, AtTick::Unknown);
        }
        let got = drain(&mut l, &view(known(9, 0)));
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, 100);
    }
}
