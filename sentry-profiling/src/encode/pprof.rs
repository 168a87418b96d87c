//! pprof's `profile.proto`, gzipped, for `go tool pprof`, Pyroscope and
//! Grafana.
//!
//! The message types are declared here with `prost`'s derive (the schema is
//! small and has been stable for years) rather than taken from the `pprof`
//! crate, whose types come with its whole sampler, unwinder and demangler as
//! dependencies.
//!
//! Samples are aggregated by (stack, labels); each carries the labels
//! Grafana's span profiles use: `span_id`, `span_name`, `trace_id`, plus
//! `thread_id` and `thread_name`. Mappings carry the file name and GNU
//! build-id, so `go tool pprof` can symbolise from the binary; functions
//! resolved in-process are included too.

use rustc_hash::FxHashMap as HashMap;
use std::io::Write;

use super::view::ProfileView;

/// `profile.proto`'s `Profile`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    /// Sample value types.
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    /// Samples.
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    /// Mappings.
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    /// Locations.
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    /// Functions.
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    /// String table; entry 0 is "".
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    /// Collection start, ns since the epoch.
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    /// Collection duration, ns.
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    /// The period's type.
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    /// Sampling period.
    #[prost(int64, tag = "12")]
    pub period: i64,
}

/// `ValueType`.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct ValueType {
    /// String index of the type.
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    /// String index of the unit.
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// `Sample`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Sample {
    /// Location ids, leaf first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    /// One value per sample type.
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    /// Labels.
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// `Label`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct Label {
    /// String index of the key.
    #[prost(int64, tag = "1")]
    pub key: i64,
    /// String index of the value.
    #[prost(int64, tag = "2")]
    pub str: i64,
    /// Numeric value.
    #[prost(int64, tag = "3")]
    pub num: i64,
}

/// `Mapping`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Mapping {
    /// Id (1-based).
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Start of the mapped range.
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    /// End of the mapped range.
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    /// File offset of `memory_start`.
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    /// String index of the file name.
    #[prost(int64, tag = "5")]
    pub filename: i64,
    /// String index of the build-id (hex).
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    /// Whether locations in it carry function names.
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
}

/// `Location`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Location {
    /// Id (1-based).
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Mapping id, 0 if none.
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    /// Code address.
    #[prost(uint64, tag = "3")]
    pub address: u64,
    /// Function(s) at the address.
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

/// `Line`.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Line {
    /// Function id.
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    /// Line number, 0 if unknown.
    #[prost(int64, tag = "2")]
    pub line: i64,
}

/// `Function`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Function {
    /// Id (1-based).
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// String index of the (demangled) name.
    #[prost(int64, tag = "2")]
    pub name: i64,
    /// String index of the system name.
    #[prost(int64, tag = "3")]
    pub system_name: i64,
}

/// Most distinct (stack, labels) combinations kept; more are dropped and
/// counted in [`PprofBuilder::dropped`].
pub(crate) const MAX_PPROF_SAMPLES: usize = 1_000_000;

/// Builds one pprof profile from chunks (the file export gives it one).
#[derive(Debug, Default)]
pub(crate) struct PprofBuilder {
    strings: Vec<String>,
    string_index: HashMap<String, i64>,
    mappings: Vec<Mapping>,
    mapping_index: HashMap<u64, u64>,
    locations: Vec<Location>,
    location_index: HashMap<(u64, Option<String>), u64>,
    functions: Vec<Function>,
    function_index: HashMap<String, u64>,
    samples: Vec<Sample>,
    sample_index: HashMap<(Vec<u64>, Vec<Label>), usize>,
    first_ns: Option<u64>,
    last_ns: u64,
    period_ns: u64,
    dropped: u64,
}

impl PprofBuilder {
    /// An empty profile.
    pub(crate) fn new() -> Self {
        let mut b = Self::default();
        b.string("");
        b
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.string_index.get(s) {
            return i;
        }
        let i = self.strings.len() as i64;
        self.strings.push(s.to_owned());
        self.string_index.insert(s.to_owned(), i);
        i
    }

    fn function(&mut self, name: &str) -> u64 {
        if let Some(&id) = self.function_index.get(name) {
            return id;
        }
        let id = self.functions.len() as u64 + 1;
        let n = self.string(name);
        self.functions.push(Function {
            id,
            name: n,
            system_name: n,
        });
        self.function_index.insert(name.to_owned(), id);
        id
    }

    fn mapping_for(&mut self, m: &crate::unwind::ModuleInfo) -> u64 {
        if let Some(&id) = self.mapping_index.get(&m.start) {
            return id;
        }
        let id = self.mappings.len() as u64 + 1;
        let filename = self.string(&m.path);
        let build_id = self.string(&m.code_id().unwrap_or_default());
        self.mappings.push(Mapping {
            id,
            memory_start: m.start,
            memory_limit: m.end,
            file_offset: 0,
            filename,
            build_id,
            has_functions: false,
        });
        self.mapping_index.insert(m.start, id);
        id
    }

