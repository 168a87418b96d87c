//! Unwinding a thread blocked in the kernel, through real frames only.
//!
//! The kernel shows a blocked thread's stack pointer and program counter
//! (`sys::TaskFile`), not its frame pointer. The leaf frames (libc's
//! system-call wrappers) unwind by their CFI, relative to the stack pointer,
//! and a frame whose CFI restores the frame pointer gives its exact value.
//! The first frame whose CFI is based on a frame pointer that no frame
//! restored (Rust's std on x86_64 is built with frame pointers, and its
//! `park`, `Condvar::wait` and `sleep` call libc directly) cannot be
//! unwound that way. Its frame record is found instead:
//!
//! 1. where its prologue puts it: `push %rbp; mov %rsp,%rbp`, pushes and
//!    `sub $n,%rsp` give the frame pointer as an offset from the stack
//!    pointer at its call sites (x86_64);
//! 2. else by searching the stack above its stack pointer for a word that
//!    points higher into the stack (or is 0) followed by a return address
//!    into code, nearest first.
//!
//! A guessed record is accepted only if the walk from it reaches the
//! thread's root (a frame whose CFI marks the end of the stack: libc's
//! `clone3` for threads, `_start` for the main thread), or the end of a
//! stack copy cut short by `stack_copy_bytes`, with every (callee, caller)
//! pair on the way confirmed by the machine code (`super::calls`). Every
//! pair is checked, guessed or not. A stack that cannot be unwound so ends
//! with [`UNWOUND_NO_FURTHER_FRAME`] after its last proven frame: a stale
//! frame record left in a frame's uninitialised locals (a return address
//! into code, as real as any) would otherwise show a caller that was never
//! on the stack.

use framehop::{FrameAddress, Unwinder as _};

use super::{Caller, MAX_FRAMES, StackUnwinder, UnwindRegs as Regs, interrupted_frame};
use crate::frames::{SIGNAL_HANDLER_FRAME, UNWOUND_NO_FURTHER_FRAME};

/// The frame-pointer value the unwinder is given while the real one is not
/// known: not zero (framehop ends a walk at a zero frame pointer, as at a
/// stack's root) and never inside a copied stack, so the first frame that
/// needs it stops the walk.
const UNKNOWN_FP: u64 = 0x10;

/// How many frame records the search tries.
const MAX_CANDIDATES: usize = 48;

/// A frame record's link points at most this far above the copy (the
/// copy may be cut short of the stack's top).
const LINK_SLACK: u64 = 1 << 20;

/// How a walk ended.
enum End {
    /// At the thread's root, or at [`MAX_FRAMES`].
    Root,
    /// At the end of a stack copy cut short: the frames found are real,
    /// the rest is not known.
    OutOfCopy,
    /// The unwinder could not go on from this frame (for want of the frame
    /// pointer, or a chain that leads nowhere): where a search for its
    /// frame record starts.
    #[cfg_attr(
        target_arch = "aarch64",
        expect(
            dead_code,
            reason = "aarch64 searches from the leaf: the link register is not known either"
        )
    )]
    Stuck(FrameAddress, Regs),
    /// A caller the machine code rules out.
    Refuted,
}

/// A stack copied from `sp` up.
#[derive(Clone, Copy)]
struct StackCopy<'a> {
    sp: u64,
    bytes: &'a [u8],
    /// Whether the copy reaches the top of the stack.
    complete: bool,
}

impl StackCopy<'_> {
    fn end(&self) -> u64 {
        self.sp.saturating_add(self.bytes.len() as u64)
    }

    fn word(&self, addr: u64) -> Option<u64> {
        let off = usize::try_from(addr.checked_sub(self.sp)?).ok()?;
        let bytes = self.bytes.get(off..off.checked_add(8)?)?;
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    }
}

impl StackUnwinder {
    /// Unwinds the stack of a thread blocked in a system call into `frames`
    /// (leaf first), knowing only its program counter `pc` and stack
    /// pointer `sp` (what the kernel shows of a blocked thread; see
    /// `sys::blocked`). `stack` is copied from `sp` up; `complete` says
    /// whether it reaches the top of the stack. `vm_read` says whether code
    /// may be read with `process_vm_readv`. See the module's doc for what is
    /// accepted; a stack that is not fully unwound ends with
    /// [`UNWOUND_NO_FURTHER_FRAME`].
    pub(crate) fn unwind_blocked(
        &mut self,
        pc: u64,
        sp: u64,
        stack: &[u8],
        complete: bool,
        vm_read: bool,
        frames: &mut Vec<u64>,
    ) {
        self.check_modules();
        self.calls.set_vm_read(vm_read);
        frames.clear();
        frames.push(pc);
        let copy = StackCopy {
            sp,
            bytes: stack,
            complete,
        };
        let address = FrameAddress::from_instruction_pointer(pc);
        #[cfg(target_arch = "x86_64")]
        let end = {
            let regs = Regs::new(pc, sp, UNKNOWN_FP);
            match self.walk(address, regs, copy, frames) {
                End::Stuck(address, regs) => self.search(address, regs, copy, frames),
                end => end,
            }
        };
        // The link register is unknown too: the leaf wrappers save it in
        // their frame record, which the search finds (a leaf that keeps it
        // in the register needs its caller's record for the same reason).
        #[cfg(target_arch = "aarch64")]
        let end = {
            let mask = framehop::aarch64::PtrAuthMask::from_max_known_address(
                self.unwinder.max_known_code_address(),
            );
            let regs = Regs::new_with_ptr_auth_mask(mask, 0, sp, UNKNOWN_FP);
            self.search(address, regs, copy, frames)
        };
        match end {
            End::Root => {}
            End::OutOfCopy | End::Stuck(..) | End::Refuted => frames.push(UNWOUND_NO_FURTHER_FRAME),
        }
    }

