//! System calls the kernel refuses the sampler, and what it says about
//! them.
//!
//! A seccomp policy (locked-down container profiles have them) can make any
//! of the sampler's system calls fail with `EPERM` (or `ENOSYS`, `EACCES`).
//! Three of its ways of learning stacks depend on one call each:
//!
//! - CPU-time timers (`timer_create`, `timer_settime`): a running thread
//!   samples itself. Without them the sampler thread signals the threads it
//!   sees running;
//! - signals from the sampler thread (`rt_tgsigqueueinfo`), for threads
//!   without a timer. Without signals or timers, no stack of running code
//!   can be captured at all: a request's lane shows only synthetic frames;
//! - `process_vm_readv`, which copies the stack of a thread blocked in the
//!   kernel. Without it the sampler reads `/proc/self/mem`.
//!
//! The sampler thread probes the three when it starts (see `sys::probe_*`),
//! and notes any call that starts failing later. Once refused, a call is not
//! made again (a seccomp filter cannot be removed). Each refused call is
//! counted, and the process says what happened on stderr once: one warning
//! when running code cannot be sampled any more, naming every call refused;
//! otherwise one notice per way of sampling lost, worded apart from the
//! warning, saying what still works. The rules are pure ([`Denials`]); the
//! sampler thread makes the calls and prints.

use std::sync::Mutex;

/// A way of learning stacks that one system call provides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Capability {
    /// Per-thread CPU-time timers (`timer_create`, `timer_settime`).
    Timers,
    /// Signals from the sampler thread (`rt_tgsigqueueinfo`).
    Signals,
    /// Copying blocked threads' stacks with `process_vm_readv`.
    VmRead,
}

/// A system call the kernel refused, and its `errno`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Refusal {
    pub(super) call: &'static str,
    pub(super) errno: i32,
}

/// Whether `errno` says the call is forbidden (a seccomp policy, a kernel
/// built without it), not that it failed this once.
pub(super) fn is_denial(errno: i32) -> bool {
    matches!(errno, libc::EPERM | libc::EACCES | libc::ENOSYS)
}

/// An `errno` by its name.
fn errno_name(errno: i32) -> String {
    match errno {
        libc::EPERM => "EPERM".into(),
        libc::EACCES => "EACCES".into(),
        libc::ENOSYS => "ENOSYS".into(),
        libc::EINVAL => "EINVAL".into(),
        libc::EFAULT => "EFAULT".into(),
        libc::EAGAIN => "EAGAIN".into(),
        e => format!("errno {e}"),
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.call, errno_name(self.errno))
    }
}

/// What the sampler thread has been refused so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Denials {
    /// Whether the sampler uses CPU-time timers at all (`cpu_timers`).
    pub(super) cpu_timers: bool,
    pub(super) timers: Option<Refusal>,
    pub(super) signals: Option<Refusal>,
    pub(super) vm_read: Option<Refusal>,
    /// Whether `/proc/self/mem` can be read (looked at once `process_vm_readv`
    /// is refused).
    pub(super) proc_mem_readable: bool,
    /// Whether the probe at the sampler's start is done: a refusal recorded
    /// since came while the sampler ran.
    pub(super) started: bool,
    /// Whether timers were refused while the sampler ran: the timers of
    /// threads bound before still fire, until they must be set again.
    pub(super) timers_late: bool,
}

/// What was said on stderr so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Reported {
    pub(super) timers: bool,
    pub(super) signals: bool,
    pub(super) vm_read: bool,
    pub(super) cannot_sample: bool,
}

/// What this process said on stderr so far: a refused call stays refused
/// for every sampler the process starts, and is said once.
static REPORTED: Mutex<Reported> = Mutex::new(Reported {
    timers: false,
    signals: false,
    vm_read: false,
    cannot_sample: false,
});

impl Denials {
    /// No refusal yet.
    pub(super) fn new(cpu_timers: bool) -> Self {
        Self {
            cpu_timers,
            ..Self::default()
        }
    }

    /// The refusal recorded for `cap`.
    pub(super) fn get(&self, cap: Capability) -> Option<Refusal> {
        match cap {
            Capability::Timers => self.timers,
            Capability::Signals => self.signals,
            Capability::VmRead => self.vm_read,
        }
    }

