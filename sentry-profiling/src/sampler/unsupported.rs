//! The sampler on platforms without one: the same API, and
//! [`Sampler::start`] returns [`Error::Unsupported`].

#[path = "consumer.rs"]
#[expect(dead_code, reason = "no sampler thread calls a consumer here")]
mod consumer;
#[path = "sample.rs"]
#[cfg_attr(
    not(test),
    expect(dead_code, reason = "constructors are only used by the real sampler")
)]
mod sample;
#[path = "stats.rs"]
#[expect(dead_code, reason = "counters are only written by the real sampler")]
mod stats;

use std::sync::Arc;
use std::time::Duration;

pub(crate) use consumer::Consumer;
pub use sample::Sample;
pub use stats::SamplerStats;

use crate::Error;
use crate::options::SamplerConfig;
use crate::unwind::ModuleSet;

/// Marks the calling thread as one of the profiler's own (no-op here).
pub(crate) fn register_own_thread() -> OwnThreadGuard {
    OwnThreadGuard
}

/// Unregisters the thread on drop (no-op here).
#[derive(Debug)]
pub(crate) struct OwnThreadGuard;

/// A running sampler (never constructed on this platform).
#[derive(Debug)]
pub struct Sampler {
    _private: (),
}

impl Sampler {
    /// Always fails: this platform is not supported.
    pub fn start(config: SamplerConfig) -> Result<Self, Error> {
        config.validated()?;
        Err(Error::Unsupported)
    }

    /// Always fails: this platform is not supported.
    pub fn start_paused(config: SamplerConfig) -> Result<Self, Error> {
        Self::start(config)
    }

    /// Always fails: this platform is not supported.
    pub(crate) fn start_feeding(
        config: SamplerConfig,
        _out: Box<dyn Consumer>,
    ) -> Result<Self, Error> {
        Self::start(config)
    }

    /// The signal in use.
    pub fn signal(&self) -> i32 {
        0
    }

    /// No samples.
    pub fn try_iter(&self) -> impl Iterator<Item = Sample> + '_ {
        std::iter::empty()
    }

    /// No samples.
    pub fn recv_timeout(&self, _timeout: Duration) -> Option<Sample> {
        None
    }

    /// No modules.
    pub fn modules(&self) -> Arc<ModuleSet> {
        Arc::default()
    }

    /// A control handle.
    pub fn control(&self) -> SamplerControl {
        SamplerControl { _private: () }
    }

    /// No-op.
    pub fn pause(&self) {
        self.control().pause();
    }

    /// No-op.
    pub fn resume(&self) {
        self.control().resume();
    }

    /// Never active.
    pub fn is_active(&self) -> bool {
        self.control().is_active()
    }

    /// Zero counters.
    pub fn stats(&self) -> SamplerStats {
        self.control().stats()
    }

    /// Zero counters.
    pub fn stop(self) -> SamplerStats {
        SamplerStats::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_reports_unsupported_without_panicking() {
        assert!(matches!(
            Sampler::start(SamplerConfig::default()),
            Err(Error::Unsupported)
        ));
        assert!(matches!(
            Sampler::start(SamplerConfig::default().frequency_hz(0)),
            Err(Error::InvalidOption {
                option: "frequency_hz",
                ..
            })
        ));
    }
}

/// Controls a [`Sampler`] (inert on this platform).
#[derive(Debug, Clone)]
pub struct SamplerControl {
    _private: (),
}

impl SamplerControl {
    /// No-op.
    pub fn pause(&self) {}
    /// No-op.
    pub fn resume(&self) {}
    /// Never active.
    pub fn is_active(&self) -> bool {
        false
    }
    /// Zero counters.
    pub fn stats(&self) -> SamplerStats {
        SamplerStats::default()
    }

    /// No-op.
    pub(crate) fn wake(&self) {}

    /// No-op.
    pub(crate) fn stop(&self) {}
}
