//! Where a fill stands, as pure functions: which request a period a thread
//! did not run (or ran without a capture) belongs to, and which stack it
//! shows. A thread's tick (`step`) gathers the inputs (the context word the
//! thread published at the fill's moment, what it knows of the thread);
//! everything here is decided from its arguments
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
    /// It was inside the request of this context word, where this stack
    /// says: blocked there (read while it waited), or waiting for a CPU in
    /// it. The fill belongs to that request.
    In(Arc<[u64]>, u64),
    /// Running the code of a capture next to the fill (see
    /// [`standing_running`]), in the request of this context word (0:
    /// none).
    Ran(Arc<[u64]>, u64),
    /// Inside the request of this context word, and where is not known yet
    /// (it ran without a capture, or was not looked at): the fill shows
    /// where the thread is found standing in that request when it leaves
    /// (waiting for a CPU, blocked), or else that it ran without a stack
    /// captured. Never another moment's stack of the request: its code may
    /// have moved on.
    InRequest(u64),
}

/// What the sampler knows of a thread when it decides where a fill stands.
#[derive(Debug, Default)]
pub(super) struct Known<'a> {
    /// Where it waits, if read while blocked (and not since found running
    /// elsewhere), with the context word it published then.
    pub(super) waiting: Option<(&'a Arc<[u64]>, u64)>,
    /// The context word it published when found runnable but not running
    /// (preempted), if it has not run since.
    pub(super) preempted: Option<u64>,
}

/// Where a fill stands, from the context word the thread published at the
/// fill's moment (`None`: the thread publishes none; `Some(None)`: it does,
/// but the word at that moment is no longer known): where the thread was
/// read waiting inside that request; waiting for a CPU, if found preempted
/// in it; or, not known yet, [`AtTick::InRequest`].
pub(super) fn standing(word: Option<Option<u64>>, known: &Known<'_>) -> AtTick {
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
    if known.preempted == Some(context) {
        return AtTick::In(synthetic(crate::frames::WAITING_FOR_CPU_FRAME), context);
    }
    AtTick::InRequest(context)
}

/// Where a fill stands that a thread spent running about the time of its
/// capture `ran` (a stack and the context word captured with it) without a
/// capture of its own: the capture's stack, filed under the request the
/// thread published at the fill's moment (`word`, as for [`standing`]); in
/// a request other than the capture's, not known yet.
pub(super) fn standing_running(word: Option<Option<u64>>, ran: (&Arc<[u64]>, u64)) -> AtTick {
    let (stack, captured_in) = ran;
    match word {
        // Publishes no word: the capture's own (0).
        None => AtTick::Ran(stack.clone(), captured_in),
        Some(None | Some(0)) => AtTick::Ran(stack.clone(), 0),
        Some(Some(context)) if context == captured_in => AtTick::Ran(stack.clone(), context),
        Some(Some(context)) => AtTick::InRequest(context),
    }
}

/// A stack of the one synthetic frame `frame`: `(waiting for a CPU)`,
/// `(running: no stack captured in time)` or `(waiting: where not read in
/// time)`, made once and shared (fills take them at every tick), or any
/// other frame, made anew.
pub(super) fn synthetic(frame: u64) -> Arc<[u64]> {
    static MADE: std::sync::OnceLock<[Arc<[u64]>; 3]> = std::sync::OnceLock::new();
    let made = MADE.get_or_init(|| {
        [
            crate::frames::WAITING_FOR_CPU_FRAME,
            crate::frames::UNCAPTURED_FRAME,
            crate::frames::WAITING_UNREAD_FRAME,
        ]
        .map(|f| Arc::from(&[f][..]))
    });
    made.iter()
        .find(|s| s[0] == frame)
        .cloned()
        .unwrap_or_else(|| Arc::from(&[frame][..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_in(a: &AtTick, stack: &[u64], context: u64) -> bool {
        matches!(a, AtTick::In(s, c) if **s == *stack && *c == context)
    }

    fn ran(a: &AtTick, stack: &[u64], context: u64) -> bool {
        matches!(a, AtTick::Ran(s, c) if **s == *stack && *c == context)
    }

    #[test]
    fn a_fill_of_a_running_thread_shows_its_capture_in_the_request_of_its_moment() {
        let captured: Arc<[u64]> = Arc::from(&[3u64][..]);
        // No word published: the capture's, as captured.
        assert!(ran(&standing_running(None, (&captured, 0)), &[3], 0));
        // Still in the capture's request.
        assert!(ran(
            &standing_running(Some(Some(8)), (&captured, 8)),
            &[3],
            8
        ));
        // Out of any request by then (or not known): the capture's code,
        // no request's time.
        assert!(ran(
            &standing_running(Some(Some(0)), (&captured, 8)),
            &[3],
            0
        ));
        assert!(ran(&standing_running(Some(None), (&captured, 8)), &[3], 0));
        // Polling another request by then: never the capture's stack (or
        // another of that request's), where is not known yet.
        assert!(matches!(
            standing_running(Some(Some(9)), (&captured, 8)),
            AtTick::InRequest(9)
        ));
    }

    #[test]
    fn a_fill_stands_in_the_request_published_at_its_moment() {
        let waiting: Arc<[u64]> = Arc::from(&[1u64, 2][..]);
        let known = Known {
            waiting: Some((&waiting, 7)),
            preempted: None,
        };
        // Publishes nothing; publishes 0; history lost.
        assert!(matches!(standing(None, &known), AtTick::Unknown));
        assert!(matches!(standing(Some(Some(0)), &known), AtTick::Outside));
        assert!(matches!(standing(Some(None), &known), AtTick::Outside));
        // Blocked inside request 7.
        assert!(is_in(&standing(Some(Some(7)), &known), &[1, 2], 7));
        // In request 8 and not known where: no stack of any other moment.
        assert!(matches!(
            standing(Some(Some(8)), &known),
            AtTick::InRequest(8)
        ));
        // Found preempted in request 8: waiting for a CPU there, not in
        // request 9.
        let preempted = Known {
            waiting: None,
            preempted: Some(8),
        };
        assert!(is_in(
            &standing(Some(Some(8)), &preempted),
            &[crate::frames::WAITING_FOR_CPU_FRAME],
            8
        ));
        assert!(matches!(
            standing(Some(Some(9)), &preempted),
            AtTick::InRequest(9)
        ));
        // Nothing known of the thread at all.
        assert!(matches!(
            standing(Some(Some(7)), &Known::default()),
            AtTick::InRequest(7)
        ));
    }
}
