//! Unwinding copied stacks with framehop, and the list of loaded modules that
//! both the unwinder and the chunk encoder (debug images) need.
//!
//! The unwinder lives on the sampler thread and is updated in place when the
//! loader's generation counter moves. The module list is published through
//! an [`ArcSwap`] so the chunk thread can read it without a lock.

use std::sync::Arc;

#[cfg(profiling_supported)]
use arc_swap::ArcSwap;
#[cfg(profiling_supported)]
use framehop::{ExplicitModuleSectionInfo, FrameAddress, MayAllocateDuringUnwind, Unwinder as _};

#[cfg(profiling_supported)]
use crate::sys::{self, LoadedImage, Regs};

#[cfg(profiling_supported)]
mod blocked;
#[cfg(profiling_supported)]
mod calls;
mod debug_id;
#[cfg(profiling_supported)]
mod signal_frame;

pub(crate) use debug_id::debug_id_from_build_id;

/// Upper bound on frames per stack; deeper stacks are truncated at the root.
#[cfg(profiling_supported)]
pub(crate) const MAX_FRAMES: usize = 512;

#[cfg(profiling_supported)]
//
// The sampler thread is no signal handler: it may allocate, so DWARF
// evaluation is not limited to framehop's fixed storage.
type NativeUnwinder = framehop::UnwinderNative<sys::ImageBytes, MayAllocateDuringUnwind>;
#[cfg(profiling_supported)]
type NativeCache = framehop::CacheNative<MayAllocateDuringUnwind>;

/// A loaded module as the encoders see it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ModuleInfo {
    /// Path of the file.
    pub path: String,
    /// First runtime address of the module.
    pub start: u64,
    /// End of the module's runtime range (exclusive).
    pub end: u64,
    /// Lowest virtual address in the file (`image_vmaddr`).
    pub vmaddr: u64,
    /// Load bias (runtime minus file address).
    pub bias: u64,
    /// GNU build-id, when the file has one.
    pub build_id: Option<Vec<u8>>,
}

impl ModuleInfo {
    /// The build-id as lowercase hex (Sentry's `code_id`).
    pub fn code_id(&self) -> Option<String> {
        self.build_id
            .as_ref()
            .map(|b| b.iter().map(|x| format!("{x:02x}")).collect())
    }

    /// Sentry's `debug_id` for this ELF module, derived from its GNU build-id.
    pub fn debug_id(&self) -> Option<String> {
        self.build_id.as_deref().map(debug_id_from_build_id)
    }

    /// Whether `addr` lies within the module.
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }
}

/// A snapshot of the loaded modules, sorted by start address, and of the
/// modules unloaded recently.
///
/// Samples are encoded up to a chunk's length after they were taken; a
/// library `dlclose`d in between would leave its frames without a debug
/// image and a name. So a module that leaves stays findable for 90 s
/// (unless another module takes its addresses: loaded modules come first).
#[derive(Debug, Default, Clone)]
pub struct ModuleSet {
    modules: Vec<Arc<ModuleInfo>>,
    retired: Vec<Arc<ModuleInfo>>,
}

/// How long an unloaded module stays in the [`ModuleSet`]: longer than the
/// longest chunk, so every sample taken while it was loaded is encoded with
/// it.
#[cfg(profiling_supported)]
pub(crate) const RETIRED_FOR: std::time::Duration = std::time::Duration::from_secs(90);
/// At most this many unloaded modules are kept (the oldest go first).
#[cfg(any(profiling_supported, test))]
const MAX_RETIRED: usize = 256;

impl ModuleSet {
    /// The loaded module containing `addr`, or else the most recently
    /// unloaded one that did.
    pub fn find(&self, addr: u64) -> Option<&Arc<ModuleInfo>> {
        let idx = self.modules.partition_point(|m| m.start <= addr);
        idx.checked_sub(1)
            .and_then(|i| self.modules.get(i))
            .filter(|m| m.contains(addr))
            .or_else(|| self.retired.iter().rev().find(|m| m.contains(addr)))
    }

    /// All loaded modules.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<ModuleInfo>> {
        self.modules.iter()
    }

    /// A set of `modules` (sorted by start), none unloaded.
    #[cfg(test)]
    pub(crate) fn for_tests(mut modules: Vec<Arc<ModuleInfo>>) -> Self {
        modules.sort_by_key(|m| m.start);
        Self {
            modules,
            retired: Vec::new(),
        }
    }

    /// The modules unloaded recently, kept to encode samples taken while
    /// they were loaded.
    pub(crate) fn retired(&self) -> impl Iterator<Item = &Arc<ModuleInfo>> {
        self.retired.iter()
    }
}

