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
