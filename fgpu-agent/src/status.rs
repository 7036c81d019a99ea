//! The status report: what `fgpu status --json` prints, one element per cgroup that uses a
//! GPU. Field names are a contract (docs/design.md section 2); add fields, never rename them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CgroupStatus {
    /// cgroup v2 path relative to the cgroup root, e.g. `/kubepods.slice/...`.
    pub cgroup: String,
    /// The cgroup's id (inode of its directory), as `bpf_get_current_cgroup_id()` reports it.
    pub cgroup_id: u64,
    /// Processes (host PIDs) holding GPU memory charged to this cgroup.
    pub pids: Vec<u32>,
    /// Bytes the kernel saw allocated and not yet freed, all devices.
    pub memory_used_bytes: u64,
    /// The memory limit that applies to the cgroup (the lowest of its own and its
    /// ancestors'); `null` when none does.
    pub memory_limit_bytes: Option<u64>,
    /// Per-GPU memory limits that apply to the cgroup, by GPU UUID (`fgpu limit set --gpu`;
    /// the lowest of its own and its ancestors' on each GPU): on a GPU listed here this
    /// value applies instead of `memory_limit_bytes`. Each device's figure is also in
    /// `devices[].limit_bytes`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub memory_limit_gpus: BTreeMap<String, u64>,
    /// The cgroup whose limit `memory_limit_bytes` is (itself or an ancestor).
    #[serde(default)]
    pub memory_limit_from: Option<String>,
    /// Bytes the kernel saw held by the cgroup and all its descendants, all devices: what
    /// its own limit is checked against.
    #[serde(default)]
    pub memory_subtree_bytes: u64,
    /// The cgroup whose ledger (budget) the cgroup's shims share: itself, or the limited
    /// ancestor whose budget it is part of. `null` while no shim of it connected.
    #[serde(default)]
    pub ledger: Option<String>,
    /// Allocations refused because they would have crossed the limit, as the cgroup's shims
    /// report them: the count they write in the ledger's usage page, which the tenant's
    /// processes share read-write, so the tenant's own word (not checked by the agent).
    pub alloc_denied: u64,
    /// Times the kernel backstop found the cgroup over its limit (a process that bypassed
    /// the shim), and killed the process or reported it, per `--on-exceed`.
    #[serde(default)]
    pub over_limit_actions: u64,
    /// Processes the kernel killed at the allocation that took the cgroup past its limit
    /// (or past its bound on tracking entries), as reported by the kernel's records.
    #[serde(default)]
    pub kernel_kills: u64,
    /// Allocations of this tenant not tracked because it reached its bound on tracking
    /// entries (the policy applied to each).
    #[serde(default)]
    pub over_bound: u64,
    /// The same usage per device.
    pub devices: Vec<DeviceUsage>,
    /// Configured guaranteed compute share, percent (`null`: none).
    #[serde(default)]
    pub compute_share_pct: Option<u8>,
    /// Configured compute cap, percent (`null`: none).
    #[serde(default)]
    pub compute_cap_pct: Option<u8>,
    /// Per-GPU compute shares and caps that apply, by GPU UUID (`fgpu limit set --compute P
    /// --gpu X`): on a GPU listed here the value applies instead of the plain one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub compute_share_gpus: BTreeMap<String, u8>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub compute_cap_gpus: BTreeMap<String, u8>,
    /// GPU time the cgroup's gated launches used over the last 5 s, percent of wall time
    /// (summed over devices; measured by the shims' events). `null` when the cgroup's
    /// compute is not gated.
    #[serde(default)]
    pub compute_used_pct: Option<f64>,
    /// Device time the cgroup held in turns over the last 5 s, percent of wall time: what a
    /// compute share is a share of (docs/compute.md). `null` when not gated.
    #[serde(default)]
    pub compute_turn_pct: Option<f64>,
    /// The cgroup runs beside the turn holder (latency-bound and under its share) on some
    /// device.
    #[serde(default)]
    pub compute_corun: bool,
    /// How much estimated GPU time each of the cgroup's processes may have queued on a
    /// device right now, µs (the controller's queue bound, times the cgroup's active
    /// processes, at most 4×; docs/compute.md). `null` when not gated.
    #[serde(default)]
    pub compute_queue_us: Option<u64>,
    /// Cross-check: NVML's per-process SM utilisation of the cgroup's processes over the last
    /// few seconds, percent (summed over processes and devices; `null` where NVML has no
    /// samples, e.g. the simulated driver).
    #[serde(default)]
    pub compute_nvml_pct: Option<f64>,
    /// The container (docker, podman, containerd, CRI-O) whose cgroup this is, or which it
    /// is inside of: its full id, from the cgroup's name; `null` for other cgroups.
    #[serde(default)]
    pub container_id: Option<String>,
    /// The Kubernetes pod whose cgroup this is (or which it is inside of): `namespace/name`
    /// where an fgpu DRA claim names it, else `pod <uid>`; `null` outside pods.
    #[serde(default)]
    pub pod: Option<String>,
    /// That pod's UID, from the cgroup's name (`null` outside pods).
    #[serde(default)]
    pub pod_uid: Option<String>,
    /// That pod's namespace and name, as the kubelet plugin gave them with the limit it set
    /// on the pod's cgroup (`null` where no fgpu DRA claim names the pod).
    #[serde(default)]
    pub pod_namespace: Option<String>,
    #[serde(default)]
    pub pod_name: Option<String>,
    /// Parkable after this long without GPU use, ms (`null`: not parkable; docs/parking.md).
    #[serde(default)]
    pub park_after_ms: Option<u64>,
    /// Device memory of its processes parked in host memory now (all GPUs); such bytes
    /// are not in `memory_used_bytes`.
    #[serde(default)]
    pub parked_bytes: u64,
    /// Why some process of it cannot be parked, as its shims said (empty: nothing pins it).
    #[serde(default)]
    pub park_pinned: Vec<String>,
    /// Parks and unparks its processes carried out (processes alive now).
    #[serde(default)]
    pub parks: u64,
    #[serde(default)]
    pub unparks: u64,
}