/// Updates the unloaded modules when the loaded set changes from `previous`
/// to `current` at `now`: modules that left are added (newest last), those
/// loaded again and those unloaded longer than [`RETIRED_FOR`] ago are
/// dropped, and at most [`MAX_RETIRED`] are kept.
#[cfg(any(profiling_supported, test))]
fn retire<T: Copy + Ord>(
    retired: &mut Vec<(Arc<ModuleInfo>, T)>,
    previous: &[Arc<ModuleInfo>],
    current: &[Arc<ModuleInfo>],
    now: T,
    expired_before: T,
) {
    retired.retain(|(m, at)| *at >= expired_before && !current.contains(m));
    for m in previous {
        if !current.contains(m) && !retired.iter().any(|(r, _)| r == m) {
            retired.push((Arc::clone(m), now));
        }
    }
    let excess = retired.len().saturating_sub(MAX_RETIRED);
    retired.drain(..excess);
}

/// Where the current [`ModuleSet`] is published.
#[cfg(profiling_supported)]
pub(crate) type SharedModules = Arc<ArcSwap<ModuleSet>>;

/// The sampler thread's unwinder.
#[cfg(profiling_supported)]
pub(crate) struct StackUnwinder {
    unwinder: NativeUnwinder,
    cache: NativeCache,
    generation: Option<u64>,
    /// Whether the module list was checked since the current tick began
    /// (see [`StackUnwinder::new_tick`]).
    checked: bool,
    loaded: Vec<u64>,
    /// Checks callers against the machine code (see `blocked`).
    calls: calls::CallChecker,
    /// Where signal handlers return to (see `signal_frame`).
    restorers: Vec<u64>,
    retired: Vec<(Arc<ModuleInfo>, std::time::Instant)>,
    published: SharedModules,
}

#[cfg(profiling_supported)]
impl std::fmt::Debug for StackUnwinder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StackUnwinder")
            .field("modules", &self.loaded.len())
            .finish()
    }
}

#[cfg(profiling_supported)]
impl StackUnwinder {
    /// An unwinder with the currently loaded modules.
    pub(crate) fn new(published: SharedModules) -> Self {
        let mut this = Self {
            unwinder: NativeUnwinder::new(),
            cache: NativeCache::new_in(),
            generation: None,
            checked: false,
            loaded: Vec::new(),
            calls: calls::CallChecker::default(),
            restorers: Vec::new(),
            retired: Vec::new(),
            published,
        };
        this.refresh_modules();
        this
    }

    /// Re-reads the module list if a library was loaded or unloaded since the
    /// last call. Returns whether anything changed.
    pub(crate) fn refresh_modules(&mut self) -> bool {
        self.checked = true;
        let generation = sys::image_generation();
        if self.generation == Some(generation) {
            return false;
        }
        self.generation = Some(generation);
        let images = sys::loaded_images();
        self.restorers = sys::signal_restorers();
        for start in self.loaded.drain(..) {
            self.unwinder.remove_module(start);
        }
        let mut infos = Vec::with_capacity(images.len());
        self.calls.set_modules(&images);
        for image in images {
            infos.push(Arc::new(ModuleInfo {
                path: image.path.clone(),
                start: image.start,
                end: image.end,
                vmaddr: image.vmaddr,
                bias: image.bias,
                build_id: image.build_id.clone(),
            }));
            self.loaded.push(image.start);
            self.unwinder.add_module(to_framehop(image));
        }
        infos.sort_by_key(|m| m.start);
        let now = std::time::Instant::now();
        retire(
            &mut self.retired,
            &self.published.load().modules,
            &infos,
            now,
            now.checked_sub(RETIRED_FOR).unwrap_or(now),
        );
        self.published.store(Arc::new(ModuleSet {
            modules: infos,
            retired: self.retired.iter().map(|(m, _)| Arc::clone(m)).collect(),
        }));
        true
    }

    /// A tick begins: the module list is checked again before its first
    /// unwind. Checking it takes the loader's lock (`dl_iterate_phdr`), which
    /// a tick with nothing to unwind is spared.
    pub(crate) fn new_tick(&mut self) {
        self.checked = false;
    }

