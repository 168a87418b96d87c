//! What a blocking poll was doing, from its thread's samples during it:
//! the kind of block, the culprit and the stack that shows it. Pure: the
//! function names come through [`Names`], so the rules are unit-tested
//! without a sampler.
//!
//! A sample of the poll is one of:
//!
//! - a capture of running code (a CPU-time timer fired: the thread ran),
//!   or a sample with the stack of one of the poll's captures (a stand-in
//!   or a fill of a thread that ran through): **on the CPU**;
//! - `(waiting for a CPU)` or `(running: no stack captured in time)`: on
//!   the CPU, or runnable, but where is not known;
//! - a fill with a stack none of the poll's captures has: the stack the
//!   sampler read while the thread was blocked in a system call. It is
//!   **waiting on a lock** when a frame of it is a lock's or a condition
//!   variable's wait, or a parked thread's (`Mutex`, `RwLock`, `Condvar`,
//!   `parking_lot`, a futex wait, `pthread_mutex_lock`, `Thread::park`:
//!   a channel's receive), and otherwise **blocked in the
//!   kernel** in the call its innermost named frame makes (`read`,
//!   `clock_nanosleep`, …);
//! - `(waiting: where not read in time)`: blocked, where not known.
//!
//! What was seen decides: the poll was on the CPU if it has more
//! captures than stacks read while blocked (a blocked thread is captured
//! now and then as it wakes; a CPU loop is never found blocked, so a tie
//! goes to the wait). Without either, the inferred samples decide (a
//! capture's stack and the runnable ones against the waits not read). The
//! culprit is the innermost frame of the application (not a synthetic frame, not
//! matched by the README's stack-trace rules, named), the most common
//! among that kind's samples; the stack shown is the most common stack of
//! those with that culprit.

use std::collections::HashMap;
use std::sync::Arc;

use crate::frames::{
    UNCAPTURED_FRAME, WAITING_FOR_CPU_FRAME, WAITING_UNREAD_FRAME, synthetic_frame,
};

/// How a poll blocked its worker.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// Running (or runnable) on a CPU: a CPU-bound loop.
    Cpu,
    /// Blocked in the kernel in this call (`read`, `clock_nanosleep`, …).
    Syscall(Arc<str>),
    /// Waiting on a lock (or a condition variable, a parked thread).
    Lock,
    /// No sample of the poll says.
    Unknown,
}

impl Kind {
    /// The kind as the fingerprint and the `blocking.kind` tag carry it.
    pub(crate) fn label(&self) -> String {
        match self {
            Kind::Cpu => "cpu".into(),
            Kind::Syscall(call) => format!("syscall:{call}"),
            Kind::Lock => "lock".into(),
            Kind::Unknown => "unknown".into(),
        }
    }

    /// How the event's title says it.
    pub(crate) fn phrase(&self) -> String {
        match self {
            Kind::Cpu => "on the CPU".into(),
            Kind::Syscall(call) => format!("in the kernel in `{call}`"),
            Kind::Lock => "waiting on a lock".into(),
            Kind::Unknown => "(where not known)".into(),
        }
    }
}

/// Function names and module paths of code addresses.
pub(crate) trait Names {
    /// The function at `addr`, when known.
    fn function(&mut self, addr: u64) -> Option<Arc<str>>;
    /// The path of the module `addr` lies in.
    fn module(&self, addr: u64) -> Option<&str>;
}

/// One sample of the poll's thread during the poll.
#[derive(Debug, Clone)]
pub(crate) struct PollSample {
    /// Leaf first.
    pub(crate) frames: Arc<[u64]>,
    /// A capture of running code (not a fill or a stand-in).
    pub(crate) captured: bool,
}

/// What the poll was doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub(crate) kind: Kind,
    /// The innermost application function, or a placeholder when no
    /// sample shows one.
    pub(crate) culprit: Arc<str>,
    /// The stack that shows it, leaf first (empty: none).
    pub(crate) stack: Arc<[u64]>,
}

/// The culprit when no sample of the poll has an application frame.
pub(crate) const NO_CULPRIT: &str = "(no application frame captured)";

/// The function-name prefixes the README's stack-trace rules mark `-app`
/// (`stack.function:std::* -app`, and `<std::*` for trait
/// implementations); `readme_rules_match` checks the two agree.
pub(crate) const NOT_APP_CRATES: &[&str] = &[
    "std",
    "core",
    "alloc",
    "tokio",
    "mio",
    "parking_lot",
    "parking_lot_core",
    "flume",
    "crossbeam_channel",
    "crossbeam_utils",
    "sentry",
    "sentry_core",
    "sentry_profiling",
];

