//! What a tick learns of a thread and how it leaves the sampler: the
//! answers a capture slot or a read from `/proc` gives, the bookkeeping of
//! a signal awaited, and emitting a thread's samples in time order. Shared
//! by the tick's loop (`worker`) and its ways of asking (`capture`), and
//! importing neither.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Sample;
use super::consumer::Consumer;
use super::ledger;
use super::state::Awaited;
use super::stats::Counters;
use super::threads::Tracked;
use crate::sys;

/// How long a signalled thread may take to run the handler before the
/// sampler stops waiting for it (a thread that blocks the signal, or is
/// starved of CPU).
pub(super) const ABANDON_AFTER: Duration = Duration::from_millis(500);

/// Most periods between two questions to a thread about where it waits,
/// while its answers stay the same.
pub(super) const MAX_ASK_EVERY: u64 = 128;

/// CPU time after which the timer of a thread found in a request with no
/// capture yet fires (see [`Services::nudge`]).
pub(super) const NUDGE_AFTER: Duration = Duration::from_micros(500);

/// CPU time beyond one period that a thread may run after its latest
/// capture before the sampler takes the capture its timer owes (see
/// [`Services::catch_stalled_timer`]): one tick of a 250 Hz kernel (the
/// longest the expired timer of a thread that keeps its CPU waits to be
/// fired) and a millisecond of margin. A kernel with fewer ticks (100 Hz)
/// has some timers caught that it would have fired late: one capture
/// still stands for each period.
///
/// [`Services::catch_stalled_timer`]: super::services::Services::catch_stalled_timer
pub(super) const STALLED_TIMER_SLACK_NS: u64 = 5_000_000;

/// The smallest share of the wall time a thread must have spent on a CPU
/// since its latest capture (one in this many nanoseconds) for its timer
/// to count as stalled. A thread that mostly waits gains a period of CPU
/// time slowly, over many short runs, and a signal sent while it runs
/// could reach it blocked a moment later and interrupt its system call;
/// one that keeps a CPU busy, or waits only for a core, is not blocked.
pub(super) const STALLED_TIMER_MIN_SHARE: u64 = 8;

/// CPU time a thread may gain between samples and still count as idle.
///
/// The thread's clock is read at the tick that signals it, so the signal
/// delivery, the handler and the return from it (a few microseconds) are
/// counted against the next tick. Without this margin a parked thread would
/// look busy at every tick because it was sampled at the previous one. A
/// timer wake-up that goes straight back to sleep stays below it too: such
/// a thread is back where its last stack was taken. 50 µs is 0.5 % of a
/// 101 Hz period.
pub(super) const IDLE_CPU_SLACK_NS: u64 = 50_000;

/// What a harvested capture was.
pub(super) enum Harvested {
    /// Nothing new in the slot.
    Nothing,
    /// A sample of running code (a timer capture, or a capture of a thread
    /// without a timer), not emitted yet: the thread's held fills go first.
    Running(Sample),
    /// Two of them (both slots were full), the older first.
    Running2(Sample, Sample),
    /// The answer to a request for the thread's parked stack.
    Parked,
    /// A capture spent learning the thread's stack bounds.
    Discarded,
}

impl Harvested {
    /// The samples of running code it holds, oldest first.
    pub(super) fn running(self) -> impl Iterator<Item = Sample> {
        let (a, b) = match self {
            Self::Running(a) => (Some(a), None),
            Self::Running2(a, b) => (Some(a), Some(b)),
            _ => (None, None),
        };
        a.into_iter().chain(b)
    }

    /// The time of the latest sample of running code it holds.
    pub(super) fn latest_ns(&self) -> Option<u64> {
        match self {
            Self::Running(a) => Some(a.timestamp_ns()),
            Self::Running2(a, b) => Some(a.timestamp_ns().max(b.timestamp_ns())),
            _ => None,
        }
    }
}

/// Why a thread's held samples are let go (see [`flush`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flush {
    /// A tick looked at the thread and did not find it running.
    Looked,
    /// A tick found that it ran (a capture, or its CPU clock moved), and
    /// read the kernel's counts of it then.
    Ran,
    /// It leaves the ledger's hands (it exited, or the sampler pauses or
    /// stops): fills also leave while where it stands is not known.
    Leaving,
}

/// Lets `t`'s held samples leave while they may (see `Ledger::drain`).
/// `period_ns` is the sampling period.
pub(super) fn flush(
    out: &mut dyn Consumer,
    c: &Counters,
    t: &mut Tracked,
    why: Flush,
    period_ns: u64,
) {
    let_go(out, c, t, why, period_ns, |t| t.read_schedstat(period_ns));
}

