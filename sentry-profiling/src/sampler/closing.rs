//! Closing the samples of threads that exit: what stands between the
//! sampler's threads and its [`Consumer`].
//!
//! Sentry weights a sample by the time to the next sample of its thread, so
//! a thread's last sample counts for nothing unless something follows it,
//! and Relay drops every sample of a thread that has a single one. A thread
//! the sampler tracked and that exited therefore gets:
//!
//! - a closing sample with an empty stack (Sentry counts no time for an
//!   empty stack) at its last known-alive moment, at most a period after
//!   its last sample, which that sample's period ends at;
//! - if it had a single sample in all, that sample is handed back instead
//!   (see [`Closing::left`]), to be filed on the shared timeline of the
//!   short-lived threads of its name (see `short_lived`), where it keeps
//!   the period it stands for.
//!
//! So a thread's first sample is held until its second arrives (a period
//! later, as every tracked thread has a sample in every period slot), or
//! until it exits or the sampler pauses.

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

use super::Sample;
use super::consumer::Consumer;
use crate::attribution::SHORT_LIVED_BASE;

/// What is known of one tracked thread's samples so far.
#[derive(Debug)]
struct Seen {
    /// Its first sample, while it is its only one.
    held: Option<Sample>,
    /// Samples it had.
    count: u64,
    /// The latest one's time.
    last_ns: u64,
    name: Arc<str>,
}

/// The sampler's consumer, with the threads' samples closed (see the
/// module docs).
pub(crate) struct Closing {
    inner: Box<dyn Consumer>,
    /// By thread id and start time.
    threads: HashMap<(u32, u64), Seen>,
    period_ns: u64,
    empty: Arc<[u64]>,
}

impl Closing {
    pub(super) fn new(inner: Box<dyn Consumer>, period_ns: u64) -> Self {
        Self {
            inner,
            threads: HashMap::default(),
            period_ns,
            empty: Arc::from(Vec::new()),
        }
    }

    /// Thread `tid`, started at `start`, exited, last known alive at
    /// `alive_ns` (every one of its samples was taken). Returns its sample
    /// if it had only one: the caller files it where it is not alone.
    pub(super) fn left(&mut self, tid: i32, start: u64, alive_ns: u64) -> Option<Sample> {
        let seen = self.threads.remove(&(tid as u32, start))?;
        if seen.held.is_some() {
            return seen.held;
        }
        let at = alive_ns.clamp(seen.last_ns, seen.last_ns.saturating_add(self.period_ns));
        if at > seen.last_ns {
            let close = Sample::new(at, tid, seen.name, self.empty.clone(), 0, true)
                .with_thread_start(start);
            self.inner.take(close);
        }
        None
    }

    /// Lets every held sample go as it is (the sampler pauses or stops:
    /// the threads' next samples may be far off), and forgets the threads.
    fn release_held(&mut self) {
        for (_, seen) in self.threads.drain() {
            if let Some(held) = seen.held {
                self.inner.take(held);
            }
        }
    }
}

impl Consumer for Closing {
    fn take(&mut self, sample: Sample) -> bool {
        if sample.thread_id() >= SHORT_LIVED_BASE {
            return self.inner.take(sample);
        }
        let key = (sample.thread_id(), sample.thread_start());
        let seen = self.threads.entry(key).or_insert_with(|| Seen {
            held: None,
            count: 0,
            last_ns: 0,
            name: sample.thread_name().clone(),
        });
        seen.count += 1;
        seen.last_ns = seen.last_ns.max(sample.timestamp_ns());
        if seen.count == 1 {
            seen.held = Some(sample);
            return true;
        }
        if let Some(held) = seen.held.take() {
            // Its fate was reported when it was held; a full queue drops
            // it now, uncounted, with the sample after it counted.
            self.inner.take(held);
        }
        self.inner.take(sample)
    }

    fn cpu_waited(&mut self, lane: u64, own: bool, ns: u64) {
        self.inner.cpu_waited(lane, own, ns);
    }

    fn ticked(&mut self) -> bool {
        self.inner.ticked()
    }

    fn dozing(&mut self) -> bool {
        self.inner.dozing()
    }

    fn woke(&mut self) {
        self.inner.woke();
    }

    fn paused(&mut self) {
        self.release_held();
        self.inner.paused();
    }

    fn stopped(&mut self) {
        self.release_held();
        self.inner.stopped();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::{Receiver, sync_channel};

    fn sample(tid: i32, at: u64, frame: u64) -> Sample {
        Sample::new(at, tid, Arc::from("t"), Arc::from(vec![frame]), 0, false)
    }

    fn closing() -> (Closing, Receiver<Sample>) {
        let (tx, rx) = sync_channel(64);
        (Closing::new(Box::new(tx), 10), rx)
    }

    #[test]
    fn a_thread_with_one_sample_has_it_handed_back_when_it_leaves() {
        let (mut out, rx) = closing();
        assert!(out.take(sample(7, 100, 1)));
        assert!(rx.try_recv().is_err(), "the first sample is held");
        let back = out.left(7, 0, 105).expect("handed back");
        assert_eq!(back.timestamp_ns(), 100);
        assert!(rx.try_recv().is_err(), "nothing left for the consumer");
    }

    #[test]
    fn a_thread_that_leaves_gets_a_closing_sample_within_a_period() {
        let (mut out, rx) = closing();
        out.take(sample(7, 100, 1));
        out.take(sample(7, 110, 2));
        let got: Vec<u64> = rx.try_iter().map(|s| s.timestamp_ns()).collect();
        assert_eq!(got, [100, 110], "both leave, in order, with the second");
        assert!(out.left(7, 0, 500).is_none());
        let close = rx.try_recv().expect("a closing sample");
        assert_eq!(
            close.timestamp_ns(),
            120,
            "a period after the last sample at most"
        );
        assert!(close.frames().is_empty());
        // Known alive only up to its last sample: nothing to close.
        out.take(sample(8, 100, 1));
        out.take(sample(8, 110, 2));
        let _: Vec<_> = rx.try_iter().collect();
        assert!(out.left(8, 0, 110).is_none());
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn pausing_lets_held_samples_go() {
        let (mut out, rx) = closing();
        out.take(sample(7, 100, 1));
        out.paused();
        assert_eq!(rx.try_recv().map(|s| s.timestamp_ns()), Ok(100));
        assert!(out.left(7, 0, 200).is_none(), "forgotten at the pause");
    }
}
