//! One thread's part of a tick: its captures harvested and placed on its
//! period slots, the free slots filled, and, for a thread that ran no timer
//! period, whether its CPU clock is read, whether the kernel is asked where
//! it is, what it is then taken to be doing, and when its held samples
//! leave. Every decision is made here, from the thread's state (`state`,
//! `ledger`, `periods`) and what the kernel shows; the system calls and the
//! samples' way out are behind [`Kernel`], so the order of the decisions is
//! tested as a thread's story, tick by tick, without a kernel (see the
//! tests).
//!
//! The rules, in order:
//!
//! 1. A thread without a capture slot is skipped (counted). One without a
//!    CPU-time timer lets go what it held and is sampled the untimed way
//!    (`Services::untimed`).
//! 2. Its captures (and stand-ins for periods the kernel counted without
//!    one, where its counts are not read) take their period slots, and
//!    every slot left free gets a fill. A thread that ran a timer period is
//!    then done: what it held leaves with the kernel's counts. Its first
//!    capture since it was found waiting marks that wait left: no later
//!    fill shows it until it is found there again.
//! 3. A thread whose signal's answer is awaited is left alone (its capture
//!    decides); one given up on lets go what it held.
//! 4. Its clock is read when due (every tick after it ran, less often the
//!    longer it stays off the CPU), and at every tick while it is inside a
//!    request: a worker idle for seconds that takes a request and blocks in
//!    it must be found blocked there, not assumed to wait where it used to.
//! 5. Its clock gone: it exited. Gone back: the id names another thread;
//!    what the old one held leaves.
//! 6. It ran less than a period (no timer period filled): the kernel's
//!    counts are read and what it held leaves; it is asked where it is now
//!    and then (every `PROBE_EVERY` periods), at every tick while it is in a
//!    request, and when its timer is overdue (then, found running, the
//!    capture the timer owes is taken).
//! 7. It stayed off the CPU: a place it was found waiting in is confirmed
//!    by one read of a kept file (blocked at the same stack pointer and
//!    instruction) while its answers stay the same; otherwise it is asked:
//!    blocked (and where), or runnable without a core (preempted).
//! 8. Its held samples leave as far as what is known allows, and its next
//!    clock read is scheduled.

use std::sync::Arc;
use std::time::Instant;

use super::answers::{Flush, Harvested, IDLE_CPU_SLACK_NS, Look, learned_waiting, sample_of};
use super::state::{self, Awaited, Clock};
use super::threads::Tracked;
use super::{periods, slots};

/// Most sampling periods between two reads of a parked thread's CPU clock.
pub(super) const MAX_CHECK_EVERY: u64 = 16;

/// Most missed periods one tick records samples for.
pub(super) const MAX_CATCH_UP: u32 = 100;

/// Sampling periods between two looks at whether a thread that keeps
/// running now and then is waiting, to learn where it waits (about 100 ms
/// at 101 Hz).
pub(super) const PROBE_EVERY: u64 = 10;

