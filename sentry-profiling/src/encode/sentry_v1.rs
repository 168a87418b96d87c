//! Transaction-based (V1) profiles in Sentry's sample format: the same
//! profile body as a continuous chunk (frames, stacks, samples, thread
//! metadata and debug images, built by `sentry_chunk::build_body`) with
//! the V1 envelope of metadata around it, timed from the transaction's
//! start.

use std::sync::Arc;

use serde::Serialize;

use super::sentry_chunk::{ARCH, DebugMeta, PLATFORM, Profile, SampleTime, build_body, new_id};
use crate::chunk::Chunk;
use crate::symbolize::Symbolizer;
use crate::unwind::ModuleSet;

/// A V1 (transaction-based) profile's metadata.
#[derive(Debug, Clone)]
pub(crate) struct V1Meta {
    pub(crate) release: String,
    pub(crate) environment: Option<String>,
    pub(crate) transaction_id: String,
    pub(crate) transaction_name: String,
    pub(crate) trace_id: String,
    pub(crate) active_thread_id: String,
    /// The transaction's start (RFC 3339), also the profile's time origin.
    pub(crate) start_rfc3339: String,
    pub(crate) start_ns: u64,
    pub(crate) os_version: String,
}

#[derive(Serialize)]
struct V1Payload<'a> {
    version: &'static str,
    event_id: &'a str,
    platform: &'static str,
    release: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    environment: Option<&'a str>,
    timestamp: &'a str,
    device: V1Device,
    os: V1Os<'a>,
    debug_meta: DebugMeta,
    transaction: V1Transaction<'a>,
    profile: Profile<'a>,
}

#[derive(Serialize)]
struct V1Device {
    architecture: &'static str,
}

#[derive(Serialize)]
struct V1Os<'a> {
    name: &'static str,
    version: &'a str,
}

#[derive(Serialize)]
struct V1Transaction<'a> {
    id: &'a str,
    name: &'a str,
    trace_id: &'a str,
    active_thread_id: &'a str,
}

/// Encodes a V1 profile of the samples `order` of `chunk`; returns its
/// `event_id` and JSON.
pub(crate) fn encode_v1(
    meta: &V1Meta,
    chunk: &Chunk,
    modules: &ModuleSet,
    symbolizer: &mut Option<&mut Symbolizer>,
    keyed: &[(u64, Option<Arc<str>>)],
    order: &[usize],
) -> (String, Vec<u8>) {
    let event_id = new_id();
    let body = build_body(
        chunk,
        modules,
        symbolizer,
        keyed,
        order,
        SampleTime::SinceNs(meta.start_ns),
    );
    let payload = V1Payload {
        version: "1",
        event_id: &event_id,
        platform: PLATFORM,
        release: &meta.release,
        environment: meta.environment.as_deref(),
        timestamp: &meta.start_rfc3339,
        device: V1Device { architecture: ARCH },
        os: V1Os {
            name: "Linux",
            version: &meta.os_version,
        },
        debug_meta: DebugMeta {
            images: body.images,
        },
        transaction: V1Transaction {
            id: &meta.transaction_id,
            name: &meta.transaction_name,
            trace_id: &meta.trace_id,
            active_thread_id: &meta.active_thread_id,
        },
        profile: body.profile,
    };
    let json = serde_json::to_vec(&payload).unwrap_or_default();
    drop(payload);
    (event_id, json)
}
