//! Sets `cfg(profiling_supported)` on the targets the sampler supports.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(profiling_supported)");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if os == "linux" && (arch == "x86_64" || arch == "aarch64") {
        println!("cargo::rustc-cfg=profiling_supported");
    }
}
