//! The sampler thread: its loop (ticks on the period grid, pausing, dozing
//! while the application is idle, and lightly between captures while no
//! thread is in a request), and each tick's work on every tracked
//! thread: the step that decides it (`step`) run with [`ThreadAt`], which
//! makes its system calls (harvesting timer captures, reading CPU clocks
//! and `/proc`, signalling, unwinding) and hands the samples that leave,
//! in time order, to its [`Consumer`], which it also runs after each tick,
//! before a doze and while paused.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::answers::{Flush, Harvested, Look, awaited, flush};
use super::closing::Closing;
use super::consumer::Consumer;
use super::denied::Denials;
use super::requests::CapturedRequests;
use super::services::Services;
use super::short_lived::ShortLived;
use super::slots;
use super::state::Awaited;
use super::stats::Counters;
use super::step::{self, MAX_CATCH_UP};
use super::threads::{StackMaps, ThreadTable, Tracked};
use super::{Shared, own_threads};
use crate::options::SamplerConfig;
use crate::sys;
use crate::unwind::StackUnwinder;

/// Application CPU per sampling period (the process's, less the sampler
/// thread's) below which a tick counts as idle: 0.5 % of a core.
const IDLE_APP_CPU_NS_PER_PERIOD: u64 = 50_000;
/// Idle ticks in a row after which the sampler dozes.
const IDLE_TICKS_BEFORE_DOZING: u32 = 3;
/// How many periods a doze lasts at most (about half a second at 101 Hz).
/// Any capture (a thread that ran a period of CPU time fires its timer)
/// ends it at once; the next tick then stands for the periods slept
/// through, as a late tick does, so every period of every thread still gets
/// its sample. A wake-up costs more than the samples of a tick, so the
/// longer the doze, the less an idle process pays (figures: BENCHMARKS §1,
/// "The profiler thread's wake-ups").
const DOZE_PERIODS: u32 = 48;
/// How many periods a light doze lasts at most (see
/// [`Worker::light_doze_periods`]): while the application runs now and then
/// (requests come at a few hundred a second or fewer) but no thread is in a
/// request at the tick, the sampler sleeps up to this many periods, and any
/// capture wakes it at once. A wake-up (a timed `futex` wait) costs the
/// sampler thread more than the work of most ticks (figures: BENCHMARKS
/// §1, "The sampler's light doze").
const LIGHT_DOZE_PERIODS: u32 = 4;
/// Most context-word changes a thread may make during a light doze, at the
/// rate it changed its word since the tick before: the periods slept
/// through keep every word it published (its history holds
/// `context::HISTORY_KEPT`, a quarter of it left for bursts), which the
/// fills of those periods and the lanes' poll edges are read from
/// afterwards. A doze is as long as that allows, up to
/// [`LIGHT_DOZE_PERIODS`]; none is shorter than two periods.
const LIGHT_DOZE_MAX_CHANGES: u64 = crate::context::HISTORY_KEPT * 3 / 4;

/// The sampler thread's state: the threads it samples, the services a
/// thread's tick uses, and the loop's own bookkeeping.
pub(super) struct Worker {
    pub(super) threads: ThreadTable,
    pub(super) services: Services,
    pub(super) shared: Arc<Shared>,
    /// Sampling periods elapsed so far (ticks run, and ticks missed that a
    /// later tick recorded); thread checks are scheduled in these.
    pub(super) tick_no: u64,
    /// Periods missed since the last tick, whose samples it records.
    pub(super) owed: u32,
    /// Idle ticks in a row (see [`IDLE_APP_CPU_NS_PER_PERIOD`]).
    pub(super) idle_ticks: u32,
    /// The application's CPU time at the last tick that read it (`None`:
    /// not read at the last tick, see [`Worker::note_idle`]).
    pub(super) app_cpu_ns: Option<u64>,
    /// Whether this tick harvested a timer capture: an application thread
    /// ran a period of CPU time.
    pub(super) captured: bool,
    /// Whether this tick found a thread that ran inside a request since the
    /// tick before (without a capture): it may be about to block there, and
    /// the sampler does not doze before it has looked at it again.
    pub(super) request_ran: bool,
    /// How many periods the light doze after the last tick may last (0:
    /// none; see [`Worker::light_doze_periods`]).
    pub(super) light_doze: u32,
    /// The sampler thread's CPU time at the end of its last tick (`None`
    /// after a pause): a tick's cost counts from there, its wake-up
    /// included.
    pub(super) cpu_mark: Option<u64>,
    /// The process-wide timer that samples threads not listed yet, and
    /// where their captures are filed.
    pub(super) short_lived: ShortLived,
}

