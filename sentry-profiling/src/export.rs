//! Destinations besides Sentry, fed by the profiler thread with each
//! finished chunk: a pprof file and an OTLP file (both written at shutdown,
//! for the whole session), and an OTLP/HTTP endpoint (one request per
//! chunk).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use crate::encode::otlp::export_request;
use crate::encode::pprof::PprofBuilder;
use crate::encode::view::ProfileView;

/// Most samples an OTLP file accumulates; later chunks are dropped (and
/// counted) beyond it.
const MAX_OTLP_FILE_SAMPLES: usize = 1_000_000;
/// Time allowed for each step of an OTLP/HTTP request.
const HTTP_TIMEOUT: Duration = Duration::from_secs(2);

/// Where profiles are exported, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum ExportTarget {
    /// A gzipped pprof `profile.proto`, written at shutdown.
    PprofFile(PathBuf),
    /// An OTLP `ExportProfilesServiceRequest` (protobuf), written at shutdown.
    OtlpFile(PathBuf),
    /// An OTLP/HTTP collector: `http://host:port` (the path defaults to
    /// `/v1development/profiles`); one request per chunk.
    OtlpHttp(String),
}

/// A running exporter.
#[derive(Debug)]
pub(crate) enum Exporter {
    PprofFile {
        path: PathBuf,
        builder: Box<PprofBuilder>,
    },
    OtlpFile {
        path: PathBuf,
        views: Vec<ProfileView>,
        samples: usize,
    },
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
    pub(crate) fn new(target: &ExportTarget) -> Result<Self, String> {
        Ok(match target {
            ExportTarget::PprofFile(path) => Self::PprofFile {
                path: path.clone(),
                builder: Box::new(PprofBuilder::new()),
            },
            ExportTarget::OtlpFile(path) => Self::OtlpFile {
                path: path.clone(),
                views: Vec::new(),
                samples: 0,
            },
            ExportTarget::OtlpHttp(url) => Self::OtlpHttp {
                endpoint: HttpEndpoint::parse(url)?,
                failures: 0,
            },
        })
    }

    /// Takes one finished chunk.
    pub(crate) fn export(&mut self, view: &ProfileView, service: &str, counts: &mut ExportCounts) {
        match self {
            Self::PprofFile { builder, .. } => builder.add(view),
            Self::OtlpFile { views, samples, .. } => {
                if *samples + view.samples.len() > MAX_OTLP_FILE_SAMPLES {
                    counts.dropped += view.samples.len() as u64;
                } else {
                    *samples += view.samples.len();
                    views.push(view.clone());
                }
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

    /// Writes what file exporters accumulated (at shutdown).
    pub(crate) fn finish(&mut self, service: &str, counts: &mut ExportCounts) {
        let result = match self {
            Self::PprofFile { path, builder } => {
                counts.dropped += builder.dropped();
                (!builder.is_empty()).then(|| (path.clone(), builder.gzipped()))
            }
            Self::OtlpFile { path, views, .. } => (!views.is_empty()).then(|| {
                (
                    path.clone(),
                    prost::Message::encode_to_vec(&export_request(views, service)),
                )
            }),
            Self::OtlpHttp { .. } => None,
        };
        if let Some((path, bytes)) = result {
            if let Err(e) = std::fs::write(&path, bytes) {
                counts.failed += 1;
                eprintln!("sentry-profiling: cannot write {}: {e}", path.display());
            } else {
                counts.sent += 1;
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
}
