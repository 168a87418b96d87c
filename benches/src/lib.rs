//! Workloads shared by the benchmarks: threads parked at a chosen stack
//! depth, busy or idle.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

/// Recurses `depth` frames (each with a small live buffer, as real frames
/// have), then runs `at_bottom`.
#[inline(never)]
pub fn at_depth(depth: usize, at_bottom: &dyn Fn()) -> u64 {
    let pad = std::hint::black_box([depth as u64; 8]);
    if depth <= 1 {
        at_bottom();
        return pad[0];
    }
    std::hint::black_box(at_depth(depth - 1, at_bottom)).wrapping_add(pad[7])
}

/// Spins on the CPU until `stop`.
pub fn spin(stop: &AtomicBool) {
    let mut x = 1u64;
    while !stop.load(Ordering::Relaxed) {
        for i in 0..1_000u64 {
            x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i));
        }
    }
}

/// Spins for `d`, or until `stop`.
pub fn spin_for(stop: &AtomicBool, d: std::time::Duration) {
    let until = std::time::Instant::now() + d;
    let mut x = 1u64;
    while std::time::Instant::now() < until && !stop.load(Ordering::Relaxed) {
        for i in 0..100u64 {
            x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i));
        }
    }
}

/// Parks until `stop`: blocked in the kernel the whole time, as an idle
/// Tokio worker or a thread waiting on a lock is, and woken only by
/// [`Workers`]' drop.
pub fn park(stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        std::thread::park();
    }
}

/// A set of worker threads, stopped and joined on drop.
#[derive(Debug)]
pub struct Workers {
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<()>>,
}

impl Workers {
    /// `n` threads at `depth`, spinning when `busy`, sleeping otherwise.
    pub fn start(n: usize, depth: usize, busy: bool) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let handles = (0..n)
            .map(|i| {
                let stop = Arc::clone(&stop);
                std::thread::Builder::new()
                    .name(format!("bench-{i}"))
                    .spawn(move || {
                        at_depth(depth, &|| if busy { spin(&stop) } else { park(&stop) });
                    })
                    .expect("spawn")
            })
            .collect();
        Self { stop, handles }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for h in &self.handles {
            h.thread().unpark();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// The headers of an HTTP/1.1 message that the loopback benchmarks' own
/// client and sink need.
#[derive(Debug, Default, Clone, Copy)]
pub struct Http1Headers {
    /// `Content-Length` (0 when absent).
    pub content_length: usize,
    /// `Content-Encoding: gzip`.
    pub gzip: bool,
}

/// Reads one line into `line` (cleared first); false at the end of the
/// stream or on an error.
pub fn read_line(r: &mut impl std::io::BufRead, line: &mut String) -> bool {
    line.clear();
    r.read_line(line).ok().filter(|n| *n > 0).is_some()
}

/// Reads header lines up to the blank line that ends them; `None` if the
/// stream ends or fails first. `line` is scratch space.
pub fn read_headers(r: &mut impl std::io::BufRead, line: &mut String) -> Option<Http1Headers> {
    let mut h = Http1Headers::default();
    loop {
        if !read_line(r, line) {
            return None;
        }
        let l = line.trim_end();
        if l.is_empty() {
            return Some(h);
        }
        if let Some((k, v)) = l.split_once(':') {
            if k.trim().eq_ignore_ascii_case("content-length") {
                h.content_length = v.trim().parse().unwrap_or(0);
            } else if k.trim().eq_ignore_ascii_case("content-encoding") {
                h.gzip = v.trim().eq_ignore_ascii_case("gzip");
            }
        }
    }
}
