//! How a tick learns each thread's stack, as methods of the sampler's
//! [`Services`] given the thread: timer captures harvested from its slots,
//! a signal to a thread without a timer (or whose timer is late: the
//! nudge), a read of where a blocked thread waits, binding the kernel
//! resources a thread is sampled with; and settling everything in flight
//! when the sampler pauses.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::answers::{
    Flush, Harvested, IDLE_CPU_SLACK_NS, Look, MAX_ASK_EVERY, NUDGE_AFTER, STALLED_TIMER_MIN_SHARE,
    STALLED_TIMER_SLACK_NS, awaited, emit_for, flush, request, sample_of,
};
use super::denied::{Capability, Refusal, is_denial};
use super::services::Services;
use super::state::Awaited;
use super::stats::Counters;
use super::threads::Tracked;
use super::worker::Worker;
use crate::sys::{self, Slot};

impl Services {
    /// Brings the timer of thread `t` forward when it is inside a request
    /// of which no stack was captured yet (on any thread): its next capture
    /// comes after `NUDGE_AFTER` of its CPU time rather than after what is
    /// left of the current period. Otherwise a short request on a thread
    /// that gets a small share of a busy machine's cores can end before its
    /// first capture, and its periods have no stack to show. The shortened
    /// period is one of the thread's periods like any other (a capture
    /// beyond the tick's periods cancels a fill), so the thread is not
    /// sampled more than once per period of its wall time. Repeated at every
    /// tick that finds the thread in such a request (the capture may land in
    /// another request the thread polls in between), at most once per tick.
    pub(super) fn nudge(&mut self, t: &mut Tracked, c: &Counters) {
        let period = self.period;
        let (Some(slot), Some(timer)) = (t.word_slot, &t.timer) else {
            return;
        };
        // Once `timer_settime` is refused, it is not called again.
        if !t.timer_armed || self.denied.timers.is_some() {
            return;
        }
        let word = crate::context::read_for(slot, t.info.tid);
        if word == 0 || self.requests.contains(word) {
            return;
        }
        // An expired timer whose signal waits for the thread to run again
        // (preempted) must be left alone: re-arming it makes the kernel
        // drop that signal, and with it the capture.
        if timer.remaining().is_none_or(|left| left <= NUDGE_AFTER) {
            return;
        }
        match timer.set_first(NUDGE_AFTER, period) {
            Ok(()) => c.timers_nudged.add(1),
            Err(errno) => self.refused(Capability::Timers, "timer_settime", errno, c),
        }
    }

    /// Whether thread `t`, seen running (its CPU clock at `cpu`) with no
    /// capture at the tick at `ts`, has run more than a period and
    /// [`STALLED_TIMER_SLACK_NS`] of CPU time since its latest capture or
    /// wait, busy for at least one [`STALLED_TIMER_MIN_SHARE`]th of that
    /// time.
    pub(super) fn timer_overdue(&self, t: &mut Tracked, cpu: u64, ts: u64) -> bool {
        let after_ns = self.period.as_nanos() as u64 + STALLED_TIMER_SLACK_NS;
        t.timer_armed && overdue(&mut t.ran_uncaptured_from, cpu, ts, after_ns)
    }

