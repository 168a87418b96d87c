//! Links Sentry transactions to `sentry-profiling`'s continuous profiles.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(unsafe_op_in_unsafe_fn)]

mod http;
mod layer;

pub use http::{ProfilingHttpFuture, ProfilingHttpLayer, ProfilingHttpService, http_layer};
pub use layer::{ProfilingLayer, layer};
