//! A shared library for the stress run: CPU work behind a C ABI, so that
//! profiling samples land inside a module that is loaded and unloaded over
//! and over.
//!
//! It uses no thread-local storage with destructors: a library that
//! registers one can no longer be unloaded by `dlclose` (the loader pins
//! it until the thread exits), and the point is to unload it.

/// Mixes `rounds` times, starting from `seed`; the result depends on every
/// round, so the work cannot be skipped.
#[inline(never)]
fn mix(seed: u64, rounds: u64) -> u64 {
    let mut x = seed;
    for i in 0..rounds {
        x = core::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i));
        x ^= x >> 29;
    }
    x
}

/// Spins for `rounds` mixing rounds from `seed`, through a chain of a few
/// calls so that unwinding has frames of this library to walk.
#[unsafe(no_mangle)]
pub extern "C" fn stress_cdylib_spin(seed: u64, rounds: u64) -> u64 {
    spin_outer(seed, rounds)
}

#[inline(never)]
fn spin_outer(seed: u64, rounds: u64) -> u64 {
    let half = rounds / 2;
    core::hint::black_box(spin_inner(seed, half)) ^ spin_inner(seed.rotate_left(7), rounds - half)
}

#[inline(never)]
fn spin_inner(seed: u64, rounds: u64) -> u64 {
    mix(seed, rounds)
}
