//! OpenTelemetry profiles (OTLP, `v1development`): an
//! `ExportProfilesServiceRequest` with one shared dictionary (strings,
//! mappings, locations, functions, stacks, attributes, links; entry 0 of
//! each is the empty value), one `Link` per sampled root span, per-sample
//! timestamps and `thread.id` / `thread.name` attributes, and mappings
//! carrying `process.executable.build_id.gnu`.

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::profiles::v1development as otlp;
use opentelemetry_proto::tonic::resource::v1::Resource;

use super::view::{ProfileView, ViewFrame, ViewSample};
use crate::lanes::LaneLink;
use crate::unwind::ModuleInfo;
use sentry_core::protocol::{SpanId, TraceId};

fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len() / 2)
        .filter_map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

/// Builds the dictionary and the samples of one request.
#[derive(Debug, Default)]
struct Dictionary {
    dict: otlp::ProfilesDictionary,
    strings: HashMap<String, i32>,
    mappings: HashMap<u64, i32>,
    locations: HashMap<(u64, Option<Arc<str>>), i32>,
    functions: HashMap<Arc<str>, i32>,
    stacks: HashMap<Vec<i32>, i32>,
    attributes: HashMap<(String, String), i32>,
    links: HashMap<(TraceId, SpanId), i32>,
}

impl Dictionary {
    fn new() -> Self {
        let mut d = Self::default();
        d.dict.string_table.push(String::new());
        d.dict.mapping_table.push(otlp::Mapping::default());
        d.dict.location_table.push(otlp::Location::default());
        d.dict.function_table.push(otlp::Function::default());
        d.dict.link_table.push(otlp::Link::default());
        d.dict
            .attribute_table
            .push(otlp::KeyValueAndUnit::default());
        d.dict.stack_table.push(otlp::Stack::default());
        d
    }

    fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.dict.string_table.len() as i32;
        self.dict.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    fn attribute(&mut self, key: &str, value: any_value::Value) -> i32 {
        let id = (key.to_owned(), format!("{value:?}"));
        if let Some(&i) = self.attributes.get(&id) {
            return i;
        }
        let key_strindex = self.string(key);
        let i = self.dict.attribute_table.len() as i32;
        self.dict.attribute_table.push(otlp::KeyValueAndUnit {
            key_strindex,
            value: Some(AnyValue { value: Some(value) }),
            unit_strindex: 0,
        });
        self.attributes.insert(id, i);
        i
    }

    fn link(&mut self, link: &LaneLink) -> i32 {
        let key = (link.trace_id, link.span_id);
        if let Some(&i) = self.links.get(&key) {
            return i;
        }
        let i = self.dict.link_table.len() as i32;
        self.dict.link_table.push(otlp::Link {
            trace_id: hex_bytes(&link.trace_id.to_string()),
            span_id: hex_bytes(&link.span_id.to_string()),
        });
        self.links.insert(key, i);
        i
    }

    /// Adds one chunk: its modules, frames and stacks join the shared
    /// tables (each entry once), its samples go to `samples`.
    fn add(&mut self, view: &ProfileView, samples: &mut Vec<otlp::Sample>) {
        let mapping_idx: Vec<i32> = view.modules.iter().map(|m| self.mapping(m)).collect();
        let location_idx: Vec<i32> = view
            .frames
            .iter()
            .map(|f| self.location(f, &mapping_idx))
            .collect();
        let stack_idx: Vec<i32> = view
            .stacks
            .iter()
            .map(|stack| self.stack(stack.iter().map(|&f| location_idx[f]).collect()))
            .collect();
        for s in &view.samples {
            let attribute_indices = self.sample_attributes(s);
            samples.push(otlp::Sample {
                stack_index: stack_idx[s.stack],
                attribute_indices,
                link_index: s.link.as_deref().map_or(0, |l| self.link(l)),
                values: vec![1],
                timestamps_unix_nano: vec![s.timestamp_ns],
            });
        }
    }

    /// The mapping of a module (keyed by its start address), with its GNU
    /// build id when it has one.
    fn mapping(&mut self, m: &ModuleInfo) -> i32 {
        if let Some(&i) = self.mappings.get(&m.start) {
            return i;
        }
        let filename_strindex = self.string(&m.path);
        let attribute_indices = m
            .code_id()
            .map(|id| {
                vec![self.attribute(
                    "process.executable.build_id.gnu",
                    any_value::Value::StringValue(id),
                )]
            })
            .unwrap_or_default();
        let i = self.dict.mapping_table.len() as i32;
        self.dict.mapping_table.push(otlp::Mapping {
            memory_start: m.start,
            memory_limit: m.end,
            file_offset: 0,
            filename_strindex,
            attribute_indices,
        });
        self.mappings.insert(m.start, i);
        i
    }

