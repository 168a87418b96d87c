//! `sentry-profiling-preview [DIR]`: writes `DIR/profile.html` (default
//! `./sentry-envelopes`), the page that shows what Sentry will show for
//! each transaction of the run whose envelopes are in `DIR`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let dir = args
        .next()
        .map_or_else(|| "sentry-envelopes".into(), std::path::PathBuf::from);
    if args.next().is_some() || dir.to_str().is_some_and(|d| d.starts_with('-')) {
        eprintln!("usage: sentry-profiling-preview [ENVELOPE_DIR]");
        return ExitCode::from(2);
    }
    match sentry_profiling_preview::write_page(&dir) {
        Ok((path, summary)) => {
            println!(
                "{}: {} transactions ({} with samples in Sentry's view), {} chunks, {} samples",
                path.display(),
                summary.transactions,
                summary.linked,
                summary.chunks,
                summary.samples
            );
            for w in &summary.warnings {
                eprintln!("sentry-profiling-preview: the run warned: {w}");
            }
            for p in &summary.problems {
                eprintln!("sentry-profiling-preview: not read: {p}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sentry-profiling-preview: {e}");
            ExitCode::FAILURE
        }
    }
}
