//! Per-architecture code of the signal handler, one mirrored file per
//! architecture (as framehop does): what the handler reads from the
//! interrupted context, and the thread pointer.

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "x86_64")]
mod x86_64;

#[cfg(target_arch = "aarch64")]
pub(crate) use aarch64::{read_regs, thread_pointer};
#[cfg(target_arch = "x86_64")]
pub(crate) use x86_64::{read_regs, thread_pointer};
