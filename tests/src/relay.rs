//! Relay's acceptance rules for `profile_chunk` items, re-stated from
//! Relay's `relay-profiling` (sample v2 parsing and normalisation, debug
//! image types) so a check fails where ingestion would reject a chunk, and
//! its normalisation of a transaction's `measurements`
//! ([`measurement_violations`]).
//!
//! This file depends on `serde_json` alone: the stress run
//! (`stress/`) includes it by path, so that its release build does not pull
//! in this crate's HTTP and TLS stack.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::Value;

/// A `profile_chunk` item, parsed.
#[derive(Debug, Clone)]
pub struct ChunkItem {
    /// The item header.
    pub header: Value,
    /// The payload.
    pub payload: Value,
    /// The payload's size in bytes, as sent.
    pub payload_len: usize,
}

fn is_event_id(v: Option<&Value>) -> bool {
    v.and_then(Value::as_str).is_some_and(|s| {
        s.len() == 32
            && s.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    })
}

fn is_hex_addr(v: Option<&Value>) -> bool {
    v.and_then(Value::as_str).is_some_and(|s| {
        s.strip_prefix("0x")
            .is_some_and(|h| !h.is_empty() && u64::from_str_radix(h, 16).is_ok())
    })
}

/// Checks one chunk against Relay's rules; returns every violation.
///
/// Parsing: `version` "2", `profiler_id`/`chunk_id` event ids, `platform`
/// string matching the item header's, `client_sdk {name, version}`,
/// samples `{timestamp: number, stack_id: integer, thread_id: string}`,
/// frames with hex-string `instruction_addr`, debug images of an accepted
/// type with hex-string addresses. Normalisation: threads with at most one
/// non-empty-stack sample are removed, and the chunk is rejected if no
/// sample remains, if an index is out of range, or if the samples span more
/// than 66 s. Size: at most 50 MiB.
pub fn relay_violations(chunk: &ChunkItem) -> Vec<String> {
    let mut v = Vec::new();
    let p = &chunk.payload;
    let mut check = |ok: bool, what: &str| {
        if !ok {
            v.push(what.to_owned());
        }
    };
    check(
        chunk.payload_len <= 50 * 1024 * 1024,
        "chunk larger than 50 MiB",
    );
    check(
        p.get("version").and_then(Value::as_str) == Some("2"),
        "version is not \"2\"",
    );
    check(
        is_event_id(p.get("profiler_id")),
        "profiler_id is not 32 lowercase hex digits",
    );
    check(
        is_event_id(p.get("chunk_id")),
        "chunk_id is not 32 lowercase hex digits",
    );
    let platform = p.get("platform").and_then(Value::as_str);
    check(platform.is_some(), "platform missing");
    check(
        chunk.header.get("platform").and_then(Value::as_str) == platform,
        "item header platform missing or different from payload platform",
    );
    check(
        p.get("release").and_then(Value::as_str).is_some(),
        "release missing",
    );
    let sdk = p.get("client_sdk");
    check(
        sdk.and_then(|s| s.get("name"))
            .and_then(Value::as_str)
            .is_some()
            && sdk
                .and_then(|s| s.get("version"))
                .and_then(Value::as_str)
                .is_some(),
        "client_sdk {name, version} missing",
    );
    // `measurements`: a map of name to `{unit, values}`; the unit one of
    // Relay's `MeasurementUnit`s, each value a `value` (a number, or a
    // string holding one) and, in format V2, a `timestamp` in seconds.
    if let Some(m) = p.get("measurements") {
        let units = [
            "nanosecond",
            "ns",
            "hertz",
            "hz",
            "byte",
            "percent",
            "nanojoule",
            "nj",
        ];
        let ok = m.as_object().is_some_and(|m| {
            m.values().all(|series| {
                series
                    .get("unit")
                    .and_then(Value::as_str)
                    .is_some_and(|u| units.contains(&u))
                    && series
                        .get("values")
                        .and_then(Value::as_array)
                        .is_some_and(|vals| {
                            vals.iter().all(|v| {
                                v.get("value").is_some_and(|x| {
                                    x.is_number()
                                        || x.as_str().is_some_and(|s| s.parse::<f64>().is_ok())
                                }) && v.get("timestamp").is_none_or(Value::is_number)
                            })
                        })
            })
        });
        check(ok, "measurements not in the form Relay reads");
    }
    let accepted = ["macho", "symbolic", "sourcemap", "proguard", "jvm"];
    for img in p
        .pointer("/debug_meta/images")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        check(
            img.get("type")
                .and_then(Value::as_str)
                .is_some_and(|t| accepted.contains(&t)),
            "debug image type not accepted by Relay",
        );
        check(
            is_hex_addr(img.get("image_addr")),
            "image_addr is not a hex string",
        );
        check(
            img.get("image_vmaddr").is_none() || is_hex_addr(img.get("image_vmaddr")),
            "image_vmaddr is not a hex string",
        );
        check(
            img.get("image_size").and_then(Value::as_u64).is_some(),
            "image_size is not an integer",
        );
        check(
            img.get("code_file").and_then(Value::as_str).is_some(),
            "code_file missing",
        );
        check(
            img.get("debug_id")
                .and_then(Value::as_str)
                .is_some_and(|d| d.len() == 36 && d.chars().filter(|&c| c == '-').count() == 4),
            "debug_id missing or not a UUID",
        );
    }
    let profile = p.get("profile");
    let samples = profile
        .and_then(|x| x.get("samples"))
        .and_then(Value::as_array);
    let stacks = profile
        .and_then(|x| x.get("stacks"))
        .and_then(Value::as_array);
    let frames = profile
        .and_then(|x| x.get("frames"))
        .and_then(Value::as_array);
    let (Some(samples), Some(stacks), Some(frames)) = (samples, stacks, frames) else {
        v.push("profile.samples/stacks/frames missing".into());
        return v;
    };
    for f in frames {
        let addr = f.get("instruction_addr");
        check(
            addr.is_none() || is_hex_addr(addr),
            "frame instruction_addr is not a hex string",
        );
        check(
            addr.is_some() || f.get("function").and_then(Value::as_str).is_some(),
            "frame has neither instruction_addr nor function",
        );
    }
    for s in stacks {
        let ok = s.as_array().is_some_and(|ids| {
            ids.iter()
                .all(|i| i.as_u64().is_some_and(|i| (i as usize) < frames.len()))
        });
        check(ok, "stack refers to a missing frame");
    }
    let mut per_thread: HashMap<&str, usize> = HashMap::new();
    for s in samples {
        let tid = s.get("thread_id").and_then(Value::as_str);
        check(tid.is_some(), "sample thread_id is not a string");
        check(
            s.get("timestamp").and_then(Value::as_f64).is_some(),
            "sample timestamp is not a number",
        );
        let stack = s.get("stack_id").and_then(Value::as_u64);
        check(
            stack.is_some_and(|i| (i as usize) < stacks.len()),
            "sample refers to a missing stack",
        );
        let non_empty = stack
            .and_then(|i| stacks.get(i as usize))
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty());
        if let (Some(tid), true) = (tid, non_empty) {
            *per_thread.entry(tid).or_default() += 1;
        }
    }
    let kept: Vec<f64> = samples
        .iter()
        .filter(|s| {
            s.get("thread_id")
                .and_then(Value::as_str)
                .is_some_and(|t| per_thread.get(t).copied().unwrap_or(0) > 1)
        })
        .filter_map(|s| s.get("timestamp").and_then(Value::as_f64))
        .collect();
    check(
        !kept.is_empty(),
        "no sample survives Relay's single-sample-thread removal",
    );
    check(
        kept.len() == samples.len(),
        "chunk has threads with a single sample (Relay would drop them)",
    );
    if let (Some(min), Some(max)) = (
        kept.iter().copied().reduce(f64::min),
        kept.iter().copied().reduce(f64::max),
    ) {
        check(max - min <= 66.0, "samples span more than 66 s");
    }
    let meta: HashSet<&str> = profile
        .and_then(|x| x.get("thread_metadata"))
        .and_then(Value::as_object)
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let used: HashSet<&str> = samples
        .iter()
        .filter_map(|s| s.get("thread_id").and_then(Value::as_str))
        .collect();
    check(
        meta == used,
        "thread_metadata does not list exactly the threads with samples",
    );
    v
}

