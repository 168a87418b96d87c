//! How samples and transactions are tied to threads: by *lanes*, one per
//! request, across `.await` hops between Tokio workers (the default), or by
//! OS threads as Sentry's spec describes. See [`ThreadAttribution`].
//!
//! The lane machinery itself lives in the crate's private `lanes` module;
//! this module holds the choice applications make (re-exported at the crate
//! root).

pub use crate::lanes::ThreadAttribution;

// The sampler's path to the synthetic frame it records for a request whose
// stack was not captured in time (kept so that the lanes' move did not
// touch the sampler).
#[cfg(profiling_supported)]
pub(crate) use crate::lanes::UNCAPTURED_FRAME;
