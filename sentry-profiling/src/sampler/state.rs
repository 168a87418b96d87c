//! A sampled thread's state as the sampler sees it, as explicit states with
//! pure transitions: where the thread stands when it does not run
//! ([`Whereabouts`]), whether a signal it was sent is awaited
//! ([`Asking`]), when it is looked at next ([`Schedule`]), and what a read
//! of its CPU clock tells ([`Clock`]). The worker performs the system calls
//! and feeds what they return to these transitions; its per-period
//! accounting is in `ledger`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::periods::{Known, synthetic};

/// Where the thread was last found waiting, and the context word it
/// published then.
#[derive(Debug, Clone)]
pub(super) struct Wait {
    pub(super) stack: Arc<[u64]>,
    pub(super) context: u64,
    /// Taken while the thread did not run (read from here while it was
    /// blocked, or confirmed by a CPU clock that did not move since), not
    /// while it ran.
    pub(super) verified: bool,
    /// When it was last known to stand there (`CLOCK_REALTIME`, ns): found
    /// or confirmed.
    pub(super) found_ns: u64,
    /// When it was first captured running since (see
    /// [`Whereabouts::captured_running`]): no later moment shows this
    /// stack until it is found there again.
    pub(super) left_ns: Option<u64>,
}

impl Wait {
    /// Found there again at `now_ns` (it did not run since, or is blocked
    /// at the same stack pointer and instruction).
    fn confirmed(&mut self, now_ns: u64) {
        if now_ns > self.found_ns {
            self.found_ns = now_ns;
            self.left_ns = None;
        }
    }
}

/// Where the thread stands now, when it does not run.
#[derive(Debug, Clone, Default)]
pub(super) enum Standing {
    /// It ran since it was last found anywhere: not known.
    #[default]
    Unknown,
    /// Waiting where [`Whereabouts::wait`] says.
    Waiting,
    /// Runnable but not given a core, in the request of this context word
    /// (0: none). Where in its code is not known: it may have run on since
    /// its latest capture.
    Preempted(u64),
}

/// What the sampler knows of where a thread is when it does not run.
#[derive(Debug, Clone, Default)]
pub(super) struct Whereabouts {
    /// Where it last waited (kept after it ran since, as a guess the
    /// kernel's counts correct, and to tell a later answer that is the
    /// same).
    pub(super) wait: Option<Wait>,
    pub(super) now: Standing,
}

/// Whether a new answer about where a thread waits is the one it gave last
/// time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answer {
    Same,
    New,
}

impl Whereabouts {
    /// Whether where it stands is current (it has not run since).
    pub(super) fn is_current(&self) -> bool {
        !matches!(self.now, Standing::Unknown)
    }

    /// Captured running at `ts`: a place it was found waiting in before
    /// that, it had left by then.
    pub(super) fn captured_running(&mut self, ts: u64) {
        if let Some(w) = &mut self.wait
            && ts > w.found_ns
            && w.left_ns.is_none_or(|left| ts < left)
        {
            w.left_ns = Some(ts);
        }
    }

    /// Whether it was found runnable without a core, and has not run since.
    pub(super) fn is_preempted(&self) -> bool {
        matches!(self.now, Standing::Preempted(_))
    }

    /// A capture of running code: where it stood is no longer current.
    pub(super) fn ran(&mut self) {
        self.now = Standing::Unknown;
    }

    /// Found waiting in `stack` with `context` published at `found_ns`: by
    /// a signal's answer (`verified` false: it may have been taken while
    /// running) or read from here while it was blocked (`verified`).
    pub(super) fn found_waiting(
        &mut self,
        stack: Arc<[u64]>,
        context: u64,
        verified: bool,
        found_ns: u64,
    ) -> Answer {
        let (stack, answer) = match &self.wait {
            Some(old) if *old.stack == *stack => (old.stack.clone(), Answer::Same),
            _ => (stack, Answer::New),
        };
        self.wait = Some(Wait {
            stack,
            context,
            verified,
            found_ns,
            left_ns: None,
        });
        self.now = Standing::Waiting;
        answer
    }

    /// Found runnable but not running (preempted), publishing `context_now`:
    /// waiting for a CPU, in that request.
    pub(super) fn found_preempted(&mut self, context_now: u64) {
        self.now = Standing::Preempted(context_now);
    }

    /// It ran without a capture (its CPU clock moved less than a period):
    /// where it stands now is not known until it is looked at again.
    pub(super) fn ran_uncaptured(&mut self) {
        self.now = Standing::Unknown;
    }

    /// It gave the same answer the last times it was asked, and the kernel
    /// shows it blocked at the same stack pointer and instruction at
    /// `now_ns`: taken to wait there again, without asking.
    pub(super) fn assume_waiting(&mut self, now_ns: u64) {
        if let Some(w) = &mut self.wait {
            w.confirmed(now_ns);
            self.now = Standing::Waiting;
        }
    }

