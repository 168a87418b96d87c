//! Sentry's continuous-profiling chunk (sample format V2), shaped so that
//! Relay accepts it as sent:
//!
//! - `thread_id` is a string; timestamps are Unix seconds as floats;
//! - a thread with at most one sample in the chunk is left out (Relay would
//!   remove it, and reject the chunk if nothing remained);
//! - debug images are `symbolic` (Relay rejects unknown types such as `elf`)
//!   and list only modules that frames point into;
//! - a chunk whose JSON would exceed [`MAX_CHUNK_BYTES`] is split in two by
//!   time, each half with its own `chunk_id`, never dropped.

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

use serde::Serialize;

use crate::chunk::{Chunk, ChunkSample};
use crate::frames::synthetic_frame;
use crate::symbolize::Symbolizer;
use crate::unwind::{ModuleInfo, ModuleSet};

/// The platform Sentry files Rust profiles under; also the envelope item
/// header's `platform`.
pub(crate) const PLATFORM: &str = "rust";

/// Largest chunk payload sent; Relay's limit is 50 MiB.
pub(crate) const MAX_CHUNK_BYTES: usize = 40 * 1024 * 1024;

/// Chunk-level metadata.
#[derive(Debug, Clone)]
pub struct ChunkMeta {
    /// 32 lowercase hex digits, one per profiler session.
    pub profiler_id: String,
    /// Application release (Sentry requires one; `"unknown"` when unset).
    pub release: String,
    /// Environment.
    pub environment: Option<String>,
}

/// How a sample's thread appears in the chunk (see attribution).
pub(crate) type ThreadKeyFn<'a> =
    dyn Fn(usize, &ChunkSample) -> Option<(u64, Option<Arc<str>>)> + 'a;

/// One encoded chunk.
#[derive(Debug)]
pub struct EncodedChunk {
    /// `chunk_id` of this piece.
    pub chunk_id: String,
    /// The JSON payload.
    pub json: Vec<u8>,
    /// Samples the sampler took that this piece includes.
    pub samples: usize,
    /// Fill-in samples of suspended lanes this piece includes.
    pub fill_ins: usize,
    /// Samples the sampler took that were left out because their thread had
    /// a single sample in the chunk.
    pub dropped_single: usize,
    /// Thread ids present in `profile.samples`.
    pub thread_ids: Vec<u64>,
    /// Earliest and latest sample timestamps (ns).
    pub span_ns: (u64, u64),
}

#[derive(Serialize)]
struct Payload<'a> {
    version: &'static str,
    profiler_id: &'a str,
    chunk_id: &'a str,
    platform: &'static str,
    release: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    environment: Option<&'a str>,
    client_sdk: ClientSdk,
    #[serde(skip_serializing_if = "Option::is_none")]
    measurements: Option<ChunkMeasurements>,
    debug_meta: DebugMeta,
    profile: Profile<'a>,
}

/// The chunk's `measurements`, in the form Relay's `relay-profiling`
/// reads for format V2 (a map of name to `{unit, values}`, each value a
/// `timestamp` in Unix seconds and a `value`) and keeps when it re-writes
/// the chunk. `cpu_usage` and `memory_footprint` are the names Sentry's
/// profile page charts.
#[derive(Serialize)]
struct ChunkMeasurements {
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu_usage: Option<Series>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_footprint: Option<Series>,
}

#[derive(Serialize)]
struct Series {
    unit: &'static str,
    values: Vec<SeriesValue>,
}

#[derive(Serialize)]
struct SeriesValue {
    timestamp: f64,
    value: f64,
}

impl ChunkMeasurements {
    /// The chunk's measurements taken within `[from, to]` (ns); `None`
    /// when there are none.
    fn of(chunk: &Chunk, (from, to): (u64, u64)) -> Option<Self> {
        let taken = chunk
            .measurements()
            .iter()
            .filter(|m| (from..=to).contains(&m.timestamp_ns));
        let series =
            |unit, value: &dyn Fn(&crate::chunk::measurements::Measurement) -> Option<f64>| {
                let values: Vec<SeriesValue> = taken
                    .clone()
                    .filter_map(|m| {
                        value(m).map(|value| SeriesValue {
                            timestamp: m.timestamp_ns as f64 / 1e9,
                            value,
                        })
                    })
                    .collect();
                (!values.is_empty()).then_some(Series { unit, values })
            };
        let cpu_usage = series("percent", &|m| m.cpu_usage_percent);
        let memory_footprint = series("byte", &|m| m.memory_footprint_bytes.map(|b| b as f64));
        (cpu_usage.is_some() || memory_footprint.is_some()).then_some(Self {
            cpu_usage,
            memory_footprint,
        })
    }
}

