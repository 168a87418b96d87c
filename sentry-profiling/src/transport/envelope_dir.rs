//! A transport that writes every envelope, byte for byte, to a directory:
//! the local default when no DSN is configured.
//!
//! The thread that sends an envelope (a Tokio worker finishing a
//! transaction) only queues it. One file per envelope is not free: creating
//! it is file-system work the request's thread must not pay for, and a
//! slow or stalled disk must not stall the requests. So a
//! thread of the transport's own serialises and writes the envelopes, as
//! Sentry's own transports send from a background thread. The queue is
//! bounded; when it is full an envelope is dropped and counted rather than
//! making the sender wait, and `flush` and `shutdown` wait for the queue at
//! most their timeout. The directory is bounded too: past a number of files
//! or bytes, the writer removes the oldest (see `super::retention`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use sentry_core::protocol::Envelope;
use sentry_core::{Transport, TransportFactory};

use super::retention::Retention;
use crate::error::log_throttled;

/// Writes each envelope to `<dir>/<sequence>-<millis>.envelope`, in Sentry's
/// envelope format, from a writer thread of its own (named
/// `sentry-envelope-dir`).
///
/// The directory keeps at most [`max_files`](Self::max_files) envelope
/// files and [`max_bytes`](Self::max_bytes) bytes of them, those of earlier
/// runs included: after each write the writer thread removes the oldest
/// past either bound (counted in [`removed`](Self::removed)), transactions
/// and other envelopes before profile chunks, which keep up to half of
/// each bound. Other files in the directory are left alone.
///
/// [`send_envelope`](Transport::send_envelope) never waits for the disk: it
/// queues the envelope, or drops it when
/// [`queue_capacity`](Self::queue_capacity) envelopes are already waiting
/// (counted in [`dropped`](Self::dropped), reported on stderr for the first,
/// the 10th, 100th, … then every 100,000th). A failed write is counted in
/// [`failed`](Self::failed) and reported the same way, never a panic.
/// [`flush`](Transport::flush) waits until what was queued before it has
/// been written, and [`shutdown`](Transport::shutdown) until everything
/// queued has been written and the thread has ended, each at most its
/// timeout; what shutdown could not write in time is dropped (and counted)
/// instead of holding the process up. Envelopes sent after shutdown are
/// dropped and counted too, and dropping a transport that was not shut
/// down shuts it down with [`DROP_TIMEOUT`](Self::DROP_TIMEOUT).
///
/// `Arc<EnvelopeDirTransport>` is itself a transport factory, handing out
/// that one transport, as [`factory`](Self::factory) does: keep the `Arc`
/// to read the counters. To flush it yourself, call `flush` on the
/// transport (`Transport::flush(&*arc, timeout)`), not on the `Arc`:
/// sentry-core's `Transport` impl for `Arc<T>` does not pass `flush` on,
/// and returns `true` at once.
///
/// In the child of a `fork()`, which has no writer thread, envelopes are
/// written on the sending thread, and `flush` and `shutdown` do not wait
/// for the parent's queue (Linux on x86_64 and aarch64, where the crate
/// notices forks).
#[derive(Debug)]
pub struct EnvelopeDirTransport {
    /// Envelopes that may wait for the writer, the one being written
    /// included.
    capacity: usize,
    /// Set by `shutdown`: later envelopes are dropped.
    closed: AtomicBool,
    jobs: Sender<Job>,
    /// The writer thread, until `shutdown` joins it (or leaves it behind
    /// on a write that outlasts the timeout).
    writer: Mutex<Option<JoinHandle<()>>>,
    shared: Arc<Shared>,
}

/// What the writer thread is asked to do, in order.
#[expect(
    clippy::large_enum_variant,
    reason = "nearly every job is a write; boxing envelopes would allocate for each to shrink the rare markers"
)]
enum Job {
    Write(Envelope),
    /// Answer once every envelope queued before has been dealt with.
    Flush(Sender<()>),
    /// Answer and end, every envelope queued before dealt with.
    Stop(Sender<()>),
}

