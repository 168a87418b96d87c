//! The profiler thread: creates the sampler (paused), then takes its
//! samples every [`PROFILER_TICK`], and drives the chunk writer (which
//! pauses the sampler at the end of a chunk when no root span is active);
//! answers flush and shutdown commands. The lanes' events are read every
//! sampling period while requests come and go: by the sampler thread at
//! each tick while it ticks, else by this thread (see `lane_desk`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant};

use super::chunk_writer::ChunkWriter;
use super::lane_desk::{LaneDesk, tick_reader};
use super::v1::{PendingProfile, V1State};
use super::{Session, SessionConfig};
use crate::chunk::Chunk;
use crate::encode::sentry_chunk::ChunkMeta;
use crate::export::Exporter;
use crate::lanes::Lanes;
use crate::lanes::registry::{LaneReader, read_interval};
use crate::sampler::{Sampler, register_own_thread};
use crate::symbolize::Symbolizer;

/// How often the profiler thread takes the sampler's samples (and, with no
/// request in flight, reads the lane queue).
pub(super) const PROFILER_TICK: Duration = Duration::from_millis(100);

/// How often the profiler thread takes the sampler's samples while the
/// sampler dozes (the application idle, requests in flight or not): the
/// samples come in batches about that far apart, and a doze that ends early
/// wakes the thread.
const PROFILER_DOZE_TICK: Duration = Duration::from_millis(500);

/// How long the profiler thread sleeps while there is nothing to do at all:
/// the sampler paused, no lane in flight, no chunk or transaction profile
/// being built. Whatever gives it work wakes it (the first root span after
/// a pause, a lane piling up, a flush or shutdown request), so this only
/// bounds how often an idle process pays a wake-up.
const PROFILER_IDLE_TICK: Duration = Duration::from_secs(1);

/// Reads in a row that found no lane event and no poll after which the
/// profiler thread reads only at its tick (a lane that starts wakes it).
const QUIET_READS_BEFORE_SLEEPING: u32 = 3;

/// What an application thread asks of the profiler thread.
pub(super) enum Command {
    Flush(Sender<()>),
    Shutdown(Sender<()>),
}

