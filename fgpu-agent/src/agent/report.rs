//! The status report, built from the agent's [`State`]: one row per cgroup that holds
//! memory or is gated for compute.
//!
//! A report is one pass over the state that takes each part it reads once, at its start,
//! and holds no lock while it builds the rows: the kernel's figures (placed on GPUs), the
//! cgroups' paths (one lock of the names, released once the rows are named), a copy of the
//! limits and the pods' names, the compute figures, the backstop's tallies, the ledgers.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::gpus::Gpus;
use super::kernel::Snapshot;
use super::ledgers::CgroupLedger;
use super::state::State;
use crate::api::PodName;
use crate::status::{CgroupStatus, DeviceUsage, StatusReport};

/// The status report: one row per cgroup that holds memory or is gated for compute.
pub fn of(state: &State) -> StatusReport {
    let snap = state.snapshot_by_gpu();
    let mut report = {
        let mut names = state.names();
        build(&snap, |id| names.path_of(id))
    };
    let limits = state.limits_view();
    // Cgroups the compute controller schedules get a row even without memory, and so do
    // limited cgroups whose subtree holds memory (a pod whose containers allocate).
    let compute = state.compute().all();
    for cgroup in compute.keys() {
        if !report.cgroups.iter().any(|r| &r.cgroup == cgroup) {
            report.cgroups.push(CgroupStatus::empty(cgroup.clone()));
        }
    }
    let mut subtree: HashMap<u64, u64> = HashMap::new();
    for (key, bytes) in &snap.tree {
        *subtree.entry(key.cgroup_id).or_default() += bytes;
    }
    for (path, limit) in limits.all() {
        if !limit.has_memory() || report.cgroups.iter().any(|r| &r.cgroup == path) {
            continue;
        }
        if let Some(id) = state.cgroup_id(path)
            && subtree.get(&id).is_some_and(|b| *b > 0)
        {
            report.cgroups.push(CgroupStatus {
                cgroup_id: id,
                ..CgroupStatus::empty(path.clone())
            });
        }
    }
    let ledgers: HashMap<String, Arc<CgroupLedger>> = state
        .ledgers()
        .all()
        .into_iter()
        .map(|l| (l.cgroup.clone(), l))
        .collect();
    // A parked container holds no GPU memory the kernel sees, but it still has a row: its
    // memory is in host memory (docs/parking.md).
    for (cgroup, l) in &ledgers {
        let parked = l.ledger().parked_total(|u| state.gpus().memory_of(u)) > 0;
        if parked && !report.cgroups.iter().any(|r| &r.cgroup == cgroup) {
            report.cgroups.push(CgroupStatus {
                cgroup_id: l.cgroup_id,
                ..CgroupStatus::empty(cgroup.clone())
            });
        }
    }
    report.cgroups.sort_by(|a, b| a.cgroup.cmp(&b.cgroup));
    let nvml = nvml_by_cgroup(state.gpus());
    let tallies = state.backstop().tallies();
    for row in &mut report.cgroups {
        identify(row, |pod_cgroup| limits.pod(pod_cgroup));
        row.compute_nvml_pct = nvml.get(&row.cgroup).map(|p| (p * 10.0).round() / 10.0);
        let (effective, from) = limits.effective(&row.cgroup);
        row.compute_share_pct = effective.compute_pct;
        row.compute_cap_pct = effective.compute_cap_pct;
        row.compute_share_gpus = effective.compute_gpus.clone();
        row.compute_cap_gpus = effective.compute_cap_gpus.clone();
        let figures = compute.get(&row.cgroup);
        row.compute_used_pct = figures.map(|f| (f.used_pct * 10.0).round() / 10.0);
        row.compute_turn_pct = figures.map(|f| (f.turn_pct * 10.0).round() / 10.0);
        row.compute_corun = figures.is_some_and(|f| f.corun);
        row.compute_queue_us = figures.map(|f| f.queue_us);
        row.memory_limit_bytes = effective.memory_bytes;
        per_gpu_limits(row, &effective, state.devices());
        row.memory_limit_gpus = effective.memory_gpus;
        row.memory_limit_from = from;
        row.memory_subtree_bytes = subtree.get(&row.cgroup_id).copied().unwrap_or(0);
        let tally = tallies.get(&row.cgroup_id).copied().unwrap_or_default();
        row.over_limit_actions = tally.actions();
        row.kernel_kills = tally.kills;
        row.over_bound = tally.over_bound;
        let ledger = super::budget::ledger_for(&limits, &row.cgroup);
        if let Some(l) = ledgers.get(&ledger) {
            row.alloc_denied = l.denied();
            parking(row, l.ledger(), state.gpus());
            row.ledger = Some(ledger);
        }
    }
    report.libraries = state.libraries();
    report
}