/// `CLOCK_REALTIME` (as samples are stamped) and the monotonic clock (as
/// deadlines are kept) read at one moment: a pair read without being
/// preempted in between (a few tries), so a deadline converts to the time
/// samples are stamped in without the preemption's error.
fn clocks_now() -> (u64, Instant) {
    let mut best = None;
    for _ in 0..3 {
        let before = sys::realtime_ns();
        let now = Instant::now();
        let after = sys::realtime_ns();
        let spread = after.saturating_sub(before);
        let pair = (before + spread / 2, now);
        if spread < 20_000 {
            return pair;
        }
        if best.is_none_or(|(s, _)| spread < s) {
            best = Some((spread, pair));
        }
    }
    best.map_or_else(|| (sys::realtime_ns(), Instant::now()), |(_, pair)| pair)
}

impl Worker {
    pub(super) fn new(config: SamplerConfig, out: Box<dyn Consumer>, shared: Arc<Shared>) -> Self {
        let unwinder = StackUnwinder::new(Arc::clone(&shared.modules));
        let period = Duration::from_secs_f64(1.0 / f64::from(config.frequency_hz));
        let period_ns = period.as_nanos() as u64;
        let short_lived = ShortLived::new(
            config.cpu_timers && config.short_lived_threads,
            config.stack_copy_bytes,
            &shared.counters,
        );
        let mut threads = ThreadTable::default();
        threads.leave_young(short_lived.available());
        Self {
            threads,
            services: Services {
                period,
                unwinder,
                frames: Vec::with_capacity(crate::unwind::MAX_FRAMES),
                copy_buf: Vec::new(),
                maps: StackMaps::default(),
                requests: CapturedRequests::default(),
                denied: Denials::new(config.cpu_timers),
                config,
                out: Closing::new(out, period_ns),
            },
            tick_no: 0,
            owed: 0,
            idle_ticks: 0,
            app_cpu_ns: None,
            captured: false,
            request_ran: false,
            light_doze: 0,
            cpu_mark: None,
            short_lived,
            shared,
        }
    }

    pub(super) fn run(&mut self) {
        let mut deadline = Instant::now();
        while !self.shared.stop.load(Ordering::Acquire) {
            if !self.shared.active.load(Ordering::Acquire) {
                self.pause();
                deadline = Instant::now();
                continue;
            }
            let cpu_before = self.cpu_mark.unwrap_or_else(sys::own_cpu_time_ns);
            // Read before the tick: a capture completed during it, after its
            // thread was harvested, ends a doze that follows at once.
            let seen = sys::completion_seq();
            let (periods, passed) = self.tick(deadline);
            if self.services.out.ticked() {
                // A request began, or a thread entered or left one, since
                // the tick before, perhaps after this tick looked at its
                // thread: look at it again before dozing.
                self.request_ran = true;
            }
            let cpu_after = sys::own_cpu_time_ns();
            self.cpu_mark = Some(cpu_after);
            let c = &self.shared.counters;
            c.tick_cpu_ns.add(cpu_after.saturating_sub(cpu_before));
            deadline += self.services.period * (1 + passed);
            let idle = self.note_idle(periods, cpu_after);
            if (idle || self.light_doze > 1) && self.doze(idle, seen, &mut deadline) {
                continue;
            }
            self.wait_until(&mut deadline);
        }
        self.settle();
        self.services.out.stopped();
        self.threads.release_all();
    }

    /// Paused: stops the timers, finishes what is in flight, then sleeps
    /// until resumed (or stopped).
    fn pause(&mut self) {
        self.settle();
        self.owed = 0;
        self.cpu_mark = None;
        self.services.out.paused();
        while !self.shared.active.load(Ordering::Acquire)
            && !self.shared.stop.load(Ordering::Acquire)
        {
            // `resume`, `wake` and `stop` unpark this thread: the timeout
            // only bounds an idle process's wake-ups.
            std::thread::park_timeout(Duration::from_secs(2));
            self.services.out.paused();
        }
    }