/// Whether a frame of `function` in the module at `module` is the
/// application's, by the README's stack-trace rules.
pub(crate) fn in_app(function: &str, module: Option<&str>) -> bool {
    let f = function.strip_prefix('<').unwrap_or(function);
    let by_function = NOT_APP_CRATES
        .iter()
        .any(|c| f.strip_prefix(c).is_some_and(|rest| rest.starts_with("::")));
    if by_function {
        return false;
    }
    !module.is_some_and(|path| {
        let base = path.rsplit('/').next().unwrap_or(path);
        base.starts_with("libc.so")
            || base.starts_with("ld-linux")
            || path.starts_with("linux-vdso")
    })
}

/// Whether `function` is a lock's or a condition variable's wait.
fn is_lock_wait(function: &str) -> bool {
    const WAITS: &[&str] = &[
        "Mutex",
        "RwLock",
        "Condvar",
        "lock_contended",
        "parking_lot",
        "futex_wait",
        "futex_lock",
        "pthread_mutex_lock",
        "pthread_rwlock_",
        "pthread_cond_",
        "sem_wait",
        // A parked thread waits for another to unpark it: a channel's
        // receive, a `Once`, a condition built on `park`.
        "::park",
    ];
    WAITS.iter().any(|w| function.contains(w))
}

/// A C library's name for a system call wrapper, without its internal
/// prefixes: `__GI___clock_nanosleep` and `__clock_nanosleep` are
/// `clock_nanosleep`, `__libc_read` is `read`.
pub(crate) fn call_name(function: &str) -> &str {
    let f = function.trim_start_matches('_');
    let f = f
        .strip_prefix("GI_")
        .map_or(f, |r| r.trim_start_matches('_'));
    f.strip_prefix("libc_").unwrap_or(f)
}

/// How one sample reads.
enum Reading {
    /// A capture of running code.
    Captured,
    /// A fill or stand-in with a capture's stack: the thread ran through,
    /// or was preempted there.
    CaptureCopy,
    /// Runnable or running with no stack: votes only when nothing else
    /// does (a thread woken from its wait on a saturated machine waits
    /// for a CPU, which says nothing of what its code did).
    Runnable,
    Blocked {
        lock: bool,
        call: Option<Arc<str>>,
    },
    BlockedUnknown,
    Nothing,
}

/// What the samples of a poll say it was doing.
pub(crate) fn classify(samples: &[PollSample], names: &mut dyn Names) -> Verdict {
    let captured: Vec<&Arc<[u64]>> = samples
        .iter()
        .filter(|s| s.captured)
        .map(|s| &s.frames)
        .collect();
    let mut cpu = Vec::new();
    let mut copies = Vec::new();
    let mut blocked = Vec::new();
    let mut blocked_unknown = 0usize;
    let mut runnable = 0usize;
    for s in samples {
        match read(s, &captured, names) {
            Reading::Captured => cpu.push(s),
            Reading::CaptureCopy => copies.push(s),
            Reading::Runnable => runnable += 1,
            Reading::Blocked { lock, call } => blocked.push((s, lock, call)),
            Reading::BlockedUnknown => blocked_unknown += 1,
            Reading::Nothing => {}
        }
    }
    // What was seen (a capture of running code, a stack read while the
    // thread was blocked) decides; what was inferred only without it.
    let on_cpu = if !cpu.is_empty() || !blocked.is_empty() {
        cpu.len() > blocked.len()
    } else if copies.len() + runnable + blocked_unknown > 0 {
        copies.len() + runnable >= blocked_unknown
    } else {
        return Verdict {
            kind: Kind::Unknown,
            culprit: Arc::from(NO_CULPRIT),
            stack: Arc::from(&[][..]),
        };
    };
    if on_cpu {
        let stacks = cpu.iter().chain(&copies).map(|s| &s.frames);
        let (culprit, stack) = culprit_of(stacks, names);
        return Verdict {
            kind: Kind::Cpu,
            culprit,
            stack,
        };
    }
    let locks = blocked.iter().filter(|b| b.1).count();
    let kind = if locks * 2 >= blocked.len() && locks > 0 {
        Kind::Lock
    } else {
        let call = most_common(blocked.iter().filter(|b| !b.1).filter_map(|b| b.2.clone()))
            .unwrap_or_else(|| Arc::from("unknown"));
        Kind::Syscall(call)
    };
    let of_kind = blocked.iter().filter(|b| match &kind {
        Kind::Lock => b.1,
        Kind::Syscall(call) => !b.1 && b.2.as_ref().is_none_or(|c| c == call),
        _ => true,
    });
    let (culprit, stack) = culprit_of(of_kind.map(|b| &b.0.frames), names);
    Verdict {
        kind,
        culprit,
        stack,
    }
}

