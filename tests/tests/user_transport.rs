//! An application's own transport sees profiled transactions as typed
//! `transaction` items, already linked to the profile (`contexts.profile`,
//! `thread.id`), and what it does with them is what is sent: here it drops
//! the `/sleep` transactions and renames the `/work` ones, as a filter of
//! the application's own would (sentry 0.49 has no `before_send_transaction`;
//! a transport of its own is where an application sees transactions last).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sentry::Transport;
use sentry::protocol::{Context, Envelope, EnvelopeItem};
use sentry_profiling::{ProfileLifecycle, ProfilingIntegration};
use sentry_profiling_tests::{
    CaptureTransport, http_get, link_problem, run_service_with, split_items,
};

/// Drops `GET /sleep/…` transactions, renames `GET /work/…` ones, and
/// passes everything else to the capture.
struct Filter {
    inner: Arc<CaptureTransport>,
    typed_seen: AtomicUsize,
    linked_seen: AtomicUsize,
    untyped_transactions: Mutex<usize>,
}

impl Transport for Filter {
    fn send_envelope(&self, envelope: Envelope) {
        let mut bytes = Vec::new();
        let _ = envelope.to_writer(&mut bytes);
        if envelope.items().next().is_none()
            && bytes
                .windows(b"\"type\":\"transaction\"".len())
                .any(|w| w == b"\"type\":\"transaction\"")
        {
            *self.untyped_transactions.lock().unwrap() += 1;
        }
        let mut out = Envelope::new().with_headers(envelope.headers().clone());
        let mut keep = false;
        if envelope.items().next().is_none() {
            // A raw envelope (a profile chunk): passed on as it is.
            self.inner.send_envelope(envelope);
            return;
        }
        for item in envelope.into_items() {
            match item {
                EnvelopeItem::Transaction(mut tx) => {
                    self.typed_seen.fetch_add(1, Ordering::Relaxed);
                    let linked = matches!(tx.contexts.get("profile"), Some(Context::Other(m)) if m.contains_key("profiler_id"))
                        && matches!(tx.contexts.get("trace"), Some(Context::Trace(t)) if t.data.contains_key("thread.id"));
                    if linked {
                        self.linked_seen.fetch_add(1, Ordering::Relaxed);
                    }
                    let name = tx.name.clone().unwrap_or_default();
                    if name.starts_with("GET /sleep") {
                        continue;
                    }
                    if name.starts_with("GET /work") {
                        tx.name = Some(format!("renamed {name}"));
                    }
                    keep = true;
                    out.add_item(EnvelopeItem::Transaction(tx));
                }
                other => {
                    keep = true;
                    out.add_item(other);
                }
            }
        }
        if keep {
            self.inner.send_envelope(out);
        }
    }
}

#[test]
fn the_applications_transport_sees_typed_linked_transactions() {
    let capture = CaptureTransport::new();
    let filter = Arc::new(Filter {
        inner: Arc::clone(&capture),
        typed_seen: AtomicUsize::new(0),
        linked_seen: AtomicUsize::new(0),
        untyped_transactions: Mutex::new(0),
    });
    let mut options = sentry::ClientOptions::new().traces_sample_rate(1.0);
    options.dsn = "https://public@sentry.invalid/1".parse().ok();
    options.release = Some("user-transport-test@1".into());
    options.transport = Some(Arc::new(Arc::clone(&filter)));
    let options = ProfilingIntegration::new()
        .profile_session_sample_rate(1.0)
        .profile_lifecycle(ProfileLifecycle::Trace)
        .apply(options);
    run_service_with(
        options,
        sentry_profiling_examples::router(),
        |addr, _| async move {
            for i in 0..6 {
                let path = if i % 2 == 0 { "/work/30" } else { "/sleep/30" };
                let r = http_get(addr, path).await;
                assert!(r.starts_with("HTTP/1.1 200"), "{r}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        },
    );
    assert_eq!(
        *filter.untyped_transactions.lock().unwrap(),
        0,
        "no transaction reached the application's transport as raw bytes"
    );
    let typed = filter.typed_seen.load(Ordering::Relaxed);
    assert_eq!(typed, 6, "every request's transaction, typed");
    assert_eq!(
        filter.linked_seen.load(Ordering::Relaxed),
        typed,
        "each already linked to the profile"
    );
    let (chunks, transactions) = split_items(&capture.envelopes());
    let names: Vec<&str> = transactions
        .iter()
        .filter_map(|t| t["transaction"].as_str())
        .collect();
    assert_eq!(names.len(), 3, "the /sleep ones were dropped: {names:?}");
    assert!(
        names.iter().all(|n| n.starts_with("renamed GET /work")),
        "{names:?}"
    );
    for tx in &transactions {
        assert_eq!(tx["contexts"]["profile"]["type"], "profile");
        if let Some(p) = link_problem(tx, &chunks) {
            panic!("a renamed transaction is still linked: {p}");
        }
    }
}