/// Sentry's default for custom measurements kept per transaction:
/// `CUSTOM_MEASUREMENT_LIMIT` in Sentry's `src/sentry/relay/config/measurements.py`,
/// which Sentry sends to Relay as `maxCustomMeasurements` in both the project
/// and the global config (Relay applies the smaller of the two).
#[allow(
    dead_code,
    reason = "the stress run, which includes this file, checks no transactions"
)]
pub const SENTRY_CUSTOM_MEASUREMENT_LIMIT: usize = 10;

/// The longest measurement name plus unit Relay keeps: its metrics
/// aggregator's default `max_name_length` (200 bytes, `relay-metrics`
/// `AggregatorConfig`) less `MeasurementsConfig::MEASUREMENT_MRI_OVERHEAD`
/// (29), the bytes of `d:transactions/measurements.` and `@` around the name
/// and unit in the metric that Relay extracts from each measurement.
const MAX_MEASUREMENT_NAME_AND_UNIT_LEN: usize = 200 - 29;

/// Sentry's built-in measurements and their units (`BUILTIN_MEASUREMENTS`
/// in Sentry's `measurements.py`). A built-in name does not count against
/// the custom limit, but Relay drops it if its unit differs or its value is
/// negative: Sentry sets no `allowNegative`, and Relay's
/// `BuiltinMeasurementKey` defaults it to false.
const SENTRY_BUILTIN_MEASUREMENTS: &[(&str, &str)] = &[
    ("app_start_cold", "millisecond"),
    ("app_start_warm", "millisecond"),
    ("cls", "none"),
    ("connection.rtt", "millisecond"),
    ("fcp", "millisecond"),
    ("fid", "millisecond"),
    ("fp", "millisecond"),
    ("frames_frozen_rate", "ratio"),
    ("frames_frozen", "none"),
    ("frames_slow_rate", "ratio"),
    ("frames_slow", "none"),
    ("frames_total", "none"),
    ("inp", "millisecond"),
    ("lcp", "millisecond"),
    ("stall_count", "none"),
    ("stall_longest_time", "millisecond"),
    ("stall_percentage", "ratio"),
    ("stall_total_time", "millisecond"),
    ("ttfb.requesttime", "millisecond"),
    ("ttfb", "millisecond"),
    ("time_to_full_display", "millisecond"),
    ("time_to_initial_display", "millisecond"),
    ("score.cls", "ratio"),
    ("score.fcp", "ratio"),
    ("score.fid", "ratio"),
    ("score.lcp", "ratio"),
    ("score.ttfb", "ratio"),
    ("score.inp", "ratio"),
    ("score.total", "ratio"),
    ("score.weight.cls", "ratio"),
    ("score.weight.fcp", "ratio"),
    ("score.weight.fid", "ratio"),
    ("score.weight.lcp", "ratio"),
    ("score.weight.ttfb", "ratio"),
    ("score.weight.inp", "ratio"),
];

