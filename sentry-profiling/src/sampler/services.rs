//! What a thread's tick uses besides the thread, owned by the sampler
//! thread: its own file so that the files that use it (`capture`, the
//! short-lived threads' `short_lived`) need not import the worker that
//! owns it.

use std::time::Duration;

use super::closing::Closing;
use super::denied::Denials;
use super::requests::CapturedRequests;
use super::threads::StackMaps;
use crate::options::SamplerConfig;
use crate::unwind::StackUnwinder;

/// What a thread's tick uses besides the thread (see `capture`): the
/// configuration, the unwinder and its buffers, the stack mappings, the
/// requests with a capture, the refused system calls, and where the
/// samples go.
pub(super) struct Services {
    pub(super) config: SamplerConfig,
    pub(super) period: Duration,
    pub(super) out: Closing,
    pub(super) unwinder: StackUnwinder,
    pub(super) frames: Vec<u64>,
    /// Reused to copy the stacks of threads blocked in the kernel.
    pub(super) copy_buf: Vec<u8>,
    /// Where thread stacks are mapped (their bounds are learned there).
    pub(super) maps: StackMaps,
    /// The requests a stack was captured in (see `Services::nudge`).
    pub(super) requests: CapturedRequests,
    /// The system calls the kernel refused (see `denied`).
    pub(super) denied: Denials,
}
