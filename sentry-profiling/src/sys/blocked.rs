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
pub(crate) fn syscall_state(tid: i32, buf: &mut Vec<u8>) -> Option<SyscallState> {
    let mut file = std::fs::File::open(format!("/proc/self/task/{tid}/syscall")).ok()?;
    buf.clear();
    file.read_to_end(buf).ok()?;
    parse_syscall(std::str::from_utf8(buf).ok()?)
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

/// Copies `[addr, addr + dst.len())` of this process's memory into `dst`,
/// stopping at the first unmapped page; returns how many bytes were copied.
///
/// Safe for any address: the kernel checks it (`process_vm_readv`, or
/// reading `/proc/self/mem` where a seccomp policy forbids that call).
pub(crate) fn read_own_memory(addr: u64, dst: &mut [u8]) -> usize {
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
        return n as usize;
    }
    read_proc_mem(addr, dst)
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
        assert_eq!(read_own_memory(sp, &mut copy), 256, "its stack is readable");
        assert_eq!(
            read_own_memory(8, &mut copy),
            0,
            "an unmapped address copies nothing"
        );
        drop(tx);
        h.join().unwrap();
    }
}
