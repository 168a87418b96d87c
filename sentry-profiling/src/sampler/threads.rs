//! The sampler's view of the process's threads: discovered from the kernel,
//! refreshed at least once a second, identified by (tid, start time) so a
//! recycled id is never mistaken for the thread that had it before.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::stats::Counters;
use crate::sys::{self, Slot, StackMappings, ThreadInfo};

/// How often the thread list is re-read, to find new and exited threads.
const LIST_EVERY: Duration = Duration::from_millis(100);
/// How often every thread's name and identity are re-read.
const NAMES_EVERY: Duration = Duration::from_secs(1);
/// A thread first seen less than this long ago has its name re-read at
/// every listing: std and Tokio name a thread just after creating it, so
/// the first read may still show the parent's name.
const YOUNG: Duration = Duration::from_secs(1);

/// One thread being sampled.
#[derive(Debug)]
pub(super) struct Tracked {
    pub(super) info: ThreadInfo,
    pub(super) name: Arc<str>,
    pub(super) last_cpu_ns: u64,
    pub(super) last_stack: Option<Arc<[u64]>>,
    /// Where the thread publishes its context word (see `crate::context`).
    pub(super) context_slot: Option<u32>,
    pub(super) stack_bounds: Option<(usize, usize)>,
    /// The slot of the signal in flight, and when it was sent.
    pub(super) outstanding: Option<(&'static Slot, Instant)>,
    /// Slots whose signal was given up on but may still be delivered.
    pub(super) abandoned: Vec<&'static Slot>,
    pub(super) gone: bool,
    retried: bool,
    first_seen: Instant,
}

impl Tracked {
    fn new(info: ThreadInfo) -> Self {
        Self {
            name: Arc::from(info.name.as_str()),
            info,
            last_cpu_ns: 0,
            last_stack: None,
            context_slot: None,
            stack_bounds: None,
            outstanding: None,
            abandoned: Vec::new(),
            gone: false,
            retried: false,
            first_seen: Instant::now(),
        }
    }

    /// Frees the slots of a thread that has exited and whose id `next`
    /// now tracks: a capture it completed is discarded, and a signal still
    /// pending on it died with it. A slot in any other state stays
    /// abandoned, on `next`, until it settles.
    fn salvage_slots(self, next: &mut Tracked, salvaged: &mut Vec<&'static Slot>) {
        let outstanding = self.outstanding.map(|(slot, _)| {
            if !slot.abandon() {
                let _ = slot.take(|_, _| ());
            }
            slot
        });
        for slot in outstanding.into_iter().chain(self.abandoned) {
            slot.reclaim_abandoned();
            match slot.state() {
                sys::SlotState::Free | sys::SlotState::Late => salvaged.push(slot),
                _ => next.abandoned.push(slot),
            }
        }
    }

    /// Forgets everything learned about the thread that had this id.
    pub(super) fn reset_identity(&mut self) {
        if let Some(info) = sys::read_thread_identity(self.info.tid) {
            self.name = Arc::from(info.name.as_str());
            self.info = info;
        }
        self.last_cpu_ns = 0;
        self.last_stack = None;
        self.stack_bounds = None;
        self.retried = false;
    }
}

/// All tracked threads.
#[derive(Debug, Default)]
pub(super) struct ThreadTable {
    entries: Vec<Tracked>,
    by_tid: HashMap<i32, usize>,
    last_list: Option<Instant>,
    last_names: Option<Instant>,
    maps: StackMappings,
    maps_read: Option<Instant>,
}

impl ThreadTable {
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn get_mut(&mut self, idx: usize) -> &mut Tracked {
        &mut self.entries[idx]
    }

    /// Whether the thread list (every 100 ms) and names (every second, and
    /// at every listing for threads seen in the last second) are due.
    pub(super) fn refresh_due(&self) -> bool {
        self.last_list.is_none_or(|t| t.elapsed() >= LIST_EVERY)
    }

