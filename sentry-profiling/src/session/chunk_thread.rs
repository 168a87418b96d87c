//! The chunk thread: creates the sampler (paused), its consumer the
//! session's intake, then takes the batches the sampler thread hands on
//! (samples and context-word changes, about every 100 ms while it samples)
//! into the session's [`Writer`]: the chunk writer, which reads the lane
//! queue, builds the chunk in progress and, when it is due, fills it in,
//! encodes, exports and sends it (pausing the sampler at the end of a chunk
//! when no root span is active), or transaction profiles' writer (see
//! `v1`). Flush and shutdown come with the batches: the sampler thread
//! takes the commands and hands on everything it holds with them.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use super::chunk_writer::ChunkWriter;
use super::desk::{Desk, Writer};
use super::intake::{BATCHES_WAITING, Command, Intake};
use super::v1::{PendingProfile, ProfileWriter};
use super::{Session, SessionConfig};
use crate::blocking::watch::Watch;
use crate::encode::sentry_chunk::ChunkMeta;
use crate::export::Exporter;
use crate::lanes::Lanes;
use crate::lanes::registry::LaneReader;
use crate::sampler::{Sampler, register_own_thread};
use crate::symbolize::Symbolizer;

/// How long the chunk thread waits for a batch while it holds a chunk or
/// transaction profiles in progress: with the sampler paused no batch
/// comes, and the chunk still ends on time. Half a second, a doze's
/// length: a dozing sampler hands a batch on at each of its ticks, and
/// the chunk thread wakes for those only.
const CHUNK_TICK: Duration = Duration::from_millis(500);

/// How long the chunk thread waits for a batch while it holds nothing
/// that time alone would make it write: this only bounds how often an idle
/// process pays a wake-up (the lane queue is read then).
const IDLE_TICK: Duration = Duration::from_secs(1);

impl Session {
    /// The chunk thread.
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
        let (to_chunks, batches) = std::sync::mpsc::sync_channel(BATCHES_WAITING);
        let (spare, spares) = std::sync::mpsc::channel();
        let intake = Intake::new(
            Arc::clone(&self),
            commands,
            to_chunks,
            spares,
            config.sampler.queue_capacity,
        );
        let Some(sampler) = self.start_sampler(&config, intake) else {
            return;
        };
        let _ = ready.send(());
        let mut writer = self.writer(&config, lane_events, v1_requests);
        let mut shutdown_acks = Vec::new();
        loop {
            let wait = if writer.is_idle() {
                IDLE_TICK
            } else {
                CHUNK_TICK
            };
            let modules = sampler.modules();
            match batches.recv_timeout(wait) {
                Ok(mut batch) => {
                    writer.take(&mut batch, &modules);
                    for command in batch.commands.drain(..) {
                        match command {
                            Command::Flush(ack) => {
                                writer.write_all(&modules);
                                let _ = ack.send(());
                            }
                            Command::Shutdown(ack) => shutdown_acks.push(ack),
                        }
                    }
                    let last = std::mem::take(&mut batch.last);
                    let _ = spare.send(batch);
                    if last {
                        break;
                    }
                }
                Err(RecvTimeoutError::Timeout) => writer.read_lane_events(),
                // The sampler thread ended without its last batch.
                Err(RecvTimeoutError::Disconnected) => break,
            }
            writer.write_due(&modules);
            writer.tend_blocking(&modules, false);
        }
        let modules = sampler.modules();
        writer.write_all(&modules);
        // The blocking polls' windows still open are sent now, before the
        // shutdown's acknowledgement lets the transport close.
        writer.tend_blocking(&modules, true);
        *self
            .last_sampler_stats
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = sampler.stop();
        for ack in shutdown_acks {
            let _ = ack.send(());
        }
    }

    /// Creates the sampler, handing its samples to `intake`, paused unless
    /// a root span is already active (roots may have started while it was
    /// being created); `None` (and profiling off for the session) if it
    /// cannot start.
    fn start_sampler(&self, config: &SessionConfig, intake: Intake) -> Option<Sampler> {
        let sampler = match Sampler::start_feeding(config.sampler.clone(), Box::new(intake)) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("{e}; profiling disabled");
                self.session_sampled.store(false, Ordering::Release);
                return None;
            }
        };
        let control = sampler.control();
        let wake = control.clone();
        self.lanes.set_wake(Box::new(move || wake.wake()));
        let _ = self.control.set(control);
        if self.active_roots.active() > 0 || self.manual_running.load(Ordering::Acquire) {
            sampler.resume();
        }
        Some(sampler)
    }

    /// The session's writer: the chunk writer, or transaction profiles'.
    fn writer<'a>(
        self: &'a Arc<Self>,
        config: &SessionConfig,
        lane_events: LaneReader,
        v1_requests: Receiver<Box<dyn PendingProfile>>,
    ) -> Box<dyn Writer + 'a> {
        let period_ns = 1_000_000_000 / u64::from(config.sampler.frequency_hz.max(1));
        // Lanes Sentry would never show are worth keeping only for the
        // exports (their samples' request labels), transaction profiles,
        // when asked for, or when a blocking poll can be that short: a
        // short request's lane is forgotten as soon as its transaction's
        // window is read, which can come before its poll's end.
        let blocking = config.blocking;
        let short_blocking =
            blocking.enabled && blocking.threshold_ns() < crate::lanes::SHORTEST_LINKED_NS;
        let drop_unlinked = config.v1.is_none()
            && config.exports.is_empty()
            && !config.short_request_lanes
            && !short_blocking;
        let desk = Desk::new(
            self,
            Lanes::with_long_poll_ns(self.long_poll_ns())
                .drop_unlinked(drop_unlinked)
                .with_blocking_ns(blocking.threshold_ns()),
            lane_events,
            period_ns,
        )
        .watching(blocking.enabled.then(|| Watch::new(blocking)));
        let symbolizer = config.symbolize.then(Symbolizer::new);
        if config.v1.is_some() {
            return Box::new(ProfileWriter {
                desk,
                symbolizer,
                attribution: config.attribution,
                period_ns,
                release: config.release.clone(),
                environment: config.environment.clone(),
                os_version: crate::kernel_release(),
                requests: v1_requests,
                pending: Vec::new(),
                idle_since: None,
            });
        }
        Box::new(ChunkWriter {
            desk,
            meta: ChunkMeta {
                profiler_id: self.profiler_id.to_string(),
                release: config.release.clone(),
                environment: config.environment.clone(),
            },
            symbolizer,
            chunk_duration: config.chunk_duration,
            attribution: config.attribution,
            period_ns,
            filled_until_ns: 0,
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
        })
    }
}
