//! A bounded queue from one thread to one other, for the lane events an
//! application thread reports (see [`super::registry`]).
//!
//! Each application thread writes its own ring, so two workers reporting
//! at once never write the same cache line: a queue every worker shares
//! passes its write index between their cores at each event (at thousands
//! of requests a second, the largest share of the profiler's cost on the
//! workers under `perf`). The writer and the reader each move only their
//! own index; an event's place is handed from one to the other by the
//! index's release and acquire. Each keeps the other's index as last seen,
//! and loads it again only when that says the ring is full (or empty): the
//! two lines cross between cores about once per read, not once per event.

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::own_line::OwnLine;

/// The places, shared by the one [`Writer`] and the one [`Reader`].
struct Ring<T> {
    places: Box<[UnsafeCell<MaybeUninit<T>>]>,
    /// Events written so far (wrapping): stored by the writer only.
    written: OwnLine<AtomicUsize>,
    /// Events read so far (wrapping): stored by the reader only.
    read: OwnLine<AtomicUsize>,
    /// The writer is gone: once empty, the ring can be forgotten.
    closed: AtomicBool,
}

// SAFETY: a place is touched by one thread at a time. The writer (the one
// `Writer`, which is not `Clone`) writes only places the reader has given
// back (`written - read < len`, with `read` as it last loaded it with
// acquire after the reader's release store: never ahead of the reader, so
// never a place the reader still holds); the reader (the one `Reader`, not
// `Clone` either, and used through `&mut`) reads only places the writer has
// filled (`read < written`, with `written` as it last loaded it with
// acquire after the writer's release store, never ahead of the writer). Values move between threads, hence `T: Send`.
unsafe impl<T: Send> Sync for Ring<T> {}

impl<T> Ring<T> {
    fn len(&self) -> usize {
        self.places.len()
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        let (read, written) = (*self.read.0.get_mut(), *self.written.0.get_mut());
        let mut at = read;
        while at != written {
            let place = &mut self.places[at % self.places.len()];
            // SAFETY: places from `read` up to `written` were filled by the
            // writer and not taken by the reader; both are gone (`&mut`).
            unsafe { place.get_mut().assume_init_drop() };
            at = at.wrapping_add(1);
        }
    }
}

/// Creates a ring of `len` places (at least one).
pub(crate) fn ring<T: Send>(len: usize) -> (Writer<T>, Reader<T>) {
    let ring = Arc::new(Ring {
        places: (0..len.max(1))
            .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
            .collect(),
        written: OwnLine(AtomicUsize::new(0)),
        read: OwnLine(AtomicUsize::new(0)),
        closed: AtomicBool::new(false),
    });
    (
        Writer {
            ring: Arc::clone(&ring),
            written: 0,
            read_seen: 0,
        },
        Reader {
            ring,
            read: 0,
            written_seen: 0,
        },
    )
}

/// The writing end; dropping it tells the reader no more will come.
pub(crate) struct Writer<T> {
    ring: Arc<Ring<T>>,
    /// The ring's `written` (only this writer stores it).
    written: usize,
    /// The ring's `read`, as last loaded: never ahead of it.
    read_seen: usize,
}

impl<T> Writer<T> {
    /// Adds `value`, or hands it back when the ring is full. Never blocks.
    pub(crate) fn push(&mut self, value: T) -> Result<(), T> {
        let ring = &*self.ring;
        let written = self.written;
        if written.wrapping_sub(self.read_seen) >= ring.len() {
            self.read_seen = ring.read.load(Ordering::Acquire);
            if written.wrapping_sub(self.read_seen) >= ring.len() {
                return Err(value);
            }
        }
        let place = &ring.places[written % ring.len()];
        // SAFETY: the place is not between `read` and `written`, so the
        // reader does not touch it (see `Ring`'s `Sync`); `&mut self` makes
        // this the only writer.
        unsafe { (*place.get()).write(value) };
        self.written = written.wrapping_add(1);
        ring.written.store(self.written, Ordering::Release);
        Ok(())
    }
}

impl<T> Drop for Writer<T> {
    fn drop(&mut self) {
        self.ring.closed.store(true, Ordering::Release);
    }
}

impl<T> std::fmt::Debug for Writer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ring::Writer")
    }
}

/// The reading end.
pub(crate) struct Reader<T> {
    ring: Arc<Ring<T>>,
    /// The ring's `read` (only this reader stores it).
    read: usize,
    /// The ring's `written`, as last loaded: never ahead of it.
    written_seen: usize,
}

impl<T> Reader<T> {
    /// Takes the oldest value, if any.
    pub(crate) fn pop(&mut self) -> Option<T> {
        let ring = &*self.ring;
        let read = self.read;
        if read == self.written_seen {
            self.written_seen = ring.written.load(Ordering::Acquire);
            if read == self.written_seen {
                return None;
            }
        }
        let place = &ring.places[read % ring.len()];
        // SAFETY: `read < written`: the writer filled the place and will
        // not touch it until `read` moves past it (see `Ring`'s `Sync`);
        // `&mut self` makes this the only reader. The value is moved out
        // once: `read` moves on just after.
        let value = unsafe { (*place.get()).assume_init_read() };
        self.read = read.wrapping_add(1);
        ring.read.store(self.read, Ordering::Release);
        Some(value)
    }

    /// Whether the writer is gone and everything it wrote was read: the
    /// ring can be forgotten.
    pub(crate) fn is_finished(&self) -> bool {
        // The flag first: a writer that wrote and then closed is seen
        // closed only with its writes visible.
        self.ring.closed.load(Ordering::Acquire)
            && self.read == self.ring.written.load(Ordering::Acquire)
    }
}

impl<T> std::fmt::Debug for Reader<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ring::Reader")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_come_out_in_order_and_a_full_ring_refuses() {
        let (mut w, mut r) = ring::<u64>(4);
        for round in 0..3u64 {
            for i in 0..4 {
                assert_eq!(w.push(round * 10 + i), Ok(()));
            }
            assert_eq!(w.push(99), Err(99), "full");
            for i in 0..4 {
                assert_eq!(r.pop(), Some(round * 10 + i));
            }
            assert_eq!(r.pop(), None);
        }
        assert!(!r.is_finished(), "its writer is alive");
        w.push(7).unwrap();
        drop(w);
        assert!(!r.is_finished(), "a value is left");
        assert_eq!(r.pop(), Some(7));
        assert!(r.is_finished());
    }

    #[test]
    fn values_cross_threads_whole_and_none_leaks() {
        // Every value written on one thread is read once on another, in
        // order; those left in the ring are dropped with it.
        let (mut w, mut r) = ring::<Arc<u64>>(8);
        let writer = std::thread::spawn(move || {
            let mut next = 0u64;
            while next < 100_000 {
                if w.push(Arc::new(next)).is_ok() {
                    next += 1;
                } else {
                    std::thread::yield_now();
                }
            }
            w
        });
        let mut expected = 0u64;
        while expected < 100_000 {
            match r.pop() {
                Some(v) => {
                    assert_eq!(*v, expected);
                    expected += 1;
                }
                None => std::thread::yield_now(),
            }
        }
        let mut w = writer.join().unwrap();
        // Left unread: freed with the ring.
        let alive = Arc::new(0u64);
        for _ in 0..3 {
            w.push(Arc::clone(&alive)).unwrap();
        }
        drop(w);
        assert_eq!(Arc::strong_count(&alive), 4);
        drop(r);
        assert_eq!(Arc::strong_count(&alive), 1, "the ring's values dropped");
    }
}
