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

use std::io::Read;

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

/// Reads thread `tid`'s system-call state; `None` if it exited or the file
/// cannot be read. `buf` is reused between calls.
fn syscall_state(tid: i32, buf: &mut Vec<u8>) -> Option<SyscallState> {
    let mut file = std::fs::File::open(syscall_path(tid)).ok()?;
    buf.clear();
    file.read_to_end(buf).ok()?;
    parse_syscall(std::str::from_utf8(buf).ok()?)
}

fn syscall_path(tid: i32) -> String {
    format!("/proc/self/task/{tid}/syscall")
}

/// Most `syscall` files kept open at once, process-wide: each is a file
/// descriptor of the application's, and a process with thousands of
/// threads must not run out of them because of the profiler. Threads
/// beyond it have the file opened at each read, as [`syscall_state`] does.
const MAX_KEPT_OPEN: usize = 64;

/// `syscall` files kept open now (see [`SyscallFile`]).
static KEPT_OPEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One thread's `/proc/self/task/<tid>/syscall`, kept open between reads
/// (up to [`MAX_KEPT_OPEN`] of them): a read from offset 0 makes the
/// kernel write the file anew, so each look at a blocked thread is one
/// `pread` instead of an allocation, a path walk through `/proc`, a read to
/// the end and a `close`. The descriptor names the task it was opened for:
/// once that thread exits its reads fail (they never show a later thread
/// given the same id), and the file is opened again by path.
#[derive(Debug, Default)]
pub(crate) struct SyscallFile {
    file: Option<std::fs::File>,
}

impl SyscallFile {
    /// Thread `tid`'s system-call state, as [`syscall_state`].
    pub(crate) fn read(&mut self, tid: i32, buf: &mut Vec<u8>) -> Option<SyscallState> {
        if let Some(state) = self.read_kept() {
            return state;
        }
        // None kept, or its read failed (the thread exited, or the id now
        // names another thread): opened anew, once.
        if self.open(tid)
            && let Some(state) = self.read_kept()
        {
            return state;
        }
        syscall_state(tid, buf)
    }

    /// The state read from the kept file; `None` if there is none or its
    /// read failed (the file is closed then).
    fn read_kept(&mut self) -> Option<Option<SyscallState>> {
        use std::os::unix::fs::FileExt;
        let mut line = [0u8; 512];
        match self.file.as_ref()?.read_at(&mut line, 0) {
            Ok(n) if n < line.len() => {
                Some(std::str::from_utf8(&line[..n]).ok().and_then(parse_syscall))
            }
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
        match std::fs::File::open(syscall_path(tid)) {
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

impl Drop for SyscallFile {
    fn drop(&mut self) {
        self.close();
    }
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
        let mut buf = Vec::new();
        let mut seen = None;
        for _ in 0..200 {
            if let Some(SyscallState::Blocked { sp, pc, .. }) = syscall_state(tid, &mut buf) {
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
        let mut file = SyscallFile::default();
        let mut buf = Vec::new();
        let mut wait_for = |file: &mut SyscallFile, blocked: bool| {
            (0..400).any(|_| {
                let state = file.read(tid, &mut buf);
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
        assert_eq!(file.read(tid, &mut buf), None, "its thread exited");
        assert!(file.file.is_none(), "a failed read closes the file");
    }
}