/// What `row`'s ledger says of parking: whether it is parkable, what its processes hold in
/// host memory, what pins them, how often they parked (docs/parking.md).
fn parking(row: &mut CgroupStatus, l: &fgpu_common::ledger::Ledger, gpus: &Gpus) {
    use std::sync::atomic::Ordering::SeqCst;
    row.park_after_ms = l.park_after_ms();
    let mut pins = 0u32;
    row.parked_bytes = l.parked_total(|u| gpus.memory_of(u));
    for s in (0..l.slots_in_range()).filter(|&s| l.slot_in_use(s)) {
        let sp = l.slot_park(s);
        pins |= sp.pinned.load(SeqCst);
        row.parks = row.parks.saturating_add(sp.parks.load(SeqCst));
        row.unparks = row.unparks.saturating_add(sp.unparks.load(SeqCst));
    }
    row.park_pinned = fgpu_common::ledger::park::pin::names(pins)
        .into_iter()
        .map(String::from)
        .collect();
}

/// Who `row`'s cgroup belongs to: its container and pod by the cgroup's name
/// ([`naming`](fgpu_common::cgroup::naming)), and the pod's namespace and name where the
/// kubelet plugin gave them with the pod's limit (`names`: by the pod's cgroup). `pod` shows
/// `namespace/name`, else `pod <uid>`.
fn identify<'a>(row: &mut CgroupStatus, names: impl Fn(&str) -> Option<&'a PodName>) {
    let who = fgpu_common::cgroup::naming::identity(&row.cgroup);
    row.container_id = who.container.map(|c| c.id);
    let Some(pod) = who.pod else {
        return;
    };
    let name = names(&pod.cgroup);
    row.pod = Some(match name {
        Some(n) => format!("{}/{}", n.namespace, n.name),
        None => format!("pod {}", pod.uid),
    });
    row.pod_namespace = name.map(|n| n.namespace.clone());
    row.pod_name = name.map(|n| n.name.clone());
    row.pod_uid = Some(pod.uid);
}

/// Each device entry's UUID and the limit on it; with per-GPU limits, every GPU of the node
/// gets an entry (its usage 0 if none), so that each GPU's limit shows.
fn per_gpu_limits(
    row: &mut CgroupStatus,
    effective: &crate::api::Limit,
    gpus: &[super::gpus::Gpu],
) {
    if !effective.memory_gpus.is_empty() {
        for g in gpus {
            if !row.devices.iter().any(|d| d.device == g.index) {
                row.devices.push(DeviceUsage {
                    device: g.index,
                    uuid: None,
                    memory_used_bytes: 0,
                    limit_bytes: None,
                    allocs: 0,
                    frees: 0,
                });
            }
        }
        row.devices.sort_by_key(|d| d.device);
    }
    for d in &mut row.devices {
        d.uuid = gpus
            .iter()
            .find(|g| g.index == d.device)
            .map(|g| g.uuid.clone());
        d.limit_bytes = match &d.uuid {
            Some(u) => effective.memory_on(u),
            None => effective.memory_bytes,
        };
    }
}

/// How far back NVML's per-process utilisation is read for `fgpu status`.
const NVML_OVER_US: u64 = 5_000_000;

/// NVML's per-process SM utilisation over the last few seconds, summed per cgroup (the
/// processes' cgroups from /proc: NVML reports host PIDs).
fn nvml_by_cgroup(gpus: &Gpus) -> std::collections::HashMap<String, f64> {
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let mut out = std::collections::HashMap::new();
    for (pid, pct) in gpus.process_sm_util(now_us.saturating_sub(NVML_OVER_US)) {
        if let Some(cg) = super::pidfd::cgroup_of_pid(pid) {
            *out.entry(cg).or_insert(0.0) += pct;
        }
    }
    out
}

/// Groups the kernel's per-(cgroup, device) totals into one row per cgroup that holds
/// memory or has a process holding memory. Rows are sorted by cgroup path.
pub fn build(snap: &Snapshot, mut path_of: impl FnMut(u64) -> Option<String>) -> StatusReport {
    let mut rows: BTreeMap<u64, CgroupStatus> = BTreeMap::new();
    fn row(rows: &mut BTreeMap<u64, CgroupStatus>, id: u64) -> &mut CgroupStatus {
        rows.entry(id).or_insert_with(|| CgroupStatus {
            cgroup_id: id,
            ..CgroupStatus::empty(String::new())
        })
    }
    for (key, usage) in &snap.usage {
        if usage.bytes == 0 {
            continue;
        }
        let r = row(&mut rows, key.cgroup_id);
        r.memory_used_bytes += usage.bytes;
        r.devices.push(DeviceUsage {
            device: key.device,
            uuid: None,
            memory_used_bytes: usage.bytes,
            limit_bytes: None,
            allocs: usage.allocs,
            frees: usage.frees,
        });
    }
    for (tgid, proc) in &snap.procs {
        if proc.bytes > 0 {
            row(&mut rows, proc.cgroup_id).pids.push(*tgid);
        }
    }
    let mut cgroups: Vec<CgroupStatus> = rows.into_values().collect();
    for c in &mut cgroups {
        c.cgroup =
            path_of(c.cgroup_id).unwrap_or_else(|| format!("(unknown cgroup {})", c.cgroup_id));
        c.pids.sort_unstable();
        c.devices.sort_by_key(|d| d.device);
    }
    cgroups.sort_by(|a, b| a.cgroup.cmp(&b.cgroup));
    StatusReport {
        cgroups,
        counters: snap.counters.clone(),
        libraries: Vec::new(),
        own_only: false,
    }
}

