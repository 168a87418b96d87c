//! What the kernel counted of one thread that its samples do not show yet:
//! its run delay (runnable, waiting for a CPU) and its CPU time, from
//! `/proc/self/task/<tid>/schedstat` at each reading, against the periods
//! its samples of running code and its fills already show.
//!
//! The ledger (`ledger.rs`) joins three concerns: placement (`slots.rs`),
//! the held queue (`held.rs`), and this one, the balances that decide what a fill whose place is a guess shows: `(waiting
//! for a CPU)` for a period of counted run delay, `(running: no stack
//! captured in time)` for a period of counted CPU time no sample shows.
//!
//! The invariant, checked in debug builds: over the thread's life, the
//! time fills show waiting for a CPU *because the kernel counted it* never
//! exceeds the run delay counted, and the time they show running with no
//! stack never exceeds the CPU time counted, each by more than half a
//! period (a fill shows a whole period once half of one is owed). Fills
//! shown waiting because the thread was *found* runnable and not running
//! at a look are shown at once, and paid back from the run delay the
//! kernel counts later (at most [`MAX_OWED_PERIODS`] ahead). The thread's
//! account (`period.rs`) checks the stronger form for the waits: over any
//! interval from a reading on.

/// Most periods of fills a thread's ledger remembers having shown waiting
/// for a CPU, or running, before the kernel counted that time: a thread
/// found runnable and not running is shown waiting at once, and the kernel
/// adds the wait to its run delay only once it runs again.
const MAX_OWED_PERIODS: i64 = 16;

/// What a fill shows once settled against the balances (see
/// [`Balance::settle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Settled {
    /// What the fill would show anyway (its own stack).
    AsIs,
    /// `(waiting for a CPU)`, for a period of counted run delay.
    WaitingForCpu,
    /// `(waiting: where not read in time)`: a guessed running period the
    /// counts do not show running.
    WaitingUnread,
    /// `(waiting for a CPU)` in a request's poll that the counts do not
    /// explain yet: the thread was in the poll, so on a CPU or runnable
    /// (not blocked), the counts read so far are all shown already, and
    /// they are less behind on its run delay than on its CPU time.
    /// Like a wait found at a look, it is shown at once and paid back from
    /// the run delay counted later.
    WaitingInPoll,
    /// `(running: no stack captured in time)`, for a period of counted CPU
    /// time no sample shows.
    Uncaptured,
}

/// What a fill shows before it is settled against the balances (see
/// [`Balance::settle`]).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Guess {
    /// It already shows a wait for a CPU (found runnable).
    pub(super) waiting: bool,
    /// It shows running code: a stack that ran (`ran`), or else a single
    /// synthetic frame (a guess).
    pub(super) running: bool,
    pub(super) ran: bool,
    /// Its stack is a single synthetic frame.
    pub(super) synthetic: bool,
    /// It stands in a request's poll where the thread was not found
    /// blocked: it was on a CPU or runnable there.
    pub(super) in_poll: bool,
}

/// One reading of the kernel's counts of a thread.
#[derive(Debug, Clone, Copy)]
pub(super) struct Reading {
    /// When they were read (`CLOCK_REALTIME`, ns): they cover the fills up
    /// to then.
    pub(super) at_ns: u64,
    /// Whether the thread was last found waiting (blocked in the kernel):
    /// the time these counts cover began with that wait (see
    /// `Ledger::blocked_first`).
    pub(super) began_waiting: bool,
    /// The request the thread stands in now (0 for none).
    pub(super) lane_now: u64,
    /// Its CPU time and run delay counted since the reading before, ns;
    /// `None` at the first reading.
    pub(super) since: Option<(u64, u64)>,
}

/// A thread's balances (see the module doc).
#[derive(Debug, Default)]
pub(super) struct Balance {
    /// When the counts were last read (see [`Reading::at_ns`]).
    counted_to_ns: u64,
    /// See [`Reading::began_waiting`], at the latest reading.
    began_waiting: bool,
    /// Run delay counted that no fill shows yet, ns, less the fills that
    /// showed such a wait before the kernel counted it.
    cpu_wait_ns: i64,
    /// CPU time counted that no sample shows yet, ns, likewise.
    ran_ns: i64,
    /// Samples of running code queued since the counts were last read.
    running_since_read: u32,
    /// The request (lane) the thread stood in at the latest reading, or 0.
    lane_at_read: u64,
    /// Whether the counts are read for the thread at all: a fill of an
    /// unknown place shows running only where they say it ran.
    counted: bool,
    /// The request the thread stood in when the run delay not shown yet
    /// began to be counted (the reading before the one that counted it),
    /// or 0.
    wait_lane: u64,
    /// Totals over the thread's life, for the invariant (debug builds).
    #[cfg(debug_assertions)]
    totals: Totals,
}

