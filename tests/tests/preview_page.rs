//! The preview page, opened in a real browser: the example service serves
//! concurrent `/work`, `/sleep` and `/` requests, shuts down, writes its
//! page, and headless Chromium renders it. The rendered page must list
//! every transaction, show `burn_cpu` in every `/work` transaction's flame
//! graph, and report no script error.
//!
//! Chromium is Debian's `chromium` (`.ci/run` installs it). Without it the
//! test says so and passes, except under CI (`CI` set), where it fails.

use std::path::Path;
use std::time::{Duration, Instant};

use sentry_profiling_tests::browser::{chromium, headless};
use sentry_profiling_tests::{http_get, local_settings, run_service};

const WORK: &str = "GET /work/{ms}";

/// What the browser made of the page: the DOM after its scripts ran, and
/// what Chromium logged (console messages included).
struct Rendered {
    dom: String,
    log: String,
}

/// Renders `page` (with `#fragment`) headless; also saves a screenshot
/// beside it.
fn render(browser: &Path, page: &Path, fragment: &str, profile_dir: &Path) -> Rendered {
    let url = format!("file://{}#{fragment}", page.display());
    let run = |extra: &[String]| {
        let out = headless(browser, profile_dir, &url, extra)
            .output()
            .expect("run chromium");
        assert!(out.status.success(), "chromium failed: {out:?}");
        out
    };
    let dump = run(&["--dump-dom".into()]);
    let shot = page.with_extension("png");
    run(&[format!("--screenshot={}", shot.display())]);
    assert!(
        shot.metadata().is_ok_and(|m| m.len() > 10_000),
        "a screenshot was taken"
    );
    Rendered {
        dom: String::from_utf8_lossy(&dump.stdout).into_owned(),
        log: String::from_utf8_lossy(&dump.stderr).into_owned(),
    }
}

#[test]
fn the_preview_page_shows_each_requests_flame_graph_in_a_browser() {
    let Some(browser) = chromium() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "chromium is not installed (`apt-get install chromium`); CI must run this test"
        );
        eprintln!("SKIPPED: chromium is not installed (apt-get install chromium)");
        return;
    };
    let settings = local_settings("preview");
    let dir = settings.envelope_dir.clone();
    // `/warm` runs outside the http layer (no transaction): 400 ms of it
    // give each worker CPU time before the measured requests, as any
    // running service has. A thread is found at the sampler's next listing
    // (every 100 ms) and its first captures teach the sampler its stack
    // bounds and are not kept, so a request in a new thread's first moments
    // shows `(running: no stack captured in time)` rather than its code.
    let app = sentry_profiling_examples::router().route(
        "/warm",
        axum::routing::get(|| async { sentry_profiling_examples::burn_cpu(30).to_string() }),
    );
    let responses = run_service(&settings, app, |addr, _| async move {
        let warm_until = Instant::now() + Duration::from_millis(400);
        while Instant::now() < warm_until {
            let warm: Vec<_> = (0..2)
                .map(|_| tokio::spawn(http_get(addr, "/warm")))
                .collect();
            for w in warm {
                assert!(w.await.unwrap().starts_with("HTTP/1.1 200"));
            }
        }
        let mut tasks = Vec::new();
        for round in 0..4u64 {
            tasks.push(tokio::spawn(http_get(
                addr,
                format!("/work/{}", 80 + 20 * round),
            )));
            tasks.push(tokio::spawn(http_get(
                addr,
                format!("/work/{}", 100 + 20 * round),
            )));
            tasks.push(tokio::spawn(http_get(addr, "/sleep/60")));
            tasks.push(tokio::spawn(http_get(addr, "/")));
            tokio::time::sleep(Duration::from_millis(60)).await;
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    assert!(responses.iter().all(|r| r.starts_with("HTTP/1.1 200")));
    let stats = sentry_profiling::stats();
    let page =
        sentry_profiling_examples::write_preview(&dir, stats.as_ref()).expect("page written");
    let size = std::fs::metadata(&page).unwrap().len();
    eprintln!("page: {} ({size} bytes)", page.display());

    let started = Instant::now();
    let rendered = render(&browser, &page, "expand=all", &dir.join("chromium-profile"));
    eprintln!("rendered twice in {:?}", started.elapsed());
    let dom = &rendered.dom;

    assert!(
        dom.contains("data-ready=\"true\""),
        "the page's script ran to its end"
    );
    let count = dom
        .split("<span id=\"tx-count\">")
        .nth(1)
        .and_then(|s| s.split('<').next())
        .and_then(|n| n.parse::<usize>().ok());
    assert_eq!(
        count,
        Some(responses.len()),
        "the page counts every transaction"
    );
    let errors = dom
        .split("<div id=\"errors\">")
        .nth(1)
        .and_then(|s| s.split("</div>").next())
        .unwrap_or("missing");
    assert!(errors.is_empty(), "the page reported errors: {errors}");
    for line in rendered.log.lines() {
        assert!(
            !(line.contains("CONSOLE") || line.contains("Uncaught")),
            "the browser console shows a message: {line}"
        );
    }

    // Every /work transaction's flame graph (each opened with
    // #expand=all) shows the handler's CPU function.
    let graphs: Vec<&str> = dom
        .split("<div class=\"flame\" data-tx=\"")
        .skip(1)
        .filter(|g| g.starts_with(WORK))
        .map(|g| g.split("<div class=\"flame\"").next().unwrap_or(g))
        .collect();
    assert_eq!(graphs.len(), 8, "one flame graph per /work transaction");
    for g in &graphs {
        assert!(
            g.contains("<svg"),
            "drawn as SVG: {}",
            &g[..g.len().min(300)]
        );
        assert!(
            g.contains("sentry_profiling_examples::burn_cpu"),
            "a /work flame graph without burn_cpu: {}",
            &g[..g.len().min(2000)]
        );
    }
    // The merged graph of the /work name shows it too, and OS threads are
    // listed.
    assert!(dom.contains(&format!("data-route=\"{WORK}\"")));
    assert!(dom.contains("data-thread=\""), "OS threads are listed");
    let _ = std::fs::remove_dir_all(&dir);
}
