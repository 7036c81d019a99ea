//! The driver's own count of a limited cgroup's memory: the backstop for memory that no
//! allocation call shows.
//!
//! The probes charge what allocation calls hand out, and the kernel's limit holds those
//! exactly. A process also holds device memory that no probed call returns: its contexts and
//! loaded modules, the local memory the driver grows for a kernel that needs more per thread
//! (and never shrinks back), device heaps and printf FIFOs sized with `cuCtxSetLimit`, CUDA
//! arrays. The shim charges its own process's context overhead; a process without the shim,
//! or any process growing local memory inside a launch, goes past what either of them sees.
//! NVML's per-process figure (host PIDs; the driver's record, which a container cannot
//! write) counts all of it.
//!
//! Every reconcile pass ([`super::enforce::RECONCILE_EVERY`]), for each limited cgroup and
//! GPU: the sum of NVML's figures for the processes of its subtree (their cgroups read from
//! `/proc`) against its limit on that GPU plus the tolerance (`--unseen-tolerance`). Over at
//! one pass: reported (`event="unseen_over_limit"`, counted like a reconcile finding). Still
//! over at the next with `--on-exceed kill`: the process of the subtree holding the most
//! memory on that GPU that the probes did not see (NVML's figure minus the kernel's bytes for
//! it) is SIGKILLed (`event="unseen_kill"`), one a pass, until the subtree is back under.
//!
//! The tolerance is the room a limit leaves for what is slow to show or legitimately unseen:
//! a shim measures its context overhead when the context is made, modules loaded lazily
//! later add to the driver's figure, and a process without the shim may allocate up to the
//! limit with its contexts on top. So a cgroup holds at most its limit plus the tolerance
//! as the driver counts it.

use std::collections::HashMap;

use fgpu_common::event::ProcUsage;
use fgpu_common::quantity::Size;

use super::cgroups::is_under;
use super::enforcer::Passes;
use super::gpus::Gpu;
use super::state::State;
use crate::api::Limit;

/// Default `--unseen-tolerance`: above a PyTorch process's context and lazily loaded modules
/// on an H200 (about 0.6 GiB, docs/design.md section 2).
pub const DEFAULT_TOLERANCE: &str = "1GiB";

/// One process's memory on one GPU as the driver counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    /// The process's cgroup (v2 path).
    pub cgroup: String,
    /// NVML's figure on the GPU.
    pub driver_bytes: u64,
    /// What the probes charged the process (all GPUs: the kernel cannot tell them apart).
    pub kernel_bytes: u64,
}

impl Holder {
    /// What the probes did not see of it.
    pub fn unseen(&self) -> u64 {
        self.driver_bytes.saturating_sub(self.kernel_bytes)
    }
}

/// A limited cgroup over its limit on a GPU by more than the tolerance, as the driver counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Over {
    pub cgroup: String,
    pub gpu: u32,
    pub driver_bytes: u64,
    pub limit: u64,
    /// The holder to kill: the most unseen memory on that GPU (then the most memory).
    pub victim: Option<Holder>,
}

/// The limited cgroups over (pure: the checks' inputs are given).
/// `limits`: (cgroup path, NVML index, bytes); `holders`: by NVML index.
pub fn over(
    limits: &[(String, u32, u64)],
    holders: &HashMap<u32, Vec<Holder>>,
    tolerance: u64,
) -> Vec<Over> {
    let mut out = Vec::new();
    for (cgroup, gpu, limit) in limits {
        let Some(on_gpu) = holders.get(gpu) else {
            continue;
        };
        let inside: Vec<&Holder> = on_gpu
            .iter()
            .filter(|h| is_under(&h.cgroup, cgroup))
            .collect();
        let driver_bytes: u64 = inside.iter().map(|h| h.driver_bytes).sum();
        if driver_bytes <= limit.saturating_add(tolerance) {
            continue;
        }
        let victim = inside
            .iter()
            .max_by_key(|h| (h.unseen(), h.driver_bytes))
            .map(|h| (*h).clone());
        out.push(Over {
            cgroup: cgroup.clone(),
            gpu: *gpu,
            driver_bytes,
            limit: *limit,
            victim,
        });
    }
    out
}

/// Each limited cgroup's memory limit on each GPU: (path, NVML index, bytes), from `limits`
/// (the pass's copy of the memory limits, by cgroup path).
fn per_gpu(limits: &[(String, Limit)], gpus: &[Gpu]) -> Vec<(String, u32, u64)> {
    let mut out = Vec::new();
    for (path, l) in limits.iter().filter(|(_, l)| l.has_memory()) {
        for g in gpus {
            if let Some(bytes) = l.memory_on(&g.uuid) {
                out.push((path.clone(), g.index, bytes));
            }
        }
    }
    out
}

/// NVML's per-process figures with each process's cgroup and kernel bytes, by NVML index.
fn holders(state: &State, procs: &[(u32, ProcUsage)]) -> HashMap<u32, Vec<Holder>> {
    let kernel: HashMap<u32, u64> = procs.iter().map(|(pid, p)| (*pid, p.bytes)).collect();
    let mut cgroups: HashMap<u32, Option<String>> = HashMap::new();
    let mut out: HashMap<u32, Vec<Holder>> = HashMap::new();
    for (gpu, pid, driver_bytes) in super::devmap::nvml_process_memory(state.gpus()) {
        let cgroup = cgroups
            .entry(pid)
            .or_insert_with(|| super::pidfd::cgroup_of_pid(pid))
            .clone();
        // A process gone since NVML listed it, or not in the v2 hierarchy.
        let Some(cgroup) = cgroup else { continue };
        out.entry(gpu).or_default().push(Holder {
            pid,
            cgroup,
            driver_bytes,
            kernel_bytes: kernel.get(&pid).copied().unwrap_or(0),
        });
    }
    out
}