    /// Its CPU clock did not move for a whole tick ending at `now_ns`: a
    /// place it was found waiting in is confirmed (it did not run since).
    pub(super) fn stayed_off(&mut self, now_ns: u64) {
        let waiting = matches!(self.now, Standing::Waiting);
        if let Some(w) = &mut self.wait {
            w.verified = waiting;
            if waiting {
                w.confirmed(now_ns);
            }
        }
    }

    /// What `periods::standing` may use: where it waits, if current.
    pub(super) fn known(&self) -> Known<'_> {
        Known {
            waiting: match (&self.now, &self.wait) {
                (Standing::Waiting, Some(w)) => Some((&w.stack, w.context)),
                _ => None,
            },
            preempted: match self.now {
                Standing::Preempted(context) => Some(context),
                _ => None,
            },
        }
    }

    /// Where its fills stand when they leave: waiting for a CPU where it is
    /// preempted; where it waits (filed under the request it waited in only
    /// while that is current and verified); where it last waited, not known
    /// to be there now (the kernel's counts then show what it ran and
    /// waited for a CPU in them, see `Ledger::settle`: what is left is
    /// time it was blocked, most often where it was found blocked before),
    /// and only up to the first capture of it running since (later fills
    /// wait for a look, see `FillPlace::left_ns`);
    /// never found waiting, ran without a stack captured (no earlier
    /// capture stands in: its code may have moved on).
    pub(super) fn fill_place(&self) -> super::ledger::FillPlace {
        use super::ledger::FillPlace;
        match (&self.now, &self.wait) {
            (Standing::Preempted(context), _) => FillPlace {
                stack: Some(synthetic(crate::frames::WAITING_FOR_CPU_FRAME)),
                context: *context,
                known: true,
                ran: false,
                left_ns: None,
            },
            (now, Some(w)) => {
                let current = matches!(now, Standing::Waiting);
                FillPlace {
                    stack: Some(w.stack.clone()),
                    context: if current && w.verified { w.context } else { 0 },
                    // A guess outside any request stands until it is
                    // known to be wrong: the thread was captured running
                    // since (its fills after that wait for a look).
                    known: current || (w.context == 0 && w.left_ns.is_none()),
                    ran: !current,
                    left_ns: w.left_ns,
                }
            }
            (_, None) => FillPlace::unknown(),
        }
    }
}

/// A signal the sampler sent to a thread, not yet answered.
#[derive(Debug, Clone, Copy)]
pub(super) struct Requested {
    /// When it was sent.
    pub(super) since: Instant,
    /// Whether the capture is a sample of its own (the thread has no timer)
    /// rather than the thread's waiting stack.
    pub(super) as_sample: bool,
}

/// Whether the sampler awaits a signal's answer from a thread.
#[derive(Debug, Clone, Copy, Default)]
pub(super) enum Asking {
    #[default]
    Idle,
    Asked(Requested),
    /// It left a signal unanswered for long (it blocks the signal, or is
    /// starved of CPU): none is sent again until it answers.
    Unresponsive,
}

/// What [`Asking::check`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Awaited {
    /// No signal is awaited.
    Nothing,
    /// One is, and may still be answered.
    Pending,
    /// One was, and has just been given up on.
    GaveUp,
}

impl Asking {
    /// The signal sent now (`as_sample`: its capture is a sample of its
    /// own).
    pub(super) fn sent(&mut self, now: Instant, as_sample: bool) {
        *self = Self::Asked(Requested {
            since: now,
            as_sample,
        });
    }

    /// A capture arrived: the thread takes the signal, and whatever was
    /// asked is answered. Returns the request it answers, if any.
    pub(super) fn answered(&mut self) -> Option<Requested> {
        match std::mem::take(self) {
            Self::Asked(r) => Some(r),
            _ => None,
        }
    }

    /// Whether a signal is still awaited at `now`; one awaited `abandon_after`
    /// is given up on, and the thread is not asked again until it answers.
    pub(super) fn check(&mut self, now: Instant, abandon_after: Duration) -> Awaited {
        let Self::Asked(r) = *self else {
            return Awaited::Nothing;
        };
        if now.duration_since(r.since) < abandon_after {
            return Awaited::Pending;
        }
        *self = Self::Unresponsive;
        Awaited::GaveUp
    }

    pub(super) fn is_asked(&self) -> bool {
        matches!(self, Self::Asked(_))
    }

    /// A question about where it waits is awaited (its fills wait for the
    /// answer).
    pub(super) fn asks_where(&self) -> bool {
        matches!(self, Self::Asked(r) if !r.as_sample)
    }

