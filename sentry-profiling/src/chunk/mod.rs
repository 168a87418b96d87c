//! Collecting samples into a chunk: stacks are interned as they arrive, so a
//! chunk holds each distinct stack once however many samples repeat it.
//!
//! A chunk covers at most [`crate::options::MAX_CHUNK_DURATION`] of sample
//! time; the chunk thread closes it then, on stop, flush and shutdown.

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;
use std::time::Duration;

#[cfg(test)]
use crate::options::MAX_CHUNK_DURATION;
use crate::sampler::Sample;

pub(crate) mod measurements;
use measurements::Measurement;
pub(crate) use measurements::ProcessMeter;

/// One sample as a chunk stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkSample {
    /// Capture time, nanoseconds since the Unix epoch.
    pub timestamp_ns: u64,
    /// Kernel thread id.
    pub thread_id: u32,
    /// Index into [`Chunk::stacks`].
    pub stack: u32,
    /// The thread's context word at capture.
    pub context: u64,
    /// Whether the sample is a capture of running code (a timer's or a
    /// signal's), as opposed to a fill, a stand-in or a sample the chunk
    /// added (a lane's fill-in or poll edge): the samples that stand for a
    /// period of CPU time each, from which a request's uncaptured running
    /// time is estimated (see `crate::lanes::estimate`).
    pub captured: bool,
}

/// Samples of one period with their interned stacks and thread names.
#[derive(Debug, Default, Clone)]
pub struct Chunk {
    samples: Vec<ChunkSample>,
    stacks: Vec<Arc<[u64]>>,
    stack_index: HashMap<Arc<[u64]>, u32>,
    thread_names: HashMap<u32, Arc<str>>,
    /// Each thread id's thread, by start time: a chunk must not hold two
    /// threads that had the same id (see [`Chunk::holds_other_thread`]).
    thread_starts: HashMap<u32, u64>,
    first_ns: Option<u64>,
    /// Process measurements taken while the chunk collected samples.
    measurements: Vec<Measurement>,
}

impl Chunk {
    /// An empty chunk.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a sample.
    pub fn push(&mut self, sample: &Sample) {
        let stack = self.intern(sample.frames());
        if self.thread_names.get(&sample.thread_id()) != Some(sample.thread_name()) {
            self.thread_names
                .insert(sample.thread_id(), sample.thread_name().clone());
        }
        self.thread_starts
            .insert(sample.thread_id(), sample.thread_start());
        let ts = sample.timestamp_ns();
        self.first_ns = Some(self.first_ns.map_or(ts, |f| f.min(ts)));
        self.samples.push(ChunkSample {
            timestamp_ns: ts,
            thread_id: sample.thread_id(),
            stack,
            context: sample.context(),
            captured: !sample.is_repeated(),
        });
    }

    /// Whether the chunk has samples of another thread that had `sample`'s
    /// thread id (the id was recycled). The format names each thread id once
    /// per chunk, so such a sample must start a new chunk, or one thread's
    /// samples would carry the other's name.
    pub(crate) fn holds_other_thread(&self, sample: &Sample) -> bool {
        self.thread_starts
            .get(&sample.thread_id())
            .is_some_and(|&start| start != sample.thread_start())
    }

    /// Adds a sample that no thread took: a lane's fill-in at a tick when it
    /// was suspended (see [`crate::lanes`]). Its thread id is 0.
    pub(crate) fn push_synthetic(&mut self, timestamp_ns: u64, context: u64, frames: &Arc<[u64]>) {
        let stack = self.intern(frames);
        self.samples.push(ChunkSample {
            timestamp_ns,
            thread_id: 0,
            stack,
            context,
            captured: false,
        });
    }

    /// Adds a sample of thread `thread_id` (already in the chunk) with a
    /// stack the chunk already holds: a request's poll that began before
    /// its first sample is recorded from its start with that sample's stack
    /// (see `crate::lanes::Lanes::add_poll_edges`).
    pub(crate) fn push_copy(
        &mut self,
        timestamp_ns: u64,
        thread_id: u32,
        stack: u32,
        context: u64,
    ) {
        self.samples.push(ChunkSample {
            timestamp_ns,
            thread_id,
            stack,
            context,
            captured: false,
        });
    }

    /// The index of `frames` among the chunk's stacks, added if new.
    pub(crate) fn stack_id(&mut self, frames: &Arc<[u64]>) -> u32 {
        self.intern(frames)
    }

    /// The index of `frames` among the chunk's stacks, if it holds them.
    pub(crate) fn find_stack(&self, frames: &[u64]) -> Option<u32> {
        self.stack_index.get(frames).copied()
    }

    /// Shows sample `i` (an index into [`Chunk::samples`]) with another of
    /// the chunk's stacks (an estimate, see `crate::lanes::estimate`).
    pub(crate) fn restack(&mut self, i: usize, stack: u32) {
        debug_assert!((stack as usize) < self.stacks.len());
        if let Some(s) = self.samples.get_mut(i) {
            s.stack = stack;
        }
    }

