//! Criterion micro-benchmarks of the consumer side, per sample, on real
//! samples: 16 busy threads with changing stacks are sampled for 2 s by the
//! real sampler first, then
//!
//! - `chunk_push`: adding every sample to a chunk (interning stacks),
//! - `encode_chunk`: encoding that chunk to `profile_chunk` JSON, without
//!   and with symbolication (the symbolizer is warmed first, as the profiler
//!   thread's is after its first chunk).
//!
//! Throughput is reported per sample. `cargo bench -p
//! sentry-profiling-benches --bench encode` (`-- --test` runs each once).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use sentry_profiling::hooks::workspace::{Chunk, ChunkMeta, encode_chunk};
use sentry_profiling::{ModuleSet, Sample, Sampler, SamplerConfig, Symbolizer};
use sentry_profiling_benches::{at_depth, spin_for};

fn collect(secs: f64) -> (Vec<Sample>, Arc<ModuleSet>) {
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..16)
        .map(|i| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut depth = 5 + i;
                while !stop.load(Ordering::Relaxed) {
                    at_depth(depth, &|| spin_for(&stop, Duration::from_micros(500)));
                    depth = if depth >= 60 { 5 } else { depth + 1 };
                }
            })
        })
        .collect();
    let sampler = Sampler::start(SamplerConfig::default()).expect("sampler");
    let started = Instant::now();
    let mut samples = Vec::new();
    while started.elapsed().as_secs_f64() < secs {
        std::thread::sleep(Duration::from_millis(100));
        samples.extend(sampler.try_iter());
    }
    let modules = sampler.modules();
    let _ = sampler.stop();
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.join();
    }
    (samples, modules)
}

fn benches(c: &mut Criterion) {
    let (samples, modules) = collect(2.0);
    let meta = ChunkMeta {
        profiler_id: "0".repeat(32),
        release: "bench".into(),
        environment: None,
    };
    let mut chunk = Chunk::new();
    for s in &samples {
        chunk.push(s);
    }
    let key = |_: usize, s: &sentry_profiling::hooks::workspace::ChunkSample| {
        Some((u64::from(s.thread_id), None))
    };

    let mut group = c.benchmark_group("per_sample");
    group.throughput(Throughput::Elements(samples.len() as u64));
    group.sample_size(20);
    group.bench_function("chunk_push", |b| {
        b.iter_batched(
            Chunk::new,
            |mut chunk| {
                for s in &samples {
                    chunk.push(s);
                }
                chunk
            },
            BatchSize::LargeInput,
        )
    });
    group.bench_function("encode_chunk", |b| {
        b.iter(|| encode_chunk(&meta, &chunk, &modules, None, &key))
    });
    let mut symbolizer = Symbolizer::new();
    let _ = encode_chunk(&meta, &chunk, &modules, Some(&mut symbolizer), &key);
    group.bench_function("encode_chunk_symbolized", |b| {
        b.iter(|| encode_chunk(&meta, &chunk, &modules, Some(&mut symbolizer), &key))
    });
    group.finish();
}

criterion_group!(encode, benches);
criterion_main!(encode);