/// What was counted and what was shown because it was counted, ns.
#[cfg(debug_assertions)]
#[derive(Debug, Default)]
struct Totals {
    run_delay: u64,
    cpu: u64,
    shown_waiting: u64,
    shown_uncaptured: u64,
}

impl Balance {
    /// A sample of running code was queued: it shows a period of CPU time.
    pub(super) fn ran_a_period(&mut self) {
        self.running_since_read = self.running_since_read.saturating_add(1);
    }

    /// The kernel's counts were read (see [`Reading`]); `held_fills` fills
    /// are held now.
    pub(super) fn read(&mut self, reading: Reading, period_ns: u64, held_fills: i64) {
        self.counted_to_ns = reading.at_ns;
        self.began_waiting = reading.began_waiting;
        match reading.since {
            Some((cpu_ns, run_delay_ns)) => self.counted(
                cpu_ns,
                run_delay_ns,
                period_ns,
                reading.lane_now,
                held_fills,
            ),
            None => self.counting_from_now(reading.lane_now),
        }
    }

    /// Records a reading at `at_ns` that counted nothing (for the tests'
    /// stories).
    #[cfg(test)]
    pub(super) fn was_read(&mut self, at_ns: u64, began_waiting: bool) {
        self.counted_to_ns = at_ns;
        self.began_waiting = began_waiting;
    }

    /// When the counts were last read: they cover the fills up to then.
    pub(super) fn counted_to_ns(&self) -> u64 {
        self.counted_to_ns
    }

    /// Whether the time the latest counts cover began with the thread
    /// found waiting.
    pub(super) fn began_waiting(&self) -> bool {
        self.began_waiting
    }

    /// The run delay counted that no fill shows yet, ns (0 if fills showed
    /// more, found waiting before the kernel counted it).
    pub(super) fn carried_wait_ns(&self) -> u64 {
        u64::try_from(self.cpu_wait_ns).unwrap_or(0)
    }

    /// The counts are read for the first time now: the samples of running
    /// code queued so far are not part of what the next count covers.
    fn counting_from_now(&mut self, lane_now: u64) {
        self.running_since_read = 0;
        self.lane_at_read = lane_now;
    }

    /// What the kernel counted since the previous reading: `cpu_ns` of CPU
    /// time and `run_delay_ns` runnable but waiting for a CPU, with
    /// `held_fills` fills held now; `lane_now` is the request the thread
    /// stands in now (0 for none). Neither balance is owed for more than
    /// the fills held now (and one) can show, so a time shows in the
    /// periods it was counted for, not in later ones.
    fn counted(
        &mut self,
        cpu_ns: u64,
        run_delay_ns: u64,
        period_ns: u64,
        lane_now: u64,
        held_fills: i64,
    ) {
        let period = period_ns.max(1) as i64;
        self.counted = true;
        if run_delay_ns > 0 {
            self.wait_lane = self.lane_at_read;
        } else if self.cpu_wait_ns < period / 2 {
            self.wait_lane = 0;
        }
        self.lane_at_read = lane_now;
        let most = (held_fills + 1) * period;
        let ns = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let shown = i64::from(std::mem::take(&mut self.running_since_read)) * period;
        self.cpu_wait_ns = self
            .cpu_wait_ns
            .saturating_add(ns(run_delay_ns))
            .clamp(-MAX_OWED_PERIODS * period, most);
        self.ran_ns = self
            .ran_ns
            .saturating_add(ns(cpu_ns))
            .saturating_sub(shown)
            .clamp(-MAX_OWED_PERIODS * period, most);
        #[cfg(debug_assertions)]
        {
            self.totals.run_delay = self.totals.run_delay.saturating_add(run_delay_ns);
            self.totals.cpu = self.totals.cpu.saturating_add(cpu_ns);
        }
    }

    /// Whether at least half a period of counted run delay is owed: a fill
    /// whose place is a guess may then leave, to show it.
    pub(super) fn owes_wait(&self, period_ns: u64) -> bool {
        self.cpu_wait_ns >= (period_ns / 2) as i64
    }

    /// How many periods the balances owe, both counted together (rounded).
    pub(super) fn owed_periods(&self, period_ns: u64) -> i64 {
        let period = period_ns.max(1) as i64;
        (self.ran_ns.max(0) + self.cpu_wait_ns.max(0) + period / 2) / period
    }