    fn intern(&mut self, frames: &Arc<[u64]>) -> u32 {
        match self.stack_index.get(frames) {
            Some(&i) => i,
            None => {
                let i = self.stacks.len() as u32;
                self.stacks.push(frames.clone());
                self.stack_index.insert(frames.clone(), i);
                i
            }
        }
    }

    /// Whether `sample` can join this chunk without stretching it past
    /// `max` (or back in time by more than that, after a clock step).
    pub fn accepts(&self, timestamp_ns: u64, max: Duration) -> bool {
        let max = max.as_nanos() as u64;
        self.first_ns.is_none_or(|first| {
            timestamp_ns.saturating_sub(first) < max && first.saturating_sub(timestamp_ns) < max
        })
    }

    /// Timestamp of the earliest sample.
    pub fn first_timestamp_ns(&self) -> Option<u64> {
        self.first_ns
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether the chunk has no sample.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The samples, in arrival order.
    pub fn samples(&self) -> &[ChunkSample] {
        &self.samples
    }

    /// The interned stacks (leaf-first code addresses).
    pub fn stacks(&self) -> &[Arc<[u64]>] {
        &self.stacks
    }

    /// The name of a thread seen in this chunk.
    pub fn thread_name(&self, thread_id: u32) -> Option<&Arc<str>> {
        self.thread_names.get(&thread_id)
    }

    /// A copy of the samples with timestamps in `[start_ns, end_ns]`.
    pub(crate) fn window(&self, start_ns: u64, end_ns: u64) -> Chunk {
        self.filtered(|s| s.timestamp_ns >= start_ns && s.timestamp_ns <= end_ns)
    }

    /// Drops samples older than `ns` (and the stacks only they used).
    pub(crate) fn retain_since(&mut self, ns: u64) {
        if self.first_ns.is_some_and(|f| f < ns) {
            *self = self.filtered(|s| s.timestamp_ns >= ns);
        }
    }

    fn filtered(&self, keep: impl Fn(&ChunkSample) -> bool) -> Chunk {
        let mut out = Chunk::new();
        for s in self.samples.iter().filter(|s| keep(s)) {
            let stack = out.intern(&self.stacks[s.stack as usize]);
            if let Some(name) = self.thread_names.get(&s.thread_id) {
                out.thread_names
                    .entry(s.thread_id)
                    .or_insert_with(|| name.clone());
            }
            if let Some(&start) = self.thread_starts.get(&s.thread_id) {
                out.thread_starts.entry(s.thread_id).or_insert(start);
            }
            out.first_ns = Some(
                out.first_ns
                    .map_or(s.timestamp_ns, |f| f.min(s.timestamp_ns)),
            );
            out.samples.push(ChunkSample { stack, ..*s });
        }
        out
    }

    /// The process measurements taken during the chunk, in time order.
    pub(crate) fn measurements(&self) -> &[Measurement] {
        &self.measurements
    }

    /// Timestamp of the newest sample.
    pub(crate) fn last_timestamp_ns(&self) -> Option<u64> {
        self.samples.iter().map(|s| s.timestamp_ns).max()
    }

    /// Takes the chunk's content, leaving it empty.
    pub fn take(&mut self) -> Chunk {
        std::mem::take(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ts: u64, tid: i32, frames: &[u64]) -> Sample {
        Sample::new(ts, tid, Arc::from("t"), Arc::from(frames), 0, false)
    }

    #[test]
    fn interns_stacks_and_bounds_duration() {
        let mut c = Chunk::new();
        c.push(&sample(1_000, 1, &[1, 2, 3]));
        c.push(&sample(2_000, 1, &[1, 2, 3]));
        c.push(&sample(3_000, 2, &[4, 3]));
        assert_eq!(c.stacks().len(), 2);
        assert_eq!(c.samples()[1].stack, 0);
        assert!(c.accepts(1_000 + 59_000_000_000, MAX_CHUNK_DURATION));
        assert!(!c.accepts(1_000 + 60_000_000_000, MAX_CHUNK_DURATION));
    }

    #[test]
    fn a_recycled_thread_id_is_another_thread() {
        let named = |ts, name: &str, start| {
            Sample::new(ts, 7, Arc::from(name), Arc::from(&[1u64][..]), 0, false)
                .with_thread_start(start)
        };
        let mut c = Chunk::new();
        c.push(&named(1_000, "parent", 100));
        // The same thread, renamed: still the same thread.
        assert!(!c.holds_other_thread(&named(2_000, "worker-1", 100)));
        c.push(&named(2_000, "worker-1", 100));
        assert_eq!(c.thread_name(7).map(|n| &**n), Some("worker-1"));
        // The id, handed to a thread started later.
        assert!(c.holds_other_thread(&named(3_000, "worker-2", 250)));
        assert!(
            !c.window(0, 10_000)
                .holds_other_thread(&named(4_000, "worker-1", 100))
        );
        assert!(
            c.window(0, 10_000)
                .holds_other_thread(&named(4_000, "worker-2", 250))
        );
    }
}
