//! Why requests waited, from the poll totals `sentry-profiling-tracing`'s
//! `http_layer()` puts on each request's transaction: time polled, queued
//! for a Tokio worker, and awaiting, per transaction and summed per
//! transaction name (a name that queues is short of workers; one that
//! awaits waits on I/O), and the run's longest polls with the stack their
//! request's lane shows during them (what blocked a worker).

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::flame::Flame;
use crate::model::{Run, Transaction};
use crate::totals::{PollTotals, round_ms};

/// The longest polls the page lists.
pub(crate) const MAX_LONGEST_POLLS: usize = 20;

/// The poll totals of one transaction name's transactions.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct NameTotals {
    /// Its transactions that carry totals (the means are over these).
    pub(crate) transactions: usize,
    /// Their summed duration, ms: the denominator of the shares.
    pub(crate) duration_ms: f64,
    pub(crate) polls: u64,
    pub(crate) polled_ms: f64,
    pub(crate) queued_ms: f64,
    pub(crate) awaiting_ms: f64,
    pub(crate) cpu_wait_ms: f64,
    /// Their offloaded work: ran, of that waiting for a CPU, queued.
    pub(crate) offloaded_ms: f64,
    pub(crate) offloaded_cpu_wait_ms: f64,
    pub(crate) offloaded_queued_ms: f64,
    /// The longest poll of any of them.
    pub(crate) longest_ms: f64,
    pub(crate) long_polls: u64,
}

impl NameTotals {
    pub(crate) fn add(&mut self, totals: &PollTotals, duration_ns: u64) {
        self.transactions += 1;
        self.duration_ms += duration_ns as f64 / 1e6;
        self.polls += totals.polls;
        self.polled_ms += totals.polled_ms;
        self.queued_ms += totals.queued_ms;
        self.awaiting_ms += totals.awaiting_ms;
        self.cpu_wait_ms += totals.cpu_wait_ms;
        self.offloaded_ms += totals.offloaded_ms;
        self.offloaded_cpu_wait_ms += totals.offloaded_cpu_wait_ms;
        self.offloaded_queued_ms += totals.offloaded_queued_ms;
        self.longest_ms = self.longest_ms.max(totals.longest_ms);
        self.long_polls += totals.long_polls;
    }

    /// The share of its transactions' time spent queued for a worker. The
    /// three parts start at the first poll, a little after the
    /// transaction, so their sum can fall short of the duration; it is the
    /// denominator only when it exceeds it, so shares never pass 1.
    pub(crate) fn queued_share(&self) -> f64 {
        let whole = self
            .duration_ms
            .max(self.polled_ms + self.queued_ms + self.awaiting_ms);
        if whole > 0.0 {
            self.queued_ms / whole
        } else {
            0.0
        }
    }

    /// The page's row object (totals; the page divides by `k` for the
    /// means), or `None` when no transaction of the name had totals.
    pub(crate) fn to_json(self) -> Option<Value> {
        (self.transactions > 0).then(|| {
            json!({
                "k": self.transactions,
                "d": round_ms(self.duration_ms),
                "n": self.polls,
                "p": round_ms(self.polled_ms),
                "q": round_ms(self.queued_ms),
                "a": round_ms(self.awaiting_ms),
                "w": round_ms(self.cpu_wait_ms),
                "l": round_ms(self.longest_ms),
            "x": self.long_polls,
                "o": round_ms(self.offloaded_ms),
                "ow": round_ms(self.offloaded_cpu_wait_ms),
                "oq": round_ms(self.offloaded_queued_ms),
                "qs": (self.queued_share() * 1e4).round() / 1e4,
            })
        })
    }
}

/// One of the run's longest polls, with what its request's lane shows
/// during it.
#[derive(Debug)]
pub(crate) struct LongPoll<'a> {
    pub(crate) tx: &'a Transaction,
    pub(crate) totals: PollTotals,
    /// The poll's interval, ns since the Unix epoch.
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
    /// The lane's samples in the interval.
    pub(crate) flame: Flame,
    /// The heaviest of their stacks (name ids, root first) and its weight
    /// in the interval, ns.
    pub(crate) heaviest: Option<(Vec<u32>, u64)>,
}

