//! Finding where a transaction's `contexts` begin in the JSON serde wrote
//! of the SDK's typed transaction, without parsing it into values: the
//! transaction sender adds the `profile` context to those bytes (see
//! `transaction_tags::write_transaction_json`) instead of inserting it into
//! the transaction's contexts first.

/// Where the value of a transaction's `contexts` starts, in the JSON serde
/// writes of the SDK's typed transaction: its last `"contexts":{`. The
/// SDK's transaction writes its contexts after every member that can hold
/// arbitrary JSON (`extra`, `spans`), and only strings after them
/// (`request`, `server_name`); inside a string every quote is escaped, so
/// the last such bytes are the transaction's own key, found without
/// looking at the members before it.
pub(crate) fn transaction_contexts(json: &[u8]) -> Option<usize> {
    const KEY: &[u8] = b"\"contexts\":{";
    // Built once: a forward search runs on SIMD, a reverse one does not,
    // and the last of a few matches is the one wanted.
    static FINDER: std::sync::OnceLock<memchr::memmem::Finder<'static>> =
        std::sync::OnceLock::new();
    let finder = FINDER.get_or_init(|| memchr::memmem::Finder::new(KEY));
    finder.find_iter(json).last().map(|at| at + KEY.len() - 1)
}

/// Whether the object whose `{` is at `open` has no members.
pub(crate) fn is_empty_object(json: &[u8], open: usize) -> bool {
    json.get(skip_ws(json, open + 1)) == Some(&b'}')
}

