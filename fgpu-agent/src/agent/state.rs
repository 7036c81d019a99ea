//! The agent's shared state: its parts, each of which keeps its own locks, built once in
//! [`super::run`] ([`State::new`]) and shared behind an `Arc`. The fields are private: other
//! modules reach a part through a method named for what they need (a part with locks of its
//! own by reference, a locked part as its guard, and narrower operations where a caller only
//! reads or does one thing: a cgroup's id or directory, cgroups' paths, the node's GPUs, a
//! copy of the limits, binding a limit to its cgroup). What reads or changes the parts lives
//! in their own modules ([`super::report`] builds the status report from a `&State`,
//! [`super::apply`] is the one place that reacts to a limit change).
//!
//! # Lock order
//!
//! Where the agent holds one of these locks while it takes another, it does so in this order
//! only (as the code stands; a lock never waits on one listed before it):
//!
//! 0. `budget_pass` ([`State::budget_pass`]): held for a whole budget pass, which takes the
//!    others below in turn; nothing else waits on it;
//! 1. `names` ([`State::names`], [`State::paths_of`], [`State::forget_cgroup`]);
//! 2. `limits` ([`State::limits`], [`State::limits_view`], [`State::memory_limits`]);
//! 3. the parts taken last, each with none of the others: the ledgers' map, or one ledger's
//!    team or effective limit; the reclaim queue; `shims`; the compute figures; the backstop's tallies; `libraries`.
//!
//! (No pass holds `names` and `limits` together now: the status report copies what it reads
//! of each, one after the other. The budget pass holds `names` while it asks `shims`; a limit
//! change holds `limits` while it sets each ledger's team and limit.)
//!
//! `kernel` ([`State::kernel`] and the figures placed on GPUs, [`State::tree_by_gpu`] and
//! the like) and `bound` are taken with no other lock of the state held, and none is taken
//! under them. The enforce loop's memory ([`super::enforcer`]) is no part of the state: the
//! loop owns it and takes no lock for it. Outside the state, the metrics listener's cache is
//! held while a scrape takes its sample, so it comes before all of the above.
//!
//! # One snapshot per pass
//!
//! The periodic passes read the limits and the cgroups' names once each, at the start of the
//! pass or as soon as they know what they need, and work from that copy:
//!
//! - the enforce loop ([`super::enforce`]), at each tick: one copy of the memory limits
//!   ([`State::memory_limits`]) and the kernel's `limits` map made from it, for its sync and,
//!   every second, its reconcile pass, which looks up the paths of the cgroups it found over
//!   (and, where it is to kill the largest holder, of the processes' cgroups) under one lock
//!   of the names ([`State::paths_of`]); the driver's check ([`super::unseen`]) in that pass
//!   reads the same copy;
//! - the status report ([`super::report`], also each metrics sample): the paths of its rows
//!   under one lock of the names, a copy of the limits and the pods' names
//!   ([`State::limits_view`]), every cgroup's backstop tally, the ledgers, each taken once;
//! - the denial log ([`super::metrics`]' eventlog), each second: one copy of the limits,
//!   taken when a ledger first needs it;
//! - the budget pass ([`super::budget::refresh`]) took the limits once and the names once
//!   already (the limited cgroups and each ledger's effective limit, copied under one lock).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::Result;
use fgpu_common::event::{CgroupKey, Event};

use super::backstop::Backstop;
use super::bound::Bound;
use super::cgroups::CgroupNames;
use super::compute::ComputeStatus;
use super::devmap::OverOnGpu;
use super::gpus::{Gpu, Gpus};
use super::kernel::{KernelMaps, Snapshot};
use super::ledgers::Ledgers;
use super::limits::{LimitStore, LimitView, OnExceed};
use super::park::ParkFigures;
use super::peer::Access;
use super::reclaim::Reclaim;
use super::shims::Shims;
use crate::api::Limit;

