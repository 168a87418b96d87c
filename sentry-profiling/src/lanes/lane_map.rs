//! The lane table's storage: lanes by id, in a ring indexed by the id.
//!
//! Lane ids are handed out in sequence (see [`super::next_lane`]), so the
//! lanes the chunk thread holds are mostly a run of consecutive ids: the
//! requests of the last chunk or two. A ring indexed by `id - base` finds a
//! lane without hashing, and a new request's lane lands next to the one
//! before it, in memory the reader touched last (a hash table spreads
//! requests over its whole table, and at thousands of requests a second
//! every lane event missed the cache). Ids with no lane (root spans that
//! were not sampled, or that were refused) leave empty places, eight bytes
//! each. A lane left behind at the ring's start while the ids run on (a
//! request open far longer than those after it), and any lane whose id
//! falls before the ring, is kept in a hash table instead, so the ring
//! stays at most about twice as long as the lanes it holds.

use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;

/// Empty places the ring may hold beyond twice its lanes before its oldest
/// lanes move to the hash table.
const SPARE: usize = 1024;

/// `T` is the lane table's lane; the map only stores it.
#[derive(Debug)]
pub(super) struct LaneMap<T> {
    /// The id of the ring's first place.
    base: u64,
    ring: VecDeque<Option<Box<T>>>,
    /// Lanes in the ring.
    in_ring: usize,
    /// Lanes outside it.
    far: HashMap<u64, T>,
}

impl<T> Default for LaneMap<T> {
    fn default() -> Self {
        Self {
            base: 0,
            ring: VecDeque::new(),
            in_ring: 0,
            far: HashMap::default(),
        }
    }
}

impl<T> LaneMap<T> {
    pub(super) fn len(&self) -> usize {
        self.in_ring + self.far.len()
    }

    /// The ring's place of `id`, if it has one.
    fn place(&self, id: u64) -> Option<usize> {
        let i = usize::try_from(id.checked_sub(self.base)?).ok()?;
        (i < self.ring.len()).then_some(i)
    }

    pub(super) fn get(&self, id: &u64) -> Option<&T> {
        match self.place(*id) {
            Some(i) => self.ring[i].as_deref(),
            None => self.far.get(id),
        }
    }

    pub(super) fn get_mut(&mut self, id: &u64) -> Option<&mut T> {
        match self.place(*id) {
            Some(i) => self.ring[i].as_deref_mut(),
            None => self.far.get_mut(id),
        }
    }

    pub(super) fn contains_key(&self, id: &u64) -> bool {
        self.get(id).is_some()
    }

    /// Adds (or replaces) the lane of `id`.
    pub(super) fn insert(&mut self, id: u64, lane: T) {
        if let Some(i) = self.place(id) {
            let slot = &mut self.ring[i];
            self.in_ring += usize::from(slot.is_none());
            *slot = Some(Box::new(lane));
            return;
        }
        if id < self.base {
            // The ring's start only moves on: its place was given up.
            self.far.insert(id, lane);
            return;
        }
        // Past the ring's end. Before it grows to reach `id`, its oldest
        // places go while the span up to `id` would hold more than `SPARE`
        // empty places beyond twice its lanes: their lanes move to `far`.
        while !self.ring.is_empty() {
            let span = usize::try_from(id - self.base).map_or(usize::MAX, |d| d.saturating_add(1));
            if span <= 2 * (self.in_ring + 1) + SPARE {
                break;
            }
            if let Some(Some(lane)) = self.ring.pop_front() {
                self.in_ring -= 1;
                self.far.insert(self.base, *lane);
            }
            self.base += 1;
        }
        if self.ring.is_empty() {
            self.base = id;
        }
        let i = (id - self.base) as usize;
        self.ring.resize_with(i, || None);
        self.ring.push_back(Some(Box::new(lane)));
        self.in_ring += 1;
    }

    /// Removes the lane of `id`, returning it.
    pub(super) fn remove(&mut self, id: u64) -> Option<T> {
        let Some(i) = self.place(id) else {
            return self.far.remove(&id);
        };
        let lane = self.ring[i].take()?;
        self.in_ring -= 1;
        // Only the start: the empty places at the end are where the next
        // lanes go. Dropping them too cost a request the whole gap back to
        // the lane before it whenever that one is kept (a linked request
        // waits for its chunk; a short one after it is forgotten at once),
        // as the next insert put the same places back: thousands of
        // instructions a request on the chunk thread once every other
        // request was linked.
        self.trim_front();
        Some(*lane)
    }

    /// Drops the empty places at the ring's start.
    fn trim_front(&mut self) {
        while self.ring.front().is_some_and(Option::is_none) {
            self.ring.pop_front();
            self.base += 1;
        }
    }

    /// Drops the empty places at both ends of the ring.
    fn trim(&mut self) {
        self.trim_front();
        while self.ring.back().is_some_and(Option::is_none) {
            self.ring.pop_back();
        }
    }

    /// Every lane with its id (the ring's in id order, then the others).
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, &T)> {
        let base = self.base;
        self.ring
            .iter()
            .enumerate()
            .filter_map(move |(i, l)| Some((base + i as u64, l.as_deref()?)))
            .chain(self.far.iter().map(|(&id, l)| (id, l)))
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &T> {
        self.iter().map(|(_, l)| l)
    }

    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.ring
            .iter_mut()
            .filter_map(|l| l.as_deref_mut())
            .chain(self.far.values_mut())
    }

    /// Keeps the lanes for which `keep` is true.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(u64, &mut T) -> bool) {
        for (i, slot) in self.ring.iter_mut().enumerate() {
            if let Some(lane) = slot
                && !keep(self.base + i as u64, lane)
            {
                *slot = None;
                self.in_ring -= 1;
            }
        }
        self.far.retain(|&id, lane| keep(id, lane));
        self.trim();
    }
}

