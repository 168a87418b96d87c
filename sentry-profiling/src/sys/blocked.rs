//! Where a thread blocked in the kernel waits, learned without interrupting
//! it.
//!
//! A signal to a thread that waits in `poll`, `epoll_wait`, `nanosleep`,
//! `futex` with a timeout, `sigtimedwait`, or a socket call with a timeout
//! makes that call fail with `EINTR` even with `SA_RESTART` (signal(7),
//! "Interruption of system calls"), and much C code treats that as an error.
//! So the sampler never signals a waiting thread: the kernel tells it the
//! stack pointer and program counter of a thread blocked in a system call
//! (`/proc/self/task/<tid>/syscall`, readable for threads of one's own
//! process), and the sampler thread (not a signal handler: it may read any
//! memory, and a copy that meets an unmapped page stops there) copies the
//! thread's stack from that stack pointer up, to be unwound like a capture.
//! The thread's CPU clock is read before and after: if it moved, the thread
//! woke up during the copy and the copy is thrown away.

/// What `/proc/self/task/<tid>/syscall` says about a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SyscallState {
    /// Running or runnable: its registers cannot be read now.
    Running,
    /// Blocked, in system call `nr` (`None`: blocked outside a system call,
    /// e.g. in a page fault), with its user stack pointer and program
    /// counter.
    Blocked { nr: Option<i64>, sp: u64, pc: u64 },
}

/// Bytes read of `syscall` and `schedstat`, one line each (read at every
/// look at a thread).
const LINE: usize = 512;

/// Bytes read of `status`, about 1.5 KB (read only for a thread whose
/// timer is overdue).
const STATUS: usize = 4096;

/// Most files under `/proc/self/task/<tid>/` kept open at once,
/// process-wide (see [`TaskFile`]): each is a file descriptor of the
/// application's, and a process with thousands of threads must not run out
/// of them because of the profiler. Files beyond it are opened at each
/// read.
const MAX_KEPT_OPEN: usize = 128;

/// Task files kept open now (see [`TaskFile`]).
static KEPT_OPEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One file of one thread's, `/proc/self/task/<tid>/<name>` (`syscall`,
/// `schedstat`), kept open between reads (up to [`MAX_KEPT_OPEN`] of them):
/// a read from offset 0 makes the kernel write the file anew, so each read
/// is one `pread` instead of a path walk through `/proc`, a read and a
/// `close`. The descriptor names the task it was opened for: once that
/// thread exits its reads fail (they never show a later thread given the
/// same id), and the file is opened again by path.
#[derive(Debug)]
pub(crate) struct TaskFile {
    name: &'static str,
    file: Option<std::fs::File>,
}

impl TaskFile {
    /// A thread's system-call state (see [`TaskFile::read_syscall`]).
    pub(crate) fn syscall() -> Self {
        Self::named("syscall")
    }

    /// A thread's scheduler statistics (see [`TaskFile::read_schedstat`]).
    pub(crate) fn schedstat() -> Self {
        Self::named("schedstat")
    }

    /// A thread's status (see [`TaskFile::read_voluntary_switches`]).
    pub(crate) fn status() -> Self {
        Self::named("status")
    }

    fn named(name: &'static str) -> Self {
        Self { name, file: None }
    }

    /// The system-call state of thread `tid` (a [`TaskFile::syscall`]);
    /// `None` if it exited or the file cannot be read.
    pub(crate) fn read_syscall(&mut self, tid: i32) -> Option<SyscallState> {
        self.read::<LINE, _>(tid, parse_syscall)
    }

    /// The nanoseconds thread `tid` spent on a CPU, and runnable but
    /// waiting for one (its run delay), since it started (a
    /// [`TaskFile::schedstat`]).
    pub(crate) fn read_schedstat(&mut self, tid: i32) -> Option<(u64, u64)> {
        self.read::<LINE, _>(tid, parse_schedstat)
    }

    /// How many times thread `tid` gave up its CPU of its own accord (to
    /// wait in the kernel) since it started (a [`TaskFile::status`]).
    pub(crate) fn read_voluntary_switches(&mut self, tid: i32) -> Option<u64> {
        self.read::<STATUS, _>(tid, parse_voluntary_switches)
    }

