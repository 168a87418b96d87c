//! Whether a caller made the call: the machine code at a return address,
//! checked against the function the callee frame is in.
//!
//! A thread blocked in the kernel is unwound without its frame-pointer
//! register (see `super::blocked`), so part of its stack may rest on a
//! frame record found by searching the stack, and a stale record left in a
//! frame's uninitialised locals looks like a real one. The code tells them
//! apart: a return address follows a call instruction, and a direct call
//! names its target, which must be the callee's function, a function that
//! reaches it by tail jumps (up to [`REACH_DEPTH`] functions deep), or a
//! PLT stub. A call through a register or memory may have gone anywhere and
//! is accepted, as is an indirect tail jump: the check rules frames out, it
//! does not prove them.
//!
//! Functions are the `.eh_frame` FDEs of the loaded modules (found through
//! `.eh_frame_hdr`'s search table), which every function that can be on a
//! stack has. Code is read from the executable's borrowed segment, or for a
//! shared library with `sys::read_own_memory` (a library unloaded meanwhile
//! fails the read instead of faulting). Verdicts are cached per (callee,
//! return address): a waiting thread shows the same pairs at every look.

use gimli::{BaseAddresses, EhFrame, EhFrameHdr, LittleEndian, UnwindSection};
use rustc_hash::FxHashMap;

use crate::sys::{self, LoadedImage, Section};

#[cfg(any(test, target_arch = "aarch64"))]
mod aarch64;
#[cfg(any(test, target_arch = "x86_64"))]
#[cfg_attr(
    not(target_arch = "x86_64"),
    expect(dead_code, reason = "on other hosts only its decoder's tests use it")
)]
mod x86_64;

#[cfg(target_arch = "aarch64")]
use aarch64 as native;
#[cfg(target_arch = "x86_64")]
use x86_64 as native;

/// What ends at a return address: a direct call (with its target), a call
/// through a register or memory, both (a byte run that decodes either way),
/// or neither.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CallBefore {
    /// The target of a direct call that ends there.
    pub(crate) direct: Option<u64>,
    /// Whether an indirect call ends there.
    pub(crate) indirect: bool,
}

impl CallBefore {
    /// Whether any call ends there.
    #[cfg(test)]
    pub(crate) fn is_call(&self) -> bool {
        self.direct.is_some() || self.indirect
    }
}

/// How many functions deep a chain of tail jumps is followed.
const REACH_DEPTH: u32 = 3;

/// At most this much of a function's body is scanned for its jumps.
const MAX_BODY: usize = 64 * 1024;

/// At most this many verdicts are cached; the cache starts over past it.
const MAX_VERDICTS: usize = 16 * 1024;

/// A loaded module as the checker reads it.
#[derive(Debug)]
struct CodeModule {
    start: u64,
    end: u64,
    bias: u64,
    eh_frame_hdr: Option<Section>,
    eh_frame: Option<Section>,
    /// The executable segment, borrowed (the main executable only).
    text: Option<Section>,
}

/// The call-site checker of the sampler thread's unwinder.
#[derive(Debug, Default)]
pub(crate) struct CallChecker {
    /// Sorted by start.
    modules: Vec<CodeModule>,
    /// Runtime ranges of every executable segment, sorted.
    code: Vec<(u64, u64)>,
    verdicts: FxHashMap<(u64, u64), bool>,
    /// Whether `process_vm_readv` may be used (else `/proc/self/mem`).
    vm_read: bool,
}

impl CallChecker {
    /// Takes the modules now loaded (their sections are shared, not
    /// copied) and forgets every verdict.
    pub(crate) fn set_modules(&mut self, images: &[LoadedImage]) {
        self.modules.clear();
        self.code.clear();
        self.verdicts.clear();
        for image in images {
            self.code.extend_from_slice(&image.code);
            self.modules.push(CodeModule {
                start: image.start,
                end: image.end,
                bias: image.bias,
                eh_frame_hdr: image.eh_frame_hdr.clone(),
                eh_frame: image.eh_frame.clone(),
                text: image.text.clone(),
            });
        }
        self.modules.sort_by_key(|m| m.start);
        self.code.sort_unstable();
    }

    /// Whether code may be read with `process_vm_readv` (refused by a
    /// seccomp policy: it is read from `/proc/self/mem`).
    pub(crate) fn set_vm_read(&mut self, allowed: bool) {
        self.vm_read = allowed;
    }