impl<T> std::ops::Index<&u64> for LaneMap<T> {
    type Output = T;

    fn index(&self, id: &u64) -> &T {
        self.get(id).expect("no lane of that id")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    /// What the map is tried with: the fields of a lane the tests look at.
    #[derive(Debug, Default)]
    struct Lane {
        start_ns: u64,
        end_ns: Option<u64>,
        polls_known: bool,
    }

    fn lane(start_ns: u64) -> Lane {
        Lane {
            start_ns,
            ..Lane::default()
        }
    }

    fn ids(map: &LaneMap<Lane>) -> Vec<u64> {
        let mut ids: Vec<u64> = map.iter().map(|(id, _)| id).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn a_removed_lane_leaves_the_others_in_place() {
        let mut map = LaneMap::<Lane>::default();
        for id in 100..110 {
            map.insert(id, lane(id));
        }
        map.insert(5, lane(5));
        assert_eq!(map.remove(100).map(|l| l.start_ns), Some(100));
        assert_eq!(map.remove(105).map(|l| l.start_ns), Some(105));
        assert_eq!(map.remove(5).map(|l| l.start_ns), Some(5));
        assert!(map.remove(105).is_none() && map.remove(200).is_none());
        assert_eq!(ids(&map), [101, 102, 103, 104, 106, 107, 108, 109]);
        assert_eq!(map.len(), 8);
        for id in [101, 102, 103, 104, 106, 107, 108, 109] {
            assert_eq!(map.remove(id).map(|l| l.start_ns), Some(id));
        }
        assert_eq!((map.len(), map.ring.len()), (0, 0), "the ring is trimmed");
        map.insert(300, lane(300));
        assert_eq!(ids(&map), [300]);
    }

    #[test]
    fn forgetting_the_newest_lane_keeps_the_places_before_it() {
        // A kept lane (linked, waiting for its chunk), then short ones
        // forgotten as they end: the ring keeps its places, so a lane costs
        // the same however far back the kept one is.
        let mut map = LaneMap::<Lane>::default();
        map.insert(10, lane(10));
        for id in 11..500 {
            map.insert(id, lane(id));
            assert!(map.remove(id).is_some());
            assert_eq!(
                map.ring.len(),
                (id - 10 + 1) as usize,
                "no place given back at the end"
            );
        }
        assert_eq!(ids(&map), [10]);
        map.insert(20, lane(20));
        assert_eq!(map.ring.len(), 490, "an empty place is reused");
        map.retain(|id, _| id == 20);
        assert_eq!(
            (map.base, map.ring.len()),
            (20, 1),
            "retain trims both ends"
        );
    }

    #[test]
    fn lanes_are_found_by_id_in_and_out_of_order() {
        let mut map = LaneMap::<Lane>::default();
        for id in [100, 101, 103, 102, 99, 150] {
            map.insert(id, lane(id * 10));
        }
        assert_eq!(map.len(), 6);
        assert_eq!(ids(&map), vec![99, 100, 101, 102, 103, 150]);
        for id in [99, 100, 101, 102, 103, 150] {
            assert_eq!(map.get(&id).map(|l| l.start_ns), Some(id * 10));
        }
        assert!(!map.contains_key(&104));
        assert!(map.get(&98).is_none());
        map.get_mut(&102).unwrap().end_ns = Some(5);
        assert_eq!(map[&102].end_ns, Some(5));
        // Replacing a lane keeps the count.
        map.insert(101, lane(7));
        assert_eq!((map.len(), map[&101].start_ns), (6, 7));
    }

    #[test]
    fn retain_forgets_lanes_and_the_ring_moves_on() {
        let mut map = LaneMap::<Lane>::default();
        for id in 1_000..1_100 {
            map.insert(id, lane(id));
        }
        map.retain(|id, _| id >= 1_050 || id == 1_010);
        assert_eq!(map.len(), 51);
        assert!(map.contains_key(&1_010) && map.contains_key(&1_099));
        assert!(!map.contains_key(&1_011) && !map.contains_key(&1_000));
        for l in map.values_mut() {
            l.polls_known = true;
        }
        assert!(map.values().all(|l| l.polls_known));
        map.retain(|_, _| false);
        assert_eq!(map.len(), 0);
        assert_eq!(map.iter().count(), 0);
        map.insert(5_000, lane(1));
        assert_eq!(ids(&map), vec![5_000]);
    }

    #[test]
    fn a_lane_left_open_while_ids_run_on_does_not_stretch_the_ring() {
        let mut map = LaneMap::<Lane>::default();
        // One request stays open while 100,000 others come and go, the
        // finished ones forgotten every 4,096.
        map.insert(1, lane(0));
        for id in 2..100_002u64 {
            map.insert(id, lane(id));
            if id % 4_096 == 0 {
                map.retain(|id, _| id == 1 || id + 100 > 100_002);
            }
        }
        assert!(map.contains_key(&1), "the open lane is kept");
        assert!(
            map.ring.len() <= 2 * map.in_ring + SPARE + 2,
            "{}",
            map.ring.len()
        );
        // Ids far apart (most root spans unsampled): still found, the ring
        // bounded.
        let mut sparse = LaneMap::<Lane>::default();
        for k in 0..10_000u64 {
            sparse.insert(k * 1_000, lane(k));
        }
        assert_eq!(sparse.len(), 10_000);
        assert!(sparse.ring.len() <= 2 * sparse.in_ring + SPARE + 2);
        assert_eq!(
            sparse.get(&(1_234 * 1_000)).map(|l| l.start_ns),
            Some(1_234)
        );
    }
}