#[derive(Serialize, Clone, Copy)]
struct ClientSdk {
    name: &'static str,
    version: &'static str,
}

/// The chunk's `client_sdk`: the Sentry SDK that sends it, as its
/// transactions name it (`sentry.rust` and the linked `sentry-core`
/// version), not this crate.
///
/// Sentry keys SDK bookkeeping on this (`ProjectSDK`, and the per-SDK
/// minimum versions `task.py::_is_deprecated` applies to profile chunks,
/// matched on the name's first two dot-separated parts). Chunks that said
/// `sentry.rust 0.1.0` beside transactions saying `sentry.rust 0.49.5`
/// made the project look like it ran an ancient sentry-rust, and would be
/// the first filtered if Sentry ever set a minimum for `sentry.rust`
/// chunks; the version of the SDK actually linked is the one such a
/// minimum would be about. The version is read from `sentry-core`'s default
/// user agent (`sentry.rust/<version>`), which an application's own
/// `user_agent` option does not change.
fn client_sdk() -> ClientSdk {
    static SDK: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    let (name, version) = SDK.get_or_init(|| {
        let agent = sentry_core::ClientOptions::default().user_agent;
        let (name, version) = agent
            .split_once('/')
            .filter(|(n, v)| !n.is_empty() && !v.is_empty())
            .unwrap_or(("sentry.rust", env!("CARGO_PKG_VERSION")));
        (name.to_owned(), version.to_owned())
    });
    ClientSdk { name, version }
}

#[derive(Serialize)]
pub(super) struct DebugMeta {
    pub(super) images: Vec<DebugImage>,
}

#[derive(Serialize)]
pub(super) struct DebugImage {
    #[serde(rename = "type")]
    kind: &'static str,
    code_file: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    debug_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    code_id: Option<String>,
    image_addr: String,
    image_vmaddr: String,
    image_size: u64,
    arch: &'static str,
}

#[derive(Serialize)]
pub(super) struct Profile<'a> {
    samples: OutSamples,
    stacks: Vec<Vec<u32>>,
    frames: Vec<Frame>,
    thread_metadata: HashMap<String, ThreadMeta<'a>>,
}

/// The samples of a profile, kept compact (a timestamp, a stack and a
/// thread per sample) and written out one [`OutSample`] at a time: a 60 s
/// chunk holds tens of thousands of them, and their written form only
/// exists in the JSON.
struct OutSamples {
    time: SampleTime,
    /// (timestamp ns, stack id, thread id) in time order.
    items: Vec<(u64, u32, u64)>,
}

impl Serialize for OutSamples {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq as _;
        let mut seq = s.serialize_seq(Some(self.items.len()))?;
        for &(ns, stack_id, thread_id) in &self.items {
            let (timestamp, elapsed_since_start_ns) = match self.time {
                SampleTime::Unix => (Some(ns as f64 / 1e9), None),
                SampleTime::SinceNs(start) => (None, Some(ns.saturating_sub(start).to_string())),
            };
            seq.serialize_element(&OutSample {
                timestamp,
                elapsed_since_start_ns,
                stack_id,
                thread_id,
            })?;
        }
        seq.end()
    }
}

#[derive(Serialize)]
struct OutSample {
    #[serde(skip_serializing_if = "Option::is_none")]
    timestamp: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    elapsed_since_start_ns: Option<String>,
    stack_id: u32,
    /// Written as a string, as the format wants; kept as a number here so a
    /// chunk of 50 000 samples does not allocate 50 000 strings.
    #[serde(serialize_with = "as_string")]
    thread_id: u64,
}

fn as_string<S: serde::Serializer>(id: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(id)
}

