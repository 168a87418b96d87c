//! Writing a transaction's JSON with what links it to its profile, in the
//! one pass serde makes over the SDK's typed transaction: a `profile`
//! context first among its contexts, and its lane's `thread.id` and
//! `thread.name` first in its trace context's data. The bytes written are
//! neither searched nor moved, and nothing is allocated.
//!
//! They go where the structure says, not where some bytes look like it:
//! a `"contexts"`, `"trace"` or `"data"` key elsewhere (in `extra`, a
//! span's data, inside another context, a request header) does not draw
//! them.

use std::io::{self, Write};

use serde::Serialize;
use serde_json::ser::{CharEscape, CompactFormatter, Formatter};

/// The keys from the transaction down to the trace context's data: the
/// object each opens is one deeper on the path.
const PATH: [&[u8]; 3] = [b"contexts", b"trace", b"data"];

/// Depths (objects open) of the objects on [`PATH`]: the transaction is 1.
const CONTEXTS: u32 = 2;
const TRACE: u32 = 3;
const DATA: u32 = 4;

/// What to add to a transaction's JSON.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Additions<'a> {
    /// The `profiler_id` of a `profile` context.
    pub(crate) profiler_id: Option<&'a str>,
    /// A lane's id and name, as the trace context's `thread.id` and
    /// `thread.name`. The caller checks that `contexts.trace` is a trace
    /// context whose data has neither already
    /// (`transaction_tags::lane_writable`): the formatter sees keys, not
    /// types.
    pub(crate) lane: Option<(u64, &'a str)>,
}

/// What [`write_with`] wrote of its [`Additions`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Added {
    /// The `profile` context (the transaction had contexts).
    pub(crate) profile: bool,
    /// The lane (it had a trace context).
    pub(crate) lane: bool,
}

/// Serialises `value` (a struct, the SDK's transaction) into `out` as
/// serde_json's compact writer does, with `additions` written into it.
pub(crate) fn write_with<T: Serialize + ?Sized>(
    out: &mut Vec<u8>,
    value: &T,
    additions: Additions<'_>,
) -> io::Result<Added> {
    let mut added = Added::default();
    let formatter = Adding {
        additions,
        added: &mut added,
        depth: 0,
        path: 0,
        in_key: false,
        key_len: 0,
        key_matches: false,
        armed: false,
        comma_due: false,
    };
    let mut serializer = serde_json::Serializer::with_formatter(&mut *out, formatter);
    value.serialize(&mut serializer).map_err(io::Error::from)?;
    Ok(added)
}

/// serde_json's compact formatting, which follows [`PATH`] and writes the
/// additions as the objects on it open (or, for a trace context without
/// data, as it closes).
struct Adding<'a> {
    additions: Additions<'a>,
    added: &'a mut Added,
    /// Objects and arrays open.
    depth: u32,
    /// The depth of the innermost object on [`PATH`] open (0: none yet).
    path: u32,
    /// A key of that object is being written.
    in_key: bool,
    /// Bytes of it so far.
    key_len: usize,
    /// Whether they are the start of the path's next key.
    key_matches: bool,
    /// The key just written is the path's next: the object opened next is
    /// its value.
    armed: bool,
    /// Something was written first into the object just opened: its own
    /// first key needs a comma before it.
    comma_due: bool,
}

