//! Writing a transaction's JSON with members added to objects on one path
//! of keys from its top level (the `profile` context first in its
//! `contexts`, the lane's `thread.id` and `thread.name` first in its trace
//! context's `data`), in the one pass serde makes over the SDK's typed
//! transaction: the bytes written are neither searched nor moved, and
//! nothing is allocated.
//!
//! A member goes where the structure says, not where some bytes look like
//! it: a `"contexts":{` anywhere else (in `extra`, in a span's data, inside
//! the contexts themselves, in a request header) is not the transaction's
//! own.

use std::io::{self, Write};

use serde::Serialize;
use serde_json::ser::{CharEscape, CompactFormatter, Formatter};

/// The path to a transaction's trace context data: the `profile` context
/// goes into the object at its first key, the lane's keys into the one at
/// its last.
pub(crate) const TRACE_DATA: [&[u8]; 3] = [b"contexts", b"trace", b"data"];

/// Serialises `value` into `out` as serde_json's compact writer does, with
/// `members[i]` (each complete `"name":value` pairs, or nothing) written
/// first into the object that is the value of `path[..=i]`, followed from
/// the top level. Returns, for each level, whether its member was written
/// (bit `i`): a level whose object is missing (or empty, when serde skips
/// it) takes nothing.
pub(crate) fn write_with_members<T: Serialize + ?Sized>(
    out: &mut Vec<u8>,
    value: &T,
    path: &[&[u8]],
    members: &[Option<&[u8]>],
) -> io::Result<u32> {
    debug_assert!(members.len() == path.len() && path.len() < 32);
    let mut inserted = 0;
    let formatter = Inserting {
        path,
        members,
        inserted: &mut inserted,
        depth: 0,
        matched: 0,
        in_key: false,
        key_len: 0,
        key_matches: false,
        armed: false,
        comma_due: false,
    };
    let mut serializer = serde_json::Serializer::with_formatter(&mut *out, formatter);
    value.serialize(&mut serializer).map_err(io::Error::from)?;
    Ok(inserted)
}

/// serde_json's compact formatting, which follows the keys of `path` down
/// from the top level and writes each level's member when its object opens.
struct Inserting<'a> {
    path: &'a [&'a [u8]],
    members: &'a [Option<&'a [u8]>],
    inserted: &'a mut u32,
    /// Objects and arrays open: 1 inside the top-level object.
    depth: usize,
    /// How many keys of the path the open objects follow: the object at
    /// depth `matched + 1` is the value of `path[..matched]`.
    matched: usize,
    /// A key of that object is being written.
    in_key: bool,
    /// Bytes of it so far.
    key_len: usize,
    /// Whether they are the start of `path[matched]`.
    key_matches: bool,
    /// The key just written is `path[matched]`: the next object opened is
    /// its value.
    armed: bool,
    /// A member was written: the object's first key of its own needs a
    /// comma before it.
    comma_due: bool,
}