    /// The request a counted wait belongs to, for a fill filed under none
    /// (the request the thread waited in, never a parked thread).
    pub(super) fn wait_lane(&self) -> u64 {
        self.wait_lane
    }

    /// Settles one fill against the balances (`fill`: what it shows).
    /// Where both balances are owed, the larger goes first. `spare`:
    /// whether what they owe may be shown in this fill; not while fills
    /// held after it need all of it (see `Ledger::drain`), and the fill
    /// then shows what it would without the counts (a guess the counts
    /// left over: a wait whose place was not read). A guess in a request's
    /// poll is not such a wait while the balances are behind (the counts
    /// read so far are shown already, by waits found at a look and by
    /// captures, and do not cover it yet; the thread was not blocked in
    /// the poll): it shows the part they are least behind on, waiting for
    /// a CPU or running, paid back from what the kernel counts later.
    pub(super) fn settle(&mut self, fill: Guess, spare: bool, period_ns: u64) -> Settled {
        let Guess {
            waiting,
            running,
            ran,
            synthetic,
            in_poll,
        } = fill;
        let (period, half) = (period_ns.max(1) as i64, (period_ns / 2) as i64);
        let floor = -MAX_OWED_PERIODS * period;
        let owes_wait = spare && self.cpu_wait_ns >= half;
        let owes_cpu = spare && self.ran_ns >= half;
        let settled = if waiting {
            Settled::AsIs
        } else if owes_wait && self.cpu_wait_ns >= self.ran_ns {
            Settled::WaitingForCpu
        } else if running && !ran && self.counted && synthetic && !owes_cpu {
            if !in_poll || self.cpu_wait_ns.saturating_add(self.ran_ns) >= 0 {
                // A period its place was not known for (it ran since it
                // was last found), which the counts do not show running:
                // the thread was blocked, somewhere not read.
                Settled::WaitingUnread
            } else if self.cpu_wait_ns >= self.ran_ns {
                // In a request's poll (so not blocked), and the counts
                // read so far are all shown already (waits found at a
                // look, captures): this period is not counted yet.
                Settled::WaitingInPoll
            } else {
                Settled::AsIs
            }
        } else if running || !owes_cpu {
            Settled::AsIs
        } else {
            Settled::Uncaptured
        };
        let waited = waiting || matches!(settled, Settled::WaitingForCpu | Settled::WaitingInPoll);
        let shows_running = matches!(settled, Settled::Uncaptured)
            || (settled == Settled::AsIs && running && !waiting);
        if waited {
            self.cpu_wait_ns = (self.cpu_wait_ns - period).max(floor);
        }
        if shows_running {
            self.ran_ns = (self.ran_ns - period).max(floor);
        }
        #[cfg(debug_assertions)]
        self.check(settled, period_ns);
        settled
    }