    /// Takes the capture the timer of thread `t` owes: found running
    /// and overdue ([`Services::timer_overdue`]) at two ticks in a row
    /// without waiting in the kernel in between, its timer expired and not
    /// fired. The kernel checks a thread's CPU timers only at its ticks,
    /// and a busy scheduler that switches threads between ticks (slices
    /// shorter than a tick) can keep a thread off the CPU at every tick for
    /// hundreds of milliseconds of its CPU time (BENCHMARKS §4, "CPU-time
    /// timers the kernel does not fire"). The sampler then signals it, as it
    /// signals a thread without a timer, and the timer starts a new period.
    pub(super) fn catch_stalled_timer(&mut self, t: &mut Tracked, now: Instant, c: &Counters) {
        if self.denied.signals.is_some() || self.denied.timers.is_some() {
            return;
        }
        let period = self.period;
        // The signal must never reach a thread as it enters a wait: a timed
        // wait it interrupts fails with `EINTR` even with `SA_RESTART`, and
        // the kernel says a thread is running until it sleeps, system call
        // entry included. So only a thread that computed without waiting in
        // the kernel (no voluntary context switch) for a whole tick is
        // signalled: the first overdue look notes its count, a later one
        // that finds the same count signals. A thread that waits between
        // bursts (a loop of timed waits, a worker that parks) keeps its
        // count moving and is never caught up; its waits are read from
        // here instead.
        let Some(waits) = t.status_file.read_voluntary_switches(t.info.tid) else {
            return;
        };
        if t.waits_when_overdue.replace(waits) != Some(waits) {
            return;
        }
        t.ran_uncaptured_from = None;
        let Some(timer) = t.timer.as_ref() else {
            return;
        };
        // A timer with time left was re-armed since (nudged): not stalled.
        if timer
            .remaining()
            .is_none_or(|left| left > Duration::from_nanos(1))
        {
            return;
        }
        // Re-armed first: a signal the kernel queued meanwhile is dropped,
        // so the thread is not sampled twice for the period.
        if let Err(errno) = timer.set(period) {
            self.refused(Capability::Timers, "timer_settime", errno, c);
            return;
        }
        // Looked at once more right before the signal: a thread that
        // entered a wait since the look (the timer calls above take
        // microseconds) is left alone. One read of a kept file.
        if t.syscall_file.read_syscall(t.info.tid) != Some(sys::SyscallState::Running) {
            return;
        }
        match request(t, true, now, c) {
            Some(errno) => self.refused(Capability::Signals, "rt_tgsigqueueinfo", errno, c),
            None => c.timers_stalled.add(1),
        }
    }

    /// A thread without a timer: signalled from here whenever its CPU clock
    /// moved, its previous stack repeated otherwise.
    pub(super) fn untimed(&mut self, t: &mut Tracked, tick_ts: u64, now: Instant, c: &Counters) {
        if awaited(t, now, c) == Awaited::Pending {
            return;
        }
        let Some(cpu) = sys::thread_cpu_time_ns(t.info.tid) else {
            t.gone = true;
            return;
        };
        if cpu < t.cpu_seen_ns {
            t.reset_identity();
            c.threads_recycled.add(1);
            return;
        }
        match t.last_stack.clone() {
            Some(stack)
                if cpu - t.cpu_seen_ns <= IDLE_CPU_SLACK_NS || t.asking.is_unresponsive() =>
            {
                let context = t.word_slot.map_or(0, crate::context::read);
                c.samples_idle.add(1);
                emit_for(&mut self.out, c, t, tick_ts, stack, context, true);
            }
            _ => {
                t.cpu_seen_ns = cpu;
                // A thread blocked in the kernel is read from here; only one
                // seen running is signalled (see `SamplerConfig::cpu_timers`).
                match self.look_blocked(t, c) {
                    Look::Waiting(stack, context) => {
                        t.last_stack = Some(stack.clone());
                        t.last_context = context;
                        emit_for(&mut self.out, c, t, tick_ts, stack, context, false);
                    }
                    Look::Running => self.signal_running(t, now, c),
                    Look::Gone => t.gone = true,
                }
            }
        }
    }

    /// Signals thread `t`, which has no timer and was seen running, for a
    /// capture; not when the kernel refused such signals before.
    fn signal_running(&mut self, t: &mut Tracked, now: Instant, c: &Counters) {
        if self.denied.signals.is_some() {
            c.dropped_signal_failed.add(1);
            return;
        }
        if let Some(errno) = request(t, true, now, c) {
            self.refused(Capability::Signals, "rt_tgsigqueueinfo", errno, c);
        }
    }

    /// Probes, on the sampler thread (a seccomp filter belongs to a thread
    /// and those it creates), the system calls the sampler captures stacks
    /// with, and says which the kernel refuses (see `denied`).
    pub(super) fn probe_capabilities(&mut self, c: &Counters) {
        self.probe_except(None, c);
        self.denied.started = true;
        self.denied.report();
    }

    /// Probes the calls not known to be refused yet, but `except`'s.
    fn probe_except(&mut self, except: Option<Capability>, c: &Counters) {
        for cap in [Capability::Timers, Capability::Signals, Capability::VmRead] {
            if Some(cap) == except || self.denied.get(cap).is_some() {
                continue;
            }
            let failed = match cap {
                Capability::Timers if !self.denied.cpu_timers => None,
                Capability::Timers => sys::probe_cpu_timer().err(),
                Capability::Signals => sys::probe_signal().err().map(|e| ("rt_tgsigqueueinfo", e)),
                Capability::VmRead => sys::probe_vm_read().err().map(|e| ("process_vm_readv", e)),
            };
            if let Some((call, errno)) = failed {
                self.note_refusal(cap, call, errno, c);
            }
        }
    }

