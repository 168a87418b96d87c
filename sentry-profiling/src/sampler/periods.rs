//! The per-thread period accounting's decisions, as pure functions: what a
//! tick's captures cover, when its fills stand, and which request a fill
//! belongs to. `Worker::tick_thread` gathers the inputs (slots, clocks, the
//! context table) and applies the results; everything here is decided from
//! its arguments alone, so the unit tests below pin every case down.

use std::sync::Arc;

use super::threads::AtTick;

/// Most captures beyond a tick's periods that are owed to later ticks.
///
/// None: a later period that an owed capture paid for got no sample, and
/// Sentry, which weights a sample by the time to the next one of its
/// thread, charged that period to the sample before it (measured: OS-thread
/// samples carrying 24 to 31 ms while the thread ran requests, and request
/// lanes showing those periods as suspended). A capture beyond the tick's
/// periods that finds no held fill near it to cancel is an extra sample.
pub(super) const MAX_SURPLUS: u32 = 0;

/// What one tick's captures cover of the `periods` it stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Covered {
    /// Periods recorded with the latest capture's stack right after it
    /// (the kernel's overruns, or periods that found both slots full).
    pub(super) stand_ins: u32,
    /// Fills held from earlier ticks that captures beyond this tick's
    /// periods cancel, newest first.
    pub(super) cancel_fills: u32,
    /// New fills: periods without a capture, after what earlier ticks
    /// owed was paid.
    pub(super) new_fills: u32,
    /// Periods without a capture that captures owed by earlier ticks paid
    /// for (the oldest of them).
    pub(super) paid: u32,
    /// Captures owed to later ticks after this one.
    pub(super) surplus: u32,
}

/// Accounts one tick: `running` captures harvested, `missed` periods the
/// handler counted without a capture, whether the thread has a latest stack
/// (stand-ins repeat it), `held_fills` fills still queued, and the
/// `surplus` owed from earlier ticks.
pub(super) fn cover(
    periods: u32,
    running: u32,
    missed: u32,
    has_stack: bool,
    held_fills: u32,
    surplus: u32,
) -> Covered {
    // Without a capture of its own this tick, what the thread ran is not
    // known well enough to repeat it.
    let stand_ins = if has_stack && running > 0 {
        missed.min(periods + MAX_SURPLUS)
    } else {
        0
    };
    let covered = running + stand_ins;
    if covered > periods {
        let beyond = covered - periods;
        let cancel_fills = beyond.min(held_fills);
        let owed = surplus + (beyond - cancel_fills);
        let surplus = if owed > MAX_SURPLUS {
            MAX_SURPLUS
        } else {
            owed
        };
        Covered {
            stand_ins,
            cancel_fills,
            new_fills: 0,
            paid: 0,
            surplus,
        }
    } else {
        let uncovered = periods - covered;
        let paid = uncovered.min(surplus);
        Covered {
            stand_ins,
            cancel_fills: 0,
            new_fills: uncovered - paid,
            paid,
            surplus: surplus - paid,
        }
    }
}

/// Timestamps of `n` fills of a thread looked at `now`, whose samples of
/// running code in the same stretch are at `taken`: the stretch's periods
/// (the fills' and the taken samples') lie one period apart back from
/// `now`, or, where that would reach back to `since` (when the thread was
/// looked at before; a late or slow tick) or beyond, evenly over
/// `(since, now]`, the time they stand for. Each taken sample occupies the
/// period nearest to it, and the fills get the others, so a thread's
/// samples stay about a period apart: Sentry weights a sample by the time to
/// the next one, and two samples close together leave a gap elsewhere that
/// the sample before it would carry.
pub(super) fn fill_times(
    n: u32,
    now: u64,
    since: Option<u64>,
    period_ns: u64,
    taken: &[u64],
) -> Vec<u64> {
    if n == 0 {
        return Vec::new();
    }
    let total = u64::from(n) + taken.len() as u64;
    let back = (total - 1).saturating_mul(period_ns);
    let step = match since {
        Some(since) if since < now && now.saturating_sub(back) <= since => {
            ((now - since) / total).max(1)
        }
        _ => period_ns,
    };
    let mut slots: Vec<u64> = (0..total)
        .map(|i| now.saturating_sub((total - 1 - i).saturating_mul(step)))
        .collect();
    for &t in taken {
        if slots.len() <= n as usize {
            break;
        }
        // The free period nearest to the taken sample.
        if let Some(i) = (0..slots.len()).min_by_key(|&i| slots[i].abs_diff(t)) {
            slots.remove(i);
        }
    }
    slots
}

