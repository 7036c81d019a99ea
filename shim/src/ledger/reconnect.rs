//! Moving this process to another ledger after the agent restarted, and the agent link's
//! periodic check that finds out ([`tick`]).
//!
//! [`crate::agent_link`] notices a dead connection and reaches the agent again; this module
//! decides what its answer means for the ledger in use: the same usage memfd back (the agent
//! adopted ours): only the limits page is replaced, in place; another one: this process's
//! charges move over ([`migrate`]) and the new ledger is published.

use super::sources::ledger_at;
use super::view::{self, claim, view};
use crate::agent_link;
use crate::log::{error, info};
use crate::sys::reopen_own;
use fgpu_common::ledger::MAX_DEVICES;
use std::sync::atomic::Ordering::SeqCst;

/// The allocation slow path's look at the agent link (at most every
/// [`agent_link::CHECK_EVERY_MS`]): a dead connection is noticed and a reconnect tried. Costs
/// one coarse clock read when not due.
pub fn tick() {
    let Some(reconnect_due) = agent_link::check() else {
        return;
    };
    if reconnect_due {
        reconnect();
    }
    agent_link::check_done();
}

/// Tries once to get the agent's ledger again and switch to it.
fn reconnect() {
    let (base, fd, agent_ledger) = view::current();
    // A fresh open file description of our usage memfd is handed over, never the one our
    // slot lock lives on (agent_link::hello_again).
    let Some(reply) = agent_link::hello_again(agent_ledger.then_some(fd)) else {
        return;
    };
    let ok = if agent_ledger && fd >= 0 && agent_link::same_file(reply.usage.0, fd) {
        // The agent adopted our usage memfd (or already had it): only the limits page is new.
        match agent_link::replace_limits(base, reply.limits.0, reply.usage.0) {
            Ok(()) => true,
            Err(e) => {
                error!("reconnected to the fgpu agent, but its limits page is unusable: {e}");
                false
            }
        }
    } else {
        match agent_link::map_ledger(reply.limits.0, reply.usage.0) {
            Ok(new_base) => {
                let own = reopen_own(reply.usage.0);
                if own >= 0 && migrate(new_base, own) {
                    true
                } else {
                    // Nothing refers to the new ledger (migrate published nothing).
                    if own >= 0 {
                        // SAFETY: closing the description we opened.
                        unsafe { libc::close(own) };
                    }
                    fgpu_ledger::unmap_shim(new_base);
                    false
                }
            }
            Err(e) => {
                error!("reconnected to the fgpu agent, but its ledger is unusable: {e}");
                false
            }
        }
    };
    if ok {
        agent_link::reconnected(reply);
    }
}

fn sub_saturating(a: &std::sync::atomic::AtomicU64, n: u64) {
    let _ = a.fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(n)));
}

/// Moves this process over to another ledger (the agent restarted and has a usage memfd of
/// its own for the cgroup): binds the same device records, claims a slot through `fd`,
/// force-charges what this process holds (even over the limit: the memory is in use), then
/// publishes the new view and takes the charges out of the old ledger. Operations that were
/// already in flight on the old ledger are settled once more after the switch; one that
/// lands on the old ledger after that stays there (the old ledger's count is too high, ours
/// too low by that allocation until it is freed). Returns false (nothing changed, the
/// mapping at `map` unused) if the two ledgers bind devices differently.
fn migrate(map: usize, fd: i32) -> bool {
    let Some(old_view) = view() else {
        return false;
    };
    let old = old_view.ledger();
    let new = ledger_at(map);
    for d in 0..MAX_DEVICES {
        let k = old.usage.devices[d].key.load(SeqCst);
        if k == 0 {
            continue;
        }
        let nd = &new.usage.devices[d];
        match nd.key.compare_exchange(0, k, SeqCst, SeqCst) {
            Ok(_) => {
                nd.uuid[0].store(old.usage.devices[d].uuid[0].load(SeqCst), SeqCst);
                nd.uuid[1].store(old.usage.devices[d].uuid[1].load(SeqCst), SeqCst);
            }
            Err(now) if now == k => {}
            Err(_) => {
                error!(
                    "the fgpu agent's new ledger binds device record {d} to another GPU: \
                     staying on the previous ledger (its limits as they were)"
                );
                return false;
            }
        }
    }
    let Some(slot) = claim(new, fd) else {
        return false;
    };
    let s = &old.slots[old_view.slot];
    let mut moved = [0u64; MAX_DEVICES];
    for (d, m) in moved.iter_mut().enumerate() {
        let n = s.used[d].load(SeqCst);
        if n != 0 {
            new.charge(d, slot, n);
            new.slots[slot].overhead[d].store(s.overhead[d].load(SeqCst), SeqCst);
        }
        *m = n;
    }
    view::publish_agent(map, fd, slot);
    let mut total = 0u64;
    for (d, &m) in moved.iter().enumerate() {
        let n = s.used[d].swap(0, SeqCst);
        s.overhead[d].store(0, SeqCst);
        sub_saturating(&old.usage.devices[d].used, n);
        if n > m {
            new.charge(d, slot, n - m);
        } else if n < m {
            new.release(d, slot, m - n);
        }
        total = total.saturating_add(n);
    }
    // The old slot is empty: let it go (the descriptor stays open: a concurrent sweep may
    // still be using it).
    fgpu_ledger::unlock_slot(old_view.fd, old_view.slot);
    info!("moved {total} bytes of this process's charges to the fgpu agent's ledger (slot {slot})");
    true
}
