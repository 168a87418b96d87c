//! The sampler's view of the process's threads: discovered from the kernel,
//! refreshed at least once a second, identified by (tid, start time) so a
//! recycled id is never mistaken for the thread that had it before.

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::balance::Reading;
use super::ledger::Ledger;
use super::state::{Asking, Schedule, Whereabouts};
use super::stats::Counters;
use crate::sys::{self, Slot, StackMappings, ThreadInfo};

/// How often the thread list is re-read, to find new and exited threads.
const LIST_EVERY: Duration = Duration::from_millis(100);
/// How often the thread list is read while the application is idle.
const LIST_EVERY_IDLE: Duration = Duration::from_secs(1);
/// Threads younger than this when first listed are left to the process
/// timer until a later listing (see [`ThreadTable::refresh`]): a listing
/// interval and the kernel's clock tick (the resolution of a thread's
/// start time).
const YOUNG_UNTRACKED: Duration = Duration::from_millis(110);
/// How often every thread's name and identity are re-read. Each read opens
/// a `/proc` file (tens of microseconds of CPU in a VM): once a second, a
/// hundred threads would cost the sampler thread several milliseconds of
/// CPU a second. A thread that exits is found by the listing, and one whose
/// id was reused by its CPU clock going back (see `state::clock`); young
/// threads are re-read at every listing.
const NAMES_EVERY: Duration = Duration::from_secs(10);
/// A thread first seen less than this long ago has its name re-read at
/// every listing: std and Tokio name a thread just after creating it, so
/// the first read may still show the parent's name.
const YOUNG: Duration = Duration::from_secs(1);

/// One thread being sampled: its identity, the kernel resources bound to
/// it, and its state (see `state` and `ledger`).
#[derive(Debug)]
pub(super) struct Tracked {
    pub(super) info: ThreadInfo,
    pub(super) name: Arc<str>,
    /// The thread's CPU clock at the last reading.
    pub(super) cpu_seen_ns: u64,
    /// The stack of the latest capture, and the context word captured with
    /// it.
    pub(super) last_stack: Option<Arc<[u64]>>,
    pub(super) last_context: u64,
    /// Where it stands when it does not run.
    pub(super) place: Whereabouts,
    /// Whether a signal it was sent is awaited.
    pub(super) asking: Asking,
    /// When it is looked at next.
    pub(super) schedule: Schedule,
    /// Its period slots and the samples it holds.
    pub(super) ledger: Ledger,
    /// Where the thread publishes its context word (see `crate::context`).
    pub(super) word_slot: Option<u32>,
    /// How many words it had published at the last tick (see
    /// `crate::context::word_and_changes`).
    pub(super) changes_seen: u64,
    pub(super) stack_bounds: Option<(usize, usize)>,
    /// The capture slots bound to the thread (the second is filled while
    /// the first waits to be read), and its CPU-time timer.
    pub(super) capture_slot: Option<&'static Slot>,
    pub(super) capture_slot2: Option<&'static Slot>,
    pub(super) timer: Option<sys::CpuTimer>,
    /// Whether the timer is armed (the sampler is not paused).
    pub(super) timer_armed: bool,
    /// Its CPU clock, and the tick's time, when it was first seen running
    /// after its latest capture or wait (see `Services::catch_stalled_timer`).
    pub(super) ran_uncaptured_from: Option<(u64, u64)>,
    /// Its stack pointer and program counter when it was last read blocked
    /// in the kernel (see `Services::look_blocked`).
    pub(super) blocked_at: Option<(u64, u64)>,
    /// How many times it had waited in the kernel (voluntary context
    /// switches) when last found overdue (see `Services::catch_stalled_timer`).
    pub(super) waits_when_overdue: Option<u64>,
    pub(super) gone: bool,
    /// Its `/proc/self/task/<tid>/syscall` and `schedstat`, kept open
    /// (see `sys::TaskFile`).
    pub(super) syscall_file: sys::TaskFile,
    pub(super) schedstat_file: sys::TaskFile,
    /// Its `/proc/self/task/<tid>/status`, read only when its timer is
    /// overdue.
    pub(super) status_file: sys::TaskFile,
    /// Its CPU time and run delay (time runnable but waiting for a CPU)
    /// at the last reading of its `schedstat`, ns.
    pub(super) schedstat_seen: Option<(u64, u64)>,
    retried: bool,
    first_seen: Instant,
}