/// The units Relay fills in when a measurement states none, or one it
/// cannot read (`get_metric_measurement_unit` in Relay's `event.rs`); any
/// other name gets `none`. This is Relay's own list, not Sentry's built-in
/// one: `connection.rtt` and the `score.*` names are missing from it, so
/// without a unit they get `none` and then fail the built-in check.
const RELAY_DEFAULT_UNITS: &[(&str, &str)] = &[
    ("fcp", "millisecond"),
    ("lcp", "millisecond"),
    ("fid", "millisecond"),
    ("fp", "millisecond"),
    ("inp", "millisecond"),
    ("ttfb", "millisecond"),
    ("ttfb.requesttime", "millisecond"),
    ("cls", "none"),
    ("app_start_cold", "millisecond"),
    ("app_start_warm", "millisecond"),
    ("frames_total", "none"),
    ("frames_slow", "none"),
    ("frames_slow_rate", "ratio"),
    ("frames_frozen", "none"),
    ("frames_frozen_rate", "ratio"),
    ("time_to_initial_display", "millisecond"),
    ("time_to_full_display", "millisecond"),
    ("stall_count", "none"),
    ("stall_total_time", "millisecond"),
    ("stall_longest_time", "millisecond"),
    ("stall_percentage", "ratio"),
];

/// Relay removes the mobile start and display durations above this many
/// milliseconds as outliers (`MAX_DURATION_MOBILE_MS` in
/// `relay-event-normalization`), since current SDKs no longer send them.
const MAX_MOBILE_DURATION_MS: f64 = 180_000.0;