/// A frame. Every frame has an `instruction_addr`: Symbolicator requires
/// one on each frame of a native chunk (see [`super::synthetic`]).
#[derive(Serialize)]
struct Frame {
    instruction_addr: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    function: Option<Arc<str>>,
    /// Set (to false) only on synthetic frames: Symbolicator replaces it on
    /// the frames it symbolicates, and decides from the image.
    #[serde(skip_serializing_if = "Option::is_none")]
    in_app: Option<bool>,
}

#[derive(Serialize)]
struct ThreadMeta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
}

/// The CPU architecture name Sentry uses.
pub(crate) const ARCH: &str = if cfg!(target_arch = "aarch64") {
    "arm64"
} else {
    "x86_64"
};

/// Encodes `chunk`, splitting it when too large. `symbolizer` is optional:
/// without it frames carry only addresses.
pub fn encode_chunk(
    meta: &ChunkMeta,
    chunk: &Chunk,
    modules: &ModuleSet,
    symbolizer: Option<&mut Symbolizer>,
    thread_key: &ThreadKeyFn<'_>,
) -> Vec<EncodedChunk> {
    encode_chunk_limited(
        meta,
        chunk,
        modules,
        symbolizer,
        thread_key,
        MAX_CHUNK_BYTES,
    )
}

/// [`encode_chunk`] with a size limit other than [`MAX_CHUNK_BYTES`].
fn encode_chunk_limited(
    meta: &ChunkMeta,
    chunk: &Chunk,
    modules: &ModuleSet,
    symbolizer: Option<&mut Symbolizer>,
    thread_key: &ThreadKeyFn<'_>,
    limit: usize,
) -> Vec<EncodedChunk> {
    // Count samples per (displayed) thread and keep threads with two or more.
    // Relay counts only samples with a non-empty stack, so those are the
    // ones counted here: a thread with one real stack and an empty one
    // would be dropped at ingestion after being reported as sent.
    let keyed: Vec<(u64, Option<Arc<str>>)> = chunk
        .samples()
        .iter()
        .enumerate()
        .map(|(i, s)| thread_key(i, s).unwrap_or((0, None)))
        .collect();
    let mut per_thread: HashMap<u64, usize> = HashMap::default();
    for (s, (k, _)) in chunk.samples().iter().zip(&keyed) {
        let count = per_thread.entry(*k).or_default();
        if !chunk.stacks()[s.stack as usize].is_empty() {
            *count += 1;
        }
    }
    // Thread id 0 means "not filed" (see the thread key).
    let mut order: Vec<usize> = (0..chunk.len())
        .filter(|&i| keyed[i].0 != 0 && per_thread[&keyed[i].0] >= 2)
        .collect();
    let real = chunk.samples().iter().filter(|s| s.thread_id != 0).count();
    let kept_real = order
        .iter()
        .filter(|&&i| chunk.samples()[i].thread_id != 0)
        .count();
    let dropped_single = real - kept_real;
    order.sort_by_key(|&i| chunk.samples()[i].timestamp_ns);
    let mut out = Vec::new();
    let span_ns = match (order.first(), order.last()) {
        (Some(&a), Some(&b)) => (
            chunk.samples()[a].timestamp_ns,
            chunk.samples()[b].timestamp_ns,
        ),
        _ => (0, 0),
    };
    let mut encoder = Encoder {
        meta,
        chunk,
        modules,
        symbolizer,
        keyed: &keyed,
        span_ns,
    };
    encoder.range(&order, limit, &mut out);
    if let Some(first) = out.first_mut() {
        first.dropped_single = dropped_single;
    }
    out
}

/// What every piece of one chunk is encoded from.
struct Encoder<'a, 's> {
    meta: &'a ChunkMeta,
    chunk: &'a Chunk,
    modules: &'a ModuleSet,
    symbolizer: Option<&'s mut Symbolizer>,
    keyed: &'a [(u64, Option<Arc<str>>)],
    /// Earliest and latest sample of the whole chunk.
    span_ns: (u64, u64),
}

