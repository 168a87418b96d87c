//! Relay's acceptance rules for `profile_chunk` items, re-stated from
//! Relay's `relay-profiling` (sample v2 parsing and normalisation, debug
//! image types) so a check fails where ingestion would reject a chunk.
//!
//! This file depends on `serde_json` alone: the stress run
//! (`stress/`) includes it by path, so that its release build does not pull
//! in this crate's HTTP and TLS stack.

use std::collections::{HashMap, HashSet};

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
