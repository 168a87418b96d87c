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

/// Resolves addresses to function names, caching symbol tables per module
/// and results per address.
#[derive(Default)]
pub struct Symbolizer {
    tables: HashMap<String, Option<Arc<SymbolTable>>>,
    cache: HashMap<u64, Option<Arc<str>>>,
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
    /// table.
    pub fn function(&mut self, modules: &ModuleSet, addr: u64) -> Option<Arc<str>> {
        if let Some(hit) = self.cache.get(&addr) {
            return hit.clone();
        }
        let found = modules.find(addr).and_then(|m| self.resolve(m, addr));
        // Bound the cache: addresses are few in practice, but never let it
        // grow without limit in a long-running service.
        if self.cache.len() > 200_000 {
            self.cache.clear();
        }
        self.cache.insert(addr, found.clone());
        found
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