impl Encoder<'_, '_> {
    /// Encodes the samples `order` (indices, in time order) as one piece, or
    /// as several when that piece would exceed `limit` bytes.
    fn range(&mut self, order: &[usize], limit: usize, out: &mut Vec<EncodedChunk>) {
        if order.is_empty() {
            return;
        }
        // Measurements go with the piece whose samples surround them; the
        // first and last pieces also take those before and after all
        // samples.
        let first = self.chunk.samples()[order[0]].timestamp_ns;
        let last = self.chunk.samples()[order[order.len() - 1]].timestamp_ns;
        let measured = (
            if first == self.span_ns.0 { 0 } else { first },
            if last == self.span_ns.1 {
                u64::MAX
            } else {
                last
            },
        );
        let piece = encode_one(
            self.meta,
            self.chunk,
            self.modules,
            &mut self.symbolizer,
            self.keyed,
            order,
            measured,
        );
        if piece.json.len() <= limit || order.len() < 4 {
            out.push(piece);
            return;
        }
        // Too large: split by time. Each half keeps every thread's samples
        // adjacent in time, so only a thread at the cut can be left with a
        // single sample in a piece.
        let mid = order.len() / 2;
        self.range(&order[..mid], limit, out);
        self.range(&order[mid..], limit, out);
    }
}

/// How sample times are written: V2 chunks use Unix seconds, V1 profiles
/// nanoseconds since the profile's start, as a string.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SampleTime {
    /// `timestamp`: Unix seconds (format V2).
    Unix,
    /// `elapsed_since_start_ns` from this start (format V1).
    SinceNs(u64),
}

/// The `profile` object and `debug_meta.images` shared by both formats.
pub(crate) struct ProfileBody<'a> {
    pub(super) profile: Profile<'a>,
    pub(super) images: Vec<DebugImage>,
    pub(crate) thread_ids: Vec<u64>,
    pub(crate) span_ns: (u64, u64),
}

/// Builds the profile body of the samples `order` (indices into `chunk`,
/// in time order, non-empty), filed under `keyed` thread ids.
pub(crate) fn build_body<'a>(
    chunk: &'a Chunk,
    modules: &ModuleSet,
    symbolizer: &mut Option<&mut Symbolizer>,
    keyed: &'a [(u64, Option<Arc<str>>)],
    order: &[usize],
    time: SampleTime,
) -> ProfileBody<'a> {
    let mut tables = Tables::default();
    let mut samples = Vec::with_capacity(order.len());
    let mut thread_metadata: HashMap<String, ThreadMeta<'_>> = HashMap::default();
    let mut thread_ids = Vec::new();
    let mut seen_threads = rustc_hash::FxHashSet::default();
    for &i in order {
        let s = &chunk.samples()[i];
        let stack_id = tables.stack(chunk, s.stack, modules, symbolizer);
        let (key, name) = &keyed[i];
        let thread_id = *key;
        if seen_threads.insert(thread_id) {
            thread_ids.push(thread_id);
            let name = name
                .as_deref()
                .or_else(|| chunk.thread_name(s.thread_id).map(|n| &**n));
            thread_metadata.insert(thread_id.to_string(), ThreadMeta { name });
        }
        samples.push((s.timestamp_ns, stack_id, thread_id));
    }
    let span_ns = (
        chunk.samples()[order[0]].timestamp_ns,
        chunk.samples()[order[order.len() - 1]].timestamp_ns,
    );
    ProfileBody {
        profile: Profile {
            samples: OutSamples {
                time,
                items: samples,
            },
            stacks: tables.stacks,
            frames: tables.frames,
            thread_metadata,
        },
        images: tables.images.iter().map(|m| debug_image(m)).collect(),
        thread_ids,
        span_ns,
    }
}

/// The frames and stacks of one profile body, each written once, and the
/// images its frames point into.
#[derive(Default)]
struct Tables {
    /// A chunk stack's index in `stacks`.
    stack_map: HashMap<u32, u32>,
    /// A frame address's index in `frames`.
    frame_map: HashMap<u64, u32>,
    stacks: Vec<Vec<u32>>,
    frames: Vec<Frame>,
    images: Vec<Arc<ModuleInfo>>,
}

impl Tables {
    /// The index of the chunk's stack `stack`, its frames added first.
    fn stack(
        &mut self,
        chunk: &Chunk,
        stack: u32,
        modules: &ModuleSet,
        symbolizer: &mut Option<&mut Symbolizer>,
    ) -> u32 {
        if let Some(&id) = self.stack_map.get(&stack) {
            return id;
        }
        let ids = chunk.stacks()[stack as usize]
            .iter()
            .map(|&addr| self.frame(addr, modules, symbolizer))
            .collect();
        self.stacks.push(ids);
        let id = (self.stacks.len() - 1) as u32;
        self.stack_map.insert(stack, id);
        id
    }

