//! Which requests (by context word) have had a stack captured, on any
//! thread: a thread inside a request that has none yet gets its timer
//! brought forward (see `Services::nudge`). Bounded: the oldest requests are
//! forgotten first.

/// The requests a stack was captured in lately, by context word.
#[derive(Default)]
pub(super) struct CapturedRequests {
    seen: rustc_hash::FxHashSet<u64>,
    order: std::collections::VecDeque<u64>,
}

/// Most requests [`CapturedRequests`] remembers.
const MAX_REQUESTS: usize = 1024;

impl CapturedRequests {
    /// A stack was captured in the request of `context` (0: none).
    pub(super) fn record(&mut self, context: u64) {
        if context == 0 || !self.seen.insert(context) {
            return;
        }
        self.order.push_back(context);
        if self.order.len() > MAX_REQUESTS {
            if let Some(old) = self.order.pop_front() {
                self.seen.remove(&old);
            }
        }
    }

    /// Whether a stack was captured in the request of `context`.
    pub(super) fn contains(&self, context: u64) -> bool {
        self.seen.contains(&context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_with_a_capture_are_remembered_up_to_a_bound() {
        let mut r = CapturedRequests::default();
        assert!(!r.contains(7));
        // Context 0 is outside any request: never recorded.
        r.record(0);
        assert!(!r.contains(0));
        r.record(7);
        r.record(7);
        assert!(r.contains(7));
        for c in 100..100 + MAX_REQUESTS as u64 {
            r.record(c);
        }
        // The oldest is forgotten first.
        assert!(!r.contains(7));
        assert!(r.contains(100 + MAX_REQUESTS as u64 - 1));
        assert_eq!(r.order.len(), MAX_REQUESTS);
    }
}
