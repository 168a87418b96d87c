//! A thread's ledger as timelines: each test draws one thread's story, a
//! column per sampling period (100 ns here), with what the kernel counted
//! at each tick, and what each period's slot shows once its sample leaves.
//!
//! The rows of a story (columns split on whitespace):
//!
//! - `in`: the request the thread stood in at the slot (`A`, `B`, ...; `-`
//!   for none), as its context word says;
//! - `ran`: `C`, its timer captured it running (stack `1`) a quarter of a
//!   period before the slot, in that request; `.`, no capture;
//! - `counts` (optional): the kernel's counts read at the tick, `cpu/delay`
//!   in ns since the reading before (`.`, not read);
//! - `look` (optional): where the tick found the thread, in the slot's
//!   request: `b` blocked at stack `9`, `r` runnable without a core, `.`
//!   nothing new;
//! - `shows`: what each slot shows: the request's letter (`-` none) and
//!   the frame: `1` the capture's stack, `9` where it blocked, `W`
//!   `(waiting for a CPU)`, `U` `(running: no stack captured in time)`,
//!   `?` `(waiting: where not read in time)`; `..` still held at the end.
//!
//! A tick runs as a thread's tick does (`step`): the capture is queued and
//! placed, the free slot gets a fill standing where the thread's context
//! word and what is known of it say, the fills around close captures are
//! rewritten, the counts are read, and what may leave leaves.

use std::sync::Arc;

use super::*;
use crate::frames::{UNCAPTURED_FRAME, WAITING_FOR_CPU_FRAME, WAITING_UNREAD_FRAME};

const P: u64 = 100;
const BLOCKED: u64 = 9;
const RAN: u64 = 1;

fn lane_of(token: &str) -> u64 {
    match token {
        "-" => 0,
        t => {
            let c = t.as_bytes()[0];
            assert!(c.is_ascii_uppercase(), "a request is a capital: {t}");
            crate::attribution::LANE_BASE + u64::from(c - b'A') + 1
        }
    }
}

fn letter_of(lane: u64) -> char {
    if lane == 0 {
        '-'
    } else {
        char::from(b'A' + (lane - crate::attribution::LANE_BASE - 1) as u8)
    }
}

fn code_of(frame: u64) -> char {
    match frame {
        RAN => '1',
        BLOCKED => '9',
        WAITING_FOR_CPU_FRAME => 'W',
        UNCAPTURED_FRAME => 'U',
        WAITING_UNREAD_FRAME => '?',
        other => panic!("a frame no story draws: {other:#x}"),
    }
}

/// Where the thread was last found (the `look` row), as `state` keeps it.
#[derive(Clone, Copy)]
enum Found {
    Nowhere,
    Blocked { lane: u64, left_ns: Option<u64> },
    Runnable(u64),
}

impl Found {
    /// `Whereabouts::fill_place` for it.
    fn place(self) -> FillPlace {
        match self {
            Found::Nowhere => FillPlace::unknown(),
            Found::Blocked { lane, left_ns } => FillPlace {
                stack: Some(Arc::from(&[BLOCKED][..])),
                context: if left_ns.is_none() { lane } else { 0 },
                known: left_ns.is_none(),
                ran: left_ns.is_some(),
                left_ns,
            },
            Found::Runnable(lane) => FillPlace {
                stack: Some(super::super::periods::synthetic(WAITING_FOR_CPU_FRAME)),
                context: lane,
                known: true,
                ran: false,
                left_ns: None,
            },
        }
    }

    /// `Whereabouts::known` for it.
    fn standing(self, word: u64) -> AtTick {
        let stack: Arc<[u64]> = Arc::from(&[BLOCKED][..]);
        let known = match self {
            Found::Blocked {
                lane,
                left_ns: None,
            } => super::super::periods::Known {
                waiting: Some((&stack, lane)),
                preempted: None,
            },
            Found::Runnable(lane) => super::super::periods::Known {
                waiting: None,
                preempted: Some(lane),
            },
            _ => super::super::periods::Known::default(),
        };
        super::super::periods::standing(Some(Some(word)), &known)
    }
}