    /// The index of the frame at `addr` (a code address or a synthetic
    /// frame's marker); a code address's image joins `images`.
    fn frame(
        &mut self,
        addr: u64,
        modules: &ModuleSet,
        symbolizer: &mut Option<&mut Symbolizer>,
    ) -> u32 {
        if let Some(&id) = self.frame_map.get(&addr) {
            return id;
        }
        let frame = if let Some((out, name)) = synthetic_frame(addr) {
            Frame {
                instruction_addr: format!("{out:#x}"),
                function: Some(Arc::from(name)),
                in_app: Some(false),
            }
        } else {
            if let Some(m) = modules.find(addr)
                && !self.images.iter().any(|x| Arc::ptr_eq(x, m))
            {
                self.images.push(Arc::clone(m));
            }
            Frame {
                instruction_addr: format!("{addr:#x}"),
                function: symbolizer
                    .as_mut()
                    .and_then(|sym| sym.function(modules, addr)),
                in_app: None,
            }
        };
        self.frames.push(frame);
        let id = (self.frames.len() - 1) as u32;
        self.frame_map.insert(addr, id);
        id
    }
}

/// The `debug_meta` image of a module.
fn debug_image(m: &ModuleInfo) -> DebugImage {
    DebugImage {
        kind: "symbolic",
        code_file: m.path.clone(),
        debug_id: m.debug_id(),
        code_id: m.code_id(),
        image_addr: format!("{:#x}", m.start),
        image_vmaddr: format!("{:#x}", m.vmaddr),
        image_size: m.end - m.start,
        arch: ARCH,
    }
}

fn encode_one(
    meta: &ChunkMeta,
    chunk: &Chunk,
    modules: &ModuleSet,
    symbolizer: &mut Option<&mut Symbolizer>,
    keyed: &[(u64, Option<Arc<str>>)],
    order: &[usize],
    measured: (u64, u64),
) -> EncodedChunk {
    let chunk_id = new_id();
    let measurements = ChunkMeasurements::of(chunk, measured);
    let body = build_body(chunk, modules, symbolizer, keyed, order, SampleTime::Unix);
    let payload = Payload {
        version: "2",
        profiler_id: &meta.profiler_id,
        chunk_id: &chunk_id,
        platform: PLATFORM,
        release: &meta.release,
        environment: meta.environment.as_deref(),
        client_sdk: client_sdk(),
        measurements,
        debug_meta: DebugMeta {
            images: body.images,
        },
        profile: body.profile,
    };
    let json = serde_json::to_vec(&payload).unwrap_or_default();
    let fill_ins = order
        .iter()
        .filter(|&&i| chunk.samples()[i].thread_id == 0)
        .count();
    EncodedChunk {
        chunk_id,
        json,
        samples: order.len() - fill_ins,
        fill_ins,
        dropped_single: 0,
        thread_ids: body.thread_ids,
        span_ns: body.span_ns,
    }
}