fn read(s: &PollSample, captured: &[&Arc<[u64]>], names: &mut dyn Names) -> Reading {
    let Some(&leaf) = s.frames.first() else {
        return Reading::Nothing;
    };
    match leaf {
        WAITING_FOR_CPU_FRAME | UNCAPTURED_FRAME => return Reading::Runnable,
        WAITING_UNREAD_FRAME => return Reading::BlockedUnknown,
        _ if synthetic_frame(leaf).is_some() => return Reading::Nothing,
        _ => {}
    }
    if s.captured {
        return Reading::Captured;
    }
    if captured.iter().any(|c| **c == s.frames) {
        return Reading::CaptureCopy;
    }
    let mut lock = false;
    let mut call = None;
    for &addr in s.frames.iter() {
        if synthetic_frame(addr).is_some() {
            continue;
        }
        let Some(f) = names.function(addr) else {
            continue;
        };
        if call.is_none() {
            call = Some(Arc::from(call_name(&f)));
        }
        if is_lock_wait(&f) {
            lock = true;
            break;
        }
        if in_app(&f, names.module(addr)) {
            // The application's own frames: what called into the wait.
            break;
        }
    }
    Reading::Blocked { lock, call }
}

/// The innermost application frame of `frames`, if any.
fn innermost_app(frames: &[u64], names: &mut dyn Names) -> Option<Arc<str>> {
    frames.iter().find_map(|&addr| {
        if synthetic_frame(addr).is_some() {
            return None;
        }
        let f = names.function(addr)?;
        in_app(&f, names.module(addr)).then_some(f)
    })
}

/// A stack with its innermost application function, if any.
type Culprited<'s> = (Option<Arc<str>>, &'s Arc<[u64]>);

/// The most common culprit of `stacks`, and the most common stack with it.
fn culprit_of<'s>(
    stacks: impl Iterator<Item = &'s Arc<[u64]>>,
    names: &mut dyn Names,
) -> (Arc<str>, Arc<[u64]>) {
    let with: Vec<Culprited<'_>> = stacks.map(|s| (innermost_app(s, names), s)).collect();
    let culprit = most_common(with.iter().filter_map(|(c, _)| c.clone()));
    let stack = most_common(
        with.iter()
            .filter(|(c, s)| *c == culprit && !s.is_empty())
            .map(|(_, s)| Arc::clone(s)),
    );
    (
        culprit.unwrap_or_else(|| Arc::from(NO_CULPRIT)),
        stack.unwrap_or_else(|| Arc::from(&[][..])),
    )
}

/// The most common item, the first seen among equals.
fn most_common<T: Eq + std::hash::Hash + Clone>(items: impl Iterator<Item = T>) -> Option<T> {
    let mut counts: HashMap<T, (usize, usize)> = HashMap::new();
    for (i, item) in items.enumerate() {
        counts.entry(item).or_insert((0, i)).0 += 1;
    }
    counts
        .into_iter()
        .max_by(|a, b| a.1.0.cmp(&b.1.0).then(b.1.1.cmp(&a.1.1)))
        .map(|(item, _)| item)
}