    /// Counts and records `call`'s failure with `errno` if it is a refusal
    /// (see `denied::is_denial`); returns whether the refusal is new.
    fn note_refusal(
        &mut self,
        cap: Capability,
        call: &'static str,
        errno: i32,
        c: &Counters,
    ) -> bool {
        if !is_denial(errno) {
            return false;
        }
        match cap {
            Capability::Timers => c.timers_denied.add(1),
            Capability::Signals => c.signals_denied.add(1),
            Capability::VmRead => c.vm_read_denied.add(1),
        }
        let new = self.denied.record(cap, Refusal { call, errno });
        if new && cap == Capability::VmRead {
            self.denied.proc_mem_readable = sys::probe_proc_mem();
        }
        new
    }

    /// `call`, which the sampler relies on for `cap`, failed with `errno`.
    /// A refusal is counted and recorded; the first one of `cap` also has
    /// the other calls probed again (a policy that forbids one often
    /// forbids more, and one warning should name them all) and what changed
    /// said on stderr.
    pub(super) fn refused(
        &mut self,
        cap: Capability,
        call: &'static str,
        errno: i32,
        c: &Counters,
    ) {
        if self.note_refusal(cap, call, errno, c) {
            self.probe_except(Some(cap), c);
            self.denied.report();
        }
    }

    /// Learns where thread `t` waits, if it is blocked in the kernel,
    /// without interrupting it (see `sys::TaskFile`): the stack it
    /// waits in and the context word it publishes.
    pub(super) fn look_blocked(&mut self, t: &mut Tracked, c: &Counters) -> Look {
        let cap = self.config.stack_copy_bytes;
        let tid = t.info.tid;
        let word_slot = t.word_slot;
        let known_bounds = t.stack_bounds;
        let Some(cpu_before) = sys::thread_cpu_time_ns(tid) else {
            return Look::Gone;
        };
        let state = t.syscall_file.read_syscall(tid);
        let (sp, pc) = match state {
            Some(sys::SyscallState::Blocked { sp, pc, .. }) => (sp, pc),
            Some(sys::SyscallState::Running) => return Look::Running,
            None if sys::thread_cpu_time_ns(tid).is_none() => return Look::Gone,
            // Unreadable (a hardened /proc): nothing is learned.
            None => return Look::Running,
        };
        let top = match known_bounds {
            Some((lo, hi)) if (lo..hi).contains(&(sp as usize)) => Some(hi),
            _ => {
                // Blocked in the kernel, its stack pointer is on its stack:
                // its bounds are learned here, before its first capture.
                let mapping = self.maps.holding(sp as usize);
                if let Some(bounds) = mapping {
                    if known_bounds.is_none() {
                        t.set_bounds(bounds);
                    }
                }
                mapping.map(|(_, hi)| hi)
            }
        };
        let len = top.map_or(0, |hi| (hi.saturating_sub(sp as usize)).min(cap));
        self.copy_buf.resize(len, 0);
        let vm_read = self.denied.vm_read.is_none();
        let read = sys::read_own_memory(sp, &mut self.copy_buf[..len], vm_read);
        if let Some(errno) = read.vm_read_errno {
            self.refused(Capability::VmRead, "process_vm_readv", errno, c);
        }
        let copied = read.copied;
        let context = word_slot.map_or(0, |s| crate::context::read_for(s, tid));
        if sys::thread_cpu_time_ns(tid) != Some(cpu_before) {
            // It woke up while its stack was read: the copy may mix two
            // moments.
            c.waits_raced.add(1);
            return Look::Running;
        }
        // Cut short by `stack_copy_bytes` (or an unreadable page): the
        // stack's root is not in the copy.
        let complete = top.is_some_and(|hi| copied == hi.saturating_sub(sp as usize));
        let start = Instant::now();
        self.unwinder.unwind_blocked(
            pc,
            sp,
            &self.copy_buf[..copied],
            complete,
            vm_read,
            &mut self.frames,
        );
        c.unwind_ns.add(start.elapsed().as_nanos() as u64);
        c.waits_read.add(1);
        t.blocked_at = Some((sp, pc));
        Look::Waiting(Arc::from(&self.frames[..]), context)
    }