/// A random UUID v4 as 32 lowercase hex digits.
pub(crate) fn new_id() -> String {
    let bytes: [u8; 16] = rand::random();
    let mut b = bytes;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::Sample;

    fn chunk_with(samples: &[(u64, i32, Vec<u64>)]) -> Chunk {
        let mut c = Chunk::new();
        for (ts, tid, frames) in samples {
            c.push(&Sample::new(
                *ts,
                *tid,
                Arc::from("t"),
                Arc::from(&frames[..]),
                0,
                false,
            ));
        }
        c
    }

    fn meta() -> ChunkMeta {
        ChunkMeta {
            profiler_id: new_id(),
            release: "r@1".into(),
            environment: None,
        }
    }

    fn by_tid(_: usize, s: &ChunkSample) -> Option<(u64, Option<Arc<str>>)> {
        Some((u64::from(s.thread_id), None))
    }

    #[test]
    fn leaves_out_single_sample_threads_and_sorts_by_time() {
        let c = chunk_with(&[
            (3_000_000_000, 1, vec![0x10, 0x20]),
            (1_000_000_000, 1, vec![0x10, 0x20]),
            (2_000_000_000, 2, vec![0x30]),
        ]);
        let out = encode_chunk(&meta(), &c, &ModuleSet::default(), None, &by_tid);
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].samples, out[0].dropped_single), (2, 1));
        let v: serde_json::Value = serde_json::from_slice(&out[0].json).unwrap();
        let samples = v["profile"]["samples"].as_array().unwrap();
        assert_eq!(samples[0]["timestamp"], 1.0);
        assert_eq!(samples[0]["thread_id"], "1");
        assert_eq!(v["profile"]["stacks"], serde_json::json!([[0, 1]]));
        assert_eq!(v["profile"]["frames"][1]["instruction_addr"], "0x20");
        assert!(v["profile"]["thread_metadata"].get("2").is_none());
    }

    #[test]
    fn client_sdk_is_the_linked_sentry_sdk() {
        let c = chunk_with(&[(1, 1, vec![0x10]), (2, 1, vec![0x10])]);
        let out = encode_chunk(&meta(), &c, &ModuleSet::default(), None, &by_tid);
        let v: serde_json::Value = serde_json::from_slice(&out[0].json).unwrap();
        // What the sentry crate puts in its transactions' `sdk`.
        let agent = sentry_core::ClientOptions::default().user_agent;
        assert_eq!(
            format!(
                "{}/{}",
                v["client_sdk"]["name"].as_str().unwrap(),
                v["client_sdk"]["version"].as_str().unwrap()
            ),
            agent
        );
        assert_eq!(v["client_sdk"]["name"], "sentry.rust");
        assert_ne!(v["client_sdk"]["version"], env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn splits_oversize_chunks_by_time_without_losing_samples() {
        let samples: Vec<_> = (0..400u64)
            .map(|i| {
                (
                    i * 10_000_000,
                    (i % 2) as i32 + 1,
                    vec![0x1000 + i, 0x2000 + i, 0x3000],
                )
            })
            .collect();
        let c = chunk_with(&samples);
        let m = meta();
        let out = encode_chunk_limited(&m, &c, &ModuleSet::default(), None, &by_tid, 8 * 1024);
        assert!(out.len() > 2, "split into {} pieces", out.len());
        assert_eq!(out.iter().map(|p| p.samples).sum::<usize>(), 400);
        let ids: std::collections::HashSet<_> = out.iter().map(|p| p.chunk_id.clone()).collect();
        assert_eq!(ids.len(), out.len(), "each piece has its own chunk_id");
        for w in out.windows(2) {
            assert!(w[0].span_ns.1 <= w[1].span_ns.0, "pieces are in time order");
        }
        for p in &out {
            assert!(p.json.len() <= 8 * 1024, "{} bytes", p.json.len());
            let v: serde_json::Value = serde_json::from_slice(&p.json).unwrap();
            assert_eq!(v["profiler_id"], m.profiler_id.as_str());
        }
    }

    // Reads this process's modules through the unwinder, which exists only
    // where profiling is supported.
    #[cfg(profiling_supported)]
    mod fuzz {
        use std::collections::{BTreeMap, HashSet};
        use std::sync::{Arc, Mutex, OnceLock};

        use proptest::prelude::*;
        use serde_json::Value;

        use super::super::{ChunkMeta, encode_chunk, new_id};
        use super::by_tid;
        use crate::chunk::Chunk;
        use crate::frames::SUSPENDED_ADDRESS;
        use crate::frames::{SUSPENDED_FRAME, SUSPENDED_FUNCTION};
        use crate::sampler::Sample;
        use crate::symbolize::Symbolizer;
        use crate::unwind::ModuleSet;
        use crate::unwind::debug_id_from_build_id;

        /// The modules of this test process, read once.
        fn modules() -> Arc<ModuleSet> {
            static MODULES: OnceLock<Arc<ModuleSet>> = OnceLock::new();
            Arc::clone(MODULES.get_or_init(|| {
                let shared = Arc::new(arc_swap::ArcSwap::from_pointee(ModuleSet::default()));
                let _unwinder = crate::unwind::StackUnwinder::new(Arc::clone(&shared));
                shared.load_full()
            }))
        }

        /// Addresses of functions in this binary, for frames that symbolize.
        fn code_addresses() -> [u64; 4] {
            [
                encode_chunk as *const () as usize as u64,
                new_id as *const () as usize as u64,
                debug_id_from_build_id as *const () as usize as u64,
                modules as *const () as usize as u64,
            ]
        }

        #[derive(Debug, Clone)]
        enum FrameChoice {
            /// A function of this binary, at an offset into it.
            Code(usize, u64),
            /// Any address (almost always outside every module).
            Any(u64),
            /// A suspended lane's marker frame.
            Suspended,
        }

        fn frame() -> impl Strategy<Value = FrameChoice> {
            prop_oneof![
                4 => (0usize..4, 0u64..16).prop_map(|(f, o)| FrameChoice::Code(f, o)),
                4 => any::<u64>().prop_map(FrameChoice::Any),
                1 => Just(FrameChoice::Suspended),
            ]
        }

        fn thread_name() -> impl Strategy<Value = String> {
            prop_oneof![
                any::<String>(),
                Just(String::new()),
                Just("quote\" back\\slash \n\t\r \u{0} \u{7f} \u{2028}".to_owned()),
                Just("🦀 ünïcødé 線程 \u{fffd}".to_owned()),
                "[\\x00-\\x1f\"\\\\]{1,8}",
            ]
        }

        /// (thread index, nanoseconds into the chunk, frames)
        type Spec = (usize, u64, Vec<FrameChoice>);

        fn samples() -> impl Strategy<Value = (Vec<String>, Vec<Spec>)> {
            proptest::collection::vec(thread_name(), 1..6).prop_flat_map(|names| {
                let n = names.len();
                let sample = (
                    0..n,
                    0u64..60_000_000_000,
                    proptest::collection::vec(frame(), 0..8),
                );
                (Just(names), proptest::collection::vec(sample, 0..60))
            })
        }

        const BASE_NS: u64 = 1_700_000_000_000_000_000;

        fn address(f: &FrameChoice) -> u64 {
            match f {
                FrameChoice::Code(i, off) => code_addresses()[*i] + off,
                FrameChoice::Any(a) => *a,
                FrameChoice::Suspended => SUSPENDED_FRAME,
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(200))]

            #[test]
            fn encodes_valid_v2_chunks((names, specs) in samples(), symbolize in any::<bool>()) {
                let modules = modules();
                let mut chunk = Chunk::new();
                for (t, offset, frames) in &specs {
                    let addrs: Vec<u64> = frames.iter().map(address).collect();
                    chunk.push(&Sample::new(
                        BASE_NS + offset,
                        1000 + *t as i32,
                        Arc::from(names[*t].as_str()),
                        Arc::from(&addrs[..]),
                        0,
                        false,
                    ));
                }
                let meta = ChunkMeta {
                    profiler_id: new_id(),
                    release: "app@1.0.0".into(),
                    environment: Some("prop\"test".into()),
                };
                // One symbolizer for every case: it reads symbol tables once.
                static SYMBOLIZER: Mutex<Option<Symbolizer>> = Mutex::new(None);
                let mut symbolizer = SYMBOLIZER.lock().unwrap();
                let pieces = encode_chunk(
                    &meta,
                    &chunk,
                    &modules,
                    symbolize.then(|| symbolizer.get_or_insert_with(Symbolizer::new)),
                    &by_tid,
                );
                drop(symbolizer);

                // Which samples Relay keeps: threads with two or more
                // samples with a non-empty stack.
                let mut non_empty: BTreeMap<usize, usize> = BTreeMap::new();
                for (t, _, frames) in &specs {
                    *non_empty.entry(*t).or_default() += usize::from(!frames.is_empty());
                }
                let kept: Vec<&Spec> = specs.iter().filter(|(t, _, _)| non_empty[t] >= 2).collect();
                prop_assert_eq!(pieces.len(), usize::from(!kept.is_empty()));
                let Some(piece) = pieces.first() else { return Ok(()); };
                prop_assert_eq!(piece.samples, kept.len());
                prop_assert_eq!(piece.dropped_single, specs.len() - kept.len());

                let v: Value = serde_json::from_slice(&piece.json).expect("valid JSON");
                prop_assert_eq!(&v["version"], "2");
                prop_assert_eq!(v["profiler_id"].as_str(), Some(meta.profiler_id.as_str()));
                prop_assert_eq!(v["chunk_id"].as_str(), Some(piece.chunk_id.as_str()));
                prop_assert_eq!(&v["environment"], "prop\"test");
                let is_id = |s: &str| s.len() == 32 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
                prop_assert!(is_id(&piece.chunk_id));
                let p = &v["profile"];
                let samples = p["samples"].as_array().unwrap();
                let stacks = p["stacks"].as_array().unwrap();
                let frames = p["frames"].as_array().unwrap();
                prop_assert_eq!(samples.len(), kept.len());

                // Time order, and the same (thread, time, stack) multiset.
                let mut got = Vec::new();
                let mut last = f64::MIN;
                for s in samples {
                    let ts = s["timestamp"].as_f64().unwrap();
                    prop_assert!(ts >= last, "timestamps out of order");
                    last = ts;
                    let stack = &stacks[s["stack_id"].as_u64().unwrap() as usize];
                    let mut addrs = Vec::new();
                    for f in stack.as_array().unwrap() {
                        let f = &frames[f.as_u64().unwrap() as usize];
                        // Every frame has a hex address; the synthetic one's
                        // lies below every mapping and is not in-app.
                        let a = f["instruction_addr"].as_str().expect("every frame has instruction_addr");
                        let addr = u64::from_str_radix(a.strip_prefix("0x").unwrap(), 16).unwrap();
                        if f["function"].as_str() == Some(SUSPENDED_FUNCTION) && f["in_app"] == false {
                            prop_assert_eq!(addr, SUSPENDED_ADDRESS);
                            addrs.push(SUSPENDED_FRAME);
                        } else {
                            prop_assert!(f.get("in_app").is_none());
                            addrs.push(addr);
                        }
                    }
                    got.push((s["thread_id"].as_str().unwrap().to_owned(), addrs, (ts * 1e6).round() as u64));
                }
                let mut want: Vec<_> = kept
                    .iter()
                    .map(|(t, off, fr)| {
                        let ts = (BASE_NS + off) as f64 / 1e9;
                        ((1000 + t).to_string(), fr.iter().map(address).collect::<Vec<_>>(), (ts * 1e6).round() as u64)
                    })
                    .collect();
                got.sort();
                want.sort();
                prop_assert_eq!(got.len(), want.len());
                for (g, w) in got.iter().zip(&want) {
                    // JSON number parsing may be one ulp off: a microsecond
                    // of slack.
                    prop_assert!(g.0 == w.0 && g.1 == w.1 && g.2.abs_diff(w.2) <= 1, "{:?} != {:?}", g, w);
                }

                // Thread metadata: exactly the threads with samples, names
                // round-tripped through JSON escaping.
                let used: HashSet<&str> = samples.iter().map(|s| s["thread_id"].as_str().unwrap()).collect();
                let meta_threads = p["thread_metadata"].as_object().unwrap();
                prop_assert_eq!(meta_threads.keys().map(String::as_str).collect::<HashSet<_>>(), used);
                for (tid, m) in meta_threads {
                    let t = tid.parse::<usize>().unwrap() - 1000;
                    prop_assert_eq!(m["name"].as_str(), Some(names[t].as_str()));
                }

                // Frames: hex addresses; symbolized functions for this
                // binary's code when asked; debug images for exactly the
                // modules the frames fall in.
                let mut wanted_images = HashSet::new();
                for f in frames {
                    if f.get("in_app").is_some() {
                        continue;
                    }
                    let a = f["instruction_addr"].as_str().unwrap();
                    let addr = u64::from_str_radix(a.trim_start_matches("0x"), 16).unwrap();
                    if let Some(m) = modules.find(addr) {
                        wanted_images.insert(m.path.clone());
                    }
                    if code_addresses().contains(&addr) {
                        prop_assert_eq!(f["function"].is_string(), symbolize, "frame {}", f);
                    }
                    if !symbolize {
                        prop_assert!(f.get("function").is_none_or(Value::is_null));
                    }
                }
                let images: HashSet<String> = v["debug_meta"]["images"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|i| i["code_file"].as_str().unwrap().to_owned())
                    .collect();
                prop_assert_eq!(images, wanted_images);
            }
        }
    }
}
