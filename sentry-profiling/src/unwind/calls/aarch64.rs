//! AArch64 machine code: the call instruction that ends at a return
//! address, the branches of a function's body, and PLT stubs.
//!
//! Every instruction is 4 bytes, so decoding is exact; it is still lenient
//! where the target is unknown (a call or branch through a register may go
//! anywhere).

use super::CallBefore;

/// How many bytes before a return address [`call_before`] reads.
pub(crate) const CALL_WINDOW: usize = 4;

/// How many bytes of a function's first instructions [`is_stub`] reads
/// (a PLT stub is `adrp`, `ldr`, `add`, `br`).
pub(crate) const STUB_WINDOW: usize = 16;

/// `BLR`, `BLRAA`, `BLRAAZ`, `BLRAB`, `BLRABZ` (bit 24 and the low 12 bits
/// are masked out), and the same for `BR` and its variants.
const CALL_REG_MASK: u32 = 0xFEFF_F000;
const CALL_REG: u32 = 0xD63F_0000;
const JUMP_REG: u32 = 0xD61F_0000;

fn sext(value: u32, bits: u32) -> i64 {
    let shift = 64 - bits;
    (i64::from(value) << shift) >> shift
}

/// The call that ends where `before` ends (the instruction just below
/// return address `ret`).
pub(crate) fn call_before(before: &[u8], ret: u64) -> CallBefore {
    let mut out = CallBefore::default();
    let Some(&[a, b, c, d]) = before.get(before.len().wrapping_sub(4)..) else {
        return out;
    };
    let insn = u32::from_le_bytes([a, b, c, d]);
    let at = ret.wrapping_sub(4);
    if insn >> 26 == 0b10_0101 {
        out.direct = Some(at.wrapping_add_signed(sext(insn & 0x03FF_FFFF, 26) * 4));
    } else if insn & CALL_REG_MASK == CALL_REG {
        out.indirect = true;
    }
    out
}

/// The targets of the branches found in `body` (a function's code starting
/// at `start`), appended to `targets`; returns whether a branch through a
/// register was seen.
pub(crate) fn jumps(body: &[u8], start: u64, targets: &mut Vec<u64>) -> bool {
    let mut indirect = false;
    for (i, word) in body.chunks_exact(4).enumerate() {
        let insn = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        let at = start.wrapping_add(i as u64 * 4);
        let rel = if insn & 0xFC00_0000 == 0x1400_0000 {
            // B
            Some(sext(insn & 0x03FF_FFFF, 26))
        } else if insn & 0xFF00_0010 == 0x5400_0000 || insn & 0x7E00_0000 == 0x3400_0000 {
            // B.cond, CBZ, CBNZ
            Some(sext((insn >> 5) & 0x7_FFFF, 19))
        } else if insn & 0x7E00_0000 == 0x3600_0000 {
            // TBZ, TBNZ
            Some(sext((insn >> 5) & 0x3FFF, 14))
        } else {
            if insn & CALL_REG_MASK == JUMP_REG {
                indirect = true;
            }
            None
        };
        if let Some(rel) = rel {
            targets.push(at.wrapping_add_signed(rel * 4));
        }
    }
    indirect
}

/// Whether the code at `head` is a PLT stub: a branch through a register
/// among its first four instructions.
pub(crate) fn is_stub(head: &[u8]) -> bool {
    head.chunks_exact(4)
        .any(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]) & CALL_REG_MASK == JUMP_REG)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bl_gives_its_target_and_blr_is_a_call() {
        // bl +8 at 0x0ffc (return address 0x1000).
        let window: [u8; CALL_WINDOW] = 0x9400_0002u32.to_le_bytes();
        let c = call_before(&window, 0x1000);
        assert_eq!(c.direct, Some(0x1004));
        // bl -4
        let c = call_before(&0x97FF_FFFFu32.to_le_bytes(), 0x1000);
        assert_eq!(c.direct, Some(0xFF8));
        for blr in [0xD63F_0100u32, 0xD63F_081F, 0xD73F_0811] {
            assert!(call_before(&blr.to_le_bytes(), 0x1000).indirect, "{blr:x}");
        }
        // ret, br x16, nop
        for other in [0xD65F_03C0u32, 0xD61F_0200, 0xD503_201F] {
            assert!(
                !call_before(&other.to_le_bytes(), 0x1000).is_call(),
                "{other:x}"
            );
        }
    }

    #[test]
    fn branches_are_found_and_register_branches_noticed() {
        let mut t = Vec::new();
        let body: Vec<u8> = [0x1400_0004u32, 0x5400_0040, 0xB400_0020, 0x3600_0040]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        assert!(!jumps(&body, 0x1000, &mut t));
        assert_eq!(t, [0x1010, 0x100C, 0x100C, 0x1014]);
        assert!(jumps(&0xD61F_0220u32.to_le_bytes(), 0x1000, &mut t));
    }

    #[test]
    fn plt_stubs_are_recognised() {
        let stub: Vec<u8> = [0x9000_0010u32, 0xF940_0211, 0x9100_0210, 0xD61F_0220]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        assert!(is_stub(&stub[..STUB_WINDOW]));
        assert!(!is_stub(&0xA9BF_7BFDu32.to_le_bytes()));
    }
}
