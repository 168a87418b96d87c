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

use rustc_hash::FxHashMap as HashMap;
use std::cell::Cell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// How many threads can publish a context word at once; threads beyond it
/// get fill-in behaviour without a context (their repeated samples say 0).
const MAX_SLOTS: usize = 4096;

/// `MY_SLOT` value: no slot claimed yet.
const UNCLAIMED: u32 = u32::MAX;
/// `MY_SLOT` value: the table was full; do not try again.
const NONE: u32 = u32::MAX - 1;

/// What a slot's thread writes at every change of its word: the word, and
/// how many times it was published. One cache line per slot: kept in two
/// packed arrays, neighbouring slots (a runtime's workers claim theirs one
/// after the other) shared lines, and each worker's publication took the
/// line from the core of the worker publishing beside it (the
/// `context_publish` bench measures both layouts).
#[repr(align(64))]
struct Published {
    word: AtomicU64,
    changes: AtomicU64,
}

static PUBLISHED: [Published; MAX_SLOTS] = [const {
    Published {
        word: AtomicU64::new(0),
        changes: AtomicU64::new(0),
    }
}; MAX_SLOTS];

/// The thread id holding each slot (0: free), so that a reader holding a
/// slot number learned before its thread exited does not read the word of
/// the next thread that claimed it.
static OWNERS: [AtomicU32; MAX_SLOTS] = [const { AtomicU32::new(0) }; MAX_SLOTS];
/// When each slot was claimed by its current thread (`CLOCK_REALTIME`, ns):
/// history entries older than that are a previous thread's.
static CLAIMED_AT: [AtomicU64; MAX_SLOTS] = [const { AtomicU64::new(0) }; MAX_SLOTS];
/// Each slot's publication count when its current thread claimed it:
/// publications before that are a previous thread's, never its losses.
static CLAIMED_SEQ: [AtomicU64; MAX_SLOTS] = [const { AtomicU64::new(0) }; MAX_SLOTS];
/// An address on each slot's thread's stack, taken when it claimed the
/// slot: the sampler learns the thread's stack mapping from it before its
/// first capture (a capture of a thread whose stack bounds are unknown
/// holds no stack).
static STACK_HINT: [AtomicUsize; MAX_SLOTS] = [const { AtomicUsize::new(0) }; MAX_SLOTS];
/// Each slot's publication count when its last thread exited, and when
/// that thread had claimed it: a reader that had not yet read that thread's
/// last publications still reads them (see [`read_changes`]).
static EXITED_SEQ: [AtomicU64; MAX_SLOTS] = [const { AtomicU64::new(0) }; MAX_SLOTS];
static EXITED_OWNER: [AtomicU32; MAX_SLOTS] = [const { AtomicU32::new(0) }; MAX_SLOTS];
static CLAIMED_AT_OF_EXITED: [AtomicU64; MAX_SLOTS] = [const { AtomicU64::new(0) }; MAX_SLOTS];

/// How many of a thread's latest words are kept, each with the time it was
/// published: the sampler asks what a thread's word was at a tick it
/// processes later (it may itself wait for a core on a busy machine, or
/// doze through a few periods, and a request's future yields every few
/// milliseconds). A Tokio worker serving 500 requests a second changes its
/// word about 24 times a period; 128 entries let the sampler doze three
/// periods at that rate (64 allowed none), at 3 KiB per thread that
/// publishes.
const HISTORY: usize = 128;

/// One published word and when (`CLOCK_REALTIME`, ns), with, for a poll
/// of an instrumented future that begins here, when that future was woken
/// (see [`set_poll_woken`]; 0: not known), and [`OWN_POLL`] if that future
/// is a request's own rather than work it handed off.
struct Entry {
    value: AtomicU64,
    since_ns: AtomicU64,
    woken_ns: AtomicU64,
}

