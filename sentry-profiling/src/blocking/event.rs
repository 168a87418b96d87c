//! The issue event of a closed window (see [`super::windows`]): Sentry's
//! event payload for a blocking poll.
//!
//! - `level` warning; `message` the title (`Tokio worker blocked for
//!   142 ms in stats_crunch`), which Sentry shows as the title;
//! - `threads`: one thread, the worker that blocked, marked `current`,
//!   with the blocked stack as its `stacktrace` (root first, as the
//!   threads interface wants): each frame its `instruction_addr` (hex) and
//!   the `function` the profiler resolved, synthetic frames at their
//!   addresses below every mapping, `in_app: false`; and `debug_meta` with
//!   the debug images those frames lie in, as a chunk carries them, so
//!   Symbolicator treats the event like any native one;
//! - `culprit`: the innermost application frame; `fingerprint`:
//!   `["tokio-blocking-poll", culprit, kind]`, so each blocking site and
//!   way of blocking is one issue;
//! - `transaction` and tags `transaction`, `route` (the path of an HTTP
//!   transaction's `METHOD /route` name), `blocking.kind`;
//! - `contexts.trace`: the request's trace and its transaction's span, so
//!   the event sits on its trace beside the transaction;
//!   `contexts.profile.profiler_id` and `contexts.blocking_poll`: the
//!   worst poll's duration, start, end and thread, the window's count,
//!   worst and median, and the profile's time range to open.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use sentry_core::protocol::{
    Context, DebugImage, DebugMeta, Event, Frame, Level, Map, Stacktrace, SymbolicDebugImage,
    Thread, ThreadId, TraceContext, Value, Values,
};

use super::classify::{Names, in_app, short_name};
use super::windows::Closed;
use crate::frames::synthetic_frame;
use crate::unwind::ModuleSet;

/// The first element of every blocking-poll event's fingerprint.
pub(crate) const FINGERPRINT_TAG: &str = "tokio-blocking-poll";

/// What the event says beyond the window: the session's profiler id
/// (`None` when no continuous profile is sent), and the blocking interval.
pub(crate) struct EventContext<'a> {
    pub(crate) profiler_id: Option<&'a str>,
    pub(crate) interval: Duration,
}

