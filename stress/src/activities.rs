//! The workloads that run beside the profiler. Each one bumps its progress
//! counter as it goes (the watchdog reads them) and ends when `stop` is set.

use std::collections::VecDeque;
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One thread's life, as the thread itself recorded it: the ground truth
/// samples are checked against.
#[derive(Debug, Clone)]
pub(crate) struct Life {
    /// The thread's name as the kernel holds it (at most 15 bytes).
    pub(crate) name: String,
    pub(crate) tid: u32,
    /// Unix nanoseconds, taken by the thread when it started its work.
    pub(crate) start_ns: u64,
    /// Unix nanoseconds, taken by the thread when it finished its work
    /// (`u64::MAX` for threads still alive at the end).
    pub(crate) end_ns: u64,
    /// Whether the spawner started it (its parent's name may show in its
    /// first samples, before std names it).
    pub(crate) spawned: bool,
}

/// The name every churn thread's parent has.
pub(crate) const SPAWNER: &str = "st-spawner";
/// The prefix of churn threads' names.
pub(crate) const CHURN_PREFIX: &str = "sp-";

pub(crate) fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn tid() -> u32 {
    sentry_profiling::hooks::current_thread_id() as u32
}

/// Mixing rounds; the result depends on every round.
#[inline(never)]
pub(crate) fn mix(seed: u64, rounds: u64) -> u64 {
    let mut x = seed;
    for i in 0..rounds {
        x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i));
        x ^= x >> 29;
    }
    x
}

/// CPU time used by the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes to a valid local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Burns `cpu` of the calling thread's CPU time, or gives up after 2 s of
/// wall time on a starved machine.
#[inline(never)]
fn burn(cpu: Duration) -> u64 {
    let until = thread_cpu() + cpu;
    let wall_limit = Instant::now() + Duration::from_secs(2);
    let mut x = 1;
    while thread_cpu() < until && Instant::now() < wall_limit {
        x = mix(x, 2_000);
    }
    x
}

/// Works for about `busy`, then sleeps as long: every workload runs at
/// about half duty, so that the run loads the machine without starving it.
fn duty(busy: Duration, mut work: impl FnMut()) {
    let until = Instant::now() + busy;
    while Instant::now() < until {
        work();
    }
    std::thread::sleep(busy);
}

/// A named long-lived thread running `body` until `stop`; returns its life
/// and what `body` returned.
pub(crate) fn long_lived<R: Send + 'static>(
    name: &'static str,
    stack_size: Option<usize>,
    stop: &Arc<AtomicBool>,
    progress: &Arc<AtomicU64>,
    body: impl FnOnce(&Arc<AtomicBool>, &Arc<AtomicU64>) -> R + Send + 'static,
) -> std::thread::JoinHandle<(Life, R)> {
    let (stop, progress) = (Arc::clone(stop), Arc::clone(progress));
    let mut builder = std::thread::Builder::new().name(name.into());
    if let Some(size) = stack_size {
        builder = builder.stack_size(size);
    }
    builder
        .spawn(move || {
            let start_ns = now_ns();
            let out = body(&stop, &progress);
            let life = Life {
                name: name.into(),
                tid: tid(),
                start_ns,
                end_ns: now_ns(),
                spawned: false,
            };
            (life, out)
        })
        .unwrap_or_else(|e| panic!("cannot start thread {name}: {e}"))
}

/// Allocates and frees blocks of mixed sizes, from a few bytes to sizes
/// that glibc serves with `mmap`, keeping a few hundred alive, and now and
/// then frees everything so the heap shrinks. Counts rounds.
pub(crate) fn hammer_allocator(seed: u64, stop: &AtomicBool, progress: &AtomicU64) {
    let mut rng = seed | 1;
    let mut live: Vec<Vec<u8>> = Vec::with_capacity(512);
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        duty(Duration::from_millis(2), || {
            for _ in 0..64 {
                rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let r = rng >> 33;
                let size = match r % 100 {
                    0 => 256 * 1024 + (r as usize % (768 * 1024)),
                    1..=10 => 4096 + (r as usize % (60 * 1024)),
                    _ => 8 + (r as usize % 504),
                };
                let mut block = Vec::with_capacity(size);
                block.resize(size.min(256), r as u8);
                let text = format!("{r:x}-{size}");
                block.extend_from_slice(text.as_bytes());
                if live.len() < 512 {
                    live.push(block);
                } else {
                    let i = r as usize % live.len();
                    live[i] = block;
                }
            }
            round += 1;
            if round % 64 == 0 {
                live = Vec::with_capacity(512);
            }
            progress.fetch_add(1, Ordering::Relaxed);
        });
    }
}

