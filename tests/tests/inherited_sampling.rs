//! The trace lifecycle follows Sentry's sampling decision for each root
//! span, including one inherited from an incoming `sentry-trace` header: a
//! request whose caller decided "not sampled" never starts the profiler,
//! one whose caller decided "sampled" does even with a local rate of 0.

use std::time::Duration;

use sentry_profiling_tests::{
    http_get_with, link_problem, local_settings, read_envelope_dir, run_example_service,
    split_items,
};

const TRACE: &str = "771a43a4192642f0b136d5159a501700";

#[test]
fn incoming_sampling_decisions_are_respected() {
    let mut settings = local_settings("inherit");
    settings.traces_sample_rate = 0.0;
    let dir = settings.envelope_dir.clone();
    let (ticks_unsampled, ticks_sampled) = run_example_service(&settings, |addr, _| async move {
        // Let the profiler thread create its paused sampler.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let ticks = || sentry_profiling::stats().unwrap().sampler.ticks;
        let t0 = ticks();
        let not_sampled = format!("{TRACE}-a1a1a1a1a1a1a1a1-0");
        let r = http_get_with(addr, "/work/100", &[("sentry-trace", &not_sampled)]).await;
        assert!(r.starts_with("HTTP/1.1 200"));
        let t1 = ticks();
        let sampled = format!("{TRACE}-b2b2b2b2b2b2b2b2-1");
        let r = http_get_with(addr, "/work/100", &[("sentry-trace", &sampled)]).await;
        assert!(r.starts_with("HTTP/1.1 200"));
        (t1 - t0, ticks() - t1)
    });
    assert_eq!(
        ticks_unsampled, 0,
        "an inherited 'not sampled' decision never starts the profiler"
    );
    assert!(
        ticks_sampled >= 5,
        "an inherited 'sampled' decision starts it ({ticks_sampled} ticks)"
    );

    let envelopes = read_envelope_dir(&dir);
    let (chunks, transactions) = split_items(&envelopes);
    assert_eq!(
        transactions.len(),
        1,
        "only the sampled request's transaction is sent"
    );
    assert_eq!(transactions[0]["contexts"]["trace"]["trace_id"], TRACE);
    assert_eq!(link_problem(&transactions[0], &chunks), None);
    let _ = std::fs::remove_dir_all(&dir);
}
