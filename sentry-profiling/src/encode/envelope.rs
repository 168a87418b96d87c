//! The `profile_chunk` envelope around an encoded chunk: what every chunk
//! sink hands to Sentry (the client's transport, or the crate's own HTTP
//! delivery).

use std::io::Write as _;

use sentry_core::protocol::Envelope;

use super::sentry_chunk::{EncodedChunk, PLATFORM};

/// Builds the envelope for one chunk: a raw envelope, because the SDK's
/// typed envelope has no `profile_chunk` item.
pub(crate) fn chunk_envelope(chunk: EncodedChunk) -> Envelope {
    // `from_bytes_raw` does not parse and cannot fail.
    Envelope::from_bytes_raw(chunk_envelope_bytes(chunk)).unwrap_or_default()
}

/// The bytes of [`chunk_envelope`], built in the chunk's own buffer: the
/// headers are moved in front of the JSON rather than the JSON copied after
/// them, so a chunk of several megabytes is not held twice.
pub(crate) fn chunk_envelope_bytes(chunk: EncodedChunk) -> Vec<u8> {
    let header = format!(
        "{{\"event_id\":\"{}\"}}\n{{\"type\":\"profile_chunk\",\"platform\":\"{PLATFORM}\",\"length\":{}}}\n",
        chunk.chunk_id,
        chunk.json.len()
    );
    let mut bytes = chunk.json;
    bytes.reserve_exact(header.len() + 1);
    bytes.splice(0..0, header.into_bytes());
    bytes.push(b'\n');
    bytes
}

/// Appends one item to raw envelope bytes: its header, of `fields` (JSON
/// members such as `"type":"client_report"`) and the payload's length, then
/// the payload.
pub(crate) fn append_item(bytes: &mut Vec<u8>, fields: &str, payload: &[u8]) {
    if !bytes.is_empty() && !bytes.ends_with(b"\n") {
        bytes.push(b'\n');
    }
    // Writing to a `Vec` cannot fail.
    let _ = writeln!(bytes, "{{{fields},\"length\":{}}}", payload.len());
    bytes.extend_from_slice(payload);
    bytes.push(b'\n');
}