    /// Whether `addr` lies in a loaded module's executable segment.
    pub(crate) fn in_code(&self, addr: u64) -> bool {
        in_ranges(&self.code, addr)
    }

    /// Whether `ret` can be the return address of a call that entered the
    /// function holding `callee` (an instruction address, or a return
    /// address minus one): `ret` is in code, a call ends there, and a
    /// direct call's target can reach `callee`'s function.
    pub(crate) fn confirms(&mut self, callee: u64, ret: u64) -> bool {
        if let Some(&verdict) = self.verdicts.get(&(callee, ret)) {
            return verdict;
        }
        let verdict = self.check(callee, ret);
        if self.verdicts.len() >= MAX_VERDICTS {
            self.verdicts.clear();
        }
        self.verdicts.insert((callee, ret), verdict);
        verdict
    }

    fn check(&self, callee: u64, ret: u64) -> bool {
        if !self.in_code(ret) {
            return false;
        }
        let mut before = [0u8; native::CALL_WINDOW];
        let Some(from) = ret.checked_sub(native::CALL_WINDOW as u64) else {
            return false;
        };
        if !self.read_code(from, &mut before) {
            return false;
        }
        let call = native::call_before(&before, ret);
        if call.indirect {
            return true;
        }
        let Some(target) = call.direct else {
            return false;
        };
        match self.function_at(callee) {
            Some((goal, _)) => self.may_reach(target, goal, REACH_DEPTH),
            // A callee outside every function: nothing to hold the call
            // against.
            None => true,
        }
    }

    /// Whether a call to `target` can end in the function starting at
    /// `goal`: it is `goal`, a PLT stub, or a function whose direct jumps
    /// lead there (or that jumps through a register).
    fn may_reach(&self, target: u64, goal: u64, depth: u32) -> bool {
        if target == goal {
            return true;
        }
        let Some((start, len)) = self.function_at(target) else {
            let mut head = [0u8; native::STUB_WINDOW];
            return self.read_code(target, &mut head) && native::is_stub(&head);
        };
        if depth == 0 {
            return false;
        }
        let len = usize::try_from(len).unwrap_or(MAX_BODY).min(MAX_BODY);
        let mut body = vec![0u8; len];
        if !self.read_code(start, &mut body) {
            return false;
        }
        let mut targets = Vec::new();
        if native::jumps(&body, start, &mut targets) || targets.contains(&goal) {
            return true;
        }
        let end = start.saturating_add(len as u64);
        targets.retain(|t| !(start..end).contains(t));
        targets.sort_unstable();
        targets.dedup();
        targets
            .into_iter()
            .any(|t| self.may_reach(t, goal, depth - 1))
    }

    /// Where a function that keeps a frame pointer has it, relative to its
    /// stack pointer at a call site at `at` (see `x86_64::fp_offset`).
    /// `None` where the prologue does not tell, and on aarch64, whose
    /// frame record is found by the search alone.
    pub(crate) fn fp_offset(&self, at: u64) -> Option<u64> {
        #[cfg(target_arch = "x86_64")]
        {
            let (start, len) = self.function_at(at)?;
            let len = usize::try_from(len.min(x86_64::PROLOGUE_WINDOW as u64)).ok()?;
            let mut code = [0u8; x86_64::PROLOGUE_WINDOW];
            let code = &mut code[..len];
            if !self.read_code(start, code) {
                return None;
            }
            x86_64::fp_offset(code)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = at;
            None
        }
    }

    fn module(&self, addr: u64) -> Option<&CodeModule> {
        let i = self.modules.partition_point(|m| m.start <= addr);
        self.modules.get(i.checked_sub(1)?).filter(|m| addr < m.end)
    }

    /// The runtime start and length of the function (FDE) holding `addr`.
    fn function_at(&self, addr: u64) -> Option<(u64, u64)> {
        let m = self.module(addr)?;
        let (hdr, frame) = (m.eh_frame_hdr.as_ref()?, m.eh_frame.as_ref()?);
        let mut bases = BaseAddresses::default()
            .set_eh_frame_hdr(hdr.svma)
            .set_eh_frame(frame.svma);
        if let Some(text) = &m.text {
            bases = bases.set_text(text.svma);
        }
        let parsed = EhFrameHdr::new(&hdr.bytes, LittleEndian)
            .parse(&bases, 8)
            .ok()?;
        let table = parsed.table()?;
        let eh_frame = EhFrame::new(&frame.bytes, LittleEndian);
        let svma = addr.checked_sub(m.bias)?;
        let fde = table
            .fde_for_address(&eh_frame, &bases, svma, EhFrame::cie_from_offset)
            .ok()?;
        Some((fde.initial_address().wrapping_add(m.bias), fde.len()))
    }