    /// Records `refusal` for `cap`, unless one is recorded already; returns
    /// whether it is new.
    pub(super) fn record(&mut self, cap: Capability, refusal: Refusal) -> bool {
        let entry = match cap {
            Capability::Timers => &mut self.timers,
            Capability::Signals => &mut self.signals,
            Capability::VmRead => &mut self.vm_read,
        };
        if entry.is_some() {
            return false;
        }
        *entry = Some(refusal);
        self.timers_late |= cap == Capability::Timers && self.started;
        true
    }

    /// Whether no stack of running code can be captured: the sampler
    /// thread cannot signal threads, and it has no CPU-time timers either
    /// (refused, or turned off).
    pub(super) fn cannot_sample(&self) -> bool {
        self.signals.is_some() && (self.timers.is_some() || !self.cpu_timers)
    }

    /// What blocked threads' stacks are still read with.
    fn blocked_stacks(&self) -> String {
        match self.vm_read {
            None => "where threads blocked in the kernel wait is still read".into(),
            Some(r) if self.proc_mem_readable => format!(
                "where threads blocked in the kernel wait is still read, from /proc/self/mem ({r})"
            ),
            Some(r) => format!(
                "where threads blocked in the kernel wait cannot be read either ({r}, /proc/self/mem unreadable)"
            ),
        }
    }

    /// The lines to print now (without the crate's prefix), given what was
    /// said before, which it updates: the warning once running code cannot
    /// be sampled, else a notice for each refusal not told yet.
    pub(super) fn messages(&self, reported: &mut Reported) -> Vec<String> {
        let mut out = Vec::new();
        if self.cannot_sample() {
            if !reported.cannot_sample {
                let timers = match self.timers {
                    Some(r) => format!("CPU timers denied ({r})"),
                    None => "CPU timers are off (`cpu_timers(false)`)".into(),
                };
                let signals = self.signals.map(|r| r.to_string()).unwrap_or_default();
                let lost = if self.timers_late {
                    "no stack of running code can be captured any more, but on threads whose CPU timer was set before, until it must be set again"
                } else {
                    "no stack of running code can be captured"
                };
                out.push(format!(
                    "cannot sample: {lost}: {timers}, and cannot signal threads ({signals}); {}; requests show only synthetic frames such as \"(running: no stack captured in time)\"",
                    self.blocked_stacks()
                ));
            }
            *reported = Reported {
                timers: true,
                signals: true,
                vm_read: reported.vm_read || self.vm_read.is_some(),
                cannot_sample: true,
            };
            return out;
        }
        if let (Some(r), false) = (self.timers, reported.timers) {
            out.push(format!(
                "sampling degraded: CPU timers denied ({r}): threads are signalled by the sampler thread instead (rt_tgsigqueueinfo); stacks are still captured"
            ));
            reported.timers = true;
        }
        if let (Some(r), false) = (self.signals, reported.signals) {
            out.push(format!(
                "sampling degraded: cannot signal threads ({r}): running threads are still sampled by their CPU timers, but a thread whose timer cannot be created is not"
            ));
            reported.signals = true;
        }
        if let (Some(r), false) = (self.vm_read, reported.vm_read) {
            let how = if self.proc_mem_readable {
                "the stacks of threads blocked in the kernel are read from /proc/self/mem instead; stacks are still captured"
            } else {
                "/proc/self/mem is unreadable too, so where threads blocked in the kernel wait is not read; running code is still sampled"
            };
            out.push(format!(
                "sampling degraded: {} denied ({}): {how}",
                r.call,
                errno_name(r.errno)
            ));
            reported.vm_read = true;
        }
        out
    }

