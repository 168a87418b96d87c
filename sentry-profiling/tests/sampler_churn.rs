//! Thread churn: a service that keeps starting and ending short-lived
//! threads can be profiled at the highest rate (1000 Hz) without crashing or
//! hanging the process, a long-lived thread keeps being sampled throughout,
//! and every sample names the thread it was taken on: the name and kernel
//! thread id of each sample of a short-lived thread match what that thread
//! recorded about itself, within its own lifetime.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sentry_profiling::{Sample, Sampler, SamplerConfig, SamplerControl};

const HZ: u32 = 1000;
const THREADS: usize = 200;
const WAVE: usize = 20;
/// The whole test must finish within this.
const BOUND: Duration = Duration::from_secs(60);
/// How long a gated wave waits for the sampler to list its threads.
const SEEN_TIMEOUT: Duration = Duration::from_secs(3);
/// Slack around a thread's recorded lifetime for its samples' timestamps
/// (thread start before the record, and exit after it).
const LIFETIME_SLACK_NS: u64 = 250_000_000;
/// Width of the windows in which `steady` must have samples.
const BUCKET_NS: u64 = 250_000_000;
const SPAWNER: &str = "spawner";
/// Ids of the short-lived threads' shared timelines start here, and their
/// names end with this (see the sampler's `short_lived` module).
const SHORT_LIVED_BASE: u64 = 500_000_000;
const SHORT_LIVED_SUFFIX: &str = " (short-lived threads)";
const STEADY: &str = "steady";

/// What a churn thread recorded about itself.
#[derive(Debug, Clone, Copy)]
struct Record {
    tid: u64,
    started_ns: u64,
    ended_ns: u64,
}

