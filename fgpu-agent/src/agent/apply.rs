//! The one place that reacts to "a limit changed": a limit set, removed, or removed with its
//! cgroup (the limit store already holds the change). Each part is told in turn: the
//! backstop, the kernel's `limits` map ([`super::enforce::sync`]), every ledger's compute
//! team and effective limit, then the hierarchical budgets ([`super::budget::refresh`]).
//! The sweep of bound limits ([`super::bound`]) lives here too: it removes the limits of
//! cgroups that are gone, which is such a change.

use std::sync::Arc;
use std::time::Duration;

use super::state::State;

/// How often bound cgroups are checked for removal ([`run_bound`]).
pub const CHECK_EVERY: Duration = Duration::from_millis(500);

/// After a limit changed: tells the backstop, writes the kernel's limits, every ledger's
/// team and effective limit, and the hierarchical budgets.
pub fn limits_changed(state: &State) {
    state.backstop().limits_changed();
    super::enforce::sync(state);
    {
        let limits = state.limits();
        for ledger in state.ledgers().all() {
            ledger.set_team(super::compute::team::TeamSpec::of(&limits, &ledger.cgroup));
            ledger.apply(&limits.effective(&ledger.cgroup).0);
        }
    }
    let tree = state.tree_by_gpu();
    super::budget::refresh(state, &super::budget::tree_by_key(&tree));
}

/// Removes the limits of bound cgroups ([`super::bound`]) that are gone; returns how many.
pub fn sweep_bound(state: &State) -> usize {
    let gone = state.bound_gone();
    if gone.is_empty() {
        return 0;
    }
    let mut removed = 0;
    {
        let mut limits = state.limits();
        for cgroup in &gone {
            match limits.remove(cgroup) {
                Ok(Some(_)) => {
                    removed += 1;
                    tracing::info!(cgroup, "cgroup removed: its container's limit is removed");
                }
                Ok(None) => {}
                Err(err) => {
                    tracing::warn!(
                        cgroup,
                        "cannot remove the limit of a removed cgroup: {err:#}"
                    );
                    return 0; // keep it bound: the next sweep tries again
                }
            }
        }
    }
    if let Err(err) = state.unbind(&gone) {
        tracing::warn!("{err:#}");
    }
    if removed > 0 {
        limits_changed(state);
    }
    removed
}

/// Sweeps every [`CHECK_EVERY`] until the agent stops.
pub async fn run_bound(state: Arc<State>) {
    let mut tick = tokio::time::interval(CHECK_EVERY);
    loop {
        tick.tick().await;
        sweep_bound(&state);
    }
}
