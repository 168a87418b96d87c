//! Whether and how a request's Sentry transaction or span is tagged with
//! the profiler and the thread its samples are filed under, decided in one
//! place ([`tag`]) for the tracing layer (a request's spans, and a
//! transaction someone else started) and for `http_layer()` (its own
//! transaction): the session says how (`SessionRef::tagging`), this says
//! whether, and writes it.

use std::cell::RefCell;

use sentry_core::TransactionOrSpan;
use sentry_core::protocol::Value;
use sentry_profiling::hooks::handover::HandedLane;
use sentry_profiling::hooks::{SessionRef, Tagging};

thread_local! {
    /// The kernel name of this thread, read once.
    static THREAD_NAME: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Whose transaction or span is being tagged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// The transaction `http_layer()` started: without transaction-based
    /// (V1) profiles its lane goes to the transport with it.
    Own,
    /// A transaction someone else started (`sentry-tower`'s), which a
    /// span of its own may have tagged already.
    Reused,
    /// The Sentry span or transaction a request's span was first entered
    /// under.
    Entered,
}

/// What [`tag`] did.
#[derive(Debug)]
pub(crate) enum Tagged {
    /// Written now, or already there.
    Done,
    /// The middleware's own transaction: its lane goes to the transport,
    /// which writes it and the lane's name as it sends the transaction.
    Handed(HandedLane),
    /// The profiler does not run now: nothing written (a later poll may
    /// tag it, if it runs again).
    NotRunning,
}

/// Tags `target` (see [`Target`]) of the request whose context word is
/// `word` and whose lane is named `name`, in the request's `session`:
/// the one decision of whether to tag, for every caller.
pub(crate) fn tag(
    session: &SessionRef,
    target: &TransactionOrSpan,
    whose: Target,
    word: u64,
    name: Option<&str>,
) -> Tagged {
    if whose == Target::Reused && is_tagged(target) {
        return Tagged::Done;
    }
    // Whether the profiler runs, without copying its id: a handed lane
    // does not need it (the transport writes it), and every thread shares
    // its reference count.
    if !session.is_running() {
        return Tagged::NotRunning;
    }
    let tagging = session.tagging(word, whose == Target::Own);
    if let Tagging::HandLane(id) = tagging {
        return Tagged::Handed(HandedLane { id });
    }
    let Some(profiler_id) = session.running_profiler_id() else {
        // Stopped just now.
        return Tagged::NotRunning;
    };
    write(session, target, tagging, &profiler_id, word, name);
    Tagged::Done
}

fn thread_name() -> String {
    THREAD_NAME.with(|n| {
        n.borrow_mut()
            .get_or_insert_with(|| {
                std::fs::read_to_string(format!(
                    "/proc/self/task/{}/comm",
                    sentry_profiling::hooks::current_thread_id()
                ))
                .map(|s| s.trim_end().to_owned())
                .unwrap_or_default()
            })
            .clone()
    })
}

/// Writes on a Sentry transaction or span the thread its samples are filed
/// under, as `tagging` says (a lane handed to the transport is not written
/// here), so Sentry's UI finds them.
fn write(
    session: &SessionRef,
    span: &TransactionOrSpan,
    tagging: Tagging,
    profiler_id: &str,
    lane: u64,
    lane_name: Option<&str>,
) {
    let (id, name, os_thread_keys) = match tagging {
        Tagging::Lane {
            lane,
            os_thread_keys,
        } => (lane, lane_name.map(str::to_owned), os_thread_keys),
        Tagging::OsThread | Tagging::HandLane(_) => (
            sentry_profiling::hooks::current_thread_id(),
            Some(thread_name()),
            false,
        ),
    };
    span.set_data("thread.id", Value::String(id.to_string()));
    if let Some(name) = name {
        span.set_data("thread.name", Value::String(name));
    }
    if os_thread_keys {
        // For transaction profiles: a request too short for its lane to get
        // two samples is linked by this OS thread instead. Continuous
        // profiling keeps every lane (the chunk thread gives each at
        // least two samples), so it does without these keys.
        span.set_data(
            sentry_profiling::hooks::keys::OS_THREAD_ID,
            Value::String(sentry_profiling::hooks::current_thread_id().to_string()),
        );
        span.set_data(
            sentry_profiling::hooks::keys::OS_THREAD_NAME,
            Value::String(thread_name()),
        );
    }
    match span {
        TransactionOrSpan::Span(_) => {
            span.set_data("profiler_id", Value::String(profiler_id.to_owned()));
        }
        TransactionOrSpan::Transaction(_) => {
            if session.transaction_profiled(lane, lane_name.unwrap_or_default()) {
                span.set_data(
                    sentry_profiling::hooks::keys::TRANSACTION_PROFILE_MARKER,
                    Value::Bool(true),
                );
            }
        }
    }
}

/// Whether a transaction or span already carries the thread its samples
/// are filed under.
fn is_tagged(span: &TransactionOrSpan) -> bool {
    match span {
        TransactionOrSpan::Transaction(tx) => tx.data().iter().any(|(key, _)| key == "thread.id"),
        TransactionOrSpan::Span(s) => s.data().contains_key("thread.id"),
    }
}
