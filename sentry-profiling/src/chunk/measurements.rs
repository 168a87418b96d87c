//! Process measurements that travel with each chunk: CPU usage and
//! resident memory, about every [`MEASUREMENT_INTERVAL`], which Sentry's
//! profile page draws as charts above the flame graph.
//!
//! CPU time is the process's CPU clock (`CLOCK_PROCESS_CPUTIME_ID`, one
//! system call, nanoseconds), resident memory the second field of
//! `/proc/self/statm` (pages): both cheap, since the chunk thread takes
//! them ten times a second for as long as the sampler runs, idle service
//! included (`status`, which the kernel formats line by line, and `stat`
//! cost several times more, and were most of the chunk thread's time in
//! an idle service). CPU usage is the share of one core the whole process
//! used since the previous measurement (100 = one core busy). Where the
//! sampler is not supported (no chunks), or `/proc` is missing, nothing is
//! measured.

use std::time::Duration;

use super::Chunk;

/// How often the process is measured.
pub(crate) const MEASUREMENT_INTERVAL: Duration = Duration::from_millis(100);

/// Most measurements one chunk holds (a 60 s chunk needs 600).
const MAX_PER_CHUNK: usize = 1_000;

/// One measurement of the process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Measurement {
    /// When it was taken, nanoseconds since the Unix epoch.
    pub(crate) timestamp_ns: u64,
    /// CPU used since the previous measurement, in percent of one core.
    pub(crate) cpu_usage_percent: Option<f64>,
    /// Resident memory, bytes.
    pub(crate) memory_footprint_bytes: Option<u64>,
}

/// Takes measurements at most every [`MEASUREMENT_INTERVAL`]; keeps the last
/// CPU reading across chunks.
#[derive(Debug, Default)]
pub(crate) struct ProcessMeter {
    /// (wall ns, process CPU ns) of the last reading.
    last: Option<(u64, u64)>,
    /// `/proc/self/statm`, kept open: reading it again from offset 0 makes
    /// the kernel write it anew, and spares a path lookup each time.
    statm: Option<std::fs::File>,
}

impl ProcessMeter {
    /// Records a measurement into `chunk` if one is due and the chunk is
    /// collecting samples (a paused profiler measures nothing).
    pub(crate) fn measure_into(&mut self, chunk: &mut Chunk) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let interval = MEASUREMENT_INTERVAL.as_nanos() as u64;
        if self
            .last
            .is_some_and(|(t, _)| now.saturating_sub(t) < interval * 9 / 10)
        {
            return;
        }
        let cpu = process_cpu_ns();
        let previous = self.last.take();
        if let Some(cpu) = cpu {
            self.last = Some((now, cpu));
        }
        if chunk.is_empty() || chunk.measurements.len() >= MAX_PER_CHUNK {
            return;
        }
        let cpu_usage_percent = match (previous, cpu) {
            (Some((t0, c0)), Some(c1)) if now > t0 => {
                Some(c1.saturating_sub(c0) as f64 * 100.0 / now.saturating_sub(t0) as f64)
            }
            _ => None,
        };
        let memory_footprint_bytes = self.resident_bytes();
        if cpu_usage_percent.is_some() || memory_footprint_bytes.is_some() {
            chunk.measurements.push(Measurement {
                timestamp_ns: now,
                cpu_usage_percent,
                memory_footprint_bytes,
            });
        }
    }
}

/// CPU time of the whole process so far.
fn process_cpu_ns() -> Option<u64> {
    #[cfg(profiling_supported)]
    {
        Some(crate::sys::process_cpu_time_ns()).filter(|ns| *ns > 0)
    }
    #[cfg(not(profiling_supported))]
    {
        None
    }
}

impl ProcessMeter {
    /// Resident memory, from `/proc/self/statm`.
    fn resident_bytes(&mut self) -> Option<u64> {
        #[cfg(profiling_supported)]
        {
            use std::os::unix::fs::FileExt;
            if self.statm.is_none() {
                self.statm = std::fs::File::open("/proc/self/statm").ok();
            }
            let mut buf = [0u8; 128];
            let n = self.statm.as_ref()?.read_at(&mut buf, 0).ok()?;
            parse_statm_resident(
                std::str::from_utf8(&buf[..n]).ok()?,
                crate::sys::page_size(),
            )
        }
        #[cfg(not(profiling_supported))]
        {
            None
        }
    }
}

/// The resident set (second field of `/proc/<pid>/statm`, in pages), in
/// bytes.
fn parse_statm_resident(statm: &str, page_size: u64) -> Option<u64> {
    let pages: u64 = statm.split_ascii_whitespace().nth(1)?.parse().ok()?;
    pages.checked_mul(page_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_statm() {
        assert_eq!(
            parse_statm_resident("2600 512 300 10 0 700 0\n", 4096),
            Some(512 * 4096)
        );
        assert_eq!(parse_statm_resident("2600\n", 4096), None);
    }

    // Burns its own CPU time, read through `sys` (Linux only).
    #[cfg(profiling_supported)]
    #[test]
    fn measures_a_busy_process_at_most_every_interval() {
        use crate::sampler::Sample;
        use std::sync::Arc;

        let mut chunk = Chunk::new();
        let mut meter = ProcessMeter::default();
        meter.measure_into(&mut chunk);
        assert!(
            chunk.measurements().is_empty(),
            "an empty chunk (paused profiler) gets none"
        );
        chunk.push(&Sample::new(
            1,
            1,
            Arc::from("t"),
            Arc::from(&[1u64][..]),
            0,
            false,
        ));
        meter.measure_into(&mut chunk);
        assert!(chunk.measurements().is_empty(), "not due yet");
        // Burn CPU on this thread for two intervals of its own CPU time
        // (on a busy machine that takes longer than two intervals).
        let wall = std::time::Instant::now();
        let cpu_before = crate::sys::own_cpu_time_ns();
        let mut x = 0u64;
        while crate::sys::own_cpu_time_ns().saturating_sub(cpu_before)
            < MEASUREMENT_INTERVAL.as_nanos() as u64 * 2
        {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let used = crate::sys::own_cpu_time_ns().saturating_sub(cpu_before);
        meter.measure_into(&mut chunk);
        let share = used as f64 / wall.elapsed().as_nanos().max(1) as f64 * 100.0;
        let m = chunk.measurements();
        if std::path::Path::new("/proc/self/stat").exists() {
            assert_eq!(m.len(), 1);
            let cpu = m[0].cpu_usage_percent.unwrap();
            // At least this thread's share of a core while it burned (the
            // interval measured began before the burn); at most every core.
            assert!(
                cpu >= share * 0.5 - 10.0 && cpu > 0.0 && cpu < 100.0 * 64.0,
                "cpu {cpu}, this thread's share {share:.1}"
            );
            assert!(m[0].memory_footprint_bytes.unwrap() > 1024 * 1024);
        }
    }
}
