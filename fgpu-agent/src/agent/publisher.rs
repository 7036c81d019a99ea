//! Keeping the ledgers current: every [`KERNEL_EVERY`] each ledger gets the kernel's view of
//! its processes' usage (the shims refuse on the larger of their own figure and the
//! kernel's) and its hierarchical memory budget ([`super::budget`]), and dead processes'
//! slots are reclaimed ([`super::reclaim`]: where processes exited at every pass, a sweep of
//! all ledgers in turn every [`RECLAIM_EVERY`]); ledgers nobody uses any more (their cgroup
//! removed, or empty with no slot held) are dropped every [`RECLAIM_EVERY`]. It runs on a
//! thread of its own (`fgpu-budget`), never on the sockets' and events' thread.

use std::sync::Arc;
use std::time::Duration;

use super::budget;
use super::state::State;

pub const KERNEL_EVERY: Duration = Duration::from_millis(50);
pub const RECLAIM_EVERY: Duration = Duration::from_secs(1);

pub async fn run(state: Arc<State>) {
    let mut tick = tokio::time::interval(KERNEL_EVERY);
    // A pass that overran is not made up for with a burst of passes.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let per_reclaim = (RECLAIM_EVERY.as_millis() / KERNEL_EVERY.as_millis()) as u32;
    let mut n = 0u32;
    loop {
        tick.tick().await;
        if state.ledgers().all().is_empty() {
            continue;
        }
        n = n.wrapping_add(1);
        let sweep = n.is_multiple_of(per_reclaim);
        // Dead processes' shares first, so that the budgets below count them out.
        state
            .reclaim()
            .pass(|| state.ledgers().all(), |ids| state.paths_of(ids), sweep);
        // Every device a ledger knows gets a figure, 0 when the kernel saw nothing, so a
        // stale figure can never keep refusing allocations.
        let tree = state.tree_by_gpu();
        budget::refresh(&state, &budget::tree_by_key(&tree));
        if sweep {
            let dropped = state.ledgers().drop_unused(|c| state.cgroup_dir(c));
            if dropped > 0 {
                tracing::debug!(dropped, "dropped ledgers nobody uses any more");
            }
        }
    }
}
