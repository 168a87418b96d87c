//! Readable function names: module paths inside generic arguments are cut
//! to their last segment, and long paths outside them keep their crate and
//! their last two segments, so `<futures_util::future::future::map::Map<Fut,F>
//! as core::future::future::Future>::poll` reads `<Map<Fut,F> as
//! Future>::poll`. The full name stays available (the page shows it on
//! hover).

/// The shortened form of a (demangled) function name.
pub(crate) fn short_name(full: &str) -> String {
    let mut out = String::with_capacity(full.len());
    let mut depth = 0usize;
    let mut run = String::new();
    for c in full.chars() {
        if is_path_char(c) {
            run.push(c);
            continue;
        }
        flush_run(&mut out, &mut run, depth);
        match c {
            '<' => depth += 1,
            '>' => depth = depth.saturating_sub(1),
            _ => {}
        }
        out.push(c);
    }
    flush_run(&mut out, &mut run, depth);
    out
}

fn is_path_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | ':' | '{' | '}' | '$' | '#')
}

fn flush_run(out: &mut String, run: &mut String, depth: usize) {
    if run.is_empty() {
        return;
    }
    // A run that starts with `::` continues a qualified path (`<T as
    // Trait>::method`): its segments are all method-level, keep them.
    if run.starts_with("::") {
        out.push_str(run);
        run.clear();
        return;
    }
    let segments: Vec<&str> = run.split("::").collect();
    if depth > 0 {
        // A path before generics (`Vec::<u8>`) keeps its trailing `::`.
        let trimmed = run.trim_end_matches("::");
        out.push_str(trimmed.rsplit("::").next().unwrap_or(trimmed));
        if run.ends_with("::") {
            out.push_str("::");
        }
    } else if segments.len() > 3 {
        let n = segments.len();
        out.push_str(segments[0]);
        out.push_str("::…::");
        out.push_str(&segments[n - 2..].join("::"));
    } else {
        out.push_str(run);
    }
    run.clear();
}

#[cfg(test)]
mod tests {
    use super::short_name;

    #[test]
    fn generics_lose_their_module_paths() {
        assert_eq!(
            short_name(
                "<futures_util::future::future::map::Map<Fut,F> as core::future::future::Future>::poll"
            ),
            "<Map<Fut,F> as Future>::poll"
        );
        assert_eq!(
            short_name("<F as axum::handler::Handler<(M,T1),S>>::call::{{closure}}"),
            "<F as Handler<(M,T1),S>>::call::{{closure}}"
        );
    }

    #[test]
    fn long_paths_keep_crate_and_last_two_segments() {
        assert_eq!(
            short_name("tokio::runtime::park::CachedParkThread::park"),
            "tokio::…::CachedParkThread::park"
        );
        assert_eq!(
            short_name("sentry_profiling_examples::burn_cpu"),
            "sentry_profiling_examples::burn_cpu"
        );
        assert_eq!(short_name("epoll_wait"), "epoll_wait");
        assert_eq!(
            short_name("(suspended: awaiting or queued)"),
            "(suspended: awaiting or queued)"
        );
    }
}