impl Session {
    /// The profiler thread.
    pub(super) fn run(
        self: Arc<Self>,
        commands: Receiver<Command>,
        lane_events: LaneReader,
        v1_requests: Receiver<Box<dyn PendingProfile>>,
        ready: Sender<()>,
    ) {
        let _own = register_own_thread();
        let Some(config) = self.config().cloned() else {
            return;
        };
        let Some(sampler) = self.start_sampler(&config) else {
            return;
        };
        let _ = ready.send(());
        let mut builder = self.chunk_writer(&config, &sampler, lane_events, v1_requests);
        let period = Duration::from_nanos(builder.period_ns);
        let mut last_drain = Instant::now();
        // Reads in a row that found nothing (no lane event, no poll).
        let mut quiet_reads = 0u32;
        loop {
            match commands.try_recv() {
                Ok(Command::Flush(ack)) => {
                    builder.drain(&sampler);
                    builder.finish(&sampler);
                    let _ = ack.send(());
                }
                Ok(Command::Shutdown(ack)) => {
                    let modules = sampler.modules();
                    let (stats, rest) = sampler.stop_and_drain();
                    for s in &rest {
                        builder.push(s, &modules);
                    }
                    builder.finish_with(&modules);
                    *self
                        .last_sampler_stats
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()) = stats;
                    let _ = ack.send(());
                    return;
                }
                Err(_) => {}
            }
            self.wait_for_work(&sampler, &mut builder, &mut quiet_reads, last_drain, period);
            if last_drain.elapsed() >= PROFILER_TICK {
                last_drain = Instant::now();
                builder.drain(&sampler);
                builder.read_lane_events();
                builder.rotate_if_due(&sampler);
            }
        }
    }

    /// Creates the sampler, paused unless a root span is already active
    /// (roots may have started while it was being created); `None` (and
    /// profiling off for the session) if it cannot start.
    fn start_sampler(&self, config: &SessionConfig) -> Option<Sampler> {
        let sampler = match Sampler::start_paused(config.sampler.clone()) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("{e}; profiling disabled");
                self.session_sampled.store(false, Ordering::Release);
                return None;
            }
        };
        let _ = self.control.set(sampler.control());
        sampler.set_reader(std::thread::current());
        if self.active_roots.active() > 0 || self.manual_running.load(Ordering::Acquire) {
            sampler.resume();
        }
        Some(sampler)
    }

    /// The chunk writer of this session, and the lane desk it shares with
    /// the sampler's tick hook.
    fn chunk_writer<'a>(
        self: &'a Arc<Self>,
        config: &SessionConfig,
        sampler: &Sampler,
        lane_events: LaneReader,
        v1_requests: Receiver<Box<dyn PendingProfile>>,
    ) -> ChunkWriter<'a> {
        let meta = ChunkMeta {
            profiler_id: self.profiler_id.to_string(),
            release: config.release.clone(),
            environment: config.environment.clone(),
        };
        let period_ns = 1_000_000_000 / u64::from(config.sampler.frequency_hz.max(1));
        // Lanes Sentry would never show are worth keeping only for the
        // exports (their samples' request labels), transaction profiles,
        // or when asked for.
        let drop_unlinked =
            config.v1.is_none() && config.exports.is_empty() && !config.short_request_lanes;
        let desk = Arc::new(std::sync::Mutex::new(LaneDesk::new(
            Lanes::with_long_poll_ns(self.long_poll_ns()).drop_unlinked(drop_unlinked),
            lane_events,
            period_ns,
        )));
        sampler.set_tick_hook(Box::new(tick_reader(
            Arc::downgrade(self),
            Arc::clone(&desk),
        )));
        ChunkWriter {
            session: self,
            meta,
            chunk: Chunk::new(),
            symbolizer: config.symbolize.then(Symbolizer::new),
            chunk_duration: config.chunk_duration,
            desk,
            attribution: config.attribution,
            period_ns,
            filled_until_ns: 0,
            meter: Default::default(),
            exporters: config
                .exports
                .iter()
                .filter_map(|t| {
                    Exporter::new(t, config.file_retention)
                        .map_err(|e| eprintln!("sentry-profiling: {e}"))
                        .ok()
                })
                .collect(),
            service_name: config.service_name.clone(),
            v1: config.v1.is_some().then(|| V1State {
                requests: v1_requests,
                pending: Vec::new(),
                os_version: crate::kernel_release(),
            }),
            idle_ticks: 0,
        }
    }

    /// Sleeps until the next thing to do, taking samples in batches:
    /// sleeping instead of blocking on the queue spares the sampler a
    /// wake-up per sample (flush and shutdown requests unpark the thread).
    /// Lane ends and polls are read every sampling `period` while requests
    /// come and go, samples every tick. While the sampler ticks, it reads
    /// the lanes at each tick, and this thread wakes only at its own tick
    /// (the sampler wakes it when it stops ticking). Otherwise this thread
    /// reads them. Requests in flight that all wait (or none at all)
    /// change nothing: after a few empty reads (`quiet_reads`) the thread
    /// sleeps until its tick, and the next lane to start wakes it (see
    /// `LaneRegistry::set_reader_asleep`).
    fn wait_for_work(
        &self,
        sampler: &Sampler,
        builder: &mut ChunkWriter<'_>,
        quiet_reads: &mut u32,
        last_drain: Instant,
        period: Duration,
    ) {
        if sampler.reads_lanes() {
            sampler.sleep_while_reading_lanes(PROFILER_TICK.saturating_sub(last_drain.elapsed()));
            return;
        }
        let busy = (sampler.is_active() || self.lanes.in_flight() > 0)
            && *quiet_reads < QUIET_READS_BEFORE_SLEEPING;
        // Nothing to take at all: a paused sampler sends nothing, and an
        // empty chunk has nothing to rotate.
        let idle =
            !busy && !sampler.is_active() && self.lanes.in_flight() == 0 && builder.is_idle();
        let tick = if idle {
            PROFILER_IDLE_TICK
        } else if sampler.is_dozing() && !busy {
            PROFILER_DOZE_TICK
        } else {
            PROFILER_TICK
        };
        let wait = read_interval(busy, period, tick);
        let since = last_drain.elapsed();
        if !busy {
            self.lanes.set_reader_asleep(true);
        }
        std::thread::park_timeout(wait.min(tick.saturating_sub(since)));
        if !busy {
            self.lanes.set_reader_asleep(false);
        }
        if builder.read_lane_events() > 0 {
            // A request started, or a thread entered or left one: a dozing
            // sampler (the application used no CPU for a few ticks, which a
            // worker blocked in a request's poll does not either) looks at
            // the application again. A no-op unless it dozes.
            sampler.end_doze();
            *quiet_reads = 0;
        } else {
            *quiet_reads = quiet_reads.saturating_add(1);
        }
    }
}
