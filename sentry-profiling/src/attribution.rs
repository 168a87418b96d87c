//! How samples and transactions are tied to threads: by *lanes*, one per
//! request, across `.await` hops between Tokio workers (the default), or by
//! OS threads as Sentry's spec describes. See [`ThreadAttribution`].
//!
//! A thread's context word (`crate::context`: what the signal handler
//! copies into each sample) is 0 outside any request, or the request's
//! lane id. The lane machinery itself lives in the crate's private `lanes`
//! module; this module holds what every side of it shares: the choice
//! applications make (re-exported at the crate root), and what a lane id
//! is.

/// Lane ids start here: above Linux's largest possible thread id (2^22), so
/// they can never be mistaken for one, and still small decimal numbers as
/// parts of Sentry's pipeline expect thread ids to be.
pub const LANE_BASE: u64 = 1_000_000_000;

/// The first profile thread id of short-lived threads' shared timelines
/// (see `sampler::short_lived`): above every thread id Linux hands out
/// (2^22) and below the lanes' ids ([`LANE_BASE`]).
pub(crate) const SHORT_LIVED_BASE: u32 = 500_000_000;

/// Whether a context word names a lane.
pub fn is_lane(context: u64) -> bool {
    context >= LANE_BASE
}

/// How samples and transactions are tied to threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ThreadAttribution {
    /// Each sampled root span gets a lane of its own (see `crate::lanes`):
    /// a transaction's profile is its own work, across `.await` hops.
    #[default]
    Lanes,
    /// Samples and transactions use OS thread ids, as Sentry's spec
    /// describes: a transaction shows the samples of the thread it started
    /// on, including other requests' work there and missing its own
    /// elsewhere.
    OsThreads,
}
