//! A request's running time that no capture of its own saw, shown with the
//! stacks captured in the request's other polls, each under an outermost
//! `(estimated from this request's samples)` frame.
//!
//! A thread's CPU-time timer captures its stack once per period of CPU
//! time, so a poll shorter than the period gets a capture only in
//! proportion to its length: three 3 ms polls in ten have one. The others
//! are running time of the request with no stack of their own, shown as
//! `(running: no stack captured in time)`. Left so, a function whose polls
//! are short is shown at a fraction of its time, and Sentry's slowest
//! functions rank functions by the length of their polls. A sampling
//! profiler's answer is that each capture stands for the period of CPU
//! time it sampled. In a request's lane that is done here: the lane's
//! uncaptured running time is shared among the stacks of its own captures,
//! in proportion to how many captures each stack has, so that each capture
//! accounts for about the same share of the request's running time. The
//! request's time per function is then an unbiased estimate (a capture
//! lands in a function in proportion to the CPU time spent there), and so
//! are Sentry's function metrics over many requests.
//!
//! What is never done: a stack of another request, or of time after the
//! request ended (only samples filed under the lane are sources, and they
//! were all taken while a thread ran the request), and a bare inferred
//! stack (each sits under the estimated frame, which Sentry shows as the
//! outermost frame of the stack, so the timeline tells the moments seen
//! from the moments inferred). A request with no capture in the chunk
//! keeps `(running: no stack captured in time)`. Threads' own samples
//! (outside lanes) keep a sampler's usual weighting: a capture there
//! already stands for the period before the thread's next sample.

use std::sync::Arc;

use rustc_hash::FxHashMap as HashMap;

use super::table::Lanes;
use crate::chunk::Chunk;
use crate::frames::{ESTIMATED_FRAME, UNCAPTURED_FRAME, synthetic_frame};

/// What one of a lane's captured stacks stands for so far.
#[derive(Debug, Clone, Copy, Default)]
struct Source {
    /// How many captures of the lane have this stack.
    captures: u64,
    /// The time the lane shows with this stack (its captures' and their
    /// copies' weights, and the estimated samples given to it so far).
    shown_ns: u64,
    /// The estimated stack made from it (its frames under the estimated
    /// frame), once interned.
    estimated: Option<u32>,
}

impl Lanes {
    /// Gives each `(running: no stack captured in time)` sample of every
    /// lane with captures of its own one of those captures' stacks under
    /// the estimated frame (see the module doc); returns how many samples
    /// were estimated. Called once the chunk's lane samples are all in
    /// (after the fill-ins and the poll edges): a sample's share is its
    /// weight in Sentry, the time to the lane's next sample.
    pub(crate) fn estimate_uncaptured(&self, chunk: &mut Chunk) -> usize {
        let Some(uncaptured) = chunk.find_stack(&[UNCAPTURED_FRAME]) else {
            return 0;
        };
        let mut by_lane: HashMap<u64, Vec<usize>> = HashMap::default();
        for (i, s) in chunk.samples().iter().enumerate() {
            if self.lanes.contains_key(&s.context) {
                by_lane.entry(s.context).or_default().push(i);
            }
        }
        let mut estimated = 0;
        for indices in by_lane.values_mut() {
            estimated += estimate_lane(chunk, indices, uncaptured);
        }
        estimated
    }
}

/// Whether `stack` is one of running code a capture saw: its leaf is a code
/// address (a synthetic leaf stands for a wait or for time no capture saw).
fn is_running_stack(stack: &[u64]) -> bool {
    stack
        .first()
        .is_some_and(|&leaf| synthetic_frame(leaf).is_none())
}