/// What the step asks of the system about one thread, and does to it. The
/// sampler's implementation makes the system calls; the tests' plays a
/// script.
pub(super) trait Kernel {
    /// The thread's state.
    fn thread(&mut self) -> &mut Tracked;
    /// Gives it a capture slot and a timer, and arms the timer, if not done
    /// yet; false if it has no slot (counted).
    fn bind(&mut self) -> bool;
    /// Whether it has a CPU-time timer.
    fn has_timer(&mut self) -> bool;
    /// Its captures since the last tick, from its slots (re-armed).
    fn harvest(&mut self) -> Harvested;
    /// Samples it the way a thread without a timer is.
    fn untimed(&mut self, tick: &TickAt);
    /// Brings its timer forward if it is in a request of which no stack was
    /// captured yet.
    fn nudge(&mut self);
    /// How many times its timer fired while its slot was still full since
    /// the last tick (counted).
    fn missed_timer_periods(&mut self) -> u32;
    /// Whether a signal sent to it is still awaited at `now` (see
    /// `state::Asking::check`).
    fn awaited(&mut self, now: Instant) -> Awaited;
    /// The context word it publishes now (0 without a word slot).
    fn context_now(&mut self) -> u64;
    /// The context word it had published at `ts` (`None`: it has no word
    /// slot; `Some(None)`: not known that far back).
    fn word_at(&mut self, ts: u64) -> Option<Option<u64>>;
    /// Its CPU clock (`None`: it exited).
    fn cpu_ns(&mut self) -> Option<u64>;
    /// The stack pointer and program counter the kernel shows it blocked
    /// at in a system call (`None`: running, or not readable), from one
    /// read of a kept file.
    fn blocked_at(&mut self) -> Option<(u64, u64)>;
    /// Where it is: blocked in the kernel (its stack unwound), running, or
    /// gone.
    fn look(&mut self) -> Look;
    /// Whether its timer is overdue, seen running (its clock at `cpu`) with
    /// no capture at the tick at `ts`.
    fn timer_overdue(&mut self, cpu: u64, ts: u64) -> bool;
    /// Takes the capture its stalled timer owes.
    fn catch_stalled_timer(&mut self, now: Instant);
    /// Reads the kernel's counts of it (CPU time, run delay) into its
    /// ledger.
    fn read_counts(&mut self);
    /// Lets its held samples leave while they may.
    fn flush(&mut self, why: Flush);
    /// Its id now names another thread: it starts afresh.
    fn recycled(&mut self);
}

/// The tick the step is part of.
#[derive(Debug, Clone, Copy)]
pub(super) struct TickAt {
    /// Sampling periods elapsed so far.
    pub(super) tick_no: u64,
    /// Sampling periods it stands for (more than one when the sampler
    /// thread could not run on time), and the period.
    pub(super) periods: u32,
    pub(super) period_ns: u64,
    /// When it ran (`CLOCK_REALTIME`, as samples are stamped), and the
    /// latest of its period slots.
    pub(super) ts: u64,
    pub(super) slot_end: u64,
    pub(super) now: Instant,
}

/// What a thread's tick found that the sampler's loop goes on with.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Done {
    /// It ran a timer period (an application thread ran).
    pub(super) captured: bool,
    /// It ran inside a request since the tick before without a capture: it
    /// may be about to block there, and the sampler does not doze before it
    /// looked at it again.
    pub(super) request_ran: bool,
}

/// The thread `k` is about, at `tick` (see the module's doc).
pub(super) fn tick(k: &mut impl Kernel, tick: &TickAt) -> Done {
    if k.thread().gone || !k.bind() {
        return Done::default();
    }
    let harvested = k.harvest();
    if !k.has_timer() {
        let t = k.thread();
        for sample in harvested.running() {
            t.ledger.push_sample(sample);
        }
        // Whatever was held when the thread lost its timer goes first.
        t.ledger.alive_at(u64::MAX);
        k.flush(Flush::Looked);
        k.untimed(tick);
        return Done::default();
    }
    k.nudge();
    if record_periods(k, harvested, tick) {
        return Done {
            captured: true,
            request_ran: false,
        };
    }
    Done {
        captured: false,
        request_ran: after_captures(k, tick),
    }
}

/// Rule 2: the thread's samples of running code (this tick's captures,
/// and stand-ins for periods the kernel counted without one where its
/// counts are not read) take their period slots in its ledger, and every
/// slot left free gets a fill (see `ledger`). Returns whether it ran a
/// timer period: then what it held until its capture leaves, and it is
/// done for this tick.
fn record_periods(k: &mut impl Kernel, harvested: Harvested, tick: &TickAt) -> bool {
    let period_ns = tick.period_ns;
    let missed = k.missed_timer_periods();
    let t = k.thread();
    let slots = t.ledger.slots_of_tick(
        tick.periods,
        tick.slot_end,
        period_ns,
        harvested.latest_ns(),
        MAX_CATCH_UP,
    );
    // This tick's samples of running code: the captures (with their
    // stacks, which the fills among them show), then stand-ins.
    let captures = t.push_captures(harvested);
    let mut running: Vec<u64> = captures.iter().map(|&(ts, _, _)| ts).collect();
    t.push_stand_ins(&mut running, missed, tick.periods);
    let placed = t
        .ledger
        .place_tick(slots, &running, period_ns / 2, period_ns);
    fill_free_slots(k, placed.free);
    let t = k.thread();
    // Two captures at most this far apart have the thread running through
    // the time between them (the timer counted that much CPU time in it,
    // to half a period): the fills between show the nearer capture (see
    // `Ledger::captured`).
    let ran_within_ns = period_ns * 3 / 2 + u64::from(missed) * period_ns;
    for (ts, stack, context) in &captures {
        t.ledger.captured(*ts, stack, *context, ran_within_ns);
    }
    if running.is_empty() {
        return false;
    }
    t.timer_caught_up();
    if let Some(&(first, ..)) = captures.first() {
        t.place.captured_running(first);
    }
    // Alive and running: what was held until the capture leaves with what
    // was known until then, and what the kernel counted since the previous
    // reading.
    k.read_counts();
    k.flush(Flush::Ran);
    let t = k.thread();
    t.place.ran();
    t.schedule.ran(tick.tick_no);
    true
}

