//! Taking back what dead processes left in their ledgers' slots (bytes, compute and parking
//! state), at a bounded cost per pass whatever a tenant holds.
//!
//! Proving a slot's owner dead costs a lock attempt on it, and a tenant can hold every slot
//! of every ledger it has. So slots are gone through only where an owner may have died:
//! - a ledger whose domain saw a process holding GPU memory exit (the kernel's exit
//!   records, [`Reclaim::exited_in`]), or one of whose shims exited (the pidfd taken at its
//!   Hello, [`Reclaim::shim_died_in`]), is queued at the next pass: a sibling's budget, or
//!   a neighbour's turn, does not wait for the sweep;
//! - every ledger comes up in turn in a sweep, once a second, for the dead that the kernel
//!   did not see hold memory (a slot with compute state only);
//!
//! and each pass looks at no more than [`SLOTS_PER_PASS`] slots, going on where it stopped at
//! the next.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use super::ledgers::CgroupLedger;
use super::pathindex::PathIndex;

/// Slots looked at per pass, queued and swept together (a lock attempt each, at most).
pub const SLOTS_PER_PASS: usize = 4096;
/// Cgroups with an exit remembered between two passes; past it an exit is left to the
/// sweep.
const MAX_EXITED: usize = 4096;

#[derive(Default)]
pub struct Reclaim(Mutex<Inner>);

#[derive(Default)]
struct Inner {
    /// Cgroups where a process holding GPU memory exited since the last pass.
    exited: HashSet<u64>,
    /// Ledgers (their cgroups) one of whose shims exited since the last pass.
    shim_died: HashSet<String>,
    /// Ledgers being gone through, and the slot each goes on from.
    queue: VecDeque<(Arc<CgroupLedger>, usize)>,
    /// The cgroups of the ledgers in `queue`.
    queued: HashSet<String>,
    /// The last ledger the sweep queued (ledgers come up in the order of their paths).
    swept: Option<String>,
}

impl Inner {
    fn enqueue(&mut self, l: Arc<CgroupLedger>) {
        if self.queued.insert(l.cgroup.clone()) {
            self.queue.push_back((l, 0));
        }
    }
}

impl Reclaim {
    /// A process holding GPU memory exited in cgroup `cgroup_id` (the kernel's record).
    pub fn exited_in(&self, cgroup_id: u64) {
        let mut inner = self.0.lock().expect("reclaim lock");
        if inner.exited.len() < MAX_EXITED {
            inner.exited.insert(cgroup_id);
        }
    }

    /// A shim that got the ledger of cgroup `ledger` exited.
    pub fn shim_died_in(&self, ledger: String) {
        let mut inner = self.0.lock().expect("reclaim lock");
        if inner.shim_died.len() < MAX_EXITED {
            inner.shim_died.insert(ledger);
        }
    }

    /// Goes through the slots of `ledgers` now (with whatever else is queued, at most
    /// [`SLOTS_PER_PASS`] slots): for a budget about to be planned from theirs, so that the
    /// share of a process that has just exited is not counted against it until the next pass.
    pub fn now(&self, ledgers: impl IntoIterator<Item = Arc<CgroupLedger>>) -> u64 {
        {
            let mut inner = self.0.lock().expect("reclaim lock");
            for l in ledgers {
                inner.enqueue(l);
            }
        }
        self.drain_queue()
    }

    /// One pass over `ledgers` (all of them): queues those where processes exited (their
    /// cgroups named by `paths_of`) and, with `sweep`, the next ones in turn, then goes
    /// through at most [`SLOTS_PER_PASS`] slots of the queue. Returns the bytes given back.
    pub fn pass(
        &self,
        ledgers: impl FnOnce() -> Vec<Arc<CgroupLedger>>,
        paths_of: impl FnOnce(Vec<u64>) -> HashMap<u64, String>,
        sweep: bool,
    ) -> u64 {
        let (exited, shim_died): (Vec<u64>, Vec<String>) = {
            let mut inner = self.0.lock().expect("reclaim lock");
            (
                inner.exited.drain().collect(),
                inner.shim_died.drain().collect(),
            )
        };
        if !exited.is_empty() || !shim_died.is_empty() || sweep {
            let ledgers = ledgers();
            let paths = if exited.is_empty() {
                HashMap::new()
            } else {
                paths_of(exited)
            };
            let mut inner = self.0.lock().expect("reclaim lock");
            if !paths.is_empty() || !shim_died.is_empty() {
                let mut by_path = PathIndex::default();
                for l in &ledgers {
                    by_path.insert(&l.cgroup, l);
                }
                for path in paths.values() {
                    if let Some(&l) = by_path.deepest(path) {
                        inner.enqueue(Arc::clone(l));
                    }
                }
                for ledger in &shim_died {
                    if let Some(&l) = by_path.deepest(ledger)
                        && &l.cgroup == ledger
                    {
                        inner.enqueue(Arc::clone(l));
                    }
                }
            }
            if sweep {
                sweep_next(&mut inner, ledgers);
            }
        }
        self.drain_queue()
    }

    /// Goes through the queue, at most [`SLOTS_PER_PASS`] slots.
    fn drain_queue(&self) -> u64 {
        let mut left = SLOTS_PER_PASS;
        let mut total = 0u64;
        while left > 0 {
            let Some((l, from)) = self.0.lock().expect("reclaim lock").queue.pop_front() else {
                break;
            };
            let (back, next) = l.reclaim_dead_in(from, left);
            let looked = match next {
                Some(next) => next - from,
                None => l.ledger().slots_in_range().saturating_sub(from),
            };
            left = left.saturating_sub(looked.max(1));
            if back > 0 {
                tracing::info!(cgroup = %l.cgroup, bytes = back, "reclaimed the share of processes that died");
                total = total.saturating_add(back);
            }
            let mut inner = self.0.lock().expect("reclaim lock");
            match next {
                Some(next) => {
                    inner.queue.push_front((l, next));
                    break;
                }
                None => {
                    inner.queued.remove(&l.cgroup);
                }
            }
        }
        total
    }
}

/// Queues the ledgers that come next in the sweep, about a pass's worth of slots (one at
/// least), in the order of their paths, going round.
fn sweep_next(inner: &mut Inner, mut ledgers: Vec<Arc<CgroupLedger>>) {
    if ledgers.is_empty() {
        return;
    }
    ledgers.sort_by(|a, b| a.cgroup.cmp(&b.cgroup));
    let start = inner
        .swept
        .as_ref()
        .map_or(0, |after| ledgers.partition_point(|l| &l.cgroup <= after));
    let mut slots = 0usize;
    for k in 0..ledgers.len() {
        let l = &ledgers[(start + k) % ledgers.len()];
        if k > 0 && slots >= SLOTS_PER_PASS {
            break;
        }
        slots += l.ledger().slots_in_range();
        inner.swept = Some(l.cgroup.clone());
        inner.enqueue(Arc::clone(l));
    }
}
