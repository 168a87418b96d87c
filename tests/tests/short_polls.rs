//! Work in short polls is shown at its full weight (see
//! `sentry_profiling_tests::short_polls`): for each slice length from 1 to
//! 30 ms, `burn_cpu` as the transactions' profiles show it (bare or
//! estimated) and as Sentry's function metrics give it is 0.9 to 1.1 of the
//! time it ran, and at most 2 % of its time shows no stack.
//!
//! Why those bounds hold by construction: every request runs 60 ms of CPU,
//! about six sampling periods, so it has captures of its own (a request
//! with none keeps `(running: no stack captured in time)`: counted, and
//! within the 2 %); its only function is `burn_cpu`, so each capture's
//! stack is `burn_cpu`'s and the estimate gives its polls without a capture
//! `burn_cpu` under the estimated frame; and each poll's edges make Sentry
//! charge a poll's time from its start to its end. What is left is the
//! glue around `burn_cpu` in each poll (microseconds) and the sampling
//! error of which poll a wait for a CPU falls in, both far inside 10 %.

use sentry_profiling_tests::short_polls::{check, measure};

#[test]
fn short_polls_are_shown_at_their_full_weight() {
    check(&measure(12, 4, include_str!("../../README.md")));
}