/// Rules 3 to 8, for a thread that ran no timer period. Returns whether it
/// ran inside a request since the tick before without a capture.
pub(super) fn after_captures(k: &mut impl Kernel, tick: &TickAt) -> bool {
    match k.awaited(tick.now) {
        Awaited::Pending => return false,
        Awaited::GaveUp => k.flush(Flush::Looked),
        Awaited::Nothing => {}
    }
    let in_request = crate::attribution::is_lane(k.context_now());
    if !in_request && !k.thread().schedule.check_due(tick.tick_no) {
        return false;
    }
    let cpu = k.cpu_ns();
    let t = k.thread();
    let clock = state::clock(t.cpu_seen_ns, cpu, IDLE_CPU_SLACK_NS);
    if let (Clock::Ran | Clock::Stayed, Some(cpu)) = (clock, cpu) {
        t.clock_seen(cpu);
    }
    let mut request_ran = false;
    match clock {
        Clock::Gone => {
            // Its held samples leave when it is dropped.
            t.exited();
            return false;
        }
        Clock::Recycled => {
            k.flush(Flush::Leaving);
            k.recycled();
            return false;
        }
        Clock::Ran => {
            ran_uncaptured(k, cpu, in_request, tick);
            request_ran = in_request;
        }
        Clock::Stayed => stayed_off_cpu(k, in_request, tick),
    }
    k.flush(Flush::Looked);
    let t = k.thread();
    t.schedule.checked(tick.tick_no);
    request_ran
}

/// Rule 6: its CPU clock (`cpu`) moved by less than a period since it was
/// last read. This tick's fill waits one tick (the thread may be parking
/// somewhere new); the older ones leave with what was known and what the
/// kernel counted.
fn ran_uncaptured(k: &mut impl Kernel, cpu: Option<u64>, in_request: bool, tick: &TickAt) {
    let t = k.thread();
    t.ledger.alive_at(tick.slot_end.saturating_sub(1));
    k.read_counts();
    k.flush(Flush::Ran);
    let t = k.thread();
    t.place.ran_uncaptured();
    t.schedule.ran(tick.tick_no);
    let responsive = !t.asking.is_unresponsive();
    let probe = responsive && t.schedule.probe(tick.tick_no, PROBE_EVERY);
    let overdue = cpu.is_some_and(|cpu| k.timer_overdue(cpu, tick.ts));
    if responsive && (probe || in_request || overdue) {
        match k.look() {
            Look::Waiting(stack, context) => {
                learned_waiting(k.thread(), (tick.tick_no, tick.ts), stack, context);
            }
            Look::Running if overdue => k.catch_stalled_timer(tick.now),
            _ => {}
        }
    }
}

