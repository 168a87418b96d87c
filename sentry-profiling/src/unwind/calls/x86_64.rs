//! x86_64 machine code: the call instruction that ends at a return address,
//! the jumps of a function's body, and PLT stubs.
//!
//! Decoding is by byte patterns, not a full disassembler. It errs on the
//! lenient side where instructions are ambiguous (a byte run that could be
//! either of two instructions counts as both), so it may accept a caller
//! that did not make the call but rejects only what cannot be a call.

use super::CallBefore;

/// How many bytes before a return address [`call_before`] reads: the
/// longest call encoding handled (`notrack call *disp32(%r12,%rax,8)`).
pub(crate) const CALL_WINDOW: usize = 9;

/// How many bytes of a function's first instructions [`is_stub`] reads.
pub(crate) const STUB_WINDOW: usize = 11;

/// The call that ends where `before` ends (`before` holds the
/// [`CALL_WINDOW`] bytes just below return address `ret`).
pub(crate) fn call_before(before: &[u8], ret: u64) -> CallBefore {
    let mut out = CallBefore::default();
    let n = before.len();
    // `call rel32`: E8 and a 32-bit displacement from the return address.
    if n >= 5 && before[n - 5] == 0xE8 {
        let rel = i32::from_le_bytes([before[n - 4], before[n - 3], before[n - 2], before[n - 1]]);
        out.direct = Some(ret.wrapping_add_signed(i64::from(rel)));
    }
    // `call r/m64`: FF /2, with an optional REX byte and one optional
    // prefix (`notrack` 3E, `bnd` F2), a ModRM byte, an optional SIB byte
    // and a displacement. Every start from 2 to n bytes back is tried.
    for len in 2..=n {
        if indirect_call_len(&before[n - len..]) == Some(len) {
            out.indirect = true;
            break;
        }
    }
    out
}

/// The length of the indirect call that starts at `code[0]`, if one does.
fn indirect_call_len(code: &[u8]) -> Option<usize> {
    let mut i = 0;
    if matches!(code.first(), Some(0x3E | 0xF2)) {
        i += 1;
    }
    if code.get(i).is_some_and(|b| (0x40..=0x4F).contains(b)) {
        i += 1;
    }
    if *code.get(i)? != 0xFF {
        return None;
    }
    let modrm = *code.get(i + 1)?;
    if (modrm >> 3) & 7 != 2 {
        return None;
    }
    let (mode, rm) = (modrm >> 6, modrm & 7);
    let mut len = i + 2;
    if mode == 3 {
        return Some(len);
    }
    let mut disp32 = mode == 2 || (mode == 0 && rm == 5);
    if rm == 4 {
        let sib = *code.get(len)?;
        len += 1;
        if mode == 0 && sib & 7 == 5 {
            disp32 = true;
        }
    }
    if mode == 1 {
        len += 1;
    } else if disp32 {
        len += 4;
    }
    Some(len)
}

/// The targets of the direct jumps found in `body` (a function's code
/// starting at `start`), appended to `targets`; returns whether an indirect
/// jump was seen. A byte scan: it may see jumps that are not there, which
/// only makes a reach more likely to be accepted.
pub(crate) fn jumps(body: &[u8], start: u64, targets: &mut Vec<u64>) -> bool {
    let mut indirect = false;
    let at = |i: usize, len: usize, rel: i64| {
        start
            .wrapping_add(i as u64 + len as u64)
            .wrapping_add_signed(rel)
    };
    for i in 0..body.len().saturating_sub(1) {
        let rel32 = |from: usize| {
            body.get(from..from + 4)
                .map(|b| i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])))
        };
        match body[i] {
            0xE9 => {
                if let Some(rel) = rel32(i + 1) {
                    targets.push(at(i, 5, rel));
                }
            }
            0x0F if (0x80..=0x8F).contains(&body[i + 1]) => {
                if let Some(rel) = rel32(i + 2) {
                    targets.push(at(i, 6, rel));
                }
            }
            0xEB => targets.push(at(i, 2, i64::from(body[i + 1] as i8))),
            0xFF if (body[i + 1] >> 3) & 7 == 4 => indirect = true,
            _ => {}
        }
    }
    indirect
}

/// Whether the code at `head` begins with an indirect jump through memory
/// (`jmp *disp32(%rip)`, after an optional `endbr64` and `bnd`): a PLT stub,
/// which may lead to any function.
pub(crate) fn is_stub(head: &[u8]) -> bool {
    let rest = head.strip_prefix(&[0xF3, 0x0F, 0x1E, 0xFA]).unwrap_or(head);
    let rest = rest.strip_prefix(&[0xF2]).unwrap_or(rest);
    rest.starts_with(&[0xFF, 0x25])
}

/// How many bytes of a function's start [`fp_offset`] reads.
pub(crate) const PROLOGUE_WINDOW: usize = 96;

