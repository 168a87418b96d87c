//! Where the session's finished chunks and V1 envelopes go. The Sentry glue
//! (the transport factory) installs a [`ChunkSink`]; without one (a client
//! built without the integration's transport), chunks go to the main hub's
//! client, if any.

use std::sync::Arc;

use sentry_core::protocol::Envelope;

use super::Session;
use crate::encode::envelope::chunk_envelope;
use crate::encode::sentry_chunk::EncodedChunk;

/// What became of a chunk handed on.
pub(crate) enum Handed {
    /// Taken by the transport, or into the sender's queue.
    Taken,
    /// The crate's sender dropped it (and counted why).
    #[cfg(feature = "http")]
    Dropped,
    /// No transport to take it.
    NoTransport,
}

/// A destination for chunks and V1 envelopes. Implementations never wait
/// for the network: the chunk thread calls them.
pub(crate) trait ChunkSink: Send + Sync {
    /// Hands one `profile_chunk` on.
    fn send_chunk(&self, chunk: EncodedChunk) -> Handed;
    /// Hands a finished envelope (a transaction with its V1 profile) on.
    fn send_envelope(&self, envelope: Envelope);
}

impl Session {
    fn sink(&self) -> Option<Arc<dyn ChunkSink>> {
        self.sink.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Hands one profile chunk to the sink, or to the main hub's client.
    pub(super) fn send_profile_chunk(&self, chunk: EncodedChunk) -> Handed {
        if let Some(sink) = self.sink() {
            return sink.send_chunk(chunk);
        }
        match sentry_core::Hub::main().client() {
            Some(client) => {
                client.send_envelope(chunk_envelope(chunk));
                Handed::Taken
            }
            None => Handed::NoTransport,
        }
    }

    /// Sends a blocking poll's issue event as the client sends any event:
    /// the main hub's client prepares it (its event processors,
    /// `before_send` and `sample_rate`, each drop recorded in its client
    /// reports), then it goes to the client's transport through the sink
    /// (rate limits of the `error` category apply there). Prepared here
    /// rather than through `capture_event`, because at shutdown the client
    /// has already taken its transport away while the last windows are
    /// sent; the sink's transport still takes them.
    pub(super) fn send_blocking_event(&self, event: sentry_core::protocol::Event<'static>) {
        let c = &self.counters.blocking;
        let Some(client) = sentry_core::Hub::main().client() else {
            crate::blocking::Counters::add(&c.events_filtered, 1);
            return;
        };
        let Some(event) = client.prepare_event(event, None) else {
            crate::blocking::Counters::add(&c.events_filtered, 1);
            return;
        };
        let envelope = Envelope::from(event);
        match self.sink() {
            Some(sink) => sink.send_envelope(envelope),
            None => client.send_envelope(envelope),
        }
        crate::blocking::Counters::add(&c.events_sent, 1);
    }

    /// Hands an envelope to the sink, or to the main hub's client.
    pub(super) fn send_envelope(&self, envelope: Envelope) {
        if let Some(sink) = self.sink() {
            sink.send_envelope(envelope);
        } else if let Some(client) = sentry_core::Hub::main().client() {
            client.send_envelope(envelope);
        }
    }
}