    /// The invariant of the module doc.
    #[cfg(debug_assertions)]
    fn check(&mut self, settled: Settled, period_ns: u64) {
        let t = &mut self.totals;
        match settled {
            Settled::WaitingForCpu => t.shown_waiting += period_ns,
            Settled::Uncaptured => t.shown_uncaptured += period_ns,
            Settled::AsIs | Settled::WaitingUnread | Settled::WaitingInPoll => {}
        }
        debug_assert!(
            t.shown_waiting <= t.run_delay + period_ns / 2,
            "fills show {} ns waiting for a CPU from counts of {} ns",
            t.shown_waiting,
            t.run_delay
        );
        debug_assert!(
            t.shown_uncaptured <= t.cpu + period_ns / 2,
            "fills show {} ns running with no stack from counts of {} ns of CPU",
            t.shown_uncaptured,
            t.cpu
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 100;

    /// A fill outside any poll: `waiting`, `running`, `ran`, `synthetic`.
    fn g(waiting: bool, running: bool, ran: bool, synthetic: bool) -> Guess {
        Guess {
            waiting,
            running,
            ran,
            synthetic,
            in_poll: false,
        }
    }

    // A thread's story, one reading of its counts per line:
    //
    //   reading  run delay  CPU   held fills   fills settle as
    //   1        230        0     3            wait wait (a third owes 30 < 50: as is)
    //   2        0          0     1            as is
    #[test]
    fn counted_run_delay_is_shown_a_period_at_a_time_and_no_more() {
        let mut b = Balance::default();
        b.counted(0, 230, P, 0, 3);
        let shown: Vec<Settled> = (0..3)
            .map(|_| b.settle(g(false, false, false, true), true, P))
            .collect();
        assert_eq!(
            shown,
            vec![
                Settled::WaitingForCpu,
                Settled::WaitingForCpu,
                Settled::AsIs
            ]
        );
        b.counted(0, 0, P, 0, 1);
        assert_eq!(
            b.settle(g(false, false, false, true), true, P),
            Settled::AsIs
        );
    }

    // Found runnable at a look, a fill shows the wait at once (owed); the
    // kernel's later count of that wait shows nothing more.
    //
    //   look: runnable -> fill shows (waiting for a CPU), owes a period
    //   reading: run delay 100 -> pays it back; the next fill is as is
    #[test]
    fn a_wait_shown_before_it_was_counted_is_not_shown_twice() {
        let mut b = Balance::default();
        assert_eq!(
            b.settle(g(true, false, false, true), true, P),
            Settled::AsIs
        );
        b.counted(0, 100, P, 0, 1);
        assert_eq!(
            b.settle(g(false, false, false, true), true, P),
            Settled::AsIs
        );
    }

    // CPU time no capture shows becomes `(running: no stack captured in
    // time)`, less what captures showed:
    //
    //   two captures queued (two periods shown), then a reading of 430 ns
    //   of CPU: 230 owed -> two fills uncaptured, a third as is
    #[test]
    fn counted_cpu_no_capture_shows_is_shown_without_a_stack() {
        let mut b = Balance::default();
        b.counting_from_now(0);
        b.ran_a_period();
        b.ran_a_period();
        b.counted(430, 0, P, 0, 3);
        let shown: Vec<Settled> = (0..3)
            .map(|_| b.settle(g(false, false, false, false), true, P))
            .collect();
        assert_eq!(
            shown,
            vec![Settled::Uncaptured, Settled::Uncaptured, Settled::AsIs]
        );
    }

    // A guessed running period with no CPU counted was a wait not read.
    #[test]
    fn a_guess_of_running_the_counts_deny_is_a_wait_not_read() {
        let mut b = Balance::default();
        b.counted(0, 0, P, 0, 1);
        assert_eq!(
            b.settle(g(false, true, false, true), true, P),
            Settled::WaitingUnread
        );
        // Before any count is read, a guess stands.
        let mut fresh = Balance::default();
        assert_eq!(
            fresh.settle(g(false, true, false, true), true, P),
            Settled::AsIs
        );
    }

    // Owed a period of each, kept for fills held after this one: it shows
    // what it would without the counts, and the balances stay owed.
    #[test]
    fn what_is_owed_is_kept_for_the_fills_it_is_spared_for() {
        let mut b = Balance::default();
        b.counted(100, 100, P, 0, 2);
        let guess = g(false, true, false, true);
        assert_eq!(b.settle(guess, false, P), Settled::WaitingUnread);
        assert_eq!(
            b.settle(g(false, false, false, true), false, P),
            Settled::AsIs
        );
        assert_eq!(b.settle(guess, true, P), Settled::WaitingForCpu);
        // The guess of running stands for the CPU time owed; then nothing
        // is owed.
        assert_eq!(b.settle(guess, true, P), Settled::AsIs);
        assert_eq!(b.settle(guess, true, P), Settled::WaitingUnread);
    }

    // A guess of running in a request's poll while the balances are behind
    // (a wait found at a look, shown before the kernel counted it): the
    // thread was not blocked in the poll, and the counts do not cover the
    // period yet, so it shows the part the balances are least behind on,
    // and owes it. Not behind, the counts covered it: a wait not read.
    #[test]
    fn a_guess_in_a_poll_the_counts_do_not_cover_yet_waited_or_ran() {
        let mut b = Balance::default();
        b.counted(0, 0, P, 0, 1);
        let in_poll = Guess {
            in_poll: true,
            ..g(false, true, false, true)
        };
        assert_eq!(b.settle(in_poll, true, P), Settled::WaitingUnread);
        let found = g(true, false, false, true);
        assert_eq!(b.settle(found, true, P), Settled::AsIs);
        assert_eq!(b.settle(in_poll, true, P), Settled::AsIs);
        assert_eq!(b.settle(in_poll, true, P), Settled::WaitingInPoll);
        // The kernel counts the waits: paid back, nothing more shown.
        b.counted(0, 200, P, 0, 1);
        assert_eq!(
            b.settle(g(false, false, false, true), true, P),
            Settled::AsIs
        );
    }

    // The wait counted at a reading outside the request is the request's
    // the thread stood in at the reading before.
    #[test]
    fn a_wait_belongs_to_the_request_of_the_reading_before() {
        let mut b = Balance::default();
        b.counting_from_now(7);
        b.counted(0, 100, P, 0, 1);
        assert_eq!(b.wait_lane(), 7);
        b.counted(0, 100, P, 0, 1);
        assert_eq!(b.wait_lane(), 0);
    }
}