impl Adding<'_> {
    /// The key of the path's next object, while something is still to be
    /// written below the innermost one open.
    fn next_key(&self) -> Option<&'static [u8]> {
        let pending = match self.path {
            1 => self.additions.profiler_id.is_some() || self.additions.lane.is_some(),
            _ => self.additions.lane.is_some() && !self.added.lane,
        };
        let key = PATH.get(self.path.checked_sub(1)? as usize)?;
        pending.then_some(*key)
    }

    fn write_profile<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        let Some(id) = self.additions.profiler_id else {
            return Ok(());
        };
        writer.write_all(b"\"profile\":{\"type\":\"profile\",\"profiler_id\":")?;
        serde_json::to_writer(&mut *writer, id)?;
        writer.write_all(b"}")?;
        self.added.profile = true;
        self.comma_due = true;
        Ok(())
    }

    fn write_lane<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        let Some((id, name)) = self.additions.lane.filter(|_| !self.added.lane) else {
            return Ok(());
        };
        writer.write_all(b"\"thread.id\":\"")?;
        writer.write_all(itoa::Buffer::new().format(id).as_bytes())?;
        writer.write_all(b"\",\"thread.name\":")?;
        serde_json::to_writer(&mut *writer, name)?;
        self.added.lane = true;
        Ok(())
    }
}

