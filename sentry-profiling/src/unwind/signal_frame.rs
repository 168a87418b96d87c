//! Unwinding through a signal frame.
//!
//! A thread sampled while it runs a signal handler of the application's
//! (Tokio's SIGINT handler at every shutdown, a crash reporter, a thread
//! that blocks in a handler) has the handler's frames on top of the code
//! the signal interrupted. Between them the kernel put a signal frame: the
//! handler "returns" to the C library's restorer (`sa_restorer`, which
//! makes the `rt_sigreturn` system call), and the interrupted code's
//! registers are saved in the frame's `ucontext`, where no call made them.
//! The restorer's own CFI is an expression framehop does not evaluate, and
//! unwinding past it by the frame pointer lands on whatever the handler's
//! caller-saved registers held: frames that were not on the stack.
//!
//! So a return address that is a known restorer (see
//! `sys::signal_restorers`) ends the handler's part of the walk: the
//! signal frame is shown as the synthetic frame `(signal handler called)`
//! (the handler's caller is the kernel, not the restorer, and a checker of
//! call sites rightly finds no call before the restorer), and the walk
//! goes on from the saved program counter, stack pointer and frame
//! pointer, the interrupted instruction shown as it is.

#[cfg(target_arch = "x86_64")]
use framehop::x86_64::UnwindRegsX86_64 as Regs;

/// Offsets from the stack pointer after the handler's return (the
/// `ucontext` of the kernel's `rt_sigframe`, right above the restorer's
/// address) to the saved registers: `uc_mcontext` follows `uc_flags`,
/// `uc_link` and the 24-byte `uc_stack`; in it `rbp`, `rsp` and `rip` are
/// the 11th, 16th and 17th of the general registers.
#[cfg(target_arch = "x86_64")]
mod offsets {
    const MCONTEXT: u64 = 40;
    pub(super) const RBP: u64 = MCONTEXT + 10 * 8;
    pub(super) const RSP: u64 = MCONTEXT + 15 * 8;
    pub(super) const RIP: u64 = MCONTEXT + 16 * 8;
}

/// The interrupted instruction and the registers to unwind it with, read
/// from the signal frame whose
/// `ucontext` starts at `regs`'s stack pointer (the handler's frame was
/// just unwound and returned to a restorer). `None` if the frame cannot be
/// read (a handler on an alternate stack whose copy ends first) or its
/// stack pointer is not above the frame (it could not be the interrupted
/// code's on the same stack, and a walk must move up).
#[cfg(target_arch = "x86_64")]
pub(super) fn interrupted(
    regs: &Regs,
    read: &mut impl FnMut(u64) -> Result<u64, ()>,
) -> Option<(u64, Regs)> {
    let ucontext = regs.sp();
    let mut at = |offset: u64| read(ucontext.checked_add(offset)?).ok();
    let (pc, sp, fp) = (at(offsets::RIP)?, at(offsets::RSP)?, at(offsets::RBP)?);
    (sp > ucontext && pc != 0).then(|| (pc, Regs::new(pc, sp, fp)))
}

/// On aarch64 glibc leaves the return from a handler to the vDSO's
/// trampoline, which `sys::signal_restorers` does not list: a handler's
/// walk ends there as before.
#[cfg(target_arch = "aarch64")]
pub(super) fn interrupted(
    _regs: &framehop::aarch64::UnwindRegsAarch64,
    _read: &mut impl FnMut(u64) -> Result<u64, ()>,
) -> Option<(u64, framehop::aarch64::UnwindRegsAarch64)> {
    None
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// A stack copy from `base`: words at offsets.
    fn stack(base: u64, words: &[(u64, u64)]) -> impl FnMut(u64) -> Result<u64, ()> + use<> {
        let words = words.to_vec();
        move |addr| {
            words
                .iter()
                .find(|(off, _)| base + off == addr)
                .map(|&(_, w)| w)
                .ok_or(())
        }
    }

    #[test]
    fn the_interrupted_registers_come_from_the_ucontext() {
        let base = 0x7000_0000;
        let mut read = stack(
            base,
            &[(120, 0x7000_9000), (160, 0x7000_8000), (168, 0x5555_1234)],
        );
        let (pc, regs) = interrupted(&Regs::new(0, base, 0), &mut read).expect("read");
        assert_eq!(
            (pc, regs.ip(), regs.sp(), regs.bp()),
            (0x5555_1234, 0x5555_1234, 0x7000_8000, 0x7000_9000)
        );
    }

    #[test]
    fn a_frame_that_would_move_the_walk_down_or_is_unreadable_ends_it() {
        let base = 0x7000_0000;
        let mut below = stack(base, &[(120, 0), (160, base - 8), (168, 0x5555_1234)]);
        assert!(interrupted(&Regs::new(0, base, 0), &mut below).is_none());
        let mut cut = stack(base, &[(120, 0), (160, base + 0x1000)]);
        assert!(interrupted(&Regs::new(0, base, 0), &mut cut).is_none());
    }
}
