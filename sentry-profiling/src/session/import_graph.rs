//! The crate's module graph, read from its sources: every path a file
//! names through `crate::`, `self::` or `super::`, in `use` trees (nested
//! braces included) and in code, comments and string literals left out.
//! The tests below check the layering the session's doc states (the core
//! never names the Sentry glue) and that no two top-level modules name
//! each other, directly or through others.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One token of Rust source, as far as paths need: identifiers (keywords
/// included), `::`, and single punctuation characters.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    PathSep,
    Punct(char),
}

/// The tokens of `src`, without comments, string and character literals
/// (whose text would otherwise read as paths).
fn tokens(src: &str) -> Vec<Token> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            // Block comments nest.
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == '"' {
            i = skip_string(&chars, i + 1);
        } else if (c == 'r' || c == 'b')
            && raw_string_start(&chars, i).is_some()
            && !chars
                .get(i.wrapping_sub(1))
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            let (hashes, body) = raw_string_start(&chars, i).unwrap_or((0, i));
            i = skip_raw_string(&chars, body, hashes);
        } else if c == '\'' {
            // A character literal (`'a'`, `'\n'`, `'\u{1F600}'`), or a
            // lifetime (`'a`), which is left as it is.
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Token::Ident(chars[start..i].iter().collect()));
        } else if c == ':' && next == Some(':') {
            out.push(Token::PathSep);
            i += 2;
        } else {
            if !c.is_whitespace() {
                out.push(Token::Punct(c));
            }
            i += 1;
        }
    }
    out
}

/// Past a string literal whose text begins at `i`.
fn skip_string(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// At `i`, `r"`, `r#"`, `br"`… begins a raw string: its count of `#` and
/// where its text begins.
fn raw_string_start(chars: &[char], i: usize) -> Option<(usize, usize)> {
    let mut j = i;
    if chars.get(j) == Some(&'b') {
        j += 1;
    }
    if chars.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while chars.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    (chars.get(j) == Some(&'"')).then_some((hashes, j + 1))
}

/// Past a raw string whose text begins at `i`, closed by `"` and `hashes`
/// of `#`.
fn skip_raw_string(chars: &[char], mut i: usize, hashes: usize) -> usize {
    while i < chars.len() {
        if chars[i] == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#')) {
            return i + 1 + hashes;
        }
        i += 1;
    }
    i
}

/// The paths a file names, each as written (`crate`, `self` or `super`
/// first): the leaves of its `use` trees, and the paths in its code.
fn named_paths(tokens: &[Token]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i] == Token::Ident("use".into()) {
            let mut prefix = Vec::new();
            i = use_tree(tokens, i + 1, &mut prefix, &mut out);
            continue;
        }
        if let Token::Ident(first) = &tokens[i] {
            let after_sep = i > 0 && tokens[i - 1] == Token::PathSep;
            if !after_sep
                && matches!(first.as_str(), "crate" | "self" | "super")
                && tokens.get(i + 1) == Some(&Token::PathSep)
            {
                let mut path = vec![first.clone()];
                let mut j = i + 1;
                while tokens.get(j) == Some(&Token::PathSep) {
                    match tokens.get(j + 1) {
                        Some(Token::Ident(seg)) => {
                            path.push(seg.clone());
                            j += 2;
                        }
                        // `crate::{…}` outside a `use`, or a glob.
                        _ => break,
                    }
                }
                out.push(path);
                i = j;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// Reads one `use` tree from `i` with the segments before it in `prefix`;
/// returns where it ends (past a `;` at the top). Leaves go to `out`.
fn use_tree(
    tokens: &[Token],
    mut i: usize,
    prefix: &mut Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    let depth = prefix.len();
    loop {
        match tokens.get(i) {
            Some(Token::PathSep) => i += 1,
            Some(Token::Ident(seg)) if seg == "as" => {
                // The alias names nothing of the crate's.
                i += 2;
            }
            Some(Token::Ident(seg)) => {
                prefix.push(seg.clone());
                i += 1;
            }
            Some(Token::Punct('{')) => {
                i += 1;
                loop {
                    let mut inner = prefix.clone();
                    i = use_tree(tokens, i, &mut inner, out);
                    match tokens.get(i) {
                        Some(Token::Punct(',')) => i += 1,
                        Some(Token::Punct('}')) => {
                            i += 1;
                            break;
                        }
                        _ => break,
                    }
                    if tokens.get(i) == Some(&Token::Punct('}')) {
                        i += 1;
                        break;
                    }
                }
                prefix.truncate(depth);
                return i;
            }
            Some(Token::Punct('*')) => {
                out.push(prefix.clone());
                prefix.truncate(depth);
                return i + 1;
            }
            Some(Token::Punct(',' | '}')) => {
                out.push(prefix.clone());
                prefix.truncate(depth);
                return i;
            }
            Some(Token::Punct(';')) => {
                out.push(prefix.clone());
                prefix.truncate(depth);
                return i + 1;
            }
            // The end of the file, or something a `use` never holds.
            _ => {
                prefix.truncate(depth);
                return i + 1;
            }
        }
    }
}

/// The module a source file is, as a path from the crate's root:
/// `lib.rs` is `[]`, `a.rs` and `a/mod.rs` are `[a]`, `a/b.rs` is `[a, b]`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap_or(file);
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs");
        if stem != "mod" && stem != "lib" {
            parts.push(stem.to_owned());
        }
    }
    parts
}