    /// Gives a thread its slot and timer, and arms the timer, if not done
    /// yet. Returns false if the thread has no slot (counted).
    pub(super) fn bind(&mut self, t: &mut Tracked, c: &Counters) -> bool {
        let cap = self.config.stack_copy_bytes;
        let period = self.period;
        // Once refused, timers are not asked for again.
        let timers = self.config.cpu_timers && self.denied.timers.is_none();
        let mut refusal = None;
        if t.capture_slot.is_none() {
            let Some(slot) = Slot::acquire(cap) else {
                c.dropped_no_slot.add(1);
                return false;
            };
            // The second slot is a bonus: without it (the process-wide
            // limit reached) a capture that finds the first one full is
            // counted as missed.
            let second = Slot::acquire(cap);
            let (lo, hi) = t.stack_bounds.unwrap_or((0, 0));
            if !slot.bind(t.info.tid, lo, hi, second) {
                let _ = Slot::release(slot);
                if let Some(second) = second {
                    let _ = Slot::release(second);
                }
                return false;
            }
            t.capture_slot = Some(slot);
            t.capture_slot2 = second.filter(|s| s.bind(t.info.tid, lo, hi, None));
            // Sampled from here on through its own slot: the process timer
            // leaves it alone (see `short_lived`).
            sys::mark_known(t.info.tid);
            t.cpu_seen_ns = sys::thread_cpu_time_ns(t.info.tid).unwrap_or(0);
            if timers {
                match sys::CpuTimer::create(t.info.tid, slot) {
                    Ok(timer) => t.timer = Some(timer),
                    // An exited thread's CPU clock is an invalid clock.
                    Err(_) if sys::thread_cpu_time_ns(t.info.tid).is_none() => t.gone = true,
                    Err(errno) => {
                        c.timers_failed.add(1);
                        refusal = Some(("timer_create", errno));
                    }
                }
            } else if self.config.cpu_timers {
                // Refused before: sampled from here, as a thread whose
                // timer could not be created.
                c.timers_failed.add(1);
            }
        }
        if let Some(timer) = &t.timer {
            if !t.timer_armed {
                // The first expiry at a random point of the first period: a
                // thread then gets a capture per period of its CPU time on
                // average however little of it it uses from here (a
                // thread that ends after less than a period would
                // otherwise never have one, and the process timer leaves
                // it alone from now on).
                let first = period
                    .mul_f64(1.0 - rand::random::<f64>())
                    .max(Duration::from_micros(1));
                match timer.set_first(first, period) {
                    Ok(()) => t.timer_armed = true,
                    Err(errno) => {
                        t.timer = None;
                        if sys::thread_cpu_time_ns(t.info.tid).is_none() {
                            t.gone = true;
                        } else {
                            // The kernel refused: sample it from here instead.
                            c.timers_failed.add(1);
                            refusal = Some(("timer_settime", errno));
                        }
                    }
                }
            }
        }
        if let Some((call, errno)) = refusal {
            self.refused(Capability::Timers, call, errno, c);
        }
        true
    }

    /// Reads the thread's slots if the handler filled them, emits what
    /// they hold, and re-arms them; `tick_no` is the tick's period.
    pub(super) fn harvest(&mut self, t: &mut Tracked, tick_no: u64, c: &Counters) -> Harvested {
        // The older capture first, when both slots are full.
        let slots = [t.capture_slot, t.capture_slot2];
        let filled = |s: Option<&'static Slot>| s.and_then(|s| s.filled_at());
        let order = match (filled(slots[0]), filled(slots[1])) {
            (Some(a), Some(b)) if b < a => [1, 0],
            _ => [0, 1],
        };
        let first = self.harvest_slot(t, slots[order[0]], tick_no, c);
        let second = self.harvest_slot(t, slots[order[1]], tick_no, c);
        match (first, second) {
            (Harvested::Running(a), Harvested::Running(b)) => Harvested::Running2(a, b),
            (Harvested::Running(a), _) | (_, Harvested::Running(a)) => Harvested::Running(a),
            (Harvested::Parked, _) | (_, Harvested::Parked) => Harvested::Parked,
            (Harvested::Discarded, _) | (_, Harvested::Discarded) => Harvested::Discarded,
            _ => Harvested::Nothing,
        }
    }

