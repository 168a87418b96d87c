//! Stack bounds that went stale must not crash the sampled thread.
//!
//! The sampler learns a thread's stack bounds from `/proc/self/maps` and the
//! signal handler copies from the stack pointer up to them. A mapping can
//! shrink after that. The stress run (`cargo xtask stress`) found it with
//! ordinary thread stacks, which `/proc/self/maps` can list as one mapping
//! with a neighbouring region that is later unmapped: the handler read past
//! the end of the memory and the process died of SIGSEGV. Both cases here
//! crashed before the fix: a thread whose stack is the lower part of a
//! mapping whose upper part is unmapped while it runs, and a thread working
//! inside a signal handler on an alternate stack in such a mapping.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sentry_profiling::{Sampler, SamplerConfig};

const PAGE: usize = 4096;
/// The whole mapping; the alternate stack is its lower half.
const MAP_LEN: usize = 64 * PAGE;
const ALT_LEN: usize = MAP_LEN / 2;

static ENTERED: AtomicBool = AtomicBool::new(false);
static RELEASE: AtomicBool = AtomicBool::new(false);
static SINK: AtomicU64 = AtomicU64::new(0);
static OWN_TID: AtomicU32 = AtomicU32::new(0);
static OWN_RELEASE: AtomicBool = AtomicBool::new(false);

/// A thread on a stack the test provides: records its id and spins until
/// released.
extern "C" fn spin_on_given_stack(_arg: *mut libc::c_void) -> *mut libc::c_void {
    OWN_TID.store(
        sentry_profiling::hooks::current_thread_id() as u32,
        Ordering::Relaxed,
    );
    let mut x = 1u64;
    while !OWN_RELEASE.load(Ordering::Relaxed) {
        for i in 0..10_000u64 {
            x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i));
        }
    }
    SINK.store(x, Ordering::Relaxed);
    std::ptr::null_mut()
}

fn map_anonymous(len: usize) -> usize {
    // SAFETY: an anonymous private mapping; the callers unmap it.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    map as usize
}

/// A thread whose stack is the lower half of a mapping: the upper half is
/// unmapped while it is sampled.
fn own_stack_phase(sampler: &Sampler) -> (usize, usize) {
    let map = map_anonymous(MAP_LEN);
    // SAFETY: `attr` is initialised before use and destroyed after; the
    // stack (the lower half of the mapping) outlives the thread, which is
    // joined before it is unmapped.
    let thread = unsafe {
        let mut attr = std::mem::zeroed::<libc::pthread_attr_t>();
        assert_eq!(libc::pthread_attr_init(&mut attr), 0);
        assert_eq!(
            libc::pthread_attr_setstack(&mut attr, map as *mut libc::c_void, ALT_LEN),
            0
        );
        let mut thread = std::mem::zeroed::<libc::pthread_t>();
        let rc = libc::pthread_create(
            &mut thread,
            &attr,
            spin_on_given_stack,
            std::ptr::null_mut(),
        );
        assert_eq!(rc, 0, "pthread_create");
        libc::pthread_attr_destroy(&mut attr);
        thread
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while OWN_TID.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "the thread never started");
        std::thread::sleep(Duration::from_millis(1));
    }
    let tid = OWN_TID.load(Ordering::Relaxed);
    let before = samples_of(sampler, tid, Duration::from_millis(300));
    // SAFETY: the upper half is not the thread's stack and nothing uses it.
    let rc = unsafe { libc::munmap((map + ALT_LEN) as *mut libc::c_void, MAP_LEN - ALT_LEN) };
    assert_eq!(rc, 0, "munmap of the upper half");
    let after = samples_of(sampler, tid, Duration::from_millis(500));
    OWN_RELEASE.store(true, Ordering::Relaxed);
    // SAFETY: `thread` is joinable and joined once; then its stack goes.
    unsafe {
        assert_eq!(libc::pthread_join(thread, std::ptr::null_mut()), 0);
        libc::munmap(map as *mut libc::c_void, ALT_LEN);
    }
    (before, after)
}

/// Spins on the alternate stack until released. Async-signal-safe: atomics
/// only.
extern "C" fn spin_on_alt_stack(_sig: libc::c_int) {
    ENTERED.store(true, Ordering::Relaxed);
    let mut x = 1u64;
    while !RELEASE.load(Ordering::Relaxed) {
        for i in 0..10_000u64 {
            x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i));
        }
    }
    SINK.store(x, Ordering::Relaxed);
}

