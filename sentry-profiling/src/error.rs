//! The crate's error type.

use std::fmt;

/// Why the profiler could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// This platform has no sampler (only Linux on x86_64 and aarch64).
    Unsupported,
    /// An option is out of range.
    InvalidOption {
        /// The option's name.
        option: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// No usable signal, or the chosen one belongs to someone else.
    Signal(String),
    /// The sampler thread could not be started.
    Spawn(std::io::Error),
    /// This process is the child of a `fork()` of a profiled process; the
    /// profiler's state was copied mid-flight, so it does not start here
    /// (start it in a fresh process: `exec` after `fork`).
    ForkedChild,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unsupported => f.write_str(
                "sentry-profiling: this platform is not supported (Linux x86_64/aarch64 only)",
            ),
            Self::InvalidOption { option, reason } => {
                write!(f, "sentry-profiling: invalid `{option}`: {reason}")
            }
            Self::Signal(msg) => write!(f, "sentry-profiling: {msg}"),
            Self::Spawn(e) => write!(f, "sentry-profiling: cannot start the sampler thread: {e}"),
            Self::ForkedChild => f.write_str(
                "sentry-profiling: not started in the forked child of a profiled process",
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Spawn(e) => Some(e),
            _ => None,
        }
    }
}

/// Reports the first failure of a kind, the 10th, 100th, 1,000th and
/// 10,000th, then every 100,000th (`count` is the number so far, this one
/// included): an endpoint that stays down, or a disk slower than thousands
/// of envelopes a second, says so without flooding the log (every
/// hundredth was 50 lines a second at 5,000 drops a second). The exact
/// counts are in the stats.
pub(crate) fn log_throttled(count: u64, message: impl FnOnce() -> String) {
    if should_log(count) {
        eprintln!("sentry-profiling: {}", message());
    }
}

fn should_log(count: u64) -> bool {
    matches!(count, 1 | 10 | 100 | 1_000 | 10_000) || (count > 0 && count % 100_000 == 0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn failures_are_reported_ever_more_sparingly() {
        let logged: Vec<u64> = (1..=1_000_000).filter(|&n| super::should_log(n)).collect();
        assert_eq!(logged[..6], [1, 10, 100, 1_000, 10_000, 100_000]);
        assert_eq!(logged.len(), 5 + 10);
        assert!(!super::should_log(0));
    }
}
