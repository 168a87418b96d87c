//! A chunk resolved for export: every sample with its OS thread, the span
//! it belongs to, and symbolised frames; the input of the pprof and OTLP
//! encoders, which share one set of linking rules with the Sentry chunk.

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

use crate::chunk::Chunk;
use crate::frames::synthetic_frame;
use crate::lanes::{LaneLink, Lanes};
use crate::symbolize::Symbolizer;
use crate::unwind::{ModuleInfo, ModuleSet};

/// A frame: a code address (for a synthetic frame such as a lane's
/// "suspended", an address below every mapping), its function if
/// symbolised, and its module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ViewFrame {
    /// Code address (for callers, return address − 1).
    pub address: Option<u64>,
    /// Demangled function name.
    pub function: Option<Arc<str>>,
    /// Index into [`ProfileView::modules`].
    pub module: Option<usize>,
}

/// A sample with everything exporters label it with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ViewSample {
    /// Capture time, nanoseconds since the Unix epoch.
    pub timestamp_ns: u64,
    /// Kernel thread id; `None` for a lane's fill-in sample.
    pub thread_id: Option<u32>,
    /// The thread's name.
    pub thread_name: Option<Arc<str>>,
    /// Index into [`ProfileView::stacks`].
    pub stack: usize,
    /// The root span it ran for, if any.
    pub link: Option<Arc<LaneLink>>,
    /// Taken inside a long poll of its request (see
    /// [`Lanes::long_polls`]): labelled [`LONG_POLL_LABEL`].
    pub long_poll: bool,
}

/// The pprof label and OTLP attribute (`"true"`) on samples taken inside a
/// poll of a request longer than the long-poll threshold: what blocked a
/// Tokio worker.
pub(crate) const LONG_POLL_LABEL: &str = "tokio.long_poll";

/// One chunk, resolved.
#[derive(Debug, Clone, Default)]
pub(crate) struct ProfileView {
    /// Samples in time order.
    pub samples: Vec<ViewSample>,
    /// Stacks as frame indices, leaf first.
    pub stacks: Vec<Vec<usize>>,
    /// Frames.
    pub frames: Vec<ViewFrame>,
    /// Modules frames point into.
    pub modules: Vec<Arc<ModuleInfo>>,
    /// Sampling period, nanoseconds.
    pub period_ns: u64,
}

impl ProfileView {
    /// Resolves `chunk`: frames symbolised (when `symbolizer` is given),
    /// samples of known lanes linked to their root span.
    pub(crate) fn build(
        chunk: &Chunk,
        lanes: &Lanes,
        modules: &ModuleSet,
        mut symbolizer: Option<&mut Symbolizer>,
        period_ns: u64,
    ) -> Self {
        let mut view = ProfileView {
            period_ns,
            ..Default::default()
        };
        let mut frame_index: HashMap<u64, usize> = HashMap::default();
        let mut module_index: HashMap<u64, usize> = HashMap::default();
        for stack in chunk.stacks() {
            let ids = stack
                .iter()
                .map(|&addr| {
                    *frame_index.entry(addr).or_insert_with(|| {
                        let frame = if let Some((out, name)) = synthetic_frame(addr) {
                            ViewFrame {
                                address: Some(out),
                                function: Some(Arc::from(name)),
                                module: None,
                            }
                        } else {
                            let module = modules.find(addr).map(|m| {
                                *module_index.entry(m.start).or_insert_with(|| {
                                    view.modules.push(Arc::clone(m));
                                    view.modules.len() - 1
                                })
                            });
                            let function =
                                symbolizer.as_mut().and_then(|s| s.function(modules, addr));
                            ViewFrame {
                                address: Some(addr),
                                function,
                                module,
                            }
                        };
                        view.frames.push(frame);
                        view.frames.len() - 1
                    })
                })
                .collect();
            view.stacks.push(ids);
        }
        let long_polls = lanes.long_polls();
        let mut samples: Vec<ViewSample> = chunk
            .samples()
            .iter()
            .map(|s| ViewSample {
                timestamp_ns: s.timestamp_ns,
                thread_id: (s.thread_id != 0).then_some(s.thread_id),
                thread_name: chunk.thread_name(s.thread_id).cloned(),
                stack: s.stack as usize,
                link: lanes.link(s.context).cloned(),
                long_poll: long_polls.holds(s.context, s.thread_id, s.timestamp_ns),
            })
            // A fill-in sample means something only with its lane.
            .filter(|s| s.thread_id.is_some() || s.link.is_some())
            .collect();
        samples.sort_by_key(|s| s.timestamp_ns);
        view.samples = samples;
        view
    }

    /// Earliest and latest sample timestamps.
    pub(crate) fn span_ns(&self) -> Option<(u64, u64)> {
        Some((
            self.samples.first()?.timestamp_ns,
            self.samples.last()?.timestamp_ns,
        ))
    }
}