/// Looks a name up in one of the tables above.
fn unit_in(table: &[(&str, &'static str)], name: &str) -> Option<&'static str> {
    table.iter().find(|(n, _)| *n == name).map(|&(_, u)| u)
}

/// Reads a unit string as Relay's `MetricUnit` does: the known names (and
/// the aliases `ns`, `ms`, `s`) become their canonical name, the empty string
/// is `none`, and anything else is a custom unit if it is 1 to 15 ASCII
/// letters, digits or underscores, stored lower-cased. `None` means Relay
/// cannot read it, and drops the stated unit.
fn canonical_unit(unit: &str) -> Option<String> {
    let known = match unit {
        "nanosecond" | "ns" => "nanosecond",
        "microsecond" => "microsecond",
        "millisecond" | "ms" => "millisecond",
        "second" | "s" => "second",
        "minute" | "hour" | "day" | "week" | "bit" | "byte" | "kilobyte" | "kibibyte"
        | "megabyte" | "mebibyte" | "gigabyte" | "gibibyte" | "terabyte" | "tebibyte"
        | "petabyte" | "pebibyte" | "exabyte" | "exbibyte" | "ratio" | "percent" | "none" => unit,
        "" => "none",
        custom => {
            let ok = (1..=15).contains(&custom.len())
                && custom
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_');
            return ok.then(|| custom.to_ascii_lowercase());
        }
    };
    Some(known.to_owned())
}

/// Checks a transaction's `measurements` against Relay's normalisation and
/// returns one message for each measurement Relay would remove or store
/// differently from what was sent. `max_custom` is the custom measurement
/// limit in force, [`SENTRY_CUSTOM_MEASUREMENT_LIMIT`] on sentry.io.
///
/// Re-stated from Relay: parsing in `relay-event-schema`
/// `protocol/measurements.rs` (`Measurements::from_value`, `Measurement`),
/// units in `relay-base-schema` `metrics/units.rs` (`MetricUnit::from_str`,
/// `CustomUnit::parse`), and `relay-event-normalization` `event.rs`
/// (`normalize_measurements`, `normalize_app_start_measurements`,
/// `filter_mobile_outliers`, `normalize_units`,
/// `remove_invalid_measurements`), with `can_be_valid_metric_name` from
/// `relay-base-schema` `metrics/mod.rs`. In order:
///
/// - Measurements survive on transaction events only.
/// - A name is trimmed, must then start with an ASCII letter and hold only
///   ASCII letters, digits, `_` and `.`, and is stored lower-cased.
/// - `app.start.cold` and `app.start.warm` are renamed with underscores, and
///   the four mobile start and display durations above 180 s are removed.
/// - The value must be a JSON number; anything else (a string, or `null`,
///   which is what a NaN or infinite `f64` serialises to) is replaced by no
///   value, and the entry is kept, and counted, without one.
/// - An unreadable unit is dropped; a missing or dropped unit becomes Relay's
///   default for the name (`none` for all but a few web and mobile vitals).
///   A missing unit is not reported, as the default is what it means.
/// - Removed: a name longer than 171 bytes less the unit's length; a Sentry
///   built-in name with a negative value or a unit other than its own; and,
///   in byte order of the names, every custom measurement after the first
///   `max_custom`. Built-in names do not count; custom values may be
///   negative.
///
/// Not modelled: the ratios Relay computes (`frames_*_rate`,
/// `stall_percentage`) overwrite sent measurements of those names.
#[allow(
    dead_code,
    reason = "the stress run, which includes this file, checks no transactions"
)]
pub fn measurement_violations(transaction: &Value, max_custom: usize) -> Vec<String> {
    let mut v = Vec::new();
    let Some(measurements) = transaction.get("measurements") else {
        return v;
    };
    if let Some(ty) = transaction.get("type").and_then(Value::as_str) {
        if ty != "transaction" {
            v.push(format!(
                "measurements are removed from events of type \"{ty}\""
            ));
            return v;
        }
    }
    let Some(measurements) = measurements.as_object() else {
        v.push("measurements is not an object".to_owned());
        return v;
    };

    // Relay keeps measurements in a map sorted by name, so the custom limit
    // keeps the first names in byte order whatever order they were sent in.
    let mut by_name: BTreeMap<String, (&str, &Value)> = BTreeMap::new();
    for (sent, m) in measurements {
        let name = sent.trim();
        let valid = name.starts_with(|c: char| c.is_ascii_alphabetic())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
        if !valid {
            v.push(format!(
                "measurement \"{sent}\": removed, a name must start with an ASCII letter and hold only letters, digits, '_' and '.'"
            ));
            continue;
        }
        let mut stored = name.to_ascii_lowercase();
        if let Some(renamed) = match stored.as_str() {
            "app.start.cold" => Some("app_start_cold"),
            "app.start.warm" => Some("app_start_warm"),
            _ => None,
        } {
            stored = renamed.to_owned();
        }
        if stored != *sent {
            v.push(format!("measurement \"{sent}\": stored as \"{stored}\""));
        }
        if let Some((other, _)) = by_name.insert(stored.clone(), (sent, m)) {
            v.push(format!(
                "measurement \"{sent}\": same stored name \"{stored}\" as \"{other}\", one of them is lost"
            ));
        }
    }

    let mut custom = 0;
    for (name, (sent, m)) in &by_name {
        let Some(m) = m.as_object() else {
            v.push(format!("measurement \"{sent}\": removed, not an object"));
            continue;
        };
        let value = m.get("value").and_then(Value::as_f64);
        if value.is_none() {
            v.push(format!(
                "measurement \"{sent}\": value is not a finite number, Relay keeps no value"
            ));
        }
        let is_mobile_duration = matches!(
            name.as_str(),
            "app_start_cold"
                | "app_start_warm"
                | "time_to_initial_display"
                | "time_to_full_display"
        );
        if is_mobile_duration && value.is_some_and(|x| x > MAX_MOBILE_DURATION_MS) {
            v.push(format!(
                "measurement \"{sent}\": removed, mobile durations above {MAX_MOBILE_DURATION_MS} ms are outliers"
            ));
            continue;
        }
        let stated = match m.get("unit") {
            None | Some(Value::Null) => None,
            Some(Value::String(u)) => match canonical_unit(u) {
                Some(c) => {
                    if c != *u {
                        v.push(format!(
                            "measurement \"{sent}\": unit \"{u}\" is stored as \"{c}\""
                        ));
                    }
                    Some(c)
                }
                None => {
                    v.push(format!(
                        "measurement \"{sent}\": unit \"{u}\" is not a unit Relay reads, it is replaced"
                    ));
                    None
                }
            },
            Some(other) => {
                v.push(format!(
                    "measurement \"{sent}\": unit {other} is not a string, it is replaced"
                ));
                None
            }
        };
        let unit = stated.unwrap_or_else(|| {
            unit_in(RELAY_DEFAULT_UNITS, name)
                .unwrap_or("none")
                .to_owned()
        });
        let max_name_len = MAX_MEASUREMENT_NAME_AND_UNIT_LEN - unit.len();
        if name.len() > max_name_len {
            v.push(format!(
                "measurement \"{sent}\": removed, name longer than {max_name_len} bytes with unit \"{unit}\""
            ));
            continue;
        }
        if let Some(builtin_unit) = unit_in(SENTRY_BUILTIN_MEASUREMENTS, name) {
            if value.is_some_and(|x| x < 0.0) {
                v.push(format!(
                    "measurement \"{sent}\": removed, built-in measurements may not be negative"
                ));
            } else if unit != builtin_unit {
                v.push(format!(
                    "measurement \"{sent}\": removed, built-in unit is \"{builtin_unit}\", not \"{unit}\""
                ));
            }
            continue;
        }
        if custom < max_custom {
            custom += 1;
        } else {
            v.push(format!(
                "measurement \"{sent}\": removed, beyond the {max_custom} custom measurements kept (in name order)"
            ));
        }
    }
    v
}

/// The platforms Relay keeps on an event (`VALID_PLATFORMS` in
/// `relay-event-schema`); any other value becomes `other`.
#[allow(
    dead_code,
    reason = "the stress run, which includes this file, checks no events"
)]
const RELAY_EVENT_PLATFORMS: &[&str] = &[
    "as3",
    "c",
    "cfml",
    "cocoa",
    "csharp",
    "elixir",
    "haskell",
    "go",
    "groovy",
    "java",
    "javascript",
    "native",
    "node",
    "objc",
    "other",
    "perl",
    "php",
    "python",
    "ruby",
];

