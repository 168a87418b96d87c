//! A transport that writes every envelope, byte for byte, to a directory:
//! the local default when no DSN is configured.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sentry_core::protocol::Envelope;
use sentry_core::{Transport, TransportFactory};

/// Writes each envelope to `<dir>/<sequence>-<millis>.envelope`, in Sentry's
/// envelope format. Writes happen on the calling thread; they are small and
/// go to the page cache. A failed write is counted and reported once on
/// stderr, never a panic.
#[derive(Debug)]
pub struct EnvelopeDirTransport {
    dir: PathBuf,
    seq: AtomicU64,
    written: AtomicU64,
    failed: AtomicU64,
}

impl EnvelopeDirTransport {
    /// A transport writing into `dir` (created if missing).
    pub fn new(dir: impl AsRef<Path>) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir.as_ref())?;
        Ok(Self {
            dir: dir.as_ref().to_path_buf(),
            seq: AtomicU64::new(0),
            written: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        })
    }

    /// A transport factory for `ClientOptions::transport`.
    pub fn factory(dir: impl AsRef<Path>) -> std::io::Result<Arc<dyn TransportFactory>> {
        let transport: Arc<dyn Transport> = Arc::new(Self::new(dir)?);
        Ok(Arc::new(move |_: &sentry_core::ClientOptions| {
            Arc::clone(&transport)
        }))
    }

    /// The directory written to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Envelopes written so far.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }
}

impl Transport for EnvelopeDirTransport {
    fn send_envelope(&self, envelope: Envelope) {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let millis = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        let path = self.dir.join(format!("{seq:06}-{millis}.envelope"));
        let mut bytes = Vec::new();
        let result = envelope
            .to_writer(&mut bytes)
            .and_then(|()| std::fs::write(&path, &bytes));
        match result {
            Ok(()) => {
                self.written.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                if self.failed.fetch_add(1, Ordering::Relaxed) == 0 {
                    eprintln!(
                        "sentry-profiling: cannot write envelope to {}: {e}",
                        path.display()
                    );
                }
            }
        }
    }
}