/// [`flush`], with the kernel's counts read by `read_counts` when the
/// ledger needs them first.
pub(super) fn let_go(
    out: &mut dyn Consumer,
    c: &Counters,
    t: &mut Tracked,
    why: Flush,
    period_ns: u64,
    read_counts: impl FnOnce(&mut Tracked),
) {
    let place = t.place.fill_place();
    if t.ledger.wants_counts(&place) {
        read_counts(t);
    }
    let view = ledger::DrainView {
        place,
        asking: t.asking.asks_where(),
        force: why == Flush::Leaving,
        ran_last: why == Flush::Ran,
        period_ns,
    };
    let (tid, name, start) = (t.info.tid, &t.name, t.info.start_time);
    let word_slot = t.word_slot;
    t.ledger.drain(&view, |left| match left {
        ledger::Out::Sample(sample) => emit(out, c, sample),
        ledger::Out::Fill {
            timestamp_ns,
            stack,
            context,
        } => {
            c.samples_idle.add(1);
            if *stack == [crate::frames::WAITING_FOR_CPU_FRAME]
                && crate::attribution::is_lane(context)
            {
                let own = word_slot.is_some_and(|slot| {
                    crate::context::own_poll_at(slot, tid, timestamp_ns, context)
                });
                out.cpu_waited(context, own, period_ns);
            }
            let sample = Sample::new(timestamp_ns, tid, name.clone(), stack, context, true)
                .with_thread_start(start);
            emit(out, c, sample);
        }
    });
}

/// Emits one sample of thread `t`.
pub(super) fn emit_for(
    out: &mut dyn Consumer,
    c: &Counters,
    t: &Tracked,
    timestamp_ns: u64,
    stack: Arc<[u64]>,
    context: u64,
    repeated: bool,
) {
    emit(out, c, sample_of(t, timestamp_ns, stack, context, repeated));
}

/// A sample of thread `t`.
pub(super) fn sample_of(
    t: &Tracked,
    timestamp_ns: u64,
    stack: Arc<[u64]>,
    context: u64,
    repeated: bool,
) -> Sample {
    Sample::new(
        timestamp_ns,
        t.info.tid,
        t.name.clone(),
        stack,
        context,
        repeated,
    )
    .with_thread_start(t.info.start_time)
}

pub(super) fn emit(out: &mut dyn Consumer, c: &Counters, sample: Sample) {
    if out.take(sample) {
        c.samples_emitted.add(1);
    } else {
        c.dropped_queue_full.add(1);
    }
}

/// What [`Services::look_blocked`] found.
pub(super) enum Look {
    /// Blocked in the kernel: the stack it waits in, and its context word.
    Waiting(Arc<[u64]>, u64),
    /// Running or runnable (or it woke up while being read).
    Running,
    /// Exited.
    Gone,
}

/// Records where `t` waits, just read from here while it was blocked there
/// (so verified), at the tick of period `tick_no` that ran at `ts`.
pub(super) fn learned_waiting(
    t: &mut Tracked,
    (tick_no, ts): (u64, u64),
    stack: Arc<[u64]>,
    context: u64,
) {
    // A thread that blocks is not one whose timer the kernel keeps missing.
    t.timer_caught_up();
    let answer = t.place.found_waiting(stack, context, true, ts);
    t.schedule.answered(answer, tick_no, MAX_ASK_EVERY);
}

/// Whether a signal sent to `t` is still awaited at `now` (see
/// [`state::Asking::check`]), counting a tick it keeps waiting and a
/// signal given up on.
pub(super) fn awaited(t: &mut Tracked, now: Instant, c: &Counters) -> Awaited {
    let awaited = t.asking.check(now, ABANDON_AFTER);
    match awaited {
        Awaited::Pending => c.samples_late.add(1),
        Awaited::GaveUp => c.signals_abandoned.add(1),
        Awaited::Nothing => {}
    }
    awaited
}

/// Sends thread `t` a signal asking for its stack; `as_sample` when the
/// capture is a sample of its own rather than the thread's parked stack.
/// Returns the `errno` of a send that failed other than for a thread gone.
pub(super) fn request(t: &mut Tracked, as_sample: bool, now: Instant, c: &Counters) -> Option<i32> {
    let slot = t.capture_slot?;
    match sys::send_sample_signal(t.info.tid, slot) {
        Ok(()) => {
            c.signals_sent.add(1);
            t.asking.sent(now, as_sample);
            None
        }
        Err(sys::SendError::ThreadGone) => {
            t.gone = true;
            None
        }
        Err(e) => {
            c.dropped_signal_failed.add(1);
            match e {
                sys::SendError::Os(errno) => Some(errno),
                _ => None,
            }
        }
    }
}
