//! The one place that reacts to "a limit changed": a limit set, removed, or removed with its
//! cgroup (the limit store already holds the change). Each part is told in turn: the
//! backstop, the kernel's `limits` map ([`super::enforce::sync`]), every ledger's compute
//! team and effective limit, then the hierarchical budgets ([`super::budget::refresh`]).

use super::state::State;

/// After a limit changed: tells the backstop, writes the kernel's limits, every ledger's
/// team and effective limit, and the hierarchical budgets.
pub fn limits_changed(state: &State) {
    state.backstop.limits_changed();
    super::enforce::sync(state);
    {
        let limits = state.limits.lock().expect("limits lock");
        for ledger in state.ledgers.all() {
            ledger.set_team(super::compute::team::TeamSpec::of(&limits, &ledger.cgroup));
            ledger.apply(&limits.effective(&ledger.cgroup).0);
        }
    }
    let tree = super::devmap::tree(state);
    super::budget::refresh(state, &super::budget::tree_by_key(&tree));
}