    /// The file's text for thread `tid` (at most `N` bytes), parsed;
    /// `None` if it exited or the file cannot be read.
    fn read<const N: usize, T>(&mut self, tid: i32, parse: fn(&str) -> Option<T>) -> Option<T> {
        let mut line = [0u8; N];
        let n = match self.read_kept(&mut line) {
            Some(n) => n,
            // None kept, or its read failed (the thread exited, or the id
            // now names another thread): opened anew, once.
            None if self.open(tid) => self.read_kept(&mut line)?,
            None => {
                use std::os::unix::fs::FileExt;
                let file = std::fs::File::open(self.path(tid)).ok()?;
                file.read_at(&mut line, 0).ok()?
            }
        };
        parse(std::str::from_utf8(line.get(..n)?).ok()?)
    }

    fn path(&self, tid: i32) -> String {
        format!("/proc/self/task/{tid}/{}", self.name)
    }

    /// Bytes read from the kept file into `line`; `None` if there is none,
    /// or its read failed or filled `line` (the file is closed then).
    fn read_kept(&mut self, line: &mut [u8]) -> Option<usize> {
        use std::os::unix::fs::FileExt;
        match self.file.as_ref()?.read_at(line, 0) {
            Ok(n) if n < line.len() => Some(n),
            _ => {
                self.close();
                None
            }
        }
    }

    /// Opens and keeps the file if fewer than [`MAX_KEPT_OPEN`] are.
    fn open(&mut self, tid: i32) -> bool {
        use std::sync::atomic::Ordering;
        let claimed = KEPT_OPEN
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_KEPT_OPEN).then_some(n + 1)
            })
            .is_ok();
        if !claimed {
            return false;
        }
        match std::fs::File::open(self.path(tid)) {
            Ok(file) => {
                self.file = Some(file);
                true
            }
            Err(_) => {
                KEPT_OPEN.fetch_sub(1, Ordering::AcqRel);
                false
            }
        }
    }

    fn close(&mut self) {
        if self.file.take().is_some() {
            KEPT_OPEN.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        }
    }
}

impl Drop for TaskFile {
    fn drop(&mut self) {
        self.close();
    }
}

/// Parses `schedstat`'s one line: CPU time, run delay (both ns), and the
/// number of times the thread was given a CPU; returns the first two.
fn parse_schedstat(line: &str) -> Option<(u64, u64)> {
    let mut fields = line.split_whitespace().map(|f| f.parse().ok());
    Some((fields.next()??, fields.next()??))
}

/// Parses `status`'s `voluntary_ctxt_switches:` line.
fn parse_voluntary_switches(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))?
        .trim()
        .parse()
        .ok()
}

/// Parses the file's one line: `running`, `-1 <sp> <pc>`, or
/// `<nr> <6 arguments> <sp> <pc>` (numbers after the first in hex).
fn parse_syscall(line: &str) -> Option<SyscallState> {
    let line = line.trim();
    if line == "running" {
        return Some(SyscallState::Running);
    }
    let fields: Vec<&str> = line.split_whitespace().collect();
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let nr: i64 = fields.first()?.parse().ok()?;
    let (sp, pc) = match fields.len() {
        3 if nr == -1 => (hex(fields[1])?, hex(fields[2])?),
        9 => (hex(fields[7])?, hex(fields[8])?),
        _ => return None,
    };
    Some(SyscallState::Blocked {
        nr: (nr >= 0).then_some(nr),
        sp,
        pc,
    })
}

/// What [`read_own_memory`] copied, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OwnRead {
    /// Bytes copied.
    pub(crate) copied: usize,
    /// The `errno` `process_vm_readv` failed with, when it was tried and
    /// failed (`EFAULT` for an unmapped address; `EPERM` or `ENOSYS` when a
    /// seccomp policy forbids it); the copy then came from `/proc/self/mem`.
    pub(crate) vm_read_errno: Option<i32>,
}