    /// Prints what this process has not said yet (see
    /// [`Denials::messages`]), from the sampler thread.
    pub(super) fn report(&self) {
        let lines = {
            let mut reported = REPORTED.lock().unwrap_or_else(|e| e.into_inner());
            self.messages(&mut reported)
        };
        for line in lines {
            eprintln!("sentry-profiling: {line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EPERM_CREATE: Refusal = Refusal {
        call: "timer_create",
        errno: libc::EPERM,
    };
    const EPERM_SIGNAL: Refusal = Refusal {
        call: "rt_tgsigqueueinfo",
        errno: libc::EPERM,
    };
    const ENOSYS_VM: Refusal = Refusal {
        call: "process_vm_readv",
        errno: libc::ENOSYS,
    };

    #[test]
    fn only_refusals_count_as_denials() {
        assert!(is_denial(libc::EPERM) && is_denial(libc::ENOSYS) && is_denial(libc::EACCES));
        assert!(!is_denial(libc::EAGAIN) && !is_denial(libc::ESRCH) && !is_denial(libc::EFAULT));
    }

    #[test]
    fn nothing_refused_says_nothing() {
        let mut reported = Reported::default();
        assert!(Denials::new(true).messages(&mut reported).is_empty());
        assert_eq!(reported, Reported::default());
    }

    #[test]
    fn each_degradation_is_a_notice_told_once() {
        let mut d = Denials::new(true);
        d.proc_mem_readable = true;
        let mut reported = Reported::default();
        assert!(d.record(Capability::Timers, EPERM_CREATE));
        assert!(!d.record(
            Capability::Timers,
            Refusal {
                call: "timer_settime",
                errno: libc::EPERM
            }
        ));
        let lines = d.messages(&mut reported);
        assert_eq!(
            lines,
            [
                "sampling degraded: CPU timers denied (timer_create: EPERM): threads are signalled by the sampler thread instead (rt_tgsigqueueinfo); stacks are still captured"
            ]
        );
        assert!(d.messages(&mut reported).is_empty(), "told once");
        d.record(Capability::VmRead, ENOSYS_VM);
        let lines = d.messages(&mut reported);
        assert_eq!(lines.len(), 1);
        assert!(
            lines[0].starts_with("sampling degraded: process_vm_readv denied (ENOSYS): the stacks of threads blocked in the kernel are read from /proc/self/mem"),
            "{lines:?}"
        );
    }

    #[test]
    fn signals_refused_with_timers_is_a_notice() {
        let mut d = Denials::new(true);
        d.record(Capability::Signals, EPERM_SIGNAL);
        assert!(!d.cannot_sample());
        let lines = d.messages(&mut Reported::default());
        assert_eq!(lines.len(), 1);
        assert!(lines[0].starts_with(
            "sampling degraded: cannot signal threads (rt_tgsigqueueinfo: EPERM): running threads are still sampled by their CPU timers"
        ));
    }

    #[test]
    fn everything_refused_is_one_warning_naming_each_call() {
        let mut d = Denials::new(true);
        d.record(Capability::Timers, EPERM_CREATE);
        d.record(Capability::Signals, EPERM_SIGNAL);
        d.record(Capability::VmRead, ENOSYS_VM);
        d.proc_mem_readable = true;
        let mut reported = Reported::default();
        let lines = d.messages(&mut reported);
        assert_eq!(
            lines,
            [
                "cannot sample: no stack of running code can be captured: CPU timers denied (timer_create: EPERM), and cannot signal threads (rt_tgsigqueueinfo: EPERM); where threads blocked in the kernel wait is still read, from /proc/self/mem (process_vm_readv: ENOSYS); requests show only synthetic frames such as \"(running: no stack captured in time)\""
            ]
        );
        assert!(d.messages(&mut reported).is_empty());
    }

    #[test]
    fn losing_signals_after_timers_turns_the_notice_into_the_warning() {
        let mut d = Denials::new(true);
        let mut reported = Reported::default();
        d.record(Capability::Timers, EPERM_CREATE);
        assert!(d.messages(&mut reported)[0].starts_with("sampling degraded: CPU timers"));
        d.record(Capability::Signals, EPERM_SIGNAL);
        let lines = d.messages(&mut reported);
        assert_eq!(lines.len(), 1);
        assert!(lines[0].starts_with("cannot sample: "), "{lines:?}");
        assert!(lines[0].contains("where threads blocked in the kernel wait is still read;"));
        assert!(d.messages(&mut reported).is_empty());
    }

    #[test]
    fn timers_refused_while_running_leave_the_timers_set_before() {
        let mut d = Denials::new(true);
        d.started = true;
        d.record(Capability::Timers, EPERM_CREATE);
        d.record(Capability::Signals, EPERM_SIGNAL);
        let lines = d.messages(&mut Reported::default());
        assert!(
            lines[0].starts_with(
                "cannot sample: no stack of running code can be captured any more, but on threads whose CPU timer was set before, until it must be set again: CPU timers denied (timer_create: EPERM), and cannot signal threads"
            ),
            "{lines:?}"
        );
    }

    #[test]
    fn signals_refused_without_timers_cannot_sample() {
        let mut d = Denials::new(false);
        d.record(Capability::Signals, EPERM_SIGNAL);
        assert!(d.cannot_sample());
        let lines = d.messages(&mut Reported::default());
        assert!(
            lines[0].contains("CPU timers are off (`cpu_timers(false)`)"),
            "{lines:?}"
        );
    }
}
