//! Each thread's ledger of sampling periods: which period slots its samples
//! take, which samples it holds back, and in what order they leave.
//!
//! The sampler's ticks cut wall time into period slots, one per tick at
//! the tick's deadline (a late tick stands for the slots it missed, one
//! period apart back from the latest deadline passed when it runs: see
//! [`tick_span`]; and for a thread whose capture it harvested later still,
//! up to that capture: see [`thread_slots`]). Every slot of a live thread
//! gets at least one sample:
//!
//! - a sample of running code (a timer capture, or a stand-in for a period
//!   the kernel counted without a capture, where its counts of the
//!   thread's CPU time cannot be read) takes the free slot nearest to
//!   it within half a period, a held fill's slot included (that fill is
//!   then cancelled); one that finds none is an extra sample, kept;
//! - every slot left free gets a fill.
//!
//! So each slot has a sample within half a period of it, and two
//! consecutive samples of a live thread are never more than two periods
//! apart: Sentry weights a sample by the time to the next sample of its
//! thread, and a slot without a sample would be charged to the sample
//! before it. A held fill is cancelled only by a sample of running code in
//! its own slot, never by a count of captures elsewhere.
//!
//! A thread's samples leave in time order: a fill is held until the thread
//! is known alive at its time (no sample outlives its thread) and where it
//! stands is known, and the samples after it wait with it.
//!
//! Everything here is decided from its arguments (no clock, no system
//! call), so the unit tests below pin every case down.

use std::collections::VecDeque;
use std::sync::Arc;

use super::Sample;
use super::balance::{Balance, Settled};
use super::periods::AtTick;

/// Most samples beyond one per slot a thread's ledger remembers, to cancel
/// held fills for.
const MAX_SURPLUS: i64 = 4;

/// Most samples a thread may hold; more means the oldest is written out.
pub(super) const MAX_PENDING: usize = 256;

/// A thread's sample waiting to be emitted; a thread's samples leave in
/// time order (see the sampler's module docs).
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
    Sample(super::Sample),
}

impl Pending {
    pub(super) fn timestamp_ns(&self) -> u64 {
        match self {
            Self::Fill { timestamp_ns, .. } => *timestamp_ns,
            Self::Sample(s) => s.timestamp_ns(),
        }
    }
}

/// The period slots a tick stands for, oldest first: `periods` slots one
/// `period_ns` apart ending at `slot_end` (the tick's deadline), only those
/// after `last_slot` (the thread's slot at its previous tick). A thread
/// seen for the first time gets the latest slot only.
pub(super) fn slot_times(
    periods: u32,
    slot_end: u64,
    last_slot: Option<u64>,
    period_ns: u64,
) -> Vec<u64> {
    let Some(last) = last_slot else {
        return vec![slot_end];
    };
    (0..u64::from(periods))
        .rev()
        .map(|j| slot_end.saturating_sub(j.saturating_mul(period_ns)))
        .filter(|&s| s > last)
        .collect()
}

/// A thread's slots at a tick (see [`slot_times`]), carried on to the
/// latest deadline before its latest capture `latest_ns` harvested then,
/// if that is later than the tick's latest slot: a sampler thread
/// preempted in the middle of a tick harvests captures taken after the
/// tick began, and a slot they left behind that the next tick filled
/// would leave after them, out of its place. At most `max_extra` slots
/// are added.
pub(super) fn thread_slots(
    periods: u32,
    slot_end: u64,
    last_slot: Option<u64>,
    period_ns: u64,
    latest_ns: Option<u64>,
    max_extra: u32,
) -> Vec<u64> {
    let period_ns = period_ns.max(1);
    let extra = latest_ns.map_or(0, |c| {
        (c.saturating_sub(slot_end) / period_ns).min(u64::from(max_extra))
    });
    slot_times(
        periods.saturating_add(extra as u32),
        slot_end + extra * period_ns,
        last_slot,
        period_ns,
    )
}

