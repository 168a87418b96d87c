//! Destinations besides Sentry, fed by the chunk thread with each
//! finished chunk: a pprof file and an OTLP file (each chunk written as it
//! finishes, into files rotated like log files, see [`FileRetention`]), and
//! an OTLP/HTTP endpoint (one request per chunk).
//!
//! Nothing accumulates across chunks: an exporter holds one chunk's profile
//! while it encodes it, so memory does not depend on how long the process
//! has run, and a process killed mid-run keeps every chunk that finished
//! before it.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::encode::otlp::export_request;
use crate::encode::pprof::PprofBuilder;
use crate::encode::view::ProfileView;

/// Time allowed for each step of an OTLP/HTTP request.
const HTTP_TIMEOUT: Duration = Duration::from_secs(2);

/// Default number of files a file export keeps (the newest and the rotated
/// ones): with 60 s chunks, the last ten minutes.
pub(crate) const DEFAULT_FILES_KEPT: usize = 10;
/// Default cap on the bytes a file export keeps on disk, all its files
/// together.
pub(crate) const DEFAULT_FILES_MAX_BYTES: u64 = 256 * 1024 * 1024;

/// Where profiles are exported, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum ExportTarget {
    /// A gzipped pprof `profile.proto` per chunk, rotated.
    PprofFile(PathBuf),
    /// An OTLP `ExportProfilesServiceRequest` (protobuf) per chunk, rotated.
    OtlpFile(PathBuf),
    /// An OTLP/HTTP collector: `http://host:port` (the path defaults to
    /// `/v1development/profiles`); one request per chunk.
    OtlpHttp(String),
}

/// How many exported files are kept, as log files are rotated: the newest
/// chunk at the configured path, the one before at `<path>.1`, then
/// `<path>.2`, and so on. The oldest are deleted beyond `kept` files, or
/// while all of them together exceed `max_bytes` (the newest always stays).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileRetention {
    pub(crate) kept: usize,
    pub(crate) max_bytes: u64,
}

impl Default for FileRetention {
    fn default() -> Self {
        Self {
            kept: DEFAULT_FILES_KEPT,
            max_bytes: DEFAULT_FILES_MAX_BYTES,
        }
    }
}

/// A running exporter.
#[derive(Debug)]
pub(crate) enum Exporter {
    PprofFile(RotatingFile),
    OtlpFile(RotatingFile),
    OtlpHttp {
        endpoint: HttpEndpoint,
        failures: u64,
    },
}

/// Outcome counters of the exporters.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ExportCounts {
    pub(crate) dropped: u64,
    pub(crate) failed: u64,
    pub(crate) sent: u64,
}

impl Exporter {
    pub(crate) fn new(target: &ExportTarget, retention: FileRetention) -> Result<Self, String> {
        Ok(match target {
            ExportTarget::PprofFile(path) => Self::PprofFile(RotatingFile::new(path, retention)),
            ExportTarget::OtlpFile(path) => Self::OtlpFile(RotatingFile::new(path, retention)),
            ExportTarget::OtlpHttp(url) => Self::OtlpHttp {
                endpoint: HttpEndpoint::parse(url)?,
                failures: 0,
            },
        })
    }

    /// Takes one finished chunk.
    pub(crate) fn export(&mut self, view: &ProfileView, service: &str, counts: &mut ExportCounts) {
        if view.samples.is_empty() {
            return;
        }
        match self {
            Self::PprofFile(file) => {
                let mut builder = PprofBuilder::new();
                builder.add(view);
                counts.dropped += builder.dropped();
                file.write(&builder.gzipped(), counts);
            }
            Self::OtlpFile(file) => {
                let bytes = prost::Message::encode_to_vec(&export_request(
                    std::slice::from_ref(view),
                    service,
                ));
                file.write(&bytes, counts);
            }
            Self::OtlpHttp { endpoint, failures } => {
                let body = prost::Message::encode_to_vec(&export_request(
                    std::slice::from_ref(view),
                    service,
                ));
                match endpoint.post(&body) {
                    Ok(()) => counts.sent += 1,
                    Err(e) => {
                        counts.failed += 1;
                        *failures += 1;
                        crate::error::log_throttled(*failures, || {
                            format!(
                                "OTLP export to {} failed ({} so far): {e}",
                                endpoint.url, failures
                            )
                        });
                    }
                }
            }
        }
    }
}

