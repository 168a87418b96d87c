//! The latest stacks captured in each request, for the periods a thread
//! spends in a request without a capture of its own there (see
//! `Worker::tick_thread`). Bounded: the oldest requests are forgotten
//! first.

use std::sync::Arc;

/// The latest stack captured in each request (by context word), for
/// periods a thread spends in a request without a capture of its own there.
/// Bounded: the oldest requests are forgotten first.
#[derive(Default)]
pub(super) struct RequestStacks {
    by_context: rustc_hash::FxHashMap<u64, Recent>,
    order: std::collections::VecDeque<u64>,
}

/// Most stacks [`RequestStacks`] keeps of one request.
const RECENT_PER_REQUEST: usize = 4;

/// A request's latest stacks, the newest at `latest`.
#[derive(Default)]
struct Recent {
    stacks: [Option<Arc<[u64]>>; RECENT_PER_REQUEST],
    latest: usize,
    len: usize,
}

/// Most requests [`RequestStacks`] remembers.
const MAX_REQUEST_STACKS: usize = 1024;

impl RequestStacks {
    pub(super) fn record(&mut self, context: u64, stack: &Arc<[u64]>) {
        if context == 0 {
            return;
        }
        let recent = match self.by_context.entry(context) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                self.order.push_back(context);
                e.insert(Recent::default())
            }
        };
        recent.latest = (recent.latest + 1) % RECENT_PER_REQUEST;
        recent.stacks[recent.latest] = Some(stack.clone());
        recent.len = (recent.len + 1).min(RECENT_PER_REQUEST);
        if self.order.len() > MAX_REQUEST_STACKS {
            if let Some(old) = self.order.pop_front() {
                self.by_context.remove(&old);
            }
        }
    }

    /// The request's latest stack.
    pub(super) fn get(&self, context: u64) -> Option<Arc<[u64]>> {
        self.pick(context, 0)
    }

    /// One of the request's latest stacks, the `n`th newest (round).
    /// Periods a thread spends preempted in a request show these in turn:
    /// where it was preempted is not known, and one stack repeated over a
    /// long preemption (a capture that happened to land in the runtime's
    /// code between two slices of work) would show that code for all of
    /// it.
    pub(super) fn pick(&self, context: u64, n: usize) -> Option<Arc<[u64]>> {
        let recent = self.by_context.get(&context)?;
        if recent.len == 0 {
            return None;
        }
        let back = n % recent.len;
        let i = (recent.latest + RECENT_PER_REQUEST - back) % RECENT_PER_REQUEST;
        recent.stacks[i].clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_gives_its_last_few_stacks_in_turn() {
        let s = |a: u64| -> Arc<[u64]> { Arc::from(&[a][..]) };
        let mut r = RequestStacks::default();
        assert!(r.get(7).is_none());
        // Context 0 is outside any request: never recorded.
        r.record(0, &s(1));
        assert!(r.get(0).is_none());
        r.record(7, &s(1));
        r.record(7, &s(2));
        assert_eq!(r.get(7), Some(s(2)));
        assert_eq!(r.pick(7, 1), Some(s(1)));
        assert_eq!(r.pick(7, 2), Some(s(2)));
        for a in 3..=6 {
            r.record(7, &s(a));
        }
        // The last four, newest first, in turn.
        let turns: Vec<_> = (0..5).map(|n| r.pick(7, n).unwrap()[0]).collect();
        assert_eq!(turns, [6, 5, 4, 3, 6]);
        // Another request's stacks are never given.
        assert!(r.pick(8, 0).is_none());
    }
}