/// Rule 7: its CPU clock did not move since it was last read.
fn stayed_off_cpu(k: &mut impl Kernel, in_request: bool, tick: &TickAt) {
    let t = k.thread();
    t.ledger.alive_at(tick.ts);
    let unresponsive = t.asking.is_unresponsive();
    let preempted = t.place.is_preempted();
    let may_assume = !in_request && !t.schedule.ask_due(tick.tick_no);
    if !unresponsive && (preempted || (!t.place.is_current() && may_assume)) {
        // It waited in the same place the last times it was asked: taken
        // to be there again if the kernel shows it blocked at the same
        // stack pointer and instruction (no stack copied). Found runnable
        // without a core at the last look, it still is unless the kernel
        // shows it blocked now (a thread that runs for less than the clock
        // tells, woken and blocking again, may have been found between
        // the two). Runnable but not given a core, or blocked elsewhere,
        // it is looked at below.
        let at = k.blocked_at();
        let t = k.thread();
        if let Some(at) = at {
            if may_assume && Some(at) == t.blocked_at {
                t.place.assume_waiting(tick.ts);
            }
            if t.place.is_preempted() {
                t.place.ran_uncaptured();
            }
        }
    }
    let t = k.thread();
    if t.place.is_current() || unresponsive {
        t.place.stayed_off(tick.ts);
        t.schedule.stayed_off(MAX_CHECK_EVERY);
        return;
    }
    // Off the CPU for a whole tick since it last ran: waiting in the
    // kernel, or runnable but not given a core (more runnable threads than
    // cores). Learn which, and where it waits.
    match k.look() {
        Look::Waiting(stack, context) => {
            learned_waiting(k.thread(), (tick.tick_no, tick.ts), stack, context);
        }
        Look::Running => {
            let context_now = k.context_now();
            k.thread().place.found_preempted(context_now);
        }
        Look::Gone => k.thread().exited(),
    }
}

/// The per-thread steps of [`record_periods`].
impl Tracked {
    /// Queues this tick's captures in the ledger; returns each one's time,
    /// stack and context word.
    fn push_captures(
        &mut self,
        harvested: super::answers::Harvested,
    ) -> Vec<(u64, Arc<[u64]>, u64)> {
        harvested
            .running()
            .map(|sample| {
                let (stack, context) = (sample.frames().clone(), sample.context());
                (self.ledger.push_sample(sample), stack, context)
            })
            .collect()
    }

    /// Queues the stand-ins of periods the thread ran with no capture of
    /// their own, and adds their times to `running`.
    ///
    /// The timer fired again before the slot was read (`missed`), or more
    /// periods passed than the kernel signalled (overruns): the thread ran
    /// that much CPU time since its previous capture. Where the kernel's
    /// counts are read, the fills between the two captures show it (see
    /// `Ledger::kernel_counted`), and no stand-in is queued for what was
    /// missed: it was spent before this capture, in code no capture saw.
    /// Otherwise its latest stack stands in for those periods, right after
    /// the capture, a microsecond apart: no request may get a moment the
    /// thread was not running in it.
    fn push_stand_ins(&mut self, running: &mut Vec<u64>, missed: u32, periods: u32) {
        let counted = self.schedstat_seen.is_some();
        let stand_ins = slots::stand_in_times(
            running.last().copied(),
            if counted { 0 } else { missed },
            periods,
            self.last_stack.is_some(),
        );
        if stand_ins.is_empty() {
            return;
        }
        let stack = self
            .last_stack
            .clone()
            .unwrap_or_else(|| Arc::from(&[][..]));
        let context = self.last_context;
        for ts in stand_ins {
            let sample = sample_of(self, ts, stack.clone(), context, true);
            running.push(self.ledger.push_sample(sample));
        }
    }
}

/// Gives every period slot no sample took a fill, with the context word
/// the thread had published at the slot (the sampler may run late).
fn fill_free_slots(k: &mut impl Kernel, free: Vec<u64>) {
    for slot in free {
        let word = k.word_at(slot);
        let t = k.thread();
        let at_tick = periods::standing(word, &t.place.known());
        t.ledger.push_fill(slot, word, at_tick);
    }
}

#[cfg(test)]
mod tests {
    //! Timelines: a thread's story, tick by tick (what the kernel shows
    //! it doing), and what each tick must do and let leave.

    use std::sync::Arc;
    use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
    use std::time::{Duration, Instant};

    use super::*;
    use crate::sampler::Sample;
    use crate::sampler::answers::{ABANDON_AFTER, let_go};
    use crate::sampler::stats::Counters;
    use crate::sys::ThreadInfo;

    const PERIOD: u64 = 10_000_000;
    /// A thread id no thread has (`/proc` reads for it fail, as for a
    /// thread that exited).
    const TID: i32 = i32::MAX - 7;
    const LANE: u64 = crate::attribution::LANE_BASE + 1;

