//! Which physical GPU the kernel's figures belong to.
//!
//! The probes see every allocation, but not always its device: `cuMemAlloc` and its family
//! allocate on the calling thread's current context, which lives inside the driver, so the
//! kernel keys them device 0 (`FGPU_DEVICE_CURRENT`); `cuMemCreate` carries a CUDA ordinal,
//! which names a different physical GPU in every process whose `CUDA_VISIBLE_DEVICES` (or
//! container device list) differs. The kernel's *totals* per cgroup are exact; its device
//! keys are not physical identities on a node of several GPUs.
//!
//! So the agent places them: NVML's per-process, per-GPU memory (host PIDs, the driver's own
//! record, which a container cannot write) says on which physical GPUs each process holds
//! memory. Each process's kernel bytes (`procs`) are split over its GPUs in proportion to
//! NVML's figures; a cgroup's (own or subtree) kernel total is then split over physical GPUs
//! in proportion to what its processes were placed on. What cannot be placed (no NVML, a
//! process NVML does not list) stays where the kernel keyed it. The sum per cgroup is always
//! the kernel's. On a node of one GPU nothing moves.
//!
//! Which source decides what: the kernel decides *how much* (exact totals), NVML decides
//! *where* (the GPU), the shims' ledgers decide their own per-device figures (they key by
//! the UUID of their CUDA ordinal, so they are physical already). `/proc/PID/environ`
//! (`CUDA_VISIBLE_DEVICES`) is never trusted for this: a container writes it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fgpu_common::event::{CgroupKey, CgroupTree, ProcUsage};

use super::gpus::Gpus;
use super::kernel::{KernelMaps, Snapshot};

/// How long one NVML per-process reading is reused (the publisher asks every 50 ms).
const NVML_EVERY: Duration = Duration::from_millis(200);

/// (NVML index, host PID, bytes) of every process NVML lists.
pub type NvmlProcs = Vec<(u32, u32, u64)>;

/// NVML's per-process memory for placing figures: none on a node of one GPU (nothing to
/// place), else [`nvml_process_memory`].
pub fn nvml_procs(gpus: &Gpus) -> NvmlProcs {
    if gpus.devices.len() < 2 {
        return Vec::new();
    }
    nvml_process_memory(gpus)
}

/// NVML's per-process memory on every GPU, read at most every [`NVML_EVERY`].
pub fn nvml_process_memory(gpus: &Gpus) -> NvmlProcs {
    static CACHE: Mutex<Option<(Instant, NvmlProcs)>> = Mutex::new(None);
    let mut c = CACHE.lock().expect("nvml cache lock");
    if let Some((at, v)) = c.as_ref()
        && at.elapsed() < NVML_EVERY
    {
        return v.clone();
    }
    let v = gpus.process_memory();
    *c = Some((Instant::now(), v.clone()));
    v
}

/// The kernel's subtree totals, keyed by physical GPU (NVML index) where NVML can tell.
pub fn tree(kernel: &Mutex<KernelMaps>, gpus: &Gpus) -> Vec<(CgroupKey, u64)> {
    let (tree, procs, ancestry) = {
        let k = kernel.lock().expect("kernel maps lock");
        let tree = k.tree();
        if gpus.devices.len() < 2 {
            return tree;
        }
        (tree, k.procs(), k.ancestry())
    };
    let placed = place(&procs, &nvml_procs(gpus), &ancestry);
    rekey(&tree, &placed.subtree)
}

/// The kernel's snapshot with its per-cgroup and subtree figures keyed by physical GPU.
pub fn snapshot(kernel: &Mutex<KernelMaps>, gpus: &Gpus) -> Snapshot {
    let (mut snap, ancestry) = {
        let k = kernel.lock().expect("kernel maps lock");
        let snap = k.snapshot();
        if gpus.devices.len() < 2 {
            return snap;
        }
        (snap, k.ancestry())
    };
    let placed = place(&snap.procs, &nvml_procs(gpus), &ancestry);
    snap.tree = rekey(&snap.tree, &placed.subtree);
    // Own figures: bytes by GPU; allocation and free counts stay on the kernel's keys.
    let bytes: Vec<(CgroupKey, u64)> = snap.usage.iter().map(|(k, u)| (*k, u.bytes)).collect();
    let mut usage: HashMap<(u64, u32), fgpu_common::event::CgroupUsage> = snap
        .usage
        .iter()
        .map(|(k, u)| {
            let mut u = *u;
            u.bytes = 0;
            ((k.cgroup_id, k.device), u)
        })
        .collect();
    for (k, b) in rekey(&bytes, &placed.own) {
        usage.entry((k.cgroup_id, k.device)).or_default().bytes = b;
    }
    snap.usage = usage
        .into_iter()
        .map(|((cgroup_id, device), u)| {
            (
                CgroupKey {
                    cgroup_id,
                    device,
                    pad: 0,
                },
                u,
            )
        })
        .collect();
    snap
}

