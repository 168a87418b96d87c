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

/// Reports the first failure of a kind and then every hundredth (`count`
/// is the number so far, this one included), so that an endpoint that stays
/// down does not flood the log.
pub(crate) fn log_throttled(count: u64, message: impl FnOnce() -> String) {
    if count % 100 == 1 {
        eprintln!("sentry-profiling: {}", message());
    }
}