pub struct State {
    cgroup2_mount: PathBuf,
    kernel: Mutex<KernelMaps>,
    limits: Mutex<LimitStore>,
    /// Limits removed with their cgroup (containers' limits from the CDI hook).
    bound: Mutex<Bound>,
    gpus: Gpus,
    access: Access,
    ledgers: Ledgers,
    /// Dead processes' slots to take back ([`super::reclaim`]).
    reclaim: Reclaim,
    /// Held for a whole budget pass: passes run one at a time ([`super::budget::refresh`]).
    budget_pass: Mutex<()>,
    backstop: Backstop,
    /// Shims that said Hello, by ledger ([`super::budget`]).
    shims: Shims,
    on_exceed: OnExceed,
    /// `--unseen-tolerance` (see [`super::unseen`]).
    unseen_tolerance: u64,
    names: Mutex<CgroupNames>,
    /// Driver libraries the probes are attached to (the library watcher adds to them).
    libraries: Arc<Mutex<Vec<String>>>,
    events: EventCounts,
    /// The compute controller's figures.
    compute: ComputeStatus,
    /// Parking's figures (the broker writes them, [`super::park`]).
    park: ParkFigures,
}

/// What [`State::new`] is given; the other parts start empty.
pub struct Parts {
    pub cgroup2_mount: PathBuf,
    pub kernel: KernelMaps,
    pub limits: LimitStore,
    pub bound: Bound,
    pub gpus: Gpus,
    pub access: Access,
    /// Shared with the library watcher, which adds to it.
    pub libraries: Arc<Mutex<Vec<String>>>,
    pub on_exceed: OnExceed,
    pub unseen_tolerance: u64,
    /// `--max-ledgers-per-tenant`.
    pub max_ledgers_per_tenant: usize,
}

impl State {
    pub fn new(parts: Parts) -> State {
        let Parts {
            cgroup2_mount,
            kernel,
            limits,
            bound,
            gpus,
            access,
            libraries,
            on_exceed,
            unseen_tolerance,
            max_ledgers_per_tenant,
        } = parts;
        State {
            names: Mutex::new(CgroupNames::new(cgroup2_mount.clone())),
            cgroup2_mount,
            kernel: Mutex::new(kernel),
            limits: Mutex::new(limits),
            bound: Mutex::new(bound),
            gpus,
            access,
            ledgers: Ledgers::new(max_ledgers_per_tenant),
            reclaim: Reclaim::default(),
            budget_pass: Mutex::new(()),
            backstop: Backstop::default(),
            shims: Shims::default(),
            on_exceed,
            unseen_tolerance,
            libraries,
            events: EventCounts::default(),
            compute: ComputeStatus::default(),
            park: ParkFigures::default(),
        }
    }

    // The node: its cgroup hierarchy and its GPUs.

    /// Where cgroup v2 is mounted.
    pub fn cgroup2_mount(&self) -> &Path {
        &self.cgroup2_mount
    }

    /// The id of cgroup `path` (a stat of the cgroupfs); `None` if it does not exist.
    pub fn cgroup_id(&self, path: &str) -> Option<u64> {
        super::cgroups::cgroup_id(&self.cgroup2_mount, path)
    }

    /// The directory of cgroup `path` on the cgroupfs.
    pub fn cgroup_dir(&self, path: &str) -> PathBuf {
        self.cgroup2_mount.join(path.trim_start_matches('/'))
    }

    pub fn gpus(&self) -> &Gpus {
        &self.gpus
    }

    /// The node's GPUs (NVML's list; empty without NVML).
    pub fn devices(&self) -> &[Gpu] {
        &self.gpus.devices
    }

    // The policy the agent was started with.

    /// `--on-exceed`.
    pub fn on_exceed(&self) -> OnExceed {
        self.on_exceed
    }

    /// `--unseen-tolerance`, in bytes.
    pub fn unseen_tolerance(&self) -> u64 {
        self.unseen_tolerance
    }

    /// Who may use the admin socket's control requests.
    pub fn access(&self) -> &Access {
        &self.access
    }

    // Parts that keep their own locks.

    pub fn ledgers(&self) -> &Ledgers {
        &self.ledgers
    }

    /// Dead processes' slots to take back.
    pub fn reclaim(&self) -> &Reclaim {
        &self.reclaim
    }