impl Formatter for Adding<'_> {
    fn begin_object<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.depth += 1;
        writer.write_all(b"{")?;
        if self.depth == 1 && self.path == 0 {
            self.path = 1;
        } else if std::mem::take(&mut self.armed) {
            self.path = self.depth;
            match self.depth {
                CONTEXTS => self.write_profile(writer)?,
                DATA => {
                    self.write_lane(writer)?;
                    self.comma_due = self.added.lane;
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn end_object<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        if self.depth == self.path {
            if self.path == TRACE && self.additions.lane.is_some() && !self.added.lane {
                // A trace context without data: the lane is all of it.
                writer.write_all(b",\"data\":{")?;
                self.write_lane(writer)?;
                writer.write_all(b"}")?;
            }
            self.path -= 1;
        }
        self.depth -= 1;
        // An object with nothing but what was added closes after it.
        self.comma_due = false;
        writer.write_all(b"}")
    }

    fn begin_array<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.depth += 1;
        writer.write_all(b"[")
    }

    fn end_array<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.depth -= 1;
        writer.write_all(b"]")
    }

    fn begin_object_key<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if std::mem::take(&mut self.comma_due) || !first {
            writer.write_all(b",")?;
        }
        if self.depth == self.path && self.next_key().is_some() {
            self.in_key = true;
            self.key_len = 0;
            self.key_matches = true;
        }
        Ok(())
    }

    fn write_string_fragment<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        if self.in_key {
            let key = self.next_key().unwrap_or_default();
            let rest = key.get(self.key_len..).unwrap_or_default();
            self.key_matches &= rest.starts_with(fragment.as_bytes());
            self.key_len += fragment.len();
        }
        writer.write_all(fragment.as_bytes())
    }

    fn write_char_escape<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        char_escape: CharEscape,
    ) -> io::Result<()> {
        // No key on the path has anything to escape.
        self.key_matches &= !self.in_key;
        CompactFormatter.write_char_escape(writer, char_escape)
    }

    fn end_object_key<W: ?Sized + Write>(&mut self, _writer: &mut W) -> io::Result<()> {
        if std::mem::take(&mut self.in_key) {
            let len = self.next_key().map_or(usize::MAX, <[u8]>::len);
            self.armed = self.key_matches && self.key_len == len;
        }
        Ok(())
    }

    fn end_object_value<W: ?Sized + Write>(&mut self, _writer: &mut W) -> io::Result<()> {
        // A key on the path whose value was not an object takes nothing.
        if self.depth == self.path {
            self.armed = false;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sentry_core::protocol::{Context, Map, Request, Span, TraceContext, Transaction, Value};

    const ID: &str = "0123456789abcdef0123456789abcdef";

    fn written(tx: &Transaction<'_>, additions: Additions<'_>) -> (Added, String) {
        let mut out = b"prefix".to_vec();
        let added = write_with(&mut out, tx, additions).unwrap();
        assert_eq!(&out[..6], b"prefix", "appended");
        (added, String::from_utf8(out[6..].to_vec()).unwrap())
    }

    /// `tx` as serde writes it, read back (so floats compare alike).
    fn plain(tx: &Transaction<'_>) -> serde_json::Value {
        serde_json::from_slice(&serde_json::to_vec(tx).unwrap()).unwrap()
    }

    /// A transaction with look-alikes of every key on the path: before
    /// the contexts (extra data, a span's data), inside them (a context
    /// named `contexts`, one with a `trace` holding `data`, the trace
    /// data's own `contexts`) and after them (a request header and body).
    fn awkward(trace_data: bool) -> Transaction<'static> {
        let look_alike = serde_json::json!({"contexts": {"trace": {"data": {}}}});
        let mut tx = Transaction::default();
        tx.extra.insert("contexts".into(), look_alike.clone());
        tx.extra.insert("trace".into(), look_alike.clone());
        tx.extra.insert("z".into(), Value::from("\"contexts\":{"));
        let mut span = Span::default();
        span.data.insert("contexts".into(), look_alike.clone());
        tx.spans.push(span);
        let mut trace = Box::<TraceContext>::default();
        if trace_data {
            trace.data.insert("contexts".into(), look_alike.clone());
            trace.data.insert("data".into(), look_alike.clone());
        }
        tx.contexts.insert("trace".into(), Context::Trace(trace));
        for (name, key) in [("contexts", "contexts"), ("a", "trace")] {
            let mut other = Map::new();
            other.insert(key.into(), look_alike.clone());
            tx.contexts.insert(name.into(), Context::Other(other));
        }
        let mut request = Request::default();
        request
            .headers
            .insert("contexts".into(), "{\"contexts\":{}}".into());
        request.data = Some("\"contexts\":{".into());
        tx.request = Some(request);
        tx
    }

    /// Each addition lands where it belongs, and only there; everything
    /// else is as serde writes it.
    #[test]
    fn additions_go_into_the_transactions_own_contexts_only() {
        let name = "GET /users/{id} \"q\"";
        for trace_data in [true, false] {
            for (profile, lane) in [(true, true), (true, false), (false, true)] {
                let tx = awkward(trace_data);
                let additions = Additions {
                    profiler_id: profile.then_some(ID),
                    lane: lane.then_some((1_000_000_042, name)),
                };
                let (added, text) = written(&tx, additions);
                assert_eq!(added, Added { profile, lane });
                let mut expected = plain(&tx);
                if profile {
                    expected["contexts"]["profile"] =
                        serde_json::json!({"type": "profile", "profiler_id": ID});
                }
                if lane {
                    let data = &mut expected["contexts"]["trace"]["data"];
                    data["thread.id"] = "1000000042".into();
                    data["thread.name"] = name.into();
                }
                let value: serde_json::Value = serde_json::from_str(&text).unwrap();
                assert_eq!(value, expected, "{text}");
                // Each written once.
                assert_eq!(
                    text.matches("\"profiler_id\"").count(),
                    usize::from(profile)
                );
                assert_eq!(text.matches("\"thread.id\"").count(), usize::from(lane));
            }
        }
    }

    /// Without contexts, or without a trace context for a lane, nothing is
    /// added and the JSON is serde's.
    #[test]
    fn with_nowhere_to_go_nothing_is_added() {
        let mut tx = Transaction::default();
        tx.extra
            .insert("contexts".into(), serde_json::json!({"trace": {}}));
        let all = Additions {
            profiler_id: Some(ID),
            lane: Some((1, "x")),
        };
        let (added, text) = written(&tx, all);
        assert_eq!(added, Added::default());
        assert_eq!(text.as_bytes(), serde_json::to_vec(&tx).unwrap());
        // A context named `trace` that is not a trace context is not one to
        // write a lane into: the transport checks the typed transaction.
        let mut other = Map::new();
        other.insert("trace".into(), serde_json::json!({"data": {}}));
        tx.contexts.insert("trace".into(), Context::Other(other));
        assert!(!crate::transaction_tags::lane_writable(&tx));
        tx.contexts
            .insert("trace".into(), Context::Trace(Box::default()));
        assert!(crate::transaction_tags::lane_writable(&tx));
    }
}
