//! Sentry symbolicates every native chunk after Relay accepts it: it sends
//! all of the chunk's frames to Symbolicator in one request, and a request
//! Symbolicator cannot read leaves the whole chunk unsymbolicated (no file
//! and line, no in-app frames, no function metrics).
//!
//! This test runs the example service, builds the request Sentry would send
//! for each chunk, checks it against Symbolicator's request schema, and then
//! symbolicates every frame with Symbolicator's own libraries (`symbolic`)
//! against this test binary (which links the example), found by its
//! `debug_id` as Symbolicator finds debug files.

use std::collections::HashMap;
use std::str::FromStr;
use std::time::Duration;

use sentry_profiling_tests::{
    http_get, local_settings, read_envelope_dir, relay_violations, run_example_service, split_items,
};
use sentry_view::{ProfileChunk, TransactionWindow, transaction_profile, what_sentry_shows};
use serde_json::{Value, json};
use symbolic_common::DebugId;
use symbolic_debuginfo::Object;
use symbolic_symcache::{SymCache, SymCacheConverter};

/// The Symbolicator request Sentry builds for a `rust` chunk, as
/// `src/sentry/profiles/task.py` does (read, not run): the modules are the
/// chunk's debug images that are native (type in Sentry's native image
/// types, with a `debug_id`) with the fields Relay keeps; the frames are
/// *all* of the chunk's frames, followed by a copy of each stack's leaf
/// frame marked `adjust_instruction_addr: false`; all in one stacktrace.
fn symbolicator_request(chunk: &Value) -> Value {
    const NATIVE: [&str; 6] = ["elf", "macho", "pe", "symbolic", "wasm", "pe_dotnet"];
    let images = chunk
        .pointer("/debug_meta/images")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let modules: Vec<Value> = images
        .into_iter()
        .filter(|i| {
            i["type"].as_str().is_some_and(|t| NATIVE.contains(&t)) && i.get("debug_id").is_some()
        })
        .map(|i| {
            // Relay's DebugImage keeps these and drops the rest.
            let mut m = serde_json::Map::new();
            for key in [
                "code_file",
                "debug_id",
                "type",
                "image_addr",
                "image_vmaddr",
                "image_size",
                "uuid",
            ] {
                if let Some(v) = i.get(key) {
                    m.insert(key.to_owned(), v.clone());
                }
            }
            Value::Object(m)
        })
        .collect();
    let p = &chunk["profile"];
    let mut frames: Vec<Value> = p["frames"].as_array().cloned().unwrap_or_default();
    for stack in p["stacks"].as_array().into_iter().flatten() {
        if let Some(leaf) = stack.get(0).and_then(Value::as_u64) {
            let mut f = p["frames"][leaf as usize].clone();
            f["adjust_instruction_addr"] = Value::Bool(false);
            frames.push(f);
        }
    }
    json!({"stacktraces": [{"frames": frames}], "modules": modules})
}

