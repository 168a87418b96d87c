//! Local symbolication: function names from each module's ELF symbol table,
//! read from the file on disk (memory-mapped) off the signal path.
//!
//! Sentry symbolicates native frames on the server from uploaded debug
//! files; names resolved here fill the frames' `function` field so that a
//! profile is readable even without them.

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

use object::{Object, ObjectSymbol, SymbolKind};

use crate::unwind::{ModuleInfo, ModuleSet};

/// Symbols of one file: sorted `(start, end, name offset, name length)`
/// entries pointing into the mapped file.
struct SymbolTable {
    map: memmap2::Mmap,
    entries: Vec<(u64, u64, u32, u32)>,
}

impl SymbolTable {
    fn open(path: &str) -> Option<Self> {
        let file = std::fs::File::open(path).ok()?;
        // SAFETY: the file is mapped read-only; if another process truncates
        // it while mapped, reads could fault, which is the usual and accepted
        // risk of reading one's own executable and libraries this way.
        let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
        let base = map.as_ptr() as usize;
        let mut entries = Vec::new();
        {
            let obj = object::File::parse(&*map).ok()?;
            let add = |entries: &mut Vec<_>, sym: object::Symbol<'_, '_>| {
                if sym.kind() != SymbolKind::Text || sym.address() == 0 {
                    return;
                }
                let Ok(name) = sym.name_bytes() else { return };
                let off = name.as_ptr() as usize - base;
                entries.push((
                    sym.address(),
                    sym.address() + sym.size().max(1),
                    off as u32,
                    name.len() as u32,
                ));
            };
            obj.symbols().for_each(|s| add(&mut entries, s));
            if entries.is_empty() {
                obj.dynamic_symbols().for_each(|s| add(&mut entries, s));
            }
        }
        entries.sort_unstable_by_key(|e| (e.0, std::cmp::Reverse(e.1)));
        Some(Self { map, entries })
    }

    fn lookup(&self, svma: u64) -> Option<&[u8]> {
        let idx = self.entries.partition_point(|e| e.0 <= svma);
        // Walk back over symbols that start before the address until one
        // covers it (nested or zero-sized neighbours).
        for e in self.entries[..idx].iter().rev().take(4) {
            if svma < e.1 {
                return self.map.get(e.2 as usize..(e.2 + e.3) as usize);
            }
        }
        None
    }
}

/// Most addresses whose function is cached; the cache starts over beyond
/// it (a large binary's hot code reaches this many distinct program
/// counters only over days).
const MAX_CACHED_ADDRESSES: usize = 65_536;

/// Resolves addresses to function names, caching symbol tables per module
/// and results per address. Both caches follow the modules: when the
/// module set changes (a library loaded or unloaded), cached addresses are
/// forgotten (another library may now sit at them) and the symbol tables of
/// modules no longer in the set are closed, so neither grows with the
/// libraries a process loads and unloads over its life.
#[derive(Default)]
pub struct Symbolizer {
    tables: HashMap<String, Option<Arc<SymbolTable>>>,
    cache: HashMap<u64, Option<Arc<str>>>,
    /// The modules of the set the caches were filled for.
    modules_seen: Vec<Arc<ModuleInfo>>,
    /// The address of that set, which spares comparing the modules while
    /// the same set is passed.
    set_seen: usize,
}

impl std::fmt::Debug for Symbolizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Symbolizer")
            .field("modules", &self.tables.len())
            .field("addresses", &self.cache.len())
            .finish()
    }
}

impl Symbolizer {
    /// An empty symbolizer.
    pub fn new() -> Self {
        Self::default()
    }