    /// [`Services::harvest`] for one of the thread's slots.
    pub(super) fn harvest_slot(
        &mut self,
        t: &mut Tracked,
        slot: Option<&'static Slot>,
        tick_no: u64,
        c: &Counters,
    ) -> Harvested {
        let Some(slot) = slot else {
            return Harvested::Nothing;
        };
        let frames = &mut self.frames;
        let unwinder = &mut self.unwinder;
        let Some(filled) = slot.filled() else {
            return Harvested::Nothing;
        };
        let cap = *filled.captured();
        let off_stack = cap.flags & sys::FLAG_OFF_STACK != 0;
        if !off_stack {
            let start = Instant::now();
            unwinder.unwind(&cap.regs, filled.stack(), frames);
            c.unwind_ns.add(start.elapsed().as_nanos() as u64);
        }
        let timer = cap.flags & sys::FLAG_TIMER != 0;
        let mut keep = true;
        if off_stack {
            let sp = cap.regs.sp as usize;
            // Bounds just learned, or learned through the thread's other slot
            // after this one was armed: spent, the next capture counts.
            let stale = t
                .stack_bounds
                .is_some_and(|(lo, hi)| (lo..hi).contains(&sp));
            if t.learn_bounds(self.maps.holding(sp)) || stale {
                keep = false;
            } else {
                self.frames.clear();
                self.frames.push(cap.regs.pc);
                c.samples_off_stack.add(1);
            }
        }
        if !off_stack && t.stack_bounds.is_none() {
            // Copied up to its thread pointer (its bounds were not known
            // yet): they are learned from the mapping that holds its stack
            // pointer, so the next captures copy within them.
            if let Some(bounds) = self.maps.holding(cap.regs.sp as usize) {
                t.set_bounds(bounds);
            }
        }
        let (lo, hi) = t.stack_bounds.unwrap_or((0, 0));
        filled.rearm(lo, hi);
        // Any capture proves the thread takes the signal again. A timer
        // capture also ends a question about where the thread waits: it
        // runs, and the question's signal may have found the slot full.
        let request = t.asking.answered();
        c.handler_ns.add(cap.handler_ns);
        if !keep {
            c.captures_discarded.add(1);
            return Harvested::Discarded;
        }
        let stack: Arc<[u64]> = match &t.last_stack {
            Some(last) if **last == self.frames[..] => last.clone(),
            _ => Arc::from(&self.frames[..]),
        };
        t.last_stack = Some(stack.clone());
        t.last_context = cap.context;
        c.samples_captured.add(1);
        if timer {
            c.samples_timer.add(1);
        }
        if timer || t.timer.is_none() || request.is_some_and(|r| r.as_sample) {
            self.requests.record(cap.context);
            return Harvested::Running(sample_of(t, cap.timestamp_ns, stack, cap.context, false));
        }
        // The answer to where it waits, taken by a signal (so possibly while
        // it ran): the same answer as last time means asking less often (up
        // to once a second at 101 Hz), another one at every chance again.
        let answer = t
            .place
            .found_waiting(stack, cap.context, false, cap.timestamp_ns);
        t.schedule.answered(answer, tick_no, MAX_ASK_EVERY);
        Harvested::Parked
    }
}

