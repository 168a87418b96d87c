//! A Sentry envelope endpoint on loopback whose behaviour can be switched
//! while a test runs: healthy, down, resetting connections, answering 503,
//! stalling, or rate-limiting profile chunks or transactions. It keeps every request it
//! read, with its arrival time and the answer it got.
//!
//! Plain threads and blocking sockets: one acceptor thread (which closes
//! the listener while the endpoint is down and binds the same port again
//! afterwards) and a thread per connection. Every answer closes its
//! connection, so clients reconnect for each request and a switch of mode
//! takes effect at once.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How the endpoint behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every request is answered `200 {}`.
    Healthy,
    /// Nothing listens on the port: connections are refused.
    Down,
    /// Connections are accepted and closed at once, unread (a reset).
    Reset,
    /// Requests are read and answered `503`.
    Unavailable,
    /// Requests are read and never answered; the connection stays open,
    /// silent, until the endpoint is dropped, even after the mode changes
    /// (as behind a black-holing network path): only a client-side timeout
    /// ends such a request.
    Stall,
    /// Envelopes with a `profile_chunk` item get
    /// `X-Sentry-Rate-Limits: <secs>:profile_chunk:organization`, with a
    /// `429` when that was their only item, or a `200` when they carried
    /// another (a client report), as Relay answers when it drops some of an
    /// envelope's items; other envelopes get a plain `200`.
    RateLimitChunks {
        /// The limit's length in seconds.
        secs: u32,
    },
    /// Envelopes with a `transaction` item get `429` with
    /// `X-Sentry-Rate-Limits: <secs>:transaction:organization`, as Sentry
    /// answers once an organization's transaction quota is spent; other
    /// envelopes get a plain `200`.
    RateLimitTransactions {
        /// The limit's length in seconds.
        secs: u32,
    },
}

/// One request as the endpoint saw it.
#[derive(Debug, Clone)]
pub struct Request {
    /// When its head had been read.
    pub at: Instant,
    /// The mode it was served in.
    pub mode: Mode,
    /// The request path.
    pub path: String,
    /// The body (by `Content-Length`).
    pub body: Vec<u8>,
    /// The status answered; `None` if it was never answered.
    pub status: Option<u16>,
    /// Whether the answer set a rate limit.
    pub rate_limited: bool,
}

impl Request {
    /// Whether the envelope holds an item of type `kind`.
    pub fn has_item(&self, kind: &str) -> bool {
        crate::parse_envelope(&self.body)
            .items
            .iter()
            .any(|i| i.header.get("type").and_then(serde_json::Value::as_str) == Some(kind))
    }
}

#[derive(Debug)]
struct State {
    mode: Mutex<Mode>,
    requests: Mutex<Vec<Request>>,
    /// Whether requests are kept (see [`FakeSentry::discard_requests`]).
    keep: AtomicBool,
    stop: AtomicBool,
}

impl State {
    fn mode(&self) -> Mode {
        *self.mode.lock().unwrap()
    }
}

/// The endpoint (see the module documentation). Stops when dropped.
#[derive(Debug)]
pub struct FakeSentry {
    addr: SocketAddr,
    state: Arc<State>,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

impl FakeSentry {
    /// Starts a healthy endpoint on a free loopback port.
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().expect("local address");
        let state = Arc::new(State {
            mode: Mutex::new(Mode::Healthy),
            requests: Mutex::new(Vec::new()),
            keep: AtomicBool::new(true),
            stop: AtomicBool::new(false),
        });
        let acceptor_state = Arc::clone(&state);
        let acceptor = std::thread::Builder::new()
            .name("fake-sentry".into())
            .spawn(move || accept_loop(Some(listener), addr, &acceptor_state))
            .expect("spawn the acceptor");
        Self {
            addr,
            state,
            acceptor: Some(acceptor),
        }
    }

    /// A DSN for project 1 on this endpoint.
    pub fn dsn(&self) -> String {
        format!("http://public@{}/1", self.addr)
    }

    /// Client options sending here, as a profiled service's would:
    /// `release`, every transaction sampled, the profiling session sampled
    /// with the trace lifecycle and 1 s chunks, applied with the crate's own
    /// HTTP delivery (no transport of the application's own).
    pub fn profiled_options(&self, release: &str) -> sentry::ClientOptions {
        let mut options = sentry::ClientOptions::new().traces_sample_rate(1.0);
        options.dsn = self.dsn().parse().ok();
        options.release = Some(release.to_owned().into());
        sentry_profiling::ProfilingIntegration::new()
            .profile_session_sample_rate(1.0)
            .profile_lifecycle(sentry_profiling::ProfileLifecycle::Trace)
            .chunk_duration(Duration::from_secs(1))
            .apply(options)
    }

