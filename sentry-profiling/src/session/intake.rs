//! The session's side of the sampler thread: the [`Consumer`] it owns. It
//! takes the samples as they leave the sampler, reads the threads'
//! context-word changes after each tick (each change a poll of a request
//! beginning or ending; a thread's history of them is short, so they are
//! read every period while the sampler ticks), and hands both to the chunk
//! thread in [`Batch`]es, about every [`BATCH_EVERY`], with the flush and
//! shutdown commands the session received.
//!
//! The sampler thread wakes every period anyway, so this costs no wake-up
//! of its own; the chunk thread wakes once per batch. Nothing here is
//! shared: the cursor and the batch in progress are the sampler thread's,
//! a batch handed on is the chunk thread's.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender, SyncSender, TrySendError};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use super::Session;
use crate::lanes::registry::LANES_HIGH_WATER;
use crate::lanes::{Change, ChangeCursor, now_ns};
use crate::request_times::RequestTimes;
use crate::sampler::{Consumer, Sample};

/// How often the sampler thread hands the chunk thread a batch while it
/// ticks (commands and a pile-up of lanes go at once).
pub(super) const BATCH_EVERY: Duration = Duration::from_millis(100);

/// Batches handed on and not yet taken, at most: past them, the batch in
/// progress grows (up to its bounds) until the chunk thread takes one.
pub(super) const BATCHES_WAITING: usize = 2;

/// Context-word changes one batch holds, at most (past them, counted as
/// polls lost): 650,000 a second in batches 100 ms apart, more than any
/// service changes; a batch waiting for a chunk thread that is behind
/// stops growing there.
const MAX_CHANGES_PER_BATCH: usize = 1 << 16;

/// What an application thread asks of the profiler.
#[derive(Debug)]
pub(super) enum Command {
    /// Send the chunk in progress now.
    Flush(Sender<()>),
    /// Stop for good, sending the last chunk.
    Shutdown(Sender<()>),
}

/// What the sampler thread hands the chunk thread.
#[derive(Debug, Default)]
pub(super) struct Batch {
    /// Samples in the order they left the sampler (each thread's in time
    /// order).
    pub(super) samples: Vec<Sample>,
    /// The threads' context-word changes, each thread's in order.
    pub(super) changes: Vec<Change>,
    /// When the changes were last read (`CLOCK_REALTIME`): the lanes' polls
    /// are known up to there.
    pub(super) read_until_ns: u64,
    pub(super) commands: Vec<Command>,
    /// The sampler thread stopped: nothing follows.
    pub(super) last: bool,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.samples.is_empty() && self.changes.is_empty() && self.commands.is_empty()
    }
}

/// The sampler thread's consumer for a session.
pub(super) struct Intake {
    session: Arc<Session>,
    cursor: ChangeCursor,
    batch: Batch,
    to_chunks: SyncSender<Batch>,
    /// Batches the chunk thread emptied, reused (their buffers stay
    /// allocated).
    spare: Receiver<Batch>,
    commands: Receiver<Command>,
    sent_at: Instant,
    /// Samples one batch holds, at most (`SamplerConfig::queue_capacity`).
    sample_room: usize,
    /// The times of the requests in flight with a lane, by lane (see
    /// [`Consumer::cpu_waited`]): each request hands its own, and one no
    /// longer held by its request is let go at the next batch.
    times: FxHashMap<u64, Arc<RequestTimes>>,
    new_times: Option<Receiver<super::NewTimes>>,
}

impl Intake {
    pub(super) fn new(
        session: Arc<Session>,
        commands: Receiver<Command>,
        to_chunks: SyncSender<Batch>,
        spare: Receiver<Batch>,
        sample_room: usize,
    ) -> Self {
        Self {
            new_times: session.take_request_times(),
            times: FxHashMap::default(),
            session,
            cursor: ChangeCursor::starting_now(),
            batch: Batch::default(),
            to_chunks,
            spare,
            commands,
            sent_at: Instant::now(),
            sample_room,
        }
    }

    /// Reads the threads' changes since the last read into the batch;
    /// returns how many it read.
    fn read_changes(&mut self) -> u64 {
        let read = crate::lanes::read_changes(
            &mut self.cursor,
            &mut self.batch.changes,
            MAX_CHANGES_PER_BATCH,
        );
        self.batch.read_until_ns = now_ns();
        if read.lost > 0 {
            self.session
                .counters
                .lane_polls_lost
                .fetch_add(read.lost, Ordering::Relaxed);
        }
        read.changes
    }

    /// Hands the batch on when it is due (`now`: whatever it holds), or a
    /// command or a pile-up of lanes waits. A chunk thread that has not
    /// taken the batches before leaves this one growing; one that is gone
    /// leaves nothing to hand on to.
    fn hand_on(&mut self, now: bool) {
        self.batch.commands.extend(self.commands.try_iter());
        let due = now
            || !self.batch.commands.is_empty()
            || self.sent_at.elapsed() >= BATCH_EVERY
            || self.session.lanes.in_flight() >= LANES_HIGH_WATER;
        if !due {
            return;
        }
        self.sent_at = Instant::now();
        // Requests that ended (only this table holds their times) are let
        // go: waits shown for them from now on reach no transaction.
        self.times.retain(|_, t| Arc::strong_count(t) > 1);
        if self.batch.is_empty() && !self.batch.last {
            return;
        }
        let batch = std::mem::take(&mut self.batch);
        if batch.last {
            // The sampler thread is ending: wait for the chunk thread (it
            // takes batches until the last one). Gone, it needs nothing.
            let _ = self.to_chunks.send(batch);
        } else if let Err(TrySendError::Full(batch)) = self.to_chunks.try_send(batch) {
            // Taken back, to be handed on at a later tick. (A chunk thread
            // that is gone needs nothing.)
            self.batch = batch;
            return;
        }
        // Go on in a batch the chunk thread emptied, its buffers kept.
        if let Ok(spare) = self.spare.try_recv() {
            self.batch = spare;
        }
    }
}

