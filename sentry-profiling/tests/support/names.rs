//! Function names of a sample's frames, for the sampler test binaries that
//! check what was unwound.

use sentry_profiling::{ModuleSet, Sample, Symbolizer};

/// The function name of each of `sample`'s frames, innermost first (empty
/// where the symbol tables name none).
pub(crate) fn function_names(
    sym: &mut Symbolizer,
    modules: &ModuleSet,
    sample: &Sample,
) -> Vec<String> {
    sample
        .frames()
        .iter()
        .map(|&a| {
            sym.function(modules, a)
                .map(|n| n.to_string())
                .unwrap_or_default()
        })
        .collect()
}