impl Tracked {
    pub(super) fn new(info: ThreadInfo) -> Self {
        Self {
            name: Arc::from(info.name.as_str()),
            info,
            cpu_seen_ns: 0,
            last_stack: None,
            last_context: 0,
            place: Whereabouts::default(),
            asking: Asking::default(),
            schedule: Schedule::default(),
            ledger: Ledger::default(),
            word_slot: None,
            changes_seen: 0,
            stack_bounds: None,
            capture_slot: None,
            capture_slot2: None,
            timer: None,
            timer_armed: false,
            ran_uncaptured_from: None,
            blocked_at: None,
            waits_when_overdue: None,
            gone: false,
            syscall_file: sys::TaskFile::syscall(),
            schedstat_file: sys::TaskFile::schedstat(),
            status_file: sys::TaskFile::status(),
            schedstat_seen: None,
            retried: false,
            first_seen: Instant::now(),
        }
    }

    /// Deletes the thread's timer and unbinds its slot.
    fn release(&mut self) {
        if self.capture_slot.is_some() {
            sys::forget_known(self.info.tid);
        }
        self.timer = None;
        self.timer_armed = false;
        for slot in [self.capture_slot.take(), self.capture_slot2.take()]
            .into_iter()
            .flatten()
        {
            let _ = Slot::release(slot);
        }
    }

    /// Reads its CPU time and run delay: what the kernel counted since the
    /// previous reading goes to its ledger, for its fills to show (see
    /// `Ledger::kernel_counted`).
    pub(super) fn read_schedstat(&mut self, period_ns: u64) {
        // Taken before the read: the counts cover every moment up to it.
        let now = sys::realtime_ns();
        let Some(counts) = self.schedstat_file.read_schedstat(self.info.tid) else {
            return;
        };
        let word = self
            .word_slot
            .map_or(0, |s| crate::context::read_for(s, self.info.tid));
        self.counted(now, counts, word, period_ns);
    }

    /// The kernel counted `(cpu, delay)` of it (its CPU time and run delay,
    /// ns, since it started) up to `now`, its context word then `word`.
    pub(super) fn counted(
        &mut self,
        now: u64,
        (cpu, delay): (u64, u64),
        word: u64,
        period_ns: u64,
    ) {
        let lane_now = if crate::attribution::is_lane(word) {
            word
        } else {
            0
        };
        let reading = Reading {
            at_ns: now,
            // Found waiting at the look before: the time these counts
            // cover began blocked there.
            began_waiting: self.place.known().waiting.is_some(),
            lane_now,
            // The first reading: the samples queued so far ran before it.
            since: self
                .schedstat_seen
                .replace((cpu, delay))
                .map(|(cpu_seen, delay_seen)| {
                    (
                        cpu.saturating_sub(cpu_seen),
                        delay.saturating_sub(delay_seen),
                    )
                }),
        };
        self.ledger.kernel_read(reading, period_ns);
    }

    /// Its timer is not behind: no capture is owed (see
    /// `Services::catch_stalled_timer`).
    pub(super) fn timer_caught_up(&mut self) {
        self.ran_uncaptured_from = None;
    }

    /// Its CPU clock read `cpu_ns`.
    pub(super) fn clock_seen(&mut self, cpu_ns: u64) {
        self.cpu_seen_ns = cpu_ns;
    }

    /// It exited: it is dropped at the end of the tick, and its held
    /// samples leave then.
    pub(super) fn exited(&mut self) {
        self.gone = true;
    }

    /// Forgets everything learned about the thread that had this id; the
    /// new one gets its own timer and slot at the next tick.
    pub(super) fn reset_identity(&mut self) {
        if let Some(info) = sys::read_thread_identity(self.info.tid) {
            self.name = Arc::from(info.name.as_str());
            self.info = info;
        }
        self.release();
        let fresh = Tracked::new(self.info.clone());
        let word_slot = self.word_slot;
        *self = fresh;
        self.word_slot = word_slot;
    }

    /// Gives it the stack bounds `bounds`, learned without a capture (from
    /// an address known to be on its stack), and its armed slots with
    /// them.
    pub(super) fn set_bounds(&mut self, bounds: (usize, usize)) {
        if self.stack_bounds == Some(bounds) {
            return;
        }
        self.stack_bounds = Some(bounds);
        if self.asking.is_asked() {
            // A signal the sampler sent is awaited: the slot must stay
            // armed for it (it gets the bounds when re-armed).
            return;
        }
        for slot in [self.capture_slot, self.capture_slot2]
            .into_iter()
            .flatten()
        {
            slot.set_bounds(bounds.0, bounds.1);
        }
    }