impl Consumer for Intake {
    fn take(&mut self, sample: Sample) -> bool {
        if self.batch.samples.len() >= self.sample_room {
            return false;
        }
        self.batch.samples.push(sample);
        true
    }

    fn cpu_waited(&mut self, lane: u64, own: bool, ns: u64) {
        // The requests begun since the last tick are read (`ticked`) only
        // when this wait's is not known yet: most waits are of a request
        // already known, and each read of the queue is a channel poll.
        if !self.times.contains_key(&lane)
            && let Some(new) = &self.new_times
        {
            self.times.extend(new.try_iter());
        }
        if let Some(times) = self.times.get(&lane) {
            times.cpu_waited(own, ns);
        }
    }

    fn ticked(&mut self) -> bool {
        if let Some(new) = &self.new_times {
            self.times.extend(new.try_iter());
        }
        let changed = self.read_changes() > 0;
        self.hand_on(false);
        changed
    }

    fn dozing(&mut self) -> bool {
        self.session.lanes.set_asleep(true);
        // A thread that entered a request since the tick's read published
        // its word before it registered the lane, so before it could see
        // the flag down: read again.
        if self.read_changes() > 0 {
            self.session.lanes.set_asleep(false);
            return false;
        }
        true
    }

    fn woke(&mut self) {
        self.session.lanes.set_asleep(false);
    }

    fn paused(&mut self) {
        self.read_changes();
        self.hand_on(true);
    }

    fn stopped(&mut self) {
        self.read_changes();
        self.batch.last = true;
        self.hand_on(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::{channel, sync_channel};

    fn sample(ts: u64) -> Sample {
        Sample::new(ts, 7, "t".into(), Arc::from(&[1u64][..]), 0, false)
    }

    struct Rig {
        intake: Intake,
        commands: std::sync::mpsc::Sender<Command>,
        batches: Receiver<Batch>,
    }

    fn rig(sample_room: usize) -> Rig {
        let (commands, command_rx) = channel();
        let (to_chunks, batches) = sync_channel(BATCHES_WAITING);
        let (_spare_tx, spare) = channel();
        Rig {
            intake: Intake::new(Session::new(), command_rx, to_chunks, spare, sample_room),
            commands,
            batches,
        }
    }

    #[test]
    fn samples_wait_for_the_batch_and_past_its_room_are_refused() {
        let mut r = rig(3);
        assert!(r.intake.take(sample(1)));
        assert!(r.intake.take(sample(2)));
        assert!(r.intake.take(sample(3)));
        assert!(!r.intake.take(sample(4)), "past the room: dropped");
        // Not due yet: nothing handed on at a tick.
        r.intake.ticked();
        assert!(r.batches.try_recv().is_err());
        // Due once `BATCH_EVERY` passed since the last one.
        r.intake.sent_at -= BATCH_EVERY;
        r.intake.ticked();
        let b = r.batches.try_recv().expect("a batch after BATCH_EVERY");
        let ts: Vec<_> = b.samples.iter().map(Sample::timestamp_ns).collect();
        assert_eq!(ts, [1, 2, 3]);
        assert!(!b.last);
        // Room again.
        assert!(r.intake.take(sample(5)));
    }

    #[test]
    fn a_command_goes_at_the_next_tick_with_what_is_held() {
        let mut r = rig(16);
        assert!(r.intake.take(sample(1)));
        let (ack, _ack_rx) = channel();
        r.commands.send(Command::Flush(ack)).unwrap();
        r.intake.ticked();
        let b = r.batches.try_recv().expect("the command does not wait");
        assert_eq!(b.samples.len(), 1);
        assert!(matches!(b.commands[..], [Command::Flush(_)]));
        // While paused, each wake-up hands on whatever came meanwhile.
        assert!(r.intake.take(sample(2)));
        r.intake.paused();
        assert_eq!(r.batches.try_recv().unwrap().samples.len(), 1);
        // An empty batch is not handed on.
        r.intake.paused();
        assert!(r.batches.try_recv().is_err());
    }

    #[test]
    fn a_chunk_thread_behind_leaves_the_batch_growing_and_the_last_one_waits() {
        let mut r = rig(1024);
        for round in 0..BATCHES_WAITING as u64 + 2 {
            assert!(r.intake.take(sample(round)));
            r.intake.paused();
        }
        // Two batches wait; the samples of the other rounds stayed in the
        // batch in progress, in order.
        let first = r.batches.try_recv().unwrap();
        let second = r.batches.try_recv().unwrap();
        assert_eq!((first.samples.len(), second.samples.len()), (1, 1));
        assert!(r.batches.try_recv().is_err());
        r.intake.stopped();
        let last = r.batches.try_recv().expect("the last batch is handed on");
        let ts: Vec<_> = last.samples.iter().map(Sample::timestamp_ns).collect();
        assert_eq!(ts, [2, 3]);
        assert!(last.last);
    }
}
