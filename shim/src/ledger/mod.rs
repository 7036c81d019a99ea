//! The container's shared ledger (layout in `fgpu_common::ledger`): where it comes from, this
//! process's slot in it, taking back dead processes' bytes, and moving to the agent's new
//! ledger after an agent restart.
//!
//! - [`sources`]: where a ledger comes from (the agent through [`crate::agent_link`], the
//!   standalone file, a private one), found and mapped at the first need;
//! - [`view`]: the ledger this process uses and its slot ([`get`], [`active`]), reclaim of
//!   dead processes' slots ([`sweep`]);
//! - [`reconnect`]: the agent link's periodic check ([`tick`]) and what a reconnect means for
//!   the ledger in use (the limits page replaced, or the charges migrated);
//! - here: [`sweep_if_due`] and the fork child's reset.
//!
//! Imports run one way: `agent_link` below hands over descriptors and mappings and this
//! module drives it (first contact, reconnects); nothing below names the ledger.

mod reconnect;
mod sources;
mod view;

pub use reconnect::tick;
pub use view::{active, current, get, sweep};

use crate::sys::now_ms;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

static LAST_SWEEP_MS: AtomicU64 = AtomicU64::new(0);

/// [`sweep`], at most every 100 ms (memory-info queries); also the agent link's check.
pub fn sweep_if_due() {
    tick();
    let now = now_ms();
    let last = LAST_SWEEP_MS.load(SeqCst);
    if now.saturating_sub(last) >= 100
        && LAST_SWEEP_MS
            .compare_exchange(last, now, SeqCst, SeqCst)
            .is_ok()
    {
        sweep();
    }
}

/// In a fork child (async-signal-safe calls only): get an open file description of our own
/// and drop the parent's, forget the parent's slot.
pub fn after_fork_child() {
    LAST_SWEEP_MS.store(0, SeqCst);
    crate::agent_link::after_fork_child();
    view::after_fork_child();
}
