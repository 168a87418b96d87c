//! The OTLP/HTTP sink: with a collector endpoint configured, every chunk is
//! posted to `/v1development/profiles` as a protobuf export request whose
//! links point at the run's transactions; a collector that is down costs
//! nothing but counted failures.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use prost::Message;
use sentry_profiling_tests::{
    http_get, local_settings, read_envelope_dir, run_example_service, split_items,
};

/// (path, body) of each POST the collector received.
type Posts = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A collector on loopback that records each POST.
fn collector() -> (String, Posts) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let got = Arc::new(Mutex::new(Vec::new()));
    let store = Arc::clone(&got);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream);
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            let mut len = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; len];
            let _ = reader.read_exact(&mut body);
            let path = request_line
                .split_whitespace()
                .nth(1)
                .unwrap_or("")
                .to_owned();
            store.lock().unwrap().push((path, body));
            let _ = reader
                .get_mut()
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    (url, got)
}

#[test]
fn chunks_are_posted_to_the_collector_with_span_links() {
    let (url, got) = collector();
    let mut settings = local_settings("otlp-http");
    settings.otlp_endpoint = Some(url);
    let dir = settings.envelope_dir.clone();
    run_example_service(&settings, |addr, _| async move {
        let mut tasks = Vec::new();
        for _ in 0..3 {
            tasks.push(tokio::spawn(http_get(addr, "/work/60")));
        }
        for t in tasks {
            assert!(t.await.unwrap().starts_with("HTTP/1.1 200"));
        }
    });
    let (_, transactions) = split_items(&read_envelope_dir(&dir));
    let spans: HashSet<String> = transactions
        .iter()
        .map(|t| {
            t["contexts"]["trace"]["span_id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let got = got.lock().unwrap();
    assert!(!got.is_empty(), "the last chunk was posted at shutdown");
    let mut linked = HashSet::new();
    for (path, body) in got.iter() {
        assert_eq!(path, "/v1development/profiles");
        let req =
            ExportProfilesServiceRequest::decode(body.as_slice()).expect("protobuf export request");
        let dict = req.dictionary.unwrap();
        for sample in &req.resource_profiles[0].scope_profiles[0].profiles[0].samples {
            if sample.link_index != 0 {
                let span: String = dict.link_table[sample.link_index as usize]
                    .span_id
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                assert!(
                    spans.contains(&span),
                    "links point at the run's transactions"
                );
                linked.insert(span);
            }
        }
    }
    assert_eq!(linked, spans, "every request's samples are linked to it");
    let stats = sentry_profiling::stats().unwrap();
    assert!(stats.exports_sent >= got.len() as u64);
    assert_eq!(stats.exports_failed, 0);
    drop(got);

    // A collector that is down: requests are served as usual, failures are
    // counted, nothing panics or hangs.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut settings = local_settings("otlp-down");
    settings.otlp_endpoint = Some(format!("http://127.0.0.1:{port}"));
    let started = std::time::Instant::now();
    run_example_service(&settings, |addr, _| async move {
        assert!(http_get(addr, "/work/30").await.starts_with("HTTP/1.1 200"));
    });
    let stats = sentry_profiling::stats().unwrap();
    assert!(stats.exports_failed >= 1, "{stats:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}