impl Worker {
    /// Stops the timers, waits briefly for requests in flight, and records
    /// every thread's held fills (the sampler is pausing or stopping).
    pub(super) fn settle(&mut self) {
        let Worker {
            threads,
            services,
            shared,
            tick_no,
            short_lived,
            ..
        } = self;
        services.unwinder.new_tick();
        let c = &shared.counters;
        for t in threads.iter_mut() {
            let refused_before = services.denied.timers.is_some();
            let Some(timer) = t.timer.as_ref().filter(|_| t.timer_armed) else {
                continue;
            };
            t.timer_armed = false;
            let disarmed = if refused_before {
                Err(None)
            } else {
                timer.set(Duration::ZERO).map_err(Some)
            };
            if let Err(errno) = disarmed {
                // A timer that cannot be disarmed is deleted, so that it
                // does not fire while the sampler pauses.
                t.timer = None;
                if let Some(errno) = errno {
                    services.refused(Capability::Timers, "timer_settime", errno, c);
                }
            }
        }
        let until = Instant::now() + Duration::from_millis(20);
        loop {
            let seen = sys::completion_seq();
            let waiting = threads.iter_mut().any(|t| {
                t.asking.is_asked()
                    && [t.capture_slot, t.capture_slot2]
                        .into_iter()
                        .flatten()
                        .all(|s| s.state() != sys::SlotState::Done)
            });
            let now = Instant::now();
            if !waiting || now >= until {
                break;
            }
            sys::wait_completion(seen, until - now);
        }
        let period_ns = services.period.as_nanos() as u64;
        for t in threads.iter_mut() {
            if t.gone || t.capture_slot.is_none() {
                continue;
            }
            let harvested = services.harvest(t, *tick_no, c);
            t.asking.forget();
            for sample in harvested.running() {
                t.ledger.push_sample(sample);
            }
            let alive = sys::thread_cpu_time_ns(t.info.tid).is_some();
            if alive {
                t.ledger.alive_at(u64::MAX);
            }
            flush(&mut services.out, c, t, Flush::Leaving, period_ns);
            // Fills after the thread was last seen alive are dropped.
            t.ledger.clear();
            if alive {
                t.ledger.alive_until(sys::realtime_ns());
            }
            t.schedule.reset_checks();
        }
        // Captures of threads not listed yet: the last ones in flight
        // were awaited above with the others.
        short_lived.disarm();
        short_lived.harvest(services, c, sys::realtime_ns(), true);
    }
}

/// Whether a thread that ran, its CPU clock at `cpu` at the tick at `ts`,
/// has run at least `after_ns` of CPU time since `from` (its CPU clock and
/// the tick's time, set here at the first look after its latest capture;
/// cleared by the caller at a capture or a wait), busy for at least one
/// [`STALLED_TIMER_MIN_SHARE`]th of the time since. A thread that gained
/// that CPU time more slowly starts counting again.
fn overdue(from: &mut Option<(u64, u64)>, cpu: u64, ts: u64, after_ns: u64) -> bool {
    let (cpu_from, ts_from) = *from.get_or_insert((cpu, ts));
    let ran = cpu.saturating_sub(cpu_from);
    if ran < after_ns {
        return false;
    }
    if ran.saturating_mul(STALLED_TIMER_MIN_SHARE) >= ts.saturating_sub(ts_from) {
        return true;
    }
    *from = Some((cpu, ts));
    false
}

#[cfg(test)]
mod tests {
    use super::overdue;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_busy_thread_is_overdue_after_the_cpu_time_since_the_first_look() {
        let mut from = None;
        // The first look after a capture only starts the count: what ran
        // between the capture and it is not known.
        assert!(!overdue(&mut from, 50 * MS, 1_000 * MS, 10 * MS));
        assert_eq!(from, Some((50 * MS, 1_000 * MS)));
        assert!(!overdue(&mut from, 60 * MS - 1, 1_030 * MS, 10 * MS));
        // 10 ms of CPU in 40 ms: a thread kept waiting for a core.
        assert!(overdue(&mut from, 60 * MS, 1_040 * MS, 10 * MS));
        // A capture clears it; the count starts again.
        from = None;
        assert!(!overdue(&mut from, 61 * MS, 1_041 * MS, 10 * MS));
        // A clock that went back (never for one thread) is not overdue.
        assert!(!overdue(&mut from, 1_000, 1_042 * MS, 10 * MS));
    }

    #[test]
    fn a_thread_that_mostly_waits_is_never_overdue() {
        // 10 ms of CPU gained over a second, in short runs between waits.
        let mut from = None;
        assert!(!overdue(&mut from, 0, 0, 10 * MS));
        assert!(!overdue(&mut from, 10 * MS, 1_000 * MS, 10 * MS));
        // It starts counting again from there: busy from now on, it is
        // overdue after another 10 ms of CPU at a busy share.
        assert_eq!(from, Some((10 * MS, 1_000 * MS)));
        assert!(!overdue(&mut from, 15 * MS, 1_020 * MS, 10 * MS));
        assert!(overdue(&mut from, 20 * MS, 1_060 * MS, 10 * MS));
    }
}