    pub(super) fn is_unresponsive(&self) -> bool {
        matches!(self, Self::Unresponsive)
    }

    /// Forgets a signal still awaited (the sampler pauses).
    pub(super) fn forget(&mut self) {
        if self.is_asked() {
            *self = Self::Idle;
        }
    }
}

/// When a thread is looked at next, in sampling periods (tick numbers).
#[derive(Debug, Clone)]
pub(super) struct Schedule {
    /// Before this period its scheduler state is not looked at again.
    next_probe: u64,
    /// Periods between two questions about where it waits (longer while
    /// the answers stay the same), and the period before which it is not
    /// asked again.
    ask_every: u64,
    next_ask: u64,
    /// Periods between CPU clock reads while it stays off the CPU, and the
    /// period of the next read.
    check_every: u64,
    next_check: u64,
}

impl Default for Schedule {
    fn default() -> Self {
        Self {
            next_probe: 0,
            ask_every: 1,
            next_ask: 0,
            check_every: 1,
            next_check: 0,
        }
    }
}

impl Schedule {
    /// An answer about where it waits at period `tick`: the same as last
    /// time means asking less often (down to every `max_every` periods),
    /// another one at every chance again.
    pub(super) fn answered(&mut self, answer: Answer, tick: u64, max_every: u64) {
        self.ask_every = match answer {
            Answer::Same => (self.ask_every * 2).min(max_every),
            Answer::New => 1,
        };
        self.next_ask = tick + self.ask_every;
    }

    /// It ran: its clock is read at the next period.
    pub(super) fn ran(&mut self, tick: u64) {
        self.check_every = 1;
        self.next_check = tick + 1;
    }

    /// Its clock did not move: read it less often (down to every
    /// `max_every` periods).
    pub(super) fn stayed_off(&mut self, max_every: u64) {
        self.check_every = (self.check_every * 2).min(max_every);
    }

    /// Its clock was read at period `tick`: the next read is due
    /// `check_every` periods later.
    pub(super) fn checked(&mut self, tick: u64) {
        self.next_check = tick + self.check_every;
    }

    /// Periods between two reads of its clock now.
    #[cfg(test)]
    pub(super) fn check_every(&self) -> u64 {
        self.check_every
    }

    /// Whether its clock is due at period `tick`.
    pub(super) fn check_due(&self, tick: u64) -> bool {
        tick >= self.next_check
    }

    /// Whether it may be asked where it waits at period `tick` (it gave a
    /// new answer lately, or the same one long enough ago).
    pub(super) fn ask_due(&self, tick: u64) -> bool {
        tick >= self.next_ask
    }

    /// Whether a thread that keeps running now and then is looked at at
    /// period `tick`, to learn where it waits; if so, the next look is
    /// `every` periods later.
    pub(super) fn probe(&mut self, tick: u64, every: u64) -> bool {
        if tick < self.next_probe.max(self.next_ask) {
            return false;
        }
        self.next_probe = tick + every;
        true
    }

    /// The sampler paused: every clock is read at the first tick after.
    pub(super) fn reset_checks(&mut self) {
        self.check_every = 1;
        self.next_check = 0;
    }
}

/// What a read of a thread's CPU clock tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Clock {
    /// The clock is gone: the thread exited.
    Gone,
    /// It went back: the id now names another thread.
    Recycled,
    /// It moved more than the slack since the last read: the thread ran.
    Ran,
    /// It stayed (within the slack): the thread did not run.
    Stayed,
}

