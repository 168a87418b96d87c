//! An oracle for unwound stacks, independent of the unwinder's own check:
//! every adjacent (callee, caller) pair is held against the machine code
//! and the symbol tables of the module files on disk. The caller's address
//! must follow a call instruction, and a direct call must target the
//! callee's function (its ELF symbol), a PLT stub, or a function that jumps
//! to it (up to three functions deep). Lenient where the code cannot tell
//! (indirect calls and jumps), so a pass does not prove a pair; a failure
//! proves a frame that was not on the stack.

use std::collections::HashMap;

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};
use sentry_profiling::ModuleSet;

/// What the code says of a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing rules the pair out.
    Possible,
    /// The caller cannot have made the call.
    RuledOut,
    /// A module or the callee's symbol could not be read.
    Unknown,
}

struct ModuleCode {
    file: Vec<u8>,
    /// (vaddr, file offset, file size) of each segment.
    segments: Vec<(u64, u64, u64)>,
    /// Function symbols: (start, size), sorted.
    functions: Vec<(u64, u64)>,
    plt: Vec<(u64, u64)>,
}

impl ModuleCode {
    fn open(path: &str) -> Option<Self> {
        let file = std::fs::read(path).ok()?;
        let elf = object::File::parse(&*file).ok()?;
        let segments = elf
            .segments()
            .filter_map(|s| {
                let (offset, size) = s.file_range();
                Some((s.address(), offset, size)).filter(|_| size > 0)
            })
            .collect();
        let mut functions: Vec<(u64, u64)> = elf
            .symbols()
            .chain(elf.dynamic_symbols())
            .filter(|s| s.kind() == SymbolKind::Text && s.address() != 0)
            .map(|s| (s.address(), s.size()))
            .collect();
        functions.sort_unstable();
        functions.dedup_by(|b, a| {
            // Keep the largest size for one start.
            a.0 == b.0 && {
                a.1 = a.1.max(b.1);
                true
            }
        });
        let plt = elf
            .sections()
            .filter(|s| s.name().is_ok_and(|n| n.starts_with(".plt")))
            .map(|s| (s.address(), s.address() + s.size()))
            .collect();
        drop(elf);
        Some(Self {
            file,
            segments,
            functions,
            plt,
        })
    }

    fn read(&self, vaddr: u64, len: u64) -> Option<&[u8]> {
        let &(base, offset, size) = self
            .segments
            .iter()
            .find(|&&(base, _, size)| base <= vaddr && vaddr + len <= base + size)?;
        let from = usize::try_from(offset + vaddr - base).ok()?;
        self.file
            .get(from..from + usize::try_from(len).ok()?)
            .filter(|_| size > 0)
    }

    fn function(&self, vaddr: u64) -> Option<(u64, u64)> {
        let i = self.functions.partition_point(|&(s, _)| s <= vaddr);
        let (start, size) = *self.functions.get(i.checked_sub(1)?)?;
        (size == 0 || vaddr < start + size).then_some((start, size))
    }

    fn in_plt(&self, vaddr: u64) -> bool {
        self.plt.iter().any(|&(a, b)| (a..b).contains(&vaddr))
    }

    /// Direct jump targets and whether an indirect jump is seen (a byte
    /// scan of the function's body).
    fn jumps(&self, start: u64, size: u64) -> (Vec<u64>, bool) {
        let body = self.read(start, size.clamp(1, 1 << 16)).unwrap_or(&[]);
        let mut targets = Vec::new();
        let mut indirect = false;
        let rel32 = |i: usize| {
            body.get(i..i + 4)
                .map(|b| i64::from(i32::from_le_bytes(b.try_into().unwrap())))
        };
        for i in 0..body.len().saturating_sub(1) {
            let here = start + i as u64;
            match body[i] {
                0xE9 => targets.extend(rel32(i + 1).map(|r| (here + 5).wrapping_add_signed(r))),
                0x0F if (0x80..=0x8F).contains(&body[i + 1]) => {
                    targets.extend(rel32(i + 2).map(|r| (here + 6).wrapping_add_signed(r)))
                }
                0xEB => targets.push((here + 2).wrapping_add_signed(i64::from(body[i + 1] as i8))),
                0xFF if (body[i + 1] >> 3) & 7 == 4 => indirect = true,
                _ => {}
            }
        }
        (targets, indirect)
    }