/// The GPUs each process's kernel bytes are on, by tgid: only processes NVML places (none on
/// a node of one GPU).
pub fn process_gpus(kernel: &Mutex<KernelMaps>, gpus: &Gpus) -> HashMap<u32, Vec<(u32, u64)>> {
    if gpus.devices.len() < 2 {
        return HashMap::new();
    }
    let (procs, ancestry) = {
        let k = kernel.lock().expect("kernel maps lock");
        (k.procs(), k.ancestry())
    };
    let mut out: HashMap<u32, Vec<(u32, u64)>> = HashMap::new();
    for (tgid, gpu, bytes) in place(&procs, &nvml_procs(gpus), &ancestry).procs {
        out.entry(tgid).or_default().push((gpu, bytes));
    }
    out
}

/// A limited subtree over its per-GPU memory limit on one physical GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverOnGpu {
    pub cgroup_id: u64,
    pub gpu: u32,
    pub bytes: u64,
    pub limit: u64,
    /// The process of the subtree holding the most on that GPU.
    pub holder: Option<u32>,
}

/// The kernel's per-GPU backstop check, done here because only here is the GPU known (see
/// the module documentation): `limits` are each limited cgroup's own limits by GPU (NVML
/// index), by cgroup id. The in-kernel check stays at the sum over GPUs (sure to be an
/// overrun whatever the devices).
pub fn over_on_one_gpu(
    kernel: &Mutex<KernelMaps>,
    gpus: &Gpus,
    limits: &HashMap<u64, HashMap<u32, u64>>,
) -> Vec<OverOnGpu> {
    if gpus.devices.len() < 2 || limits.is_empty() {
        return Vec::new();
    }
    let (procs, ancestry) = {
        let k = kernel.lock().expect("kernel maps lock");
        (k.procs(), k.ancestry())
    };
    over(
        &place(&procs, &nvml_procs(gpus), &ancestry),
        &procs,
        &ancestry,
        limits,
    )
}

/// SIGKILLs `pid`, the largest holder on `gpu` of subtree `path` still over its limit there.
pub fn kill_holder(pid: u32, gpu: u32, path: &str) {
    let outcome = super::pidfd::kill_in_said(pid, path);
    tracing::warn!(
        event = "reconcile_kill",
        pid,
        gpu,
        cgroup = path,
        "reconcile: killed the largest holder on GPU {gpu} of a subtree still over its per-GPU limit there{outcome}"
    );
}

fn over(
    placed: &Placement,
    procs: &[(u32, ProcUsage)],
    ancestry: &HashMap<u64, CgroupTree>,
    limits: &HashMap<u64, HashMap<u32, u64>>,
) -> Vec<OverOnGpu> {
    let cgroup_of: HashMap<u32, u64> = procs.iter().map(|(t, p)| (*t, p.cgroup_id)).collect();
    let under = |tgid: u32, top: u64| {
        cgroup_of
            .get(&tgid)
            .is_some_and(|cg| *cg == top || ancestry.get(cg).is_some_and(|t| t.anc.contains(&top)))
    };
    let mut out = Vec::new();
    for (&cg, on) in limits {
        let Some(per) = placed.subtree.get(&cg) else {
            continue;
        };
        let over_there = |(g, b): &(&u32, &u64)| on.get(g).is_some_and(|l| **b > *l);
        for (&gpu, &bytes) in per.iter().filter(over_there) {
            let limit = on[&gpu];
            let holder = placed
                .procs
                .iter()
                .filter(|(t, g, _)| *g == gpu && under(*t, cg))
                .max_by_key(|(_, _, b)| *b)
                .map(|(t, _, _)| *t);
            out.push(OverOnGpu {
                cgroup_id: cg,
                gpu,
                bytes,
                limit,
                holder,
            });
        }
    }
    out.sort_unstable_by_key(|o| (o.cgroup_id, o.gpu));
    out
}