/// What the sampler knows of a thread when it decides where a fill stands.
#[derive(Debug, Default)]
pub(super) struct Known<'a> {
    /// Where it waits, if read while blocked (and not since found running
    /// elsewhere), with the context word it published then.
    pub(super) waiting: Option<(&'a Arc<[u64]>, u64)>,
    /// Its latest capture, with the context word captured with it.
    pub(super) last: Option<(&'a Arc<[u64]>, u64)>,
}

/// Where a fill stands, from the context word the thread published at the
/// fill's moment (`None`: the thread publishes none; `Some(None)`: it does,
/// but the word at that moment is no longer known) and `request_stack`, the
/// latest stack captured in that request on any thread.
pub(super) fn standing(
    word: Option<Option<u64>>,
    known: &Known<'_>,
    request_stack: impl FnOnce(u64) -> Option<Arc<[u64]>>,
) -> AtTick {
    let context = match word {
        None => return AtTick::Unknown,
        Some(None | Some(0)) => return AtTick::Outside,
        Some(Some(context)) => context,
    };
    match (known.waiting, known.last) {
        // Blocked inside the request, where it was read waiting.
        (Some((stack, c)), _) if c == context => AtTick::In(stack.clone(), context),
        (_, Some((stack, c))) if c == context => AtTick::In(stack.clone(), context),
        _ => match request_stack(context) {
            Some(stack) => AtTick::In(stack, context),
            // No capture in the request yet (it just began): looked up
            // again when the fill is recorded.
            None => AtTick::InRequest(context),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covered(stand_ins: u32, cancel_fills: u32, new_fills: u32, surplus: u32) -> Covered {
        Covered {
            stand_ins,
            cancel_fills,
            new_fills,
            paid: 0,
            surplus,
        }
    }

    #[test]
    fn one_capture_covers_its_period() {
        assert_eq!(cover(1, 1, 0, true, 0, 0), covered(0, 0, 0, 0));
    }

    #[test]
    fn a_period_without_capture_is_a_fill() {
        assert_eq!(cover(1, 0, 0, true, 0, 0), covered(0, 0, 1, 0));
        // A late tick: one fill per period it stands for.
        assert_eq!(cover(4, 1, 0, true, 0, 0), covered(0, 0, 3, 0));
    }

    #[test]
    fn overruns_become_stand_ins_only_after_a_capture() {
        assert_eq!(cover(3, 1, 2, true, 0, 0), covered(2, 0, 0, 0));
        // No capture this tick: the missed count is not repeated.
        assert_eq!(cover(3, 0, 2, true, 0, 0), covered(0, 0, 3, 0));
        // No stack to repeat.
        assert_eq!(cover(3, 1, 2, false, 0, 0), covered(0, 0, 2, 0));
        // At most the tick's periods and what may be owed.
        assert_eq!(cover(1, 1, 50, true, 0, 0).stand_ins, 1 + MAX_SURPLUS);
    }

    #[test]
    fn captures_beyond_the_periods_cancel_held_fills_and_are_not_owed() {
        // Two captures in one period: one held fill cancelled.
        assert_eq!(cover(1, 2, 0, true, 1, 0), covered(0, 1, 0, 0));
        // None held: both recorded, nothing owed to the next tick (its
        // period would get no sample, and Sentry would charge it to the
        // sample before).
        assert_eq!(cover(1, 2, 0, true, 0, 0), covered(0, 0, 0, MAX_SURPLUS));
        // Stand-ins at most the tick's periods (and what may be owed).
        assert_eq!(
            cover(1, 2, 3, true, 0, 2),
            covered(1 + MAX_SURPLUS, 0, 0, MAX_SURPLUS)
        );
    }

    #[test]
    fn owed_captures_pay_for_later_periods() {
        let c = cover(1, 0, 0, true, 0, 1);
        assert_eq!((c.new_fills, c.paid, c.surplus), (0, 1, 0));
        let c = cover(3, 0, 0, true, 0, 2);
        assert_eq!((c.new_fills, c.paid, c.surplus), (1, 2, 0));
    }

    #[test]
    fn fill_times_step_back_by_periods() {
        let t = fill_times(3, 1_000, None, 100, &[]);
        assert_eq!(t, [800, 900, 1_000]);
        // Looked at long enough ago: still a period apart.
        let t = fill_times(3, 1_000, Some(500), 100, &[]);
        assert_eq!(t, [800, 900, 1_000]);
        assert!(fill_times(0, 1_000, None, 100, &[990]).is_empty());
    }

    #[test]
    fn fill_times_never_reach_back_before_the_previous_look() {
        // A slow tick: the previous look was 150 ns ago, 3 fills.
        let t = fill_times(3, 1_000, Some(850), 100, &[]);
        assert_eq!(t, [900, 950, 1_000]);
        assert!(t.iter().all(|&x| x > 850));
    }

    #[test]
    fn fills_take_the_periods_a_capture_left_free() {
        // A late tick standing for two periods since the look at 800: one
        // capture at 990, one fill. The fill goes to the older period, not
        // next to the capture (which would leave 800..990 to one sample).
        let t = fill_times(1, 1_000, Some(800), 100, &[990]);
        assert_eq!(t, [900]);
        // A capture early in the stretch: the fill takes the tick.
        let t = fill_times(1, 1_000, Some(800), 100, &[880]);
        assert_eq!(t, [1_000]);
        // Three periods, captures at both ends: the fill in the middle.
        let t = fill_times(1, 1_000, Some(700), 100, &[790, 995]);
        assert_eq!(t, [900]);
    }

    #[test]
    fn a_fill_stands_in_the_request_published_at_its_moment() {
        let waiting: Arc<[u64]> = Arc::from(&[1u64, 2][..]);
        let last: Arc<[u64]> = Arc::from(&[3u64, 4][..]);
        let other: Arc<[u64]> = Arc::from(&[5u64][..]);
        let known = Known {
            waiting: Some((&waiting, 7)),
            last: Some((&last, 8)),
        };
        let none = |_| None;
        let is_in = |a: &AtTick, stack: &Arc<[u64]>, context: u64| matches!(a, AtTick::In(s, c) if s == stack && *c == context);
        // Publishes nothing; publishes 0; history lost.
        assert!(matches!(standing(None, &known, none), AtTick::Unknown));
        assert!(matches!(
            standing(Some(Some(0)), &known, none),
            AtTick::Outside
        ));
        assert!(matches!(
            standing(Some(None), &known, none),
            AtTick::Outside
        ));
        // Blocked inside request 7; last captured in request 8.
        assert!(is_in(&standing(Some(Some(7)), &known, none), &waiting, 7));
        assert!(is_in(&standing(Some(Some(8)), &known, none), &last, 8));
        // Request 9: its latest stack from another thread, or none yet.
        let from_other = |c| (c == 9).then(|| other.clone());
        assert!(is_in(
            &standing(Some(Some(9)), &known, from_other),
            &other,
            9
        ));
        assert!(matches!(
            standing(Some(Some(9)), &known, none),
            AtTick::InRequest(9)
        ));
        // Nothing known of the thread at all.
        let nothing = Known::default();
        assert!(matches!(
            standing(Some(Some(7)), &nothing, none),
            AtTick::InRequest(7)
        ));
    }
}