/// Classifies a read `now` of a thread's CPU clock, last read as `seen`.
pub(super) fn clock(seen: u64, now: Option<u64>, slack_ns: u64) -> Clock {
    match now {
        None => Clock::Gone,
        Some(now) if now < seen => Clock::Recycled,
        Some(now) if now - seen > slack_ns => Clock::Ran,
        Some(_) => Clock::Stayed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(a: u64) -> Arc<[u64]> {
        Arc::from(&[a][..])
    }

    #[test]
    fn a_thread_read_waiting_files_its_fills_under_its_request_once_verified() {
        let mut w = Whereabouts::default();
        assert!(!w.is_current());
        // Answered a signal: current, not verified (filed under no request).
        assert_eq!(w.found_waiting(stack(1), 7, false, 1), Answer::New);
        let p = w.fill_place();
        assert_eq!(
            (p.stack.as_deref(), p.context, p.known),
            (Some(&[1][..]), 0, true)
        );
        // Its clock stayed: verified, filed under request 7.
        w.stayed_off(2);
        assert_eq!(w.fill_place().context, 7);
        // Read while blocked, same place: verified at once.
        let mut w = Whereabouts::default();
        w.found_waiting(stack(1), 7, true, 1);
        assert_eq!(w.found_waiting(stack(1), 7, true, 1), Answer::Same);
        assert_eq!(w.fill_place().context, 7);
        // It ran since: the place is a guess, its request not claimed.
        w.ran();
        let p = w.fill_place();
        assert_eq!((p.context, p.known), (0, false));
        // Not asked again (it gave the same answer): taken to wait there.
        w.assume_waiting(3);
        assert!(w.is_current());
    }

    #[test]
    fn a_preempted_thread_waits_for_a_cpu_in_the_request_it_publishes() {
        let mut w = Whereabouts::default();
        w.found_waiting(stack(1), 0, true, 1);
        w.found_preempted(5);
        let p = w.fill_place();
        assert_eq!(
            (p.stack.as_deref(), p.context, p.known),
            (Some(&[crate::frames::WAITING_FOR_CPU_FRAME][..]), 5, true)
        );
        assert!(w.known().waiting.is_none());
        assert_eq!(w.known().preempted, Some(5));
        // Outside any request.
        w.found_preempted(0);
        assert_eq!(w.fill_place().context, 0);
        // It ran since: not known where it stands.
        w.ran_uncaptured();
        assert!(!w.is_current());
        assert_eq!(w.known().preempted, None);
    }

    #[test]
    fn a_thread_that_ran_without_a_capture_is_not_shown_in_its_latest_capture() {
        // Never seen waiting: the period shows that no stack was captured,
        // not the latest capture (its code may have moved on).
        let mut w = Whereabouts::default();
        w.ran_uncaptured();
        let p = w.fill_place();
        assert_eq!(
            (p.stack.as_deref(), p.context, p.known),
            (Some(&[crate::frames::UNCAPTURED_FRAME][..]), 0, false)
        );
        // Seen waiting once: its place is not known now, its last wait
        // the guess (which the kernel's counts correct).
        w.found_waiting(stack(1), 0, true, 1);
        w.ran_uncaptured();
        assert!(!w.is_current());
        assert_eq!(w.fill_place().stack.as_deref(), Some(&[1][..]));
    }

    #[test]
    fn an_unanswered_signal_is_given_up_on_and_not_sent_again() {
        let t0 = Instant::now();
        let after = Duration::from_millis(500);
        let mut a = Asking::default();
        assert_eq!(a.check(t0, after), Awaited::Nothing);
        a.sent(t0, false);
        assert!(a.asks_where());
        assert_eq!(
            a.check(t0 + Duration::from_millis(10), after),
            Awaited::Pending
        );
        assert_eq!(a.check(t0 + after, after), Awaited::GaveUp);
        assert!(a.is_unresponsive());
        assert_eq!(a.check(t0 + after, after), Awaited::Nothing);
        // Any capture proves it takes the signal again.
        assert!(a.answered().is_none());
        assert!(!a.is_unresponsive());
        a.sent(t0, true);
        assert!(!a.asks_where());
        assert!(a.answered().is_some_and(|r| r.as_sample));
    }

    #[test]
    fn the_same_answer_means_asking_less_often() {
        let mut s = Schedule::default();
        assert!(s.ask_due(0));
        s.answered(Answer::Same, 10, 8);
        assert_eq!((s.ask_every, s.next_ask), (2, 12));
        s.answered(Answer::Same, 12, 8);
        s.answered(Answer::Same, 16, 8);
        s.answered(Answer::Same, 24, 8);
        assert_eq!((s.ask_every, s.next_ask), (8, 32));
        s.answered(Answer::New, 30, 8);
        assert_eq!((s.ask_every, s.next_ask), (1, 31));
        // A thread that keeps running is probed every `every` periods, and
        // never before it may be asked.
        let mut s = Schedule::default();
        assert!(s.probe(0, 10));
        assert!(!s.probe(5, 10));
        s.answered(Answer::Same, 9, 64);
        assert!(!s.probe(10, 10));
        assert!(s.probe(11, 10));
    }

    #[test]
    fn a_parked_thread_has_its_clock_read_less_often() {
        let mut s = Schedule::default();
        s.ran(4);
        assert!(!s.check_due(4) && s.check_due(5));
        for _ in 0..10 {
            s.stayed_off(16);
        }
        assert_eq!(s.check_every, 16);
        s.ran(40);
        assert_eq!(s.check_every, 1);
    }

    #[test]
    fn a_clock_going_back_is_a_recycled_thread_id() {
        assert_eq!(clock(1_000, None, 50), Clock::Gone);
        assert_eq!(clock(1_000, Some(900), 50), Clock::Recycled);
        assert_eq!(clock(1_000, Some(1_040), 50), Clock::Stayed);
        assert_eq!(clock(1_000, Some(1_051), 50), Clock::Ran);
    }
}
