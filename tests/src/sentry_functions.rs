//! Sentry's view of functions: which module a frame's address lies in,
//! the project's stack-trace rules (which frames are not the application's),
//! and each function's self time as Sentry's function metrics (vroomrs)
//! compute it. Shared by the `truth` benchmark and the short-polls tests.

use std::collections::HashMap;

use sentry_view::ProfileChunk;
use serde_json::Value;

/// A module of a chunk's debug images: (start, end, path, bias).
pub type Image = (u64, u64, String, u64);

/// The module of `images` holding `addr`: its path and bias.
pub fn locate_in(images: &[Image], addr: u64) -> Option<(&String, u64)> {
    images
        .iter()
        .find(|(s, e, _, _)| (*s..*e).contains(&addr))
        .map(|(_, _, path, bias)| (path, *bias))
}

/// The modules of a chunk's debug images.
pub fn images(payload: &Value) -> Vec<Image> {
    let hex = |v: &Value| {
        v.as_str()
            .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
    };
    payload["debug_meta"]["images"]
        .as_array()
        .map(|images| {
            images
                .iter()
                .filter_map(|im| {
                    let start = hex(&im["image_addr"])?;
                    let vmaddr = hex(&im["image_vmaddr"]).unwrap_or(0);
                    let size = im["image_size"].as_u64()?;
                    let path = im["code_file"].as_str()?.to_owned();
                    Some((start, start + size, path, start - vmaddr))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Project stack-trace rules that mark frames `-app`, as the README gives
/// them: `stack.function:GLOB -app` and `stack.package:GLOB -app`.
#[derive(Debug, Default)]
pub struct Rules {
    functions: Vec<String>,
    packages: Vec<String>,
}

impl Rules {
    /// The rules of the block after "Stack Trace Rules" in `readme` (the
    /// text of the document that gives them).
    pub fn from_readme(readme: &str) -> Self {
        let mut rules = Rules::default();
        let Some(at) = readme.find("Stack Trace Rules*") else {
            return rules;
        };
        let block = readme[at..]
            .split("```text")
            .nth(1)
            .and_then(|b| b.split("```").next())
            .unwrap_or("");
        for line in block.lines() {
            let mut words = line.split_whitespace();
            let (Some(matcher), Some("-app")) = (words.next(), words.next()) else {
                continue;
            };
            if let Some(glob) = matcher.strip_prefix("stack.function:") {
                rules.functions.push(glob.to_owned());
            } else if let Some(glob) = matcher.strip_prefix("stack.package:") {
                rules.packages.push(glob.to_owned());
            }
        }
        rules
    }

    /// How many rules there are.
    pub fn len(&self) -> usize {
        self.functions.len() + self.packages.len()
    }

    /// Whether there is no rule.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a frame of `function` in `package` stays in-app.
    pub fn in_app(&self, function: &str, package: &str) -> bool {
        !self.functions.iter().any(|g| glob(g, function))
            && !self.packages.iter().any(|g| glob(g, package))
    }
}

/// Whether `text` matches `pattern`, where `*` stands for any run of
/// characters.
fn glob(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    for (i, part) in parts.iter().enumerate() {
        if i + 1 == parts.len() {
            return rest.ends_with(part);
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

/// The function a sample of `stack` (frame indices of `chunk`, leaf
/// first) is charged to by Sentry's function metrics (vroomrs): its
/// leaf-most frame that is in-app (the executable's code, less what
/// `rules` mark `-app`), not synthetic and not the stack's root.
pub fn owner(
    chunk: &ProfileChunk,
    images: &[Image],
    rules: &Rules,
    stack: &[usize],
) -> Option<String> {
    let depth = stack.len();
    stack.iter().enumerate().find_map(|(k, &f)| {
        let frame = chunk.frames.get(f)?;
        let function = frame.function.as_deref()?;
        let image = frame.instruction_addr.and_then(|a| locate_in(images, a));
        let executable = image.is_some_and(|(path, _)| !path.contains(".so"));
        let package = image.map_or("", |(path, _)| path.as_str());
        (k + 1 < depth && !frame.is_synthetic() && executable && rules.in_app(function, package))
            .then(|| function.to_owned())
    })
}

/// Self time per function as vroomrs computes it, over every thread of
/// the chunks, with `rules`: (function, seconds), most first.
pub fn slowest_functions(
    chunks: &[(ProfileChunk, Vec<Image>)],
    rules: &Rules,
) -> Vec<(String, f64)> {
    let mut time: HashMap<String, (u64, u32)> = HashMap::new();
    for (chunk, images) in chunks {
        let mut by_thread: HashMap<&str, Vec<(u64, usize)>> = HashMap::new();
        for s in &chunk.samples {
            by_thread
                .entry(&s.thread_id)
                .or_default()
                .push((s.timestamp_ns, s.stack_id));
        }
        for samples in by_thread.values_mut() {
            samples.sort_unstable();
            for (i, &(ts, stack_id)) in samples.iter().enumerate() {
                let Some(&(next, _)) = samples.get(i + 1) else {
                    continue;
                };
                let Some(stack) = chunk.stacks.get(stack_id) else {
                    continue;
                };
                let owner = owner(chunk, images, rules, stack);
                if let Some(function) = owner {
                    let entry = time.entry(function).or_default();
                    entry.0 += next.saturating_sub(ts);
                    entry.1 += 1;
                }
            }
        }
    }
    let mut out: Vec<(String, f64)> = time
        .into_iter()
        .filter(|(_, (_, n))| *n > 1)
        .map(|(f, (ns, _))| (f, ns as f64 / 1e9))
        .collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1));
    out
}