type Registry = Arc<Mutex<HashMap<String, Record>>>;

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// CPU time used by the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes to a valid local timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "CLOCK_THREAD_CPUTIME_ID");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Burns `cpu` of the thread's CPU time (at most 2 s of wall time).
#[inline(never)]
fn burn(cpu: Duration) -> u64 {
    let until_cpu = thread_cpu() + cpu;
    let wall_limit = Instant::now() + Duration::from_secs(2);
    let mut x = 1u64;
    while thread_cpu() < until_cpu && Instant::now() < wall_limit {
        for i in 0..1_000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    x
}

/// One short-lived thread: records its name and id, optionally waits at the
/// gate, burns 5 to 20 ms of CPU and exits.
fn churn_thread(n: usize, registry: Registry, gate: Option<Arc<Barrier>>) {
    let name = format!("churn-{n}");
    let started_ns = now_ns();
    let tid = sentry_profiling::hooks::current_thread_id();
    registry.lock().unwrap().insert(
        name.clone(),
        Record {
            tid,
            started_ns,
            ended_ns: u64::MAX,
        },
    );
    if let Some(gate) = gate {
        gate.wait();
    }
    std::hint::black_box(burn(Duration::from_millis(5 + (n % 16) as u64)));
    registry.lock().unwrap().get_mut(&name).unwrap().ended_ns = now_ns();
}

/// Starts the churn threads in waves of `WAVE`. Even waves are held at a
/// gate until the sampler has listed them (so they are sure to be sampled
/// while they burn and exit); odd waves run free, appearing and vanishing
/// between the sampler's thread-list refreshes.
fn spawn_waves(control: SamplerControl, registry: Registry) -> usize {
    let mut gated_seen = 0;
    for (wave, first) in (0..THREADS).step_by(WAVE).enumerate() {
        let gated = wave % 2 == 0;
        let gate = gated.then(|| Arc::new(Barrier::new(WAVE + 1)));
        let seen_before = control.stats().threads_seen;
        let handles: Vec<_> = (first..first + WAVE)
            .map(|n| {
                let registry = Arc::clone(&registry);
                let gate = gate.clone();
                std::thread::Builder::new()
                    .name(format!("churn-{n}"))
                    .spawn(move || churn_thread(n, registry, gate))
                    .unwrap()
            })
            .collect();
        if let Some(gate) = gate {
            let deadline = Instant::now() + SEEN_TIMEOUT;
            while control.stats().threads_seen < seen_before + WAVE as u64
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            if control.stats().threads_seen >= seen_before + WAVE as u64 {
                gated_seen += 1;
            }
            gate.wait();
        }
        for h in handles {
            h.join().unwrap();
        }
    }
    gated_seen
}

#[test]
fn thread_churn_at_1000_hz_keeps_samples_attributed_correctly() {
    let test_start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let steady = {
        let stop = Arc::clone(&stop);
        std::thread::Builder::new()
            .name(STEADY.into())
            .spawn(move || {
                let tid = sentry_profiling::hooks::current_thread_id();
                let mut x = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    for i in 0..10_000u64 {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(i),
                        );
                    }
                }
                std::hint::black_box(x);
                tid
            })
            .unwrap()
    };
    // Let `steady` set its name before the sampler lists threads.
    std::thread::sleep(Duration::from_millis(50));

    let sampler =
        Sampler::start(SamplerConfig::default().frequency_hz(HZ)).expect("sampler starts");
    let sampling_from = now_ns();
    let registry: Registry = Arc::default();
    let spawner = {
        let control = sampler.control();
        let registry = Arc::clone(&registry);
        std::thread::Builder::new()
            .name(SPAWNER.into())
            .spawn(move || spawn_waves(control, registry))
            .unwrap()
    };

    let mut samples: Vec<Sample> = Vec::new();
    while !spawner.is_finished() {
        assert!(
            test_start.elapsed() < BOUND,
            "thread churn did not finish within {BOUND:?}"
        );
        if let Some(s) = sampler.recv_timeout(Duration::from_millis(20)) {
            samples.push(s);
        }
        samples.extend(sampler.try_iter());
    }
    let gated_seen = spawner.join().unwrap();
    let sampling_to = now_ns();
    samples.extend(sampler.try_iter());
    let stopping = Instant::now();
    let stats = sampler.stop();
    let stop_took = stopping.elapsed();
    stop.store(true, Ordering::Relaxed);
    let steady_tid = steady.join().unwrap();
    let total_time = test_start.elapsed();

    let registry = registry.lock().unwrap().clone();
    let names_by_tid: HashMap<u64, Vec<&str>> =
        registry.iter().fold(HashMap::new(), |mut m, (name, r)| {
            m.entry(r.tid).or_default().push(name.as_str());
            m
        });

    let mut churn_samples = 0;
    let mut churn_captured = 0;
    let mut stale_named = 0;
    let mut stale_tids = std::collections::HashSet::new();
    let mut churn_threads_sampled: HashMap<&str, usize> = HashMap::new();
    let mut steady_buckets = vec![0usize; ((sampling_to - sampling_from) / BUCKET_NS + 1) as usize];
    for s in &samples {
        let full_name = &**s.thread_name();
        let tid = u64::from(s.thread_id());
        // A thread that lived between two listings is sampled by the
        // process-wide timer and filed on the shared timeline of its
        // name's short-lived threads, whose id is none of a thread's: its
        // name is the thread's, with a suffix saying so.
        let shared = tid >= SHORT_LIVED_BASE;
        let name = if shared {
            full_name
                .strip_suffix(SHORT_LIVED_SUFFIX)
                .unwrap_or_else(|| panic!("a shared timeline named {full_name:?}"))
        } else {
            full_name
        };
        if let Some(rest) = name.strip_prefix("churn-") {
            let record = registry.get(name).unwrap_or_else(|| {
                panic!("sample named {name:?} (tid {tid}) but no such thread recorded itself")
            });
            assert!(
                shared || tid == record.tid,
                "a sample named {name:?} has tid {tid}, but {name} recorded tid {}",
                record.tid
            );
            let ts = s.timestamp_ns();
            assert!(
                ts + LIFETIME_SLACK_NS >= record.started_ns
                    && ts <= record.ended_ns.saturating_add(LIFETIME_SLACK_NS),
                "a sample of {name} (tid {tid}) is stamped {ts}, outside its lifetime {}..{}",
                record.started_ns,
                record.ended_ns
            );
            assert!(rest.parse::<usize>().is_ok_and(|n| n < THREADS));
            churn_samples += 1;
            churn_captured += usize::from(!s.is_repeated());
            *churn_threads_sampled.entry(name).or_default() += 1;
        } else if let Some(names) = names_by_tid.get(&tid) {
            // A churn thread's id under another name: only the name it
            // inherited from its parent is accepted. The sampler reads a
            // thread's name when it first lists it and again only at its
            // 1 s refresh, so a thread listed between its creation and std
            // naming it keeps the parent's name until then (printed below
            // as `stale_named`).
            assert_eq!(
                name, SPAWNER,
                "a sample of tid {tid} (recorded by {names:?}) is named {name:?}"
            );
            stale_named += 1;
            stale_tids.insert(tid);
        } else if name == STEADY {
            assert_eq!(tid, steady_tid, "a sample named {STEADY} has another tid");
            let ts = s.timestamp_ns();
            if (sampling_from..sampling_to).contains(&ts) {
                steady_buckets[((ts - sampling_from) / BUCKET_NS) as usize] += 1;
            }
        }
    }
    // The last bucket is usually partial; judge only the full ones.
    let full_buckets = ((sampling_to - sampling_from) / BUCKET_NS) as usize;
    // The first window is left out: a thread's first capture only teaches
    // the sampler its stack bounds, and on a busy machine the spinning
    // thread may need more than a window of wall time for its first two
    // periods of CPU time.
    let steady_full = &steady_buckets[1.min(full_buckets)..full_buckets];
    let steady_min = steady_full.iter().copied().min().unwrap_or(0);
    let steady_total: usize = steady_buckets.iter().sum();
    let (churn_threads, gated_waves, sampled_threads, stale_threads, bucket_ms) = (
        registry.len(),
        THREADS / WAVE / 2,
        churn_threads_sampled.len(),
        stale_tids.len(),
        BUCKET_NS / 1_000_000,
    );
    eprintln!(
        "total_time={total_time:?} stop_took={stop_took:?} churn_threads={churn_threads} \
         gated_waves_seen={gated_seen}/{gated_waves} churn_threads_sampled={sampled_threads} \
         churn_samples={churn_samples} churn_captured={churn_captured} \
         stale_named={stale_named} (of {stale_threads} threads) steady_samples={steady_total} \
         steady_per_{bucket_ms}ms={steady_buckets:?} stats={stats:?}"
    );

    assert_eq!(registry.len(), THREADS, "not every churn thread ran");
    assert!(
        registry.values().all(|r| r.ended_ns != u64::MAX),
        "a churn thread did not finish"
    );
    assert!(
        total_time < BOUND,
        "the test took {total_time:?}, more than {BOUND:?}"
    );
    assert!(
        stop_took < Duration::from_secs(2),
        "stopping the sampler took {stop_took:?}"
    );
    // The gated waves were listed and released, so many churn threads must
    // have been sampled; otherwise the attribution checks above were vacuous.
    assert!(
        churn_threads_sampled.len() >= WAVE * 2,
        "only {} churn threads were sampled",
        churn_threads_sampled.len()
    );
    assert!(
        churn_captured >= 100,
        "only {churn_captured} captured samples of churn threads"
    );
    assert!(full_buckets >= 4, "the churn phase was too short to judge");
    assert!(
        steady_min >= 10,
        "`{STEADY}` went a {}ms window with only {steady_min} samples: {steady_buckets:?}",
        BUCKET_NS / 1_000_000
    );
}