/// Runs the story drawn in `rows` and checks its `shows` row.
#[track_caller]
fn story(rows: &[&str]) {
    let row = |name: &str| -> Option<Vec<&str>> {
        rows.iter().find_map(|r| {
            let mut cols = r.split_whitespace();
            (cols.next() == Some(name)).then(|| cols.collect())
        })
    };
    let lanes: Vec<u64> = row("in")
        .expect("an `in` row")
        .into_iter()
        .map(lane_of)
        .collect();
    let n = lanes.len();
    let column = |name: &str| -> Vec<&str> {
        let cols = row(name).unwrap_or_else(|| vec!["."; n]);
        assert_eq!(cols.len(), n, "the `{name}` row has {} columns", cols.len());
        cols
    };
    let (ran, counts, looks) = (column("ran"), column("counts"), column("look"));
    let expected = row("shows").expect("a `shows` row");
    let mut shown: Vec<Vec<String>> = vec![Vec::new(); n];
    let mut l = Ledger::default();
    let first = Reading {
        at_ns: 0,
        began_waiting: false,
        lane_now: 0,
        since: None,
    };
    l.kernel_read(first, P);
    let mut found = Found::Nowhere;
    let keep = |shown: &mut Vec<Vec<String>>, ts: u64, frame: u64, context: u64| {
        let k = ((ts + P / 2) / P).clamp(1, n as u64) as usize - 1;
        shown[k].push(format!("{}{}", letter_of(context), code_of(frame)));
    };
    for k in 0..n {
        let slot = (k as u64 + 1) * P;
        let lane = lanes[k];
        // This tick's capture, placed with its slot.
        let captured = ran[k] == "C";
        let mut running = Vec::new();
        let stack: Arc<[u64]> = Arc::from(&[RAN][..]);
        if captured {
            let ts = slot - P / 4;
            let sample = Sample::new(ts, 7, Arc::from("t"), stack.clone(), lane, false);
            running.push(l.push_sample(sample));
        }
        let slots = l.slots_of_tick(1, slot, P, None, 0);
        let placed = l.place_tick(slots, &running, P / 2, P);
        for free in placed.free {
            l.push_fill(free, Some(Some(lane)), found.standing(lane));
        }
        if captured {
            l.captured(running[0], &stack, lane, P * 3 / 2);
            if let Found::Blocked {
                lane,
                left_ns: None,
            } = found
            {
                found = Found::Blocked {
                    lane,
                    left_ns: Some(running[0]),
                };
            }
        }
        // What the tick reads and finds.
        let read = counts[k] != ".";
        if read {
            let (cpu, delay) = counts[k].split_once('/').expect("counts as cpu/delay");
            let reading = Reading {
                at_ns: slot,
                began_waiting: matches!(found, Found::Blocked { left_ns: None, .. }),
                lane_now: lane,
                since: Some((
                    cpu.parse().expect("cpu ns"),
                    delay.parse().expect("delay ns"),
                )),
            };
            l.kernel_read(reading, P);
        }
        if !captured {
            l.alive_at(if read { slot - 1 } else { slot });
        }
        match looks[k] {
            "b" => {
                found = Found::Blocked {
                    lane,
                    left_ns: None,
                }
            }
            "r" => found = Found::Runnable(lane),
            "." => {}
            other => panic!("a look no story draws: {other}"),
        }
        if captured && matches!(found, Found::Runnable(_)) {
            found = Found::Nowhere;
        }
        let view = DrainView {
            place: found.place(),
            asking: false,
            force: false,
            ran_last: captured || read,
            period_ns: P,
        };
        l.drain(&view, |out| match out {
            Out::Sample(s) => keep(&mut shown, s.timestamp_ns(), s.frames()[0], s.context()),
            Out::Fill {
                timestamp_ns,
                stack,
                context,
            } => keep(&mut shown, timestamp_ns, stack[0], context),
        });
    }
    let got: Vec<String> = shown
        .into_iter()
        .map(|s| {
            if s.is_empty() {
                "..".to_owned()
            } else {
                s.join("+")
            }
        })
        .collect();
    assert_eq!(
        got.join(" "),
        expected.join(" "),
        "\n  slots {}\n  want  {}\n  got   {}",
        (1..=n).map(|k| format!("{k:<3}")).collect::<String>(),
        expected
            .iter()
            .map(|s| format!("{s:<3}"))
            .collect::<String>(),
        got.iter().map(|s| format!("{s:<3}")).collect::<String>(),
    );
}

// A worker busy in one request beside CPU hogs: a third of a CPU, so a
// capture every third period; the kernel counts two periods of run delay
// at each capture. Its two free slots show that wait.
#[test]
fn a_busy_thread_beside_hogs_shows_the_run_delay_counted() {
    story(&[
        "in      A    A    A    A        A    A    A",
        "ran     C    .    .    C        .    .    C",
        "counts  0/0  .    .    100/200  .    .    100/200",
        "shows   A1   AW   AW   A1       AW   AW   A1",
    ]);
}

// The same worker, its run delay not a whole number of periods: what is
// left of it stays owed, and a fill the counts covered and show neither
// running nor waiting for a CPU is shown as a wait whose place was not
// read.
#[test]
fn run_delay_short_of_a_period_shows_as_a_wait_not_read() {
    story(&[
        "in      A      A    A    A        A    A    A",
        "ran     C      .    .    C        .    .    C",
        "counts  100/0  .    .    100/140  .    .    100/140",
        "shows   A1     AW   A?   A1       AW   AW   A1",
    ]);
}

