//! Sets `cfg(profiling_supported)` on the targets the sampler supports.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(profiling_supported)");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    // SENTRY_PROFILING_FORCE_UNSUPPORTED builds the unsupported-platform
    // variant on a supported one, so CI can check that it compiles.
    println!("cargo::rerun-if-env-changed=SENTRY_PROFILING_FORCE_UNSUPPORTED");
    let forced_off = std::env::var_os("SENTRY_PROFILING_FORCE_UNSUPPORTED").is_some();
    if os == "linux" && (arch == "x86_64" || arch == "aarch64") && !forced_off {
        println!("cargo::rustc-cfg=profiling_supported");
    }
}