    /// The budget pass's turn (passes run one at a time).
    pub fn budget_pass(&self) -> MutexGuard<'_, ()> {
        self.budget_pass.lock().expect("budget pass lock")
    }

    pub fn backstop(&self) -> &Backstop {
        &self.backstop
    }

    pub fn shims(&self) -> &Shims {
        &self.shims
    }

    /// The compute controller's figures.
    pub fn compute(&self) -> &ComputeStatus {
        &self.compute
    }

    /// Parking's figures.
    pub fn park(&self) -> &ParkFigures {
        &self.park
    }

    /// Events seen, by kind ([`super::events`]).
    pub fn events(&self) -> &EventCounts {
        &self.events
    }

    /// The backstop's report of an `OverLimit` or `OverBound` record, with the names, the
    /// limits and the GPUs it reads.
    pub fn backstop_record(&self, e: &Event) {
        self.backstop
            .record(&self.names, &self.limits, &self.gpus.devices, e);
    }

    /// Driver libraries the probes are attached to (a copy).
    pub fn libraries(&self) -> Vec<String> {
        self.libraries.lock().expect("libraries lock").clone()
    }

    // Locked parts (the lock order is in the module documentation).

    /// The limit store, locked.
    pub fn limits(&self) -> MutexGuard<'_, LimitStore> {
        self.limits.lock().expect("limits lock")
    }

    /// A copy of the limits and the pods' names (one lock), for a pass that reads them
    /// throughout.
    pub fn limits_view(&self) -> LimitView {
        self.limits().view()
    }

    /// Every cgroup's own limit that sets memory, by path, copied under one lock.
    pub fn memory_limits(&self) -> Vec<(String, Limit)> {
        self.limits()
            .all()
            .filter(|(_, l)| l.has_memory())
            .map(|(path, l)| (path.clone(), l.clone()))
            .collect()
    }

    /// The cgroup names (id -> path), locked: for a caller that looks up many.
    pub fn names(&self) -> MutexGuard<'_, CgroupNames> {
        self.names.lock().expect("cgroup names lock")
    }

    /// The paths of cgroups `ids`, under one lock of the names; ids without one are left
    /// out.
    pub fn paths_of(&self, ids: impl IntoIterator<Item = u64>) -> HashMap<u64, String> {
        let mut names = self.names();
        let mut out = HashMap::new();
        for id in ids {
            if let std::collections::hash_map::Entry::Vacant(e) = out.entry(id)
                && let Some(path) = names.path_of(id)
            {
                e.insert(path);
            }
        }
        out
    }

    /// Cgroup `id` was removed: its name is forgotten.
    pub fn forget_cgroup(&self, id: u64) {
        self.names().forget(id);
    }

    /// The kernel's maps, locked.
    pub fn kernel(&self) -> MutexGuard<'_, KernelMaps> {
        self.kernel.lock().expect("kernel maps lock")
    }

    /// The kernel's subtree totals keyed by physical GPU ([`super::devmap::tree`]).
    pub fn tree_by_gpu(&self) -> Vec<(CgroupKey, u64)> {
        super::devmap::tree(&self.kernel, &self.gpus)
    }

    /// The kernel's snapshot keyed by physical GPU ([`super::devmap::snapshot`]).
    pub fn snapshot_by_gpu(&self) -> Snapshot {
        super::devmap::snapshot(&self.kernel, &self.gpus)
    }

    /// The GPUs each process's kernel bytes are on ([`super::devmap::process_gpus`]).
    pub fn process_gpus(&self) -> HashMap<u32, Vec<(u32, u64)>> {
        super::devmap::process_gpus(&self.kernel, &self.gpus)
    }

    /// Limited subtrees over their limit on one GPU ([`super::devmap::over_on_one_gpu`]).
    pub fn over_on_one_gpu(&self, limits: &HashMap<u64, HashMap<u32, u64>>) -> Vec<OverOnGpu> {
        super::devmap::over_on_one_gpu(&self.kernel, &self.gpus, limits)
    }

    /// Binds the limit of `cgroup` (id `cgroup_id`) to the cgroup's life ([`super::bound`]).
    pub fn bind(&self, cgroup: &str, cgroup_id: u64) -> Result<()> {
        self.bound
            .lock()
            .expect("bound lock")
            .bind(cgroup, cgroup_id)
    }

    /// Bound cgroups that are gone.
    pub fn bound_gone(&self) -> Vec<String> {
        self.bound
            .lock()
            .expect("bound lock")
            .gone(&self.cgroup2_mount)
    }

    /// Forgets the binding of `cgroups` (their limits were removed).
    pub fn unbind(&self, cgroups: &[String]) -> Result<()> {
        self.bound.lock().expect("bound lock").forget(cgroups)
    }
}

/// Events seen by the agent, by kind ([`super::events`]).
#[derive(Debug, Default)]
pub struct EventCounts {
    pub allocs: AtomicU64,
    pub frees: AtomicU64,
    pub exits: AtomicU64,
}
