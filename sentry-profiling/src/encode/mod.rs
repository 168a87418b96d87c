//! Encoders: chunks in the formats their destinations accept.

pub(crate) mod sentry_chunk;
