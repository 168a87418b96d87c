//! Where a fill stands, as pure functions: which request a period a thread
//! did not run (or ran without a capture) belongs to, and which stack it
//! shows. `Worker::tick_thread` gathers the inputs (the context word the
//! thread published at the fill's moment, what it knows of the thread, the
//! requests' latest stacks); everything here is decided from its arguments
//! alone, so the unit tests below pin every case down.

use std::sync::Arc;

/// Where a thread stood at a fill's tick, as far as its published context
/// word tells (see `crate::context`).
#[derive(Debug, Clone)]
pub(super) enum AtTick {
    /// It publishes no context word: the fill gets what the thread's
    /// captures tell.
    Unknown,
    /// It was inside no request, or that is not known any more (a tick
    /// so late that the thread's history of words does not reach back to
    /// the fill's moment): the fill is filed under no request.
    Outside,
    /// It was inside the request of this context word, the same one as its
    /// latest capture, whose stack it stands in: running it, preempted in
    /// it (a CPU-time timer does not fire while a thread waits for a core),
    /// or blocked inside it. The fill belongs to that request.
    In(Arc<[u64]>, u64),
    /// Inside the request of this context word, not captured in it at the
    /// tick: recorded with the request's latest stack if one is known by
    /// then, or else with the thread's latest stack if that was captured in
    /// a request (request-handling code), otherwise as
    /// [`AtTick::Outside`].
    InRequest(u64),
}