/// An export file and its rotated predecessors (see [`FileRetention`]).
#[derive(Debug)]
pub(crate) struct RotatingFile {
    path: PathBuf,
    retention: FileRetention,
    /// Writes that failed so far (the first ones are reported).
    failures: u64,
}

impl RotatingFile {
    fn new(path: &Path, retention: FileRetention) -> Self {
        Self {
            path: path.to_path_buf(),
            retention: FileRetention {
                kept: retention.kept.max(1),
                max_bytes: retention.max_bytes,
            },
            failures: 0,
        }
    }

    /// The `n`th rotated file (`n` ≥ 1): `<path>.<n>`.
    fn rotated(&self, n: usize) -> PathBuf {
        let mut name = self.path.clone().into_os_string();
        name.push(format!(".{n}"));
        PathBuf::from(name)
    }

    /// Writes `bytes` as the newest file, rotating the older ones.
    fn write(&mut self, bytes: &[u8], counts: &mut ExportCounts) {
        match self.try_write(bytes) {
            Ok(()) => counts.sent += 1,
            Err(e) => {
                counts.failed += 1;
                self.failures += 1;
                crate::error::log_throttled(self.failures, || {
                    format!(
                        "cannot write {} ({} failed so far): {e}",
                        self.path.display(),
                        self.failures
                    )
                });
            }
        }
    }

    fn try_write(&self, bytes: &[u8]) -> std::io::Result<()> {
        // Written beside the file, then renamed over it: a reader (or a
        // process killed mid-write) never sees half a profile.
        let mut partial = self.path.clone().into_os_string();
        partial.push(".partial");
        let partial = PathBuf::from(partial);
        std::fs::write(&partial, bytes)?;
        let kept = self.retention.kept;
        if kept > 1 {
            // Shift the rotated files up by one, dropping the oldest.
            let _ = std::fs::remove_file(self.rotated(kept - 1));
            for n in (1..kept - 1).rev() {
                let from = self.rotated(n);
                if from.exists() {
                    std::fs::rename(&from, self.rotated(n + 1))?;
                }
            }
            // A hard link keeps the newest file at its path until the
            // rename replaces it (a copy where links are not supported).
            if self.path.exists() {
                let first = self.rotated(1);
                if std::fs::hard_link(&self.path, &first).is_err() {
                    std::fs::copy(&self.path, &first)?;
                }
            }
        }
        std::fs::rename(&partial, &self.path)?;
        self.enforce_size_cap();
        Ok(())
    }

    /// Deletes the oldest rotated files while all of them together exceed
    /// the byte cap; the newest file always stays.
    fn enforce_size_cap(&self) {
        let mut total = std::fs::metadata(&self.path).map_or(0, |m| m.len());
        for n in 1..self.retention.kept {
            let path = self.rotated(n);
            let Ok(meta) = std::fs::metadata(&path) else {
                break;
            };
            total = total.saturating_add(meta.len());
            if total > self.retention.max_bytes {
                for m in n..self.retention.kept {
                    let _ = std::fs::remove_file(self.rotated(m));
                }
                break;
            }
        }
    }
}

/// A plain-HTTP OTLP endpoint.
#[derive(Debug, Clone)]
pub(crate) struct HttpEndpoint {
    url: String,
    host: String,
    port: u16,
    path: String,
}