/// Copies `[addr, addr + dst.len())` of this process's memory into `dst`,
/// stopping at the first unmapped page.
///
/// Safe for any address: the kernel checks it. With `vm_read` the copy is
/// one `process_vm_readv`, and `/proc/self/mem` is read only where that
/// fails; without it (the sampler found the call forbidden),
/// `/proc/self/mem` alone.
pub(crate) fn read_own_memory(addr: u64, dst: &mut [u8], vm_read: bool) -> OwnRead {
    if !vm_read {
        return OwnRead {
            copied: read_proc_mem(addr, dst),
            vm_read_errno: None,
        };
    }
    let local = libc::iovec {
        iov_base: dst.as_mut_ptr().cast(),
        iov_len: dst.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: dst.len(),
    };
    // SAFETY: `local` is `dst`, writable for its length; `remote` is only
    // read by the kernel, which reports an unmapped page as a short count or
    // an error instead of faulting.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n >= 0 {
        return OwnRead {
            copied: n as usize,
            vm_read_errno: None,
        };
    }
    let errno = std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EINVAL);
    OwnRead {
        copied: read_proc_mem(addr, dst),
        vm_read_errno: Some(errno),
    }
}

/// Whether this process's memory can be read through `/proc/self/mem` (a
/// hardened `/proc` may refuse it).
pub(crate) fn probe_proc_mem() -> bool {
    let src = [0xa5u8; 16];
    let mut dst = [0u8; 16];
    read_proc_mem(src.as_ptr() as u64, &mut dst) == src.len() && dst == src
}