/// What the spawner did.
#[derive(Debug, Default)]
pub(crate) struct Churn {
    pub(crate) lives: Vec<Life>,
    pub(crate) spawn_failures: u64,
}

/// Starts about `per_second` short-lived threads a second (each named
/// `sp-<n>`, recording its own life) and joins them. Every 50th lives about
/// 50 ms (burning, sleeping, burning) so that the sampler lists and samples
/// it; the others exit almost at once, so thread ids are used up, and
/// recycled, as fast as the kernel hands them out.
pub(crate) fn spawn_churn(per_second: u32, stop: &AtomicBool, progress: &AtomicU64) -> Churn {
    let period = Duration::from_secs(1) / per_second.max(1);
    let mut churn = Churn::default();
    let mut inflight: VecDeque<std::thread::JoinHandle<Life>> = VecDeque::new();
    let mut next = Instant::now();
    let mut n = 0u64;
    let join = |h: std::thread::JoinHandle<Life>, churn: &mut Churn| {
        churn.lives.push(h.join().expect("a churn thread panicked"));
        progress.fetch_add(1, Ordering::Relaxed);
    };
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now < next {
            std::thread::sleep(next - now);
        } else if now - next > Duration::from_millis(100) {
            // Far behind (a starved machine): do not try to catch up in a burst.
            next = now;
        }
        next += period;
        let long = n % 50 == 0;
        let name = format!("{CHURN_PREFIX}{n}");
        match std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || churn_thread(name, n, long))
        {
            Ok(h) => inflight.push_back(h),
            Err(_) => churn.spawn_failures += 1,
        }
        n += 1;
        while let Some(h) = inflight.front() {
            if !h.is_finished() && inflight.len() <= 64 {
                break;
            }
            let h = inflight.pop_front().expect("front exists");
            join(h, &mut churn);
        }
    }
    for h in inflight {
        join(h, &mut churn);
    }
    churn
}

fn churn_thread(name: String, n: u64, long: bool) -> Life {
    let start_ns = now_ns();
    let tid = tid();
    if long {
        std::hint::black_box(burn(Duration::from_millis(5)));
        std::thread::sleep(Duration::from_millis(40));
        std::hint::black_box(burn(Duration::from_millis(5)));
    } else {
        std::hint::black_box(mix(n, 2_000));
    }
    Life {
        name,
        tid,
        start_ns,
        end_ns: now_ns(),
        spawned: true,
    }
}

/// What the `dlopen` loop did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct DlCounts {
    pub(crate) cycles: u64,
    /// Cycles after which the loader no longer had the library (checked
    /// every 8th cycle with `RTLD_NOLOAD`).
    pub(crate) unmapped: u64,
    pub(crate) checked: u64,
}

/// The test library's spin function.
type SpinFn = unsafe extern "C" fn(u64, u64) -> u64;

const DL_ROUNDS: u64 = 400_000;

/// Loads the test library, runs its spin function (checking the result
/// against [`mix`]), and unloads it, over and over.
pub(crate) fn dlopen_loop(path: &str, stop: &AtomicBool, progress: &AtomicU64) -> DlCounts {
    let c_path = CString::new(path).expect("library path has no NUL");
    let mut counts = DlCounts::default();
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: `c_path` is a NUL-terminated path; the library runs no
        // initialisers beyond Rust's (none that matter here).
        let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!handle.is_null(), "dlopen {path}: {}", dl_error());
        // SAFETY: `handle` is a live handle from dlopen; the name is a C string.
        let sym = unsafe { libc::dlsym(handle, c"stress_cdylib_spin".as_ptr()) };
        assert!(!sym.is_null(), "dlsym stress_cdylib_spin: {}", dl_error());
        // SAFETY: the library defines `stress_cdylib_spin` with this
        // signature (stress/cdylib/src/lib.rs).
        let spin: SpinFn = unsafe { std::mem::transmute::<*mut libc::c_void, SpinFn>(sym) };
        let seed = counts.cycles;
        // SAFETY: the library stays loaded until the dlclose below.
        let got = unsafe { spin(seed, DL_ROUNDS) };
        let half = DL_ROUNDS / 2;
        let want = mix(seed, half) ^ mix(seed.rotate_left(7), DL_ROUNDS - half);
        assert_eq!(got, want, "the test library computed a wrong result");
        // SAFETY: `handle` came from dlopen and is closed once; nothing of
        // the library is used after this.
        let rc = unsafe { libc::dlclose(handle) };
        assert_eq!(rc, 0, "dlclose: {}", dl_error());
        counts.cycles += 1;
        if counts.cycles % 8 == 0 {
            counts.checked += 1;
            // SAFETY: RTLD_NOLOAD only looks the library up; a handle it
            // returns is closed at once, restoring the reference count.
            let again =
                unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
            if again.is_null() {
                counts.unmapped += 1;
            } else {
                // SAFETY: `again` is a live handle from dlopen, closed once.
                unsafe { libc::dlclose(again) };
            }
        }
        progress.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(1));
    }
    counts
}

