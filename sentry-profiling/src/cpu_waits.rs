//! The time each request's threads waited for a CPU, as its profile shows
//! it: the sampler adds a period for each `(waiting for a CPU)` sample it
//! emits under a request's context word, and the transport reads the total
//! when the request's transaction is sent (its `tokio.cpu_wait`).
//!
//! A fixed table indexed by the word: no allocation, no lock. The sampler
//! thread is its one writer; a word that meets a slot held by another
//! (two requests in flight whose words are [`SLOTS`] apart) takes it over,
//! and the other request's total then reads as what was added since: a
//! total is never more than its request waited as shown.

use std::sync::atomic::{AtomicU64, Ordering};

/// Slots in the table.
const SLOTS: usize = 4096;

struct Slot {
    word: AtomicU64,
    ns: AtomicU64,
}

static TABLE: [Slot; SLOTS] = [const {
    Slot {
        word: AtomicU64::new(0),
        ns: AtomicU64::new(0),
    }
}; SLOTS];

fn slot(word: u64) -> &'static Slot {
    &TABLE[(word % SLOTS as u64) as usize]
}

/// Adds `ns` of waiting for a CPU to the request of context word `word`
/// (the sampler thread only).
#[cfg_attr(
    not(profiling_supported),
    expect(dead_code, reason = "no sampler runs where profiling is unsupported")
)]
pub(crate) fn add(word: u64, ns: u64) {
    let s = slot(word);
    if s.word.load(Ordering::Relaxed) != word {
        s.ns.store(0, Ordering::Relaxed);
        s.word.store(word, Ordering::Release);
    }
    s.ns.fetch_add(ns, Ordering::Relaxed);
}

/// The time the request of context word `word` was shown waiting for a
/// CPU so far, ns.
pub(crate) fn of(word: u64) -> u64 {
    let s = slot(word);
    let ns = s.ns.load(Ordering::Relaxed);
    if s.word.load(Ordering::Acquire) == word {
        ns
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_reads_what_was_added_under_its_word_and_no_other() {
        let (a, b) = (
            crate::attribution::LANE_BASE + 7,
            crate::attribution::LANE_BASE + 8,
        );
        assert_eq!(of(a), 0);
        add(a, 10);
        add(a, 5);
        add(b, 3);
        assert_eq!((of(a), of(b)), (15, 3));
        // A word SLOTS apart takes the slot over.
        let c = a + SLOTS as u64;
        add(c, 4);
        assert_eq!((of(a), of(c)), (0, 4));
    }
}