/// Per cgroup: the bytes its processes were placed on, by physical GPU (NVML index).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Processes whose cgroup is the key.
    pub own: HashMap<u64, HashMap<u32, u64>>,
    /// Processes whose cgroup is the key or lies below it.
    pub subtree: HashMap<u64, HashMap<u32, u64>>,
    /// Each placed process's bytes, by GPU: (tgid, GPU, bytes).
    pub procs: Vec<(u32, u32, u64)>,
}

/// Splits `bytes` over `weights` in proportion (the last share takes the rounding).
fn split(bytes: u64, weights: &[(u32, u64)]) -> Vec<(u32, u64)> {
    let total: u128 = weights.iter().map(|(_, w)| u128::from(*w)).sum();
    if total == 0 {
        return Vec::new();
    }
    let mut left = bytes;
    let mut out = Vec::with_capacity(weights.len());
    for (i, (g, w)) in weights.iter().enumerate() {
        let share = if i + 1 == weights.len() {
            left
        } else {
            (u128::from(bytes) * u128::from(*w) / total) as u64
        };
        left -= share.min(left);
        out.push((*g, share));
    }
    out
}

/// What NVML's per-GPU figures of one process say it *allocated* on each GPU: NVML counts
/// each context's own overhead (hundreds of MiB per GPU, the same on like GPUs) which the
/// kernel does not, so the excess of NVML's sum over the kernel's `bytes` is taken off
/// evenly. Without an excess the figures are used as they are; if nothing is left, too.
fn allocated(bytes: u64, nvml: &[(u32, u64)]) -> Vec<(u32, u64)> {
    let sum: u64 = nvml.iter().map(|(_, b)| b).sum();
    let per_context = sum.saturating_sub(bytes) / nvml.len().max(1) as u64;
    let net: Vec<(u32, u64)> = nvml
        .iter()
        .map(|&(g, b)| (g, b.saturating_sub(per_context)))
        .collect();
    if net.iter().all(|(_, b)| *b == 0) {
        nvml.to_vec()
    } else {
        net
    }
}

/// Places each kernel process (`procs`: tgid → cgroup, bytes) on the GPUs NVML lists it on.
/// `ancestry`: the kernel's recorded ancestors per cgroup (anc[0] is the cgroup itself).
pub fn place(
    procs: &[(u32, ProcUsage)],
    nvml: &[(u32, u32, u64)],
    ancestry: &HashMap<u64, CgroupTree>,
) -> Placement {
    let mut by_pid: HashMap<u32, Vec<(u32, u64)>> = HashMap::new();
    for &(gpu, pid, bytes) in nvml {
        if bytes > 0 {
            by_pid.entry(pid).or_default().push((gpu, bytes));
        }
    }
    let mut out = Placement::default();
    for (pid, p) in procs.iter().filter(|(_, p)| p.bytes > 0) {
        let Some(weights) = by_pid.get_mut(pid) else {
            continue;
        };
        weights.sort_unstable();
        let shares = split(p.bytes, &allocated(p.bytes, weights));
        out.procs.extend(shares.iter().map(|&(g, b)| (*pid, g, b)));
        let own = out.own.entry(p.cgroup_id).or_default();
        for &(g, b) in &shares {
            *own.entry(g).or_default() += b;
        }
        let anc = ancestry.get(&p.cgroup_id).map_or_else(
            || vec![p.cgroup_id],
            |t| t.anc.iter().copied().take_while(|&a| a != 0).collect(),
        );
        for a in anc {
            let sub = out.subtree.entry(a).or_default();
            for &(g, b) in &shares {
                *sub.entry(g).or_default() += b;
            }
        }
    }
    out
}