#[cfg(test)]
mod tests {
    use fgpu_common::event::{CgroupKey, CgroupUsage, ProcUsage};

    use super::*;

    fn key(cgroup_id: u64, device: u32) -> CgroupKey {
        CgroupKey {
            cgroup_id,
            device,
            pad: 0,
        }
    }

    #[test]
    fn rows_name_their_container_and_pod() {
        const UID: &str = "0c3d6f1e-2b4a-4c8e-9f00-00000000000a";
        let ctr = "a1".repeat(32);
        let pod_cg = format!("/kubepods/besteffort/pod{UID}");
        let named = PodName {
            namespace: "team-a".into(),
            name: format!("pod-{UID}"),
        };
        let names = |cg: &str| (cg == pod_cg).then_some(&named);
        let mut row = CgroupStatus::empty(format!("{pod_cg}/{ctr}"));
        identify(&mut row, names);
        let want = format!("team-a/pod-{UID}");
        assert_eq!(row.pod, Some(want));
        assert_eq!(row.container_id, Some(ctr.clone()));
        assert_eq!(row.pod_uid.as_deref(), Some(UID));
        assert_eq!(
            (row.pod_namespace.as_deref(), row.pod_name.as_deref()),
            (Some("team-a"), Some(named.name.as_str()))
        );
        let other = "/kubepods/besteffort/pod11111111-2222-3333-4444-555555555555";
        let mut row = CgroupStatus::empty(other.into());
        identify(&mut row, names);
        assert_eq!(
            row.pod.as_deref(),
            Some("pod 11111111-2222-3333-4444-555555555555")
        );
        assert_eq!((row.pod_namespace, row.container_id), (None, None));
        let mut row = CgroupStatus::empty("/system.slice/x".into());
        identify(&mut row, names);
        assert_eq!(row, CgroupStatus::empty("/system.slice/x".into()));
    }

    #[test]
    fn one_row_per_cgroup_summed_over_devices() {
        let snap = Snapshot {
            usage: vec![
                (
                    key(7, 0),
                    CgroupUsage {
                        bytes: 300,
                        allocs: 3,
                        frees: 0,
                    },
                ),
                (
                    key(7, 1),
                    CgroupUsage {
                        bytes: 200,
                        allocs: 1,
                        frees: 0,
                    },
                ),
                (
                    key(9, 0),
                    CgroupUsage {
                        bytes: 0,
                        allocs: 5,
                        frees: 5,
                    },
                ),
                (
                    key(8, 0),
                    CgroupUsage {
                        bytes: 50,
                        allocs: 1,
                        frees: 0,
                    },
                ),
            ],
            procs: vec![
                (
                    42,
                    ProcUsage {
                        cgroup_id: 7,
                        bytes: 500,
                        tenant: 7,
                    },
                ),
                (
                    41,
                    ProcUsage {
                        cgroup_id: 7,
                        bytes: 1,
                        tenant: 7,
                    },
                ),
                (
                    43,
                    ProcUsage {
                        cgroup_id: 9,
                        bytes: 0,
                        tenant: 9,
                    },
                ),
            ],
            tree: Vec::new(),
            counters: Default::default(),
        };
        let report = build(&snap, |id| (id != 8).then(|| format!("/job-{id}")));
        assert_eq!(report.cgroups.len(), 2, "cgroup 9 holds nothing: no row");
        let seven = report.cgroups.iter().find(|c| c.cgroup_id == 7).unwrap();
        assert_eq!(seven.cgroup, "/job-7");
        assert_eq!(seven.memory_used_bytes, 500);
        assert_eq!(seven.pids, vec![41, 42]);
        assert_eq!(seven.devices.len(), 2);
        assert_eq!(seven.memory_limit_bytes, None);
        let eight = report.cgroups.iter().find(|c| c.cgroup_id == 8).unwrap();
        assert_eq!(eight.cgroup, "(unknown cgroup 8)");
    }
}
