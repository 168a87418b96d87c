//! Encoders: chunks in the formats their destinations accept.

pub(crate) mod envelope;
pub(crate) mod otlp;
pub(crate) mod pprof;
pub(crate) mod sentry_chunk;
pub(crate) mod sentry_v1;
pub(crate) mod synthetic;
pub(crate) mod view;
