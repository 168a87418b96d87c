//! A thread's time, one sampling period at a time: what each period a
//! sample stands for shows the thread doing, and the account of those
//! periods against what the kernel counted.
//!
//! Every sample of a thread stands for one period of its time (Sentry
//! weights a sample by the time to the next one of its thread, and the
//! ledger gives every period slot one): the period a sample of running
//! code stands for was spent on a CPU; a fill's was spent as its stack
//! shows: on a CPU with no stack of its own captured, runnable and waiting
//! for one, blocked where its stack shows, or not known (a wait whose place
//! was not read in time).
//!
//! The invariants, checked in debug builds:
//!
//! - a period's parts add up to the period ([`Period`]);
//! - over any interval from a reading of the kernel's counts on, the time
//!   shown waiting for a CPU because the kernel counted it never exceeds
//!   the run delay counted in that interval and counted before it but not
//!   shown yet (what the ledger's balance carries into it), by more than
//!   half a period (a fill shows a whole period once half of one is owed).
//!   Waits shown because the thread was *found* runnable are shown at once
//!   and paid back from the run delay counted later (see `balance.rs`), as
//!   are those of a period in a request's poll the counts do not cover yet
//!   (the thread was not blocked there).

/// What a thread spent one period doing, as its sample shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Spent {
    /// On a CPU: a capture, or `(running: no stack captured in time)`.
    OnCpu,
    /// Runnable, waiting for a CPU: counted by the kernel (`counted`), or
    /// found so at a look (or in a request's poll the counts do not cover
    /// yet), and paid back from the counts later.
    WaitingForCpu { counted: bool },
    /// Blocked, where its stack shows.
    Blocked,
    /// Not known: `(waiting: where not read in time)`.
    NotKnown,
}

impl Spent {
    /// What a fill showing `stack` stands for (`ran`: the stack shows
    /// running code; a wait it shows was found, not counted).
    pub(super) fn of_fill(stack: &[u64], ran: bool) -> Self {
        if ran {
            return Self::OnCpu;
        }
        match stack {
            [crate::frames::WAITING_FOR_CPU_FRAME] => Self::WaitingForCpu { counted: false },
            [crate::frames::UNCAPTURED_FRAME] => Self::OnCpu,
            [crate::frames::WAITING_UNREAD_FRAME] => Self::NotKnown,
            _ => Self::Blocked,
        }
    }
}

/// A span of a thread's time by its parts, ns.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Period {
    pub(super) on_cpu_ns: u64,
    pub(super) cpu_wait_ns: u64,
    pub(super) blocked_ns: u64,
    pub(super) unknown_ns: u64,
}

impl Period {
    /// A period of `period_ns` spent as `spent`.
    pub(super) fn whole(spent: Spent, period_ns: u64) -> Self {
        let mut p = Self::default();
        *match spent {
            Spent::OnCpu => &mut p.on_cpu_ns,
            Spent::WaitingForCpu { .. } => &mut p.cpu_wait_ns,
            Spent::Blocked => &mut p.blocked_ns,
            Spent::NotKnown => &mut p.unknown_ns,
        } = period_ns;
        debug_assert_eq!(p.len_ns(), period_ns, "a period's parts add up to it");
        p
    }

    /// The span between two readings of the kernel's counts, `span_ns`
    /// long, in which the kernel counted `cpu_ns` of CPU time and
    /// `run_delay_ns` of run delay: on a CPU for what it ran, waiting for
    /// one for what it waited, and the rest blocked or not known (the
    /// counts do not say which). The kernel counts a wait when it ends, so
    /// one that began before the span may be counted in it: what the span
    /// cannot hold is left out.
    pub(super) fn counted(span_ns: u64, cpu_ns: u64, run_delay_ns: u64) -> Self {
        let on_cpu_ns = cpu_ns.min(span_ns);
        let cpu_wait_ns = run_delay_ns.min(span_ns - on_cpu_ns);
        let p = Self {
            on_cpu_ns,
            cpu_wait_ns,
            blocked_ns: 0,
            unknown_ns: span_ns - on_cpu_ns - cpu_wait_ns,
        };
        debug_assert_eq!(p.len_ns(), span_ns, "a span's parts add up to it");
        p
    }

    /// How long it is: its parts added up.
    pub(super) fn len_ns(&self) -> u64 {
        self.on_cpu_ns + self.cpu_wait_ns + self.blocked_ns + self.unknown_ns
    }

    fn add(&mut self, other: &Self) {
        self.on_cpu_ns += other.on_cpu_ns;
        self.cpu_wait_ns += other.cpu_wait_ns;
        self.blocked_ns += other.blocked_ns;
        self.unknown_ns += other.unknown_ns;
    }
}