/// What the sampler knows of a thread when it decides where a fill stands.
#[derive(Debug, Default)]
pub(super) struct Known<'a> {
    /// Where it waits, if read while blocked (and not since found running
    /// elsewhere), with the context word it published then.
    pub(super) waiting: Option<(&'a Arc<[u64]>, u64)>,
    /// Its latest capture, with the context word captured with it.
    pub(super) last: Option<(&'a Arc<[u64]>, u64)>,
}

/// Where a fill stands, from the context word the thread published at the
/// fill's moment (`None`: the thread publishes none; `Some(None)`: it does,
/// but the word at that moment is no longer known) and `request_stack`, a
/// stack captured in that request lately on any thread (the worker passes
/// one of the request's last few in turn). In order: where the thread was
/// read waiting inside that request; a stack the request ran lately; the
/// thread's own latest capture if taken in that request; or, none yet, the
/// request's first capture, awaited.
pub(super) fn standing(
    word: Option<Option<u64>>,
    known: &Known<'_>,
    request_stack: impl FnOnce(u64) -> Option<Arc<[u64]>>,
) -> AtTick {
    let context = match word {
        None => return AtTick::Unknown,
        Some(None | Some(0)) => return AtTick::Outside,
        Some(Some(context)) => context,
    };
    // Blocked inside the request, where it was read waiting.
    if let Some((stack, c)) = known.waiting {
        if c == context {
            return AtTick::In(stack.clone(), context);
        }
    }
    // Running or preempted in it: a stack captured in it lately (on any
    // thread, its own latest capture there among them).
    if let Some(stack) = request_stack(context) {
        return AtTick::In(stack, context);
    }
    match known.last {
        Some((stack, c)) if c == context => AtTick::In(stack.clone(), context),
        // No capture in the request yet (it just began): looked up again
        // when the fill is recorded.
        _ => AtTick::InRequest(context),
    }
}

/// Where a fill stands that a thread spent running about the time of its
/// capture `ran` (a stack and the context word captured with it) without a
/// capture of its own: the capture's stack, filed under the request the
/// thread published at the fill's moment (`word`, as for [`standing`]); a
/// request other than the capture's shows its own latest stack.
pub(super) fn standing_running(
    word: Option<Option<u64>>,
    ran: (&Arc<[u64]>, u64),
    request_stack: impl FnOnce(u64) -> Option<Arc<[u64]>>,
) -> AtTick {
    let (stack, captured_in) = ran;
    match word {
        // Publishes no word: the capture's own (0).
        None => AtTick::In(stack.clone(), captured_in),
        Some(None | Some(0)) => AtTick::In(stack.clone(), 0),
        Some(Some(context)) if context == captured_in => AtTick::In(stack.clone(), context),
        Some(Some(context)) => match request_stack(context) {
            Some(stack) => AtTick::In(stack, context),
            None => AtTick::InRequest(context),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fill_of_a_running_thread_shows_its_capture_in_the_request_of_its_moment() {
        let captured: Arc<[u64]> = Arc::from(&[3u64][..]);
        let other: Arc<[u64]> = Arc::from(&[5u64][..]);
        let is_in = |a: &AtTick, stack: &Arc<[u64]>, context: u64| matches!(a, AtTick::In(s, c) if s == stack && *c == context);
        let none = |_| None;
        // No word published: the capture's, as captured.
        assert!(is_in(
            &standing_running(None, (&captured, 0), none),
            &captured,
            0
        ));
        // Still in the capture's request.
        assert!(is_in(
            &standing_running(Some(Some(8)), (&captured, 8), none),
            &captured,
            8
        ));
        // Out of any request by then (or not known): the capture's code,
        // no request's time.
        assert!(is_in(
            &standing_running(Some(Some(0)), (&captured, 8), none),
            &captured,
            0
        ));
        assert!(is_in(
            &standing_running(Some(None), (&captured, 8), none),
            &captured,
            0
        ));
        // Polling another request by then: that request's stack, or its
        // first capture awaited.
        let from_other = |c| (c == 9).then(|| other.clone());
        assert!(is_in(
            &standing_running(Some(Some(9)), (&captured, 8), from_other),
            &other,
            9
        ));
        assert!(matches!(
            standing_running(Some(Some(9)), (&captured, 8), none),
            AtTick::InRequest(9)
        ));
    }

    #[test]
    fn a_fill_stands_in_the_request_published_at_its_moment() {
        let waiting: Arc<[u64]> = Arc::from(&[1u64, 2][..]);
        let last: Arc<[u64]> = Arc::from(&[3u64, 4][..]);
        let other: Arc<[u64]> = Arc::from(&[5u64][..]);
        let known = Known {
            waiting: Some((&waiting, 7)),
            last: Some((&last, 8)),
        };
        let none = |_| None;
        let is_in = |a: &AtTick, stack: &Arc<[u64]>, context: u64| matches!(a, AtTick::In(s, c) if s == stack && *c == context);
        // Publishes nothing; publishes 0; history lost.
        assert!(matches!(standing(None, &known, none), AtTick::Unknown));
        assert!(matches!(
            standing(Some(Some(0)), &known, none),
            AtTick::Outside
        ));
        assert!(matches!(
            standing(Some(None), &known, none),
            AtTick::Outside
        ));
        // Blocked inside request 7; last captured in request 8.
        assert!(is_in(&standing(Some(Some(7)), &known, none), &waiting, 7));
        assert!(is_in(&standing(Some(Some(8)), &known, none), &last, 8));
        // Request 8 ran other code lately (the worker passes its stacks in
        // turn): a preempted thread's periods show those, not one capture
        // repeated.
        let lately = |c| (c == 8).then(|| other.clone());
        assert!(is_in(&standing(Some(Some(8)), &known, lately), &other, 8));
        // Request 9: its latest stack from another thread, or none yet.
        let from_other = |c| (c == 9).then(|| other.clone());
        assert!(is_in(
            &standing(Some(Some(9)), &known, from_other),
            &other,
            9
        ));
        assert!(matches!(
            standing(Some(Some(9)), &known, none),
            AtTick::InRequest(9)
        ));
        // Nothing known of the thread at all.
        let nothing = Known::default();
        assert!(matches!(
            standing(Some(Some(7)), &nothing, none),
            AtTick::InRequest(7)
        ));
    }
}
