//! Finding an object's members in JSON that serde_json wrote, without
//! parsing it into values: the transaction sender adds a linked
//! transaction's lane and `profile` context to the SDK's own bytes (see
//! `transaction_tags::write_transaction_json`) instead of inserting them
//! into the transaction's maps first.
//!
//! Strings are skipped with `memchr` (a quote or a backslash ends a run);
//! only the bytes between strings are looked at one by one.

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

/// Just past the string whose opening quote is at `open`.
fn string_end(json: &[u8], open: usize) -> Option<usize> {
    let mut i = open + 1;
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

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn tolerates_whitespace_between_tokens() {
        let json = "{ \"a\" : [ 1 , 2 ] ,\n \"b\" : { } }";
        assert_eq!(value(json, 0, "a"), Some("[ 1 , 2 ]"));
        let (bs, _) = member(json.as_bytes(), 0, "b").unwrap();
        assert!(is_empty_object(json.as_bytes(), bs));
    }
}
