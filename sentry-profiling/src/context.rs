//! Context words the sampler can read without interrupting the thread.
//!
//! The signal handler copies a thread's context word from a thread-local
//! into each sample it takes. A thread that has not run since its last
//! sample is not signalled; its previous stack is recorded again, and for
//! that sample the sampler needs the thread's context word *now* (the thread
//! may have left the request's span before parking). So every thread that
//! sets a context word also mirrors it into a slot of a static table, which
//! the sampler reads by thread id. Slots are claimed on a thread's first
//! context change and given back when the thread exits.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// How many threads can publish a context word at once; threads beyond it
/// get fill-in behaviour without a context (their repeated samples say 0).
const MAX_SLOTS: usize = 4096;

/// `MY_SLOT` value: no slot claimed yet.
const UNCLAIMED: u32 = u32::MAX;
/// `MY_SLOT` value: the table was full; do not try again.
const NONE: u32 = u32::MAX - 1;

static SLOTS: [AtomicU64; MAX_SLOTS] = [const { AtomicU64::new(0) }; MAX_SLOTS];
/// The thread id holding each slot (0: free), so that a reader holding a
/// slot number learned before its thread exited does not read the word of
/// the next thread that claimed it.
static OWNERS: [AtomicU32; MAX_SLOTS] = [const { AtomicU32::new(0) }; MAX_SLOTS];

/// Slot bookkeeping: who holds which slot, and which are free.
#[derive(Default)]
struct Table {
    by_tid: HashMap<u32, u32>,
    free: Vec<u32>,
    next: u32,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

/// Gives the slot back when its thread exits.
struct SlotGuard {
    slot: u32,
    tid: u32,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        SLOTS[self.slot as usize].store(0, Ordering::Relaxed);
        OWNERS[self.slot as usize].store(0, Ordering::Release);
        if crate::sys::in_forked_child() {
            // See `publish`: never wait for a lock held across the fork.
            return;
        }
        let mut table = TABLE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = table.as_mut() {
            t.by_tid.remove(&self.tid);
            t.free.push(self.slot);
        }
    }
}

thread_local! {
    static MY_SLOT: Cell<u32> = const { Cell::new(UNCLAIMED) };
    static GUARD: Cell<Option<SlotGuard>> = const { Cell::new(None) };
}

fn claim(tid: u32) -> u32 {
    let mut table = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let t = table.get_or_insert_with(Table::default);
    let slot = match t.free.pop() {
        Some(s) => s,
        None if (t.next as usize) < MAX_SLOTS => {
            t.next += 1;
            t.next - 1
        }
        None => return NONE,
    };
    t.by_tid.insert(tid, slot);
    drop(table);
    OWNERS[slot as usize].store(tid, Ordering::Release);
    // Registers the thread-local destructor that gives the slot back.
    let _ = GUARD.try_with(|g| g.set(Some(SlotGuard { slot, tid })));
    slot
}

/// Mirrors the calling thread's new context word into its slot.
#[inline]
pub(crate) fn publish(value: u64, tid: impl FnOnce() -> u32) {
    let Ok(mut slot) = MY_SLOT.try_with(Cell::get) else {
        return;
    };
    if slot == UNCLAIMED {
        if crate::sys::in_forked_child() {
            // The table's lock may have been held by a thread that stayed in
            // the parent, and no sampler reads the table here anyway.
            return;
        }
        slot = claim(tid());
        let _ = MY_SLOT.try_with(|s| s.set(slot));
    }
    if slot != NONE {
        SLOTS[slot as usize].store(value, Ordering::Relaxed);
    }
}

/// The slots of threads that publish context words, by thread id.
pub(crate) fn slots_by_tid() -> HashMap<u32, u32> {
    TABLE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map(|t| t.by_tid.clone())
        .unwrap_or_default()
}

/// The context word last published in `slot`.
#[inline]
pub(crate) fn read(slot: u32) -> u64 {
    SLOTS
        .get(slot as usize)
        .map_or(0, |s| s.load(Ordering::Relaxed))
}

/// The context word last published in `slot` by thread `tid`; 0 if the
/// slot is no longer that thread's.
#[inline]
pub(crate) fn read_for(slot: u32, tid: i32) -> u64 {
    let i = slot as usize;
    if i >= MAX_SLOTS || OWNERS[i].load(Ordering::Acquire) != tid as u32 {
        return 0;
    }
    let value = SLOTS[i].load(Ordering::Relaxed);
    // Claimed by another thread in between: its word, not `tid`'s.
    if OWNERS[i].load(Ordering::Acquire) != tid as u32 {
        return 0;
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_publishes_and_gives_its_slot_back() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::spawn(move || {
            publish(42, || 4_000_000);
            tx.send(()).unwrap();
            done_rx.recv().unwrap();
        });
        rx.recv().unwrap();
        let slot = slots_by_tid()[&4_000_000];
        assert_eq!(read(slot), 42);
        assert_eq!(read_for(slot, 4_000_000), 42);
        assert_eq!(read_for(slot, 4_000_001), 0, "another thread's slot");
        done_tx.send(()).unwrap();
        h.join().unwrap();
        assert!(!slots_by_tid().contains_key(&4_000_000));
        assert_eq!(read(slot), 0);
        assert_eq!(read_for(slot, 4_000_000), 0, "given back");
    }
}
