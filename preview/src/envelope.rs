//! Sentry's envelope format, read back from files: a header line, then
//! items, each a header line and a payload of `length` bytes (or, without a
//! length, up to the next newline).
//!
//! Reading never fails as a whole: what can be parsed is returned, and the
//! first problem found (a header that is not JSON, a payload cut short) is
//! reported beside it, so a directory with one truncated file still shows
//! the rest.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// One item of a parsed envelope.
#[derive(Debug, Clone)]
pub struct EnvelopeItem {
    /// The item header.
    pub header: Value,
    /// The payload bytes.
    pub payload: Vec<u8>,
}

impl EnvelopeItem {
    /// The item's `type` header (`transaction`, `profile_chunk`, ...).
    pub fn kind(&self) -> Option<&str> {
        self.header.get("type").and_then(Value::as_str)
    }
}

/// A parsed envelope.
#[derive(Debug, Clone)]
pub struct ParsedEnvelope {
    /// The envelope header (`Null` when it was not JSON).
    pub header: Value,
    /// The items that were read whole.
    pub items: Vec<EnvelopeItem>,
    /// Why reading stopped before the end, if it did.
    pub problem: Option<String>,
}

/// Parses one envelope (see the module docs).
pub fn parse_envelope(bytes: &[u8]) -> ParsedEnvelope {
    let mut rest = bytes;
    let mut problem = None;
    let header = match next_line(&mut rest) {
        Some(l) => serde_json::from_slice(l).unwrap_or_else(|e| {
            problem = Some(format!("the envelope header is not JSON ({e})"));
            Value::Null
        }),
        None => {
            problem = Some("the file is empty".to_owned());
            Value::Null
        }
    };
    let mut items = Vec::new();
    while problem.is_none() {
        let Some(h) = next_line(&mut rest) else { break };
        if h.is_empty() {
            continue;
        }
        let header: Value = match serde_json::from_slice(h) {
            Ok(v) => v,
            Err(e) => {
                problem = Some(format!(
                    "item {} has a header that is not JSON ({e})",
                    items.len() + 1
                ));
                break;
            }
        };
        let payload = match header.get("length").and_then(Value::as_u64) {
            Some(len) => {
                let len = usize::try_from(len).unwrap_or(usize::MAX);
                if len > rest.len() {
                    problem = Some(format!(
                        "item {} is cut short: {} of its {len} bytes are there",
                        items.len() + 1,
                        rest.len()
                    ));
                    break;
                }
                let (p, tail) = rest.split_at(len);
                rest = tail.strip_prefix(b"\n").unwrap_or(tail);
                p.to_vec()
            }
            None => next_line(&mut rest).unwrap_or_default().to_vec(),
        };
        items.push(EnvelopeItem { header, payload });
    }
    ParsedEnvelope {
        header,
        items,
        problem,
    }
}

/// Writes an envelope of `(type, payload)` items, each with its `length`
/// (the inverse of [`parse_envelope`]; the header is empty).
pub fn envelope_bytes(items: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = b"{}\n".to_vec();
    for (kind, payload) in items {
        let header = serde_json::json!({"type": kind, "length": payload.len()});
        out.extend(header.to_string().bytes());
        out.push(b'\n');
        out.extend_from_slice(payload);
        out.push(b'\n');
    }
    out
}

fn next_line<'a>(rest: &mut &'a [u8]) -> Option<&'a [u8]> {
    if rest.is_empty() {
        return None;
    }
    let end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
    let line = &rest[..end];
    *rest = rest.get(end + 1..).unwrap_or(&[]);
    Some(line)
}

/// The `*.envelope` files of a directory, in name order (the envelope
/// directory transport names them in write order), and the other entries
/// it holds.
pub(crate) fn envelope_files(dir: &Path) -> std::io::Result<(Vec<PathBuf>, usize)> {
    let mut files = Vec::new();
    let mut other = 0;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_file() && path.extension().is_some_and(|e| e == "envelope") {
            files.push(path);
        } else {
            other += 1;
        }
    }
    files.sort_by_cached_key(|p| write_order(p));
    Ok((files, other))
}

/// The order files were written in, from names `<sequence>-<millis>`
/// (`EnvelopeDirTransport`'s): by time, then sequence (which restarts with
/// each process, and outgrows its six digits); other names after, by name.
fn write_order(path: &Path) -> (u64, u64, String) {
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let parsed = name
        .split_once('-')
        .and_then(|(seq, millis)| Some((millis.parse().ok()?, seq.parse().ok()?)));
    let (millis, seq) = parsed.unwrap_or((u64::MAX, u64::MAX));
    (millis, seq, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_in_write_order() {
        let mut files: Vec<PathBuf> = [
            "1000000-1700000000500.envelope",
            "999999-1700000000400.envelope",
            "000000-1700000000900.envelope",
            "notes.envelope",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        files.sort_by_cached_key(|p| write_order(p));
        let names: Vec<_> = files.iter().map(|p| p.to_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "999999-1700000000400.envelope",
                "1000000-1700000000500.envelope",
                "000000-1700000000900.envelope",
                "notes.envelope"
            ]
        );
    }

    #[test]
    fn reads_items_with_and_without_length() {
        let env = b"{\"event_id\":\"x\"}\n{\"type\":\"a\",\"length\":3}\nabc\n{\"type\":\"b\"}\n{\"k\":1}\n";
        let p = parse_envelope(env);
        assert!(p.problem.is_none(), "{:?}", p.problem);
        assert_eq!(p.items.len(), 2);
        assert_eq!(p.items[0].kind(), Some("a"));
        assert_eq!(p.items[0].payload, b"abc");
        assert_eq!(p.items[1].payload, b"{\"k\":1}");
    }

    #[test]
    fn a_truncated_item_is_reported_and_the_items_before_it_kept() {
        let env = b"{}\n{\"type\":\"a\",\"length\":1}\nx\n{\"type\":\"b\",\"length\":100}\nshort";
        let p = parse_envelope(env);
        assert_eq!(p.items.len(), 1);
        assert!(
            p.problem
                .as_deref()
                .is_some_and(|m| m.contains("cut short")),
            "{:?}",
            p.problem
        );
    }

    #[test]
    fn garbage_is_reported_not_panicked_on() {
        for bytes in [&b""[..], b"\xff\xfe", b"{}\nnot json\n", b"{\"a\":\n"] {
            let p = parse_envelope(bytes);
            assert!(p.problem.is_some(), "{bytes:?}");
        }
    }
}