fn read_proc_mem(addr: u64, dst: &mut [u8]) -> usize {
    use std::os::unix::fs::FileExt;
    let Ok(file) = std::fs::File::open("/proc/self/mem") else {
        return 0;
    };
    let mut done = 0;
    while done < dst.len() {
        match file.read_at(&mut dst[done..], addr + done as u64) {
            Ok(0) | Err(_) => break,
            Ok(n) => done += n,
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_forms() {
        assert_eq!(parse_syscall("running\n"), Some(SyscallState::Running));
        assert_eq!(
            parse_syscall("-1 0x7ffd1000 0x401000\n"),
            Some(SyscallState::Blocked {
                nr: None,
                sp: 0x7ffd_1000,
                pc: 0x40_1000
            })
        );
        assert_eq!(
            parse_syscall("7 0x7f00 0x1 0x5 0x0 0x0 0x0 0x7ffd2000 0x7f1234\n"),
            Some(SyscallState::Blocked {
                nr: Some(7),
                sp: 0x7ffd_2000,
                pc: 0x7f_1234
            })
        );
        assert_eq!(parse_syscall("garbage"), None);
        assert_eq!(parse_syscall("7 0x1 0x2"), None);
    }

    #[test]
    fn a_thread_blocked_in_a_read_is_seen_with_its_stack() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || {
            tid_tx.send(crate::sys::current_tid()).unwrap();
            let _ = rx.recv();
        });
        let tid = tid_rx.recv().unwrap();
        let mut seen = None;
        for _ in 0..200 {
            // Opened anew at each read, as for threads beyond those kept.
            let state = TaskFile::syscall().read_syscall(tid);
            if let Some(SyscallState::Blocked { sp, pc, .. }) = state {
                seen = Some((sp, pc));
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let (sp, pc) = seen.expect("the thread blocks");
        assert_ne!(pc, 0);
        let mut copy = [0u8; 256];
        for vm_read in [true, false] {
            let read = read_own_memory(sp, &mut copy, vm_read);
            assert_eq!(read.copied, 256, "its stack is readable");
            assert_eq!(read.vm_read_errno, None);
            let read = read_own_memory(8, &mut copy, vm_read);
            assert_eq!(read.copied, 0, "an unmapped address copies nothing");
            assert_eq!(read.vm_read_errno, vm_read.then_some(libc::EFAULT));
        }
        assert!(probe_proc_mem());
        drop(tx);
        h.join().unwrap();
    }

    #[test]
    fn a_kept_file_reads_the_state_anew_and_fails_once_its_thread_exits() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, mpsc};
        // A thread that spins until told to block, then blocks until told
        // to exit.
        let spin = Arc::new(AtomicBool::new(true));
        let (tx, rx) = mpsc::channel::<()>();
        let (tid_tx, tid_rx) = mpsc::channel();
        let spinning = Arc::clone(&spin);
        let h = std::thread::spawn(move || {
            tid_tx.send(crate::sys::current_tid()).unwrap();
            while spinning.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
            let _ = rx.recv();
        });
        let tid = tid_rx.recv().unwrap();
        let mut file = TaskFile::syscall();
        let wait_for = |file: &mut TaskFile, blocked: bool| {
            (0..400).any(|_| {
                let state = file.read_syscall(tid);
                let matches = match state {
                    Some(SyscallState::Blocked { .. }) => blocked,
                    Some(SyscallState::Running) => !blocked,
                    None => false,
                };
                if !matches {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                matches
            })
        };
        assert!(wait_for(&mut file, false), "seen running");
        assert!(file.file.is_some(), "the file is kept open");
        spin.store(false, Ordering::Relaxed);
        assert!(
            wait_for(&mut file, true),
            "the same file then shows it blocked"
        );
        drop(tx);
        h.join().unwrap();
        assert_eq!(file.read_syscall(tid), None, "its thread exited");
        assert!(file.file.is_none(), "a failed read closes the file");
    }

    #[test]
    fn a_thread_that_waits_gives_up_its_cpu_of_its_own_accord() {
        assert_eq!(
            parse_voluntary_switches(
                "Name:\tx\nvoluntary_ctxt_switches:\t17\nnonvoluntary_ctxt_switches:\t3\n"
            ),
            Some(17)
        );
        assert_eq!(parse_voluntary_switches("Name:\tx\n"), None);
        let mut file = TaskFile::status();
        let me = crate::sys::current_tid();
        let before = file
            .read_voluntary_switches(me)
            .expect("status is readable");
        // Computing gives nothing up; each sleep does.
        let until = std::time::Instant::now() + std::time::Duration::from_millis(20);
        while std::time::Instant::now() < until {
            std::hint::spin_loop();
        }
        let computed = file
            .read_voluntary_switches(me)
            .expect("status is readable");
        for _ in 0..5 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let slept = file
            .read_voluntary_switches(me)
            .expect("status is readable");
        assert_eq!(computed, before, "no wait while computing");
        assert!(
            slept >= before + 5,
            "{before} then {slept} after five sleeps"
        );
    }

    #[test]
    fn a_thread_kept_off_the_cpu_by_another_grows_its_run_delay() {
        assert_eq!(
            parse_schedstat("90030773 93897837 82\n"),
            Some((90_030_773, 93_897_837))
        );
        assert_eq!(parse_schedstat("1"), None);
        // Two threads pinned to one CPU take turns: each waits for it
        // while the other runs.
        // SAFETY: a cpu_set_t is plain bits; all zero is the empty set.
        let mut cpus: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: CPU_SET writes bit 0 of a set owned by this frame.
        unsafe { libc::CPU_SET(0, &mut cpus) };
        let spin = move || {
            // SAFETY: sets the calling thread's affinity from a set that
            // lives through the call.
            unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&cpus), &cpus) };
            let tid = crate::sys::current_tid();
            let until = std::time::Instant::now() + std::time::Duration::from_millis(300);
            while std::time::Instant::now() < until {
                std::hint::spin_loop();
            }
            tid
        };
        let other = std::thread::spawn(spin);
        let mut file = TaskFile::schedstat();
        let me = crate::sys::current_tid();
        let (_, before) = file.read_schedstat(me).expect("schedstat is readable");
        assert_eq!(spin(), me);
        let (_, after) = file.read_schedstat(me).expect("schedstat is readable");
        other.join().unwrap();
        assert!(file.file.is_some(), "the file is kept open");
        assert!(
            after - before >= 50_000_000,
            "waited {} ms for the CPU the other thread held",
            (after - before) / 1_000_000
        );
    }
}
