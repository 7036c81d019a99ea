//! Reading what the kernel side recorded: the `cg_usage`, `procs` and `counters` maps.
//!
//! The totals live in maps updated with atomic adds in the kernel, so they stay exact even
//! if ring-buffer events are dropped; the agent only reads them.

use anyhow::{Context, Result};
use aya::Ebpf;
use aya::Pod;
use aya::maps::{Array, HashMap, MapData};
use fgpu_common::event::{CgroupKey, CgroupUsage, ProcUsage, counter};

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

// SAFETY: #[repr(transparent)] over #[repr(C)] structs of integers with no padding holes
// the kernel could leave uninitialised (layouts asserted in fgpu_common::event).
unsafe impl Pod for Key {}
// SAFETY: as above.
unsafe impl Pod for Usage {}
// SAFETY: as above.
unsafe impl Pod for Proc {}

/// A consistent-enough copy of the kernel's view (each entry is read atomically).
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    pub usage: Vec<(CgroupKey, CgroupUsage)>,
    pub procs: Vec<(u32, ProcUsage)>,
    pub counters: KernelCounters,
}

pub struct KernelMaps {
    usage: HashMap<MapData, Key, Usage>,
    procs: HashMap<MapData, u32, Proc>,
    counters: Array<MapData, u64>,
}

impl KernelMaps {
    pub fn take(ebpf: &mut Ebpf) -> Result<Self> {
        let mut take = |name: &str| {
            ebpf.take_map(name)
                .with_context(|| format!("eBPF object lacks map {name}"))
        };
        Ok(Self {
            usage: HashMap::try_from(take(fgpu_ebpf::maps::CG_USAGE)?)?,
            procs: HashMap::try_from(take(fgpu_ebpf::maps::PROCS)?)?,
            counters: Array::try_from(take(fgpu_ebpf::maps::COUNTERS)?)?,
        })
    }

    /// The per-(cgroup, device) totals alone.
    pub fn usage(&self) -> Vec<(CgroupKey, CgroupUsage)> {
        // An entry deleted while we iterate ends that walk early; what was read stays valid.
        self.usage
            .iter()
            .filter_map(Result::ok)
            .map(|(k, v)| (k.0, v.0))
            .collect()
    }

    pub fn snapshot(&self) -> Snapshot {
        let usage = self.usage();
        let procs = self
            .procs
            .iter()
            .filter_map(Result::ok)
            .map(|(k, v)| (k, v.0))
            .collect();
        let get = |idx| self.counters.get(&idx, 0).unwrap_or(0);
        Snapshot {
            usage,
            procs,
            counters: KernelCounters {
                ringbuf_drops: get(counter::RINGBUF_DROPS),
                map_full: get(counter::MAP_FULL),
                unknown_frees: get(counter::UNKNOWN_FREES),
                failed_calls: get(counter::FAILED_CALLS),
            },
        }
    }
}