    /// Re-reads the thread list (see [`ThreadTable::refresh_due`]).
    /// Slots still held for a thread whose id turned out to be reused go to
    /// `salvaged`: that thread has exited, and a signal pending on it died
    /// with it.
    pub(super) fn refresh(
        &mut self,
        own: &[i32],
        counters: &Counters,
        salvaged: &mut Vec<&'static Slot>,
    ) {
        self.last_list = Some(Instant::now());
        let all_names = self.last_names.is_none_or(|t| t.elapsed() >= NAMES_EVERY);
        if all_names {
            self.last_names = Some(Instant::now());
            for t in &mut self.entries {
                t.retried = false;
            }
        }
        let Ok(tids) = sys::list_threads() else {
            return;
        };
        let slots = crate::context::slots_by_tid();
        let listed: std::collections::HashSet<i32> = tids.iter().copied().collect();
        for t in &mut self.entries {
            if !listed.contains(&t.info.tid) || own.contains(&t.info.tid) {
                t.gone = true;
                continue;
            }
            t.context_slot = slots.get(&(t.info.tid as u32)).copied();
            if !all_names && t.first_seen.elapsed() >= YOUNG {
                continue;
            }
            match sys::read_thread_identity(t.info.tid) {
                None => t.gone = true,
                Some(info) if info.start_time != t.info.start_time => {
                    counters.threads_recycled.add(1);
                    counters.threads_seen.add(1);
                    let old = std::mem::replace(t, Tracked::new(info));
                    old.salvage_slots(t, salvaged);
                }
                Some(info) => {
                    if info.name != t.info.name {
                        t.name = Arc::from(info.name.as_str());
                        t.info.name = info.name;
                    }
                }
            }
        }
        for tid in tids {
            if own.contains(&tid) || self.by_tid.contains_key(&tid) {
                continue;
            }
            if let Some(info) = sys::read_thread_identity(tid) {
                counters.threads_seen.add(1);
                self.by_tid.insert(tid, self.entries.len());
                self.entries.push(Tracked::new(info));
            }
        }
    }

    /// Sets a thread's stack bounds from the mapping that holds `sp`.
    /// Returns true when the bounds changed and the capture should be
    /// discarded: the thread is then signalled again at the next tick.
    pub(super) fn learn_bounds(&mut self, idx: usize, sp: usize) -> bool {
        let mut found = self.maps.find(sp);
        if found.is_none()
            && self
                .maps_read
                .is_none_or(|t| t.elapsed() > Duration::from_millis(5))
        {
            self.maps = sys::stack_mappings();
            self.maps_read = Some(Instant::now());
            found = self.maps.find(sp);
        }
        let t = &mut self.entries[idx];
        match found {
            Some(bounds) if t.stack_bounds != Some(bounds) => {
                t.stack_bounds = Some(bounds);
                if t.retried {
                    return false;
                }
                t.retried = true;
                // The first sample was spent learning the bounds; the next
                // tick takes it again, even if the thread is idle by then.
                t.last_cpu_ns = 0;
                t.last_stack = None;
                true
            }
            _ => false,
        }
    }

    /// Frees abandoned slots once a late handler has acknowledged them.
    pub(super) fn recycle_abandoned(&mut self, free: &mut Vec<&'static Slot>) {
        for t in &mut self.entries {
            t.abandoned.retain(|slot| {
                if slot.state() == sys::SlotState::Late {
                    free.push(slot);
                    false
                } else {
                    true
                }
            });
        }
    }

    /// Drops threads that exited. A signal pending on an exited thread died
    /// with it, so its abandoned slots can be reused.
    pub(super) fn remove_gone(&mut self, free: &mut Vec<&'static Slot>) {
        if !self
            .entries
            .iter()
            .any(|t| t.gone && t.outstanding.is_none())
        {
            return;
        }
        self.entries.retain_mut(|t| {
            if t.gone && t.outstanding.is_none() {
                for slot in t.abandoned.drain(..) {
                    slot.reclaim_abandoned();
                    free.push(slot);
                }
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

    /// Returns every slot to the process-wide pool (at stop).
    pub(super) fn release_all(&mut self) {
        for t in &mut self.entries {
            for slot in t.abandoned.drain(..) {
                Slot::release(slot);
            }
            if let Some((slot, _)) = t.outstanding.take() {
                Slot::release(slot);
            }
        }
    }
}
