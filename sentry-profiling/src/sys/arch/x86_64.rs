//! x86_64: registers from the kernel's `ucontext_t`, and the thread pointer.
//! Mirrors `aarch64.rs`.

use crate::sys::Regs;

/// Reads PC, SP, FP (and LR) from the interrupted context.
///
/// # Safety
/// `uc` must point at the kernel's `ucontext_t` for the current delivery.
#[inline(always)]
pub(crate) unsafe fn read_regs(uc: *const libc::ucontext_t) -> Regs {
    // SAFETY: guaranteed by the caller.
    let gregs = unsafe { &(*uc).uc_mcontext.gregs };
    Regs {
        pc: gregs[libc::REG_RIP as usize] as u64,
        sp: gregs[libc::REG_RSP as usize] as u64,
        fp: gregs[libc::REG_RBP as usize] as u64,
        lr: 0,
    }
}

/// The calling thread's thread pointer: the address of its thread control
/// block, which the threads library places at the top of the thread's stack
/// allocation. Async-signal-safe (one instruction).
#[inline(always)]
pub(crate) fn thread_pointer() -> usize {
    let tp: usize;
    // SAFETY: the x86-64 TLS ABI makes the first word of the thread control
    // block, at %fs:0, point at the block itself; every thread that runs
    // Rust code has one (the handler's thread-local context needs it too).
    unsafe {
        std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags));
    }
    tp
}
