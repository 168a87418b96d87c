//! How many envelope files a directory keeps: the writer of
//! `EnvelopeDirTransport` removes the oldest once there are more than a
//! number of files or bytes, so a service that runs for months with the
//! local default does not fill its disk (one file per transaction: at a
//! thousand requests a second, millions of files a day).
//!
//! Profile chunks are few (one a minute per profiler) and each stands for
//! a minute of every thread; transactions come one per request. Removing
//! the oldest file whatever it holds kept 4 of 422 chunks after a soak at
//! 13,000 requests a second. So chunks are held apart: the oldest
//! transaction (or other envelope) goes first, and the oldest chunk only
//! while chunks take more than half of either bound, or nothing else is
//! left.
//!
//! The files already in the directory when the transport starts (an
//! earlier run's) count too, oldest first by the time in their names
//! (`<sequence>-<milliseconds>.envelope`; the sequence starts again at 0 in
//! each run), so a directory shared by many runs stays bounded as well;
//! whether each holds a chunk is read from its first bytes.

use std::collections::VecDeque;
use std::io::Read as _;
use std::path::Path;

/// The files of one kind, oldest first, and their bytes.
#[derive(Debug, Default)]
struct Files {
    names: VecDeque<(Box<str>, u64)>,
    bytes: u64,
}

impl Files {
    fn push(&mut self, name: Box<str>, size: u64) {
        self.bytes += size;
        self.names.push_back((name, size));
    }

    fn pop(&mut self) -> Option<Box<str>> {
        let (name, size) = self.names.pop_front()?;
        self.bytes -= size;
        Some(name)
    }
}

/// The envelope files a directory holds: profile chunks, and the rest.
#[derive(Debug, Default)]
pub(crate) struct Retention {
    chunks: Files,
    others: Files,
}

/// When a file named by the transport was written: (milliseconds,
/// sequence) from `<sequence>-<milliseconds>.envelope`.
fn written_at(name: &str) -> Option<(u64, u64)> {
    let stem = name.strip_suffix(".envelope")?;
    let (seq, millis) = stem.split_once('-')?;
    Some((millis.parse().ok()?, seq.parse().ok()?))
}

/// Whether envelope bytes starting with `head` hold a profile chunk: its
/// first item's header (the envelope's second line) says so.
pub(crate) fn holds_chunk(head: &[u8]) -> bool {
    let mut lines = head.split(|&b| b == b'\n');
    lines.next();
    const NEEDLE: &[u8] = b"\"type\":\"profile_chunk\"";
    lines
        .next()
        .is_some_and(|item| item.windows(NEEDLE.len()).any(|w| w == NEEDLE))
}

/// The first bytes of the file at `path` hold a profile chunk.
fn file_holds_chunk(path: &Path) -> bool {
    let mut head = [0u8; 512];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .unwrap_or(0);
    holds_chunk(&head[..n])
}