impl CgroupStatus {
    /// A row with nothing in it yet.
    pub fn empty(cgroup: String) -> Self {
        CgroupStatus {
            cgroup,
            cgroup_id: 0,
            pids: Vec::new(),
            memory_used_bytes: 0,
            memory_limit_bytes: None,
            memory_limit_gpus: BTreeMap::new(),
            memory_limit_from: None,
            memory_subtree_bytes: 0,
            ledger: None,
            alloc_denied: 0,
            over_limit_actions: 0,
            kernel_kills: 0,
            over_bound: 0,
            devices: Vec::new(),
            compute_share_pct: None,
            compute_cap_pct: None,
            compute_share_gpus: BTreeMap::new(),
            compute_cap_gpus: BTreeMap::new(),
            compute_used_pct: None,
            compute_turn_pct: None,
            compute_corun: false,
            compute_queue_us: None,
            compute_nvml_pct: None,
            container_id: None,
            pod: None,
            pod_uid: None,
            pod_namespace: None,
            pod_name: None,
            park_after_ms: None,
            parked_bytes: 0,
            park_pinned: Vec::new(),
            parks: 0,
            unparks: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceUsage {
    /// The GPU: its NVML index where the agent can tell (on a node of several GPUs the
    /// kernel's figures are placed on physical GPUs), else the kernel's device key.
    pub device: u32,
    /// The GPU's NVML UUID, where `device` is an NVML index the agent knows.
    #[serde(default)]
    pub uuid: Option<String>,
    pub memory_used_bytes: u64,
    /// The memory limit that applies to the cgroup on this GPU (`null`: none).
    #[serde(default)]
    pub limit_bytes: Option<u64>,
    /// Successful allocations charged since the agent started.
    pub allocs: u64,
    /// Frees and process-exit releases credited since the agent started.
    pub frees: u64,
}

/// Node-wide counters of the kernel side; never silently non-zero.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelCounters {
    /// Events that did not fit in the ring buffer (totals stay exact: they live in maps).
    pub ringbuf_drops: u64,
    /// Allocations that could not be tracked because a map was full.
    pub map_full: u64,
    /// Frees of pointers never seen allocated (allocated before the agent started).
    pub unknown_frees: u64,
    /// Probed calls that returned an error (nothing charged).
    pub failed_calls: u64,
    /// Allocations that took a limited cgroup past its limit (the kernel acted on each).
    #[serde(default)]
    pub over_limit: u64,
    /// Processes the kernel SIGKILLed at such an allocation (`--on-exceed kill`).
    #[serde(default)]
    pub killed: u64,
    /// Allocations not tracked because their tenant reached its bound on tracking entries
    /// (the policy applied to them).
    #[serde(default)]
    pub over_bound: u64,
    /// Probed calls whose arguments the kernel could not store (an allocation among them
    /// failed closed by its tenant's policy).
    #[serde(default)]
    pub args_lost: u64,
    /// Allocations charged under a key of their own because the address read back could not
    /// be believed (unreadable, or naming memory the process still held).
    #[serde(default)]
    pub addr_untrusted: u64,
    /// Removed cgroups whose kernel records were pruned.
    #[serde(default)]
    pub cgroups_pruned: u64,
}

/// Everything the agent answers to a status request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    pub cgroups: Vec<CgroupStatus>,
    pub counters: KernelCounters,
    /// Driver libraries the probes are attached to.
    pub libraries: Vec<String>,
    /// True when the report is the caller's own cgroup only (the containers' socket's
    /// answer): no node-wide counters or libraries then.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub own_only: bool,
}

/// Longest text [`printable`] keeps; longer text is cut (on a character boundary).
const MAX_PRINTABLE: usize = 512;

/// A name from the report (a cgroup path, a GPU's name or UUID, the node's name) made safe
/// for a metrics label value (the exposition does not escape it, and dashboards show it):
/// `\`, `"`, control characters (a cgroup's name may hold a newline) and invisible format
/// characters such as bidi overrides ([`fgpu_common::inert::is_unsafe`]) become `_`, and
/// long text is cut at 512 bytes. Terminals get [`fgpu_common::inert::escape`] instead,
/// which keeps the name readable.
pub fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(MAX_PRINTABLE));
    for c in s.chars() {
        if out.len() + c.len_utf8() > MAX_PRINTABLE {
            break;
        }
        out.push(
            if c == '\\' || c == '"' || fgpu_common::inert::is_unsafe(c) {
                '_'
            } else {
                c
            },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_names_cannot_break_the_exposition() {
        assert_eq!(printable("/a\"b\\c\nd}"), "/a_b_c_d}");
        assert_eq!(printable("/ok-é"), "/ok-é");
        assert_eq!(printable("/a\u{202e}b\u{2066}\u{9b}c"), "/a_b__c");
        let long = "é".repeat(1000);
        let v = printable(&long);
        assert!(v.len() <= MAX_PRINTABLE && v.chars().all(|c| c == 'é'));
    }
}
