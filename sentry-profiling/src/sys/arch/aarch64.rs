//! aarch64: registers from the kernel's `ucontext_t`, and the thread
//! pointer. Mirrors `x86_64.rs`.

use crate::sys::Regs;

/// Reads PC, SP, FP (and LR) from the interrupted context.
///
/// # Safety
/// `uc` must point at the kernel's `ucontext_t` for the current delivery.
#[inline(always)]
pub(crate) unsafe fn read_regs(uc: *const libc::ucontext_t) -> Regs {
    // SAFETY: guaranteed by the caller.
    let mc = unsafe { &(*uc).uc_mcontext };
    Regs {
        pc: mc.pc,
        sp: mc.sp,
        fp: mc.regs[29],
        lr: mc.regs[30],
    }
}

/// The calling thread's thread pointer: the address of its thread control
/// block, which the threads library places at the top of the thread's stack
/// allocation. Async-signal-safe (one instruction).
#[inline(always)]
pub(crate) fn thread_pointer() -> usize {
    let tp: usize;
    // SAFETY: reading TPIDR_EL0 has no side effects.
    unsafe {
        std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nomem, nostack, preserves_flags));
    }
    tp
}