    /// Checks the module list if this tick has not yet.
    fn check_modules(&mut self) {
        if !self.checked {
            self.refresh_modules();
        }
    }

    /// Unwinds a copied stack into `frames` (leaf first). The first entry is
    /// the interrupted PC; the others are return addresses minus one, so that
    /// each points into its call instruction, or stand for a signal frame
    /// (see `signal_frame`).
    pub(crate) fn unwind(&mut self, regs: &Regs, stack: &[u8], frames: &mut Vec<u64>) {
        self.check_modules();
        frames.clear();
        let sp = regs.sp;
        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            let off = usize::try_from(addr.checked_sub(sp).ok_or(())?).map_err(|_| ())?;
            let bytes = stack.get(off..off.checked_add(8).ok_or(())?).ok_or(())?;
            Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| ())?))
        };
        #[cfg(target_arch = "x86_64")]
        let mut unwind_regs = UnwindRegs::new(regs.pc, regs.sp, regs.fp);
        #[cfg(target_arch = "aarch64")]
        let mask = framehop::aarch64::PtrAuthMask::from_max_known_address(
            self.unwinder.max_known_code_address(),
        );
        #[cfg(target_arch = "aarch64")]
        let mut unwind_regs = UnwindRegs::new_with_ptr_auth_mask(mask, regs.lr, regs.sp, regs.fp);
        let mut address = FrameAddress::from_instruction_pointer(regs.pc);
        frames.push(regs.pc);
        while frames.len() < MAX_FRAMES {
            let step = self.unwinder.unwind_frame(
                address,
                &mut unwind_regs,
                &mut self.cache,
                &mut read_stack,
            );
            let Ok(Some(ret)) = step else {
                break;
            };
            #[cfg(target_arch = "aarch64")]
            let ret = mask.strip_ptr_auth(ret);
            match self.caller(ret, &mut unwind_regs, &mut read_stack) {
                Caller::Called(next) => {
                    frames.push(next.address_for_lookup());
                    address = next;
                }
                Caller::Interrupted(pc) => {
                    frames.extend([crate::frames::SIGNAL_HANDLER_FRAME, interrupted_frame(pc)]);
                    address = FrameAddress::from_instruction_pointer(pc);
                }
                Caller::Unreadable | Caller::None => break,
            }
        }
    }

    /// What a frame's return address `ret` leads to, `regs` the frame's
    /// caller's registers as unwound: a call site, or (`ret` a signal
    /// restorer) the code a signal interrupted, `regs` then set to its
    /// registers from the signal frame (see `signal_frame`).
    fn caller(
        &self,
        ret: u64,
        regs: &mut UnwindRegs,
        read_stack: &mut impl FnMut(u64) -> Result<u64, ()>,
    ) -> Caller {
        if self.restorers.contains(&ret) {
            return match signal_frame::interrupted(regs, read_stack) {
                Some((pc, interrupted)) => {
                    *regs = interrupted;
                    Caller::Interrupted(pc)
                }
                None => Caller::Unreadable,
            };
        }
        FrameAddress::from_return_address(ret).map_or(Caller::None, Caller::Called)
    }
}

/// The entry that stands for an instruction a signal interrupted, where it
/// is not the leaf: one byte past its first, inside it, as a return
/// address minus one is inside its call. Sentry's symbolication takes one
/// byte off every frame's address but the leaf's; the instruction's own
/// address would then name the function before it when the signal came at
/// a function's first instruction.
#[cfg(profiling_supported)]
fn interrupted_frame(pc: u64) -> u64 {
    pc.saturating_add(1)
}

/// The caller of a frame (see [`StackUnwinder::caller`]).
#[cfg(profiling_supported)]
enum Caller {
    /// A call site.
    Called(FrameAddress),
    /// The instruction a signal interrupted: its handler's frame returned
    /// to a restorer.
    Interrupted(u64),
    /// A signal frame whose saved registers cannot be read or lead down.
    Unreadable,
    /// None that can be shown.
    None,
}

#[cfg(all(profiling_supported, target_arch = "x86_64"))]
type UnwindRegs = framehop::x86_64::UnwindRegsX86_64;
#[cfg(all(profiling_supported, target_arch = "aarch64"))]
type UnwindRegs = framehop::aarch64::UnwindRegsAarch64;