fn skip_ws(json: &[u8], mut i: usize) -> usize {
    while json.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    // A walk over an object's members, which the fast look-up above is
    // checked against.

    /// The value of member `key` of the object whose `{` is at `open`: where
    /// it starts and ends (exclusive). `None` if the object has no such
    /// member, or `json` is not an object at `open`. `key` must need no
    /// escaping.
    pub(crate) fn member(json: &[u8], open: usize, key: &str) -> Option<(usize, usize)> {
        if json.get(open) != Some(&b'{') {
            return None;
        }
        let mut i = open + 1;
        loop {
            i = skip_ws(json, i);
            if *json.get(i)? != b'"' {
                // `}`: no such member (or not JSON).
                return None;
            }
            let name_end = string_end(json, i)?;
            let name = &json[i + 1..name_end - 1];
            i = skip_ws(json, name_end);
            if *json.get(i)? != b':' {
                return None;
            }
            let start = skip_ws(json, i + 1);
            let end = value_end(json, start)?;
            if name == key.as_bytes() {
                return Some((start, end));
            }
            i = skip_ws(json, end);
            if *json.get(i)? != b',' {
                return None;
            }
            i += 1;
        }
    }

    /// Just past the string whose opening quote is at `open`.
    fn string_end(json: &[u8], open: usize) -> Option<usize> {
        let mut i = open + 1;
        // Most strings (keys, ids) are short: looked at byte by byte before
        // `memchr`, whose call costs more than a few bytes' look.
        for _ in 0..16 {
            match *json.get(i)? {
                b'"' => return Some(i + 1),
                b'\\' => i += 2,
                _ => i += 1,
            }
        }
        loop {
            let j = i + memchr::memchr2(b'"', b'\\', json.get(i..)?)?;
            if json[j] == b'"' {
                return Some(j + 1);
            }
            // An escape: the next byte is never the string's end.
            i = j + 2;
        }
    }

    /// Just past the value that starts at `start`.
    fn value_end(json: &[u8], start: usize) -> Option<usize> {
        match *json.get(start)? {
            b'"' => string_end(json, start),
            b'{' | b'[' => {
                let mut depth = 0usize;
                let mut i = start;
                while let Some(&b) = json.get(i) {
                    match b {
                        b'"' => {
                            i = string_end(json, i)?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                return Some(i + 1);
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
                None
            }
            // A number, `true`, `false` or `null`.
            _ => {
                let rest = json.get(start..)?;
                let len = rest
                    .iter()
                    .position(|b| matches!(b, b',' | b'}' | b']') || b.is_ascii_whitespace())
                    .unwrap_or(rest.len());
                (len > 0).then_some(start + len)
            }
        }
    }

    fn value<'a>(json: &'a str, open: usize, key: &str) -> Option<&'a str> {
        member(json.as_bytes(), open, key).map(|(s, e)| &json[s..e])
    }

    #[test]
    fn finds_top_level_members_past_nested_ones_of_the_same_name() {
        let json = r#"{"extra":{"contexts":{"trace":1}},"s":"\"contexts\":{\\","n":-1.5e3,"t":true,"a":[{"x":"]"},[]],"contexts":{"trace":{"data":{}}},"z":null}"#;
        let (cs, ce) = member(json.as_bytes(), 0, "contexts").unwrap();
        assert_eq!(&json[cs..ce], r#"{"trace":{"data":{}}}"#);
        let (ts, _) = member(json.as_bytes(), cs, "trace").unwrap();
        assert_eq!(value(json, ts, "data"), Some("{}"));
        let (ds, _) = member(json.as_bytes(), ts, "data").unwrap();
        assert!(is_empty_object(json.as_bytes(), ds));
        assert!(!is_empty_object(json.as_bytes(), ts));
        assert_eq!(value(json, 0, "n"), Some("-1.5e3"));
        assert_eq!(value(json, 0, "t"), Some("true"));
        assert_eq!(value(json, 0, "z"), Some("null"));
        assert_eq!(value(json, 0, "s"), Some(r#""\"contexts\":{\\""#));
        assert_eq!(value(json, 0, "a"), Some(r#"[{"x":"]"},[]]"#));
        assert_eq!(value(json, 0, "missing"), None);
    }

    #[test]
    fn malformed_or_truncated_json_finds_nothing_and_never_panics() {
        for json in [
            "",
            "{",
            "[]",
            r#"{"a""#,
            r#"{"a":"#,
            r#"{"a":"\"#,
            r#"{"a":{"b":1}"#,
            r#"{"a":1 "b":2}"#,
            r#"{"a":1,"#,
            r#"{a:1}"#,
        ] {
            assert_eq!(member(json.as_bytes(), 0, "b"), None, "{json}");
        }
        assert_eq!(member(b"{\"a\":1}", 9, "a"), None);
    }

    /// The fast look-up of a transaction's contexts agrees with the member
    /// walk on the SDK's own serialisation, with look-alikes before the
    /// contexts (extra data, a span's data) and after them (a request
    /// header named `contexts`): this pins the SDK's field order it relies
    /// on.
    #[test]
    fn a_transactions_contexts_are_its_last_contexts_key() {
        use sentry_core::protocol::{Context, Request, Span, Transaction, Value};
        let look_alike = serde_json::json!({"contexts": {"trace": {"data": {}}}});
        let mut tx = Transaction::default();
        tx.extra.insert("contexts".into(), look_alike.clone());
        let mut span = Span::default();
        span.data.insert("contexts".into(), look_alike);
        tx.spans.push(span);
        tx.contexts
            .insert("trace".into(), Context::Trace(Box::default()));
        tx.contexts
            .insert("other".into(), Context::Other(Default::default()));
        let mut request = Request::default();
        request
            .headers
            .insert("contexts".into(), "{\"contexts\":{}}".into());
        request.data = Some("\"contexts\":{".into());
        tx.request = Some(request);
        tx.extra.insert("z".into(), Value::from("\"contexts\":{"));
        let json = serde_json::to_vec(&tx).unwrap();
        let walked = member(&json, 0, "contexts").map(|(s, _)| s);
        assert!(walked.is_some());
        assert_eq!(transaction_contexts(&json), walked);
        assert!(member(&json, walked.unwrap(), "trace").is_some());
        assert_eq!(transaction_contexts(b"{\"extra\":1}"), None);
    }

    #[test]
    fn long_strings_and_escapes_past_the_first_bytes() {
        let long = format!("{}\\\"{}", "x".repeat(40), "y".repeat(40));
        let json = format!(r#"{{"a":"{long}","b":"short\\","c":1}}"#);
        assert_eq!(value(&json, 0, "c"), Some("1"));
        assert_eq!(value(&json, 0, "b"), Some(r#""short\\""#));
    }

    #[test]
    fn tolerates_whitespace_between_tokens() {
        let json = "{ \"a\" : [ 1 , 2 ] ,\n \"b\" : { } }";
        assert_eq!(value(json, 0, "a"), Some("[ 1 , 2 ]"));
        let (bs, _) = member(json.as_bytes(), 0, "b").unwrap();
        assert!(is_empty_object(json.as_bytes(), bs));
    }
}