/// Symbolicator's `HexValue`: a number, or a string of `0x` and hex digits
/// (or decimal digits) that fits 64 bits.
fn hex_value(v: &Value) -> Option<u64> {
    if let Some(n) = v.as_u64() {
        return Some(n);
    }
    let s = v.as_str()?;
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Checks a request body against Symbolicator's request types as its code
/// defines them (`symbolicator-native/src/interface.rs` `RawFrame` and
/// `RawStacktrace`, `symbolicator-service` `RawObjectInfo`, read at 2026-08).
/// Restated:
/// - a stacktrace is an object with a `frames` list;
/// - a frame's `instruction_addr` is required (no default) and a
///   `HexValue`; `adjust_instruction_addr` is an optional bool; `function`,
///   `symbol`, `package`, `filename`, `abs_path` optional strings, `lineno`
///   an optional u32; unknown fields are ignored;
/// - a module's `type` is a required string; `code_id`, `code_file`,
///   `debug_id`, `debug_file` optional strings; `image_addr` a `HexValue`
///   (omitted only when 0); `image_size` an optional integer. A `debug_id`
///   that does not parse as a debug id is dropped (the image can then never
///   be found), so it must parse.
///
/// Any violation of the first kind fails the whole body with HTTP 422.
fn schema_violations(body: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for (si, st) in body["stacktraces"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let Some(frames) = st.get("frames").and_then(Value::as_array) else {
            out.push(format!("stacktrace {si} has no frames list"));
            continue;
        };
        for (fi, f) in frames.iter().enumerate() {
            match f.get("instruction_addr") {
                None => out.push(format!("frame {fi} has no instruction_addr: {f}")),
                Some(a) if hex_value(a).is_none() => out.push(format!(
                    "frame {fi} instruction_addr is not a HexValue: {a}"
                )),
                Some(_) => {}
            }
            if f.get("adjust_instruction_addr")
                .is_some_and(|v| !v.is_boolean())
            {
                out.push(format!("frame {fi}: adjust_instruction_addr not a bool"));
            }
            for key in ["function", "symbol", "package", "filename", "abs_path"] {
                if f.get(key).is_some_and(|v| !v.is_string() && !v.is_null()) {
                    out.push(format!("frame {fi}: {key} is not a string"));
                }
            }
            if f.get("lineno")
                .is_some_and(|v| v.as_u64().is_none_or(|n| n > u64::from(u32::MAX)))
            {
                out.push(format!("frame {fi}: lineno is not a u32"));
            }
        }
    }
    for (mi, m) in body["modules"].as_array().into_iter().flatten().enumerate() {
        if !m.get("type").is_some_and(Value::is_string) {
            out.push(format!("module {mi}: no string type"));
        }
        for key in ["code_id", "code_file", "debug_id", "debug_file"] {
            if m.get(key).is_some_and(|v| !v.is_string()) {
                out.push(format!("module {mi}: {key} is not a string"));
            }
        }
        match m.get("image_addr") {
            Some(a) if hex_value(a).is_none() => {
                out.push(format!("module {mi}: image_addr is not a HexValue"))
            }
            None => out.push(format!("module {mi}: no image_addr")),
            _ => {}
        }
        if m.get("image_size").is_some_and(|v| v.as_u64().is_none()) {
            out.push(format!("module {mi}: image_size is not an integer"));
        }
        if let Some(id) = m.get("debug_id").and_then(Value::as_str) {
            if DebugId::from_str(id).is_err() {
                out.push(format!("module {mi}: debug_id {id:?} does not parse"));
            }
        }
    }
    out
}

/// Where a frame address lies: the module covering it, by
/// `[image_addr, image_addr + image_size)`.
fn module_of(modules: &[Value], addr: u64) -> Option<&Value> {
    modules.iter().find(|m| {
        let start = m.get("image_addr").and_then(hex_value).unwrap_or(0);
        let size = m.get("image_size").and_then(Value::as_u64).unwrap_or(0);
        addr >= start && addr < start.saturating_add(size)
    })
}

/// What Symbolicator finds for one address of this binary: (function, file,
/// line) of every (inlined) location, innermost first.
type Resolved = Vec<(String, String, u32)>;

#[test]
fn every_chunk_symbolicates_and_work_frames_resolve_to_burn_cpu() {
    let settings = local_settings("symbolicator");
    let dir = settings.envelope_dir.clone();
    run_example_service(&settings, |addr, _shutdown| async move {
        let mut tasks = Vec::new();
        for _ in 0..2 {
            for _ in 0..3 {
                tasks.push(tokio::spawn(http_get(addr, "/work/100")));
                tasks.push(tokio::spawn(http_get(addr, "/sleep/40")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for t in tasks {
            assert!(t.await.unwrap().starts_with("HTTP/1.1 200"));
        }
    });
    let (chunks, transactions) = split_items(&read_envelope_dir(&dir));
    assert!(!chunks.is_empty());
    // The check rejects what Symbolicator rejects: the frame this crate
    // used to write for suspended lanes, and a malformed module.
    let old_suspended = json!({"stacktraces": [{"frames": [
        {"function": "(suspended: awaiting or queued)"}
    ]}], "modules": [{"type": "symbolic", "image_addr": "0x1000", "image_size": "big"}]});
    assert_eq!(schema_violations(&old_suspended).len(), 2);

    // This binary, as Symbolicator would find it by debug_id.
    let exe = std::env::current_exe().unwrap();
    let bytes = std::fs::read(&exe).unwrap();
    let object = Object::parse(&bytes).expect("this test binary parses");
    let exe_debug_id = object.debug_id();
    let mut cache_bytes = Vec::new();
    let mut converter = SymCacheConverter::new();
    converter.process_object(&object).expect("symcache");
    converter
        .serialize(&mut cache_bytes)
        .expect("symcache written");
    let cache = SymCache::parse(&cache_bytes).expect("symcache parses");

    let mut resolved: HashMap<u64, Resolved> = HashMap::new();
    let mut synthetic = 0;
    let mut in_exe = 0;
    for chunk in &chunks {
        assert!(relay_violations(chunk).is_empty());
        let body = symbolicator_request(&chunk.payload);
        let v = schema_violations(&body);
        assert!(v.is_empty(), "Symbolicator would reject the request: {v:?}");
        let modules = body["modules"].as_array().cloned().unwrap_or_default();
        let frames = body["stacktraces"][0]["frames"].as_array().unwrap();
        for (i, f) in frames.iter().enumerate() {
            let addr = hex_value(&f["instruction_addr"]).unwrap();
            let module = module_of(&modules, addr);
            if f["in_app"] == false {
                synthetic += 1;
                assert!(
                    module.is_none(),
                    "synthetic frame {f} lies in image {module:?}"
                );
                assert!(f["function"].as_str().is_some_and(|n| n.starts_with('(')));
                continue;
            }
            let Some(m) = module else { continue };
            if m["debug_id"].as_str() != Some(&exe_debug_id.to_string()) {
                continue;
            }
            in_exe += 1;
            // Symbolicator looks up the address relative to the image, one
            // byte back for callers (all but the first frame of a
            // stacktrace, unless told not to adjust).
            let adjust = i > 0 && f["adjust_instruction_addr"] != false;
            let image_addr = hex_value(&m["image_addr"]).unwrap();
            let rel = addr - image_addr - u64::from(adjust);
            let locations: Resolved = cache
                .lookup(rel)
                .map(|l| {
                    (
                        l.function().name().to_owned(),
                        l.file().map(|f| f.full_path()).unwrap_or_default(),
                        l.line(),
                    )
                })
                .collect();
            resolved.insert(addr, locations);
        }
    }
    assert!(synthetic > 0, "the chunks hold synthetic frames");
    assert!(in_exe > 0, "frames point into this binary");

    // burn_cpu's lines in the example's source.
    let source_path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/src/lib.rs");
    let source = std::fs::read_to_string(source_path).unwrap();
    let first = source
        .lines()
        .position(|l| l.starts_with("pub fn burn_cpu"))
        .unwrap() as u32
        + 1;
    let last = first
        + source
            .lines()
            .skip(first as usize)
            .position(|l| l == "}")
            .unwrap() as u32
        + 1;

    let parsed: Vec<ProfileChunk> = chunks
        .iter()
        .map(|c| ProfileChunk::from_value(&c.payload).unwrap())
        .collect();
    let work: Vec<TransactionWindow> = transactions
        .iter()
        .filter(|t| t["transaction"] == "GET /work/{ms}")
        .map(|t| TransactionWindow::from_value(t).unwrap())
        .collect();
    assert_eq!(work.len(), 6);
    let burns = |f: &sentry_view::Frame| {
        f.instruction_addr
            .and_then(|a| resolved.get(&a))
            .is_some_and(|locs| {
                locs.iter().any(|(func, file, line)| {
                    func.contains("burn_cpu")
                        && file.ends_with("examples/src/lib.rs")
                        && (first..=last).contains(line)
                })
            })
    };
    let mut in_lane = 0;
    for tx in &work {
        // The frames of the transaction: those Sentry shows for it (its
        // lane) or, where the sampler filed the request's samples under
        // the worker's OS thread (it does on a loaded machine, see
        // sentry_weighting.rs), those of the profiler's OS threads in its
        // window. This test is about symbolication; which thread a
        // sample is shown on is sentry_weighting's.
        let shown = transaction_profile(&parsed, tx);
        let lane_hit = shown.samples.iter().any(|s| shown.stack(s).any(burns));
        in_lane += usize::from(lane_hit);
        let os_hit = || {
            parsed.iter().flat_map(|c| c.thread_ids()).any(|tid| {
                let os = what_sentry_shows(&parsed, &tx.profiler_id, tid, tx.start_ns, tx.end_ns);
                os.samples.iter().any(|s| os.stack(s).any(burns))
            })
        };
        assert!(
            lane_hit || os_hit(),
            "no frame in the window of {} (thread {}) symbolicates to burn_cpu in examples/src/lib.rs:{first}-{last}",
            tx.name,
            tx.thread_id
        );
    }
    eprintln!(
        "{in_lane} of {} /work transactions show burn_cpu, symbolicated, on their lane",
        work.len()
    );
    assert!(in_lane > 0, "no /work lane shows a symbolicated burn_cpu");
    let _ = std::fs::remove_dir_all(&dir);
}