/// [`Lanes::estimate_uncaptured`] for one lane, whose samples are at
/// `indices` of the chunk (sorted here by time).
fn estimate_lane(chunk: &mut Chunk, indices: &mut [usize], uncaptured: u32) -> usize {
    indices.sort_by_key(|&i| chunk.samples()[i].timestamp_ns);
    let samples = chunk.samples();
    // Sentry's weight of each sample: the time to the lane's next sample
    // (the last one carries none).
    let weights: Vec<u64> = (0..indices.len())
        .map(|k| {
            indices.get(k + 1).map_or(0, |&next| {
                samples[next]
                    .timestamp_ns
                    .saturating_sub(samples[indices[k]].timestamp_ns)
            })
        })
        .collect();
    let mut sources: HashMap<u32, Source> = HashMap::default();
    for &i in indices.iter() {
        let s = &samples[i];
        if s.captured && is_running_stack(&chunk.stacks()[s.stack as usize]) {
            sources.entry(s.stack).or_default().captures += 1;
        }
    }
    if sources.is_empty() {
        return 0;
    }
    let mut targets = Vec::new();
    for (k, &i) in indices.iter().enumerate() {
        let stack = samples[i].stack;
        if stack == uncaptured {
            targets.push((i, weights[k]));
        } else if let Some(src) = sources.get_mut(&stack) {
            src.shown_ns += weights[k];
        }
    }
    // Each uncaptured sample, in time order, goes to the stack furthest
    // below its share (shown time per capture), so that over the lane every
    // capture stands for about the same running time. Ties go to the lower
    // stack id: the result does not depend on the map's order.
    let mut order: Vec<u32> = sources.keys().copied().collect();
    order.sort_unstable();
    for &(i, weight) in &targets {
        let best = *order
            .iter()
            .min_by(|a, b| {
                let (a, b) = (&sources[a], &sources[b]);
                (u128::from(a.shown_ns) * u128::from(b.captures))
                    .cmp(&(u128::from(b.shown_ns) * u128::from(a.captures)))
            })
            .expect("a lane with sources");
        let src = sources.get_mut(&best).expect("a source of the lane");
        src.shown_ns += weight;
        let stack = match src.estimated {
            Some(id) => id,
            None => {
                let frames = &chunk.stacks()[best as usize];
                let mut under: Vec<u64> = Vec::with_capacity(frames.len() + 1);
                under.extend_from_slice(frames);
                under.push(ESTIMATED_FRAME);
                let id = chunk.stack_id(&Arc::from(under));
                src.estimated = Some(id);
                id
            }
        };
        chunk.restack(i, stack);
    }
    targets.len()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::frames::{AWAITING_FRAME, WAITING_FOR_CPU_FRAME};
    use crate::lanes::{LaneEvent, LaneLink, next_lane};
    use crate::sampler::Sample;

    const MS: u64 = 1_000_000;

    fn started(lanes: &mut Lanes, start_ns: u64) -> u64 {
        let lane = next_lane();
        lanes.apply(LaneEvent::Started {
            lane,
            link: LaneLink::default(),
            start_ns,
        });
        lane
    }

    fn capture(ts: u64, frames: &[u64], context: u64) -> Sample {
        Sample::new(ts, 7, Arc::from("w"), Arc::from(frames), context, false)
    }

    fn fill(ts: u64, frames: &[u64], context: u64) -> Sample {
        Sample::new(ts, 7, Arc::from("w"), Arc::from(frames), context, true)
    }

    /// (time, stack) of the lane's samples, by time.
    fn shown(chunk: &Chunk, lane: u64) -> Vec<(u64, Vec<u64>)> {
        let mut v: Vec<_> = chunk
            .samples()
            .iter()
            .filter(|s| s.context == lane)
            .map(|s| (s.timestamp_ns, chunk.stacks()[s.stack as usize].to_vec()))
            .collect();
        v.sort();
        v
    }

    // Ten polls of 3 ms, 10 ms apart (`P` a poll, `.` awaiting); captures
    // `a` (function A) in polls 2 and 8, `b` (function B) in poll 5; the
    // other polls' edges show no stack:
    //
    //   0    10   20   30   40   50   60   70   80   90 ms
    //   P... P... Pa.. P... P... Pb.. P... P... Pa.. P...
    //
    // Seven uncaptured polls, three captures: each capture's stack stands
    // for about a third of the ten polls' running time, A for two thirds.
    #[test]
    fn uncaptured_polls_take_the_requests_captures_in_proportion() {
        let mut lanes = Lanes::default();
        let lane = started(&mut lanes, 0);
        let mut chunk = Chunk::new();
        let (a, b) = ([0xa1, 0xa0], [0xb1, 0xa0]);
        for poll in 0..10u64 {
            let t = poll * 10 * MS;
            match poll {
                2 | 8 => chunk.push(&capture(t, &a, lane)),
                5 => chunk.push(&capture(t, &b, lane)),
                _ => chunk.push(&fill(t, &[UNCAPTURED_FRAME], lane)),
            }
            chunk.push_synthetic(t + 3 * MS, lane, &Arc::from(&[AWAITING_FRAME][..]));
        }
        assert_eq!(lanes.estimate_uncaptured(&mut chunk), 7);
        let samples = shown(&chunk, lane);
        let with = |leaf: u64, estimated: bool| {
            samples
                .iter()
                .filter(|(_, s)| s[0] == leaf && (s.last() == Some(&ESTIMATED_FRAME)) == estimated)
                .count()
        };
        assert_eq!(with(UNCAPTURED_FRAME, false), 0, "{samples:x?}");
        // A has two captures and B one: A's stack gets twice B's share.
        assert_eq!(with(0xa1, false), 2);
        assert_eq!(with(0xb1, false), 1);
        assert_eq!(with(0xa1, true) + with(0xb1, true), 7);
        assert!((4..=5).contains(&with(0xa1, true)), "{samples:x?}");
        // An estimated stack is the captured one under the estimated frame.
        let est = samples
            .iter()
            .find(|(_, s)| s.last() == Some(&ESTIMATED_FRAME))
            .unwrap();
        let under = &est.1[..est.1.len() - 1];
        assert!(under == a || under == b, "{est:x?}");
        // The waits between polls are untouched.
        assert_eq!(with(AWAITING_FRAME, false), 10);
    }

    #[test]
    fn a_request_without_a_capture_keeps_no_stack_and_others_are_not_sources() {
        let mut lanes = Lanes::default();
        let (one, other) = (started(&mut lanes, 0), started(&mut lanes, 0));
        let mut chunk = Chunk::new();
        // `one` has no capture of its own, only a wait for a CPU and a
        // stand-in (not a capture); `other`'s capture is not its to use.
        chunk.push(&fill(0, &[UNCAPTURED_FRAME], one));
        chunk.push(&fill(5 * MS, &[WAITING_FOR_CPU_FRAME], one));
        chunk.push(&fill(8 * MS, &[0xc1, 0xc0], one));
        chunk.push(&capture(9 * MS, &[0xd1, 0xd0], other));
        chunk.push(&fill(12 * MS, &[UNCAPTURED_FRAME], one));
        assert_eq!(lanes.estimate_uncaptured(&mut chunk), 0);
        let stacks: Vec<Vec<u64>> = shown(&chunk, one).into_iter().map(|(_, s)| s).collect();
        assert_eq!(stacks[0], vec![UNCAPTURED_FRAME]);
        assert_eq!(stacks[3], vec![UNCAPTURED_FRAME]);
    }

    #[test]
    fn samples_outside_lanes_keep_no_stack() {
        let mut lanes = Lanes::default();
        let lane = started(&mut lanes, 0);
        let mut chunk = Chunk::new();
        chunk.push(&capture(0, &[0xa1, 0xa0], lane));
        // An OS thread's uncaptured CPU time, outside any request.
        chunk.push(&fill(MS, &[UNCAPTURED_FRAME], 0));
        chunk.push(&fill(2 * MS, &[UNCAPTURED_FRAME], lane));
        assert_eq!(lanes.estimate_uncaptured(&mut chunk), 1);
        let outside: Vec<_> = chunk.samples().iter().filter(|s| s.context == 0).collect();
        assert_eq!(
            chunk.stacks()[outside[0].stack as usize].to_vec(),
            vec![UNCAPTURED_FRAME]
        );
    }
}
