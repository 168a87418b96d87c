//! Frames that no code address stands for: a waiting lane's `(queued for a
//! Tokio worker)` and `(awaiting)` (or the undivided `(suspended: awaiting
//! or queued)` for a request whose wakes are not known), a worker's
//! `(running a request)`, request time whose stack was not captured in
//! time, the end of a stack not unwound further (`unwind::blocked`), and
//! a signal frame (`unwind::signal_frame`).
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
//! Inside a chunk, synthetic frames are marked by addresses at the top of
//! the address space, where no user-space code runs on Linux.

use std::sync::Arc;

use crate::chunk::Chunk;
use crate::lanes::{
    AWAITING_FRAME, AWAITING_FUNCTION, QUEUED_FRAME, QUEUED_FUNCTION, SUSPENDED_FRAME,
    SUSPENDED_FUNCTION, UNCAPTURED_FRAME, UNCAPTURED_FUNCTION, WAITING_FOR_CPU_FRAME,
    WAITING_FOR_CPU_FUNCTION, WAITING_UNREAD_FRAME, WAITING_UNREAD_FUNCTION,
};
use crate::unwind::{
    SIGNAL_HANDLER_FRAME, SIGNAL_HANDLER_FUNCTION, UNWOUND_NO_FURTHER_FRAME,
    UNWOUND_NO_FURTHER_FUNCTION,
};

/// Marker (inside a chunk) of the frame standing for a worker's OS thread
/// polling a request's lane.
pub(crate) const RUNNING_REQUEST_FRAME: u64 = u64::MAX - 1;

/// The function name of the frame standing for a worker polling a
/// request (a root frame, alone in its stack).
pub const RUNNING_REQUEST_FUNCTION: &str = "(running a request)";

/// The `instruction_addr` written for the suspended frame.
pub const SUSPENDED_ADDRESS: u64 = 0x1;

/// The `instruction_addr` written for the running-a-request frame.
pub const RUNNING_REQUEST_ADDRESS: u64 = 0x2;

/// The `instruction_addr` written for the frame of request time whose stack
/// was not captured in time.
pub const UNCAPTURED_ADDRESS: u64 = 0x3;

/// The `instruction_addr` written for the frame of a request queued for a
/// Tokio worker.
pub const QUEUED_ADDRESS: u64 = 0x4;

/// The `instruction_addr` written for the frame of a request awaiting.
pub const AWAITING_ADDRESS: u64 = 0x5;

/// The `instruction_addr` written for the frame that ends a stack not
/// unwound further.
pub const UNWOUND_NO_FURTHER_ADDRESS: u64 = 0x6;

/// The `instruction_addr` written for the frame of a period its thread was
/// runnable but not given a CPU.
pub const WAITING_FOR_CPU_ADDRESS: u64 = 0x7;

/// The `instruction_addr` written for the frame between a signal handler
/// and the code the signal interrupted.
pub const SIGNAL_HANDLER_ADDRESS: u64 = 0x8;

/// The `instruction_addr` written for the frame of a period its thread
/// was blocked where the sampler did not read.
pub const WAITING_UNREAD_ADDRESS: u64 = 0x9;

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
        _ => None,
    }
}

/// A sample's thread as the encoder files it (see
/// [`crate::lanes::Lanes::thread_keys`]).
pub(crate) type ThreadKey = Option<(u64, Option<Arc<str>>)>;

/// Gives each worker's OS thread a sample with the single frame
/// `(running a request)` at every tick at which the worker's sample was
/// filed under a request's lane; returns `keys` extended with the new
/// samples' keys.
///
/// Sentry weights a sample by the time to the next sample on the same
/// thread. Without these samples, a worker's OS-thread timeline has a gap
/// wherever the worker polled requests, and Sentry charges the whole gap to
/// the OS-thread sample before it (an `epoll_wait` sample seen carrying
/// 0.38 s). With one per lane tick, each carries about one period, and what
/// the worker did then is shown as what it was: running requests, whose own
/// timelines hold the detail. The marker is a root frame and not in-app, so
/// Sentry's function metrics (which skip depth 0 and system frames) leave
/// it out.
pub(crate) fn mark_running_requests(chunk: &mut Chunk, mut keys: Vec<ThreadKey>) -> Vec<ThreadKey> {
    let mut marks: Vec<(u64, u32)> = Vec::new();
    let mut own: rustc_hash::FxHashSet<(u64, u32)> = rustc_hash::FxHashSet::default();
    for (s, key) in chunk.samples().iter().zip(&keys) {
        let Some((id, _)) = key else { continue };
        if s.thread_id == 0 {
            continue;
        }
        if *id == u64::from(s.thread_id) {
            own.insert((s.timestamp_ns, s.thread_id));
        } else {
            marks.push((s.timestamp_ns, s.thread_id));
        }
    }
    marks.sort_unstable();
    marks.dedup();
    let stack: Arc<[u64]> = Arc::from(&[RUNNING_REQUEST_FRAME][..]);
    for (ts, tid) in marks {
        if own.contains(&(ts, tid)) {
            continue;
        }
        let name = chunk.thread_name(tid).cloned();
        chunk.push_synthetic(ts, 0, &stack);
        keys.push(Some((u64::from(tid), name)));
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::Sample;

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
        ] {
            let (addr, name) = synthetic_frame(marker).unwrap();
            assert!(addr < 4096, "{name} at {addr:#x}");
        }
        assert_eq!(synthetic_frame(0x5555_0000), None);
    }

    #[test]
    fn a_worker_polling_a_lane_gets_a_running_sample_per_lane_tick() {
        let mut chunk = Chunk::new();
        let lane = crate::lanes::LANE_BASE + 7;
        let push = |c: &mut Chunk, ts, ctx| {
            c.push(&Sample::new(
                ts,
                42,
                Arc::from("worker"),
                Arc::from(&[0x10u64][..]),
                ctx,
                false,
            ));
        };
        push(&mut chunk, 0, 0);
        push(&mut chunk, 10, lane);
        push(&mut chunk, 20, lane);
        push(&mut chunk, 30, 0);
        let keys = vec![
            Some((42, None)),
            Some((lane, None)),
            Some((lane, None)),
            Some((42, None)),
        ];
        let keys = mark_running_requests(&mut chunk, keys);
        assert_eq!(chunk.len(), 6);
        assert_eq!(keys.len(), 6);
        let added: Vec<_> = chunk.samples()[4..]
            .iter()
            .map(|s| (s.timestamp_ns, &*chunk.stacks()[s.stack as usize]))
            .collect();
        assert_eq!(
            added,
            vec![
                (10, &[RUNNING_REQUEST_FRAME][..]),
                (20, &[RUNNING_REQUEST_FRAME][..])
            ]
        );
        assert_eq!(keys[4].as_ref().map(|k| k.0), Some(42));
        assert_eq!(
            keys[4].as_ref().and_then(|k| k.1.as_deref()),
            Some("worker")
        );
    }
}
