//! Threads that live between two listings of the thread list: sampled by
//! the process-wide CPU-time timer (see `sys::ProcessTimer`), filed under
//! a few shared profile threads per thread name.
//!
//! The process timer interrupts whichever thread runs when a period of the
//! process's CPU time ends, so a thread is caught in proportion to the CPU
//! time it uses, however short its life; the handler does nothing on a
//! thread the sampler samples with its own timer, and writes a capture of
//! any other into a spare slot, with the thread's name. Each such capture
//! stands for one period of the process timer (more with the kernel's
//! overruns): the sampling period, or 10 ms when that is shorter (see
//! [`MIN_PROCESS_PERIOD`]).
//!
//! Such a thread has one sample, or a few, before it exits, and Sentry
//! drops a thread with a single sample (and weights a sample by the time
//! to the next sample of its thread). So its captures are filed under a
//! profile thread shared by the short-lived threads of its name
//! (`"{name} (short-lived threads)"`, ids from [`SHORT_LIVED_BASE`]), one
//! per capture that overlaps another: each such profile thread is a
//! timeline of CPU periods that do not overlap, as many as ran at once.
//! A capture of `n` periods is drawn from its moment over `n` periods: two
//! samples of its stack half that span apart, then a closing sample with
//! an empty stack at its end (Sentry counts no time for an empty stack),
//! so Sentry weights it by exactly the CPU time it stands for, and the
//! profile thread has the two samples Relay requires. A capture taken
//! inside a request (its thread's context word names a lane, the
//! thread-spawning helpers of `sentry-profiling-tracing` set it) goes
//! to the request's lane with its two samples; the lane's own samples
//! close it.
//!
//! The closing sample leaves once its moment has passed (samples never
//! leave ahead of the time they stand for), at a later tick, or when the
//! sampler pauses or stops.

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Sample;
use super::answers::emit;
use super::services::Services;
use super::stats::Counters;
use crate::attribution::SHORT_LIVED_BASE;
use crate::sys;

/// Spare slots for the process timer's captures. A capture waits in its
/// slot until the next tick (a period at most, or until the doze it ends):
/// with two cores, up to about two periods of process CPU time pass
/// meanwhile, so a handful of slots leave room for bursts.
const SPARES: usize = 8;

/// Most shared profile threads per name; captures beyond that overlap on
/// the one free soonest.
const MAX_LANES_PER_NAME: usize = 64;

/// How long the process timer stays armed after the latest sign that
/// threads come and go: a new thread in the listing, or a capture of a
/// thread that was never listed. Long, so that a service that starts a
/// few threads now and then keeps them sampled; the listing sees some of
/// them alive at least once a minute, or the timer catches one.
const ARMED_FOR: Duration = Duration::from_secs(60);

/// The process timer's shortest period. Its signal reaches the threads
/// that have timers of their own too (which do nothing with it), so a
/// period that followed a high sampling rate would cost those threads
/// more with the rate for nothing; and a period shorter than the kernel's
/// scheduler tick (4 ms at 250 Hz) mostly comes as overruns of the next
/// tick's signal anyway. A capture stands for the process timer's
/// periods, so a longer one only makes the short-lived threads' samples
/// coarser.
const MIN_PROCESS_PERIOD: Duration = Duration::from_millis(10);

/// The process timer's period for the sampling period `period`.
fn process_period(period: Duration) -> Duration {
    period.max(MIN_PROCESS_PERIOD)
}

/// How long the shared profile threads of a name are kept after their
/// latest capture once many names have some: a chunk's length, so a name
/// that comes back within a chunk keeps its ids, and a service that names
/// every thread differently (`worker-1234`) does not grow the table
/// without bound.
const KEEP_NAMES_NS: u64 = 60_000_000_000;
/// Names kept without pruning.
const NAMES_KEPT: usize = 64;

/// One shared profile thread: its id, and when its latest capture's span
/// ends.
#[derive(Debug)]
struct Lane {
    id: u32,
    free_at: u64,
}

/// A capture drawn over its span, waiting until its closing moment has
/// passed.
#[derive(Debug)]
struct Drawn {
    lane: u32,
    name: Arc<str>,
    at: u64,
    span: u64,
    stack: Arc<[u64]>,
    context: u64,
}

/// A capture read from a spare slot.
#[derive(Debug)]
struct Harvest {
    at: u64,
    span: u64,
    name: Arc<str>,
    stack: Arc<[u64]>,
    context: u64,
}

