//! How many envelope files a directory keeps: the writer of
//! `EnvelopeDirTransport` removes the oldest once there are more than a
//! number of files or bytes, so a service that runs for months with the
//! local default does not fill its disk (one file per transaction: at a
//! thousand requests a second, millions of files a day).
//!
//! The files already in the directory when the transport starts (an
//! earlier run's) count too, oldest first by the time in their names
//! (`<sequence>-<milliseconds>.envelope`; the sequence starts again at 0 in
//! each run), so a directory shared by many runs stays bounded as well.

use std::collections::VecDeque;
use std::path::Path;

/// The envelope files a directory holds, oldest first, and their bytes.
#[derive(Debug, Default)]
pub(crate) struct Retention {
    files: VecDeque<(Box<str>, u64)>,
    bytes: u64,
}

/// When a file named by the transport was written: (milliseconds,
/// sequence) from `<sequence>-<milliseconds>.envelope`.
fn written_at(name: &str) -> Option<(u64, u64)> {
    let stem = name.strip_suffix(".envelope")?;
    let (seq, millis) = stem.split_once('-')?;
    Some((millis.parse().ok()?, seq.parse().ok()?))
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
            this.bytes += size;
            this.files.push_back((name, size));
        }
        this
    }

    /// Files held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.files.len()
    }

    /// Notes that `name` (`size` bytes) was written, the newest file, and
    /// appends to `remove` the oldest files to remove so that at most
    /// `max_files` files and `max_bytes` bytes remain (the newest file
    /// stays even when it alone is larger).
    pub(crate) fn admit(
        &mut self,
        name: Box<str>,
        size: u64,
        max_files: usize,
        max_bytes: u64,
        remove: &mut Vec<Box<str>>,
    ) {
        self.bytes += size;
        self.files.push_back((name, size));
        while self.files.len() > 1
            && (self.files.len() > max_files.max(1) || self.bytes > max_bytes)
        {
            let Some((old, old_size)) = self.files.pop_front() else {
                break;
            };
            self.bytes -= old_size;
            remove.push(old);
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
        r.admit("000005-5.envelope".into(), 25, 3, 40, &mut removed);
        assert_eq!(
            removed,
            ["000002-2.envelope".into(), "000003-3.envelope".into()] as [Box<str>; 2]
        );
        assert_eq!(r.len(), 2);
        removed.clear();
        r.admit("000006-6.envelope".into(), 100, 3, 40, &mut removed);
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
        r.admit("000000-3000.envelope".into(), 1, 3, u64::MAX, &mut removed);
        assert_eq!(
            removed,
            ["000000-1000.envelope".into(), "000001-1001.envelope".into()] as [Box<str>; 2]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