    /// The function containing `addr`, demangled, if the module has a symbol
    /// table; for a frame the sampler makes up (a period a thread waited
    /// for a CPU, or ran with no stack captured, or the end of a stack not
    /// unwound further), its name, such as `(waiting for a CPU)`.
    pub fn function(&mut self, modules: &ModuleSet, addr: u64) -> Option<Arc<str>> {
        if let Some((_, name)) = crate::frames::synthetic_frame(addr) {
            return Some(Arc::from(name));
        }
        self.follow(modules);
        if let Some(hit) = self.cache.get(&addr) {
            return hit.clone();
        }
        let found = modules.find(addr).and_then(|m| self.resolve(m, addr));
        if self.cache.len() >= MAX_CACHED_ADDRESSES {
            self.cache.clear();
        }
        self.cache.insert(addr, found.clone());
        found
    }

    /// Whether the caches were filled for `modules`.
    fn follows(&self, modules: &ModuleSet) -> bool {
        let mut seen = self.modules_seen.iter();
        modules.iter().all(|m| seen.next() == Some(m)) && seen.next().is_none()
    }

    /// Makes the caches those of `modules` (see [`Symbolizer`]).
    fn follow(&mut self, modules: &ModuleSet) {
        let set = std::ptr::from_ref(modules) as usize;
        if set == self.set_seen && modules.iter().count() == self.modules_seen.len() {
            return;
        }
        self.set_seen = set;
        if self.follows(modules) {
            return;
        }
        self.cache.clear();
        self.modules_seen = modules.iter().cloned().collect();
        let present: std::collections::HashSet<&str> = modules
            .iter()
            .chain(modules.retired())
            .map(|m| m.path.as_str())
            .collect();
        self.tables
            .retain(|path, _| present.contains(path.as_str()));
    }

    fn resolve(&mut self, module: &ModuleInfo, addr: u64) -> Option<Arc<str>> {
        let table = self
            .tables
            .entry(module.path.clone())
            .or_insert_with(|| SymbolTable::open(&module.path).map(Arc::new))
            .clone()?;
        let raw = table.lookup(addr.checked_sub(module.bias)?)?;
        let name = std::str::from_utf8(raw).ok()?;
        Some(Arc::from(
            format!("{:#}", rustc_demangle::demangle(name)).as_str(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(paths: &[(&str, u64)]) -> ModuleSet {
        ModuleSet::for_tests(
            paths
                .iter()
                .map(|(path, start)| {
                    Arc::new(ModuleInfo {
                        path: (*path).into(),
                        start: *start,
                        end: start + 0x1000,
                        vmaddr: 0,
                        bias: *start,
                        build_id: None,
                    })
                })
                .collect(),
        )
    }

    #[test]
    fn caches_follow_the_modules_loaded() {
        let mut s = Symbolizer::new();
        let first = set(&[("/missing/app", 0x1000), ("/missing/plugin.so", 0x8000)]);
        assert_eq!(s.function(&first, 0x1010), None);
        assert_eq!(s.function(&first, 0x8010), None);
        assert_eq!(s.tables.len(), 2);
        assert_eq!(s.cache.len(), 2);
        // The plugin unloaded, another library at its addresses.
        let second = set(&[("/missing/app", 0x1000), ("/missing/other.so", 0x8000)]);
        assert_eq!(s.function(&second, 0x1010), None);
        assert!(
            !s.tables.contains_key("/missing/plugin.so"),
            "the unloaded library's table is closed"
        );
        assert_eq!(s.cache.len(), 1, "addresses are looked up again");
        // The same set again: nothing is forgotten.
        s.function(&second, 0x8010);
        s.function(&second, 0x1010);
        assert_eq!(s.cache.len(), 2);
        assert_eq!(s.tables.len(), 2);
    }

    #[test]
    fn the_address_cache_is_bounded() {
        let mut s = Symbolizer::new();
        let modules = set(&[("/missing/app", 0)]);
        for addr in 0..(MAX_CACHED_ADDRESSES as u64 + 10) {
            s.function(&modules, addr);
        }
        assert!(s.cache.len() <= MAX_CACHED_ADDRESSES);
    }
}