/// The process timer, and the profile threads its captures are filed
/// under.
#[derive(Debug, Default)]
pub(super) struct ShortLived {
    timer: Option<sys::ProcessTimer>,
    armed: bool,
    /// Shared profile threads by thread name.
    lanes: HashMap<Arc<str>, (Arc<str>, Vec<Lane>)>,
    next_id: u32,
    /// Captures harvested at this tick, sorted by time before filing.
    harvested: Vec<Harvest>,
    /// Drawn captures whose span has not ended yet.
    drawn: Vec<Drawn>,
    /// When the latest sign of threads coming and going was seen.
    appeared_at: Option<Instant>,
    /// Process-timer counts already added to the counters.
    known_seen: u64,
    full_seen: u64,
    empty: Option<Arc<[u64]>>,
}

impl ShortLived {
    /// Creates the spare slots and the process timer (disarmed), when
    /// threads get CPU-time timers (`cpu_timers`); nothing otherwise, or
    /// when the kernel refuses.
    pub(super) fn new(cpu_timers: bool, stack_copy_bytes: usize, c: &Counters) -> Self {
        let mut this = Self {
            next_id: SHORT_LIVED_BASE,
            ..Self::default()
        };
        if !cpu_timers || sys::ensure_spares(SPARES, stack_copy_bytes) == 0 {
            return this;
        }
        (this.known_seen, this.full_seen) = sys::process_timer_counts();
        if let Ok(timer) = sys::ProcessTimer::create() {
            c.short_lived_timer.add(1);
            this.timer = Some(timer);
        }
        this
    }

    /// The process has threads the listing had not seen before, or a
    /// capture of one came in, at `now`: the process timer is armed until
    /// [`ARMED_FOR`] after the latest such sign (see [`ShortLived::tend`]).
    pub(super) fn threads_appeared(&mut self, now: Instant) {
        self.appeared_at = Some(now);
    }

    /// Whether the process timer exists (threads not listed yet are
    /// sampled).
    pub(super) fn available(&self) -> bool {
        self.timer.is_some()
    }

    /// Arms the process timer with the sampling period while threads come
    /// and go (a sign of it within [`ARMED_FOR`]), and disarms it when they
    /// no longer do: a service whose threads all live long pays nothing
    /// for it once they were listed.
    pub(super) fn tend(&mut self, period: Duration, now: Instant) {
        let churning = self
            .appeared_at
            .is_some_and(|at| now.saturating_duration_since(at) < ARMED_FOR);
        if !churning {
            self.disarm();
            return;
        }
        if let Some(timer) = &self.timer {
            if !self.armed {
                // A refusal leaves it disarmed: short-lived threads are then
                // found by the listing only, as before.
                self.armed = timer.set(process_period(period)).is_ok();
            }
        }
    }

    /// Disarms the process timer (the sampler pauses or stops).
    pub(super) fn disarm(&mut self) {
        if let Some(timer) = &self.timer {
            if self.armed && timer.set(Duration::ZERO).is_err() {
                self.timer = None;
            }
        }
        self.armed = false;
    }

    /// Reads the spare slots, files their captures and lets go of the
    /// drawn captures whose span ended by `now_ns` (all of them with
    /// `all`). Returns whether any capture was read.
    pub(super) fn harvest(
        &mut self,
        services: &mut Services,
        c: &Counters,
        now_ns: u64,
        all: bool,
    ) -> bool {
        let (known, full) = sys::process_timer_counts();
        c.short_lived_known_hits
            .add(known.saturating_sub(self.known_seen));
        c.short_lived_missed
            .add(full.saturating_sub(self.full_seen));
        (self.known_seen, self.full_seen) = (known, full);
        let period_ns = process_period(services.period).as_nanos() as u64;
        for slot in sys::spare_slots() {
            let Some(filled) = slot.filled() else {
                continue;
            };
            let cap = *filled.captured();
            if cap.flags & sys::FLAG_OFF_STACK != 0 {
                services.frames.clear();
                services.frames.push(cap.regs.pc);
                c.samples_off_stack.add(1);
            } else {
                let start = Instant::now();
                services
                    .unwinder
                    .unwind(&cap.regs, filled.stack(), &mut services.frames);
                c.unwind_ns.add(start.elapsed().as_nanos() as u64);
            }
            let name: Arc<str> = Arc::from(cap.thread_name());
            filled.rearm(0, 0);
            c.handler_ns.add(cap.handler_ns);
            c.samples_captured.add(1);
            c.short_lived_captures.add(1);
            c.short_lived_overruns
                .add(u64::from(cap.periods.saturating_sub(1)));
            let stack: Arc<[u64]> = Arc::from(&services.frames[..]);
            self.harvested.push(Harvest {
                at: cap.timestamp_ns,
                span: period_ns.saturating_mul(u64::from(cap.periods.max(1))),
                name,
                stack,
                context: cap.context,
            });
        }
        let any = !self.harvested.is_empty();
        if any {
            self.appeared_at = Some(Instant::now());
        }
        if self.lanes.len() > NAMES_KEPT {
            let since = now_ns.saturating_sub(KEEP_NAMES_NS);
            self.lanes
                .retain(|_, (_, lanes)| lanes.iter().any(|l| l.free_at >= since));
        }
        self.file();
        self.release(services, c, now_ns, all);
        any
    }