/// Debug image types Relay's `DebugImage` reads.
#[allow(
    dead_code,
    reason = "the stress run, which includes this file, checks no events"
)]
const RELAY_IMAGE_TYPES: &[&str] = &[
    "apple",
    "symbolic",
    "elf",
    "macho",
    "pe",
    "pe_dotnet",
    "proguard",
    "wasm",
    "sourcemap",
    "jvm",
    "il2cpp",
    "file",
];

#[allow(
    dead_code,
    reason = "the stress run, which includes this file, checks no events"
)]
fn is_hex_id(v: Option<&Value>, len: usize) -> bool {
    v.and_then(Value::as_str).is_some_and(|s| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    })
}

/// A debug id as Relay parses it (`debugid`): a GUID, hyphenated or not,
/// optionally followed by an age.
#[allow(
    dead_code,
    reason = "the stress run, which includes this file, checks no events"
)]
fn is_debug_id(v: Option<&Value>) -> bool {
    v.and_then(Value::as_str).is_some_and(|s| {
        let hex: String = s.chars().filter(|c| *c != '-').collect();
        hex.len() >= 32 && hex.chars().all(|c| c.is_ascii_hexdigit())
    })
}

/// Checks an `event` item's payload against Relay's event schema and
/// normalization, as they touch what the crate writes: returns every
/// violation (a field Relay would drop, trim, or replace, or a reason it
/// would reject the event).
///
/// Restated from `relay-event-schema` and `relay-event-normalization`:
/// `event_id` 32 hex digits; `level` one of Relay's levels; `platform` one
/// of its valid platforms (else it becomes `other`); `timestamp` a number
/// no more than 30 days in the past nor a minute in the future (else the
/// event is dropped or its time replaced); `fingerprint` a non-empty list
/// of strings; `culprit` and `transaction` at most 200 characters, tags'
/// keys and values at most 200 and without a newline (longer ones are
/// trimmed, invalid tags removed), `message` at most 8192; every frame of
/// every thread's stack trace with an `instruction_addr` that is a hex
/// string (its address kept for Symbolicator); each debug image of a type
/// Relay reads, with a valid `debug_id` (or its legacy alias `id`), a hex
/// `image_addr` and a `code_file` (or `name`); a trace context with a 32-digit trace id and 16-digit
/// span id.
#[allow(
    dead_code,
    reason = "the stress run, which includes this file, checks no events"
)]
pub fn event_violations(event: &Value) -> Vec<String> {
    let mut v = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            v.push(what);
        }
    };
    check(
        is_event_id(event.get("event_id")),
        "event_id is not 32 lowercase hex digits".into(),
    );
    let level = event.get("level").and_then(Value::as_str);
    check(
        level.is_some_and(|l| ["debug", "info", "warning", "error", "fatal"].contains(&l)),
        format!("level {level:?} is not one of Relay's"),
    );
    let platform = event.get("platform").and_then(Value::as_str);
    check(
        platform.is_some_and(|p| RELAY_EVENT_PLATFORMS.contains(&p)),
        format!("platform {platform:?} becomes `other`"),
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let ts = event.get("timestamp").and_then(Value::as_f64);
    check(
        ts.is_some_and(|t| t > now - 30.0 * 86_400.0 && t < now + 60.0),
        format!("timestamp {ts:?} outside what Relay keeps"),
    );
    let fingerprint = event.get("fingerprint").and_then(Value::as_array);
    check(
        fingerprint.is_some_and(|f| !f.is_empty() && f.iter().all(Value::is_string)),
        "fingerprint is not a non-empty list of strings".into(),
    );
    let chars = |key: &str| {
        event
            .get(key)
            .and_then(Value::as_str)
            .map(|s| s.chars().count())
    };
    check(
        chars("culprit").is_none_or(|n| n <= 200),
        "culprit longer than 200 characters".into(),
    );
    check(
        chars("transaction").is_none_or(|n| n <= 200),
        "transaction longer than 200 characters".into(),
    );
    check(
        chars("message").is_none_or(|n| n <= 8192),
        "message longer than 8192 characters".into(),
    );
    if let Some(tags) = event.get("tags").and_then(Value::as_object) {
        for (k, val) in tags {
            let val = val.as_str().unwrap_or("");
            check(
                !k.is_empty() && k.chars().count() <= 200,
                format!("tag key {k:?} invalid"),
            );
            check(
                val.chars().count() <= 200 && !val.contains('\n'),
                format!("tag {k} value {val:?} invalid"),
            );
        }
    }
    let threads = event
        .pointer("/threads/values")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for t in &threads {
        check(
            t.get("id").is_some_and(|id| id.is_u64() || id.is_string()),
            "thread without an id".into(),
        );
        if let Some(frames) = t.pointer("/stacktrace/frames").and_then(Value::as_array) {
            check(!frames.is_empty(), "empty stack trace".into());
            for f in frames {
                check(
                    is_hex_addr(f.get("instruction_addr")),
                    format!("frame without a hex instruction_addr: {f}"),
                );
            }
        }
    }
    if let Some(images) = event
        .pointer("/debug_meta/images")
        .and_then(Value::as_array)
    {
        for im in images {
            let kind = im.get("type").and_then(Value::as_str);
            check(
                kind.is_some_and(|k| RELAY_IMAGE_TYPES.contains(&k)),
                format!("debug image type {kind:?} unknown to Relay"),
            );
            // Relay's `NativeDebugImage` reads `id` and `name` as legacy
            // aliases of `debug_id` and `code_file` (what sentry-types
            // writes).
            check(
                is_debug_id(im.get("debug_id").or_else(|| im.get("id"))),
                format!("debug image without a valid debug_id: {im}"),
            );
            check(
                is_hex_addr(im.get("image_addr")),
                format!("debug image without a hex image_addr: {im}"),
            );
            check(
                im.get("code_file")
                    .or_else(|| im.get("name"))
                    .and_then(Value::as_str)
                    .is_some(),
                format!("debug image without a code_file: {im}"),
            );
        }
    }
    if let Some(trace) = event.pointer("/contexts/trace") {
        check(
            is_hex_id(trace.get("trace_id"), 32),
            "trace context without a 32-digit trace_id".into(),
        );
        check(
            is_hex_id(trace.get("span_id"), 16),
            "trace context without a 16-digit span_id".into(),
        );
    }
    v
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::{SENTRY_CUSTOM_MEASUREMENT_LIMIT, measurement_violations};

    /// A transaction as the SDK serialises it, with the given measurements.
    fn transaction(measurements: Value) -> Value {
        json!({ "type": "transaction", "measurements": measurements })
    }

    /// The violations for `measurements`, under Sentry's default limit.
    fn check(measurements: Value) -> Vec<String> {
        measurement_violations(&transaction(measurements), SENTRY_CUSTOM_MEASUREMENT_LIMIT)
    }

    /// Asserts that exactly one violation names `name` and says `what`.
    fn assert_one(violations: &[String], name: &str, what: &str) {
        let hits: Vec<&String> = violations
            .iter()
            .filter(|m| m.contains(&format!("\"{name}\"")) && m.contains(what))
            .collect();
        assert_eq!(hits.len(), 1, "{name}: {what} in {violations:#?}");
    }

    #[test]
    fn the_tokio_measurements_are_kept_as_sent() {
        let v = check(json!({
            "tokio.polled": { "value": 12.5, "unit": "millisecond" },
            "tokio.queued": { "value": 0.0, "unit": "millisecond" },
            "tokio.awaiting": { "value": 840.25, "unit": "millisecond" },
            "tokio.longest_poll": { "value": 3.0, "unit": "millisecond" },
            "tokio.polls": { "value": 17.0, "unit": "none" },
        }));
        assert!(v.is_empty(), "{v:#?}");
    }

    #[test]
    fn no_measurements_and_a_missing_unit_are_fine() {
        assert!(measurement_violations(&json!({ "type": "transaction" }), 10).is_empty());
        // Relay fills in `none`, which is what a custom measurement without
        // a unit means anyway.
        assert!(check(json!({ "tokio.polls": { "value": 3 } })).is_empty());
        // A built-in vital without a unit gets its own unit from Relay.
        assert!(check(json!({ "lcp": { "value": 1200.0 } })).is_empty());
    }

    #[test]
    fn measurements_on_other_events_are_removed() {
        let event = json!({ "type": "error", "measurements": { "tokio.polls": { "value": 1.0 } } });
        let v = measurement_violations(&event, 10);
        assert_eq!(v.len(), 1, "{v:#?}");
        assert!(v[0].contains("\"error\""));
        let v = measurement_violations(&json!({ "measurements": [1, 2] }), 10);
        assert_eq!(v, ["measurements is not an object"]);
    }

    #[test]
    fn invalid_names_are_removed() {
        let v = check(json!({
            "tokio-polled": { "value": 1.0 },
            "1tokio.polled": { "value": 1.0 },
            "tokio polled": { "value": 1.0 },
            ".tokio": { "value": 1.0 },
            "tökio": { "value": 1.0 },
            "": { "value": 1.0 },
        }));
        assert_eq!(v.len(), 6, "{v:#?}");
        for name in [
            "tokio-polled",
            "1tokio.polled",
            "tokio polled",
            ".tokio",
            "tökio",
            "",
        ] {
            assert_one(&v, name, "removed, a name must start");
        }
    }

    #[test]
    fn names_are_trimmed_lower_cased_and_app_starts_renamed() {
        let v = check(json!({
            "Tokio.Polled": { "value": 1.0, "unit": "millisecond" },
            " tokio.queued ": { "value": 1.0, "unit": "millisecond" },
            "app.start.cold": { "value": 900.0, "unit": "millisecond" },
        }));
        assert_eq!(v.len(), 3, "{v:#?}");
        assert_one(&v, "Tokio.Polled", "stored as \"tokio.polled\"");
        assert_one(&v, " tokio.queued ", "stored as \"tokio.queued\"");
        assert_one(&v, "app.start.cold", "stored as \"app_start_cold\"");

        let v = check(json!({ "tokio.polls": { "value": 1.0 }, "TOKIO.POLLS": { "value": 2.0 } }));
        assert_one(&v, "tokio.polls", "one of them is lost");
    }

    #[test]
    fn name_and_unit_together_are_bounded() {
        // 171 bytes for name and unit: 160 + "millisecond", 167 + "none".
        let ok_ms = format!("tokio.{}", "a".repeat(154));
        let long_ms = format!("tokio.{}", "a".repeat(155));
        let ok_none = format!("tokio.{}", "b".repeat(161));
        let long_none = format!("tokio.{}", "b".repeat(162));
        let v = check(json!({
            ok_ms.clone(): { "value": 1.0, "unit": "millisecond" },
            long_ms.clone(): { "value": 1.0, "unit": "millisecond" },
            ok_none.clone(): { "value": 1.0, "unit": "none" },
            long_none.clone(): { "value": 1.0 },
        }));
        assert_eq!(v.len(), 2, "{v:#?}");
        assert_one(&v, &long_ms, "longer than 160 bytes");
        assert_one(&v, &long_none, "longer than 167 bytes");
    }

    #[test]
    fn units_are_read_as_relay_reads_them() {
        let v = check(json!({
            "a.alias": { "value": 1.0, "unit": "ms" },
            "b.custom": { "value": 1.0, "unit": "polls" },
            "c.upper": { "value": 1.0, "unit": "Polls" },
            "d.too_long": { "value": 1.0, "unit": "polls_per_second" },
            "e.spaced": { "value": 1.0, "unit": "milli second" },
            "f.number": { "value": 1.0, "unit": 5 },
            "g.empty": { "value": 1.0, "unit": "" },
        }));
        assert_eq!(v.len(), 6, "{v:#?}");
        assert_one(&v, "a.alias", "unit \"ms\" is stored as \"millisecond\"");
        assert_one(&v, "c.upper", "unit \"Polls\" is stored as \"polls\"");
        assert_one(&v, "d.too_long", "not a unit Relay reads");
        assert_one(&v, "e.spaced", "not a unit Relay reads");
        assert_one(&v, "f.number", "not a string");
        assert_one(&v, "g.empty", "unit \"\" is stored as \"none\"");
    }

    #[test]
    fn built_in_names_need_their_unit_and_no_negative_value() {
        let v = check(json!({
            "lcp": { "value": 1.0, "unit": "none" },
            "fcp": { "value": -1.0, "unit": "millisecond" },
            "cls": { "value": 0.1, "unit": "none" },
            "connection.rtt": { "value": 40.0 },
            "score.total": { "value": 0.9, "unit": "ratio" },
            "tokio.drift": { "value": -5.0, "unit": "millisecond" },
        }));
        assert_eq!(v.len(), 3, "{v:#?}");
        assert_one(&v, "lcp", "built-in unit is \"millisecond\", not \"none\"");
        assert_one(&v, "fcp", "may not be negative");
        // Relay has no default unit for this built-in name, so it gets `none`.
        assert_one(&v, "connection.rtt", "not \"none\"");
    }

    #[test]
    fn custom_measurements_beyond_the_limit_are_removed_in_name_order() {
        let mut m = serde_json::Map::new();
        // Sent in reverse order: Relay keeps the first names in byte order.
        for i in (0..12).rev() {
            m.insert(
                format!("tokio.m{i:02}"),
                json!({ "value": 1.0, "unit": "none" }),
            );
        }
        // Built-in names do not count against the limit.
        m.insert("lcp".into(), json!({ "value": 1.0, "unit": "millisecond" }));
        let v = check(Value::Object(m));
        assert_eq!(v.len(), 2, "{v:#?}");
        assert_one(&v, "tokio.m10", "beyond the 10 custom measurements");
        assert_one(&v, "tokio.m11", "beyond the 10 custom measurements");

        let v = measurement_violations(
            &transaction(json!({ "b": { "value": 1.0 }, "a": { "value": 1.0 } })),
            1,
        );
        assert_eq!(v.len(), 1, "{v:#?}");
        assert_one(&v, "b", "beyond the 1 custom");
    }

    #[test]
    fn values_must_be_finite_numbers() {
        // serde_json writes a NaN or infinite f64 as null.
        let nan = serde_json::to_value(f64::NAN).unwrap();
        let inf = serde_json::to_value(f64::INFINITY).unwrap();
        let v = check(json!({
            "a.nan": { "value": nan, "unit": "millisecond" },
            "b.inf": { "value": inf, "unit": "millisecond" },
            "c.string": { "value": "12", "unit": "millisecond" },
            "d.missing": { "unit": "millisecond" },
            "e.integer": { "value": 12, "unit": "millisecond" },
            "f.bare": 12.0,
        }));
        assert_eq!(v.len(), 5, "{v:#?}");
        for name in ["a.nan", "b.inf", "c.string", "d.missing"] {
            assert_one(&v, name, "not a finite number");
        }
        assert_one(&v, "f.bare", "removed, not an object");
    }

    #[test]
    fn mobile_outliers_are_removed() {
        let v = check(json!({
            "app_start_cold": { "value": 180_001.0, "unit": "millisecond" },
            "time_to_full_display": { "value": 180_000.0, "unit": "millisecond" },
        }));
        assert_eq!(v.len(), 1, "{v:#?}");
        assert_one(&v, "app_start_cold", "outliers");
    }
}