impl Retention {
    /// The envelope files already in `dir`, oldest first. Files whose names
    /// the transport did not give are left alone, and not counted.
    pub(crate) fn scan(dir: &Path) -> Self {
        let mut found: Vec<((u64, u64), Box<str>, u64)> = std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|e| {
                        let name = e.file_name().into_string().ok()?;
                        let at = written_at(&name)?;
                        let size = e.metadata().ok().filter(|m| m.is_file())?.len();
                        Some((at, name.into_boxed_str(), size))
                    })
                    .collect()
            })
            .unwrap_or_default();
        found.sort_unstable();
        let mut this = Self::default();
        for (_, name, size) in found {
            let chunk = file_holds_chunk(&dir.join(&*name));
            this.kind(chunk).push(name, size);
        }
        this
    }

    fn kind(&mut self, chunk: bool) -> &mut Files {
        if chunk {
            &mut self.chunks
        } else {
            &mut self.others
        }
    }

    /// Files held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.chunks.names.len() + self.others.names.len()
    }

    /// Notes that `name` (`size` bytes, a profile chunk if `chunk`) was
    /// written, the newest file, and appends to `remove` the files to
    /// remove so that at most `max_files` files and `max_bytes` bytes
    /// remain (see the module's doc for which go first; the newest file
    /// stays even when it alone is larger).
    pub(crate) fn admit(
        &mut self,
        name: Box<str>,
        size: u64,
        chunk: bool,
        max_files: usize,
        max_bytes: u64,
        remove: &mut Vec<Box<str>>,
    ) {
        let max_files = max_files.max(1);
        self.kind(chunk).push(name, size);
        loop {
            let files = self.chunks.names.len() + self.others.names.len();
            let bytes = self.chunks.bytes + self.others.bytes;
            if files <= 1 || (files <= max_files && bytes <= max_bytes) {
                break;
            }
            let chunks_over =
                self.chunks.names.len() > max_files / 2 || self.chunks.bytes > max_bytes / 2;
            // The newest file (the last of its kind) is never the one.
            let others_left = self.others.names.len() > usize::from(!chunk);
            let chunks_left = self.chunks.names.len() > usize::from(chunk);
            let from_chunks = chunks_left && (chunks_over || !others_left);
            let old = if from_chunks {
                self.chunks.pop()
            } else if others_left {
                self.others.pop()
            } else {
                None
            };
            match old {
                Some(old) => remove.push(old),
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_go_first_past_either_bound() {
        let mut r = Retention::default();
        let mut removed = Vec::new();
        for i in 0..5u64 {
            r.admit(
                format!("{i:06}-{i}.envelope").into(),
                10,
                false,
                3,
                1000,
                &mut removed,
            );
        }
        assert_eq!(
            removed,
            ["000000-0.envelope".into(), "000001-1.envelope".into()] as [Box<str>; 2]
        );
        removed.clear();
        // Bytes: three files of 10 and one of 25 are 55 bytes; 40 keeps
        // the newest two.
        r.admit("000005-5.envelope".into(), 25, false, 3, 40, &mut removed);
        assert_eq!(
            removed,
            ["000002-2.envelope".into(), "000003-3.envelope".into()] as [Box<str>; 2]
        );
        assert_eq!(r.len(), 2);
        removed.clear();
        r.admit("000006-6.envelope".into(), 100, false, 3, 40, &mut removed);
        assert_eq!(
            removed,
            ["000004-4.envelope".into(), "000005-5.envelope".into()] as [Box<str>; 2]
        );
        assert_eq!(
            r.len(),
            1,
            "the newest stays even when larger than the bound"
        );
    }

    #[test]
    fn files_of_earlier_runs_count_oldest_first() {
        let dir =
            std::env::temp_dir().join(format!("sentry-profiling-retention-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // Two runs: the second's sequence started again at 0.
        for name in [
            "000000-2000.envelope",
            "000001-2001.envelope",
            "000000-1000.envelope",
            "000001-1001.envelope",
        ] {
            std::fs::write(dir.join(name), b"x").unwrap();
        }
        std::fs::write(dir.join("profile.pb.gz"), b"not an envelope").unwrap();
        let mut r = Retention::scan(&dir);
        assert_eq!(r.len(), 4);
        let mut removed = Vec::new();
        r.admit(
            "000000-3000.envelope".into(),
            1,
            false,
            3,
            u64::MAX,
            &mut removed,
        );
        assert_eq!(
            removed,
            ["000000-1000.envelope".into(), "000001-1001.envelope".into()] as [Box<str>; 2]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn chunks_outlive_transactions_up_to_half_of_the_bounds() {
        let mut r = Retention::default();
        let mut removed = Vec::new();
        let name = |i: u64| -> Box<str> { format!("{i:06}-{i}.envelope").into() };
        // Ten files at most; a chunk every tenth envelope.
        for i in 0..100u64 {
            r.admit(name(i), 10, i % 10 == 0, 10, u64::MAX, &mut removed);
        }
        let kept_chunks = r.chunks.names.len();
        assert_eq!(r.len(), 10);
        assert_eq!(kept_chunks, 5, "chunks keep half of the files");
        assert_eq!(
            r.chunks.names.front().map(|(n, _)| n.clone()),
            Some(name(50))
        );
        assert!(removed.contains(&name(0)) && !removed.contains(&name(90)));
        // Bytes: chunks of 100 bytes against a bound of 300 keep one.
        let mut r = Retention::default();
        removed.clear();
        for i in 0..20u64 {
            let chunk = i % 5 == 0;
            r.admit(
                name(i),
                if chunk { 100 } else { 10 },
                chunk,
                100,
                300,
                &mut removed,
            );
        }
        assert_eq!(r.chunks.names.len(), 1);
        assert!(r.chunks.bytes + r.others.bytes <= 300);
        // Only chunks: the oldest goes, the newest stays.
        let mut r = Retention::default();
        removed.clear();
        for i in 0..4u64 {
            r.admit(name(i), 10, true, 2, u64::MAX, &mut removed);
        }
        assert_eq!(removed, [name(0), name(1)]);
    }

    #[test]
    fn a_chunk_is_told_by_its_first_item_header() {
        assert!(holds_chunk(
            b"{\"event_id\":\"ab\"}\n{\"type\":\"profile_chunk\",\"platform\":\"rust\",\"length\":2}\n{}\n"
        ));
        assert!(!holds_chunk(
            b"{\"event_id\":\"ab\"}\n{\"type\":\"transaction\",\"length\":2}\n{}\n"
        ));
        assert!(!holds_chunk(b""));
    }
}