/// The short name of a function for a title: its last path segment that is
/// not a closure, without generic arguments (`my_app::items::stats_crunch`
/// is `stats_crunch`, `my_app::handler::{{closure}}` is `handler`).
pub(crate) fn short_name(function: &str) -> &str {
    let mut segments = Vec::new();
    let (mut depth, mut start, mut i) = (0usize, 0usize, 0usize);
    let bytes = function.as_bytes();
    while i < bytes.len() {
        match bytes[i] {
            b'<' => depth += 1,
            b'>' => depth = depth.saturating_sub(1),
            b':' if depth == 0 && bytes.get(i + 1) == Some(&b':') => {
                segments.push(&function[start..i]);
                start = i + 2;
                i += 1;
            }
            _ => {}
        }
        i += 1;
    }
    segments.push(&function[start..]);
    segments
        .iter()
        .rev()
        .map(|s| s.split('<').next().unwrap_or(s))
        .find(|s| !s.is_empty() && !s.starts_with('{'))
        .unwrap_or(function)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names of made-up addresses: 0x1000 + i is `functions[i]`; addresses
    /// from 0x9000 lie in libc.
    struct Fake(Vec<&'static str>);

    impl Names for Fake {
        fn function(&mut self, addr: u64) -> Option<Arc<str>> {
            let i = addr.checked_sub(0x1000)? as usize;
            self.0
                .get(i % 0x8000)
                .filter(|n| !n.is_empty())
                .map(|n| Arc::from(*n))
        }
        fn module(&self, addr: u64) -> Option<&str> {
            Some(if addr >= 0x9000 {
                "/usr/lib/x86_64-linux-gnu/libc.so.6"
            } else {
                "/srv/my-service"
            })
        }
    }

    fn names() -> Fake {
        Fake(vec![
            "my_service::items::stats_crunch",                     // 0x1000
            "my_service::items::handler::{{closure}}",             // 0x1001
            "<tokio::runtime::task::Harness<T,S>>::poll",          // 0x1002
            "std::thread::sleep",                                  // 0x1003
            "std::sys::sync::mutex::futex::Mutex::lock_contended", // 0x1004
            "std::sync::poison::mutex::Mutex<T>::lock",            // 0x1005
            "std::fs::read::inner",                                // 0x1006
            "my_service::export::build",                           // 0x1007
            "core::hint::black_box",                               // 0x1008
        ])
    }

    fn sample(frames: &[u64], captured: bool) -> PollSample {
        PollSample {
            frames: Arc::from(frames),
            captured,
        }
    }

    struct Libc(Fake);

    impl Names for Libc {
        fn function(&mut self, addr: u64) -> Option<Arc<str>> {
            match addr {
                0x9000 => Some(Arc::from("__GI___clock_nanosleep")),
                0x9001 => Some(Arc::from("read")),
                0x9002 => Some(Arc::from("syscall")),
                0x9003 => None,
                _ => self.0.function(addr),
            }
        }
        fn module(&self, addr: u64) -> Option<&str> {
            self.0.module(addr)
        }
    }

    #[test]
    fn a_cpu_loop_is_on_the_cpu_in_its_innermost_app_function() {
        let crunch = [0x1008, 0x1000, 0x1001, 0x1002];
        let samples = vec![
            sample(&crunch, true),
            sample(&crunch, true),
            // A fill of a thread that ran through: a capture's stack.
            sample(&crunch, false),
            sample(&[WAITING_FOR_CPU_FRAME], false),
            sample(&[0x1000, 0x1001, 0x1002], true),
        ];
        let v = classify(&samples, &mut names());
        assert_eq!(v.kind, Kind::Cpu);
        assert_eq!(&*v.culprit, "my_service::items::stats_crunch");
        assert_eq!(&*v.stack, &crunch[..]);
    }

    #[test]
    fn a_sleep_is_in_the_kernel_in_its_call() {
        let sleeping = [0x9000, 0x1003, 0x1007, 0x1001, 0x1002];
        let samples = vec![
            sample(&sleeping, false),
            sample(&sleeping, false),
            sample(&sleeping, false),
            // The poll's start, before the sleep.
            sample(&[0x1007, 0x1001, 0x1002], true),
        ];
        let v = classify(&samples, &mut Libc(names()));
        assert_eq!(v.kind, Kind::Syscall(Arc::from("clock_nanosleep")));
        assert_eq!(v.kind.label(), "syscall:clock_nanosleep");
        assert_eq!(&*v.culprit, "my_service::export::build");
        assert_eq!(&*v.stack, &sleeping[..]);
    }

    #[test]
    fn a_contended_mutex_is_a_lock_wait() {
        let waiting = [0x9002, 0x1004, 0x1005, 0x1000, 0x1001];
        let samples = vec![sample(&waiting, false), sample(&waiting, false)];
        let v = classify(&samples, &mut Libc(names()));
        assert_eq!(v.kind, Kind::Lock);
        assert_eq!(&*v.culprit, "my_service::items::stats_crunch");
    }

    #[test]
    fn waiting_for_a_cpu_after_the_wait_does_not_make_it_a_cpu_loop() {
        // Woken when the lock was released, on a saturated machine: the
        // thread waited for a CPU longer than it was seen blocked.
        let waiting = [0x9002, 0x1004, 0x1005, 0x1000, 0x1001];
        let mut samples = vec![sample(&waiting, false), sample(&waiting, false)];
        samples.extend((0..5).map(|_| sample(&[WAITING_FOR_CPU_FRAME], false)));
        let v = classify(&samples, &mut Libc(names()));
        assert_eq!(v.kind, Kind::Lock);
        // With nothing else, it was on a CPU (or wanted one).
        let only = [sample(&[WAITING_FOR_CPU_FRAME], false)];
        assert_eq!(classify(&only, &mut names()).kind, Kind::Cpu);
    }

    #[test]
    fn what_was_seen_decides_and_a_tie_goes_to_the_wait() {
        let reading = [0x9001, 0x1006, 0x1007];
        // One stack read while blocked, one capture as it woke, and more
        // inferred samples than either: the read decides.
        let samples = vec![
            sample(&reading, false),
            sample(&[0x1007], true),
            sample(&[0x1007], false),
            sample(&[0x1007], false),
            sample(&[WAITING_FOR_CPU_FRAME], false),
        ];
        let v = classify(&samples, &mut Libc(names()));
        assert_eq!(v.kind, Kind::Syscall(Arc::from("read")));
        assert_eq!(&*v.culprit, "my_service::export::build");
        // Nothing seen: waits not read against the runnable ones.
        let unread = [
            sample(&[WAITING_UNREAD_FRAME], false),
            sample(&[WAITING_UNREAD_FRAME], false),
            sample(&[WAITING_FOR_CPU_FRAME], false),
        ];
        let v = classify(&unread, &mut names());
        assert_eq!(v.kind, Kind::Syscall(Arc::from("unknown")));
        assert_eq!(&*v.culprit, NO_CULPRIT);
    }

    #[test]
    fn no_samples_no_culprit() {
        let v = classify(&[], &mut names());
        assert_eq!(v.kind, Kind::Unknown);
        assert_eq!(&*v.culprit, NO_CULPRIT);
        let only_libs = [sample(&[0x1008, 0x1002], true)];
        let v = classify(&only_libs, &mut names());
        assert_eq!(v.kind, Kind::Cpu);
        assert_eq!(&*v.culprit, NO_CULPRIT);
    }

    #[test]
    fn in_app_follows_the_rules() {
        assert!(!in_app("std::thread::sleep", None));
        assert!(!in_app(
            "<core::pin::Pin<P> as core::future::future::Future>::poll",
            None
        ));
        assert!(!in_app("tokio::runtime::park", None));
        assert!(!in_app("sentry_profiling::hooks::x", None));
        assert!(in_app("sentry_profiling_tracing::http::x", None));
        assert!(in_app("stdlib_like::x", None));
        assert!(in_app("my_service::x", Some("/srv/my-service")));
        assert!(!in_app("read", Some("/lib/x86_64-linux-gnu/libc.so.6")));
        assert!(!in_app("x", Some("/lib64/ld-linux-x86-64.so.2")));
        assert!(!in_app("__vdso_clock_gettime", Some("linux-vdso.so.1")));
    }

    /// The README's rules and [`NOT_APP_CRATES`] name the same crates, and
    /// the README's package rules are the three [`in_app`] applies.
    #[test]
    fn readme_rules_match() {
        let readme = include_str!("../../../README.md");
        let at = readme
            .find("Stack Trace Rules*")
            .expect("the rules' section");
        let block = readme[at..]
            .split("```text")
            .nth(1)
            .and_then(|b| b.split("```").next())
            .expect("the rules' block");
        let mut crates = Vec::new();
        let mut packages = Vec::new();
        for line in block.lines() {
            let mut words = line.split_whitespace();
            let (Some(m), Some("-app")) = (words.next(), words.next()) else {
                continue;
            };
            if let Some(f) = m.strip_prefix("stack.function:") {
                let c = f.trim_start_matches('<').trim_end_matches("::*");
                if !crates.contains(&c) {
                    crates.push(c);
                }
            } else if let Some(p) = m.strip_prefix("stack.package:") {
                packages.push(p);
            }
        }
        assert_eq!(crates, NOT_APP_CRATES);
        assert_eq!(packages, ["**/libc.so*", "**/ld-linux*", "linux-vdso*"]);
    }

    #[test]
    fn names_for_titles_and_calls() {
        assert_eq!(short_name("my_app::items::stats_crunch"), "stats_crunch");
        assert_eq!(short_name("my_app::handler::{{closure}}"), "handler");
        assert_eq!(
            short_name("<my_app::Foo<T> as core::ops::Fn>::call"),
            "call"
        );
        assert_eq!(short_name("crunch"), "crunch");
        assert_eq!(call_name("__GI___clock_nanosleep"), "clock_nanosleep");
        assert_eq!(call_name("__libc_read"), "read");
        assert_eq!(call_name("read"), "read");
    }
}