/// Each slot's latest words: publication `n` is at `n % HISTORY`. Only the
/// owner writes; readers check the slot's count of publications before and
/// after (a sequence lock) and trust only entries no newer publication can
/// have overwritten.
static HISTORY_TABLE: [History; MAX_SLOTS] = [const {
    History(
        [const {
            Entry {
                value: AtomicU64::new(0),
                since_ns: AtomicU64::new(0),
                woken_ns: AtomicU64::new(0),
            }
        }; HISTORY],
    )
}; MAX_SLOTS];

/// One slot's history, starting on a cache line of its own (see
/// [`Published`]).
#[repr(align(64))]
struct History([Entry; HISTORY]);

/// Slot bookkeeping: who holds which slot, and which are free.
#[derive(Default)]
struct Table {
    by_tid: HashMap<u32, u32>,
    free: Vec<u32>,
    next: u32,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

/// One more than the highest slot ever claimed: the slots
/// [`read_changes`] looks at.
static SLOTS_USED: AtomicU32 = AtomicU32::new(0);

/// Bumped at every claim, so the sampler knows when to re-read
/// [`slots_by_tid`] (a thread's first context change must not wait for the
/// next thread listing to be seen).
static CLAIMS: AtomicU64 = AtomicU64::new(0);

/// Gives the slot back when its thread exits.
struct SlotGuard {
    slot: u32,
    tid: u32,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        // The thread may still publish while its other thread-locals are
        // destroyed: from now on that writes nothing, rather than into a
        // slot another thread may claim next.
        let _ = MY_SLOT.try_with(|s| s.set(NONE));
        let i = self.slot as usize;
        EXITED_SEQ[i].store(
            PUBLISHED[i].changes.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        EXITED_OWNER[i].store(self.tid, Ordering::Relaxed);
        CLAIMED_AT_OF_EXITED[i].store(CLAIMED_AT[i].load(Ordering::Relaxed), Ordering::Relaxed);
        PUBLISHED[i].word.store(0, Ordering::Relaxed);
        OWNERS[i].store(0, Ordering::Release);
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
    /// When the future whose poll this thread is about to begin was woken,
    /// and when that poll began (0: unknown; see [`set_poll_woken`]); taken
    /// by the next publication. Stays because `Span::enter`, whose layer
    /// callback publishes the word, takes no argument to carry them.
    static POLL_WOKEN: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
    /// See [`take_last_published_ns`]. Stays because a span's exit, whose
    /// layer callback read the clock, returns nothing to the poll it ends.
    static LAST_PUBLISHED_NS: Cell<u64> = const { Cell::new(0) };
}

/// The mark an entry's wake time carries (its highest bit, far above any
/// `CLOCK_REALTIME` in ns before the year 2262) when the poll it begins is
/// of a request's own future (`http_layer()`'s), not of work the request
/// handed off (`spawn_in_span`, `spawn_blocking_in_span`): the time such a
/// poll waits for a CPU is the request's own. Readers of the wake time
/// never see it ([`read_changes`] takes it off).
pub(crate) const OWN_POLL: u64 = 1 << 63;

/// Marks, in a published word's wake time, work a request handed to a
/// thread that is not a Tokio worker (`spawn_blocking_in_span`, the thread
/// helpers): such a "poll" blocks no worker, however long it runs, so it
/// never becomes a blocking poll (see `crate::blocking`). Unlike
/// [`OWN_POLL`], [`read_changes`] passes it on for `crate::lanes` to take
/// off.
pub(crate) const OFF_WORKER: u64 = 1 << 62;

/// Says when the instrumented future this thread is about to poll was
/// woken (`CLOCK_REALTIME`, ns; 1: it was not woken, as for its first
/// poll): the next word this thread publishes (the request's, as the poll
/// enters its span) carries it, so the chunk thread knows how long the
/// request waited for a worker before that poll. `start_ns` is when the
/// poll began, if the caller read the clock for it (else 0): the
/// publication is stamped with it instead of reading the clock again. 0
/// takes both back (the span was already entered, and no word was
/// published).
#[inline]
pub(crate) fn set_poll_woken(woken_ns: u64, start_ns: u64) {
    let _ = POLL_WOKEN.try_with(|w| w.set((woken_ns, start_ns)));
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
    CLAIMED_AT[slot as usize].store(crate::sys::realtime_ns(), Ordering::Relaxed);
    CLAIMED_SEQ[slot as usize].store(
        PUBLISHED[slot as usize].changes.load(Ordering::Relaxed),
        Ordering::Relaxed,
    );
    let on_stack = 0u8;
    STACK_HINT[slot as usize].store(
        std::hint::black_box(std::ptr::from_ref(&on_stack)) as usize,
        Ordering::Relaxed,
    );
    OWNERS[slot as usize].store(tid, Ordering::Release);
    SLOTS_USED.fetch_max(slot + 1, Ordering::Release);
    CLAIMS.fetch_add(1, Ordering::Release);
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
    let mut claimed_now = false;
    if slot == UNCLAIMED {
        if crate::sys::in_forked_child() {
            // The table's lock may have been held by a thread that stayed in
            // the parent, and no sampler reads the table here anyway.
            return;
        }
        slot = claim(tid());
        claimed_now = true;
        let _ = MY_SLOT.try_with(|s| s.set(slot));
    }
    if slot != NONE {
        let i = slot as usize;
        // Unchanged (a child span of the request entered or left): nothing
        // to record, and no clock to read.
        let published = &PUBLISHED[i];
        if published.word.load(Ordering::Relaxed) == value {
            return;
        }
        published.word.store(value, Ordering::Relaxed);
        // Only the slot's owner writes it: no read-modify-write needed.
        let n = published.changes.load(Ordering::Relaxed);
        let entry = &HISTORY_TABLE[i].0[n as usize % HISTORY];
        let (woken, start) = POLL_WOKEN.try_with(|w| w.replace((0, 0))).unwrap_or((0, 0));
        // A poll about to begin read the clock already: its start is the
        // moment the thread took up the request. Not on the slot's first
        // publication: the reader skips entries older than the claim.
        let now = if start == 0 || claimed_now {
            crate::sys::realtime_ns()
        } else {
            start
        };
        entry.value.store(value, Ordering::Relaxed);
        entry.since_ns.store(now, Ordering::Relaxed);
        entry.woken_ns.store(woken, Ordering::Relaxed);
        published
            .changes
            .store(n.wrapping_add(1), Ordering::Release);
        let _ = LAST_PUBLISHED_NS.try_with(|c| c.set(now));
    }
}

/// When this thread last published a new word (`CLOCK_REALTIME`, ns; 0:
/// not since the last call), and forgets it: an instrumented future takes
/// the end of its poll from the publication its span's exit made, rather
/// than reading the clock again.
#[inline]
pub(crate) fn take_last_published_ns() -> u64 {
    LAST_PUBLISHED_NS.try_with(|c| c.replace(0)).unwrap_or(0)
}

/// How many slots were claimed so far (see [`CLAIMS`]).
pub(crate) fn claims() -> u64 {
    CLAIMS.load(Ordering::Acquire)
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

/// An address on the stack of thread `tid`, which publishes in `slot`
/// (taken when it claimed the slot); `None` if the slot is not its.
pub(crate) fn stack_hint(slot: u32, tid: i32) -> Option<usize> {
    let i = slot as usize;
    if i >= MAX_SLOTS || OWNERS[i].load(Ordering::Acquire) != tid as u32 {
        return None;
    }
    let hint = STACK_HINT[i].load(Ordering::Relaxed);
    (hint != 0 && OWNERS[i].load(Ordering::Acquire) == tid as u32).then_some(hint)
}

/// The context word last published in `slot`.
#[inline]
pub(crate) fn read(slot: u32) -> u64 {
    PUBLISHED
        .get(slot as usize)
        .map_or(0, |s| s.word.load(Ordering::Relaxed))
}

/// The context word last published in `slot` by thread `tid`; 0 if the
/// slot is no longer that thread's.
#[inline]
pub(crate) fn read_for(slot: u32, tid: i32) -> u64 {
    word_and_changes(slot, tid).map_or(0, |(word, _)| word)
}

/// The context word last published in `slot` by thread `tid`, and how many
/// words the slot has held so far (its count of publications); `None` if
/// the slot is no longer that thread's. The count tells a reader how fast
/// the thread changes its word: the history keeps only the last
/// `HISTORY_KEPT` of them.
#[inline]
pub(crate) fn word_and_changes(slot: u32, tid: i32) -> Option<(u64, u64)> {
    let i = slot as usize;
    if i >= MAX_SLOTS || OWNERS[i].load(Ordering::Acquire) != tid as u32 {
        return None;
    }
    let changes = PUBLISHED[i].changes.load(Ordering::Acquire);
    let word = PUBLISHED[i].word.load(Ordering::Relaxed);
    // Claimed by another thread in between: its word, not `tid`'s.
    if OWNERS[i].load(Ordering::Acquire) != tid as u32 {
        return None;
    }
    Some((word, changes))
}

/// How many of a thread's latest publications its history keeps (see
/// [`word_at`]).
pub(crate) const HISTORY_KEPT: u64 = HISTORY as u64 - 1;

/// The context word thread `tid` (publishing in `slot`) had at `at_ns`
/// (`CLOCK_REALTIME`); `None` when that is older than the history kept, or
/// the slot is not the thread's.
pub(crate) fn word_at(slot: u32, tid: i32, at_ns: u64) -> Option<u64> {
    let i = slot as usize;
    if i >= MAX_SLOTS || OWNERS[i].load(Ordering::Acquire) != tid as u32 {
        return None;
    }
    let claimed_at = CLAIMED_AT[i].load(Ordering::Relaxed);
    if at_ns < claimed_at {
        // Before the thread's first word.
        return Some(0);
    }
    let before = PUBLISHED[i].changes.load(Ordering::Acquire);
    let mut found = None;
    let mut oldest_since = None;
    // Newest first; the entry the next publication writes is left out.
    for back in 1..HISTORY as u64 {
        let Some(n) = before.checked_sub(back) else {
            break;
        };
        let entry = &HISTORY_TABLE[i].0[n as usize % HISTORY];
        let since = entry.since_ns.load(Ordering::Relaxed);
        let value = entry.value.load(Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Acquire);
        let after = PUBLISHED[i].changes.load(Ordering::Relaxed);
        // Publication `n + HISTORY` overwrites this entry; it may have
        // begun once the count reached it.
        if after >= n + HISTORY as u64 {
            return None;
        }
        if since <= at_ns {
            // A previous thread's word: this one had published none yet.
            found = Some(if since < claimed_at { 0 } else { value });
            break;
        }
        oldest_since = Some(n);
    }
    if OWNERS[i].load(Ordering::Acquire) != tid as u32 {
        return None;
    }
    match (found, oldest_since) {
        (Some(v), _) => Some(v),
        // Every publication kept is later, and the first is among them:
        // before it the thread had published nothing (word 0).
        (None, Some(0)) => Some(0),
        (None, None) if before == 0 => Some(0),
        _ => None,
    }
}

/// Whether thread `tid` (publishing in `slot`) last stood in the request
/// of word `word`, at or before `at_ns`, in a poll of that request's own
/// future (the publication carried [`OWN_POLL`]). The latest such
/// publication, not only the one in force at `at_ns`: a wait at the end of
/// a poll is often counted at a tick after the thread left the request,
/// and filed under the request it stood in. False when it was offloaded
/// work, or when that publication is no longer kept (the time then counts
/// as the request's other work, never as its own).
pub(crate) fn own_poll_at(slot: u32, tid: i32, at_ns: u64, word: u64) -> bool {
    let i = slot as usize;
    if i >= MAX_SLOTS || OWNERS[i].load(Ordering::Acquire) != tid as u32 {
        return false;
    }
    let claimed_at = CLAIMED_AT[i].load(Ordering::Relaxed);
    let before = PUBLISHED[i].changes.load(Ordering::Acquire);
    // Newest first, as `word_at` reads, back to the latest publication of
    // `word` at or before `at_ns`.
    for back in 1..HISTORY as u64 {
        let Some(n) = before.checked_sub(back) else {
            return false;
        };
        let entry = &HISTORY_TABLE[i].0[n as usize % HISTORY];
        let since = entry.since_ns.load(Ordering::Relaxed);
        let value = entry.value.load(Ordering::Relaxed);
        let woken = entry.woken_ns.load(Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Acquire);
        if PUBLISHED[i].changes.load(Ordering::Relaxed) >= n + HISTORY as u64 {
            // Overwritten while read.
            return false;
        }
        if since < claimed_at {
            // A previous thread's.
            return false;
        }
        if since <= at_ns && value == word {
            return woken & OWN_POLL != 0 && OWNERS[i].load(Ordering::Acquire) == tid as u32;
        }
    }
    false
}

/// Where [`read_changes`] left off in each slot.
#[derive(Debug, Default)]
pub(crate) struct ChangeCursor {
    slots: Vec<SlotCursor>,
}

impl ChangeCursor {
    /// A cursor that starts now: what threads published before it (in an
    /// earlier profiling session of the process, say) is behind it, neither
    /// read nor counted as lost; each thread's current word is where its
    /// changes start from.
    pub(crate) fn starting_now() -> Self {
        let used = (SLOTS_USED.load(Ordering::Acquire) as usize).min(MAX_SLOTS);
        let slots = (0..used)
            .map(|i| {
                let owner = OWNERS[i].load(Ordering::Acquire);
                SlotCursor {
                    owner,
                    seen: PUBLISHED[i].changes.load(Ordering::Acquire),
                    word: (owner != 0).then(|| PUBLISHED[i].word.load(Ordering::Relaxed)),
                }
            })
            .collect();
        Self { slots }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct SlotCursor {
    /// The thread the slot held when last read (0: none).
    owner: u32,
    /// Publications read so far.
    seen: u64,
    /// The word of the latest publication read; `None` when not known
    /// (entries were overwritten before they were read).
    word: Option<u64>,
}

/// Reports, in each thread's order, every context word published since the
/// previous call with the same cursor, as `report(tid, from, to, at_ns,
/// woken_ns)`: thread `tid` changed its word from `from` (`None`: not
/// known, its publication was lost; a thread's first word is reported from
/// 0) to `to` at `at_ns` (`CLOCK_REALTIME`), beginning a poll of a future
/// woken at `woken_ns` (see [`set_poll_woken`]; 0: not known). Returns how many publications were
/// overwritten before they could be read (a thread changes its word more
/// than `HISTORY` times between two calls). Reads only atomics: never
/// blocks a publishing thread.
pub(crate) fn read_changes(
    cursor: &mut ChangeCursor,
    mut report: impl FnMut(u32, Option<u64>, u64, u64, u64),
) -> u64 {
    let used = (SLOTS_USED.load(Ordering::Acquire) as usize).min(MAX_SLOTS);
    if cursor.slots.len() < used {
        cursor.slots.resize(used, SlotCursor::default());
    }
    let mut lost = 0;
    for (i, c) in cursor.slots.iter_mut().enumerate().take(used) {
        let owner = OWNERS[i].load(Ordering::Acquire);
        if c.owner != 0 && c.owner != owner {
            // The thread read last time has exited (and the slot may hold
            // another one now): what it published before it exited is
            // still read (a runtime's workers exit right after their last
            // polls, often before the next read), up to where it stopped.
            // (If another thread came and went since, its record replaced
            // this one's: that tail is not known.)
            if EXITED_OWNER[i].load(Ordering::Relaxed) == c.owner {
                let exited_at = EXITED_SEQ[i].load(Ordering::Relaxed);
                let claimed_at = CLAIMED_AT_OF_EXITED[i].load(Ordering::Relaxed);
                lost += read_entries(i, c, exited_at, claimed_at, &mut report);
            }
            c.owner = 0;
        }
        if owner == 0 {
            continue;
        }
        let claimed_at = CLAIMED_AT[i].load(Ordering::Relaxed);
        if c.owner != owner {
            // A new thread holds the slot: its words start from 0, and
            // entries older than its claim are the previous thread's.
            *c = SlotCursor {
                owner,
                seen: c.seen.max(CLAIMED_SEQ[i].load(Ordering::Relaxed)),
                word: Some(0),
            };
        }
        let changes = PUBLISHED[i].changes.load(Ordering::Acquire);
        lost += read_entries(i, c, changes, claimed_at, &mut report);
    }
    lost
}

/// Reads slot `i`'s publications from `c.seen` up to `until` as
/// [`read_changes`] reports them (those before `claimed_at` are a previous
/// thread's, and skipped); returns how many were overwritten before they
/// could be read.
fn read_entries(
    i: usize,
    c: &mut SlotCursor,
    until: u64,
    claimed_at: u64,
    report: &mut impl FnMut(u32, Option<u64>, u64, u64, u64),
) -> u64 {
    let mut lost = 0;
    // The entry the next publication writes is left out of the kept ones,
    // as in `word_at`.
    let oldest_kept = PUBLISHED[i]
        .changes
        .load(Ordering::Acquire)
        .saturating_sub(HISTORY as u64 - 1);
    if c.seen < oldest_kept.min(until) {
        lost += oldest_kept.min(until) - c.seen;
        c.seen = oldest_kept.min(until);
        c.word = None;
    }
    for n in c.seen..until {
        let entry = &HISTORY_TABLE[i].0[n as usize % HISTORY];
        let value = entry.value.load(Ordering::Relaxed);
        let since = entry.since_ns.load(Ordering::Relaxed);
        let woken = entry.woken_ns.load(Ordering::Relaxed) & !OWN_POLL;
        std::sync::atomic::fence(Ordering::Acquire);
        if PUBLISHED[i].changes.load(Ordering::Relaxed) >= n + HISTORY as u64 {
            // Overwritten while read.
            lost += 1;
            c.word = None;
            continue;
        }
        if since < claimed_at {
            continue;
        }
        if c.word != Some(value) {
            report(c.owner, c.word, value, since, woken);
        }
        c.word = Some(value);
    }
    c.seen = c.seen.max(until);
    lost
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tests share the process's slot table: a slot one test's thread
    /// gives back can be claimed by another test's thread, whose words then
    /// overwrite the history the first test reads. They run one at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn serial() -> std::sync::MutexGuard<'static, ()> {
        SERIAL
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A thread that publishes words 0, 1, 2, 0, 1, … on request, as `tid`.
    struct Publisher {
        go: std::sync::mpsc::Sender<u32>,
        done: std::sync::mpsc::Receiver<()>,
        thread: std::thread::JoinHandle<()>,
    }

    impl Publisher {
        fn start(tid: u32) -> Self {
            let (go, go_rx) = std::sync::mpsc::channel::<u32>();
            let (done_tx, done) = std::sync::mpsc::channel::<()>();
            let thread = std::thread::spawn(move || {
                for round in go_rx {
                    for value in 0..round {
                        publish(u64::from(value % 3), || tid);
                    }
                    done_tx.send(()).unwrap();
                }
            });
            Self { go, done, thread }
        }

        /// Publishes `n` words and waits until they are.
        fn publish(&self, n: u32) {
            self.go.send(n).unwrap();
            self.done.recv().unwrap();
        }

        fn stop(self) {
            drop(self.go);
            self.thread.join().unwrap();
        }
    }

    #[test]
    fn every_change_is_read_once_in_order() {
        let _serial = serial();
        let tid = 4_200_000u32;
        let publisher = Publisher::start(tid);
        let mut cursor = ChangeCursor::default();
        let mut run = |n: u32| {
            publisher.publish(n);
            let mut mine = Vec::new();
            let lost = read_changes(&mut cursor, |t, from, to, _, _| {
                if t == tid {
                    mine.push((from, to));
                }
            });
            (mine, lost)
        };
        // 0 (no change from the start), 1, 2: two changes.
        let (first, lost) = run(3);
        assert_eq!(first, vec![(Some(0), 1), (Some(1), 2)]);
        assert_eq!(lost, 0);
        // Nothing new, nothing reported.
        let (none, _) = run(0);
        assert!(none.is_empty());
        // 0, 1, 2, 0: the change from 2 to 0 first.
        let (next, _) = run(4);
        assert_eq!(
            next,
            vec![(Some(2), 0), (Some(0), 1), (Some(1), 2), (Some(2), 0)]
        );
        // More than the history between two reads: counted, and the first
        // change read has no known word before it.
        let (late, lost) = run(200);
        assert!(lost >= 200 - HISTORY as u64, "{lost}");
        assert_eq!(late.first().map(|c| c.0), Some(None));
        assert!(late.len() < HISTORY);
        publisher.stop();
    }

    #[test]
    fn a_thread_that_exits_before_the_read_still_has_its_words_read() {
        let _serial = serial();
        let tid = 4_400_000u32;
        let mut cursor = ChangeCursor::default();
        let (go_tx, go) = std::sync::mpsc::channel::<()>();
        let (ready, ready_rx) = std::sync::mpsc::channel::<()>();
        let (start_tx, start_rx) = std::sync::mpsc::channel::<u64>();
        let h = std::thread::spawn(move || {
            // Its first word, of a poll that began before the thread had a
            // slot: still read (not taken for an older thread's).
            set_poll_woken(0, crate::sys::realtime_ns() - 1_000_000);
            publish(7, || tid);
            ready.send(()).unwrap();
            go.recv().unwrap();
            // A poll of a future woken at 123 that began at `start` (the
            // caller read the clock), then back to no request; then the
            // thread exits, before any read.
            let start = crate::sys::realtime_ns();
            set_poll_woken(123, start);
            publish(8, || tid);
            start_tx.send(start).unwrap();
            publish(0, || tid);
        });
        ready_rx.recv().unwrap();
        let mut mine = Vec::new();
        let mut times = Vec::new();
        let mut read = |cursor: &mut ChangeCursor| {
            read_changes(cursor, |t, from, to, at, woken| {
                if t == tid {
                    mine.push((from, to, woken));
                    times.push(at);
                }
            })
        };
        read(&mut cursor);
        go_tx.send(()).unwrap();
        h.join().unwrap();
        assert_eq!(read(&mut cursor), 0);
        assert_eq!(
            mine,
            vec![(Some(0), 7, 0), (Some(7), 8, 123), (Some(8), 0, 0)],
            "the exited thread's last words, with the wake its poll carried"
        );
        let start = start_rx.recv().unwrap();
        assert_eq!(times[1], start, "the poll's word is stamped with its start");
        assert!(
            times[0] <= start && times[2] >= start,
            "the other words read the clock: {times:?}"
        );
    }

    #[test]
    fn a_wait_is_the_requests_own_where_its_thread_last_stood_in_its_own_poll() {
        let _serial = serial();
        let tid = 4_500_000u32;
        let (lane, other) = (
            crate::attribution::LANE_BASE + 41,
            crate::attribution::LANE_BASE + 42,
        );
        let (tx, rx) = std::sync::mpsc::channel::<Vec<u64>>();
        let (done_tx, done) = std::sync::mpsc::channel::<()>();
        let h = std::thread::spawn(move || {
            let mut at = Vec::new();
            // A poll of the request's own future, then its end.
            set_poll_woken(1 | OWN_POLL, 0);
            publish(lane, || tid);
            at.push(crate::sys::realtime_ns());
            publish(0, || tid);
            at.push(crate::sys::realtime_ns());
            // The same request's offloaded work, then another request's.
            set_poll_woken(1, 0);
            publish(lane, || tid);
            at.push(crate::sys::realtime_ns());
            publish(other, || tid);
            at.push(crate::sys::realtime_ns());
            tx.send(at).unwrap();
            // Stays alive (its slot its own) until the checks are done.
            let _ = done.recv();
        });
        let at = rx.recv().unwrap();
        let slot = slots_by_tid()[&tid];
        let own = |i: usize| own_poll_at(slot, tid as i32, at[i], lane);
        // In its own poll, and after it (a wait counted late), it is own;
        // in and after its offloaded work, it is not.
        assert_eq!((own(0), own(1), own(2), own(3)), (true, true, false, false));
        // No such publication before the thread's first: not own.
        assert!(!own_poll_at(slot, tid as i32, at[0] - 1_000_000_000, lane));
        done_tx.send(()).unwrap();
        h.join().unwrap();
    }

    #[test]
    fn a_cursor_starting_now_counts_nothing_before_it_as_lost() {
        let _serial = serial();
        let tid = 4_300_000u32;
        let publisher = Publisher::start(tid);
        // An earlier session's history, far more than is kept.
        publisher.publish(500);
        let mut cursor = ChangeCursor::starting_now();
        let mut mine = Vec::new();
        let lost = read_changes(&mut cursor, |t, from, to, _, _| {
            if t == tid {
                mine.push((from, to));
            }
        });
        assert_eq!(lost, 0, "what came before the cursor is not lost");
        assert!(mine.is_empty());
        // The last word published was 499 % 3 = 1; then 0, 1, 2.
        publisher.publish(3);
        read_changes(&mut cursor, |t, from, to, _, _| {
            if t == tid {
                mine.push((from, to));
            }
        });
        assert_eq!(mine, vec![(Some(1), 0), (Some(0), 1), (Some(1), 2)]);
        publisher.stop();
    }

    #[test]
    fn the_word_at_a_past_moment_comes_from_the_history() {
        let _serial = serial();
        let h = std::thread::spawn(move || {
            let tid = 4_100_000;
            let mut times = Vec::new();
            // The history keeps the last `HISTORY - 1`: words 6 and on.
            let last = HISTORY as u64 + 4;
            for value in 1..=last {
                publish(value, || tid as u32);
                times.push(crate::sys::realtime_ns());
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            let slot = slots_by_tid()[&(tid as u32)];
            assert_eq!(word_at(slot, tid, times[last as usize - 1]), Some(last));
            assert_eq!(word_at(slot, tid, times[30]), Some(31));
            assert_eq!(word_at(slot, tid, times[5]), Some(6));
            // Older than the history kept: not known.
            assert_eq!(word_at(slot, tid, times[4]), None);
            assert_eq!(word_at(slot, tid + 1, times[last as usize - 1]), None);
        });
        h.join().unwrap();
    }

    #[test]
    fn a_thread_publishes_and_gives_its_slot_back() {
        let _serial = serial();
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
        let now = crate::sys::realtime_ns();
        assert_eq!(word_at(slot, 4_000_000, now), Some(42));
        assert_eq!(
            word_at(slot, 4_000_000, 0),
            Some(0),
            "before its first word"
        );
        assert_eq!(word_at(slot, 4_000_001, now), None, "another thread's slot");
        done_tx.send(()).unwrap();
        h.join().unwrap();
        assert!(!slots_by_tid().contains_key(&4_000_000));
        // (Another test's thread may have claimed the slot since.)
        assert_eq!(read_for(slot, 4_000_000), 0, "given back");
    }
}
