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

    /// The look-up finds the transaction's own contexts in the SDK's
    /// serialisation, with look-alikes before them (extra data, a span's
    /// data) and after them (a request header and body): this pins the
    /// SDK's field order it relies on.
    #[test]
    fn a_transactions_contexts_are_its_last_contexts_key() {
        use sentry_core::protocol::{Context, Request, Span, Transaction, Value};
        let look_alike = serde_json::json!({"contexts": {"trace": {"data": {}}}});
        let mut tx = Transaction::default();
        tx.extra.insert("contexts".into(), look_alike.clone());
        tx.extra.insert("z".into(), Value::from("\"contexts\":{"));
        let mut span = Span::default();
        span.data.insert("contexts".into(), look_alike.clone());
        tx.spans.push(span);
        tx.contexts
            .insert("trace".into(), Context::Trace(Box::default()));
        let mut request = Request::default();
        request
            .headers
            .insert("contexts".into(), "{\"contexts\":{}}".into());
        request.data = Some("\"contexts\":{".into());
        tx.request = Some(request);
        let json = serde_json::to_vec(&tx).unwrap();
        let at = transaction_contexts(&json).expect("the contexts are found");
        assert!(!is_empty_object(&json, at));
        // A member put there lands in the transaction's own contexts, and
        // nowhere else.
        let mut marked = json[..=at].to_vec();
        marked.extend_from_slice(b"\"mark\":{},");
        marked.extend_from_slice(&json[at + 1..]);
        let value: serde_json::Value = serde_json::from_slice(&marked).unwrap();
        assert!(value["contexts"]["mark"].is_object(), "{value}");
        assert!(value["contexts"]["trace"].is_object());
        assert_eq!(value["extra"]["contexts"], look_alike);
        assert_eq!(value["spans"][0]["data"]["contexts"], look_alike);
        assert_eq!(transaction_contexts(b"{\"extra\":1}"), None);
        assert!(is_empty_object(b"{ }", 0));
    }
}