/// What a tick that runs `late_ns` after its deadline stands for, with
/// `owed` periods missed before it (at most `max_periods` in all): how
/// many periods, how many whole periods after its deadline it ran (those
/// deadlines are its own too), and its latest slot, the latest deadline
/// passed (`now_ns` is when it runs).
///
/// A tick that runs more than a period late stands for every deadline
/// passed by now: the captures it harvests were taken up to now, and a
/// slot they left behind that the next tick filled would leave after
/// them, out of its place (a gap of the stall's length).
pub(super) fn tick_span(
    owed: u32,
    late_ns: u64,
    period_ns: u64,
    now_ns: u64,
    max_periods: u32,
) -> (u32, u32, u64) {
    let period_ns = period_ns.max(1);
    let passed = (late_ns / period_ns).min(u64::from(max_periods)) as u32;
    let periods = (1 + owed + passed).min(max_periods.max(1));
    (periods, passed, now_ns.saturating_sub(late_ns % period_ns))
}

/// The times of a tick's stand-ins: one for each of the `missed` periods
/// the kernel counted without a capture (at most the tick's `periods`),
/// a microsecond apart right after the tick's latest capture at `after`
/// (the thread ran through them, running what it shows; no request may
/// get a moment it was not running in). None without a capture this tick,
/// or without a stack to repeat.
pub(super) fn stand_in_times(
    after: Option<u64>,
    missed: u32,
    periods: u32,
    has_stack: bool,
) -> Vec<u64> {
    match after {
        Some(after) if has_stack => (1..=u64::from(missed.min(periods)))
            .map(|i| after + i * 1_000)
            .collect(),
        _ => Vec::new(),
    }
}

/// Where one tick's samples of running code went.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Placement {
    /// Held fills whose slot a sample of running code took (their
    /// timestamps).
    pub(super) cancelled: Vec<u64>,
    /// The tick's slots no sample took: each gets a fill.
    pub(super) free: Vec<u64>,
    /// Samples of running code that found no free slot near them (their
    /// timestamps).
    pub(super) extra: Vec<u64>,
}

/// Places samples of running code (`running`, in time order) on the free
/// slots: the tick's new `slots` and the slots of `held` fills. Each takes
/// the free slot nearest to it within `half_ns` (the older on a tie).
pub(super) fn place(slots: &[u64], held: &[u64], running: &[u64], half_ns: u64) -> Placement {
    // (slot time, whether it is a held fill), in time order.
    let mut free: Vec<(u64, bool)> = held
        .iter()
        .map(|&t| (t, true))
        .chain(slots.iter().map(|&t| (t, false)))
        .collect();
    free.sort_unstable();
    let mut out = Placement::default();
    for &ts in running {
        let nearest = free
            .iter()
            .enumerate()
            .filter(|(_, (slot, _))| slot.abs_diff(ts) <= half_ns)
            .min_by_key(|(_, (slot, _))| slot.abs_diff(ts))
            .map(|(i, _)| i);
        match nearest {
            Some(i) => {
                let (slot, held) = free.remove(i);
                if held {
                    out.cancelled.push(slot);
                }
            }
            None => out.extra.push(ts),
        }
    }
    out.free = free
        .into_iter()
        .filter(|&(_, held)| !held)
        .map(|(t, _)| t)
        .collect();
    out
}

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