    /// Dozes after a tick: nothing of the application ran for a few ticks
    /// (`idle`: every thread waits), or nothing that needs a look every
    /// period (see `light_doze_periods`). Sleeps until a thread runs a
    /// period of CPU time (its timer's capture, completed after `seen`,
    /// wakes this thread) or the doze ends. The tick after it stands for
    /// every period slept through, so no thread loses a sample; it only
    /// costs fewer wake-ups. Returns whether that tick is due now
    /// (`deadline` moved to it, its periods owed).
    fn doze(&mut self, idle: bool, seen: u32, deadline: &mut Instant) -> bool {
        let doze = if idle { DOZE_PERIODS } else { self.light_doze };
        let until = *deadline + self.services.period * (doze - 1);
        let now = Instant::now();
        if until > now && !self.shared.stop.load(Ordering::Acquire) {
            if idle {
                if !self.services.out.dozing() {
                    // A thread entered or left a request meanwhile.
                    return false;
                }
            } else {
                self.shared.counters.light_dozes.add(1);
            }
            sys::wait_completion(seen, until - now);
            if idle {
                self.services.out.woke();
            }
        }
        let now = Instant::now();
        // Periods past the doze's end are late, as for a tick that overran:
        // the thread was not given a core in time.
        let late = now.saturating_duration_since(until).as_nanos()
            / self.services.period.as_nanos().max(1);
        self.shared.counters.ticks_skipped.add(late as u64);
        if now < *deadline {
            return false;
        }
        let passed = (now.duration_since(*deadline).as_nanos()
            / self.services.period.as_nanos().max(1)) as u32;
        *deadline += self.services.period * passed;
        self.owed = (self.owed + passed).min(MAX_CATCH_UP);
        true
    }

    /// Sleeps until the next tick's `deadline`. A tick that overran (or a
    /// thread not given a core in time) skips the ticks missed instead of
    /// bursting to catch up: they are counted, and the next tick records
    /// their samples.
    fn wait_until(&mut self, deadline: &mut Instant) {
        let now = Instant::now();
        if *deadline <= now {
            let behind = now.duration_since(*deadline);
            let missed = (behind.as_nanos() / self.services.period.as_nanos().max(1)) as u64 + 1;
            self.shared.counters.ticks_skipped.add(missed);
            *deadline += self.services.period * missed as u32;
            self.owed = (self.owed + missed as u32).min(MAX_CATCH_UP);
        }
        while !self.shared.stop.load(Ordering::Acquire) {
            let now = Instant::now();
            if now >= *deadline {
                break;
            }
            std::thread::park_timeout(*deadline - now);
        }
    }

    /// Records whether the tick that stood for `periods` periods was idle
    /// (the application used less than [`IDLE_APP_CPU_NS_PER_PERIOD`] per
    /// period since the tick before); returns whether the sampler should
    /// doze.
    ///
    /// The application's CPU time is the process's less this thread's
    /// (`own_cpu_ns`, read at the end of the tick). The profiler's other
    /// threads count as the application: while this thread ticks they wake
    /// every 100 ms at most (it reads the lanes), and while it dozes they
    /// do little, so they do not keep it awake; reading their clocks too
    /// cost three system calls a tick. A tick that harvested a timer
    /// capture was not idle (a thread ran a whole period of CPU time), nor
    /// one that found a thread in a request that ran since the tick before
    /// (it may block there next: a doze begins only once it was looked at
    /// again): no clock is read then. The next tick that reads them counts
    /// as busy, having nothing to compare with.
    fn note_idle(&mut self, periods: u32, own_cpu_ns: u64) -> bool {
        let request_ran = std::mem::take(&mut self.request_ran);
        if std::mem::take(&mut self.captured) || request_ran {
            self.app_cpu_ns = None;
            self.idle_ticks = 0;
            return false;
        }
        let app = sys::process_cpu_time_ns().saturating_sub(own_cpu_ns);
        let used = self
            .app_cpu_ns
            .map_or(u64::MAX, |before| app.saturating_sub(before));
        self.app_cpu_ns = Some(app);
        if used < u64::from(periods) * IDLE_APP_CPU_NS_PER_PERIOD {
            self.idle_ticks = self.idle_ticks.saturating_add(1);
        } else {
            self.idle_ticks = 0;
        }
        self.idle_ticks >= IDLE_TICKS_BEFORE_DOZING
    }

