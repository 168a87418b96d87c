//! Threads of this process, as the kernel lists them: ids, names, identity
//! (start time) and per-thread CPU clocks.

use std::io;
use std::sync::atomic::{AtomicI32, Ordering};

/// What `/proc/self/task/<tid>/stat` says about one thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ThreadInfo {
    /// Kernel thread id.
    pub(crate) tid: i32,
    /// The thread's name (`comm`, at most 15 bytes).
    pub(crate) name: String,
    /// Start time in clock ticks since boot; with `tid` it identifies a
    /// thread even after its id is recycled.
    pub(crate) start_time: u64,
}

thread_local! {
    /// The calling thread's kernel id once asked for (0: not yet). A
    /// `const`-initialised atomic with no destructor, so reading and
    /// filling it from the signal handler is a plain TLS access (see
    /// [`kept_tid`]).
    static OWN_TID: AtomicI32 = const { AtomicI32::new(0) };
}

/// The calling thread's kernel id: one `gettid` system call on each thread,
/// a thread-local read after it. The tracing layer asks for it at every
/// request it files under an OS thread, where the system call cost more
/// than the rest of the tagging.
///
/// The child of a `fork()` runs on a thread with a new id but a copy of
/// the forking thread's thread-locals: there it asks the kernel every time.
/// The fork watcher is registered before an id is first kept here (the
/// signal handler keeps ids only once a sampler started, which registered
/// it), so every fork after that sets the child's flag.
#[inline]
pub(crate) fn current_tid() -> i32 {
    if super::in_forked_child() {
        return gettid();
    }
    let kept = OWN_TID.with(|t| t.load(Ordering::Relaxed));
    if kept != 0 {
        return kept;
    }
    super::watch_fork();
    kept_tid()
}

/// The calling thread's kept kernel id, asking the kernel the first time
/// on the thread. Async-signal-safe (a TLS access, and a `gettid` system
/// call once): the signal handler's way to [`current_tid`], which it cannot
/// take (registering the fork watcher is not async-signal-safe).
#[inline(always)]
pub(crate) fn kept_tid() -> i32 {
    OWN_TID.with(|t| {
        let kept = t.load(Ordering::Relaxed);
        if kept != 0 {
            return kept;
        }
        let tid = gettid();
        t.store(tid, Ordering::Relaxed);
        tid
    })
}

fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// The ids of every thread of this process, listed from `/proc/self/task`
/// kept open: each listing is a seek and a `getdents64` or two, where
/// `read_dir` opened the directory (a path walk), allocated an entry per
/// thread and closed it again, every 100 ms on the sampler thread.
#[derive(Debug, Default)]
pub(crate) struct TaskList {
    dir: Option<std::os::fd::OwnedFd>,
    buf: Vec<u8>,
}

/// Bytes of directory entries one `getdents64` call reads at most.
const DENTS_BUF: usize = 8 * 1024;

impl TaskList {
    /// Replaces `out` with the ids of the process's threads.
    pub(crate) fn read(&mut self, out: &mut Vec<i32>) -> io::Result<()> {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        out.clear();
        if self.dir.is_none() {
            let path = c"/proc/self/task";
            // SAFETY: `path` is a NUL-terminated string; the flags open a
            // directory read-only, closed on exec.
            let fd = unsafe {
                libc::open(
                    path.as_ptr(),
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
                )
            };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: `fd` was just opened and is owned by nothing else.
            self.dir = Some(unsafe { OwnedFd::from_raw_fd(fd) });
            self.buf = vec![0; DENTS_BUF];
        }
        let fd = self.dir.as_ref().map_or(-1, AsRawFd::as_raw_fd);
        // SAFETY: `fd` is the open directory above.
        if unsafe { libc::lseek(fd, 0, libc::SEEK_SET) } < 0 {
            let e = io::Error::last_os_error();
            self.dir = None;
            return Err(e);
        }
        loop {
            // SAFETY: `buf` is writable for its whole length, and the kernel
            // writes at most that many bytes into it.
            let n = unsafe {
                libc::syscall(
                    libc::SYS_getdents64,
                    fd,
                    self.buf.as_mut_ptr(),
                    self.buf.len(),
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                self.dir = None;
                return Err(e);
            }
            if n == 0 {
                return Ok(());
            }
            parse_dirents(&self.buf[..n as usize], out);
        }
    }
}

/// Appends the numeric names among `linux_dirent64` records (inode, offset,
/// record length, type, NUL-terminated name) to `out`.
fn parse_dirents(mut records: &[u8], out: &mut Vec<i32>) {
    const NAME_AT: usize = 19;
    while records.len() > NAME_AT {
        let len = usize::from(u16::from_ne_bytes([records[16], records[17]]));
        if len <= NAME_AT || len > records.len() {
            return;
        }
        let name = &records[NAME_AT..len];
        let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
        if let Some(tid) = std::str::from_utf8(name).ok().and_then(|s| s.parse().ok()) {
            out.push(tid);
        }
        records = &records[len..];
    }
}

/// Reads a thread's name and start time; `None` if it has exited.
pub(crate) fn read_thread_identity(tid: i32) -> Option<ThreadInfo> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    parse_stat(tid, &stat)
}