/// Re-keys per-(cgroup, kernel device) figures by physical GPU: each cgroup's total is
/// split over GPUs as `placed` says; what exceeds the placed bytes stays on the kernel's
/// keys, in their proportions. Cgroups nothing was placed for are returned unchanged.
pub fn rekey(
    entries: &[(CgroupKey, u64)],
    placed: &HashMap<u64, HashMap<u32, u64>>,
) -> Vec<(CgroupKey, u64)> {
    let mut per: HashMap<u64, Vec<(u32, u64)>> = HashMap::new();
    for (k, b) in entries {
        per.entry(k.cgroup_id).or_default().push((k.device, *b));
    }
    let mut out: Vec<(CgroupKey, u64)> = Vec::new();
    for (cg, mut kernel) in per {
        kernel.sort_unstable();
        let total: u64 = kernel.iter().map(|(_, b)| b).sum();
        let mut gpus: Vec<(u32, u64)> = placed
            .get(&cg)
            .map(|m| m.iter().map(|(g, b)| (*g, *b)).collect())
            .unwrap_or_default();
        gpus.sort_unstable();
        let placed_total: u64 = gpus.iter().map(|(_, b)| b).sum();
        let mut figures: HashMap<u32, u64> = HashMap::new();
        if placed_total >= total {
            // Everything is placed (NVML may count a little more, e.g. context overhead).
            for (g, b) in split(total, &gpus) {
                *figures.entry(g).or_default() += b;
            }
        } else {
            for &(g, b) in &gpus {
                *figures.entry(g).or_default() += b;
            }
            for (d, b) in split(total - placed_total, &kernel) {
                *figures.entry(d).or_default() += b;
            }
        }
        // Every key the kernel had stays present (0 if all moved), so a stale figure is
        // overwritten rather than left behind.
        for (d, _) in &kernel {
            figures.entry(*d).or_default();
        }
        out.extend(figures.into_iter().map(|(device, b)| {
            (
                CgroupKey {
                    cgroup_id: cg,
                    device,
                    pad: 0,
                },
                b,
            )
        }));
    }
    out.sort_unstable_by_key(|(k, _)| (k.cgroup_id, k.device));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn key(cgroup_id: u64, device: u32) -> CgroupKey {
        CgroupKey {
            cgroup_id,
            device,
            pad: 0,
        }
    }

    fn proc(cgroup_id: u64, bytes: u64) -> ProcUsage {
        ProcUsage {
            cgroup_id,
            bytes,
            tenant: cgroup_id,
        }
    }

    fn tree(anc: &[u64]) -> CgroupTree {
        let mut t = CgroupTree::default();
        t.anc[..anc.len()].copy_from_slice(anc);
        t
    }

    #[test]
    fn a_process_on_gpu_1_moves_its_cgroups_figure_to_gpu_1() {
        // The kernel keyed 7 + 2 GiB as device 0; NVML shows process 10 on GPU 0 and 11 on 1.
        let procs = [(10, proc(5, 7 * GIB)), (11, proc(5, 2 * GIB))];
        let nvml = [(0, 10, 7 * GIB + 300), (1, 11, 2 * GIB + 300), (0, 99, GIB)];
        let anc = HashMap::from([(5, tree(&[5, 2, 1]))]);
        let p = place(&procs, &nvml, &anc);
        assert_eq!(p.own[&5], HashMap::from([(0, 7 * GIB), (1, 2 * GIB)]));
        assert_eq!(p.subtree[&1], HashMap::from([(0, 7 * GIB), (1, 2 * GIB)]));
        let kernel = [(key(5, 0), 9 * GIB), (key(2, 0), 9 * GIB)];
        assert_eq!(
            rekey(&kernel, &p.subtree),
            vec![
                (key(2, 0), 7 * GIB),
                (key(2, 1), 2 * GIB),
                (key(5, 0), 7 * GIB),
                (key(5, 1), 2 * GIB)
            ]
        );
    }

    #[test]
    fn a_process_on_two_gpus_is_split_by_nvmls_proportions_and_totals_stay_exact() {
        let procs = [(10, proc(5, 3 * GIB))];
        let nvml = [(0, 10, GIB), (1, 10, 2 * GIB)];
        let p = place(&procs, &nvml, &HashMap::new());
        assert_eq!(p.own[&5], HashMap::from([(0, GIB), (1, 2 * GIB)]));
        let out = rekey(&[(key(5, 0), 3 * GIB)], &p.own);
        assert_eq!(out, vec![(key(5, 0), GIB), (key(5, 1), 2 * GIB)]);
    }

    #[test]
    fn what_nvml_does_not_list_stays_on_the_kernels_keys() {
        // Process 12 (1 GiB, no NVML record) keeps its kernel key; 11 moves to GPU 1.
        let procs = [(11, proc(5, 2 * GIB)), (12, proc(5, GIB))];
        let nvml = [(1, 11, 2 * GIB)];
        let p = place(&procs, &nvml, &HashMap::new());
        let out = rekey(&[(key(5, 0), 3 * GIB)], &p.own);
        assert_eq!(out, vec![(key(5, 0), GIB), (key(5, 1), 2 * GIB)]);
        // A cgroup nothing was placed for is unchanged.
        let other = [(key(6, 0), GIB), (key(6, 2), GIB)];
        assert_eq!(rekey(&other, &p.own), other.to_vec());
    }

    #[test]
    fn a_figure_that_moved_away_leaves_a_zero_behind() {
        let procs = [(11, proc(5, GIB))];
        let p = place(&procs, &[(1, 11, GIB)], &HashMap::new());
        let out = rekey(&[(key(5, 0), GIB)], &p.own);
        assert_eq!(out, vec![(key(5, 0), 0), (key(5, 1), GIB)]);
    }

    #[test]
    fn over_on_one_gpu_names_the_gpu_and_its_largest_holder() {
        // Limit 2 GiB per GPU on cgroup 2; its child 5 holds 1 GiB on GPU 0 and 3 GiB on GPU 1
        // (4 GiB in all: not over 2 × 2 GiB), the largest on GPU 1 being process 11.
        let procs = [
            (10, proc(5, GIB)),
            (11, proc(5, 2 * GIB)),
            (12, proc(5, GIB)),
        ];
        let nvml = [(0, 10, GIB), (1, 11, 2 * GIB), (1, 12, GIB)];
        let anc = HashMap::from([(5, tree(&[5, 2, 1]))]);
        let p = place(&procs, &nvml, &anc);
        let every = |b: u64| HashMap::from([(0, b), (1, b)]);
        let limits = HashMap::from([(2, every(2 * GIB)), (1, every(8 * GIB))]);
        assert_eq!(
            over(&p, &procs, &anc, &limits),
            vec![OverOnGpu {
                cgroup_id: 2,
                gpu: 1,
                bytes: 3 * GIB,
                limit: 2 * GIB,
                holder: Some(11)
            }]
        );
        assert!(over(&p, &procs, &anc, &HashMap::from([(2, every(3 * GIB))])).is_empty());
        // Per-GPU values: 4 GiB on GPU 1 is not over, 512 MiB on GPU 0 is; a GPU without a
        // limit of the cgroup is never over.
        let per = HashMap::from([(2, HashMap::from([(0, GIB / 2), (1, 4 * GIB)]))]);
        let found = over(&p, &procs, &anc, &per);
        assert_eq!(
            found
                .iter()
                .map(|o| (o.gpu, o.limit, o.holder))
                .collect::<Vec<_>>(),
            [(0, GIB / 2, Some(10))]
        );
        let only1 = HashMap::from([(2, HashMap::from([(1, GIB)]))]);
        assert_eq!(
            over(&p, &procs, &anc, &only1)
                .iter()
                .map(|o| o.gpu)
                .collect::<Vec<_>>(),
            [1]
        );
    }

    #[test]
    fn context_overhead_on_a_gpu_holding_nothing_does_not_draw_bytes_there() {
        // 1 GiB allocated on GPU 1; a 300 MiB context on each GPU.
        let ctx = 300 << 20;
        assert_eq!(
            allocated(GIB, &[(0, ctx), (1, GIB + ctx)]),
            vec![(0, 0), (1, GIB)]
        );
        let procs = [(10, proc(5, GIB))];
        let p = place(&procs, &[(0, 10, ctx), (1, 10, GIB + ctx)], &HashMap::new());
        assert_eq!(p.own[&5], HashMap::from([(0, 0), (1, GIB)]));
        // NVML below the kernel's figure: its proportions as they are.
        assert_eq!(
            allocated(4 * GIB, &[(0, GIB), (1, GIB)]),
            vec![(0, GIB), (1, GIB)]
        );
    }

    #[test]
    fn split_is_exact() {
        assert_eq!(
            split(10, &[(0, 1), (1, 1), (2, 1)]),
            vec![(0, 3), (1, 3), (2, 4)]
        );
        assert!(split(10, &[(0, 0)]).is_empty());
    }
}