    /// How many periods the sampler may sleep through after the tick that
    /// stood for `periods`, woken at once by any capture (0 or 1: none).
    /// None when this tick harvested a capture (a thread ran a period of
    /// CPU time), when a thread has no CPU-time timer of its own (only a
    /// timer's capture wakes the sampler), or when a thread is inside a
    /// request now (a worker that blocks in a request's poll is looked at
    /// every period). Otherwise up to [`LIGHT_DOZE_PERIODS`], fewer for a
    /// thread that changes its context word often (see
    /// [`LIGHT_DOZE_MAX_CHANGES`]).
    fn light_doze_periods(&mut self, periods: u32) -> u32 {
        let mut doze = if self.captured { 0 } else { LIGHT_DOZE_PERIODS };
        let periods = u64::from(periods.max(1));
        for t in self.threads.iter_mut() {
            if t.gone {
                continue;
            }
            if t.timer.is_none() {
                doze = 0;
            }
            let Some(slot) = t.word_slot else {
                continue;
            };
            let Some((word, changes)) = crate::context::word_and_changes(slot, t.info.tid) else {
                continue;
            };
            // Changes per period since the tick before, rounded up.
            let rate = changes.saturating_sub(t.changes_seen).div_ceil(periods);
            t.changes_seen = changes;
            if crate::attribution::is_lane(word) {
                doze = 0;
            } else if let Some(most) = LIGHT_DOZE_MAX_CHANGES.checked_div(rate) {
                // (No change at all allows the longest doze.)
                doze = doze.min(most.min(u64::from(LIGHT_DOZE_PERIODS)) as u32);
            }
        }
        doze
    }

    /// One tick, due at `deadline`; returns how many periods it stood for,
    /// and how many whole periods after `deadline` it ran (the deadlines
    /// it stood for too).
    fn tick(&mut self, deadline: Instant) -> (u32, u32) {
        let shared = Arc::clone(&self.shared);
        let c = &shared.counters;
        c.ticks.add(1);
        let (ts, now) = clocks_now();
        // The slots are the deadlines, one period apart, however late the
        // tick runs, up to the latest passed (see `slots::tick_span`).
        let (periods, passed, slot_end) = slots::tick_span(
            std::mem::take(&mut self.owed),
            now.saturating_duration_since(deadline).as_nanos() as u64,
            self.services.period.as_nanos() as u64,
            ts,
            MAX_CATCH_UP + 1,
        );
        c.ticks_skipped.add(u64::from(passed));
        self.tick_no += u64::from(periods);
        let tick = step::TickAt {
            tick_no: self.tick_no,
            periods,
            period_ns: self.services.period.as_nanos() as u64,
            ts,
            slot_end,
            now,
        };
        // The module list is read again before this tick's first unwind,
        // if it has one (most ticks of a lightly loaded service do not).
        self.services.unwinder.new_tick();
        let listed = self.threads.listed();
        let seen = self.threads.found(c);
        self.threads.refresh_word_slots(c, &mut self.services.maps);
        for t in self.threads.iter_mut() {
            let mut thread = ThreadAt {
                t,
                services: &mut self.services,
                c,
                tick_no: tick.tick_no,
            };
            let done = step::tick(&mut thread, &tick);
            self.captured |= done.captured;
            self.request_ran |= done.request_ran;
        }
        // Threads not listed yet: their captures, and those of threads
        // that exited before any listing, come from the process timer.
        // Armed while threads come and go, once every thread of the first
        // listing was given its own timer (above), so none of them is
        // taken for a short-lived one; and here rather than when the
        // sampler starts, so that it never runs while paused.
        if listed {
            self.short_lived.tend(self.services.period, now);
        }
        self.captured |= self.short_lived.harvest(&mut self.services, c, ts, false);
        self.light_doze = self.light_doze_periods(periods);
        // After the captures: those were taken by the threads the table
        // still names, even if the listing now finds an id reused since.
        // A thread that exited (or whose id a new one took) leaves the
        // ledger's hands: its held fills (up to when it was last known
        // alive) leave with what is known, as when the sampler pauses: a
        // runtime shut down right after a request would otherwise lose
        // that request's last periods, those it spent blocked included.
        // Its samples are closed then (see `closing`); a single one is
        // filed on the shared timeline of its name's short-lived threads.
        // The captures its timer took before it exited are read first: a
        // thread that ends between two ticks would otherwise lose them
        // with its slots.
        let services = &mut self.services;
        let short_lived = &mut self.short_lived;
        let tick_no = self.tick_no;
        let period_ns = services.period.as_nanos() as u64;
        let mut leaving = |t: &mut super::threads::Tracked| {
            if t.capture_slot.is_some() {
                for sample in services.harvest(t, tick_no, c).running() {
                    t.ledger.push_sample(sample);
                }
            }
            flush(&mut services.out, c, t, Flush::Leaving, period_ns);
            let alive_ns = t.ledger.known_alive_ns();
            if let Some(single) = services.out.left(t.info.tid, t.info.start_time, alive_ns) {
                short_lived.refile(single, period_ns);
            }
        };
        if self
            .threads
            .refresh_due(self.idle_ticks >= IDLE_TICKS_BEFORE_DOZING)
        {
            self.threads.refresh(&own_threads(), c, &mut leaving);
        }
        self.threads.remove_gone(leaving);
        // New threads after the first listing (or added as they entered a
        // request): the process starts threads, some of which may live
        // between two listings.
        if listed && self.threads.found(c) != seen {
            self.short_lived.threads_appeared(now);
        }
        (periods, passed)
    }
}