/// How long ago the thread `info` describes started, to the kernel's
/// clock-tick resolution (10 ms at the usual 100 ticks a second); `None`
/// when the clocks cannot be read.
pub(crate) fn thread_age(info: &ThreadInfo) -> Option<std::time::Duration> {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = u64::try_from(ticks).ok().filter(|&t| t > 0)?;
    // `starttime` counts from boot, suspended time included: the boot-time
    // clock (both in the process's time namespace).
    let now = clock_ns(libc::CLOCK_BOOTTIME)?;
    let started = info.start_time.checked_mul(1_000_000_000)? / ticks;
    Some(std::time::Duration::from_nanos(now.saturating_sub(started)))
}

fn parse_stat(tid: i32, stat: &str) -> Option<ThreadInfo> {
    // The name is in parentheses and may itself contain ')' or spaces.
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_owned();
    // Fields after the name start at field 3 (state); starttime is field 22.
    let start_time = stat
        .get(close + 1..)?
        .split_whitespace()
        .nth(22 - 3)?
        .parse()
        .ok()?;
    Some(ThreadInfo {
        tid,
        name,
        start_time,
    })
}

/// Reads a clock in nanoseconds; `None` if the clock is invalid (a thread
/// CPU clock of an exited thread). `clock_gettime` is async-signal-safe (and
/// served by the vDSO for the real-time and monotonic clocks), so the signal
/// handler uses this too.
#[inline(always)]
pub(crate) fn clock_ns(clock: libc::clockid_t) -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes to a local timespec; an invalid clock id
    // is reported as an error, not undefined behaviour.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    (rc == 0).then(|| {
        (ts.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec as u64)
    })
}

/// CPU time consumed so far by thread `tid` of this process, in nanoseconds;
/// `None` once the thread has exited.
pub(crate) fn thread_cpu_time_ns(tid: i32) -> Option<u64> {
    // The kernel encodes a per-thread CPU clock as `(!tid << 3) | 6`
    // (CPUCLOCK_PERTHREAD_MASK | CPUCLOCK_SCHED), see `clock_getcpuclockid(3)`.
    clock_ns((((!tid) << 3) | 6) as libc::clockid_t)
}

/// The kernel's release string (`uname -r`), for profiles' `os.version`.
pub(crate) fn kernel_release() -> String {
    // SAFETY: uname fills a zeroed utsname owned by this frame; `release` is
    // NUL-terminated by the kernel.
    unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        if libc::uname(&mut u) != 0 {
            return "unknown".into();
        }
        std::ffi::CStr::from_ptr(u.release.as_ptr())
            .to_string_lossy()
            .into_owned()
    }
}

/// CPU time consumed so far by the whole process (every thread, including
/// those that exited), in nanoseconds.
pub(crate) fn process_cpu_time_ns() -> u64 {
    clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID).unwrap_or(0)
}

/// The size of a memory page, in bytes (4 KiB unless the kernel says
/// otherwise).
pub(crate) fn page_size() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|s| *s > 0).unwrap_or(4096)
}

/// CPU time consumed so far by the calling thread, in nanoseconds.
pub(crate) fn own_cpu_time_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or(0)
}

/// `CLOCK_REALTIME` in nanoseconds since the Unix epoch, the same clock the
/// signal handler stamps samples with.
#[inline]
pub(crate) fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kept id is each thread's own, asked again or not.
    #[test]
    fn each_thread_keeps_its_own_id() {
        let here = (current_tid(), current_tid(), gettid());
        let there = std::thread::spawn(|| (current_tid(), current_tid(), gettid()))
            .join()
            .unwrap();
        for (a, b, truth) in [here, there] {
            assert_eq!((a, b), (truth, truth));
        }
        assert_ne!(here.2, there.2);
    }

    #[test]
    fn parses_names_with_parentheses_and_spaces() {
        let stat = "4242 (tokio (w) 1) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 987654 20 21";
        let info = parse_stat(4242, stat).unwrap();
        assert_eq!(info.name, "tokio (w) 1");
        assert_eq!(info.start_time, 987654);
    }

    #[test]
    fn lists_this_thread_with_a_cpu_clock() {
        let tid = current_tid();
        let mut list = TaskList::default();
        let mut tids = Vec::new();
        list.read(&mut tids).unwrap();
        assert!(tids.contains(&tid));
        // Read again from the same open directory: the same threads, and
        // one started since.
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            tx.send(current_tid()).unwrap();
            let _ = done_rx.recv();
        });
        let other_tid = rx.recv().unwrap();
        list.read(&mut tids).unwrap();
        assert!(tids.contains(&tid) && tids.contains(&other_tid), "{tids:?}");
        assert!(!tids.contains(&0));
        drop(done_tx);
        other.join().unwrap();
        let before = thread_cpu_time_ns(tid).unwrap();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(thread_cpu_time_ns(tid).unwrap() > before);
        assert!(read_thread_identity(tid).is_some());
    }
}