    fn may_reach(&self, target: u64, goal: Option<u64>, depth: u32) -> bool {
        if Some(target) == goal || self.in_plt(target) {
            return true;
        }
        let Some((start, size)) = self.function(target) else {
            return false;
        };
        if depth == 0 {
            return false;
        }
        let (targets, indirect) = self.jumps(start, size);
        if indirect || goal.is_some_and(|g| targets.contains(&g)) {
            return true;
        }
        targets
            .into_iter()
            .filter(|t| !(start..start + size.max(1)).contains(t))
            .any(|t| self.may_reach(t, goal, depth - 1))
    }
}

/// The calls that may end at `ret`: the target of a direct call whose
/// bytes end there, and whether the bytes also decode as an indirect call
/// (`call *%rax` after a byte that happens to be E8 reads both ways).
fn call_ending_at(code: &ModuleCode, ret: u64) -> (Option<u64>, bool) {
    let Some(pre) = ret.checked_sub(7).and_then(|from| code.read(from, 7)) else {
        return (None, false);
    };
    let direct = (pre[2] == 0xE8).then(|| {
        let rel = i32::from_le_bytes(pre[3..7].try_into().unwrap());
        ret.wrapping_add_signed(i64::from(rel))
    });
    (direct, indirect_call_ends(pre))
}

/// Whether an indirect call (FF /2, an optional REX byte, 2 to 7 bytes
/// long) ends where `pre` ends.
fn indirect_call_ends(pre: &[u8]) -> bool {
    // FF /2 with an optional REX byte: 2 to 7 bytes long.
    for len in 2..=7usize {
        let i = 7 - len;
        let j = if (0x40..=0x4F).contains(&pre[i]) {
            i + 1
        } else {
            i
        };
        if j + 1 >= 7 || pre[j] != 0xFF || (pre[j + 1] >> 3) & 7 != 2 {
            continue;
        }
        let modrm = pre[j + 1];
        let (mode, rm) = (modrm >> 6, modrm & 7);
        let mut n = 2 + (j - i);
        if mode != 3 && rm == 4 {
            n += 1;
        }
        if mode == 1 {
            n += 1;
        } else if mode == 2 || (mode == 0 && rm == 5) {
            n += 4;
        }
        if n == len {
            return true;
        }
    }
    false
}

/// Checks pairs of frames against the module files (each read once).
#[derive(Default)]
pub(crate) struct CallChainCheck {
    modules: HashMap<String, Option<ModuleCode>>,
}

/// A module holding an address: its file's path and its load bias
/// (runtime address minus file address).
pub(crate) type Located = Option<(String, u64)>;

impl CallChainCheck {
    /// The verdict on `caller` (a return address minus one, as the
    /// unwinder reports callers) having called the function holding
    /// `callee`; `locate` names the module of an address.
    pub(crate) fn pair(
        &mut self,
        locate: impl Fn(u64) -> Located,
        callee: u64,
        caller: u64,
    ) -> Verdict {
        let (Some((epath, ebias)), Some((cpath, cbias))) = (locate(callee), locate(caller)) else {
            return Verdict::Unknown;
        };
        for path in [&epath, &cpath] {
            if !self.modules.contains_key(path) {
                self.modules.insert(path.clone(), ModuleCode::open(path));
            }
        }
        let (Some(Some(ecode)), Some(Some(ccode))) =
            (self.modules.get(&epath), self.modules.get(&cpath))
        else {
            return Verdict::Unknown;
        };
        let callee_fn = ecode.function(callee - ebias).map(|(s, _)| s);
        let ret = caller + 1 - cbias;
        match call_ending_at(ccode, ret) {
            (_, true) => Verdict::Possible,
            (None, false) => Verdict::RuledOut,
            (Some(target), false) => {
                let same_module = epath == cpath;
                if callee_fn.is_none() && !ccode.in_plt(target) {
                    Verdict::Unknown
                } else if ccode.may_reach(target, callee_fn.filter(|_| same_module), 3) {
                    Verdict::Possible
                } else {
                    Verdict::RuledOut
                }
            }
        }
    }
}

/// [`CallChainCheck::pair`]'s `locate` for the modules a sampler saw.
#[allow(
    dead_code,
    reason = "each binary that includes this module uses one way to locate"
)]
pub(crate) fn in_modules(modules: &ModuleSet) -> impl Fn(u64) -> Located + '_ {
    |addr| modules.find(addr).map(|m| (m.path.clone(), m.bias))
}
