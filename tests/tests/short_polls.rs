//! Work in short polls is shown at its full weight (see
//! `sentry_profiling_tests::short_polls`, whose `check` states each bound
//! and why it holds): for each slice length from 1 to 30 ms, of the running
//! time the requests show, `burn_cpu` (bare, or estimated from the
//! request's own captures) is nearly all of it and no stack at most 2 %,
//! on any machine; and where the requests waited little for a CPU,
//! `burn_cpu` as the transactions' profiles show it and as Sentry's
//! function metrics give it is 0.9 to 1.1 of the time it ran. Before the
//! estimate, 3 ms slices showed `burn_cpu` for 0.3 of it.

use sentry_profiling_tests::short_polls::{check, measure};

#[test]
fn short_polls_are_shown_at_their_full_weight() {
    check(&measure(12, 4, include_str!("../../README.md")));
}