/// `path` (as written in module `module`) from the crate's root; `None`
/// when it does not start at the crate (`std::…`, a dependency).
fn resolve(module: &[String], path: &[String]) -> Option<Vec<String>> {
    let mut base: Vec<String> = match path.first()?.as_str() {
        "crate" => Vec::new(),
        "self" | "super" => module.to_vec(),
        _ => return None,
    };
    let mut rest = &path[1..];
    if path[0] == "super" {
        base.pop();
    }
    while rest.first().is_some_and(|s| s == "super") {
        base.pop();
        rest = &rest[1..];
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// Every source file under `path`.
fn collect(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for e in entries {
            collect(&e, out);
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_owned());
    }
}

/// The crate's top-level modules and which others each names:
/// `module -> {named module: a file and the path that names it}`.
fn top_level_graph() -> BTreeMap<String, BTreeMap<String, String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    collect(&src, &mut files);
    // A path into the root that names no module (`crate::Item`, one of
    // `lib.rs`'s re-exports) is no edge between layers.
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|f| module_of(&src, f).first().cloned())
        .collect();
    let mut graph: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for file in files {
        let module = module_of(&src, &file);
        let Some(from) = module.first().cloned() else {
            // `lib.rs` declares every module: it is the root, not a layer.
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        let edges = graph.entry(from.clone()).or_default();
        for path in named_paths(&tokens(&text)) {
            let Some(to) = resolve(&module, &path).and_then(|p| p.first().cloned()) else {
                continue;
            };
            if to != from && modules.contains(&to) {
                edges
                    .entry(to)
                    .or_insert_with(|| format!("{}: {}", file.display(), path.join("::")));
            }
        }
    }
    graph
}

/// The modules `start` reaches through `graph`, itself left out unless a
/// path leads back to it.
fn reached(graph: &BTreeMap<String, BTreeMap<String, String>>, start: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![start.to_owned()];
    while let Some(m) = todo.pop() {
        for next in graph.get(&m).into_iter().flat_map(BTreeMap::keys) {
            if seen.insert(next.clone()) {
                todo.push(next.clone());
            }
        }
    }
    seen
}

#[test]
fn use_trees_are_read_to_their_leaves() {
    let src = r#"
        use crate::{a::x, b::{c, d::{e as f, *}}, self as me};
        use super::super::g;
        // use crate::commented::out;
        /* use crate::blocked /* nested */ out; */
        fn f() { let s = "crate::in_a_string"; let r = r"crate::raw"; crate::h::call('x'); }
        use std::sync::Arc;
    "#;
    let paths: Vec<String> = named_paths(&tokens(src))
        .iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(
        paths,
        [
            "crate::a::x",
            "crate::b::c",
            "crate::b::d::e",
            "crate::b::d",
            "crate::self",
            "super::super::g",
            "crate::h::call",
            "std::sync::Arc",
        ]
    );
    let module = ["session".to_owned(), "intake".to_owned()];
    let path = |s: &str| s.split("::").map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(resolve(&module, &path("super::super::g")), Some(path("g")));
    assert_eq!(
        resolve(&module, &path("super::desk::Desk")),
        Some(path("session::desk::Desk"))
    );
    assert_eq!(resolve(&module, &path("std::sync::Arc")), None);
}

#[test]
fn a_circle_is_found() {
    let mut graph: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (from, to) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")] {
        graph
            .entry(from.into())
            .or_default()
            .insert(to.into(), String::new());
    }
    assert!(reached(&graph, "a").contains("a"));
    assert!(!reached(&graph, "d").contains("d"));
}

/// The Sentry glue may depend on the session and the core, never the
/// reverse: no core module names a glue module, however it is written.
#[test]
fn the_core_never_names_the_glue() {
    let graph = top_level_graph();
    assert!(graph.len() > 20, "found the modules: {:?}", graph.keys());
    let core = [
        "session",
        "lanes",
        "sampler",
        "encode",
        "chunk",
        "export",
        "symbolize",
        "unwind",
        "sys",
        "options",
        "context",
        "attribution",
        "request_times",
        "blocking",
    ];
    let glue = [
        "transport",
        "transaction_profile",
        "integration",
        "hooks",
        "request",
    ];
    let mut offenders = Vec::new();
    for c in core {
        let Some(edges) = graph.get(c) else {
            panic!("no module {c}");
        };
        for (to, at) in edges {
            if glue.contains(&to.as_str()) {
                offenders.push(format!("{c} names {to} ({at})"));
            }
        }
    }
    assert!(offenders.is_empty(), "core depends on glue: {offenders:#?}");
}

/// No top-level module reaches itself through the modules it names.
#[test]
fn no_import_circle() {
    let graph = top_level_graph();
    let circles: Vec<String> = graph
        .iter()
        .filter(|(m, _)| reached(&graph, m).contains(*m))
        .map(|(m, edges)| format!("{m} -> {edges:?}"))
        .collect();
    assert!(circles.is_empty(), "modules in a circle: {circles:#?}");
}
