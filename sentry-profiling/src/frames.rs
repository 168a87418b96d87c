//! The synthetic frames: frames no code address stands for. Each has a
//! *marker*, the address it has inside the profiler (in a sample's stack,
//! a lane's fill-in, a chunk), at the top of the address space where no
//! user-space code runs on Linux; the *address* written for it in what is
//! sent; and the *function* name shown for it.
//!
//! Sentry symbolicates native chunks by sending every frame to Symbolicator,
//! whose frame schema requires an `instruction_addr` (a frame without one
//! makes the whole request fail to deserialize, and the chunk then stays
//! unsymbolicated). So every synthetic frame is written with an address
//! below the lowest page Linux ever maps (`vm.mmap_min_addr`, 4 KiB at
//! least), which lies in no image: Symbolicator reports it as an unknown
//! image and keeps the frame as sent, with its `function`. It is also
//! marked `in_app: false`, so it never counts as application code.
//!
//! Which frame stands for what:
//!
//! | function | marker | address | stands for |
//! |---|---|---|---|
//! | `(suspended: awaiting or queued)` | `MAX` | `0x1` | a request not ready, whose wakes are not known |
//! | `(running a request)` | `MAX - 1` | `0x2` | a worker's OS thread polling a request's lane |
//! | `(running: no stack captured in time)` | `MAX - 2` | `0x3` | CPU time no capture saw |
//! | `(queued for a Tokio worker)` | `MAX - 3` | `0x4` | a request woken, not yet polled |
//! | `(awaiting)` | `MAX - 4` | `0x5` | a request not ready |
//! | `(rest of the stack not unwound)` | `MAX - 5` | `0x6` | the end of a stack not unwound further |
//! | `(waiting for a CPU)` | `MAX - 6` | `0x7` | runnable, not given a core |
//! | `(signal handler called)` | `MAX - 7` | `0x8` | a signal frame |
//! | `(waiting: where not read in time)` | `MAX - 8` | `0x9` | blocked where the sampler did not read |
//! | `(estimated from this request's samples)` | `MAX - 9` | `0xa` | a request's running time shown with a stack of its own captures |

/// The marker standing for "suspended" in a lane's fill-ins: a request not
/// ready, whose wakes are not known (not instrumented by
/// `sentry-profiling-tracing`).
pub(crate) const SUSPENDED_FRAME: u64 = u64::MAX;
/// The function name shown for the `SUSPENDED_FRAME` marker.
pub const SUSPENDED_FUNCTION: &str = "(suspended: awaiting or queued)";
/// The `instruction_addr` written for the `(suspended: awaiting or queued)` frame.
pub const SUSPENDED_ADDRESS: u64 = 0x1;

/// The marker (inside a chunk) of the frame standing for a worker's OS
/// thread polling a request's lane.
pub(crate) const RUNNING_REQUEST_FRAME: u64 = u64::MAX - 1;
/// The function name of the frame standing for a worker polling a
/// request (a root frame, alone in its stack).
pub const RUNNING_REQUEST_FUNCTION: &str = "(running a request)";
/// The `instruction_addr` written for the `(running a request)` frame.
pub const RUNNING_REQUEST_ADDRESS: u64 = 0x2;

/// The marker standing for a period its thread spent running without a
/// stack of its own captured: in a request, before any stack of the
/// request was captured (the time is the request's, but no stack of it is
/// known, and another request's would show that request's code here); on
/// a thread, CPU time the kernel counted that no capture saw.
pub(crate) const UNCAPTURED_FRAME: u64 = u64::MAX - 2;
/// The function name shown for the `UNCAPTURED_FRAME` marker.
pub const UNCAPTURED_FUNCTION: &str = "(running: no stack captured in time)";
/// The `instruction_addr` written for the `(running: no stack captured in time)` frame.
pub const UNCAPTURED_ADDRESS: u64 = 0x3;

/// The marker standing, in a lane's fill-in, for time an instrumented
/// request was woken but not yet polled: its task waited for a Tokio
/// worker (the runtime was saturated, or a worker was blocked by someone
/// else's long poll).
pub(crate) const QUEUED_FRAME: u64 = u64::MAX - 3;
/// The function name shown for the `QUEUED_FRAME` marker.
pub const QUEUED_FUNCTION: &str = "(queued for a Tokio worker)";
/// The `instruction_addr` written for the `(queued for a Tokio worker)` frame.
pub const QUEUED_ADDRESS: u64 = 0x4;

/// The marker standing, in a lane's fill-in, for time an instrumented
/// request was not ready: it awaited a database, a downstream call, a
/// timer.
pub(crate) const AWAITING_FRAME: u64 = u64::MAX - 4;
/// The function name shown for the `AWAITING_FRAME` marker.
pub const AWAITING_FUNCTION: &str = "(awaiting)";
/// The `instruction_addr` written for the `(awaiting)` frame.
pub const AWAITING_ADDRESS: u64 = 0x5;

/// The marker that ends a stack whose callers beyond its last frame could
/// not be unwound through frames proven to be on it (see
/// `unwind::blocked`).
pub(crate) const UNWOUND_NO_FURTHER_FRAME: u64 = u64::MAX - 5;
/// The function name shown for the `UNWOUND_NO_FURTHER_FRAME` marker.
pub const UNWOUND_NO_FURTHER_FUNCTION: &str = "(rest of the stack not unwound)";
/// The `instruction_addr` written for the `(rest of the stack not unwound)` frame.
pub const UNWOUND_NO_FURTHER_ADDRESS: u64 = 0x6;

