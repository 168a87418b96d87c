//! Where the sampler thread's samples go, and what it runs between its
//! ticks: a [`Consumer`] the sampler thread owns. A standalone
//! [`super::Sampler`] hands its samples to a bounded channel (read with
//! `try_iter`); a profiling session takes them on the sampler thread
//! itself, with the context words' changes read at the same tick (the
//! session's intake).

use std::sync::mpsc::SyncSender;

use super::Sample;

/// What the sampler thread hands its samples to. Every method runs on the
/// sampler thread, between two of its ticks: none may wait for long, or
/// the next tick comes late.
pub(crate) trait Consumer: Send {
    /// Takes one sample (each thread's in time order). False when there is
    /// no room for it: the sample is dropped, and counted.
    fn take(&mut self, sample: Sample) -> bool;

    /// The sampler showed a thread waiting for a CPU for `ns` under the
    /// context word `lane` (a request's lane), inside a poll of that
    /// request's own future (`own`) or in work the request handed off.
    /// No default: a consumer that wraps another must pass it on (one
    /// that did not left every request's `tokio.cpu_wait` at 0).
    fn cpu_waited(&mut self, lane: u64, own: bool, ns: u64);

    /// After each tick. Returns true when the application did something the
    /// sampler looks at again before it dozes: a thread entered or left a
    /// request since the tick before, perhaps after the tick looked at it
    /// (a request that begins may block its worker at once, using no CPU
    /// time, so no timer capture would end a doze).
    fn ticked(&mut self) -> bool {
        false
    }

    /// Before a doze while the application idles. From here until
    /// [`Consumer::woke`], whatever needs the sampler must wake it
    /// ([`super::SamplerControl::wake`]). Returns false when something is
    /// already waiting: the sampler does not doze.
    fn dozing(&mut self) -> bool {
        true
    }

    /// After that doze.
    fn woke(&mut self) {}

    /// The sampler is paused: called once as it pauses (every sample of
    /// the ticks before was taken), then at each of its wake-ups until it
    /// resumes or stops.
    fn paused(&mut self) {}

    /// The sampler thread stops; every sample was taken. The last call.
    fn stopped(&mut self) {}
}

/// A standalone sampler's queue: full, a sample is dropped.
impl Consumer for SyncSender<Sample> {
    fn take(&mut self, sample: Sample) -> bool {
        self.try_send(sample).is_ok()
    }

    /// A standalone sampler has no requests to add waits to.
    fn cpu_waited(&mut self, _lane: u64, _own: bool, _ns: u64) {}
}
