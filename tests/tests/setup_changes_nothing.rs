//! Adding the two crates to a service changes nothing else in it.
//!
//! Cargo unifies a dependency's features across everything one build
//! compiles: a feature this project's libraries turn on in a crate the
//! service also uses is turned on in the service's copy too. Turned on by
//! the tracing layer, tracing-subscriber's `env-filter` made a service's own
//! `tracing_subscriber::fmt::init()` read `RUST_LOG` and default to ERROR,
//! and its INFO logs vanished.
//!
//! The service is `tests/setup-check`, a member of this workspace that
//! depends on the two library crates, the SDK without features of its own,
//! tracing-subscriber with its default features and tokio. This test builds
//! and runs it with `cargo run -p` on its own: Cargo then resolves features
//! for that package alone, exactly as in a service's own workspace, and the
//! other members (whose tests and examples may turn on more) cannot hide or
//! fake the result.

use std::path::Path;
use std::process::Command;

#[test]
fn a_services_own_fmt_init_still_logs_info() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let envelopes = std::env::temp_dir().join(format!(
        "sentry-profiling-setup-check-{}",
        std::process::id()
    ));
    let out = Command::new(&cargo)
        .current_dir(workspace)
        .args([
            "run",
            "--quiet",
            "--locked",
            "-p",
            "sentry-profiling-setup-check",
            "--",
        ])
        .arg(&envelopes)
        // The service's environment as a user starts it: no filter asked for.
        .env_remove("RUST_LOG")
        .output()
        .expect("run cargo");
    let _ = std::fs::remove_dir_all(&envelopes);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the service failed to build or run: {}\n--- stdout\n{stdout}--- stderr\n{stderr}",
        out.status
    );
    let logged = stdout
        .lines()
        .any(|l| l.contains("INFO") && l.contains("setup-check: the service's own INFO log"));
    if !logged {
        // Which of tracing-subscriber's features the service got, and from
        // whom: the first place to look when this fails.
        let tree = Command::new(&cargo)
            .current_dir(workspace)
            .args([
                "tree",
                "--locked",
                "-e",
                "features",
                "-p",
                "sentry-profiling-setup-check",
                "-i",
                "tracing-subscriber",
            ])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        panic!(
            "the service's own INFO log is missing from its output: adding the crates \
             changed its logging\n--- stdout\n{stdout}--- stderr\n{stderr}\
             --- tracing-subscriber's features in the service\n{tree}"
        );
    }
}