    /// Fills `buf` with the code at `addr`; false if it is not all code of
    /// one loaded module, or cannot be read.
    fn read_code(&self, addr: u64, buf: &mut [u8]) -> bool {
        let Some(last) = addr.checked_add(buf.len().saturating_sub(1) as u64) else {
            return false;
        };
        if !self.in_code(addr) || !self.in_code(last) {
            return false;
        }
        let Some(m) = self.module(addr) else {
            return false;
        };
        if let Some(text) = &m.text {
            let from = text.svma.wrapping_add(m.bias);
            let range = usize::try_from(addr.wrapping_sub(from))
                .ok()
                .filter(|_| addr >= from)
                .and_then(|off| text.bytes.get(off..off.checked_add(buf.len())?));
            if let Some(bytes) = range {
                buf.copy_from_slice(bytes);
                return true;
            }
        }
        sys::read_own_memory(addr, buf, self.vm_read).copied == buf.len()
    }
}

/// Whether `addr` lies in one of `ranges` (sorted by start).
fn in_ranges(ranges: &[(u64, u64)], addr: u64) -> bool {
    let i = ranges.partition_point(|&(start, _)| start <= addr);
    i.checked_sub(1)
        .is_some_and(|i| ranges.get(i).is_some_and(|&(_, end)| addr < end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "x86_64")]
    fn checker() -> CallChecker {
        let mut c = CallChecker {
            vm_read: true,
            ..CallChecker::default()
        };
        c.set_modules(&sys::loaded_images());
        c
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(never)]
    fn callee_fn(x: u64) -> u64 {
        std::hint::black_box(x).wrapping_mul(3)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(never)]
    fn other_fn(x: u64) -> u64 {
        std::hint::black_box(x).wrapping_add(5)
    }

    #[cfg(target_arch = "x86_64")]
    /// The return address of this function's call of `callee_fn`, found
    /// by scanning its own code for a direct call to it.
    #[inline(never)]
    fn caller_fn(c: &CallChecker) -> (u64, u64) {
        let result = callee_fn(std::hint::black_box(2));
        let start = caller_fn as *const () as u64;
        let (f, len) = c.function_at(start).expect("caller's FDE");
        assert_eq!(f, start, "an FDE starts at the function");
        let mut body = vec![0u8; len as usize];
        assert!(c.read_code(start, &mut body));
        let target = callee_fn as *const () as u64;
        let ret = (0..body.len().saturating_sub(4))
            .filter(|&i| body[i] == 0xE8)
            .map(|i| start + i as u64 + 5)
            .find(|&ret| {
                let rel = i32::from_le_bytes(
                    body[(ret - start - 4) as usize..(ret - start) as usize]
                        .try_into()
                        .unwrap(),
                );
                ret.wrapping_add_signed(i64::from(rel)) == target
            })
            .expect("a direct call to callee_fn");
        (ret, result)
    }

    /// A direct call confirms its own target and rules out another
    /// function; an address inside a function is no return address.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_direct_call_confirms_its_callee_only() {
        let mut c = checker();
        let (ret, _) = caller_fn(&c);
        let callee = callee_fn as *const () as u64 + 1;
        let other = other_fn as *const () as u64 + 1;
        assert_eq!(other_fn(1), 6);
        assert!(c.confirms(callee, ret));
        assert!(!c.confirms(other, ret));
        // Data is no return address.
        static DATA: [u64; 4] = [1, 2, 3, 4];
        let data = std::hint::black_box(&DATA) as *const [u64; 4] as u64;
        assert!(!c.in_code(data));
        assert!(!c.confirms(callee, data + 8));
    }

    #[test]
    fn ranges_are_half_open() {
        assert!(in_ranges(&[(10, 20)], 10) && !in_ranges(&[(10, 20)], 20));
        assert!(!in_ranges(&[], 10));
    }
}