/// The `max` transactions with the longest polls (those with at least one
/// long poll, slowest first), each with the stacks its lane shows during
/// that poll.
pub(crate) fn longest_polls(run: &Run, max: usize) -> Vec<LongPoll<'_>> {
    let mut picked: Vec<(&Transaction, PollTotals, u64)> = run
        .transactions
        .iter()
        .filter_map(|tx| {
            let totals = tx.polls?;
            let start = totals.longest_start_ns?;
            (totals.long_polls >= 1).then_some((tx, totals, start))
        })
        .collect();
    picked.sort_by(|a, b| b.1.longest_ms.total_cmp(&a.1.longest_ms));
    picked.truncate(max);
    picked
        .into_iter()
        .map(|(tx, totals, start_ns)| {
            let end_ns = start_ns.saturating_add((totals.longest_ms * 1e6) as u64);
            let (flame, heaviest) = during(run, tx, start_ns, end_ns);
            LongPoll {
                tx,
                totals,
                start_ns,
                end_ns,
                flame,
                heaviest,
            }
        })
        .collect()
}

/// What `tx`'s lane shows in `[start_ns, end_ns]`: its samples there as a
/// flame graph, and the heaviest stack among them.
///
/// The samples are weighted as Sentry weights the transaction (time to the
/// next sample inside its window), not re-weighted inside the interval: a
/// short poll holds one or two samples, and the last would weigh nothing.
/// A weight is cut at the interval's end, since what follows the poll
/// (the lane's `(awaiting)`, say) is not what the poll ran.
fn during(
    run: &Run,
    tx: &Transaction,
    start_ns: u64,
    end_ns: u64,
) -> (Flame, Option<(Vec<u32>, u64)>) {
    let mut flame = Flame::default();
    let Some(w) = &tx.window else {
        return (flame, None);
    };
    // Stacks in the order first seen, so a tie goes to the earliest.
    let mut stacks: Vec<(Vec<u32>, u64)> = Vec::new();
    let mut index: HashMap<Vec<u32>, usize> = HashMap::new();
    let mut stack = Vec::new();
    for s in run.shown(&w.profiler_id, &w.thread_id, w.start_ns, w.end_ns) {
        if s.timestamp_ns < start_ns || s.timestamp_ns > end_ns {
            continue;
        }
        let weight = s.weight_ns.min(end_ns - s.timestamp_ns);
        run.stack_names(&s, &mut stack);
        flame.add(&stack, weight);
        let i = *index.entry(stack.clone()).or_insert_with(|| {
            stacks.push((stack.clone(), 0));
            stacks.len() - 1
        });
        stacks[i].1 += weight;
    }
    let heaviest = stacks
        .into_iter()
        .enumerate()
        .max_by(|(i, a), (j, b)| a.1.cmp(&b.1).then(j.cmp(i)))
        .map(|(_, s)| s);
    (flame, heaviest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_come_from_trace_data_or_measurements() {
        let tx = json!({
            "contexts": {"trace": {"data": {
                "tokio.polls": 4, "tokio.polled": 12.5, "tokio.queued": 3.0,
                "tokio.longest_poll": 11.0, "tokio.long_polls": 1,
                "tokio.longest_poll.start": 10.25,
            }}},
            "measurements": {
                "tokio.awaiting": {"value": 80.5, "unit": "millisecond"},
                "tokio.cpu_wait": {"value": 2.5, "unit": "millisecond"},
                "tokio.offloaded": {"value": 40.0, "unit": "millisecond"},
                "tokio.offloaded_queued": {"value": 7.5, "unit": "millisecond"},
                "tokio.queued": {"value": 99.0, "unit": "millisecond"},
            },
        });
        assert_eq!(
            PollTotals::from_transaction(&tx),
            Some(PollTotals {
                polls: 4,
                polled_ms: 12.5,
                queued_ms: 3.0,
                awaiting_ms: 80.5,
                cpu_wait_ms: 2.5,
                offloaded_ms: 40.0,
                offloaded_cpu_wait_ms: 0.0,
                offloaded_queued_ms: 7.5,
                longest_ms: 11.0,
                long_polls: 1,
                longest_start_ns: Some(10_250_000_000),
            })
        );
        let untracked = json!({"contexts": {"trace": {"data": {"thread.id": "1"}}}});
        assert_eq!(PollTotals::from_transaction(&untracked), None);
    }

    /// An envelope directory with one lane (`1000000001`) and three
    /// transactions on it; `data` is each one's poll totals.
    fn lane_run(tag: &str, transactions: &[(f64, f64, Value)]) -> Run {
        let dir = std::env::temp_dir().join(format!("preview-polls-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let p = "c".repeat(32);
        let lane = "1000000001";
        // Stacks (leaf first): 0 parse, 1 hash, 2 awaiting, 3 queued.
        let samples = [
            (10.00, 2),
            (10.04, 3),
            (10.05, 0),
            (10.06, 1),
            (10.065, 0),
            (10.075, 1),
            (10.10, 2),
            (10.20, 2),
        ];
        let chunk = json!({
            "version": "2", "profiler_id": p, "chunk_id": "c", "platform": "rust",
            "profile": {
                "frames": [{"function": "main", "instruction_addr": "0x10"},
                           {"function": "app::handler", "instruction_addr": "0x20"},
                           {"function": "app::parse", "instruction_addr": "0x30"},
                           {"function": "app::hash", "instruction_addr": "0x40"},
                           {"function": "(awaiting)", "instruction_addr": "0x5"},
                           {"function": "(queued for a Tokio worker)", "instruction_addr": "0x4"}],
                "stacks": [[2, 1, 0], [3, 1, 0], [4], [5]],
                "samples": samples.iter().map(|(ts, stack)| {
                    json!({"timestamp": ts, "thread_id": lane, "stack_id": stack})
                }).collect::<Vec<_>>(),
                "thread_metadata": {lane: {"name": "GET /parse"}},
            }
        });
        let mut items = vec![("profile_chunk", chunk.to_string())];
        for (start, end, data) in transactions {
            let mut data = data.clone();
            data["thread.id"] = lane.into();
            let tx = json!({
                "transaction": "GET /parse", "start_timestamp": start, "timestamp": end,
                "contexts": {"profile": {"profiler_id": p},
                             "trace": {"trace_id": "t".repeat(32), "data": data}},
            });
            items.push(("transaction", tx.to_string()));
        }
        let items: Vec<(&str, &[u8])> = items.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        std::fs::write(dir.join("1.envelope"), crate::envelope_bytes(&items)).unwrap();
        let run = Run::read(&dir).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        run
    }

    #[test]
    fn a_long_poll_shows_the_heaviest_stack_its_lane_shows_during_it() {
        let run = lane_run(
            "heaviest",
            &[
                // The poll [10.05, 10.08]: parse weighs 10 + 10 ms; hash
                // 5 ms, and 5 ms more of its 25 before the next sample,
                // which are after the poll's end.
                (
                    10.0,
                    10.2,
                    json!({"tokio.polls": 3, "tokio.longest_poll": 30.0,
                           "tokio.long_polls": 1, "tokio.longest_poll.start": 10.05}),
                ),
                // A shorter long poll: listed second.
                (
                    10.0,
                    10.2,
                    json!({"tokio.polls": 2, "tokio.longest_poll": 12.0,
                           "tokio.long_polls": 1, "tokio.longest_poll.start": 10.0}),
                ),
                // Longer, but under the long-poll threshold: not listed.
                (
                    10.0,
                    10.2,
                    json!({"tokio.polls": 1, "tokio.longest_poll": 40.0}),
                ),
            ],
        );
        let polls = longest_polls(&run, MAX_LONGEST_POLLS);
        let longest: Vec<f64> = polls.iter().map(|p| p.totals.longest_ms).collect();
        assert_eq!(longest, [30.0, 12.0]);
        assert_eq!(longest_polls(&run, 1).len(), 1);

        let first = &polls[0];
        assert_eq!(first.flame.samples(), 4, "the samples at 10.05 to 10.075");
        assert!(first.flame.total().abs_diff(30_000_000) < 1_000);
        let (stack, weight) = first.heaviest.clone().unwrap();
        let names: Vec<&str> = stack
            .iter()
            .map(|&n| run.names.list[n as usize].as_str())
            .collect();
        assert_eq!(names, ["main", "app::handler", "app::parse"]);
        assert!(weight.abs_diff(20_000_000) < 1_000, "{weight}");

        // The second poll, [10.00, 10.012], holds only the lane's
        // `(awaiting)` sample, weighed up to the poll's end.
        let (stack, weight) = polls[1].heaviest.clone().unwrap();
        assert_eq!(run.names.list[stack[0] as usize], "(awaiting)");
        assert!(weight.abs_diff(12_000_000) < 1_000, "{weight}");
    }

    #[test]
    fn a_names_shares_never_pass_its_duration() {
        let mut name = NameTotals::default();
        let totals = PollTotals {
            polls: 2,
            polled_ms: 10.0,
            queued_ms: 30.0,
            awaiting_ms: 80.0,
            cpu_wait_ms: 4.0,
            offloaded_ms: 0.0,
            offloaded_cpu_wait_ms: 0.0,
            offloaded_queued_ms: 0.0,
            longest_ms: 6.0,
            long_polls: 0,
            longest_start_ns: None,
        };
        // The parts (120 ms) outlast the transaction (100 ms).
        name.add(&totals, 100_000_000);
        assert!((name.queued_share() - 0.25).abs() < 1e-9);
        assert_eq!(NameTotals::default().to_json(), None);
    }
}