/// A thread's periods shown against the kernel's counts (see the module
/// doc).
#[derive(Debug, Default)]
pub(super) struct Account {
    /// The run delay the kernel counted over the thread's life, ns.
    run_delay_ns: u64,
    /// The spans between its readings by their parts, as the kernel
    /// counted them (see [`Period::counted`]).
    counted: Period,
    /// The periods its samples showed, by part.
    shown: Period,
    /// Of `shown.cpu_wait_ns`, the time shown because the kernel counted
    /// it.
    counted_wait_shown_ns: u64,
    /// The lowest, at any reading (and at the start), of the counted wait
    /// shown less the run delay counted, plus the run delay the balance
    /// carried on from that reading (see [`Account::read`]).
    low_ns: i64,
}

impl Account {
    /// The kernel counted `cpu_ns` of CPU time and `run_delay_ns` of run
    /// delay in the `span_ns` since the reading before; after it, the
    /// balance carries `carried_ns` of run delay counted and not shown
    /// yet.
    pub(super) fn read(
        &mut self,
        (span_ns, cpu_ns, run_delay_ns): (u64, u64, u64),
        carried_ns: u64,
    ) {
        self.counted
            .add(&Period::counted(span_ns, cpu_ns, run_delay_ns));
        self.run_delay_ns = self.run_delay_ns.saturating_add(run_delay_ns);
        let at_reading = self.margin_ns().saturating_add(ns(carried_ns));
        self.low_ns = self.low_ns.min(at_reading);
    }

    /// A sample showing a period of `period_ns` spent as `spent` left.
    pub(super) fn shown(&mut self, spent: Spent, period_ns: u64) {
        self.shown.add(&Period::whole(spent, period_ns));
        if spent == (Spent::WaitingForCpu { counted: true }) {
            self.counted_wait_shown_ns += period_ns;
            // Over the interval from the reading that set `low_ns` to now,
            // the counted wait shown exceeds the run delay counted in it
            // and carried into it by `margin - low`: the most over every
            // interval from a reading on.
            debug_assert!(
                self.margin_ns() - self.low_ns <= ns(period_ns / 2),
                "{} ns more shown waiting for a CPU than the run delay counted: {self:?}",
                self.margin_ns() - self.low_ns,
            );
        }
    }

    /// The counted wait shown less the run delay counted, over the
    /// thread's life.
    fn margin_ns(&self) -> i64 {
        ns(self.counted_wait_shown_ns) - ns(self.run_delay_ns)
    }

    /// The periods shown so far, by part, and the spans counted by the
    /// kernel, by part.
    #[cfg(test)]
    pub(super) fn so_far(&self) -> (Period, Period) {
        (self.shown, self.counted)
    }
}

fn ns(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 100;

    #[test]
    fn a_period_is_its_parts() {
        let p = Period::whole(Spent::WaitingForCpu { counted: true }, P);
        assert_eq!((p.cpu_wait_ns, p.len_ns()), (P, P));
        // Between two readings 300 apart: 100 ran, 150 waited for a CPU,
        // the rest blocked or not known; a wait longer than the span (it
        // began before) fills what is left of it.
        let c = Period::counted(300, 100, 150);
        assert_eq!((c.on_cpu_ns, c.cpu_wait_ns, c.unknown_ns), (100, 150, 50));
        let c = Period::counted(300, 100, 400);
        assert_eq!((c.on_cpu_ns, c.cpu_wait_ns, c.unknown_ns), (100, 200, 0));
    }

    #[test]
    fn the_wait_shown_from_counts_stays_within_what_was_counted() {
        let counted = Spent::WaitingForCpu { counted: true };
        let mut a = Account::default();
        // 230 counted, carried whole: two periods shown, and a third
        // (half a period owed rounds up).
        a.read((400, 0, 230), 230);
        a.shown(counted, P);
        a.shown(counted, P);
        // Waits found at a look are paid back, not checked here.
        a.shown(Spent::WaitingForCpu { counted: false }, P);
        a.shown(Spent::OnCpu, P);
        let (shown, by_kernel) = a.so_far();
        assert_eq!(
            (shown.cpu_wait_ns, shown.on_cpu_ns, shown.len_ns()),
            (300, 100, 400)
        );
        assert_eq!((by_kernel.cpu_wait_ns, by_kernel.unknown_ns), (230, 170));
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "more shown waiting for a CPU than the run delay counted")]
    fn a_wait_shown_beyond_the_run_delay_counted_is_caught() {
        let counted = Spent::WaitingForCpu { counted: true };
        let mut a = Account::default();
        a.read((100, 0, 100), 100);
        a.shown(counted, P);
        // A reading that carries nothing on: the next interval counted
        // nothing, and a wait shown in it is one too many.
        a.read((100, 0, 0), 0);
        a.shown(counted, P);
    }
}