/// What the sending side and the writer thread both see.
#[derive(Debug)]
struct Shared {
    dir: PathBuf,
    /// Envelopes queued and not yet dealt with (the one being written
    /// included); what bounds the queue.
    queued: AtomicUsize,
    /// The next file's sequence number.
    seq: AtomicU64,
    written: AtomicU64,
    failed: AtomicU64,
    dropped: AtomicU64,
    /// Envelope files removed to keep the directory within its bounds.
    removed: AtomicU64,
    /// The bounds: files, and bytes.
    max_files: AtomicUsize,
    max_bytes: AtomicU64,
    /// Shutdown ran out of time: the writer drops what is still queued
    /// instead of writing it.
    abandoned: AtomicBool,
    /// A pause before each write, in nanoseconds, that tests set to play a
    /// slow disk (see `crate::hooks::workspace::set_envelope_dir_write_delay`).
    write_delay_ns: AtomicU64,
}

impl EnvelopeDirTransport {
    /// Envelopes that may wait for the writer thread (the one being written
    /// included) unless [`queue_capacity`](Self::queue_capacity) says
    /// otherwise: about a second of transactions of a service serving 1,000
    /// requests a second, a few megabytes of memory for typical ones.
    pub const DEFAULT_QUEUE_CAPACITY: usize = 1024;

    /// Envelope files the directory keeps unless
    /// [`max_files`](Self::max_files) says otherwise: as many as the
    /// preview page reads (`cargo xtask view`), about 20 s of a service at
    /// 1,000 requests a second, hours of one at a few a second.
    pub const DEFAULT_MAX_FILES: usize = 20_000;

    /// Bytes of envelope files the directory keeps unless
    /// [`max_bytes`](Self::max_bytes) says otherwise: 1 GiB.
    pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

    /// How long dropping a transport that was not shut down waits for its
    /// queue, at most (Sentry's default `shutdown_timeout`).
    pub const DROP_TIMEOUT: Duration = Duration::from_secs(2);