impl Formatter for Inserting<'_> {
    fn begin_object<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.depth += 1;
        writer.write_all(b"{")?;
        if std::mem::take(&mut self.armed) {
            let level = self.matched;
            self.matched += 1;
            if let Some(member) = self.members[level] {
                writer.write_all(member)?;
                *self.inserted |= 1 << level;
                self.comma_due = true;
            }
        }
        Ok(())
    }

    fn end_object<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        if self.matched > 0 && self.depth == self.matched + 1 {
            // The object that followed the path's last matched key closes.
            self.matched -= 1;
        }
        self.depth -= 1;
        // An object with nothing but the member closes after it.
        self.comma_due = false;
        writer.write_all(b"}")
    }

    fn begin_array<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        // A key of the path whose value is an array takes nothing.
        self.armed = false;
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
        if self.depth == self.matched + 1 && self.matched < self.path.len() {
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
            let key = self.path[self.matched];
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
        // No key of the path has anything to escape.
        self.key_matches &= !self.in_key;
        CompactFormatter.write_char_escape(writer, char_escape)
    }

    fn end_object_key<W: ?Sized + Write>(&mut self, _writer: &mut W) -> io::Result<()> {
        if std::mem::take(&mut self.in_key) {
            self.armed = self.key_matches && self.key_len == self.path[self.matched].len();
        }
        Ok(())
    }

    fn end_object_value<W: ?Sized + Write>(&mut self, _writer: &mut W) -> io::Result<()> {
        // A key of the path whose value was not an object takes nothing.
        self.armed = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sentry_core::protocol::{Context, Map, Request, Span, Transaction, Value};

    /// [`write_with_members`] with one `member` for the top-level
    /// `contexts` object: whether there was one to write it into.
    fn write_with_context<T: Serialize + ?Sized>(
        out: &mut Vec<u8>,
        value: &T,
        member: &[u8],
    ) -> io::Result<bool> {
        Ok(write_with_members(out, value, &TRACE_DATA[..1], &[Some(member)])? & 1 != 0)
    }

    /// `tx` written with a profile member `p` in its contexts and a lane
    /// member `thread.id` in its trace data: the levels written, the JSON.
    fn with_profile_and_lane(tx: &Transaction, p: &[u8]) -> (u32, Vec<u8>) {
        let mut out = Vec::new();
        let members = [Some(p), None, Some(&b"\"thread.id\":\"9\""[..])];
        let written = write_with_members(&mut out, tx, &TRACE_DATA, &members).unwrap();
        (written, out)
    }

    /// The lane's keys land in the trace context's own data, and the
    /// profile context in the transaction's own contexts, past look-alikes
    /// at every level: a `data` in another context and in a span, a
    /// `trace` key in `extra` and inside the trace context's data.
    #[test]
    fn members_go_down_the_path_and_nowhere_else() {
        let look_alike = serde_json::json!({"contexts": {"trace": {"data": {}}}});
        let mut tx = Transaction::default();
        tx.extra.insert("trace".into(), look_alike.clone());
        let mut span = Span::default();
        span.data.insert("data".into(), look_alike.clone());
        tx.spans.push(span);
        let mut other = Map::new();
        other.insert("data".into(), look_alike.clone());
        tx.contexts.insert("app2".into(), Context::Other(other));
        let mut trace = Box::<sentry_core::protocol::TraceContext>::default();
        trace.data.insert("a".into(), Value::from(1));
        trace.data.insert("trace".into(), look_alike.clone());
        tx.contexts.insert("trace".into(), Context::Trace(trace));

        let (written, out) = with_profile_and_lane(&tx, b"\"p\":{}");
        assert_eq!(written, 0b101);
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let mut expected: serde_json::Value =
            serde_json::from_slice(&serde_json::to_vec(&tx).unwrap()).unwrap();
        expected["contexts"]["p"] = serde_json::json!({});
        expected["contexts"]["trace"]["data"]["thread.id"] = "9".into();
        assert_eq!(value, expected);
        let text = std::str::from_utf8(&out).unwrap();
        assert_eq!(text.matches("thread.id").count(), 1, "{text}");
        assert!(
            text.contains("\"data\":{\"thread.id\":\"9\",\"a\":1,"),
            "{text}"
        );
    }

    /// A trace context without data (serde leaves it out) takes no lane,
    /// and says so; the levels above still take theirs.
    #[test]
    fn a_missing_level_takes_nothing_and_says_so() {
        let mut tx = Transaction::default();
        tx.contexts.insert(
            "trace".into(),
            Context::Trace(Box::<sentry_core::protocol::TraceContext>::default()),
        );
        let (written, out) = with_profile_and_lane(&tx, b"\"p\":1");
        assert_eq!(written, 0b001);
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value["contexts"]["p"], 1);
        assert!(!std::str::from_utf8(&out).unwrap().contains("thread.id"));
    }

    /// The member lands in the transaction's own contexts, with look-alikes
    /// before them (extra data, a span's data), inside them (a context's
    /// data, a context named `contexts`) and after them (a request header
    /// and body); everything else is written as serde writes it.
    #[test]
    fn the_member_goes_into_the_transactions_own_contexts_only() {
        let look_alike = serde_json::json!({"contexts": {"trace": {"data": {}}}});
        let mut tx = Transaction::default();
        tx.extra.insert("contexts".into(), look_alike.clone());
        tx.extra.insert("z".into(), Value::from("\"contexts\":{"));
        let mut span = Span::default();
        span.data.insert("contexts".into(), look_alike.clone());
        tx.spans.push(span);
        let mut trace = Box::<sentry_core::protocol::TraceContext>::default();
        trace.data.insert("contexts".into(), look_alike.clone());
        tx.contexts.insert("trace".into(), Context::Trace(trace));
        let mut other = Map::new();
        other.insert("contexts".into(), look_alike.clone());
        tx.contexts.insert("contexts".into(), Context::Other(other));
        let mut request = Request::default();
        request
            .headers
            .insert("contexts".into(), "{\"contexts\":{}}".into());
        request.data = Some("\"contexts\":{".into());
        tx.request = Some(request);

        let mut out = b"prefix".to_vec();
        assert!(write_with_context(&mut out, &tx, b"\"mark\":{\"a\":1}").unwrap());
        assert_eq!(&out[..6], b"prefix");
        let value: serde_json::Value = serde_json::from_slice(&out[6..]).unwrap();
        // (Read back from text as the result is, so floats compare alike.)
        let mut expected: serde_json::Value =
            serde_json::from_slice(&serde_json::to_vec(&tx).unwrap()).unwrap();
        expected["contexts"]["mark"] = serde_json::json!({"a": 1});
        assert_eq!(value, expected);
        // First among the contexts, and written once.
        let text = std::str::from_utf8(&out[6..]).unwrap();
        assert_eq!(text.matches("\"mark\"").count(), 1);
        assert!(text.contains("\"contexts\":{\"mark\":{\"a\":1},"), "{text}");
    }

    #[test]
    fn an_empty_contexts_object_takes_the_member_alone() {
        let value = serde_json::json!({"a": [1, {"contexts": 2}], "contexts": {}, "z": "x"});
        let mut out = Vec::new();
        assert!(write_with_context(&mut out, &value, b"\"mark\":1").unwrap());
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"a":[1,{"contexts":2}],"contexts":{"mark":1},"z":"x"}"#
        );
    }

    #[test]
    fn without_contexts_it_is_written_as_serde_writes_it() {
        for value in [
            serde_json::json!({"context": {}, "contextsx": {}, "extra": {"contexts": {}}}),
            serde_json::json!({"contexts": null, "b": {"c": {}}}),
            serde_json::json!({"con\"texts": {}}),
        ] {
            let mut out = Vec::new();
            assert!(!write_with_context(&mut out, &value, b"\"mark\":1").unwrap());
            assert_eq!(out, serde_json::to_vec(&value).unwrap());
        }
        // A transaction without contexts has no `contexts` key at all.
        let mut out = Vec::new();
        assert!(!write_with_context(&mut out, &Transaction::default(), b"\"m\":1").unwrap());
    }
}