#[cfg(profiling_supported)]
fn to_framehop(image: LoadedImage) -> framehop::Module<sys::ImageBytes> {
    let range = |s: &sys::Section| s.svma..s.svma + s.bytes.len() as u64;
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: image.text.as_ref().map(range),
        eh_frame_hdr_svma: image.eh_frame_hdr.as_ref().map(range),
        eh_frame_svma: image.eh_frame.as_ref().map(range),
        text: image.text.map(|s| s.bytes),
        eh_frame_hdr: image.eh_frame_hdr.map(|s| s.bytes),
        eh_frame: image.eh_frame.map(|s| s.bytes),
        ..Default::default()
    };
    framehop::Module::new(image.path, image.start..image.end, image.bias, info)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(path: &str, start: u64) -> Arc<ModuleInfo> {
        Arc::new(ModuleInfo {
            path: path.into(),
            start,
            end: start + 0x1000,
            vmaddr: 0,
            bias: start,
            build_id: Some(path.as_bytes().to_vec()),
        })
    }

    #[test]
    fn unloaded_modules_stay_findable_until_they_expire_or_are_replaced() {
        let (exe, plugin, other) = (
            module("/bin/app", 0x1000),
            module("/lib/plugin.so", 0x8000),
            module("/lib/other.so", 0x8000),
        );
        let mut retired = Vec::new();
        let loaded = vec![Arc::clone(&exe), Arc::clone(&plugin)];
        let now_loaded = vec![Arc::clone(&exe)];
        retire(&mut retired, &loaded, &now_loaded, 10u64, 0);
        let set = ModuleSet {
            modules: now_loaded.clone(),
            retired: retired.iter().map(|(m, _)| Arc::clone(m)).collect(),
        };
        assert_eq!(set.find(0x8010).map(|m| &*m.path), Some("/lib/plugin.so"));
        assert_eq!(set.find(0x1010).map(|m| &*m.path), Some("/bin/app"));
        assert_eq!(set.find(0x20000), None);
        assert_eq!(set.iter().count(), 1, "iter lists loaded modules only");

        // Another library at the same addresses wins over the unloaded one.
        let with_other = vec![Arc::clone(&exe), Arc::clone(&other)];
        retire(&mut retired, &now_loaded, &with_other, 20, 0);
        let set = ModuleSet {
            modules: with_other.clone(),
            retired: retired.iter().map(|(m, _)| Arc::clone(m)).collect(),
        };
        assert_eq!(set.find(0x8010).map(|m| &*m.path), Some("/lib/other.so"));

        // Loaded again: no longer retired. Expired: gone.
        retire(&mut retired, &with_other, &loaded, 30, 0);
        assert!(retired.iter().all(|(m, _)| m.path != "/lib/plugin.so"));
        assert!(retired.iter().any(|(m, _)| m.path == "/lib/other.so"));
        retire(&mut retired, &loaded, &loaded, 200, 100);
        assert!(retired.is_empty(), "expired modules are dropped");

        // Bounded.
        for i in 0..(MAX_RETIRED as u64 + 10) {
            let m = module(&format!("/lib/p{i}.so"), 0x100_0000 + i * 0x1000);
            retire(&mut retired, &[m], &[], 300 + i, 0);
        }
        assert_eq!(retired.len(), MAX_RETIRED);
        assert_eq!(retired[0].1, 310, "the oldest went first");
    }

    /// A word on the stack that points into a module's data (a static) is
    /// not taken for a return address when a blocked thread's frame
    /// pointer is searched for; one that points into its code is.
    ///
    /// The static is a writable one: read-only data may share the
    /// executable segment (aarch64's linker does so by default), and there
    /// only the call check tells it from a return address.
    #[cfg(profiling_supported)]
    #[test]
    fn only_code_counts_as_a_return_address() {
        static DATA: [std::sync::atomic::AtomicU64; 4] =
            [const { std::sync::atomic::AtomicU64::new(1) }; 4];
        #[inline(never)]
        fn some_code() -> u64 {
            std::hint::black_box(7)
        }
        let unwinder = StackUnwinder::new(Arc::new(ArcSwap::from_pointee(ModuleSet::default())));
        let code = some_code as *const () as u64;
        let data = std::hint::black_box(&DATA) as *const _ as u64;
        assert!(unwinder.calls.in_code(code));
        assert!(!unwinder.calls.in_code(data));
        // Both lie in the same module: its range alone does not tell them
        // apart.
        let modules = unwinder.published.load();
        let (a, b) = (modules.find(code), modules.find(data));
        assert!(a.is_some() && b.is_some() && a.map(|m| m.start) == b.map(|m| m.start));
    }
}