    /// Samples dropped because the profile reached [`MAX_PPROF_SAMPLES`].
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Adds a chunk's samples.
    pub(crate) fn add(&mut self, view: &ProfileView) {
        self.period_ns = view.period_ns;
        // `go tool pprof` takes the first mapping for the main binary: list
        // the executable first.
        if self.mappings.is_empty() {
            let exe = std::env::current_exe()
                .ok()
                .map(|p| p.to_string_lossy().into_owned());
            if let Some(m) = view.modules.iter().find(|m| Some(&m.path) == exe.as_ref()) {
                self.mapping_for(m);
            }
        }
        let mut mapping_ids = Vec::with_capacity(view.modules.len());
        for m in &view.modules {
            mapping_ids.push(self.mapping_for(m));
        }
        let location_ids: Vec<u64> = view
            .frames
            .iter()
            .map(|f| self.location_for(f, &mapping_ids))
            .collect();
        let keys = LabelKeys {
            thread_id: self.string("thread_id"),
            thread_name: self.string("thread_name"),
            span_id: self.string("span_id"),
            span_name: self.string("span_name"),
            trace_id: self.string("trace_id"),
            long_poll: self.string(crate::encode::view::LONG_POLL_LABEL),
            yes: self.string("true"),
        };
        for s in &view.samples {
            self.first_ns = Some(
                self.first_ns
                    .map_or(s.timestamp_ns, |f| f.min(s.timestamp_ns)),
            );
            self.last_ns = self.last_ns.max(s.timestamp_ns);
            let labels = self.labels_of(s, &keys);
            let stack: Vec<u64> = view.stacks[s.stack]
                .iter()
                .map(|&f| location_ids[f])
                .collect();
            self.count(stack, labels, view.period_ns as i64);
        }
    }

    /// The location of frame `f` (made the first time), in the mapping of
    /// its module (`mapping_ids`: the view's modules' mappings).
    fn location_for(&mut self, f: &super::view::ViewFrame, mapping_ids: &[u64]) -> u64 {
        let key = (
            f.address.unwrap_or(0),
            f.function.as_deref().map(str::to_owned),
        );
        if let Some(&id) = self.location_index.get(&key) {
            return id;
        }
        let id = self.locations.len() as u64 + 1;
        let mapping_id = f.module.map_or(0, |m| mapping_ids[m]);
        let line = match &f.function {
            Some(name) => {
                if mapping_id != 0 {
                    self.mappings[mapping_id as usize - 1].has_functions = true;
                }
                vec![Line {
                    function_id: self.function(name),
                    line: 0,
                }]
            }
            None => Vec::new(),
        };
        self.locations.push(Location {
            id,
            mapping_id,
            address: key.0,
            line,
        });
        self.location_index.insert(key, id);
        id
    }

    /// A sample's labels: its thread, the request it is filed under, and
    /// whether it is in a long poll.
    fn labels_of(&mut self, s: &super::view::ViewSample, keys: &LabelKeys) -> Vec<Label> {
        let mut labels = Vec::with_capacity(5);
        let mut label = |key: i64, str: i64| labels.push(Label { key, str, num: 0 });
        if let Some(tid) = s.thread_id {
            label(keys.thread_id, self.string(&tid.to_string()));
        }
        if let Some(name) = &s.thread_name {
            label(keys.thread_name, self.string(name));
        }
        if let Some(link) = &s.link {
            label(keys.span_id, self.string(&link.span_id.to_string()));
            label(keys.span_name, self.string(&link.name));
            label(keys.trace_id, self.string(&link.trace_id.to_string()));
        }
        if s.long_poll {
            label(keys.long_poll, keys.yes);
        }
        labels
    }

    /// Counts one sample of `stack` with `labels`, one `period` long
    /// (a new pprof sample the first time, dropped past the cap).
    fn count(&mut self, stack: Vec<u64>, labels: Vec<Label>, period: i64) {
        match self.sample_index.get(&(stack.clone(), labels.clone())) {
            Some(&i) => {
                self.samples[i].value[0] += 1;
                self.samples[i].value[1] += period;
            }
            None if self.samples.len() >= MAX_PPROF_SAMPLES => self.dropped += 1,
            None => {
                self.sample_index
                    .insert((stack.clone(), labels.clone()), self.samples.len());
                self.samples.push(Sample {
                    location_id: stack,
                    value: vec![1, period],
                    label: labels,
                });
            }
        }
    }

    /// The profile so far.
    pub(crate) fn profile(&mut self) -> Profile {
        let samples = self.string("samples");
        let count = self.string("count");
        let wall = self.string("wall");
        let nanos = self.string("nanoseconds");
        let first = self.first_ns.unwrap_or(0);
        Profile {
            sample_type: vec![
                ValueType {
                    r#type: samples,
                    unit: count,
                },
                ValueType {
                    r#type: wall,
                    unit: nanos,
                },
            ],
            sample: self.samples.clone(),
            mapping: self.mappings.clone(),
            location: self.locations.clone(),
            function: self.functions.clone(),
            string_table: self.strings.clone(),
            time_nanos: first as i64,
            duration_nanos: self.last_ns.saturating_sub(first) as i64,
            period_type: Some(ValueType {
                r#type: wall,
                unit: nanos,
            }),
            period: self.period_ns as i64,
        }
    }

    /// The profile, protobuf-encoded and gzipped, as `go tool pprof` reads it.
    pub(crate) fn gzipped(&mut self) -> Vec<u8> {
        let bytes = prost::Message::encode_to_vec(&self.profile());
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        // Writing to a Vec cannot fail.
        let _ = gz.write_all(&bytes);
        gz.finish().unwrap_or_default()
    }
}
/// The string ids of the label keys (and the value `true`) a profile's
/// samples carry.
struct LabelKeys {
    thread_id: i64,
    thread_name: i64,
    span_id: i64,
    span_name: i64,
    trace_id: i64,
    long_poll: i64,
    yes: i64,
}
