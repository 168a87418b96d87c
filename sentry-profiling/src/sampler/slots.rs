//! Placement: which of a thread's period slots its samples take, and where
//! the fills of the others stand.
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
//! Fills between two captures close together stand for time the thread ran
//! through without a capture of its own: they show the nearer capture's
//! stack ([`Slots::captured`]).
//!
//! Everything here is decided from its arguments and the held queue (no
//! clock, no system call).

use std::sync::Arc;

use super::held::Held;

/// Most samples beyond one per slot a thread's ledger remembers, to cancel
/// held fills for.
const MAX_SURPLUS: i64 = 4;

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

/// One thread's placement state (see the module doc).
#[derive(Debug, Default)]
pub(super) struct Slots {
    /// The slot of the thread's latest tick.
    last_slot: Option<u64>,
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
}

impl Slots {
    /// Placement whose latest slot was `last_slot` (for the tests, which
    /// start a story there).
    #[cfg(test)]
    pub(super) fn after(last_slot: u64) -> Self {
        Self {
            last_slot: Some(last_slot),
            ..Self::default()
        }
    }

    /// The thread's slots at a tick (see [`thread_slots`]), which become
    /// its latest.
    pub(super) fn of_tick(
        &mut self,
        periods: u32,
        slot_end: u64,
        period_ns: u64,
        latest_ns: Option<u64>,
        max_extra: u32,
    ) -> Vec<u64> {
        let slots = thread_slots(
            periods,
            slot_end,
            self.last_slot,
            period_ns,
            latest_ns,
            max_extra,
        );
        if let Some(&last) = slots.last() {
            self.last_slot = Some(last);
        }
        slots
    }

    /// Places one tick's samples of running code (already queued in
    /// `held`) on the tick's `slots` and the held fills' (see [`place`]),
    /// cancels the held fills whose slot they took, and returns the
    /// placement (the free slots get fills).
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
        held: &mut Held,
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
        let mut p = place(&slots, &held.fills(), &all, half_ns);
        held.cancel(&p.cancelled);
        let extra = Self::place_late(held, &mut p, period_ns);
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
        self.cancel_surplus(held, &mut p, period_ns);
        p.extra = extra;
        p
    }

    /// The samples `place` found no slot for (`p.extra`) take a free or
    /// held slot up to a period before them when no gap longer than two
    /// periods opens; returns those that still have none.
    fn place_late(held: &mut Held, p: &mut Placement, period_ns: u64) -> Vec<u64> {
        let mut extra = Vec::new();
        for &ts in &p.extra {
            let fills = held.fills();
            let Some(slot) = p
                .free
                .iter()
                .chain(&fills)
                .copied()
                .filter(|&s| s < ts && ts - s <= period_ns)
                .max()
            else {
                extra.push(ts);
                continue;
            };
            let before = held.running_before(slot).max(held.emitted_ns());
            if ts.saturating_sub(before) > 2 * period_ns {
                extra.push(ts);
                continue;
            }
            if let Some(i) = p.free.iter().position(|&s| s == slot) {
                p.free.remove(i);
            } else {
                held.cancel(&[slot]);
                p.cancelled.push(slot);
            }
        }
        extra
    }

    /// While the thread has more samples than slots (`surplus`: extra
    /// ones, and fills of slots a sample of running code came too late to
    /// take), held fills with a sample of running code at most two periods
    /// away on both sides are cancelled.
    fn cancel_surplus(&mut self, held: &mut Held, p: &mut Placement, period_ns: u64) {
        if self.surplus == 0 {
            return;
        }
        for f in held.fills() {
            if self.surplus == 0 {
                break;
            }
            let before = held.running_before(f).max(held.emitted_ns());
            if held
                .running_after(f)
                .is_some_and(|a| a - before <= 2 * period_ns)
            {
                held.cancel(&[f]);
                p.cancelled.push(f);
                self.surplus -= 1;
            }
        }
    }

    /// A capture at `ts` of `stack` in the request of `context` (call in
    /// time order, after the tick's fills are queued). Held fills between
    /// the thread's previous capture and this one, if the two are at most
    /// `ran_within_ns` apart (1.5 periods, and a period more for each
    /// period the timer counted without a capture), stand for time it spent
    /// running without a capture of its own (a CPU-time timer fires at the
    /// kernel's scheduler tick, so a busy thread's captures are 8 or 12 ms
    /// apart at 101 Hz, not 9.9, and some slot lies farther than half a
    /// period from both): they show the nearer capture's stack, filed under
    /// the request the thread published at their moment (see
    /// `periods::standing_running`). Farther apart, the thread also waited
    /// or was preempted between them, and the fills keep where it stood:
    /// neither capture's code is known to have been on its stack then.
    pub(super) fn captured(
        &mut self,
        held: &mut Held,
        ts: u64,
        stack: &Arc<[u64]>,
        context: u64,
        ran_within_ns: u64,
    ) {
        if let Some((prev, prev_stack, prev_context)) = &self.last_capture {
            if *prev < ts && ts - prev <= ran_within_ns {
                for (timestamp_ns, word, at_tick) in held.fills_between(*prev, ts) {
                    let near = if timestamp_ns - prev <= ts - timestamp_ns {
                        (prev_stack, *prev_context)
                    } else {
                        (stack, context)
                    };
                    *at_tick = super::periods::standing_running(word, near);
                }
            }
        }
        if self.last_capture.as_ref().is_none_or(|c| c.0 < ts) {
            self.last_capture = Some((ts, stack.clone(), context));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 100;
    const HALF: u64 = P / 2;

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
        let mut s = Slots::after(900);
        assert_eq!(
            s.of_tick(1, 1_000, P, Some(1_250), 100),
            [1_000, 1_100, 1_200]
        );
        assert!(s.of_tick(1, 1_100, P, None, 100).is_empty());
        assert_eq!(s.of_tick(1, 1_300, P, None, 100), [1_300]);
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
}
