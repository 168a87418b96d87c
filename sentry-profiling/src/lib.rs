//! Continuous profiling for Tokio services, sent to Sentry.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(unsafe_op_in_unsafe_fn)]

mod error;
mod options;
mod sampler;
mod symbolize;
mod sys;
mod unwind;

pub use error::Error;
pub use options::{
    DEFAULT_FREQUENCY_HZ, DEFAULT_QUEUE_CAPACITY, DEFAULT_STACK_COPY_BYTES, MAX_FREQUENCY_HZ,
    MAX_STACK_COPY_BYTES, SamplerConfig,
};
pub use sampler::{Sample, Sampler, SamplerStats};
pub use symbolize::{Symbol, Symbolizer};
pub use unwind::{ModuleInfo, ModuleSet, debug_id_from_build_id};