    /// A transport writing into `dir` (created if missing), with its writer
    /// thread started. Fails if the directory cannot be created or the
    /// thread cannot be started.
    pub fn new(dir: impl AsRef<Path>) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir.as_ref())?;
        // A forked child must know that the writer thread is not there.
        crate::sys::watch_fork();
        let shared = Arc::new(Shared {
            dir: dir.as_ref().to_path_buf(),
            queued: AtomicUsize::new(0),
            seq: AtomicU64::new(0),
            written: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            removed: AtomicU64::new(0),
            max_files: AtomicUsize::new(Self::DEFAULT_MAX_FILES),
            max_bytes: AtomicU64::new(Self::DEFAULT_MAX_BYTES),
            abandoned: AtomicBool::new(false),
            write_delay_ns: AtomicU64::new(0),
        });
        // Unbounded, so that flush and shutdown markers always get in: the
        // bound on envelopes is `Shared::queued`, checked before sending.
        let (jobs, receiver) = channel();
        let worker = Arc::clone(&shared);
        let writer = std::thread::Builder::new()
            .name("sentry-envelope-dir".into())
            .spawn(move || run(&worker, &receiver))?;
        Ok(Self {
            capacity: Self::DEFAULT_QUEUE_CAPACITY,
            closed: AtomicBool::new(false),
            jobs,
            writer: Mutex::new(Some(writer)),
            shared,
        })
    }

    /// A transport factory for `ClientOptions::transport` that hands every
    /// client the same new transport writing into `dir`. Closing a client
    /// shuts that transport down for good: give a later client a factory of
    /// its own.
    pub fn factory(dir: impl AsRef<Path>) -> std::io::Result<Arc<dyn TransportFactory>> {
        let transport: Arc<dyn Transport> = Arc::new(Self::new(dir)?);
        Ok(Arc::new(move |_: &sentry_core::ClientOptions| {
            Arc::clone(&transport)
        }))
    }

    /// Sets how many envelopes may wait for the writer thread, the one
    /// being written included (default
    /// [`DEFAULT_QUEUE_CAPACITY`](Self::DEFAULT_QUEUE_CAPACITY), at least
    /// 1). Each waits serialised by the SDK's types, not yet as bytes.
    #[must_use]
    pub fn queue_capacity(mut self, envelopes: usize) -> Self {
        self.capacity = envelopes.max(1);
        self
    }

    /// Sets how many envelope files the directory keeps at most (default
    /// [`DEFAULT_MAX_FILES`](Self::DEFAULT_MAX_FILES), at least 1): past
    /// it, the writer thread removes the oldest.
    #[must_use]
    pub fn max_files(self, files: usize) -> Self {
        self.shared.max_files.store(files.max(1), Ordering::Relaxed);
        self
    }

    /// Sets how many bytes of envelope files the directory keeps at most
    /// (default [`DEFAULT_MAX_BYTES`](Self::DEFAULT_MAX_BYTES)): past it,
    /// the writer thread removes the oldest (the newest file stays, however
    /// large).
    #[must_use]
    pub fn max_bytes(self, bytes: u64) -> Self {
        self.shared.max_bytes.store(bytes, Ordering::Relaxed);
        self
    }

    /// Envelope files removed so far to keep the directory within
    /// [`max_files`](Self::max_files) and [`max_bytes`](Self::max_bytes).
    pub fn removed(&self) -> u64 {
        self.shared.removed.load(Ordering::Relaxed)
    }

    /// The directory written to.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Envelopes written so far.
    pub fn written(&self) -> u64 {
        self.shared.written.load(Ordering::Relaxed)
    }

    /// Envelopes dropped unwritten so far: sent while the queue was full
    /// or after shutdown, or still queued when shutdown's timeout passed.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Envelopes whose write failed so far (the directory removed, the
    /// disk full...).
    pub fn failed(&self) -> u64 {
        self.shared.failed.load(Ordering::Relaxed)
    }

    /// Makes the writer pause `per_write` before each write, from its next
    /// one on: a slow disk, for tests.
    pub(crate) fn set_write_delay(&self, per_write: Duration) {
        let ns = u64::try_from(per_write.as_nanos()).unwrap_or(u64::MAX);
        self.shared.write_delay_ns.store(ns, Ordering::Relaxed);
    }

    /// Takes the writer thread's handle, if it is still held.
    fn take_writer(&self) -> Option<JoinHandle<()>> {
        self.writer.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

impl Transport for EnvelopeDirTransport {
    fn send_envelope(&self, envelope: Envelope) {
        if crate::sys::in_forked_child() {
            // The writer thread stayed in the parent, and the parent writes
            // what was queued when the child was forked. The child keeps no
            // count of the directory: the parent's writer bounds it.
            let _ = self.shared.write(&envelope);
            return;
        }
        // A place in the queue is claimed before `closed` is read, both in
        // one total order with shutdown's store: an envelope sent after the
        // writer was told to stop was claimed before `closed` was set, so
        // the stopping writer sees the claim and waits for the envelope
        // (see `run`). None is lost uncounted.
        let claimed = self
            .shared
            .queued
            .fetch_update(Ordering::SeqCst, Ordering::Relaxed, |n| {
                (n < self.capacity).then_some(n + 1)
            })
            .is_ok();
        if !claimed {
            self.shared
                .drop_one("the queue is full (the disk is slower than envelopes arrive)");
            return;
        }
        if self.closed.load(Ordering::SeqCst) {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            self.shared.drop_one("the transport is shut down");
            return;
        }
        if self.jobs.send(Job::Write(envelope)).is_err() {
            // Only a writer that has ended drops its receiver.
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            self.shared.drop_one("the writer thread has ended");
        }
    }

    fn flush(&self, timeout: Duration) -> bool {
        if crate::sys::in_forked_child() {
            return true;
        }
        let (reply, answer) = channel();
        if self.closed.load(Ordering::SeqCst) || self.jobs.send(Job::Flush(reply)).is_err() {
            return self.shared.queued.load(Ordering::SeqCst) == 0;
        }
        self.shared.answered(&answer, timeout)
    }

    fn shutdown(&self, timeout: Duration) -> bool {
        if crate::sys::in_forked_child() {
            return true;
        }
        self.closed.store(true, Ordering::SeqCst);
        let (reply, answer) = channel();
        let done = if self.jobs.send(Job::Stop(reply)).is_ok() {
            self.shared.answered(&answer, timeout)
        } else {
            // An earlier shutdown ended the writer.
            self.shared.queued.load(Ordering::SeqCst) == 0
        };
        if done {
            // The writer answered as its last act: this join does not wait
            // for the disk.
            if let Some(writer) = self.take_writer() {
                let _ = writer.join();
            }
        } else {
            // The writer is stuck on a slow write: leave it behind. Once the
            // write returns, it drops (and counts) what is left, and ends.
            self.shared.abandoned.store(true, Ordering::Relaxed);
            drop(self.take_writer());
        }
        done
    }
}

impl Drop for EnvelopeDirTransport {
    fn drop(&mut self) {
        if crate::sys::in_forked_child() {
            // The handle names a thread of the parent: leave it alone.
            let writer = self.writer.get_mut().unwrap_or_else(|e| e.into_inner());
            std::mem::forget(writer.take());
            return;
        }
        if !self.closed.load(Ordering::SeqCst) {
            self.shutdown(Self::DROP_TIMEOUT);
        }
    }
}

/// The writer thread: deals with jobs in order until told to stop (or the
/// transport is gone).
fn run(shared: &Shared, jobs: &Receiver<Job>) {
    // The directory's files, read before the first write (not earlier: a
    // transport that writes nothing reads nothing).
    let mut retention: Option<Retention> = None;
    let mut remove = Vec::new();
    while let Ok(job) = jobs.recv() {
        match job {
            Job::Write(envelope) => {
                if shared.abandoned.load(Ordering::Relaxed) {
                    shared.drop_one("not written before the shutdown timeout");
                } else {
                    let retention = retention.get_or_insert_with(|| Retention::scan(&shared.dir));
                    if let Some((name, size, chunk)) = shared.write(&envelope) {
                        retention.admit(
                            name,
                            size,
                            chunk,
                            shared.max_files.load(Ordering::Relaxed),
                            shared.max_bytes.load(Ordering::Relaxed),
                            &mut remove,
                        );
                        for old in remove.drain(..) {
                            if std::fs::remove_file(shared.dir.join(&*old)).is_ok() {
                                shared.removed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
                // Counted out only now, so that the bound covers the
                // envelope being written too.
                shared.queued.fetch_sub(1, Ordering::SeqCst);
            }
            Job::Flush(reply) => {
                let _ = reply.send(());
            }
            Job::Stop(reply) => {
                // Every envelope sent before the marker has been dealt with.
                // What is still claimed was sent, or is about to be, by a
                // thread that read `closed` before shutdown set it: wait
                // for it (its sender is a few instructions from the send)
                // and drop it.
                while shared.queued.load(Ordering::SeqCst) > 0 {
                    match jobs.try_recv() {
                        Ok(Job::Write(_)) => {
                            shared.drop_one("the transport is shut down");
                            shared.queued.fetch_sub(1, Ordering::SeqCst);
                        }
                        Ok(Job::Flush(reply) | Job::Stop(reply)) => {
                            let _ = reply.send(());
                        }
                        Err(TryRecvError::Empty) => std::thread::yield_now(),
                        Err(TryRecvError::Disconnected) => break,
                    }
                }
                let _ = reply.send(());
                return;
            }
        }
    }
}

impl Shared {
    /// Waits at most `timeout` for the writer to answer a marker. A writer
    /// that ended without answering (stopped by a concurrent shutdown) has
    /// dealt with everything if nothing is still queued.
    fn answered(&self, answer: &Receiver<()>, timeout: Duration) -> bool {
        match answer.recv_timeout(timeout) {
            Ok(()) => true,
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => self.queued.load(Ordering::SeqCst) == 0,
        }
    }

    /// Serialises `envelope` and writes it to the next file, counting the
    /// outcome; returns the file's name and size, and whether it holds a
    /// profile chunk, when written.
    fn write(&self, envelope: &Envelope) -> Option<(Box<str>, u64, bool)> {
        let delay = self.write_delay_ns.load(Ordering::Relaxed);
        if delay > 0 {
            std::thread::sleep(Duration::from_nanos(delay));
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let millis = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        let name = format!("{seq:06}-{millis}.envelope");
        let path = self.dir.join(&name);
        let result =
            crate::transaction_tags::envelope_bytes(envelope, None, None, None).and_then(|bytes| {
                let chunk = super::retention::holds_chunk(&bytes[..bytes.len().min(512)]);
                std::fs::write(&path, &bytes).map(|()| (bytes.len(), chunk))
            });
        match result {
            Ok((size, chunk)) => {
                self.written.fetch_add(1, Ordering::Relaxed);
                Some((name.into_boxed_str(), size as u64, chunk))
            }
            Err(e) => {
                let n = self.failed.fetch_add(1, Ordering::Relaxed) + 1;
                log_throttled(n, || {
                    format!(
                        "cannot write envelope to {}: {e} ({n} failed so far)",
                        path.display()
                    )
                });
                None
            }
        }
    }

    /// Counts and (sparingly) reports an envelope that will not be written.
    fn drop_one(&self, why: &str) {
        let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
        log_throttled(n, || {
            format!(
                "envelope for {} dropped: {why} ({n} dropped so far)",
                self.dir.display()
            )
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// The writer's pause per write in the slow-disk tests: a synchronous
    /// writer would hold each sender this long.
    const DELAY: Duration = Duration::from_millis(50);
    /// What a busy machine may add to any wait measured here.
    const SLACK: Duration = Duration::from_secs(2);

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "sentry-profiling-envelope-dir-{tag}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn envelope(i: usize) -> Envelope {
        let mut envelope = Envelope::new();
        envelope.add_item(sentry_core::protocol::Event {
            message: Some(format!("envelope {i}")),
            ..Default::default()
        });
        envelope
    }

    fn files(dir: &Path) -> Vec<PathBuf> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.sort();
        files
    }

    /// Waits (at most 20 s) until `done` holds.
    fn eventually(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(Instant::now() < deadline, "{what}: not within 20 s");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn writes_every_envelope_in_order_and_flush_waits_for_them() {
        let dir = temp_dir("order");
        let t = EnvelopeDirTransport::new(&dir).unwrap();
        for i in 0..20 {
            t.send_envelope(envelope(i));
        }
        assert!(t.flush(Duration::from_secs(30)));
        assert_eq!((t.written(), t.dropped(), t.failed()), (20, 0, 0));
        let files = files(&dir);
        assert_eq!(files.len(), 20);
        for (i, file) in files.iter().enumerate() {
            let text = String::from_utf8(std::fs::read(file).unwrap()).unwrap();
            assert!(
                text.contains(&format!("\"envelope {i}\"")),
                "{}: {text}",
                file.display()
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_slow_disk_never_holds_the_sender_and_bounds_flush_and_shutdown() {
        const SENT: usize = 1000;
        const CAPACITY: usize = 64;
        let dir = temp_dir("slow");
        let t = EnvelopeDirTransport::new(&dir)
            .unwrap()
            .queue_capacity(CAPACITY);
        t.set_write_delay(DELAY);
        let envelopes: Vec<_> = (0..SENT).map(envelope).collect();

        let started = Instant::now();
        for e in envelopes {
            t.send_envelope(e);
        }
        let sending = started.elapsed();
        // Written one by one on this thread, they would have taken 1,000
        // pauses; queued, they take less than twenty.
        assert!(
            sending < DELAY * 20,
            "{SENT} sends took {sending:?} with a writer pausing {DELAY:?} per write"
        );
        // The queue held CAPACITY, plus one per write finished meanwhile.
        let writes_meanwhile = (sending.as_nanos() / DELAY.as_nanos()) as u64 + 1;
        let dropped = t.dropped();
        assert!(
            dropped >= (SENT - CAPACITY) as u64 - writes_meanwhile,
            "only {dropped} of {SENT} dropped with room for {CAPACITY}"
        );

        // The queue needs about 3 s; flush gives up at its timeout.
        let timeout = Duration::from_millis(200);
        let started = Instant::now();
        assert!(!t.flush(timeout), "flushed a 3 s queue in {timeout:?}");
        let waited = started.elapsed();
        assert!(
            waited >= timeout && waited < timeout + SLACK,
            "flush({timeout:?}) took {waited:?}"
        );

        // A writer that can catch up is flushed.
        t.set_write_delay(Duration::ZERO);
        assert!(
            t.flush(Duration::from_secs(30)),
            "flush after the disk recovered"
        );
        assert_eq!(t.written() + t.dropped(), SENT as u64);
        assert_eq!(t.failed(), 0);

        // Shutdown with the writer stuck again returns at its timeout, and
        // the writer drops what is left once its write returns.
        t.set_write_delay(DELAY);
        for i in 0..CAPACITY {
            t.send_envelope(envelope(i));
        }
        let timeout = Duration::from_millis(300);
        let started = Instant::now();
        assert!(!t.shutdown(timeout), "shut down a 3 s queue in {timeout:?}");
        let waited = started.elapsed();
        assert!(
            waited < timeout + SLACK,
            "shutdown({timeout:?}) took {waited:?}"
        );
        t.send_envelope(envelope(0));
        let total = (SENT + CAPACITY + 1) as u64;
        eventually("every envelope written or dropped", || {
            t.written() + t.dropped() == total
        });
        assert_eq!(t.failed(), 0);
        assert_eq!(files(&dir).len() as u64, t.written());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn shutdown_writes_what_is_queued_and_ends_the_writer() {
        let dir = temp_dir("shutdown");
        let t = EnvelopeDirTransport::new(&dir).unwrap();
        t.set_write_delay(Duration::from_millis(2));
        for i in 0..50 {
            t.send_envelope(envelope(i));
        }
        assert!(t.shutdown(Duration::from_secs(30)));
        assert_eq!((t.written(), t.dropped()), (50, 0));
        assert!(t.take_writer().is_none(), "the writer was joined");
        // Afterwards nothing is queued, and nothing is taken.
        t.send_envelope(envelope(50));
        assert_eq!(t.dropped(), 1);
        assert!(t.flush(Duration::from_secs(1)));
        assert!(t.shutdown(Duration::from_secs(1)));
        assert_eq!(files(&dir).len(), 50);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn envelopes_racing_shutdown_are_written_or_counted() {
        const THREADS: usize = 4;
        const EACH: usize = 500;
        let dir = temp_dir("race");
        let t = Arc::new(EnvelopeDirTransport::new(&dir).unwrap().queue_capacity(16));
        let senders: Vec<_> = (0..THREADS)
            .map(|_| {
                let t = Arc::clone(&t);
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        t.send_envelope(envelope(i));
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(5));
        assert!(Transport::shutdown(&*t, Duration::from_secs(30)));
        for s in senders {
            s.join().unwrap();
        }
        assert_eq!(t.written() + t.dropped(), (THREADS * EACH) as u64);
        assert_eq!(t.failed(), 0);
        assert_eq!(t.shared.queued.load(Ordering::SeqCst), 0);
        assert_eq!(files(&dir).len() as u64, t.written());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn dropping_a_transport_with_a_stuck_writer_waits_at_most_drop_timeout() {
        let dir = temp_dir("drop");
        let t = EnvelopeDirTransport::new(&dir).unwrap();
        t.set_write_delay(Duration::from_millis(500));
        for i in 0..20 {
            t.send_envelope(envelope(i));
        }
        let started = Instant::now();
        drop(t);
        let waited = started.elapsed();
        assert!(
            waited < EnvelopeDirTransport::DROP_TIMEOUT + SLACK,
            "drop took {waited:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn failed_writes_are_counted() {
        let dir = temp_dir("failed");
        let t = EnvelopeDirTransport::new(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        for i in 0..3 {
            t.send_envelope(envelope(i));
        }
        assert!(t.flush(Duration::from_secs(30)));
        assert_eq!((t.written(), t.dropped(), t.failed()), (0, 0, 3));
    }

    #[test]
    fn the_directory_keeps_its_newest_files_within_its_bounds() {
        let dir = temp_dir("retention");
        std::fs::create_dir_all(&dir).unwrap();
        // An earlier run's files, older than any of this run's.
        for i in 0..3 {
            std::fs::write(dir.join(format!("{i:06}-{i}.envelope")), b"old").unwrap();
        }
        std::fs::write(dir.join("profile.pb.gz"), b"kept").unwrap();
        let t = EnvelopeDirTransport::new(&dir).unwrap().max_files(5);
        for i in 0..12 {
            t.send_envelope(envelope(i));
        }
        assert!(t.flush(Duration::from_secs(30)));
        assert_eq!((t.written(), t.removed(), t.failed()), (12, 10, 0));
        let names: Vec<String> = files(&dir)
            .iter()
            .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
            .collect();
        assert!(names.contains(&"profile.pb.gz".to_owned()), "{names:?}");
        let envelopes: Vec<_> = files(&dir)
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "envelope"))
            .collect();
        assert_eq!(envelopes.len(), 5);
        // The newest five of this run.
        for (file, i) in envelopes.iter().zip(7..) {
            let text = String::from_utf8(std::fs::read(file).unwrap()).unwrap();
            assert!(
                text.contains(&format!("\"envelope {i}\"")),
                "{}",
                file.display()
            );
        }

        // Bytes: a bound below two envelopes keeps one.
        let t = EnvelopeDirTransport::new(&dir).unwrap().max_bytes(1);
        t.send_envelope(envelope(99));
        assert!(t.shutdown(Duration::from_secs(30)));
        assert_eq!(t.removed(), 5);
        let left: Vec<_> = files(&dir)
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "envelope"))
            .collect();
        assert_eq!(left.len(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_profile_chunk_outlives_the_transactions_written_after_it() {
        let dir = temp_dir("retention-chunk");
        let t = EnvelopeDirTransport::new(&dir).unwrap().max_files(4);
        let chunk = b"{\"event_id\":\"9a\"}\n{\"type\":\"profile_chunk\",\"platform\":\"rust\",\"length\":2}\n{}\n";
        t.send_envelope(Envelope::from_bytes_raw(chunk.to_vec()).unwrap());
        for i in 0..10 {
            t.send_envelope(envelope(i));
        }
        assert!(t.shutdown(Duration::from_secs(30)));
        assert_eq!((t.written(), t.removed()), (11, 7));
        let texts: Vec<String> = files(&dir)
            .iter()
            .map(|p| String::from_utf8(std::fs::read(p).unwrap()).unwrap())
            .collect();
        assert!(texts[0].contains("profile_chunk"), "{texts:?}");
        assert!(texts[3].contains("\"envelope 9\""), "{texts:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
