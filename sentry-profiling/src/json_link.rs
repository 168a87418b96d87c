//! Writing a transaction's JSON with one more member first in its
//! `contexts` (the `profile` context that links it), in the one pass serde
//! makes over the SDK's typed transaction: the bytes written are neither
//! searched nor moved, and nothing is allocated.
//!
//! The member goes where the structure says, not where some bytes look
//! like it: a `"contexts":{` anywhere else (in `extra`, in a span's data,
//! inside the contexts themselves, in a request header) is not the
//! transaction's own.

use std::io::{self, Write};

use serde::Serialize;
use serde_json::ser::{CharEscape, CompactFormatter, Formatter};

/// The key of the object the member goes into, at the top level.
const KEY: &[u8] = b"contexts";

/// Serialises `value` into `out` as serde_json's compact writer does, with
/// `member` (a complete `"name":value`) written first into its top-level
/// `contexts` object. Returns whether there was one to write it into.
pub(crate) fn write_with_context<T: Serialize + ?Sized>(
    out: &mut Vec<u8>,
    value: &T,
    member: &[u8],
) -> io::Result<bool> {
    let mut inserted = false;
    let formatter = Inserting {
        member,
        inserted: &mut inserted,
        depth: 0,
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

/// serde_json's compact formatting, which watches the top-level keys for
/// [`KEY`] and writes the member when its object opens.
struct Inserting<'a> {
    member: &'a [u8],
    inserted: &'a mut bool,
    /// Objects and arrays open: 1 inside the top-level object.
    depth: u32,
    /// A top-level key is being written (until the member is).
    in_key: bool,
    /// Bytes of it so far.
    key_len: usize,
    /// Whether they are the start of [`KEY`].
    key_matches: bool,
    /// The top-level key just written is [`KEY`]: the next object opened
    /// is its value.
    armed: bool,
    /// The member was written: the object's first key of its own needs a
    /// comma before it.
    comma_due: bool,
}

impl Formatter for Inserting<'_> {
    fn begin_object<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.depth += 1;
        writer.write_all(b"{")?;
        if std::mem::take(&mut self.armed) {
            writer.write_all(self.member)?;
            *self.inserted = true;
            self.comma_due = true;
        }
        Ok(())
    }

    fn end_object<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.depth -= 1;
        // An object with nothing but the member closes after it.
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
        if self.depth == 1 && !*self.inserted {
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
            let rest = KEY.get(self.key_len..).unwrap_or_default();
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
        // [`KEY`] has nothing to escape.
        self.key_matches &= !self.in_key;
        CompactFormatter.write_char_escape(writer, char_escape)
    }

    fn end_object_key<W: ?Sized + Write>(&mut self, _writer: &mut W) -> io::Result<()> {
        if std::mem::take(&mut self.in_key) {
            self.armed = self.key_matches && self.key_len == KEY.len();
        }
        Ok(())
    }

    fn end_object_value<W: ?Sized + Write>(&mut self, _writer: &mut W) -> io::Result<()> {
        // A top-level `contexts` that was not an object takes nothing.
        self.armed = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sentry_core::protocol::{Context, Map, Request, Span, Transaction, Value};

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
