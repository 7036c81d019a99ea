//! Reading what the kernel side recorded (`cg_usage`, `tree_usage`, `procs`, `tenants`,
//! `counters`) and writing the maps the agent owns: `limits`, and the node's shared parents
//! (`shared`, `shared_paths`; which cgroups those are, [`super::shared`]).
//!
//! The totals live in maps updated with atomic adds in the kernel, so they stay exact even
//! if ring-buffer events are dropped; the agent only reads them. The kernel prunes a removed
//! cgroup's records itself (`fgpu_cgroup_rmdir`), so the agent never deletes any.

use anyhow::{Context, Result};
use aya::Ebpf;
use aya::Pod;
use aya::maps::{Array, HashMap, MapData};
use fgpu_common::event::{
    CgroupKey, CgroupTree, CgroupUsage, KernelLimit, ProcUsage, SharedPath, counter,
};

use crate::status::KernelCounters;

// aya reads map keys and values as `Pod`; these wrappers carry the shared layouts.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct Key(CgroupKey);
#[derive(Clone, Copy)]
#[repr(transparent)]
struct Usage(CgroupUsage);
#[derive(Clone, Copy)]
#[repr(transparent)]
struct Proc(ProcUsage);
#[derive(Clone, Copy)]
#[repr(transparent)]
struct Lim(KernelLimit);
#[derive(Clone, Copy)]
#[repr(transparent)]
struct Tree(CgroupTree);
#[derive(Clone, Copy)]
#[repr(transparent)]
struct Path(SharedPath);

// SAFETY: #[repr(transparent)] over #[repr(C)] structs of integers with no padding holes
// the kernel could leave uninitialised (layouts asserted in fgpu_common::event).
unsafe impl Pod for Key {}
// SAFETY: as above.
unsafe impl Pod for Usage {}
// SAFETY: as above.
unsafe impl Pod for Proc {}
// SAFETY: as above.
unsafe impl Pod for Lim {}
// SAFETY: as above.
unsafe impl Pod for Tree {}
// SAFETY: #[repr(transparent)] over a #[repr(C)] byte array (layout asserted likewise).
unsafe impl Pod for Path {}

/// A consistent-enough copy of the kernel's view (each entry is read atomically).
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    pub usage: Vec<(CgroupKey, CgroupUsage)>,
    /// Subtree totals: bytes held by a cgroup and all its descendants, per device.
    pub tree: Vec<(CgroupKey, u64)>,
    pub procs: Vec<(u32, ProcUsage)>,
    pub counters: KernelCounters,
}

pub struct KernelMaps {
    usage: HashMap<MapData, Key, Usage>,
    tree: HashMap<MapData, Key, u64>,
    cg_tree: HashMap<MapData, u64, Tree>,
    limits: HashMap<MapData, u64, Lim>,
    procs: HashMap<MapData, u32, Proc>,
    shared: HashMap<MapData, u64, u32>,
    shared_paths: HashMap<MapData, Path, u64>,
    counters: Array<MapData, u64>,
}

impl KernelMaps {
    pub fn take(ebpf: &mut Ebpf) -> Result<Self> {
        let mut take = |name: &str| {
            ebpf.take_map(name)
                .with_context(|| format!("eBPF object lacks map {name}"))
        };
        use fgpu_ebpf::maps;
        Ok(Self {
            usage: HashMap::try_from(take(maps::CG_USAGE)?)?,
            tree: HashMap::try_from(take(maps::TREE_USAGE)?)?,
            cg_tree: HashMap::try_from(take(maps::CG_TREE)?)?,
            limits: HashMap::try_from(take(maps::LIMITS)?)?,
            procs: HashMap::try_from(take(maps::PROCS)?)?,
            shared: HashMap::try_from(take(maps::SHARED)?)?,
            shared_paths: HashMap::try_from(take(maps::SHARED_PATHS)?)?,
            counters: Array::try_from(take(maps::COUNTERS)?)?,
        })
    }

    /// The per-(cgroup, device) totals of each cgroup's own processes.
    pub fn usage(&self) -> Vec<(CgroupKey, CgroupUsage)> {
        // An entry deleted while we iterate ends that walk early; what was read stays valid.
        self.usage
            .iter()
            .filter_map(Result::ok)
            .map(|(k, v)| (k.0, v.0))
            .collect()
    }

    /// The per-(cgroup, device) subtree totals.
    pub fn tree(&self) -> Vec<(CgroupKey, u64)> {
        self.tree
            .iter()
            .filter_map(Result::ok)
            .map(|(k, v)| (k.0, v))
            .collect()
    }

    /// The processes holding GPU memory.
    pub fn procs(&self) -> Vec<(u32, ProcUsage)> {
        self.procs
            .iter()
            .filter_map(Result::ok)
            .map(|(k, v)| (k, v.0))
            .collect()
    }

    /// The limits the kernel enforces, by cgroup id (0: the node's default policy).
    pub fn limits(&self) -> Vec<(u64, KernelLimit)> {
        self.limits
            .iter()
            .filter_map(Result::ok)
            .map(|(k, v)| (k, v.0))
            .collect()
    }

    pub fn set_limit(&mut self, cgroup_id: u64, limit: KernelLimit) -> Result<()> {
        self.limits
            .insert(cgroup_id, Lim(limit), 0)
            .with_context(|| format!("writing the kernel limit of cgroup {cgroup_id}"))
    }

    pub fn remove_limit(&mut self, cgroup_id: u64) -> Result<()> {
        self.limits
            .remove(&cgroup_id)
            .with_context(|| format!("removing the kernel limit of cgroup {cgroup_id}"))
    }

    /// Marks cgroup `id` at `path` as one of the node's shared parents (its path first, so
    /// that the kernel reports cgroups made in it as soon as it is shared). `Ok(false)` if
    /// its path does not fit the kernel's key (it stays unmarked).
    pub fn mark_shared(&mut self, id: u64, path: &str) -> Result<bool> {
        let Some(key) = SharedPath::new(path) else {
            return Ok(false);
        };
        self.shared_paths
            .insert(Path(key), id, 0)
            .with_context(|| format!("marking {path} shared (by path)"))?;
        self.shared
            .insert(id, 1, 0)
            .with_context(|| format!("marking {path} shared"))?;
        Ok(true)
    }

    /// Whether cgroup `id` is marked shared.
    pub fn is_shared(&self, id: u64) -> bool {
        self.shared.get(&id, 0).is_ok()
    }

    /// The ancestry the kernel recorded, by cgroup id.
    pub fn ancestry(&self) -> std::collections::HashMap<u64, CgroupTree> {
        self.cg_tree
            .iter()
            .filter_map(Result::ok)
            .map(|(k, v)| (k, v.0))
            .collect()
    }

    pub fn snapshot(&self) -> Snapshot {
        let get = |idx| self.counters.get(&idx, 0).unwrap_or(0);
        Snapshot {
            usage: self.usage(),
            tree: self.tree(),
            procs: self.procs(),
            counters: KernelCounters {
                ringbuf_drops: get(counter::RINGBUF_DROPS),
                map_full: get(counter::MAP_FULL),
                unknown_frees: get(counter::UNKNOWN_FREES),
                failed_calls: get(counter::FAILED_CALLS),
                over_limit: get(counter::OVER_LIMIT),
                killed: get(counter::KILLED),
                over_bound: get(counter::OVER_BOUND),
                args_lost: get(counter::ARGS_LOST),
                addr_untrusted: get(counter::ADDR_UNTRUSTED),
                cgroups_pruned: get(counter::CGROUPS_PRUNED),
            },
        }
    }
}