/// One pass (from [`super::enforce::reconcile`]): reports and, by policy, kills. `limits`:
/// the pass's copy of the memory limits, by cgroup path; `passes`: the enforce loop's count
/// of consecutive passes over, by (cgroup, GPU).
pub fn reconcile(
    state: &State,
    limits: &[(String, Limit)],
    procs: &[(u32, ProcUsage)],
    passes: &mut Passes<(String, u32)>,
) {
    let limits = per_gpu(limits, state.devices());
    if limits.is_empty() {
        return;
    }
    let holders = holders(state, procs);
    tracing::trace!(?holders, "the driver's per-process figures");
    let found = over(&limits, &holders, state.unseen_tolerance());
    passes.retain(|key| found.iter().any(|o| (&o.cgroup, o.gpu) == (&key.0, key.1)));
    for o in found {
        let n = passes.count((o.cgroup.clone(), o.gpu));
        let unseen = o.victim.as_ref().map_or(0, Holder::unseen);
        if n == 1 {
            if let Some(id) = state.cgroup_id(&o.cgroup) {
                state.backstop().reconciled(id);
            }
            tracing::warn!(
                event = "unseen_over_limit",
                cgroup = o.cgroup,
                gpu = o.gpu,
                "the driver counts {} for the cgroup on GPU {}, over its {} limit by more than \
                 the {} tolerance: memory no allocation call showed (contexts, modules, local \
                 memory, device heaps, arrays)",
                Size(o.driver_bytes),
                o.gpu,
                Size(o.limit),
                Size(state.unseen_tolerance())
            );
        } else if state.on_exceed() == super::limits::OnExceed::Kill
            && let Some(v) = &o.victim
        {
            // Through a pidfd, and only if the PID still names a process of the subtree (a
            // tenant can churn PIDs until one NVML listed is reused elsewhere).
            let outcome = super::pidfd::kill_in_said(v.pid, &o.cgroup);
            tracing::warn!(
                event = "unseen_kill",
                pid = v.pid,
                cgroup = o.cgroup,
                gpu = o.gpu,
                "killed the process holding the most memory the probes did not see on GPU {} \
                 ({} of its {}) in a cgroup still over its limit there{}",
                o.gpu,
                Size(unseen),
                Size(v.driver_bytes),
                outcome
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn h(pid: u32, cgroup: &str, driver: u64, kernel: u64) -> Holder {
        Holder {
            pid,
            cgroup: cgroup.into(),
            driver_bytes: driver,
            kernel_bytes: kernel,
        }
    }

    #[test]
    fn a_subtree_over_its_limit_plus_the_tolerance_names_its_largest_unseen_holder() {
        let holders = HashMap::from([(
            0,
            vec![
                // Allocations the probes saw, up to the limit, with a context on top.
                h(10, "/pod/a", 2 * GIB + 300 * MIB, 2 * GIB),
                // Arrays or local memory: nothing the probes saw.
                h(11, "/pod/b", 3 * GIB, 0),
                // Outside the subtree: never counted, never chosen.
                h(12, "/other", 40 * GIB, 0),
            ],
        )]);
        let limits = [("/pod".to_string(), 0, 4 * GIB)];
        let found = over(&limits, &holders, GIB);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].driver_bytes, 5 * GIB + 300 * MIB);
        assert_eq!(found[0].victim.as_ref().unwrap().pid, 11);
        // Within the tolerance: nothing.
        assert!(over(&limits, &holders, 2 * GIB).is_empty());
    }

    #[test]
    fn each_gpu_is_held_to_its_own_limit() {
        let holders = HashMap::from([
            (0, vec![h(10, "/c", 3 * GIB, 0)]),
            (1, vec![h(10, "/c", GIB, 0)]),
        ]);
        let limits = [
            ("/c".to_string(), 0, 2 * GIB),
            ("/c".to_string(), 1, 2 * GIB),
        ];
        let found = over(&limits, &holders, 512 * MIB);
        assert_eq!(found.iter().map(|o| o.gpu).collect::<Vec<_>>(), [0]);
        // A GPU NVML lists nothing on, or one the cgroup has no limit on: nothing.
        assert!(over(&[("/c".to_string(), 2, 0)], &holders, 0).is_empty());
    }

    #[test]
    fn a_holder_whose_memory_the_probes_saw_is_chosen_only_when_nothing_is_unseen() {
        let holders =
            HashMap::from([(0, vec![h(10, "/c", 3 * GIB, 3 * GIB), h(11, "/c", GIB, 0)])]);
        let found = over(&[("/c".to_string(), 0, GIB)], &holders, 0);
        assert_eq!(found[0].victim.as_ref().unwrap().pid, 11);
        let seen = HashMap::from([(
            0,
            vec![h(10, "/c", 3 * GIB, 3 * GIB), h(11, "/c", GIB, GIB)],
        )]);
        let found = over(&[("/c".to_string(), 0, GIB)], &seen, 0);
        assert_eq!(found[0].victim.as_ref().unwrap().pid, 10);
    }
}
