//! A global allocator that counts the allocator calls (allocations,
//! reallocations and frees) of the threads that ask, for tests that assert
//! a path never allocates. Included with `#[path]` by each such test binary
//! (a global allocator serves its whole process), which declares
//! `#[global_allocator] static ALLOCATOR: Counting = Counting;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    /// Whether this thread's allocator calls are counted. `const`-initialised
    /// with no destructor: touching it from the allocator never allocates.
    static TRACKING: Cell<bool> = const { Cell::new(false) };
    /// Allocator calls made by this thread while tracking.
    static CALLS: Cell<u64> = const { Cell::new(0) };
}

fn count_call() {
    if TRACKING.get() {
        CALLS.set(CALLS.get() + 1);
    }
}

/// `System`, counting the calls made by tracking threads.
pub(crate) struct Counting;

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged; the counting only touches const thread-locals.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_call();
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_call();
        // SAFETY: the caller's contract for `alloc_zeroed` is passed on unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_call();
        // SAFETY: the caller's contract for `realloc` is passed on unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count_call();
        // SAFETY: the caller's contract for `dealloc` is passed on unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Counts the calling thread's allocator calls while `f` runs.
pub(crate) fn tracked<R>(f: impl FnOnce() -> R) -> (R, u64) {
    CALLS.set(0);
    TRACKING.set(true);
    let out = f();
    TRACKING.set(false);
    (out, CALLS.get())
}