    /// Where the kernel shows the thread at one tick.
    #[derive(Debug, Clone, Copy)]
    enum At {
        /// Blocked in a system call at this stack pointer, its stack's leaf
        /// frame this address.
        Blocked(u64),
        /// Running, or runnable without a core.
        Running,
        Gone,
    }

    /// What the kernel shows of the thread at one tick.
    #[derive(Debug, Clone, Copy)]
    struct Shows {
        /// Its CPU clock.
        cpu_ns: u64,
        at: At,
        /// Its run delay (time runnable without a core).
        delay_ns: u64,
        /// Its context word.
        word: u64,
        /// Its timer overdue.
        overdue: bool,
        /// The leaf frame of a capture its timer took in this tick's
        /// period.
        captured: Option<u64>,
    }

    /// Blocked at `sp`, its clock at `cpu_ns`, outside any request.
    fn blocked(sp: u64, cpu_ns: u64) -> Shows {
        Shows {
            cpu_ns,
            at: At::Blocked(sp),
            delay_ns: 0,
            word: 0,
            overdue: false,
            captured: None,
        }
    }

    /// Running (or runnable), its clock at `cpu_ns`, outside any request.
    fn running(cpu_ns: u64) -> Shows {
        Shows {
            at: At::Running,
            ..blocked(0, cpu_ns)
        }
    }

    struct Story {
        t: Tracked,
        shows: Shows,
        tick_no: u64,
        ts: u64,
        /// How long before its tick a capture was taken.
        capture_ago: u64,
        start: Instant,
        did: Vec<String>,
        tx: SyncSender<Sample>,
        rx: Receiver<Sample>,
        c: Counters,
    }

    impl Kernel for Story {
        fn thread(&mut self) -> &mut Tracked {
            &mut self.t
        }

        fn bind(&mut self) -> bool {
            true
        }

        fn has_timer(&mut self) -> bool {
            true
        }

        fn harvest(&mut self) -> Harvested {
            match self.shows.captured {
                Some(leaf) => {
                    let ts = self.ts - self.capture_ago;
                    let stack = Arc::from(&[leaf][..]);
                    Harvested::Running(sample_of(&self.t, ts, stack, self.shows.word, false))
                }
                None => Harvested::Nothing,
            }
        }

        fn untimed(&mut self, _tick: &TickAt) {
            self.did.push("untimed".into());
        }

        fn nudge(&mut self) {}

        fn missed_timer_periods(&mut self) -> u32 {
            0
        }

        fn awaited(&mut self, now: Instant) -> Awaited {
            self.t.asking.check(now, ABANDON_AFTER)
        }

        fn context_now(&mut self) -> u64 {
            self.shows.word
        }

        fn word_at(&mut self, _ts: u64) -> Option<Option<u64>> {
            // The story's thread has no word slot: its fills stand where
            // the thread is found.
            None
        }

        fn cpu_ns(&mut self) -> Option<u64> {
            self.did.push("clock".into());
            (!matches!(self.shows.at, At::Gone)).then_some(self.shows.cpu_ns)
        }

        fn blocked_at(&mut self) -> Option<(u64, u64)> {
            self.did.push("where blocked".into());
            match self.shows.at {
                At::Blocked(sp) => Some((sp, 0x1000)),
                _ => None,
            }
        }

        fn look(&mut self) -> Look {
            self.did.push("look".into());
            match self.shows.at {
                At::Blocked(sp) => {
                    self.t.blocked_at = Some((sp, 0x1000));
                    Look::Waiting(Arc::from(&[sp][..]), self.shows.word)
                }
                At::Running => Look::Running,
                At::Gone => Look::Gone,
            }
        }

        fn timer_overdue(&mut self, _cpu: u64, _ts: u64) -> bool {
            self.shows.overdue
        }

        fn catch_stalled_timer(&mut self, _now: Instant) {
            self.did.push("catch timer".into());
        }

        fn read_counts(&mut self) {
            self.did.push("counts".into());
            let counted = self.counted();
            counted(&mut self.t);
        }

        fn flush(&mut self, why: Flush) {
            self.did.push(format!("let go {why:?}"));
            let counted = self.counted();
            let_go(&mut self.tx, &self.c, &mut self.t, why, PERIOD, counted);
        }

