//! A worker's OS thread while it polls requests: the `(running a request)`
//! samples it gets where its own samples were filed under a request's lane
//! (the synthetic frames themselves are in `crate::frames`).

use std::sync::Arc;

use crate::chunk::Chunk;
use crate::frames::RUNNING_REQUEST_FRAME;

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
    fn a_worker_polling_a_lane_gets_a_running_sample_per_lane_tick() {
        let mut chunk = Chunk::new();
        let lane = crate::attribution::LANE_BASE + 7;
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
