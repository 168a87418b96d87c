//! Headless Chromium, for tests and benchmarks that look at a page as a
//! person would (Debian's `chromium`; `.ci/run` installs it).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The Chromium binary on `PATH`, if there is one.
pub fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |d| d.join(name)))
        .find(|p| p.is_file())
}

/// A headless Chromium command for opening `url`, with the flags a
/// sandboxed, offline root session needs (no sandbox, no GPU, no
/// background connections), console messages logged to stderr, and a
/// profile directory of its own. Add `--dump-dom` or `--screenshot=PATH`.
pub fn headless(browser: &Path, profile_dir: &Path, url: &str, extra: &[String]) -> Command {
    let mut cmd = Command::new(browser);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--enable-logging=stderr",
        "--v=0",
        "--window-size=1400,1800",
    ])
    .arg(format!("--user-data-dir={}", profile_dir.display()))
    .args(extra)
    .arg(url);
    cmd
}