/// One thread's ledger.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    /// Samples waiting to leave, in time order.
    pending: VecDeque<Pending>,
    /// The time up to which the thread is known to have been alive.
    pub(super) alive_ns: u64,
    /// The newest timestamp of the samples that left so far.
    pub(super) emitted_ns: u64,
    /// The slot of the thread's latest tick.
    pub(super) last_slot: Option<u64>,
    /// The thread's latest capture: its time, stack and context word.
    last_capture: Option<(u64, Arc<[u64]>, u64)>,
    /// Samples queued beyond the slots given (at most `MAX_SURPLUS`): held
    /// fills that have a sample of running code close on both sides are
    /// cancelled while there are any.
    surplus: u32,
    /// Samples of running code after the latest slot that took no slot
    /// yet: the next tick's slot may be theirs (a tick runs after its
    /// deadline, and harvests captures taken since).
    carried: Vec<u64>,
    /// What the kernel counted of the thread that its samples do not show
    /// yet (see [`Balance`]).
    balance: Balance,
    /// When the kernel's counts were last read (`CLOCK_REALTIME`, ns): they
    /// cover the fills up to then.
    pub(super) counted_to_ns: u64,
    /// Whether the thread was last found waiting (blocked in the kernel)
    /// when the kernel's counts were last read: the time they cover began
    /// with that wait (see [`Ledger::blocked_first`]).
    pub(super) began_waiting: bool,
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
            && self.pending.iter().any(|p| {
                matches!(p, Pending::Fill { timestamp_ns, .. }
                    if *timestamp_ns > self.counted_to_ns && *timestamp_ns <= self.alive_ns)
            })
    }

    /// The slots of the fills held, oldest first.
    pub(super) fn held_fills(&self) -> Vec<u64> {
        self.pending
            .iter()
            .filter_map(|p| match p {
                Pending::Fill { timestamp_ns, .. } => Some(*timestamp_ns),
                Pending::Sample(_) => None,
            })
            .collect()
    }

    /// Places one tick's samples of running code (already queued) on the
    /// tick's `slots` and the held fills' (see [`place`]), cancels the held
    /// fills whose slot they took, and returns the placement (the free
    /// slots get fills).
    ///
    /// A sample that found no free slot within half a period may then take
    /// a free slot up to a period before it, if the sample of running code
    /// (or the sample already emitted) before that slot is at most two
    /// periods before it: no gap longer than two periods opens, and a busy
    /// thread whose captures drift against the ticks (a CPU-time timer
    /// fires at the kernel's scheduler tick) is not sampled more often than
    /// once per period (`place_late`). Likewise, while the thread has more
    /// samples than slots, held fills go (`cancel_surplus`).
    pub(super) fn place_tick(
        &mut self,
        slots: Vec<u64>,
        running: &[u64],
        half_ns: u64,
        period_ns: u64,
    ) -> Placement {
        let mut all = std::mem::take(&mut self.carried);
        if all.is_empty() && running.is_empty() {
            // Nothing ran (a parked thread, most of the time): every new
            // slot is free, and nothing else changes.
            return Placement {
                free: slots,
                ..Placement::default()
            };
        }
        all.extend_from_slice(running);
        all.sort_unstable();
        let placing = all.len();
        let mut p = place(&slots, &self.held_fills(), &all, half_ns);
        self.cancel(&p.cancelled);
        let extra = self.place_late(&mut p, period_ns);
        // Those after the latest slot wait for the next tick's.
        let latest = self.last_slot.unwrap_or(0);
        let (carried, extra): (Vec<u64>, Vec<u64>) = extra.into_iter().partition(|&t| t > latest);
        self.carried = carried;
        // A sample carried to the next tick counts there, where it takes
        // its slot: counted now, it would make a surplus for a tick and
        // cancel a fill its slot needs.
        let queued = (placing - self.carried.len() + p.free.len()) as i64;
        let given = (slots.len() + p.cancelled.len()) as i64;
        self.surplus = (i64::from(self.surplus) + queued - given).clamp(0, MAX_SURPLUS) as u32;
        self.cancel_surplus(&mut p, period_ns);
        p.extra = extra;
        p
    }

    /// The samples `place` found no slot for (`p.extra`) take a free or
    /// held slot up to a period before them when no gap longer than two
    /// periods opens; returns those that still have none.
    fn place_late(&mut self, p: &mut Placement, period_ns: u64) -> Vec<u64> {
        let mut extra = Vec::new();
        for &ts in &p.extra {
            let held = self.held_fills();
            let Some(slot) = p
                .free
                .iter()
                .chain(&held)
                .copied()
                .filter(|&s| s < ts && ts - s <= period_ns)
                .max()
            else {
                extra.push(ts);
                continue;
            };
            let before = self.running_before(slot).max(self.emitted_ns);
            if ts.saturating_sub(before) > 2 * period_ns {
                extra.push(ts);
                continue;
            }
            if let Some(i) = p.free.iter().position(|&s| s == slot) {
                p.free.remove(i);
            } else {
                self.cancel(&[slot]);
                p.cancelled.push(slot);
            }
        }
        extra
    }

    /// While the thread has more samples than slots (`surplus`: extra
    /// ones, and fills of slots a sample of running code came too late to
    /// take), held fills with a sample of running code at most two periods
    /// away on both sides are cancelled.
    fn cancel_surplus(&mut self, p: &mut Placement, period_ns: u64) {
        if self.surplus == 0 {
            return;
        }
        for f in self.held_fills() {
            if self.surplus == 0 {
                break;
            }
            let before = self.running_before(f).max(self.emitted_ns);
            if self
                .running_after(f)
                .is_some_and(|a| a - before <= 2 * period_ns)
            {
                self.cancel(&[f]);
                p.cancelled.push(f);
                self.surplus -= 1;
            }
        }
    }

    /// The latest queued sample of running code before `t` (0: none).
    /// Those are never cancelled: a gap checked against them and the
    /// samples already emitted stays checked whatever fills are cancelled
    /// later.
    fn running_before(&self, t: u64) -> u64 {
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
    fn running_after(&self, t: u64) -> Option<u64> {
        self.pending
            .iter()
            .filter_map(|p| match p {
                Pending::Sample(s) if s.timestamp_ns() > t => Some(s.timestamp_ns()),
                _ => None,
            })
            .min()
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

    /// Queues a sample of running code in time order. One older than a
    /// sample that already left (a capture harvested a tick late) is moved
    /// just after it: a thread's samples leave in time order.
    /// Returns the time it is queued at.
    pub(super) fn push_sample(&mut self, sample: Sample) -> u64 {
        let sample = if sample.timestamp_ns() <= self.emitted_ns {
            sample.at(self.emitted_ns + 1)
        } else {
            sample
        };
        let ts = sample.timestamp_ns();
        self.alive_ns = self.alive_ns.max(ts);
        self.balance.ran_a_period();
        self.insert(Pending::Sample(sample));
        ts
    }

    /// Queues a fill for the slot `slot` (moved after the samples that
    /// already left, if it is not); `word` is the context word the thread
    /// published then, `at_tick` where it stands.
    pub(super) fn push_fill(&mut self, slot: u64, word: Option<Option<u64>>, at_tick: AtTick) {
        let timestamp_ns = slot.max(self.emitted_ns + 1);
        self.insert(Pending::Fill {
            timestamp_ns,
            word,
            at_tick,
        });
    }

    /// A capture at `ts` of `stack` in the request of `context` (call in
    /// time order, after the tick's fills are queued). Held fills between
    /// the thread's previous capture and this one, if the two are at most
    /// `ran_within_ns` apart (1.5 periods, and a period more for each
    /// period the timer counted without a capture), stand for time it spent
    /// running without a
    /// capture of its own (a CPU-time timer fires at the kernel's scheduler
    /// tick, so a busy thread's captures are 8 or 12 ms apart at 101 Hz,
    /// not 9.9, and some slot lies farther than half a period from both):
    /// they show the nearer capture's stack, filed under the request the
    /// thread published at their moment (see `periods::standing_running`).
    /// Farther apart, the thread also waited or was preempted between them,
    /// and the fills keep where it stood: neither capture's code is known
    /// to have been on its stack then.
    pub(super) fn captured(
        &mut self,
        ts: u64,
        stack: &Arc<[u64]>,
        context: u64,
        ran_within_ns: u64,
    ) {
        if let Some((prev, prev_stack, prev_context)) = &self.last_capture {
            if *prev < ts && ts - prev <= ran_within_ns {
                for p in &mut self.pending {
                    let Pending::Fill {
                        timestamp_ns,
                        word,
                        at_tick,
                    } = p
                    else {
                        continue;
                    };
                    if *timestamp_ns <= *prev || *timestamp_ns >= ts {
                        continue;
                    }
                    let near = if *timestamp_ns - prev <= ts - *timestamp_ns {
                        (prev_stack, *prev_context)
                    } else {
                        (stack, context)
                    };
                    *at_tick = super::periods::standing_running(*word, near);
                }
            }
        }
        if self.last_capture.as_ref().is_none_or(|c| c.0 < ts) {
            self.last_capture = Some((ts, stack.clone(), context));
        }
    }

    /// What the kernel counted for the thread since the previous reading:
    /// `cpu_ns` of CPU time and `run_delay_ns` runnable but waiting for a
    /// CPU. The fills then show those times, at one period per fill:
    ///
    /// - the CPU time its samples of running code (one period each, queued
    ///   since the previous reading) and fills showing its running code do
    ///   not show, as `(running: no stack captured in time)` in fills that
    ///   would show where it waits (a thread that ran in bursts its timer
    ///   did not fire in, and was found waiting at every look);
    /// - the run delay, as `(waiting for a CPU)`, in any fill but one
    ///   already showing that wait.
    ///
    /// Where both are owed, the larger goes first. Neither is owed for
    /// more than the fills held now (and one) can show, so a time shows in
    /// the periods it was counted for, not in later ones.
    ///
    /// `lane_now` is the request the thread stands in now (0 for none). A
    /// run delay is counted when the thread runs again, after the wait: a
    /// thread that waited for a CPU at the end of a request's poll and then
    /// left it (and parked) has its wait counted at a tick that finds it
    /// outside the request. Such a wait belongs to the request the thread
    /// stood in at the reading before (see [`Ledger::drain`]).
    pub(super) fn kernel_counted(
        &mut self,
        cpu_ns: u64,
        run_delay_ns: u64,
        period_ns: u64,
        lane_now: u64,
    ) {
        let held = self
            .pending
            .iter()
            .filter(|p| matches!(p, Pending::Fill { .. }))
            .count() as i64;
        self.balance
            .counted(cpu_ns, run_delay_ns, period_ns, lane_now, held);
    }

    /// The kernel's counts are read for the first time now: the samples
    /// of running code queued so far are not part of what the next count
    /// covers.
    pub(super) fn counting_from_now(&mut self, lane_now: u64) {
        self.balance.counting_from_now(lane_now);
    }

    /// The stack a fill shows once the kernel's counts are settled (see
    /// [`Ledger::kernel_counted`]), and its context: `stack`, which shows
    /// running code if `ran`, or a synthetic frame in its place. A wait the
    /// kernel counted, shown in a fill outside any request (`context` 0),
    /// is filed under the request the thread waited in: never shown as the
    /// stack of a thread parked after it.
    fn settle(
        &mut self,
        stack: Arc<[u64]>,
        mut context: u64,
        ran: bool,
        period_ns: u64,
    ) -> (Arc<[u64]>, u64) {
        let frame = (stack.len() == 1).then(|| stack[0]);
        let waiting = frame == Some(crate::frames::WAITING_FOR_CPU_FRAME);
        let running = ran || frame == Some(crate::frames::UNCAPTURED_FRAME);
        let synthetic = super::periods::synthetic;
        match self
            .balance
            .settle(waiting, running, ran, frame.is_some(), period_ns)
        {
            Settled::AsIs => (stack, context),
            Settled::WaitingForCpu => {
                if context == 0 {
                    context = self.balance.wait_lane();
                }
                (synthetic(crate::frames::WAITING_FOR_CPU_FRAME), context)
            }
            Settled::WaitingUnread => (synthetic(crate::frames::WAITING_UNREAD_FRAME), context),
            Settled::Uncaptured => (synthetic(crate::frames::UNCAPTURED_FRAME), context),
        }
    }

    /// How many of the fills leaving now filed under no request show where
    /// the thread waits before the kernel's counts are settled on the
    /// rest. When the time the counts cover began with the thread found
    /// waiting, and it was found running at its end, it was blocked first,
    /// then ran or waited for a CPU: what it ran and waited for a CPU goes
    /// to the latest of those fills, and the earlier ones show where it
    /// waited. Otherwise (it ran, then blocked) the earliest take it.
    fn blocked_first(&self, view: &DrainView) -> usize {
        if !self.began_waiting || !(view.place.ran || view.ran_last) || view.force {
            return 0;
        }
        let covered_to = self.alive_ns.min(self.counted_to_ns);
        let covered = self
            .pending
            .iter()
            .filter(|p| {
                matches!(p, Pending::Fill { timestamp_ns, at_tick: AtTick::Outside | AtTick::Unknown, .. }
                    if *timestamp_ns <= covered_to)
            })
            .count() as i64;
        let owed = self.balance.owed_periods(view.period_ns);
        (covered - owed).max(0) as usize
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

    /// Forgets the held samples (those after the thread was last known
    /// alive, when it is dropped from sampling).
    pub(super) fn clear(&mut self) {
        self.pending.clear();
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
        let blocked = timestamp_ns > self.alive_ns
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
    /// not known. With more than [`MAX_PENDING`] held, the oldest leaves
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
            self.samples_queued()
        };
        let mut blocked_first = self.blocked_first(view);
        while let Some(front) = self.pending.front() {
            let overfull = self.pending.len() > MAX_PENDING;
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
            let Some(item) = self.pending.pop_front() else {
                break;
            };
            let (timestamp_ns, at_tick) = match item {
                Pending::Sample(sample) => {
                    later_samples = later_samples.saturating_sub(1);
                    let ts = self.stamp(sample.timestamp_ns());
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
            let shown = shown_in_fill(at_tick, place, force);
            let Some((stack, context, ran)) = shown else {
                continue;
            };
            let (stack, context) = if guessed && !stale && blocked_first > 0 {
                // Blocked where it last waited, before it ran.
                blocked_first -= 1;
                (stack, context)
            } else {
                self.settle(stack, context, ran, view.period_ns)
            };
            out(Out::Fill {
                timestamp_ns: self.stamp(timestamp_ns),
                stack,
                context,
            });
        }
    }

    /// How many samples of running code are held.
    fn samples_queued(&self) -> usize {
        self.pending
            .iter()
            .filter(|p| matches!(p, Pending::Sample(_)))
            .count()
    }

    /// The time a sample leaving now at `timestamp_ns` is stamped with:
    /// strictly after what left before (two queued at one moment).
    fn stamp(&mut self, timestamp_ns: u64) -> u64 {
        self.emitted_ns = timestamp_ns.max(self.emitted_ns + 1);
        self.emitted_ns
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

    #[test]
    fn slots_are_one_period_apart_back_from_the_deadline() {
        assert_eq!(slot_times(1, 1_000, Some(900), P), [1_000]);
        // A late tick standing for three periods.
        assert_eq!(slot_times(3, 1_000, Some(700), P), [800, 900, 1_000]);
        // Never a slot the thread already had.
        assert_eq!(slot_times(3, 1_000, Some(850), P), [900, 1_000]);
        // A thread seen for the first time: the tick's own slot only.
        assert_eq!(slot_times(5, 1_000, None, P), [1_000]);
    }

    #[test]
    fn a_tick_stands_for_every_deadline_passed_before_what_it_harvests() {
        // On time, or late by less than a period: its own deadline.
        assert_eq!(tick_span(0, 0, P, 1_000, 101), (1, 0, 1_000));
        assert_eq!(tick_span(0, 90, P, 1_090, 101), (1, 0, 1_000));
        // 250 late: the two deadlines passed since are its slots too, the
        // latest 50 before it runs; with periods owed from before.
        assert_eq!(tick_span(0, 250, P, 1_250, 101), (3, 2, 1_200));
        assert_eq!(tick_span(2, 250, P, 1_250, 101), (5, 2, 1_200));
        // Never more than the most it may stand for.
        assert_eq!(tick_span(100, 5_000, P, 6_000, 101), (101, 50, 6_000));
        // A thread reached 250 into the tick (the sampler thread was
        // preempted), its latest capture taken then: its slots go on to the
        // latest deadline before the capture, and the next ticks do not
        // give those again.
        assert_eq!(
            thread_slots(1, 1_000, Some(900), P, Some(1_250), 100),
            [1_000, 1_100, 1_200]
        );
        assert!(slot_times(1, 1_100, Some(1_200), P).is_empty());
        assert_eq!(slot_times(1, 1_300, Some(1_200), P), [1_300]);
        // A capture within the tick's own period, or none: the tick's slots.
        assert_eq!(
            thread_slots(1, 1_000, Some(900), P, Some(1_050), 100),
            [1_000]
        );
        assert_eq!(thread_slots(1, 1_000, Some(900), P, None, 100), [1_000]);
    }

    #[test]
    fn overruns_stand_in_right_after_a_capture_of_the_same_tick() {
        assert_eq!(stand_in_times(Some(5_000), 2, 3, true), [6_000, 7_000]);
        // At most the tick's periods.
        assert_eq!(stand_in_times(Some(5_000), 50, 1, true), [6_000]);
        // No capture this tick, or no stack to repeat: none.
        assert!(stand_in_times(None, 2, 3, true).is_empty());
        assert!(stand_in_times(Some(5_000), 2, 3, false).is_empty());
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
            let slots = thread_slots(
                periods,
                slot_end,
                l.last_slot,
                p,
                taken.last().copied(),
                100,
            );
            l.last_slot = slots.last().copied().or(l.last_slot);
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
                l.alive_ns = l.alive_ns.max(slot_end - 1);
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

    #[test]
    fn a_capture_takes_the_slot_nearest_to_it() {
        let p = place(&[1_000], &[], &[980], HALF);
        assert_eq!(p, Placement::default());
        // Two slots of a late tick: the capture takes the older one, the
        // other gets a fill.
        let p = place(&[900, 1_000], &[], &[910], HALF);
        assert_eq!(p.free, [1_000]);
        assert!(p.extra.is_empty());
    }

    #[test]
    fn a_capture_far_from_every_free_slot_is_an_extra_sample() {
        // Captured early in the tick's period, the previous slot's fill
        // already left: the tick's slot still gets a fill.
        let p = place(&[1_000], &[], &[930], HALF);
        assert_eq!(
            (p.free.as_slice(), p.extra.as_slice()),
            (&[1_000][..], &[930][..])
        );
        // Two captures around one slot: one takes it.
        let p = place(&[1_000], &[], &[960, 1_040], HALF);
        assert_eq!((p.free.len(), p.extra.as_slice()), (0, &[1_040][..]));
    }

    /// One tick of a thread: its new `slots`, its `captures`; free slots
    /// get fills. Returns the placement.
    fn tick(l: &mut Ledger, slots: &[u64], captures: &[u64]) -> Placement {
        l.last_slot = slots.last().copied().or(l.last_slot);
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
            emitted_ns: 750,
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
        assert!(l.held_fills() == [1_200]);
    }

    #[test]
    fn a_thread_with_more_samples_than_slots_gives_up_fills_between_close_captures() {
        // The slot at 900 is taken by the capture at 890; the one at 940
        // is 60 from the slot at 1_000, which gets a fill.
        let mut l = Ledger {
            last_slot: Some(800),
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
            last_slot: Some(800),
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
            emitted_ns: 670,
            last_slot: Some(770),
            ..Ledger::default()
        };
        l.push_fill(770, None, AtTick::Unknown);
        let p = tick(&mut l, &[870, 970, 1_070], &[821, 1_121]);
        assert!(p.cancelled.is_empty(), "{p:?}");
        assert_eq!(l.held_fills(), [770, 970, 1_070]);
        // The next tick's slot is its own.
        let p = tick(&mut l, &[1_170], &[]);
        assert!(p.free.is_empty() && p.cancelled.is_empty(), "{p:?}");
        assert_eq!(l.held_fills(), [770, 970, 1_070]);
    }

    #[test]
    fn a_capture_harvested_late_cancels_the_held_fill_of_its_own_slot() {
        // The previous tick (slot 900) held a fill; its capture at 905 is
        // harvested now, with another at 990.
        let p = place(&[1_000], &[900], &[905, 990], HALF);
        assert_eq!(p.cancelled, [900]);
        assert!(p.free.is_empty());
        // The measured defect: two captures harvested at one tick cancelled
        // the fill of a slot neither was in (by count), leaving 20 ms
        // without a sample. Here neither is near the held fill at 800.
        let p = place(&[1_000], &[800, 900], &[940, 990], HALF);
        assert_eq!(p.cancelled, [900]);
        assert!(p.extra.is_empty());
        let p = place(&[1_000], &[800], &[960, 990], HALF);
        assert!(p.cancelled.is_empty(), "{p:?}");
        assert_eq!(p.extra, [990]);
    }

    #[test]
    fn every_slot_gets_a_sample_within_half_a_period() {
        // Any captures, any late tick: after placing, every slot either
        // has a sample of running code within half a period or is free
        // (and gets a fill); so samples are never more than two periods
        // apart.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..2_000 {
            let periods = 1 + (next() % 4) as u32;
            let slots = slot_times(periods, 10_000, Some(10_000 - P * 5), P);
            let held: Vec<u64> = if next() % 2 == 0 {
                vec![slots[0] - P]
            } else {
                vec![]
            };
            let mut running: Vec<u64> = (0..next() % 4)
                .map(|_| 10_000 - next() % (u64::from(periods) * P + P))
                .collect();
            running.sort_unstable();
            let p = place(&slots, &held, &running, HALF);
            let mut samples: Vec<u64> = running.clone();
            samples.extend(&p.free);
            samples.extend(held.iter().filter(|h| !p.cancelled.contains(h)));
            samples.sort_unstable();
            for &slot in held.iter().chain(&slots) {
                assert!(
                    samples.iter().any(|&s| s.abs_diff(slot) <= HALF),
                    "slot {slot} has no sample: {slots:?} {held:?} {running:?} {p:?}"
                );
            }
            assert_eq!(
                p.free.len() + running.len() - p.extra.len(),
                slots.len() + p.cancelled.len()
            );
        }
    }

    #[test]
    fn samples_leave_in_time_order() {
        let mut l = Ledger::default();
        l.push_sample(sample(100, 1, 0));
        l.push_fill(50, None, AtTick::In(stack(9), 0));
        l.alive_ns = 100;
        let got = drain(&mut l, &view(known(9, 0)));
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), [50, 100]);
        // A capture harvested a tick late, older than what already left,
        // leaves just after it; so does a fill.
        l.push_sample(sample(90, 2, 0));
        l.push_fill(95, None, AtTick::In(stack(9), 0));
        l.alive_ns = 200;
        let got = drain(&mut l, &view(known(9, 0)));
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), [101, 102]);
    }

    #[test]
    fn a_fill_waits_until_the_thread_is_known_alive_at_its_time() {
        let mut l = Ledger::default();
        l.push_fill(100, None, AtTick::Unknown);
        l.push_fill(200, None, AtTick::Unknown);
        l.alive_ns = 150;
        let got = drain(&mut l, &view(known(9, 4)));
        assert_eq!(got, [(100, 9, 4, true)]);
        // The thread exited: what was held after it was last alive is
        // dropped with it.
        l.clear();
        l.alive_ns = u64::MAX;
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
        l.alive_ns = 1_000;
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
        l.alive_ns = 500;
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
        l.alive_ns = 500;
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
        l.alive_ns = 700;
        l.kernel_counted(0, 100, 100, 0);
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
        l.alive_ns = 1400;
        let got = drain(&mut l, &view(known(9, 0)));
        assert_eq!(got, [(1200, WAITING, 0, true), (1300, 9, 0, true)]);
        // Fills shown waiting for a CPU before the kernel counted it
        // (found runnable and not running) are not shown twice once it
        // does.
        let mut l = Ledger::default();
        for slot in [100, 200] {
            l.push_fill(slot, None, AtTick::InRequest(5));
        }
        l.alive_ns = 300;
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
        l.alive_ns = 200;
        l.kernel_counted(0, 80, 100, 0);
        let got = drain(&mut l, &view(known(9, 0)));
        assert_eq!(got, [(100, WAITING, 5, true)]);
        // The next wait, counted from a reading outside any request, is the
        // thread's own.
        l.push_fill(300, None, AtTick::Outside);
        l.alive_ns = 400;
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
        l.alive_ns = 500;
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
        l.alive_ns = 300;
        l.kernel_counted(100, 0, 100, 0);
        let got = drain(&mut l, &view(known(9, 0)));
        assert_eq!(got, [(100, 1, 0, true), (200, 9, 0, true)]);
        // Owed both, the larger goes first.
        let mut l = Ledger::default();
        for slot in [100, 200, 300] {
            l.push_fill(slot, None, AtTick::Outside);
        }
        l.alive_ns = 400;
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
            l.alive_ns = 500;
            l.counted_to_ns = 500;
            l.kernel_counted(200, 0, 100, 0);
        };
        let mut l = Ledger {
            began_waiting: true,
            ..Ledger::default()
        };
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
        l.alive_ns = 50;
        // Not known alive at the fill yet: nothing to read for.
        assert!(!l.wants_counts(&ran()));
        l.alive_ns = 150;
        assert!(l.wants_counts(&ran()));
        // Where it waits is current: no guess to correct.
        assert!(!l.wants_counts(&known(9, 0)));
        // Counts read after the fill cover it.
        l.counted_to_ns = 120;
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
        l.alive_ns = 1_000;
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
        l.alive_ns = 1_000;
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
            let mut l = Ledger {
                began_waiting: true,
                ..Ledger::default()
            };
            l.counting_from_now(0);
            l.push_fill(100, None, AtTick::Outside);
            l.push_sample(sample(200, 1, 0));
            l.captured(200, &stack(1), 0, 150);
            for slot in [300, 400, 500] {
                l.push_fill(slot, None, AtTick::Outside);
            }
            l.alive_ns = 600;
            l.counted_to_ns = 600;
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
        l.alive_ns = 600;
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