/// Samples of thread `tid` received within `d`.
fn samples_of(sampler: &Sampler, tid: u32, d: Duration) -> usize {
    let until = Instant::now() + d;
    let mut n = 0;
    while Instant::now() < until {
        if let Some(s) = sampler.recv_timeout(Duration::from_millis(20)) {
            n += usize::from(s.thread_id() == tid && !s.is_repeated());
        }
    }
    n
}

#[test]
fn a_shrunk_stack_mapping_does_not_crash_the_sampled_thread() {
    let sampler =
        Sampler::start(SamplerConfig::default().frequency_hz(1000)).expect("sampler starts");
    let (own_before, own_after) = own_stack_phase(&sampler);
    eprintln!("own stack: before={own_before} after={own_after}");
    assert!(
        own_before > 0,
        "the thread on a given stack was not sampled"
    );
    assert!(
        own_after > 0,
        "the thread on a given stack was not sampled after its mapping shrank"
    );

    let map = map_anonymous(MAP_LEN);
    let worker = std::thread::Builder::new()
        .name("alt-stack".into())
        .spawn(move || {
            let ss = libc::stack_t {
                ss_sp: map as *mut libc::c_void,
                ss_flags: 0,
                ss_size: ALT_LEN,
            };
            // SAFETY: the lower half of the mapping stays mapped until after
            // this thread is joined.
            assert_eq!(unsafe { libc::sigaltstack(&ss, std::ptr::null_mut()) }, 0);
            // SAFETY: a zeroed sigaction with a plain handler (no SA_SIGINFO).
            unsafe {
                let mut action = std::mem::zeroed::<libc::sigaction>();
                action.sa_sigaction = spin_on_alt_stack as extern "C" fn(libc::c_int) as usize;
                action.sa_flags = libc::SA_ONSTACK;
                libc::sigemptyset(&mut action.sa_mask);
                assert_eq!(
                    libc::sigaction(libc::SIGUSR2, &action, std::ptr::null_mut()),
                    0
                );
                // The handler runs before pthread_kill returns.
                assert_eq!(libc::pthread_kill(libc::pthread_self(), libc::SIGUSR2), 0);
            }
            let disable = libc::stack_t {
                ss_sp: std::ptr::null_mut(),
                ss_flags: libc::SS_DISABLE,
                ss_size: 0,
            };
            // SAFETY: disables the alternate stack before the mapping goes.
            unsafe { libc::sigaltstack(&disable, std::ptr::null_mut()) };
        })
        .unwrap();
    let tid = {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ENTERED.load(Ordering::Relaxed) {
            assert!(Instant::now() < deadline, "the handler never ran");
            std::thread::sleep(Duration::from_millis(1));
        }
        // The worker is the only thread named so.
        let mut tid = None;
        while tid.is_none() {
            assert!(Instant::now() < deadline, "the worker was never sampled");
            if let Some(s) = sampler.recv_timeout(Duration::from_millis(20)) {
                if &**s.thread_name() == "alt-stack" && !s.is_repeated() {
                    tid = Some(s.thread_id());
                }
            }
        }
        tid.unwrap()
    };

    // The sampler has learned the whole mapping as the worker's stack.
    let before = samples_of(&sampler, tid, Duration::from_millis(300));
    // SAFETY: the upper half is not the alternate stack and nothing else
    // uses it.
    let rc = unsafe { libc::munmap((map + ALT_LEN) as *mut libc::c_void, MAP_LEN - ALT_LEN) };
    assert_eq!(rc, 0, "munmap of the upper half");
    let after = samples_of(&sampler, tid, Duration::from_millis(500));
    RELEASE.store(true, Ordering::Relaxed);
    worker.join().unwrap();
    let stats = sampler.stop();
    // SAFETY: the lower half, no longer an alternate stack.
    unsafe { libc::munmap(map as *mut libc::c_void, ALT_LEN) };
    eprintln!("before={before} after={after} stats={stats:?}");
    assert!(
        before > 0,
        "the worker was not sampled on its alternate stack"
    );
    assert!(
        after > 0,
        "the worker was not sampled after its stack mapping shrank"
    );
}