/// One thread of the worker's table as `step` sees it, with the services
/// that make its system calls and send its samples on.
struct ThreadAt<'a> {
    t: &'a mut Tracked,
    services: &'a mut Services,
    c: &'a Counters,
    /// The tick's period number.
    tick_no: u64,
}

impl ThreadAt<'_> {
    fn period_ns(&self) -> u64 {
        self.services.period.as_nanos() as u64
    }
}

impl step::Kernel for ThreadAt<'_> {
    fn thread(&mut self) -> &mut Tracked {
        self.t
    }

    fn bind(&mut self) -> bool {
        self.services.bind(self.t, self.c)
    }

    fn has_timer(&mut self) -> bool {
        self.t.timer.is_some()
    }

    fn harvest(&mut self) -> Harvested {
        self.services.harvest(self.t, self.tick_no, self.c)
    }

    fn untimed(&mut self, tick: &step::TickAt) {
        self.services.untimed(self.t, tick.ts, tick.now, self.c);
    }

    fn nudge(&mut self) {
        self.services.nudge(self.t, self.c);
    }

    fn missed_timer_periods(&mut self) -> u32 {
        let missed = self.t.capture_slot.map_or(0, |s| s.take_missed());
        self.c.samples_timer_missed.add(u64::from(missed));
        missed
    }

    fn awaited(&mut self, now: Instant) -> Awaited {
        awaited(self.t, now, self.c)
    }

    fn context_now(&mut self) -> u64 {
        let t = &self.t;
        t.word_slot
            .map_or(0, |s| crate::context::read_for(s, t.info.tid))
    }

    fn word_at(&mut self, ts: u64) -> Option<Option<u64>> {
        let t = &self.t;
        t.word_slot
            .map(|s| crate::context::word_at(s, t.info.tid, ts))
    }

    fn cpu_ns(&mut self) -> Option<u64> {
        sys::thread_cpu_time_ns(self.t.info.tid)
    }

    fn blocked_at(&mut self) -> Option<(u64, u64)> {
        let t = &mut self.t;
        blocked_at(t.syscall_file.read_syscall(t.info.tid))
    }

    fn look(&mut self) -> Look {
        self.services.look_blocked(self.t, self.c)
    }

    fn timer_overdue(&mut self, cpu: u64, ts: u64) -> bool {
        self.services.timer_overdue(self.t, cpu, ts)
    }

    fn catch_stalled_timer(&mut self, now: Instant) {
        self.services.catch_stalled_timer(self.t, now, self.c);
    }

    fn read_counts(&mut self) {
        let period_ns = self.period_ns();
        self.t.read_schedstat(period_ns);
    }

    fn flush(&mut self, why: Flush) {
        let period_ns = self.period_ns();
        flush(&mut self.services.out, self.c, self.t, why, period_ns);
    }

    fn recycled(&mut self) {
        self.t.reset_identity();
        self.c.threads_recycled.add(1);
    }
}

/// The stack pointer and program counter of a thread the kernel shows
/// blocked in a system call.
pub(super) fn blocked_at(state: Option<sys::SyscallState>) -> Option<(u64, u64)> {
    match state? {
        sys::SyscallState::Blocked { sp, pc, .. } => Some((sp, pc)),
        sys::SyscallState::Running => None,
    }
}