        fn recycled(&mut self) {
            self.did.push("recycled".into());
        }
    }

    impl Story {
        /// What the kernel counts of the thread at this tick.
        fn counted(&self) -> impl FnOnce(&mut Tracked) + use<> {
            let (ts, shows) = (self.ts, self.shows);
            move |t| t.counted(ts, (shows.cpu_ns, shows.delay_ns), shows.word, PERIOD)
        }

        fn new() -> Self {
            let (tx, rx) = sync_channel(1024);
            Self {
                t: Tracked::new(ThreadInfo {
                    tid: TID,
                    name: "story".into(),
                    start_time: 1,
                }),
                shows: blocked(0, 0),
                tick_no: 0,
                ts: 0,
                capture_ago: PERIOD / 4,
                start: Instant::now(),
                did: Vec::new(),
                tx,
                rx,
                c: Counters::default(),
            }
        }

        /// One tick at which the kernel `shows` the thread so. Returns what
        /// the tick did, and the leaf frame of each sample that left.
        fn tick(&mut self, shows: Shows) -> (Vec<String>, Vec<u64>) {
            self.late_tick(shows, 1)
        }

        /// [`Story::tick`] for a tick that stands for `periods` periods
        /// (the sampler thread ran late).
        fn late_tick(&mut self, shows: Shows, periods: u32) -> (Vec<String>, Vec<u64>) {
            self.tick_no += u64::from(periods);
            self.shows = shows;
            let ts = self.tick_no * PERIOD;
            self.ts = ts;
            self.did.clear();
            let at = TickAt {
                tick_no: self.tick_no,
                periods,
                period_ns: PERIOD,
                ts,
                slot_end: ts,
                now: self.start + Duration::from_nanos(ts),
            };
            tick(self, &at);
            let left = self.rx.try_iter().map(|s| s.frames()[0]).collect();
            (std::mem::take(&mut self.did), left)
        }
    }

    const MS: u64 = 1_000_000;
    const WAIT_A: u64 = 0xA0;
    const WAIT_B: u64 = 0xB0;