fn dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string owned by the
    // loader, valid until the next dl* call on this thread.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        return "unknown error".into();
    }
    // SAFETY: non-null, NUL-terminated (above).
    unsafe { std::ffi::CStr::from_ptr(e) }
        .to_string_lossy()
        .into_owned()
}

/// The set of real-time signals, one of which the profiler samples with.
fn realtime_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set it is given.
    let mut set = unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        set
    };
    for sig in libc::SIGRTMIN()..=libc::SIGRTMAX() {
        // SAFETY: `set` is initialised and `sig` a valid signal number.
        unsafe { libc::sigaddset(&mut set, sig) };
    }
    set
}

/// Counts of the signal-blocking thread.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct BlockCounts {
    pub(crate) periods: u64,
    /// Blocked periods at whose end a real-time signal was pending (the
    /// profiler kept signalling the thread while it could not take it).
    pub(crate) pending_at_unblock: u64,
}

/// Works with every real-time signal (so the profiler's) blocked for about
/// a second at a time, then unblocked for 50 ms, which lets the queued,
/// long-abandoned signals in late.
pub(crate) fn block_signals(stop: &AtomicBool, progress: &AtomicU64) -> BlockCounts {
    let set = realtime_signals();
    let mut counts = BlockCounts::default();
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: `set` is an initialised signal set; the old mask is not wanted.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        assert_eq!(rc, 0, "pthread_sigmask(SIG_BLOCK)");
        let until = Instant::now() + Duration::from_secs(1);
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            duty(Duration::from_millis(5), || {
                std::hint::black_box(mix(7, 5_000));
            });
            progress.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: sigpending fills an initialised set.
        let pending = unsafe {
            let mut pending = std::mem::zeroed::<libc::sigset_t>();
            libc::sigemptyset(&mut pending);
            libc::sigpending(&mut pending);
            pending
        };
        if (libc::SIGRTMIN()..=libc::SIGRTMAX())
            // SAFETY: `pending` is an initialised set.
            .any(|sig| unsafe { libc::sigismember(&pending, sig) } == 1)
        {
            counts.pending_at_unblock += 1;
        }
        // SAFETY: as above.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
        assert_eq!(rc, 0, "pthread_sigmask(SIG_UNBLOCK)");
        counts.periods += 1;
        let until = Instant::now() + Duration::from_millis(50);
        while Instant::now() < until {
            duty(Duration::from_millis(5), || {
                std::hint::black_box(mix(9, 5_000));
            });
        }
        progress.fetch_add(1, Ordering::Relaxed);
    }
    counts
}

/// The small-stack thread's stack size.
pub(crate) const SMALL_STACK: usize = 32 * 1024;
/// Stack left free below the deepest frame of the small-stack thread, for
/// the kernel's signal frame and the profiler's handler.
const SMALL_STACK_HEADROOM: usize = 12 * 1024;

/// The lowest usable address of the calling thread's stack.
fn stack_low() -> usize {
    // SAFETY: pthread_getattr_np initialises `attr` for the calling thread;
    // it is destroyed after the stack is read from it.
    unsafe {
        let mut attr = std::mem::zeroed::<libc::pthread_attr_t>();
        assert_eq!(
            libc::pthread_getattr_np(libc::pthread_self(), &mut attr),
            0,
            "pthread_getattr_np"
        );
        let mut addr = std::ptr::null_mut();
        let mut size = 0;
        libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        addr as usize
    }
}