/// The marker standing, in a sample, for a period its thread was runnable
/// but not running: preempted, or not yet given a core, because more
/// threads were runnable than the machine has cores. Where in its code it
/// stood is not known (it may have run on since its latest capture), so no
/// function is shown for the period.
pub(crate) const WAITING_FOR_CPU_FRAME: u64 = u64::MAX - 6;
/// The function name shown for the `WAITING_FOR_CPU_FRAME` marker.
pub const WAITING_FOR_CPU_FUNCTION: &str = "(waiting for a CPU)";
/// The `instruction_addr` written for the `(waiting for a CPU)` frame.
pub const WAITING_FOR_CPU_ADDRESS: u64 = 0x7;

/// The marker of the frame between a signal handler's frames and the code
/// the signal interrupted (see `unwind::signal_frame`): the kernel's
/// signal frame, which no call made.
pub(crate) const SIGNAL_HANDLER_FRAME: u64 = u64::MAX - 7;
/// The function name shown for the `SIGNAL_HANDLER_FRAME` marker.
pub const SIGNAL_HANDLER_FUNCTION: &str = "(signal handler called)";
/// The `instruction_addr` written for the `(signal handler called)` frame.
pub const SIGNAL_HANDLER_ADDRESS: u64 = 0x8;

/// The marker standing, in a sample, for a period its thread spent off the
/// CPU and not runnable (blocked in the kernel, by the kernel's counts)
/// where the sampler did not read where it waited: no function is shown,
/// and the period is not shown as running.
pub(crate) const WAITING_UNREAD_FRAME: u64 = u64::MAX - 8;
/// The function name shown for the `WAITING_UNREAD_FRAME` marker.
pub const WAITING_UNREAD_FUNCTION: &str = "(waiting: where not read in time)";
/// The `instruction_addr` written for the `(waiting: where not read in time)` frame.
pub const WAITING_UNREAD_ADDRESS: u64 = 0x9;

/// The marker of the outermost frame of an *estimated* stack: a request's
/// running time that no capture of its own saw (a poll shorter than the
/// sampling period, or the rest of a poll after its capture), shown with a
/// stack captured in the same request's other polls (see
/// `crate::lanes::estimate`). The frames under it are the request's code,
/// so Sentry counts them as the functions' time; the frame says the stack
/// at that moment was inferred, not seen.
pub(crate) const ESTIMATED_FRAME: u64 = u64::MAX - 9;
/// The function name shown for the `ESTIMATED_FRAME` marker.
pub const ESTIMATED_FUNCTION: &str = "(estimated from this request's samples)";
/// The `instruction_addr` written for the `(estimated from this request's samples)` frame.
pub const ESTIMATED_ADDRESS: u64 = 0xa;

/// The address written for, and the function name of, a synthetic frame;
/// `None` for a real code address.
pub(crate) fn synthetic_frame(marker: u64) -> Option<(u64, &'static str)> {
    match marker {
        SUSPENDED_FRAME => Some((SUSPENDED_ADDRESS, SUSPENDED_FUNCTION)),
        RUNNING_REQUEST_FRAME => Some((RUNNING_REQUEST_ADDRESS, RUNNING_REQUEST_FUNCTION)),
        UNCAPTURED_FRAME => Some((UNCAPTURED_ADDRESS, UNCAPTURED_FUNCTION)),
        QUEUED_FRAME => Some((QUEUED_ADDRESS, QUEUED_FUNCTION)),
        AWAITING_FRAME => Some((AWAITING_ADDRESS, AWAITING_FUNCTION)),
        UNWOUND_NO_FURTHER_FRAME => Some((UNWOUND_NO_FURTHER_ADDRESS, UNWOUND_NO_FURTHER_FUNCTION)),
        WAITING_FOR_CPU_FRAME => Some((WAITING_FOR_CPU_ADDRESS, WAITING_FOR_CPU_FUNCTION)),
        SIGNAL_HANDLER_FRAME => Some((SIGNAL_HANDLER_ADDRESS, SIGNAL_HANDLER_FUNCTION)),
        WAITING_UNREAD_FRAME => Some((WAITING_UNREAD_ADDRESS, WAITING_UNREAD_FUNCTION)),
        ESTIMATED_FRAME => Some((ESTIMATED_ADDRESS, ESTIMATED_FUNCTION)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_addresses_lie_below_every_mapping() {
        for marker in [
            SUSPENDED_FRAME,
            RUNNING_REQUEST_FRAME,
            UNCAPTURED_FRAME,
            QUEUED_FRAME,
            AWAITING_FRAME,
            UNWOUND_NO_FURTHER_FRAME,
            WAITING_FOR_CPU_FRAME,
            SIGNAL_HANDLER_FRAME,
            WAITING_UNREAD_FRAME,
            ESTIMATED_FRAME,
        ] {
            let (addr, name) = synthetic_frame(marker).unwrap();
            assert!(addr < 4096, "{name} at {addr:#x}");
        }
        assert_eq!(synthetic_frame(0x5555_0000), None);
    }
}
