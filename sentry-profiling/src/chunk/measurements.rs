//! Process measurements that travel with each chunk: CPU usage and
//! resident memory, about every [`MEASUREMENT_INTERVAL`], which Sentry's
//! profile page draws as charts above the flame graph.
//!
//! Both come from `/proc/self` (plain file reads, no unsafe code): CPU time
//! from `stat` (user + system time, in the kernel's `USER_HZ` ticks, 100 per
//! second on every Linux ABI this crate supports), resident memory from
//! `status` (`VmRSS`, in kB, so no page-size lookup is needed). CPU usage
//! is the share of one core the whole process used since the previous
//! measurement (100 = one core busy); with 10 ms ticks a 100 ms interval
//! reads in steps of 10, which averages out over the chart. Where `/proc`
//! is missing, nothing is measured.

use std::time::Duration;

use super::Chunk;

/// How often the process is measured.
pub(crate) const MEASUREMENT_INTERVAL: Duration = Duration::from_millis(100);

/// Most measurements one chunk holds (a 60 s chunk needs 600).
const MAX_PER_CHUNK: usize = 1_000;

/// `USER_HZ`: the unit of `/proc/*/stat` times (fixed at 100 by the ABI on
/// x86_64 and aarch64).
const TICK_NS: u64 = 10_000_000;

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
        let memory_footprint_bytes = resident_bytes();
        if cpu_usage_percent.is_some() || memory_footprint_bytes.is_some() {
            chunk.measurements.push(Measurement {
                timestamp_ns: now,
                cpu_usage_percent,
                memory_footprint_bytes,
            });
        }
    }
}

/// User + system CPU time of the whole process so far.
fn process_cpu_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_cpu_ticks(&stat).map(|t| t.saturating_mul(TICK_NS))
}

/// utime + stime from a `/proc/<pid>/stat` line. The command name (field
/// 2) may hold spaces and parentheses, so fields are counted after its last
/// `)`: state is the first there, utime the 12th, stime the 13th.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_rss(&status)
}

/// `VmRSS` from `/proc/<pid>/status`, in bytes.
fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kb.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        let stat = "4242 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 150 25 0 0 20 0 9 0 100";
        assert_eq!(parse_cpu_ticks(stat), Some(175));
        let status = "Name:\tx\nVmPeak:\t  10 kB\nVmRSS:\t   2048 kB\nThreads:\t3\n";
        assert_eq!(parse_vm_rss(status), Some(2048 * 1024));
        assert_eq!(parse_vm_rss("Name: x\n"), None);
    }

    // Burns its own CPU time, read through `sys` (Linux only).
    #[cfg(profiling_supported)]
    #[test]
    fn measures_a_busy_process_at_most_every_interval() {
        use crate::Sample;
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
            // kernel counts process CPU in 10 ms steps, and the interval
            // measured began before the burn); at most every core.
            assert!(
                cpu >= share * 0.5 - 10.0 && cpu > 0.0 && cpu < 100.0 * 64.0,
                "cpu {cpu}, this thread's share {share:.1}"
            );
            assert!(m[0].memory_footprint_bytes.unwrap() > 1024 * 1024);
        }
    }
}