/// Recurses until only [`SMALL_STACK_HEADROOM`] bytes of stack are left,
/// then works there. Returns the depth reached and the work's result.
#[inline(never)]
fn descend(low: usize, depth: u32) -> (u32, u64) {
    let frame = std::hint::black_box([depth as u8; 256]);
    let here = std::ptr::addr_of!(frame) as usize;
    let (reached, below) = if here > low + SMALL_STACK_HEADROOM + 512 {
        descend(low, depth + 1)
    } else {
        (depth, mix(u64::from(depth), 20_000))
    };
    (
        reached,
        std::hint::black_box(below ^ u64::from(frame[depth as usize % 256])),
    )
}

/// Runs on a [`SMALL_STACK`]-byte stack without the alternate signal stack
/// std gives every thread, so the profiler's handler runs on what is left of
/// the small stack, and works near its bottom. Returns the deepest
/// recursion reached.
pub(crate) fn small_stack(stop: &AtomicBool, progress: &AtomicU64) -> u32 {
    let disable = libc::stack_t {
        ss_sp: std::ptr::null_mut(),
        ss_flags: libc::SS_DISABLE,
        ss_size: 0,
    };
    let mut old = libc::stack_t {
        ss_sp: std::ptr::null_mut(),
        ss_flags: 0,
        ss_size: 0,
    };
    // SAFETY: both stack_t values are valid; disabling the alternate stack
    // only affects this thread. std's own is restored before the thread
    // ends, for its cleanup.
    assert_eq!(unsafe { libc::sigaltstack(&disable, &mut old) }, 0);
    let low = stack_low();
    let mut depth = 0;
    while !stop.load(Ordering::Relaxed) {
        duty(Duration::from_millis(3), || {
            let (reached, value) = descend(low, 0);
            std::hint::black_box(value);
            depth = depth.max(reached);
        });
        progress.fetch_add(1, Ordering::Relaxed);
    }
    // SAFETY: `old` is the stack std installed (or a disabled one).
    unsafe { libc::sigaltstack(&old, std::ptr::null_mut()) };
    depth
}

/// Size of the alternate signal stack.
pub(crate) const ALT_STACK: usize = 64 * 1024;

static ALT_LO: AtomicU64 = AtomicU64::new(0);
static ALT_RUNS: AtomicU64 = AtomicU64::new(0);
static ALT_ON_STACK: AtomicU64 = AtomicU64::new(0);
static ALT_SINK: AtomicU64 = AtomicU64::new(0);

/// The alternate-stack thread's SIGUSR1 handler: about 2 ms of CPU work on
/// the alternate stack. Async-signal-safe: it calls only `clock_gettime`
/// and touches only atomics.
extern "C" fn on_usr1(_sig: libc::c_int) {
    let marker = 0u8;
    let here = std::ptr::addr_of!(marker) as u64;
    let lo = ALT_LO.load(Ordering::Relaxed);
    if here >= lo && here < lo + ALT_STACK as u64 {
        ALT_ON_STACK.fetch_add(1, Ordering::Relaxed);
    }
    let start = monotonic_ns();
    let mut x = here;
    while monotonic_ns().saturating_sub(start) < 2_000_000 {
        x = mix(x, 1_000);
    }
    ALT_SINK.store(x, Ordering::Relaxed);
    ALT_RUNS.fetch_add(1, Ordering::Relaxed);
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime is async-signal-safe and writes a local.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Counts of the alternate-stack thread.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct AltCounts {
    pub(crate) handler_runs: u64,
    pub(crate) on_alt_stack: u64,
}

/// Installs `stack` (heap memory, as many programs allocate it) as this
/// thread's alternate signal stack and a SIGUSR1 handler that runs on it,
/// then raises SIGUSR1 to itself over and over, so the profiler's signals
/// arrive while the thread is on the alternate stack.
pub(crate) fn alt_stack(stack: Box<[u8]>, stop: &AtomicBool, progress: &AtomicU64) -> AltCounts {
    assert_eq!(stack.len(), ALT_STACK);
    ALT_LO.store(stack.as_ptr() as u64, Ordering::Relaxed);
    let ss = libc::stack_t {
        ss_sp: stack.as_ptr() as *mut libc::c_void,
        ss_flags: 0,
        ss_size: stack.len(),
    };
    let mut old = libc::stack_t {
        ss_sp: std::ptr::null_mut(),
        ss_flags: 0,
        ss_size: 0,
    };
    // SAFETY: `stack` outlives its use as the alternate stack: std's stack
    // is restored below before `stack` is dropped.
    let rc = unsafe { libc::sigaltstack(&ss, &mut old) };
    assert_eq!(rc, 0, "sigaltstack");
    // SAFETY: a zeroed sigaction is a valid starting point; the handler is
    // an `extern "C" fn(c_int)` as SA_SIGINFO is not set.
    unsafe {
        let mut action = std::mem::zeroed::<libc::sigaction>();
        action.sa_sigaction = on_usr1 as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_ONSTACK | libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        assert_eq!(
            libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut()),
            0,
            "sigaction(SIGUSR1)"
        );
    }
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: signals this very thread, whose SIGUSR1 handler is installed.
        let rc = unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGUSR1) };
        assert_eq!(rc, 0, "pthread_kill(SIGUSR1)");
        progress.store(ALT_RUNS.load(Ordering::Relaxed), Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(2));
    }
    // SAFETY: `old` is the stack std installed for this thread.
    unsafe { libc::sigaltstack(&old, std::ptr::null_mut()) };
    drop(stack);
    AltCounts {
        handler_runs: ALT_RUNS.load(Ordering::Relaxed),
        on_alt_stack: ALT_ON_STACK.load(Ordering::Relaxed),
    }
}