    /// Sets its stack bounds from `found`, the mapping that holds the stack
    /// pointer of a capture taken off its known stack. Returns true when
    /// the bounds changed and the capture should be discarded: the thread
    /// is then signalled again at the next tick.
    pub(super) fn learn_bounds(&mut self, found: Option<(usize, usize)>) -> bool {
        match found {
            Some(bounds) if self.stack_bounds != Some(bounds) => {
                self.stack_bounds = Some(bounds);
                if self.retried {
                    return false;
                }
                self.retried = true;
                // The capture was spent learning the bounds; the next one
                // counts.
                true
            }
            _ => false,
        }
    }
}

/// The process's writable private mappings, where thread stacks are, read
/// from `/proc/self/maps` when an address is in none of them (at most every
/// 5 ms).
#[derive(Debug, Default)]
pub(super) struct StackMaps {
    maps: StackMappings,
    read_at: Option<Instant>,
}

impl StackMaps {
    /// The mapping that holds `sp`.
    pub(super) fn holding(&mut self, sp: usize) -> Option<(usize, usize)> {
        let mut found = self.maps.find(sp);
        if found.is_none()
            && self
                .read_at
                .is_none_or(|t| t.elapsed() > Duration::from_millis(5))
        {
            self.maps = sys::stack_mappings();
            self.read_at = Some(Instant::now());
            found = self.maps.find(sp);
        }
        found
    }
}

/// All tracked threads.
#[derive(Debug, Default)]
pub(super) struct ThreadTable {
    entries: Vec<Tracked>,
    by_tid: HashMap<i32, usize>,
    last_list: Option<Instant>,
    last_names: Option<Instant>,
    /// `crate::context::claims()` when word slots (where threads publish their context words) were last looked up.
    claims_seen: u64,
    /// Where the thread list is read from, and the last list read.
    tasks: sys::TaskList,
    /// Young threads a listing left to the process timer (or found gone
    /// before it could read them), so far.
    young_left: u64,
    /// Whether young threads are left to the process timer (it exists).
    leave_young: bool,
    tids: Vec<i32>,
}

