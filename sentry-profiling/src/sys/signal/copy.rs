//! Copying the interrupted thread's stack from inside the signal handler:
//! async-signal-safe, never faulting where `process_vm_readv` works (see
//! the module docs of `sys::signal`). Shared by the handler's bound slots
//! and the spare slots of threads not yet listed (`spare`).

use std::sync::atomic::Ordering;

use super::*;
use crate::sys::arch::thread_pointer;

/// Copies the interrupted thread's stack from `sp` up to its thread
/// pointer (the top of its own stack allocation, see the module docs) into
/// the claimed slot's buffer, with `process_vm_readv`: nothing proves that
/// `sp` is on that allocation, and that call stops at the first unmapped
/// page instead of faulting. Without it (refused), nothing is copied
/// (`FLAG_OFF_STACK`).
///
/// # Safety
/// `slot` must be claimed by this handler (in the Writing state), and `sp`
/// the interrupted thread's stack pointer.
#[inline(always)]
pub(super) unsafe fn copy_to_thread_pointer(slot: &Slot, sp: usize) -> (usize, u32) {
    let tp = thread_pointer();
    if !VM_READ.load(Ordering::Relaxed) || sp >= tp {
        return (0, FLAG_OFF_STACK);
    }
    // SAFETY: `buf` has `cap` bytes and is exclusively ours in the Writing
    // state; `copy_own_memory` reads with `process_vm_readv` (VM_READ is
    // set), which stops at the first unmapped page.
    let copied = unsafe { copy_own_memory(sp, slot.buf, (tp - sp).min(slot.cap)) };
    (copied, 0)
}

/// Copies up to `len` bytes from `src` to `dst` and returns how many were
/// copied: all of them, or those before the first page of `src` that is no
/// longer mapped (see the module docs). Async-signal-safe.
///
/// # Safety
/// `dst` must be valid for `len` bytes of writes and not overlap `src`.
/// Without a working `process_vm_readv`, `[src, src + len)` must also be
/// mapped and readable.
#[inline(always)]
pub(super) unsafe fn copy_own_memory(src: usize, dst: *mut u8, len: usize) -> usize {
    if VM_READ.load(Ordering::Relaxed) {
        let local = libc::iovec {
            iov_base: dst.cast(),
            iov_len: len,
        };
        let remote = libc::iovec {
            iov_base: src as *mut libc::c_void,
            iov_len: len,
        };
        // SAFETY: `local` is writable for `len` bytes (the caller's
        // guarantee); the kernel checks `remote` and reports an unmapped
        // page as a short count or EFAULT instead of faulting.
        let n = unsafe {
            libc::process_vm_readv(OWN_PID.load(Ordering::Relaxed), &local, 1, &remote, 1, 0)
        };
        return usize::try_from(n).unwrap_or(0);
    }
    // SAFETY: guaranteed by the caller when `process_vm_readv` is unavailable.
    unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst, len) };
    len
}