    /// The location of a frame (keyed by address and function), with one
    /// line naming its function when it is symbolised.
    fn location(&mut self, f: &ViewFrame, mapping_idx: &[i32]) -> i32 {
        let key = (f.address.unwrap_or(0), f.function.clone());
        if let Some(&i) = self.locations.get(&key) {
            return i;
        }
        let lines = match &f.function {
            Some(name) => vec![otlp::Line {
                function_index: self.function(name),
                line: 0,
                column: 0,
            }],
            None => Vec::new(),
        };
        let i = self.dict.location_table.len() as i32;
        self.dict.location_table.push(otlp::Location {
            mapping_index: f.module.map_or(0, |m| mapping_idx[m]),
            address: key.0,
            lines,
            attribute_indices: Vec::new(),
        });
        self.locations.insert(key, i);
        i
    }

    fn function(&mut self, name: &Arc<str>) -> i32 {
        if let Some(&i) = self.functions.get(name) {
            return i;
        }
        let name_strindex = self.string(name);
        let i = self.dict.function_table.len() as i32;
        self.dict.function_table.push(otlp::Function {
            name_strindex,
            system_name_strindex: name_strindex,
            filename_strindex: 0,
            start_line: 0,
        });
        self.functions.insert(name.clone(), i);
        i
    }

    fn stack(&mut self, location_indices: Vec<i32>) -> i32 {
        if let Some(&i) = self.stacks.get(&location_indices) {
            return i;
        }
        let i = self.dict.stack_table.len() as i32;
        self.dict.stack_table.push(otlp::Stack {
            location_indices: location_indices.clone(),
        });
        self.stacks.insert(location_indices, i);
        i
    }

    /// A sample's `thread.id`, `thread.name` and long-poll attributes.
    fn sample_attributes(&mut self, s: &ViewSample) -> Vec<i32> {
        let mut attribute_indices = Vec::with_capacity(2);
        if let Some(tid) = s.thread_id {
            attribute_indices
                .push(self.attribute("thread.id", any_value::Value::IntValue(i64::from(tid))));
        }
        if let Some(name) = &s.thread_name {
            attribute_indices.push(self.attribute(
                "thread.name",
                any_value::Value::StringValue(name.to_string()),
            ));
        }
        if s.long_poll {
            attribute_indices.push(self.attribute(
                crate::encode::view::LONG_POLL_LABEL,
                any_value::Value::BoolValue(true),
            ));
        }
        attribute_indices
    }
}

/// Encodes chunks as one OTLP profiles export request (protobuf).
pub(crate) fn export_request(
    views: &[ProfileView],
    service_name: &str,
) -> ExportProfilesServiceRequest {
    let mut dict = Dictionary::new();
    let mut samples = Vec::new();
    for v in views {
        dict.add(v, &mut samples);
    }
    let first = views
        .iter()
        .filter_map(ProfileView::span_ns)
        .map(|s| s.0)
        .min()
        .unwrap_or(0);
    let last = views
        .iter()
        .filter_map(ProfileView::span_ns)
        .map(|s| s.1)
        .max()
        .unwrap_or(0);
    let period = views.first().map_or(0, |v| v.period_ns) as i64;
    let wall = dict.string("wall");
    let nanos = dict.string("nanoseconds");
    let samples_type = dict.string("samples");
    let count = dict.string("count");
    let profile = otlp::Profile {
        sample_type: Some(otlp::ValueType {
            type_strindex: samples_type,
            unit_strindex: count,
        }),
        samples,
        time_unix_nano: first,
        duration_nano: last.saturating_sub(first),
        period_type: Some(otlp::ValueType {
            type_strindex: wall,
            unit_strindex: nanos,
        }),
        period,
        profile_id: rand::random::<[u8; 16]>().to_vec(),
        ..Default::default()
    };
    ExportProfilesServiceRequest {
        resource_profiles: vec![otlp::ResourceProfiles {
            resource: Some(Resource {
                attributes: vec![KeyValue {
                    key: "service.name".into(),
                    key_strindex: 0,
                    value: Some(AnyValue {
                        value: Some(any_value::Value::StringValue(service_name.to_owned())),
                    }),
                }],
                ..Default::default()
            }),
            scope_profiles: vec![otlp::ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "sentry-profiling".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                profiles: vec![profile],
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
        dictionary: Some(dict.dict),
    }
}