    /// Looks for the frame record of the frame at `address` (its registers
    /// `regs`, frame pointer unknown) and walks on from the first one that
    /// leads to the root or the copy's end through confirmed frames. On
    /// failure, `frames` is as it was.
    fn search(
        &mut self,
        address: FrameAddress,
        regs: Regs,
        copy: StackCopy<'_>,
        frames: &mut Vec<u64>,
    ) -> End {
        let kept = frames.len();
        let from = regs.sp();
        let predicted = self
            .calls
            .fp_offset(address.address_for_lookup())
            .and_then(|offset| from.checked_add(offset));
        let mut records: Vec<u64> = predicted.into_iter().collect();
        let start = from.next_multiple_of(8);
        let mut at = start;
        while records.len() < MAX_CANDIDATES && at.saturating_add(16) <= copy.end() {
            if let (Some(link), Some(ret)) = (copy.word(at), copy.word(at + 8)) {
                let links_up =
                    link == 0 || (link > at && link < copy.end().saturating_add(LINK_SLACK));
                if links_up && self.calls.in_code(ret) && Some(at) != predicted {
                    records.push(at);
                }
            }
            at += 8;
        }
        for record in records {
            frames.truncate(kept);
            let guess = with_record(regs, record, copy);
            match self.walk(address, guess, copy, frames) {
                End::Root => return End::Root,
                End::OutOfCopy => return End::OutOfCopy,
                End::Stuck(..) | End::Refuted => {}
            }
        }
        frames.truncate(kept);
        End::Refuted
    }

    /// Unwinds from the frame at `address` with `regs`, pushing each caller
    /// the machine code confirms, until the root, the copy's end, a frame
    /// the unwinder cannot leave, or a refuted caller.
    fn walk(
        &mut self,
        mut address: FrameAddress,
        mut regs: Regs,
        copy: StackCopy<'_>,
        frames: &mut Vec<u64>,
    ) -> End {
        let past_end = std::cell::Cell::new(false);
        let mut read_stack = |addr: u64| {
            if addr >= copy.end() {
                past_end.set(true);
            }
            copy.word(addr).ok_or(())
        };
        #[cfg(target_arch = "aarch64")]
        let mask = framehop::aarch64::PtrAuthMask::from_max_known_address(
            self.unwinder.max_known_code_address(),
        );
        loop {
            if frames.len() >= MAX_FRAMES {
                return End::Root;
            }
            let before = regs;
            let step =
                self.unwinder
                    .unwind_frame(address, &mut regs, &mut self.cache, &mut read_stack);
            let ret = match step {
                Ok(Some(ret)) => ret,
                Ok(None) if self.is_root(address, before) => return End::Root,
                _ if past_end.get() && !copy.complete => return End::OutOfCopy,
                _ => return End::Stuck(address, before),
            };
            #[cfg(target_arch = "aarch64")]
            let ret = mask.strip_ptr_auth(ret);
            address = match self.caller(ret, &mut regs, &mut read_stack) {
                Caller::Called(next) => {
                    if !self.calls.confirms(address.address_for_lookup(), ret) {
                        return End::Refuted;
                    }
                    frames.push(next.address_for_lookup());
                    next
                }
                // The handler returns there because the kernel put the
                // address there, not a call: nothing to confirm.
                Caller::Interrupted(pc) => {
                    frames.extend([SIGNAL_HANDLER_FRAME, interrupted_frame(pc)]);
                    FrameAddress::from_instruction_pointer(pc)
                }
                Caller::Unreadable if past_end.get() && !copy.complete => return End::OutOfCopy,
                Caller::Unreadable => return End::Refuted,
                Caller::None => return End::Stuck(address, before),
            };
        }
    }

    /// Whether the frame at `address` is the stack's root: its CFI says
    /// there is no caller (framehop ends a walk without reading the stack
    /// only there; a zero frame pointer or return address read from a
    /// stale record ends it too, and is no root).
    fn is_root(&mut self, address: FrameAddress, mut regs: Regs) -> bool {
        set_fp(&mut regs, UNKNOWN_FP);
        let step =
            self.unwinder
                .unwind_frame(address, &mut regs, &mut self.cache, &mut |_| Err(()));
        matches!(step, Ok(None))
    }
}

/// `regs` with the frame pointer a frame record at `record` gives (on
/// aarch64 also the link register saved beside it).
fn with_record(mut regs: Regs, record: u64, copy: StackCopy<'_>) -> Regs {
    set_fp(&mut regs, record);
    #[cfg(target_arch = "aarch64")]
    regs.set_lr(copy.word(record + 8).unwrap_or(0));
    #[cfg(not(target_arch = "aarch64"))]
    let _ = copy;
    regs
}

#[cfg(target_arch = "x86_64")]
fn set_fp(regs: &mut Regs, fp: u64) {
    regs.set_bp(fp);
}

#[cfg(target_arch = "aarch64")]
fn set_fp(regs: &mut Regs, fp: u64) {
    regs.set_fp(fp);
}
