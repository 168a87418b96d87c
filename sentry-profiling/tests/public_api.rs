//! Pins the crate root's public items, so that growing the API is a
//! decision (edit the list below, and the README) and not an accident.
//!
//! It reads `src/lib.rs` and collects every unindented `pub` item: `pub use`
//! re-exports (each name, or the name after `as`), `pub fn`, `pub mod`,
//! `pub const`, `pub static`, `pub struct`, `pub enum`, `pub type` and
//! `pub trait`. Everything else the workspace's
//! own crates need lives in the `#[doc(hidden)]` module `hooks`, which is
//! not part of the API.

/// The root's public items, sorted.
const EXPECTED: &[&str] = &[
    "BlockingStats",
    "ChunkDrops",
    "DEFAULT_BLOCKING_INTERVAL",
    "DEFAULT_BLOCKING_THRESHOLD",
    "DEFAULT_CHUNK_DURATION",
    "DEFAULT_FREQUENCY_HZ",
    "DEFAULT_HTTP_TIMEOUT",
    "DEFAULT_LONG_POLL_THRESHOLD",
    "DEFAULT_PROFILE_SESSION_SAMPLE_RATE",
    "DEFAULT_QUEUE_CAPACITY",
    "DEFAULT_STACK_COPY_BYTES",
    "EnvelopeDirTransport",
    "Error",
    "LANE_BASE",
    "MAX_BLOCKING_EVENTS_PER_MINUTE",
    "MAX_CHUNK_DURATION",
    "MAX_FREQUENCY_HZ",
    "MAX_STACK_COPY_BYTES",
    "MIN_BLOCKING_INTERVAL",
    "MIN_BLOCKING_THRESHOLD",
    "ModuleInfo",
    "ModuleSet",
    "ProfileLifecycle",
    "ProfilerStats",
    "ProfilingIntegration",
    "Sample",
    "Sampler",
    "SamplerConfig",
    "SamplerControl",
    "SamplerStats",
    "Symbolizer",
    "ThreadAttribution",
    "TransactionProfileDrops",
    "frames",
    "hooks",
    "start_profiler",
    "stats",
    "stop_profiler",
];

/// The names a `pub use` statement (without `pub use` and `;`) exports.
fn used_names(statement: &str) -> Vec<String> {
    let list = match (statement.find('{'), statement.rfind('}')) {
        (Some(a), Some(b)) => &statement[a + 1..b],
        _ => statement,
    };
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| match s.split_once(" as ") {
            Some((_, alias)) => alias.trim().to_owned(),
            None => s.rsplit("::").next().unwrap_or(s).trim().to_owned(),
        })
        .collect()
}

fn root_public_items(source: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut lines = source.lines();
    while let Some(line) = lines.next() {
        if let Some(rest) = line.strip_prefix("pub use ") {
            let mut statement = rest.to_owned();
            while !statement.trim_end().ends_with(';') {
                statement.push_str(lines.next().expect("an unterminated `pub use`"));
            }
            names.extend(used_names(statement.trim_end().trim_end_matches(';')));
            continue;
        }
        for kind in [
            "pub fn ",
            "pub mod ",
            "pub const ",
            "pub static ",
            "pub struct ",
            "pub enum ",
            "pub type ",
            "pub trait ",
        ] {
            if let Some(rest) = line.strip_prefix(kind) {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                names.push(name);
            }
        }
    }
    names.sort();
    names
}

#[test]
fn the_crate_root_exports_what_users_need_and_nothing_else() {
    let found = root_public_items(include_str!("../src/lib.rs"));
    assert_eq!(
        found, EXPECTED,
        "the crate root's public items changed: update EXPECTED (and the README) if that is intended"
    );
}

#[test]
fn the_scan_reads_each_kind_of_item() {
    let source = "pub use a::{B, c::D as E,\n    F};\npub fn g() {}\npub mod h {\n    pub fn hidden() {}\n}\nmod i;\npub const J: u8 = 0;\n";
    assert_eq!(root_public_items(source), ["B", "E", "F", "J", "g", "h"]);
}