impl ThreadTable {
    /// Every thread, in the order they were found.
    pub(super) fn iter_mut(&mut self) -> std::slice::IterMut<'_, Tracked> {
        self.entries.iter_mut()
    }

    /// How many threads, and young threads left untracked (see
    /// [`ThreadTable::refresh`]), the listings found so far, to tell
    /// whether the process starts threads.
    pub(super) fn found(&self, c: &Counters) -> u64 {
        c.threads_seen.get().wrapping_add(self.young_left)
    }

    /// Leaves threads younger than [`YOUNG_UNTRACKED`] to the process
    /// timer (`true`, when there is one) or tracks them at once.
    pub(super) fn leave_young(&mut self, leave: bool) {
        self.leave_young = leave;
    }

    /// Whether the thread list was read at least once.
    pub(super) fn listed(&self) -> bool {
        self.last_list.is_some()
    }

    /// Whether the thread list (every 100 ms) and names (every second, and
    /// at every listing for threads seen in the last second) are due.
    /// While the application is idle (the sampler dozes), the list is read
    /// every [`LIST_EVERY_IDLE`] instead: a thread started meanwhile is
    /// added at the latest then, or at once when it enters a request (see
    /// `context::stack_hint`).
    pub(super) fn refresh_due(&self, idle: bool) -> bool {
        let every = if idle { LIST_EVERY_IDLE } else { LIST_EVERY };
        self.last_list.is_none_or(|t| t.elapsed() >= every)
    }

    /// Re-reads the thread list (see [`ThreadTable::refresh_due`]). A
    /// thread whose id a new one took is handed to `leaving` before it is
    /// replaced (its held samples leave with what is known of it).
    pub(super) fn refresh(
        &mut self,
        own: &[i32],
        counters: &Counters,
        mut leaving: impl FnMut(&mut Tracked),
    ) {
        let first = self.last_list.is_none();
        self.last_list = Some(Instant::now());
        let all_names = self.last_names.is_none_or(|t| t.elapsed() >= NAMES_EVERY);
        if all_names {
            self.last_names = Some(Instant::now());
            for t in &mut self.entries {
                t.retried = false;
            }
        }
        let mut tids = std::mem::take(&mut self.tids);
        if self.tasks.read(&mut tids).is_err() {
            self.tids = tids;
            return;
        }
        let slots = crate::context::slots_by_tid();
        let listed: rustc_hash::FxHashSet<i32> = tids.iter().copied().collect();
        for t in &mut self.entries {
            if !listed.contains(&t.info.tid) || own.contains(&t.info.tid) {
                t.gone = true;
                continue;
            }
            t.word_slot = slots.get(&(t.info.tid as u32)).copied();
            if !all_names && t.first_seen.elapsed() >= YOUNG {
                continue;
            }
            match sys::read_thread_identity(t.info.tid) {
                None => t.gone = true,
                Some(info) if info.start_time != t.info.start_time => {
                    counters.threads_recycled.add(1);
                    counters.threads_seen.add(1);
                    let mut old = std::mem::replace(t, Tracked::new(info));
                    leaving(&mut old);
                    old.release();
                }
                Some(info) => {
                    if info.name != t.info.name {
                        t.name = Arc::from(info.name.as_str());
                        t.info.name = info.name;
                    }
                }
            }
        }
        for &tid in &tids {
            if own.contains(&tid) || self.by_tid.contains_key(&tid) {
                continue;
            }
            let Some(info) = sys::read_thread_identity(tid) else {
                // Listed, and gone before its identity was read: a thread
                // that came and went.
                self.young_left = self.young_left.wrapping_add(1);
                continue;
            };
            {
                // A thread started since about the last listing may end
                // before the next tick: the process timer samples it until
                // the next listing (see `short_lived`), where it counts
                // among the threads that came and went, and those that
                // still live are tracked then. A thread tracked for a few
                // milliseconds would show them less well: its timer's
                // captures and its fills leave at the ticks, and its last
                // one closes at the tick that finds it gone. A thread in a
                // request is added as it enters it (see
                // `refresh_word_slots`).
                if self.leave_young
                    && !first
                    && !slots.contains_key(&(tid as u32))
                    && sys::thread_age(&info).is_some_and(|age| age < YOUNG_UNTRACKED)
                {
                    self.young_left = self.young_left.wrapping_add(1);
                    continue;
                }
                counters.threads_seen.add(1);
                self.by_tid.insert(tid, self.entries.len());
                let mut t = Tracked::new(info);
                t.word_slot = slots.get(&(tid as u32)).copied();
                self.entries.push(t);
            }
        }
        self.tids = tids;
    }

    /// Looks up the threads' word slots again if a thread claimed one
    /// since the last look. A thread that claimed one is entering its first
    /// profiled request: if the table does not know it yet (it was created
    /// since the last listing), it is added now rather than at the next
    /// listing, and every thread that publishes a context word gets its
    /// stack bounds from the address it left with its slot, so its first
    /// timer capture already holds its stack.
    pub(super) fn refresh_word_slots(&mut self, counters: &Counters, maps: &mut StackMaps) {
        let claims = crate::context::claims();
        if claims == self.claims_seen {
            return;
        }
        self.claims_seen = claims;
        let own = super::own_threads();
        let slots = crate::context::slots_by_tid();
        for t in &mut self.entries {
            t.word_slot = slots.get(&(t.info.tid as u32)).copied();
        }
        for (&tid, &slot) in &slots {
            let tid = tid as i32;
            if own.contains(&tid) || self.by_tid.contains_key(&tid) {
                continue;
            }
            if let Some(info) = sys::read_thread_identity(tid) {
                counters.threads_seen.add(1);
                counters.threads_added_early.add(1);
                self.by_tid.insert(tid, self.entries.len());
                let mut t = Tracked::new(info);
                t.word_slot = Some(slot);
                self.entries.push(t);
            }
        }
        for t in &mut self.entries {
            if t.stack_bounds.is_some() {
                continue;
            }
            let Some(hint) = t
                .word_slot
                .and_then(|slot| crate::context::stack_hint(slot, t.info.tid))
            else {
                continue;
            };
            if let Some(bounds) = maps.holding(hint) {
                t.set_bounds(bounds);
            }
        }
    }

    /// Drops threads that exited, with their timers and slots; each is
    /// handed to `leaving` first (its held samples leave with what is known
    /// of it), as in [`ThreadTable::refresh`].
    pub(super) fn remove_gone(&mut self, mut leaving: impl FnMut(&mut Tracked)) {
        if !self.entries.iter().any(|t| t.gone) {
            return;
        }
        self.entries.retain_mut(|t| {
            if t.gone {
                leaving(t);
                t.release();
                false
            } else {
                true
            }
        });
        self.by_tid = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, t)| (t.info.tid, i))
            .collect();
    }

    /// Deletes every timer and unbinds every slot (at stop).
    pub(super) fn release_all(&mut self) {
        for t in &mut self.entries {
            t.release();
        }
    }
}
