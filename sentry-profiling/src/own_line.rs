//! A value on a cache line of its own.

/// `T` alone on its cache line: for a counter the application's threads
/// write on every request, so that each write does not also take from
/// their cores the line of the fields they only read (the session's flags,
/// the lane queue's sender), which the compiler may place beside it.
#[repr(align(64))]
#[derive(Debug, Default)]
pub(crate) struct OwnLine<T>(pub(crate) T);

impl<T> std::ops::Deref for OwnLine<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// Lines a [`SpreadCount`] is spread over.
const SHARDS: usize = 16;

/// A count of things begun and ended on many threads (root spans), each
/// thread counting on a line of its own: one shared line written by every
/// worker at every request's start and end passed between their cores each
/// time. A thing may end on another thread than it began (Tokio moves a
/// task at an `.await`), so each line counts begun and ended apart, and
/// only the sums mean anything.
#[derive(Debug, Default)]
pub(crate) struct SpreadCount {
    lines: [OwnLine<Shard>; SHARDS],
}

#[derive(Debug, Default)]
struct Shard {
    begun: std::sync::atomic::AtomicU64,
    ended: std::sync::atomic::AtomicU64,
}

impl SpreadCount {
    /// The calling thread's line (threads beyond [`SHARDS`] share lines,
    /// which only costs them the sharing).
    fn line(&self) -> &Shard {
        use std::cell::Cell;
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        thread_local! {
            static LINE: Cell<usize> = const { Cell::new(usize::MAX) };
        }
        // A thread being torn down (its locals gone) counts on the first
        // line.
        let i = LINE
            .try_with(|l| {
                if l.get() == usize::MAX {
                    l.set(NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS);
                }
                l.get()
            })
            .unwrap_or(0);
        &self.lines[i].0
    }

    /// One thing began. Sequentially consistent, as [`SpreadCount::active`]'s
    /// reads: a thread that counts itself and then reads a flag, against
    /// one that writes the flag and then reads the count, cannot both miss
    /// the other.
    pub(crate) fn begin(&self) {
        self.line()
            .begun
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// One thing that [`SpreadCount::begin`] counted ended (on any thread).
    pub(crate) fn end(&self) {
        self.line()
            .ended
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Things begun and not ended: never fewer than those active for the
    /// whole call. The ends are summed first: each of them began before it
    /// ended, so its beginning is in the second sum, and no thing that ran
    /// throughout is cancelled by an end counted without its beginning.
    /// One that ended meanwhile may still be counted.
    pub(crate) fn active(&self) -> u64 {
        use std::sync::atomic::Ordering::SeqCst;
        let ended: u64 = self.lines.iter().map(|l| l.0.ended.load(SeqCst)).sum();
        let begun: u64 = self.lines.iter().map(|l| l.0.begun.load(SeqCst)).sum();
        begun.saturating_sub(ended)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn things_ended_on_other_threads_are_counted_out() {
        let count = std::sync::Arc::new(SpreadCount::default());
        // Begun on this thread, ended on many others, the lines each see
        // only part of it.
        for _ in 0..40 {
            count.begin();
        }
        assert_eq!(count.active(), 40);
        let threads: Vec<_> = (0..20)
            .map(|_| {
                let count = std::sync::Arc::clone(&count);
                std::thread::spawn(move || {
                    count.end();
                    count.begin();
                    count.end();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(count.active(), 20);
        for _ in 0..20 {
            count.end();
        }
        assert_eq!(count.active(), 0);
    }
}