    /// Switches the behaviour (for connections accepted from now on).
    pub fn set_mode(&self, mode: Mode) {
        *self.state.mode.lock().unwrap() = mode;
    }

    /// Answers from now on without keeping the requests (for long runs at
    /// high rates, whose envelopes would fill the test's memory).
    pub fn discard_requests(&self) {
        self.state.keep.store(false, Ordering::Release);
    }

    /// Every request so far (that was kept).
    pub fn requests(&self) -> Vec<Request> {
        self.state.requests.lock().unwrap().clone()
    }
}

impl Drop for FakeSentry {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Release);
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(mut listener: Option<TcpListener>, addr: SocketAddr, state: &Arc<State>) {
    while !state.stop.load(Ordering::Acquire) {
        let down = state.mode() == Mode::Down;
        if down {
            // Closing the listener makes the kernel refuse connections.
            listener = None;
        } else if listener.is_none() {
            // The standard library sets SO_REUSEADDR, so the port is ours
            // again at once.
            listener = TcpListener::bind(addr).ok();
        }
        let Some(l) = &listener else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        l.set_nonblocking(true).expect("non-blocking listener");
        match l.accept() {
            Ok((stream, _)) => {
                let state = Arc::clone(state);
                let _ = std::thread::Builder::new()
                    .name("fake-sentry-conn".into())
                    .spawn(move || serve(stream, &state));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Reads one request's head and body; `None` on a closed or broken
/// connection.
fn read_request(stream: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 64 * 1024];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
        let n = stream.read(&mut tmp).ok().filter(|n| *n > 0)?;
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let path = head.split(' ').nth(1).unwrap_or_default().to_owned();
    let header = |name: &str| {
        head.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_owned())
    };
    let len: usize = header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf.split_off(head_end + 4);
    while body.len() < len {
        let n = stream.read(&mut tmp).ok().filter(|n| *n > 0)?;
        body.extend_from_slice(&tmp[..n]);
    }
    body.truncate(len);
    let body = crate::decode_body(header("content-encoding").as_deref(), &body)?;
    Some((path, body))
}

fn serve(mut stream: TcpStream, state: &State) {
    let mode = state.mode();
    if mode == Mode::Reset || mode == Mode::Down {
        return;
    }
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let Some((path, body)) = read_request(&mut stream) else {
        return;
    };
    let at = Instant::now();
    let mode = state.mode();
    let has = |kind: &[u8]| body.windows(kind.len()).any(|w| w == kind);
    let is_chunk = has(b"\"type\":\"profile_chunk\"");
    let is_transaction = has(b"\"type\":\"transaction\"");
    let (status, extra) = match mode {
        Mode::Healthy => (Some(200), String::new()),
        Mode::Down | Mode::Reset => (None, String::new()),
        Mode::Unavailable => (Some(503), String::new()),
        Mode::Stall => (None, String::new()),
        Mode::RateLimitChunks { secs } if is_chunk => {
            let others = crate::parse_envelope(&body).items.len() > 1;
            (
                Some(if others { 200 } else { 429 }),
                format!("X-Sentry-Rate-Limits: {secs}:profile_chunk:organization\r\n"),
            )
        }
        Mode::RateLimitChunks { .. } => (Some(200), String::new()),
        Mode::RateLimitTransactions { secs } if is_transaction => (
            Some(429),
            format!("X-Sentry-Rate-Limits: {secs}:transaction:organization\r\n"),
        ),
        Mode::RateLimitTransactions { .. } => (Some(200), String::new()),
    };
    if state.keep.load(Ordering::Acquire) {
        state.requests.lock().unwrap().push(Request {
            at,
            mode,
            path,
            body,
            status,
            rate_limited: !extra.is_empty(),
        });
    }
    match status {
        Some(code) => {
            let reason = match code {
                200 => "OK",
                429 => "Too Many Requests",
                _ => "Service Unavailable",
            };
            let response = format!(
                "HTTP/1.1 {code} {reason}\r\n{extra}Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
            );
            let _ = stream.write_all(response.as_bytes());
        }
        None if mode == Mode::Stall => {
            // Hold the connection, unanswered, until the endpoint stops.
            while !state.stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        None => {}
    }
}