    /// Takes the single sample of a tracked thread that exited (see
    /// `closing`), to be filed with the next captures: it stands for one
    /// period.
    pub(super) fn refile(&mut self, sample: Sample, period_ns: u64) {
        self.harvested.push(Harvest {
            at: sample.timestamp_ns(),
            span: period_ns,
            name: sample.thread_name().clone(),
            stack: sample.frames().clone(),
            context: sample.context(),
        });
    }

    /// Files this tick's captures, in time order, under the shared profile
    /// thread of their name that is free at their moment (a new one when
    /// none is, up to [`MAX_LANES_PER_NAME`]).
    fn file(&mut self) {
        self.harvested.sort_by_key(|h| h.at);
        for h in self.harvested.drain(..) {
            let next_id = &mut self.next_id;
            let (shown, lanes) = self.lanes.entry(h.name.clone()).or_insert_with(|| {
                (
                    Arc::from(format!("{} (short-lived threads)", h.name)),
                    Vec::new(),
                )
            });
            let lane = match lanes.iter_mut().position(|l| l.free_at <= h.at) {
                Some(i) => &mut lanes[i],
                None if lanes.len() < MAX_LANES_PER_NAME => {
                    lanes.push(Lane {
                        id: *next_id,
                        free_at: 0,
                    });
                    *next_id = next_id.saturating_add(1);
                    let last = lanes.len() - 1;
                    &mut lanes[last]
                }
                None => {
                    let soonest = (0..lanes.len())
                        .min_by_key(|&i| lanes[i].free_at)
                        .unwrap_or(0);
                    &mut lanes[soonest]
                }
            };
            // Overlapping only when every lane of the name is taken: then
            // it starts where the soonest ends, so the lane stays in time
            // order.
            let at = h.at.max(lane.free_at);
            lane.free_at = at.saturating_add(h.span);
            self.drawn.push(Drawn {
                lane: lane.id,
                name: shown.clone(),
                at,
                span: h.span,
                stack: h.stack,
                context: h.context,
            });
        }
    }

    /// Lets go of the drawn captures whose span ended by `now_ns` (every
    /// one with `all`), each as its samples (see the module docs).
    fn release(&mut self, services: &mut Services, c: &Counters, now_ns: u64, all: bool) {
        if self.drawn.is_empty() {
            return;
        }
        let period_ns = services.period.as_nanos() as u64;
        let empty = self
            .empty
            .get_or_insert_with(|| Arc::from(Vec::new()))
            .clone();
        let out = &mut services.out;
        self.drawn.retain(|d| {
            let end = d.at.saturating_add(d.span);
            if !all && end > now_ns {
                return true;
            }
            let sample = |at: u64, stack: Arc<[u64]>, context: u64| {
                Sample::new(at, d.lane as i32, d.name.clone(), stack, context, false)
            };
            emit(out, c, sample(d.at, d.stack.clone(), d.context));
            if crate::attribution::is_lane(d.context) {
                // In a request's lane, the lane's own samples bound it; the
                // second sample stays within the period the capture was
                // taken in, so it never lands past the request's end.
                emit(
                    out,
                    c,
                    sample(d.at + period_ns / 2, d.stack.clone(), d.context),
                );
            } else {
                emit(
                    out,
                    c,
                    sample(d.at + d.span / 2, d.stack.clone(), d.context),
                );
                emit(out, c, sample(end, empty.clone(), 0));
            }
            false
        });
    }
}