/// Lives of the Tokio runtime's threads, recorded by its start and stop
/// hooks.
pub(crate) type TokioLives = Arc<Mutex<Vec<Life>>>;

/// The name of the Tokio runtime's threads.
pub(crate) const TOKIO_NAME: &str = "st-tokio";
const CLIENTS: usize = 4;

/// Runs an axum service on a two-worker Tokio runtime and `CLIENTS`
/// keep-alive clients hammering it over loopback; counts correct responses.
pub(crate) fn serve_http(lives: TokioLives, stop: &Arc<AtomicBool>, progress: &Arc<AtomicU64>) {
    let (on_start, on_stop) = (Arc::clone(&lives), Arc::clone(&lives));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(TOKIO_NAME)
        .on_thread_start(move || {
            on_start.lock().unwrap().push(Life {
                name: TOKIO_NAME.into(),
                tid: tid(),
                start_ns: now_ns(),
                end_ns: u64::MAX,
                spawned: false,
            });
        })
        .on_thread_stop(move || {
            let me = tid();
            let mut lives = on_stop.lock().unwrap();
            if let Some(l) = lives
                .iter_mut()
                .rev()
                .find(|l| l.tid == me && l.end_ns == u64::MAX)
            {
                l.end_ns = now_ns();
            }
        })
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        let app = axum::Router::new().route(
            "/work/{n}",
            axum::routing::get(
                |axum::extract::Path(n): axum::extract::Path<u64>| async move {
                    format!("{}", mix(n, 20_000))
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local address");
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let clients: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let (stop, progress) = (Arc::clone(stop), Arc::clone(progress));
                tokio::spawn(client(addr, c as u64, stop, progress))
            })
            .collect();
        for c in clients {
            c.await.expect("client task").expect("client");
        }
        server.abort();
    });
    drop(runtime);
}

async fn client(
    addr: std::net::SocketAddr,
    id: u64,
    stop: Arc<AtomicBool>,
    progress: Arc<AtomicU64>,
) -> std::io::Result<()> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let mut stream = tokio::io::BufReader::new(stream);
    let mut n = id << 40;
    let mut line = String::new();
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        let req = format!("GET /work/{n} HTTP/1.1\r\nHost: stress\r\n\r\n");
        stream.get_mut().write_all(req.as_bytes()).await?;
        let mut length = None;
        line.clear();
        stream.read_line(&mut line).await?;
        assert!(line.starts_with("HTTP/1.1 200"), "response: {line:?}");
        loop {
            line.clear();
            stream.read_line(&mut line).await?;
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((k, v)) = header.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse::<usize>().ok();
                }
            }
        }
        let mut body = vec![0; length.expect("content-length")];
        stream.read_exact(&mut body).await?;
        assert_eq!(
            body,
            mix(n, 20_000).to_string().into_bytes(),
            "wrong response body"
        );
        progress.fetch_add(1, Ordering::Relaxed);
        n += 1;
        if n % 8 == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}
