//! pprof and OTLP exports of the example service: the files it writes at
//! shutdown decode, carry `burn_cpu`, build-ids and file names, and every
//! span link points at a transaction of the run; `go tool pprof` reads the
//! pprof file, shows `burn_cpu` in `-top`, and `-tagfocus=span_id=...`
//! selects one request's samples.

use std::collections::HashSet;
use std::io::Read;
use std::process::Command;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use prost::Message;
use sentry_profiling::hooks::workspace::pprof_proto::Profile;
use sentry_profiling_examples::{OTLP_FILE, PPROF_FILE};
use sentry_profiling_tests::{
    http_get, local_settings, read_envelope_dir, run_example_service, split_items,
};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn pprof_and_otlp_files_link_samples_to_spans() {
    let settings = local_settings("exports");
    let dir = settings.envelope_dir.clone();
    run_example_service(&settings, |addr, _| async move {
        let mut tasks = Vec::new();
        for _ in 0..3 {
            tasks.push(tokio::spawn(http_get(addr, "/work/120")));
            tasks.push(tokio::spawn(http_get(addr, "/sleep/60")));
        }
        for t in tasks {
            assert!(t.await.unwrap().starts_with("HTTP/1.1 200"));
        }
    });
    let (_, transactions) = split_items(&read_envelope_dir(&dir));
    let spans: HashSet<(String, String)> = transactions
        .iter()
        .map(|t| {
            (
                t["contexts"]["trace"]["trace_id"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
                t["contexts"]["trace"]["span_id"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            )
        })
        .collect();
    let work_spans: Vec<&str> = transactions
        .iter()
        .filter(|t| t["transaction"] == "GET /work/{ms}")
        .map(|t| t["contexts"]["trace"]["span_id"].as_str().unwrap())
        .collect();
    assert_eq!(spans.len(), 6);

    // pprof
    let pprof_path = dir.join(PPROF_FILE);
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&pprof_path).unwrap())
        .read_to_end(&mut raw)
        .unwrap();
    let p = Profile::decode(raw.as_slice()).unwrap();
    let s = |i: i64| p.string_table[i as usize].as_str();
    assert_eq!(s(p.sample_type[0].r#type), "samples");
    assert_eq!(s(p.sample_type[1].r#type), "wall");
    assert!(p.period > 0);
    let exe = p
        .mapping
        .iter()
        .find(|m| s(m.filename).ends_with("e2e") || s(m.build_id).len() >= 32);
    assert!(exe.is_some(), "mappings carry file names and build-ids");
    let burn_fn = p
        .function
        .iter()
        .find(|f| s(f.name) == "sentry_profiling_examples::burn_cpu")
        .map(|f| f.id);
    let burn_fn = burn_fn.expect("burn_cpu is among the functions");
    let burn_locs: HashSet<u64> = p
        .location
        .iter()
        .filter(|l| l.line.iter().any(|line| line.function_id == burn_fn))
        .map(|l| l.id)
        .collect();
    let mut burn_span_ids = HashSet::new();
    let mut linked = 0;
    for sample in &p.sample {
        let label = |k: &str| {
            sample
                .label
                .iter()
                .find(|l| s(l.key) == k)
                .map(|l| s(l.str).to_owned())
        };
        if let (Some(span), Some(trace)) = (label("span_id"), label("trace_id")) {
            linked += 1;
            assert!(
                spans.contains(&(trace, span.clone())),
                "pprof link to a span of the run"
            );
            assert!(label("span_name").is_some());
            if sample.location_id.iter().any(|l| burn_locs.contains(l)) {
                burn_span_ids.insert(span);
            }
        }
    }
    assert!(linked > 0);
    assert!(
        work_spans.iter().all(|w| burn_span_ids.contains(*w)),
        "every /work request's span has burn_cpu samples"
    );

    // OTLP
    let req = ExportProfilesServiceRequest::decode(
        std::fs::read(dir.join(OTLP_FILE)).unwrap().as_slice(),
    )
    .unwrap();
    let dict = req.dictionary.as_ref().unwrap();
    assert_eq!(
        dict.string_table[0], "",
        "entry 0 of the string table is empty"
    );
    let profile = &req.resource_profiles[0].scope_profiles[0].profiles[0];
    assert!(!profile.samples.is_empty());
    let mut otlp_links = 0;
    for sample in &profile.samples {
        assert_eq!(sample.timestamps_unix_nano.len(), 1);
        if sample.link_index != 0 {
            let link = &dict.link_table[sample.link_index as usize];
            assert!(
                spans.contains(&(hex(&link.trace_id), hex(&link.span_id))),
                "OTLP link to a span of the run"
            );
            otlp_links += 1;
        }
    }
    assert!(otlp_links > 0);
    let build_id_attr = dict.attribute_table.iter().any(|a| {
        dict.string_table[a.key_strindex as usize] == "process.executable.build_id.gnu"
            && matches!(a.value.as_ref().and_then(|v| v.value.as_ref()), Some(any_value::Value::StringValue(v)) if v.len() >= 32)
    });
    assert!(
        build_id_attr,
        "mappings carry process.executable.build_id.gnu"
    );
    let thread_attrs = dict
        .attribute_table
        .iter()
        .filter(|a| dict.string_table[a.key_strindex as usize] == "thread.id")
        .count();
    assert!(thread_attrs >= 1);

    // go tool pprof
    let go = Command::new("go").arg("version").output();
    if go.is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must have `go` (golang-go) for this test"
        );
        eprintln!("skipping the `go tool pprof` checks: `go` is not installed");
        return;
    }
    let pprof = |args: &[&str]| {
        let out = Command::new("go")
            .args(["tool", "pprof"])
            .args(args)
            .arg(&pprof_path)
            .env("HOME", std::env::temp_dir())
            .output()
            .expect("go tool pprof runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let top = pprof(&["-top", "-sample_index=samples"]);
    assert!(top.contains("sentry_profiling_examples::burn_cpu"), "{top}");
    let (shown, total) = accounting(&top);
    assert_eq!(shown, total);
    // Anchored: a bare value of digits then letters (`4096abcdef012345`,
    // about one span id in 700) is read by pprof as a numeric label range
    // ("32kb") and matches nothing.
    let one = pprof(&[
        "-top",
        "-sample_index=samples",
        &format!("-tagfocus=span_id=^{}$", work_spans[0]),
    ]);
    let (focused, _) = accounting(&one);
    assert!(
        focused > 0 && focused < total,
        "tagfocus selects one request: {focused} of {total}"
    );
    assert!(one.contains("burn_cpu"), "{one}");
}

/// The shown and total sample counts from `go tool pprof -top`'s header
/// ("Showing nodes accounting for N, X% of M total").
fn accounting(top: &str) -> (u64, u64) {
    top.lines()
        .find_map(|l| {
            let rest = l.trim().strip_prefix("Showing nodes accounting for ")?;
            let shown = rest.split(',').next()?.trim().parse().ok()?;
            let total = rest
                .split(" of ")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            Some((shown, total))
        })
        .unwrap_or((0, 0))
}