fn ms(ns: u64) -> f64 {
    (ns as f64 / 1e6 * 1_000.0).round() / 1_000.0
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// The event of `closed`.
pub(crate) fn build(
    closed: &Closed,
    ctx: &EventContext<'_>,
    modules: &ModuleSet,
    names: &mut dyn Names,
) -> Event<'static> {
    let worst = &closed.worst;
    let poll = &worst.poll;
    let verdict = &worst.verdict;
    let culprit = verdict.culprit.to_string();
    let title = format!(
        "Tokio worker blocked for {} ms in {}",
        (closed.worst_ns as f64 / 1e6).round() as u64,
        short_name(&culprit)
    );
    let (frames, images) = frames_and_images(&verdict.stack, modules, names);
    let thread = Thread {
        id: Some(ThreadId::Int(u64::from(poll.tid))),
        name: worst.thread_name.as_deref().map(str::to_owned),
        stacktrace: (!frames.is_empty()).then(|| Stacktrace {
            frames,
            ..Default::default()
        }),
        current: true,
        ..Default::default()
    };
    let name = poll.link.name.to_string();
    let mut tags = BTreeMap::new();
    tags.insert("blocking.kind".to_owned(), verdict.kind.label());
    if !name.is_empty() {
        tags.insert("transaction".to_owned(), name.clone());
        if let Some((_, route)) = name.split_once(' ').filter(|(_, r)| r.starts_with('/')) {
            tags.insert("route".to_owned(), route.to_owned());
        }
    }
    let mut contexts = BTreeMap::new();
    contexts.insert(
        "trace".to_owned(),
        Context::Trace(Box::new(TraceContext {
            trace_id: poll.link.trace_id,
            span_id: poll.link.span_id,
            op: Some("http.server".to_owned()).filter(|_| tags.contains_key("route")),
            ..Default::default()
        })),
    );
    let mut blocking = Map::new();
    let mut put = |k: &str, v: Value| {
        blocking.insert(k.to_owned(), v);
    };
    put("type", Value::from("blocking_poll"));
    put("kind", Value::from(verdict.kind.label()));
    put("blocked", Value::from(verdict.kind.phrase()));
    put("duration_ms", Value::from(ms(poll.duration_ns())));
    put("start", Value::from(secs(poll.start_ns)));
    put("end", Value::from(secs(poll.end_ns)));
    put("thread_id", Value::from(poll.tid));
    if let Some(n) = &worst.thread_name {
        put("thread_name", Value::from(&**n));
    }
    put("count", Value::from(closed.count));
    if closed.kinds.len() > 1 {
        // Some of the site's polls were read as another kind.
        let kinds: serde_json::Map<String, Value> = closed
            .kinds
            .iter()
            .map(|(label, n)| (label.clone(), Value::from(*n)))
            .collect();
        put("kinds", Value::Object(kinds));
    }
    put("worst_ms", Value::from(ms(closed.worst_ns)));
    put("median_ms", Value::from(ms(closed.median_ns)));
    put("interval_s", Value::from(ctx.interval.as_secs_f64()));
    if let Some(id) = ctx.profiler_id {
        put("profiler_id", Value::from(id));
        put("profile_start", Value::from(secs(poll.start_ns)));
        put("profile_end", Value::from(secs(poll.end_ns)));
        let mut profile = Map::new();
        profile.insert("type".into(), Value::from("profile"));
        profile.insert("profiler_id".into(), Value::from(id));
        contexts.insert("profile".to_owned(), Context::Other(profile));
    }
    contexts.insert("blocking_poll".to_owned(), Context::Other(blocking));
    Event {
        level: Level::Warning,
        message: Some(title),
        logger: Some("sentry_profiling".to_owned()),
        fingerprint: Cow::Owned(vec![
            Cow::Borrowed(FINGERPRINT_TAG),
            Cow::Owned(culprit.clone()),
            Cow::Owned(verdict.kind.label()),
        ]),
        culprit: Some(culprit),
        transaction: (!name.is_empty()).then_some(name),
        platform: Cow::Borrowed("native"),
        timestamp: UNIX_EPOCH + Duration::from_nanos(poll.end_ns),
        threads: Values {
            values: vec![thread],
        },
        tags,
        contexts,
        debug_meta: Cow::Owned(DebugMeta {
            images,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The stack's frames, root first, and the debug images they lie in.
fn frames_and_images(
    stack: &[u64],
    modules: &ModuleSet,
    names: &mut dyn Names,
) -> (Vec<Frame>, Vec<DebugImage>) {
    let mut images: Vec<DebugImage> = Vec::new();
    let mut seen: Vec<u64> = Vec::new();
    let mut frames = Vec::with_capacity(stack.len());
    for &addr in stack.iter().rev() {
        if let Some((out, function)) = synthetic_frame(addr) {
            frames.push(Frame {
                instruction_addr: Some(out.into()),
                function: Some(function.to_owned()),
                in_app: Some(false),
                ..Default::default()
            });
            continue;
        }
        let module = modules.find(addr);
        if let Some(m) = module
            && !seen.contains(&m.start)
        {
            seen.push(m.start);
            if let Some(image) = debug_image(m) {
                images.push(image);
            }
        }
        let function = names.function(addr);
        let app = function
            .as_deref()
            .map(|f| in_app(f, module.map(|m| m.path.as_str())));
        frames.push(Frame {
            instruction_addr: Some(addr.into()),
            function: function.map(|f| f.to_string()),
            package: module.map(|m| m.path.clone()),
            in_app: app,
            ..Default::default()
        });
    }
    (frames, images)
}

/// The `debug_meta` image of a module (`None` without a debug id, which
/// Sentry requires of a native image).
fn debug_image(m: &crate::unwind::ModuleInfo) -> Option<DebugImage> {
    let id = m.debug_id()?.parse().ok()?;
    Some(DebugImage::Symbolic(SymbolicDebugImage {
        name: m.path.clone(),
        arch: Some(crate::encode::sentry_chunk::ARCH.to_owned()),
        image_addr: m.start.into(),
        image_size: m.end.saturating_sub(m.start),
        image_vmaddr: m.vmaddr.into(),
        id,
        code_id: m.code_id().and_then(|c| c.parse().ok()),
        debug_file: None,
    }))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::BlockingPoll;
    use super::super::classify::{Kind, Verdict};
    use super::super::windows::Occurrence;
    use super::*;
    use crate::lanes::LaneLink;

    struct NoNames;

    impl Names for NoNames {
        fn function(&mut self, addr: u64) -> Option<Arc<str>> {
            (addr == 0x5000).then(|| Arc::from("my_service::items::stats_crunch"))
        }
        fn module(&self, _: u64) -> Option<&str> {
            None
        }
    }

    #[test]
    fn the_event_says_what_blocked_where_and_links_its_request() {
        let link = LaneLink {
            name: Arc::from("GET /items/{id}/stats"),
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".parse().unwrap(),
            span_id: "00f067aa0ba902b7".parse().unwrap(),
        };
        let closed = Closed {
            count: 7,
            kinds: vec![(Kind::Cpu.label(), 7)],
            worst_ns: 142_400_000,
            median_ns: 120_000_000,
            worst: Occurrence {
                poll: BlockingPoll {
                    lane: 1,
                    tid: 42,
                    start_ns: 1_700_000_000_000_000_000,
                    end_ns: 1_700_000_000_142_400_000,
                    link: Arc::new(link),
                },
                verdict: Verdict {
                    kind: Kind::Cpu,
                    culprit: Arc::from("my_service::items::stats_crunch"),
                    stack: Arc::from(&[0x5000, crate::frames::UNWOUND_NO_FURTHER_FRAME][..]),
                },
                thread_name: Some(Arc::from("tokio-runtime-worker")),
            },
        };
        let ctx = EventContext {
            profiler_id: Some("0123456789abcdef0123456789abcdef"),
            interval: Duration::from_secs(60),
        };
        let event = build(&closed, &ctx, &ModuleSet::default(), &mut NoNames);
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["level"], "warning");
        assert_eq!(
            json["message"],
            "Tokio worker blocked for 142 ms in stats_crunch"
        );
        assert_eq!(json["culprit"], "my_service::items::stats_crunch");
        assert_eq!(
            json["fingerprint"],
            serde_json::json!([FINGERPRINT_TAG, "my_service::items::stats_crunch", "cpu"])
        );
        assert_eq!(json["transaction"], "GET /items/{id}/stats");
        assert_eq!(json["tags"]["route"], "/items/{id}/stats");
        assert_eq!(json["tags"]["blocking.kind"], "cpu");
        assert_eq!(
            json["contexts"]["trace"]["trace_id"],
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(json["contexts"]["trace"]["span_id"], "00f067aa0ba902b7");
        assert_eq!(
            json["contexts"]["profile"]["profiler_id"],
            "0123456789abcdef0123456789abcdef"
        );
        let b = &json["contexts"]["blocking_poll"];
        assert_eq!(b["count"], 7);
        assert_eq!(b["worst_ms"], 142.4);
        assert_eq!(b["median_ms"], 120.0);
        assert_eq!(b["thread_id"], 42);
        let thread = &json["threads"]["values"][0];
        assert_eq!(thread["current"], true);
        let frames = thread["stacktrace"]["frames"].as_array().unwrap();
        // Root first: the synthetic end of the stack, then the leaf.
        assert_eq!(frames[0]["instruction_addr"], "0x6");
        assert_eq!(frames[0]["in_app"], false);
        assert_eq!(frames[1]["instruction_addr"], "0x5000");
        assert_eq!(frames[1]["function"], "my_service::items::stats_crunch");
        assert_eq!(frames[1]["in_app"], true);
    }
}