// Two requests interleaved on the worker, a poll per period: each fill
// stands in the request the thread published at its slot, and shows the
// wait the counts give it, whichever request's poll that wait fell in.
#[test]
fn interleaved_requests_get_the_wait_of_the_slot_they_stand_at() {
    story(&[
        "in      A    B    A    B        A    B    A",
        "ran     C    .    .    C        .    .    C",
        "counts  0/0  .    .    100/200  .    .    100/200",
        "shows   A1   BW   AW   B1       AW   BW   A1",
    ]);
}

// A run delay counted at a tick that found the thread outside any request
// is the request's it stood in at the reading before.
#[test]
fn a_wait_counted_after_the_request_is_the_requests() {
    story(&[
        "in      A    A    -      -",
        "ran     C    .    .      .",
        "counts  0/0  .    0/100  0/0",
        "look    .    .    b      .",
        "shows   A1   AW   -9     ..",
    ]);
}

// Found runnable without a core: its fills show the wait at once, and the
// kernel's later count of it is not shown again.

#[test]
fn a_thread_found_runnable_shows_the_wait_once() {
    story(&[
        "in      A    A    A    A        A",
        "ran     C    .    .    C        .",
        "counts  0/0  .    .    100/200  .",
        "look    .    r    .    .        .",
        "shows   A1   AW   AW   A1       ..",
    ]);
}

// Found blocked, then woken: it ran two periods' CPU time no capture saw,
// counted at tick 5. The periods before left at their ticks, where it was
// found; the tick's own fill waits a tick (the thread may be parking
// somewhere new), and with the next it shows what it ran.
#[test]
fn a_thread_woken_from_its_wait_shows_the_wait_then_what_it_ran() {
    story(&[
        "in      -    -    -    -    -       -",
        "ran     .    .    .    .    .       .",
        "counts  0/0  .    .    .    200/0   .",
        "look    b    .    .    .    .       .",
        "shows   -9   -9   -9   -9   -U      -U",
    ]);
}

// A worker polls request A, then parks between its polls (outside any
// request, where no look read it), then polls A again; its timer catches
// it in A at periods 1 and 4. The counts at tick 4: two periods of CPU
// time (the capture's, and one no capture saw) and no wait. Inside A's
// poll the thread ran or waited for a CPU (a thread blocked in a request
// is found there: it is looked at every tick it stands in one), so the
// period it ran without a capture is A's; the one outside is where it
// blocked, not read. (Given in time order, A's period showed a wait not
// read, and the worker's own period the CPU time: A's poll showed less
// than it ran.)
#[test]
fn what_a_worker_ran_between_captures_goes_to_the_poll_it_ran_in() {
    story(&[
        "in      A      -    A    A",
        "ran     C      .    .    C",
        "counts  100/0  .    .    200/0",
        "shows   A1     -?   AU   A1",
    ]);
}

// The same with a wait for a CPU counted instead: it is shown in A's poll,
// where the thread was runnable, not at the period it parked (filed under
// A, outside its poll: A's poll showed a wait not read).
#[test]
fn a_wait_for_a_cpu_goes_to_the_poll_it_fell_in() {
    story(&[
        "in      A      -    A    A",
        "ran     C      .    .    C",
        "counts  100/0  .    .    100/100",
        "shows   A1     -?   AW   A1",
    ]);
}

// Counts for more than the polls' periods: those go first to the polls,
// the rest to the periods outside them, in time order.
#[test]
fn counts_beyond_the_polls_periods_go_to_the_periods_outside_them() {
    story(&[
        "in      A      -    A    -    A",
        "ran     C      .    .    .    C",
        "counts  100/0  .    .    .    100/200",
        "shows   A1     AW   AW   -?   A1",
    ]);
}

// Found runnable in A at tick 2: its periods show the wait at once, ahead
// of the kernel's counts, which have not counted it by tick 6. The fill of
// slot 5, in A's poll (so not blocked there), is not covered by what the
// counts owe: it is not a wait whose place was not read, but the part the
// counts are least behind on (here what it ran, as the captures are not
// ahead of the CPU time counted, the waits shown are), owed.
#[test]
fn a_poll_the_counts_do_not_cover_yet_shows_what_they_are_least_behind_on() {
    story(&[
        "in      A      A    A    A      A    A",
        "ran     C      .    .    C      .    C",
        "counts  100/0  .    .    100/0  .    100/0",
        "look    .      r    .    .      .    .",
        "shows   A1     AW   AW   A1     AU   A1",
    ]);
}
