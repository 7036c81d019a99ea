//! What the enforce loop ([`super::enforce`]) remembers between its passes: the cgroups
//! processes were seen exec'ing in, and the consecutive passes each limited cgroup has been
//! over its threshold in the kernel's count and in the driver's ([`super::unseen`]). The
//! event thread tells it of execs and removed cgroups; it knows nothing else of the agent.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use tokio::sync::Notify;

/// What the enforcement side remembers between passes.
#[derive(Default)]
pub struct Enforcer {
    /// Cgroup ids processes were seen exec'ing in (a new one triggers a sync).
    pub(super) seen: Mutex<HashSet<u64>>,
    pub(super) wake: Notify,
    /// Limited cgroups found over their threshold, by id: consecutive passes.
    pub(super) over: Mutex<HashMap<u64, u32>>,
    /// The same for the driver's count ([`super::unseen`]).
    pub unseen: Passes,
}

impl Enforcer {
    /// A process exec'd in cgroup `id` (from the kernel's exec record).
    pub fn note_cgroup(&self, id: u64) {
        if self.seen.lock().expect("enforcer lock").insert(id) {
            self.wake.notify_one();
        }
    }

    /// Cgroup `id` was removed (from the kernel's record): forget it.
    pub fn cgroup_gone(&self, id: u64) {
        self.seen.lock().expect("enforcer lock").remove(&id);
        self.over.lock().expect("enforcer lock").remove(&id);
    }
}

/// Consecutive passes each (cgroup path, GPU) has been over the driver's count
/// ([`super::unseen`]).
#[derive(Debug, Default)]
pub struct Passes(pub(super) Mutex<HashMap<(String, u32), u32>>);