impl HttpEndpoint {
    fn parse(url: &str) -> Result<Self, String> {
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            format!("OTLP endpoint {url:?}: only http:// endpoints are supported")
        })?;
        let (authority, path) = match rest.find('/') {
            Some(i) if i + 1 < rest.len() => (&rest[..i], rest[i..].to_owned()),
            Some(i) => (&rest[..i], "/v1development/profiles".to_owned()),
            None => (rest, "/v1development/profiles".to_owned()),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (
                h.to_owned(),
                p.parse()
                    .map_err(|_| format!("OTLP endpoint {url:?}: bad port"))?,
            ),
            None => (authority.to_owned(), 4318),
        };
        Ok(Self {
            url: url.to_owned(),
            host,
            port,
            path,
        })
    }

    fn post(&self, body: &[u8]) -> Result<(), String> {
        let addr = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| e.to_string())?
            .next()
            .ok_or("no address")?;
        let mut stream =
            TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).map_err(|e| e.to_string())?;
        stream
            .set_write_timeout(Some(HTTP_TIMEOUT))
            .map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(HTTP_TIMEOUT))
            .map_err(|e| e.to_string())?;
        let head = format!(
            "POST {} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.path,
            self.host,
            self.port,
            body.len()
        );
        stream
            .write_all(head.as_bytes())
            .map_err(|e| e.to_string())?;
        stream.write_all(body).map_err(|e| e.to_string())?;
        let mut status = [0u8; 12];
        stream.read_exact(&mut status).map_err(|e| e.to_string())?;
        match &status[9..12] {
            [b'2', _, _] => Ok(()),
            code => Err(format!("HTTP {}", String::from_utf8_lossy(code))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_endpoints() {
        let e = HttpEndpoint::parse("http://127.0.0.1:4318").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.path.as_str()),
            ("127.0.0.1", 4318, "/v1development/profiles")
        );
        let e = HttpEndpoint::parse("http://collector/custom/path").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.path.as_str()),
            ("collector", 4318, "/custom/path")
        );
        assert!(HttpEndpoint::parse("https://x").is_err());
    }

    /// A fresh directory of this test's own.
    fn test_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "sentry-profiling-export-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn contents(path: &Path) -> Option<String> {
        std::fs::read_to_string(path).ok()
    }

    #[test]
    fn rotates_like_log_files_and_keeps_at_most_kept() {
        let dir = test_dir("rotates");
        let path = dir.join("profile.pb.gz");
        let mut file = RotatingFile::new(
            &path,
            FileRetention {
                kept: 3,
                max_bytes: u64::MAX,
            },
        );
        let mut counts = ExportCounts::default();
        for i in 0..5 {
            file.write(format!("chunk {i}").as_bytes(), &mut counts);
        }
        assert_eq!(counts.sent, 5);
        assert_eq!(contents(&path).as_deref(), Some("chunk 4"));
        assert_eq!(contents(&file.rotated(1)).as_deref(), Some("chunk 3"));
        assert_eq!(contents(&file.rotated(2)).as_deref(), Some("chunk 2"));
        assert_eq!(contents(&file.rotated(3)), None);
        let names = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(names, 3, "no partial file is left behind");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn byte_cap_deletes_the_oldest_but_never_the_newest() {
        let dir = test_dir("byte-cap");
        let path = dir.join("profile.otlp.pb");
        let mut file = RotatingFile::new(
            &path,
            FileRetention {
                kept: 10,
                max_bytes: 25,
            },
        );
        let mut counts = ExportCounts::default();
        for i in 0..4 {
            file.write(format!("chunk {i}...").as_bytes(), &mut counts);
        }
        // 10 bytes each: the newest two fit in 25 bytes.
        assert_eq!(contents(&path).as_deref(), Some("chunk 3..."));
        assert_eq!(contents(&file.rotated(1)).as_deref(), Some("chunk 2..."));
        assert_eq!(contents(&file.rotated(2)), None);
        file.write(&[b'x'; 100], &mut counts);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 100);
        assert_eq!(contents(&file.rotated(1)), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_failed_write_is_counted_not_fatal() {
        let dir = test_dir("failed");
        let path = dir.join("missing-dir").join("profile.pb.gz");
        let mut file = RotatingFile::new(&path, FileRetention::default());
        let mut counts = ExportCounts::default();
        file.write(b"x", &mut counts);
        assert_eq!((counts.sent, counts.failed), (0, 1));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