    /// What a tick did, as written in the stories.
    fn did(steps: &[&str]) -> Vec<String> {
        steps.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_parked_thread_is_asked_once_and_its_clock_read_ever_less_often() {
        let mut s = Story::new();
        assert_eq!(
            s.tick(blocked(WAIT_A, 0)),
            (did(&["clock", "look", "let go Looked"]), vec![WAIT_A])
        );
        let mut clock_read = Vec::new();
        let mut left = Vec::new();
        for _ in 1..40 {
            let (did, out) = s.tick(blocked(WAIT_A, 0));
            assert!(!did.contains(&"look".to_owned()), "asked again: {did:?}");
            if did.contains(&"clock".to_owned()) {
                clock_read.push(s.tick_no);
            }
            left.extend(out);
        }
        // Read at the next tick, then every 2, 4, 8 and at most 16 periods.
        assert_eq!(clock_read, [2, 4, 8, 16, 32]);
        // Every period up to the latest reading shows where it waits.
        assert_eq!(left, vec![WAIT_A; 31]);
    }

    #[test]
    fn a_thread_idle_for_long_that_blocks_in_a_request_is_looked_at_that_tick_and_every_tick_after()
    {
        let mut s = Story::new();
        for _ in 0..40 {
            s.tick(blocked(WAIT_A, 0));
        }
        assert_eq!(s.t.schedule.check_every(), MAX_CHECK_EVERY);
        // Tick 41, not due for a clock read: it took a request, ran 2 ms in
        // it and blocked elsewhere.
        let mut in_request = blocked(WAIT_B, 2 * MS);
        in_request.word = LANE;
        let (did41, left) = s.tick(in_request);
        assert_eq!(
            did41,
            did(&["clock", "counts", "let go Ran", "look", "let go Looked"])
        );
        // The periods since the last reading (33 to 40) waited where it
        // was; this tick's waits to be placed.
        assert_eq!(left, vec![WAIT_A; 8]);
        for _ in 0..3 {
            let (did, left) = s.tick(in_request);
            assert_eq!(did, did_looked());
            assert!(left.iter().all(|&f| f == WAIT_B), "{left:x?}");
        }
    }

    /// A tick that read the clock of a thread that did not run, and let go
    /// what it held.
    fn did_looked() -> Vec<String> {
        did(&["clock", "let go Looked"])
    }

    #[test]
    fn a_thread_that_keeps_blocking_in_the_same_place_is_asked_ever_less_often() {
        // It runs 1 ms every other tick and blocks where it was, for eight
        // ticks.
        let eight_ticks = || {
            let mut s = Story::new();
            let story: Vec<_> = (1..=8u64)
                .map(|tick| s.tick(blocked(WAIT_A, tick / 2 * MS)).0)
                .collect();
            (s, story)
        };
        let (mut s, story) = eight_ticks();
        let ran_no_look = did(&["clock", "counts", "let go Ran", "let go Looked"]);
        assert_eq!(story[0], did(&["clock", "look", "let go Looked"]));
        // Tick 2: it ran; the first look at a thread that runs now and
        // then (the probe) finds the same place.
        assert_eq!(
            story[1],
            did(&["clock", "counts", "let go Ran", "look", "let go Looked"])
        );
        assert_eq!(story[2], did_looked());
        assert_eq!(story[3], did(&[]), "tick 4: its clock is not due");
        assert_eq!(story[4], ran_no_look);
        assert_eq!(story[5], ran_no_look);
        // Tick 7: off the CPU since it ran, and due to be asked again.
        assert_eq!(story[6], did(&["clock", "look", "let go Looked"]));
        assert_eq!(story[7], ran_no_look);
        // Tick 9: not due to be asked (the same answer twice); blocked at
        // the same stack pointer and instruction, it is taken to wait
        // where it did.
        let (did9, _) = s.tick(blocked(WAIT_A, 4 * MS));
        assert_eq!(did9, did(&["clock", "where blocked", "let go Looked"]));
        assert!(s.t.place.is_current());
        // Blocked elsewhere at tick 9, it is asked.
        let (mut s, _) = eight_ticks();
        let (did9, _) = s.tick(blocked(WAIT_B, 4 * MS));
        assert_eq!(
            did9,
            did(&["clock", "where blocked", "look", "let go Looked"])
        );
    }

    #[test]
    fn a_thread_runnable_without_a_core_shows_it_waits_for_a_cpu() {
        let mut s = Story::new();
        s.tick(blocked(WAIT_A, 0));
        // It ran 3 ms, then was preempted: runnable, its clock still.
        s.tick(running(3 * MS));
        let mut preempted = running(3 * MS);
        preempted.delay_ns = 10 * MS;
        let (did3, left) = s.tick(preempted);
        assert_eq!(did3, did(&["clock", "look", "let go Looked"]));
        assert_eq!(left, vec![crate::frames::WAITING_FOR_CPU_FRAME; 2]);
        // Found so, it is not asked again while its clock stays and the
        // kernel shows it runnable.
        let still = did(&["clock", "where blocked", "let go Looked"]);
        assert_eq!(
            s.tick(preempted),
            (still, vec![crate::frames::WAITING_FOR_CPU_FRAME])
        );
        // It got a core for less than its clock tells and blocked in B:
        // it is looked at when its clock is read next (tick 6), and shown
        // waiting there, not for a CPU.
        assert_eq!(s.tick(blocked(WAIT_B, 3 * MS)), (did(&[]), vec![]));
        assert_eq!(
            s.tick(blocked(WAIT_B, 3 * MS)),
            (
                did(&["clock", "where blocked", "look", "let go Looked"]),
                vec![WAIT_B, WAIT_B]
            )
        );
    }

    #[test]
    fn a_running_thread_whose_timer_is_overdue_has_its_capture_taken() {
        let mut s = Story::new();
        let mut overdue = running(5 * MS);
        overdue.overdue = true;
        let (did1, _) = s.tick(overdue);
        assert_eq!(
            did1,
            did(&[
                "clock",
                "counts",
                "let go Ran",
                "look",
                "catch timer",
                "let go Looked"
            ])
        );
        // Not overdue, not in a request, asked lately: not looked at.
        let (did2, _) = s.tick(running(10 * MS));
        assert_eq!(
            did2,
            did(&["clock", "counts", "let go Ran", "let go Looked"])
        );
    }

    #[test]
    fn a_thread_awaiting_a_signals_answer_is_left_alone_until_it_is_given_up() {
        let mut s = Story::new();
        s.tick(blocked(WAIT_A, 0));
        s.t.asking.sent(s.start + Duration::from_nanos(s.ts), true);
        let given_up_at = 1 + ABANDON_AFTER.as_nanos() as u64 / PERIOD;
        for _ in 2..given_up_at {
            assert_eq!(s.tick(blocked(WAIT_A, 0)), (did(&[]), vec![]));
        }
        // Given up: what it held leaves, and the tick goes on.
        let (did_then, left) = s.tick(blocked(WAIT_A, 0));
        assert_eq!(s.tick_no, given_up_at);
        assert_eq!(did_then, did(&["let go Looked", "clock", "let go Looked"]));
        assert_eq!(left.len() as u64, given_up_at - 1);
        assert!(left.iter().all(|&f| f == WAIT_A));
    }

    #[test]
    fn a_clock_going_back_is_another_thread_and_a_lost_clock_an_exited_one() {
        let mut s = Story::new();
        s.tick(blocked(WAIT_A, 5 * MS));
        assert_eq!(
            s.tick(blocked(WAIT_A, MS)).0,
            did(&["clock", "let go Leaving", "recycled"])
        );
        assert!(!s.t.gone);
        let mut gone = blocked(WAIT_A, MS);
        gone.at = At::Gone;
        assert_eq!(s.tick(gone).0, did(&["clock"]));
        assert!(s.t.gone, "dropped at the end of the tick");
    }

    #[test]
    fn a_busy_thread_is_shown_by_its_captures_and_looked_at_once_it_stops() {
        const BUSY: u64 = 0xC0;
        let mut s = Story::new();
        // A capture in every period: each takes its slot and leaves with
        // the kernel's counts; the clock is not read, nobody is asked.
        for tick in 1..=3u64 {
            let mut busy = running(tick * 10 * MS);
            busy.captured = Some(BUSY);
            assert_eq!(
                s.tick(busy),
                (did(&["counts", "let go Ran"]), vec![BUSY]),
                "tick {tick}"
            );
        }
        // It ran 2 ms more and blocked: the tick after its last capture
        // reads its clock and asks where it is; the period waits a tick.
        assert_eq!(
            s.tick(blocked(WAIT_A, 32 * MS)),
            (
                did(&["clock", "counts", "let go Ran", "look", "let go Looked"]),
                vec![]
            )
        );
        assert_eq!(
            s.tick(blocked(WAIT_A, 32 * MS)),
            (did_looked(), vec![WAIT_A, WAIT_A])
        );
    }

    #[test]
    fn a_thread_captured_since_its_wait_is_not_shown_there_after_the_capture() {
        const BUSY: u64 = 0xC0;
        let mut s = Story::new();
        assert_eq!(s.tick(blocked(WAIT_A, 0)).1, vec![WAIT_A]);
        // A late tick (periods 2 and 3): it woke, was captured running
        // early in period 2, ran a period and blocked elsewhere. Period 2
        // is its capture; period 3 came after it left the wait it was
        // found in, and waits for a look.
        s.capture_ago = PERIOD * 5 / 4;
        let mut woke = running(PERIOD);
        woke.captured = Some(BUSY);
        let (did3, left) = s.late_tick(woke, 2);
        assert_eq!(did3, did(&["counts", "let go Ran"]));
        assert_eq!(left, vec![BUSY]);
        // The next tick reads its clock (it ran since the last reading)
        // and, a thread that ran now and then, looks where it is: blocked
        // in B, which period 3 shows (period 4 waits a tick, as it may be
        // parking somewhere new; it leaves with period 5).
        let (did4, left) = s.tick(blocked(WAIT_B, PERIOD));
        assert_eq!(
            did4,
            did(&["clock", "counts", "let go Ran", "look", "let go Looked"])
        );
        assert_eq!(left, vec![WAIT_B]);
        assert_eq!(s.tick(blocked(WAIT_B, PERIOD)).1, vec![WAIT_B, WAIT_B]);
    }
}
