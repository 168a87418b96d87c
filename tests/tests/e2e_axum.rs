//! End to end: the example's router on a real loopback socket, concurrent
//! `/work` and `/sleep` requests, graceful shutdown, then the envelopes the
//! SDK wrote are checked the way Sentry would use them.

use std::time::Duration;

use sentry_profiling_tests::{
    functions_in_window, http_get, link_problem, local_settings, read_envelope_dir,
    relay_violations, run_example_service, split_items, transaction_window,
};

#[test]
fn example_service_writes_linked_accepted_profiles() {
    let settings = local_settings("e2e");
    let dir = settings.envelope_dir.clone();
    let responses = run_example_service(&settings, |addr, shutdown| async move {
        let mut tasks = Vec::new();
        for round in 0..3 {
            for i in 0..4 {
                tasks.push(tokio::spawn(http_get(addr, "/work/80")));
                tasks.push(tokio::spawn(http_get(
                    addr,
                    format!("/sleep/{}", 40 + 10 * i),
                )));
            }
            if round == 1 {
                tasks.push(tokio::spawn(http_get(addr, "/")));
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        let mut responses = Vec::new();
        for t in tasks {
            responses.push(t.await.unwrap());
        }
        // A request in flight at shutdown must still complete: start it,
        // and let shutdown begin while it sleeps.
        let late = tokio::spawn(http_get(addr, "/sleep/200"));
        tokio::time::sleep(Duration::from_millis(50)).await;
        shutdown.begin();
        responses.push(late.await.unwrap());
        responses
    });

    eprintln!("profiler stats: {:?}", sentry_profiling::stats());
    assert_eq!(responses.len(), 26);
    assert!(
        responses.iter().all(|r| r.starts_with("HTTP/1.1 200")),
        "every request succeeded"
    );

    let envelopes = read_envelope_dir(&dir);
    let (chunks, transactions) = split_items(&envelopes);
    assert!(!chunks.is_empty(), "at least one profile chunk was written");
    for chunk in &chunks {
        let v = relay_violations(chunk);
        assert!(v.is_empty(), "Relay would reject a chunk: {v:?}");
    }
    assert_eq!(
        transactions.len(),
        26,
        "one transaction per request, none lost at shutdown"
    );
    let names: Vec<&str> = transactions
        .iter()
        .filter_map(|t| t["transaction"].as_str())
        .collect();
    assert_eq!(names.iter().filter(|n| **n == "GET /work/{ms}").count(), 12);
    assert_eq!(
        names.iter().filter(|n| **n == "GET /sleep/{ms}").count(),
        13
    );
    assert_eq!(names.iter().filter(|n| **n == "GET /").count(), 1);
    for tx in &transactions {
        if let Some(problem) = link_problem(tx, &chunks) {
            panic!("transaction not linked to a chunk: {problem}");
        }
        assert!(tx.pointer("/contexts/trace/data/thread.name").is_some());
        for span in tx["spans"].as_array().into_iter().flatten() {
            assert!(
                span.pointer("/data/thread.id").is_some(),
                "span without thread.id: {span}"
            );
        }
    }

    // Where did /work requests spend their time? In burn_cpu.
    let mut with_burn = 0;
    let work: Vec<_> = transactions
        .iter()
        .filter(|t| t["transaction"] == "GET /work/{ms}")
        .collect();
    for tx in &work {
        let (start, end) = transaction_window(tx).unwrap();
        let found = chunks.iter().any(|c| {
            functions_in_window(c, None, start, end)
                .iter()
                .any(|stack| {
                    stack
                        .iter()
                        .any(|f| f == "sentry_profiling_examples::burn_cpu")
                })
        });
        with_burn += usize::from(found);
    }
    assert_eq!(
        with_burn,
        work.len(),
        "burn_cpu appears in samples during every /work request"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