/// Where a function that keeps a frame pointer has it, relative to its
/// stack pointer at its call sites: decoded from its prologue (`code`, from
/// the function's first byte), `push %rbp; mov %rsp,%rbp`, then pushes of
/// callee-saved registers and `sub $n,%rsp`. The prologue may come after a
/// few instructions (shrink-wrapping moves it past an early return), so the
/// first `push %rbp; mov %rsp,%rbp` in `code` is taken. `None` when the
/// prologue is not of that shape (a realigned or dynamically sized frame).
pub(crate) fn fp_offset(code: &[u8]) -> Option<u64> {
    const SETUP: [u8; 4] = [0x55, 0x48, 0x89, 0xE5];
    let at = code.windows(SETUP.len()).position(|w| w == SETUP)?;
    let mut rest = &code[at + SETUP.len()..];
    let mut offset = 0u64;
    loop {
        match rest {
            // push %rbx, %rsi, %rdi (and other one-byte pushes but %rsp, %rbp)
            [0x50..=0x53 | 0x56 | 0x57, tail @ ..] => rest = tail,
            // push %r8 … %r15
            [0x41, 0x50..=0x57, tail @ ..] => rest = tail,
            _ => break,
        }
        offset += 8;
    }
    match rest {
        // sub $imm8,%rsp
        [0x48, 0x83, 0xEC, imm, ..] => u64::try_from(*imm as i8).ok().map(|imm| offset + imm),
        // sub $imm32,%rsp
        [0x48, 0x81, 0xEC, a, b, c, d, ..] => {
            let imm = i32::from_le_bytes([*a, *b, *c, *d]);
            u64::try_from(imm).ok().map(|imm| offset + imm)
        }
        // Anything else that moves the stack pointer: unknown.
        [0x48, 0x83 | 0x81, 0xE4, ..] | [0x48, 0x29, ..] | [0x48, 0x8D, 0x64, ..] => None,
        _ => Some(offset),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(code: &[u8]) -> [u8; CALL_WINDOW] {
        let mut w = [0x90; CALL_WINDOW];
        w[CALL_WINDOW - code.len()..].copy_from_slice(code);
        w
    }

    #[test]
    fn direct_calls_give_their_target() {
        // call +0x10 from a return address of 0x1000.
        let c = call_before(&window(&[0xE8, 0x10, 0, 0, 0]), 0x1000);
        assert_eq!(c.direct, Some(0x1010));
        let c = call_before(&window(&[0xE8, 0xF0, 0xFF, 0xFF, 0xFF]), 0x1000);
        assert_eq!(c.direct, Some(0xFF0));
    }

    #[test]
    fn indirect_calls_of_every_form_are_calls() {
        for code in [
            &[0xFF, 0xD0][..],               // call *%rax
            &[0x41, 0xFF, 0xD3],             // call *%r11
            &[0xFF, 0x10],                   // call *(%rax)
            &[0xFF, 0x50, 0x18],             // call *0x18(%rax)
            &[0xFF, 0x90, 0, 1, 0, 0],       // call *0x100(%rax)
            &[0xFF, 0x15, 1, 2, 3, 4],       // call *disp(%rip)
            &[0xFF, 0x54, 0x24, 0x08],       // call *8(%rsp)
            &[0x41, 0xFF, 0x14, 0xC4],       // call *(%r12,%rax,8)
            &[0xFF, 0x14, 0xC5, 1, 2, 3, 4], // call *disp(,%rax,8)
            &[0x3E, 0xFF, 0xD0],             // notrack call *%rax
        ] {
            let c = call_before(&window(code), 0x1000);
            assert!(c.indirect, "{code:02x?}");
            assert!(c.is_call());
        }
    }

    #[test]
    fn other_instructions_are_not_calls() {
        for code in [
            &[0x48, 0x89, 0xC7][..],   // mov %rax,%rdi
            &[0xFF, 0xE0],             // jmp *%rax
            &[0xCC, 0xCC, 0xCC],       // int3 padding
            &[0x48, 0x83, 0xEC, 0x28], // sub $0x28,%rsp
            &[0xFF, 0x25, 1, 2, 3, 4], // jmp *disp(%rip)
        ] {
            let c = call_before(&window(code), 0x1000);
            assert!(!c.is_call(), "{code:02x?}: {c:?}");
        }
    }

    #[test]
    fn jumps_are_found_and_indirect_jumps_noticed() {
        let mut t = Vec::new();
        // jmp +0x10 at 0; jne +0 at 5; jmp short -2 at 11
        let body = [0xE9, 0x10, 0, 0, 0, 0x0F, 0x85, 0, 0, 0, 0, 0xEB, 0xFE];
        assert!(!jumps(&body, 0x1000, &mut t));
        assert!(t.contains(&0x1015) && t.contains(&0x100B) && t.contains(&0x100B));
        t.clear();
        assert!(jumps(&[0x90, 0xFF, 0xE0], 0x1000, &mut t));
    }

    #[test]
    fn plt_stubs_are_recognised() {
        assert!(is_stub(&[0xFF, 0x25, 0, 0, 0, 0]));
        assert!(is_stub(&[
            0xF3, 0x0F, 0x1E, 0xFA, 0xF2, 0xFF, 0x25, 0, 0, 0, 0
        ]));
        assert!(!is_stub(&[0x55, 0x48, 0x89, 0xE5]));
    }

    #[test]
    fn frame_pointer_offset_from_the_prologue() {
        // endbr64; push %rbp; mov %rsp,%rbp; push %r15; push %r14; push %rbx; sub $0x28,%rsp
        let code = [
            0xF3, 0x0F, 0x1E, 0xFA, 0x55, 0x48, 0x89, 0xE5, 0x41, 0x57, 0x41, 0x56, 0x53, 0x48,
            0x83, 0xEC, 0x28,
        ];
        assert_eq!(fp_offset(&code), Some(0x28 + 24));
        // A shrink-wrapped prologue after an early return, with a large frame.
        let code = [
            0x48, 0x85, 0xFF, 0x74, 0x10, 0x55, 0x48, 0x89, 0xE5, 0x53, 0x48, 0x81, 0xEC, 0x00,
            0x10, 0x00, 0x00,
        ];
        assert_eq!(fp_offset(&code), Some(0x1000 + 8));
        // Realigned: unknown.
        let code = [0x55, 0x48, 0x89, 0xE5, 0x48, 0x83, 0xE4, 0xE0];
        assert_eq!(fp_offset(&code), None);
        // No frame pointer set up at all.
        assert_eq!(fp_offset(&[0x53, 0x48, 0x83, 0xEC, 0x10]), None);
    }
}
