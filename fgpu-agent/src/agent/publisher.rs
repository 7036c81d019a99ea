//! Keeping the ledgers current: every [`KERNEL_EVERY`] each ledger gets the kernel's view of
//! its processes' usage (the shims refuse on the larger of their own figure and the
//! kernel's) and its hierarchical memory budget ([`super::budget`]); dead processes' slots
//! are reclaimed and ledgers of removed cgroups are dropped every [`RECLAIM_EVERY`].

use std::sync::Arc;
use std::time::Duration;

use super::budget;
use super::state::State;

pub const KERNEL_EVERY: Duration = Duration::from_millis(50);
pub const RECLAIM_EVERY: Duration = Duration::from_secs(1);

pub async fn run(state: Arc<State>) {
    let mut tick = tokio::time::interval(KERNEL_EVERY);
    let per_reclaim = (RECLAIM_EVERY.as_millis() / KERNEL_EVERY.as_millis()) as u32;
    let mut n = 0u32;
    loop {
        tick.tick().await;
        let ledgers = state.ledgers().all();
        if ledgers.is_empty() {
            continue;
        }
        // Every device a ledger knows gets a figure, 0 when the kernel saw nothing, so a
        // stale figure can never keep refusing allocations.
        let tree = state.tree_by_gpu();
        budget::refresh(&state, &budget::tree_by_key(&tree));
        n = n.wrapping_add(1);
        if n.is_multiple_of(per_reclaim) {
            for ledger in &ledgers {
                let back = ledger.reclaim_dead();
                if back > 0 {
                    tracing::info!(cgroup = %ledger.cgroup, bytes = back, "reclaimed the share of processes that died");
                }
            }
            state
                .ledgers()
                .retain(|l| state.cgroup_dir(&l.cgroup).is_dir());
        }
    }
}
