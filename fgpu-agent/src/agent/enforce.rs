//! Keeping the kernel's `limits` map in step with the limit store, and checking the kernel's
//! totals against the limits.
//!
//! The map is keyed by cgroup id (the inode of the cgroup's directory) while limits are kept
//! by path, so it is written again ([`sync`]) on every limit change, at start (also over
//! pinned maps a previous agent left), every [`SYNC_EVERY`], and as soon as a process execs
//! in a cgroup the agent has not seen (a cgroup created or re-created since). Each limited
//! cgroup gets the sum of its limits over the node's GPUs as its threshold (`limit × number
//! of GPUs` for a plain limit; with per-GPU limits each GPU's own value): the kernel cannot
//! see the device of cuMemAlloc-family calls (the calling thread's current context) and
//! charges them to one key, so on an N-GPU node only that sum is sure to be an overrun
//! (commit 24f9790's rule; the shim enforces each device exactly, and [`reconcile`] checks
//! each GPU through [`super::devmap`]). A cgroup limited on some GPUs only has no bound in
//! the kernel (it stays a tenant). Key 0 carries the node's policy for tenants without a
//! limit.
//!
//! [`reconcile`] runs every [`RECONCILE_EVERY`]: a limited subtree the kernel sees over its
//! threshold is reported even if the kernel's record of it was lost (ring buffer full), and
//! with `--on-exceed kill` its largest holder is killed if it is still over at the next
//! pass (a limit lowered below what is in use, a kill the kernel could not send). The kernel
//! prunes the records of removed cgroups itself; nothing here walks the cgroup hierarchy.
//!
//! Each tick of the loop ([`run`]) reads the limit store once ([`Pass`]: the memory limits
//! and the map they make), for its sync and its reconcile pass; the loop owns what it
//! remembers between passes ([`super::enforcer`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fgpu_common::event::KernelLimit;
use fgpu_common::quantity::Size;

use super::cgroups::is_under;
use super::enforcer::Enforcer;
use super::limits::{OnExceed, threshold};
use super::state::State;
use crate::api::Limit;

pub const SYNC_EVERY: Duration = Duration::from_millis(250);
pub const RECONCILE_EVERY: Duration = Duration::from_secs(1);
const _: () =
    assert!(super::backstop::RECONCILED_RECENTLY.as_nanos() == 3 * RECONCILE_EVERY.as_nanos());

/// What one tick of the enforce loop reads of the limit store, taken at its start under one
/// lock and used by its sync and its reconcile pass: every limit that sets memory, and the
/// `limits` map they make.
pub struct Pass {
    limits: Vec<(String, Limit)>,
    want: HashMap<u64, KernelLimit>,
}

impl Pass {
    pub fn take(state: &State) -> Pass {
        let limits = state.memory_limits();
        let want = desired(state, &limits);
        Pass { limits, want }
    }
}

/// The `limits` map as it should be, from `limits` (the memory limits, by cgroup path).
fn desired(state: &State, limits: &[(String, Limit)]) -> HashMap<u64, KernelLimit> {
    let flags = match state.on_exceed() {
        OnExceed::Kill => KernelLimit::KILL,
        OnExceed::Deny => 0,
    };
    let mut out = HashMap::from([(
        0,
        KernelLimit {
            bytes: u64::MAX,
            flags,
            pad: 0,
        },
    )]);
    for (path, limit) in limits {
        let Some(bytes) = threshold(state.devices(), limit) else {
            continue;
        };
        if let Some(id) = state.cgroup_id(path) {
            out.insert(
                id,
                KernelLimit {
                    bytes,
                    flags,
                    pad: 0,
                },
            );
        }
    }
    out
}

/// Each limited cgroup's own memory limit per GPU (NVML index), by cgroup id: only GPUs it
/// has a limit on.
fn per_gpu_limits(state: &State, limits: &[(String, Limit)]) -> HashMap<u64, HashMap<u32, u64>> {
    limits
        .iter()
        .filter(|(_, l)| l.has_memory())
        .filter_map(|(path, l)| {
            let per: HashMap<u32, u64> = state
                .devices()
                .iter()
                .filter_map(|g| Some((g.index, l.memory_on(&g.uuid)?)))
                .collect();
            Some((state.cgroup_id(path)?, per))
        })
        .collect()
}

/// Writes the `limits` map from the limit store; returns how many entries changed.
pub fn sync(state: &State) -> usize {
    write(state, &Pass::take(state).want)
}

/// Writes the `limits` map as `want` has it; returns how many entries changed.
fn write(state: &State, want: &HashMap<u64, KernelLimit>) -> usize {
    let mut kernel = state.kernel();
    let have: HashMap<u64, KernelLimit> = kernel.limits().into_iter().collect();
    let mut changed = 0;
    for (id, limit) in want {
        if have.get(id) != Some(limit) {
            match kernel.set_limit(*id, *limit) {
                Ok(()) => changed += 1,
                Err(err) => tracing::error!("{err:#}: the kernel does not enforce this limit"),
            }
        }
    }
    for id in have.keys().filter(|id| !want.contains_key(id)) {
        match kernel.remove_limit(*id) {
            Ok(()) => changed += 1,
            Err(err) => tracing::warn!("{err:#}"),
        }
    }
    if changed > 0 {
        tracing::debug!(changed, limits = want.len() - 1, "kernel limits written");
    }
    changed
}

/// Checks the kernel's subtree totals against the limits of `pass` (see the module
/// documentation). The cgroups' paths the pass needs are looked up under one lock of the
/// names, once it knows which.
pub fn reconcile(state: &State, enforcer: &mut Enforcer, pass: &Pass) {
    let want = &pass.want;
    let snap = state.kernel().snapshot();
    let mut over_now = HashMap::new();
    for (key, bytes) in &snap.tree {
        let Some(limit) = want.get(&key.cgroup_id).filter(|_| key.cgroup_id != 0) else {
            continue;
        };
        if *bytes > limit.bytes {
            over_now.insert(key.cgroup_id, (*bytes, limit.bytes));
        }
    }
    // Per GPU, where the agent can place the kernel's bytes (super::devmap).
    let mut holders = HashMap::new();
    for o in state.over_on_one_gpu(&per_gpu_limits(state, &pass.limits)) {
        over_now.entry(o.cgroup_id).or_insert((o.bytes, o.limit));
        if let Some(pid) = o.holder {
            holders.entry(o.cgroup_id).or_insert((pid, o.gpu));
        }
    }
    let over = enforcer.over();
    over.retain(|id| over_now.contains_key(id));
    let counted: Vec<(u64, (u64, u64), u32)> = over_now
        .into_iter()
        .map(|(id, figures)| (id, figures, over.count(id)))
        .collect();
    let kill = state.on_exceed() == OnExceed::Kill;
    // The names: the cgroups over and, where the largest holder of one is to be killed,
    // those of the processes that hold memory.
    let kill_largest_of = |id: &u64, passes: u32| kill && passes == 2 && !holders.contains_key(id);
    let procs_too = counted.iter().any(|(id, _, n)| kill_largest_of(id, *n));
    let holding = snap
        .procs
        .iter()
        .filter(|_| procs_too)
        .filter(|(_, p)| p.bytes > 0)
        .map(|(_, p)| p.cgroup_id);
    let paths = state.paths_of(counted.iter().map(|(id, _, _)| *id).chain(holding));
    for (id, (bytes, limit), passes) in counted {
        let path = paths
            .get(&id)
            .cloned()
            .unwrap_or_else(|| format!("cgroup {id}"));
        // The kernel's own record of the crossing explains an overrun it reported lately
        // (with `deny` the subtree stays over); one without such a record (lost in a full
        // ring buffer, or a limit lowered below what is held) is reported here.
        let recorded = state
            .backstop()
            .tally(id)
            .last_record
            .is_some_and(|t| t.elapsed() < RECONCILE_EVERY * 3);
        if passes == 1 && !recorded {
            state.backstop().reconciled(id);
            tracing::warn!(
                event = "reconcile_over_limit",
                cgroup = path,
                "reconcile: the kernel sees {} in the subtree, over the {} threshold",
                Size(bytes),
                Size(limit)
            );
        } else if passes == 2 && kill {
            match holders.get(&id) {
                Some(&(pid, gpu)) => super::devmap::kill_holder(pid, gpu, &path),
                None => kill_largest(&paths, &snap.procs, &path),
            }
        }
    }
    super::unseen::reconcile(state, &pass.limits, &snap.procs, enforcer.unseen());
}

/// SIGKILLs the process of the subtree `path` that holds the most (`paths`: the cgroups of
/// the processes that hold memory).
fn kill_largest(
    paths: &HashMap<u64, String>,
    procs: &[(u32, fgpu_common::event::ProcUsage)],
    path: &str,
) {
    let victim = procs
        .iter()
        .filter(|(_, p)| p.bytes > 0)
        .filter(|(_, p)| paths.get(&p.cgroup_id).is_some_and(|c| is_under(c, path)))
        .max_by_key(|(_, p)| p.bytes);
    if let Some((pid, p)) = victim {
        // Through a pidfd, and only if the PID still names a process of the subtree.
        let outcome = super::pidfd::kill_in_said(*pid, path);
        tracing::warn!(
            event = "reconcile_kill",
            pid,
            cgroup = path,
            "reconcile: killed the largest holder ({}) of a subtree still over its limit{}",
            Size(p.bytes),
            outcome
        );
    }
}

/// Keeps the kernel's limits in sync and reconciles, until the agent stops. The loop owns
/// `enforcer`; the event thread's notices reach it through its channel ([`super::enforcer`]).
pub async fn run(state: Arc<State>, mut enforcer: Enforcer) {
    let mut tick = tokio::time::interval(SYNC_EVERY);
    let per_reconcile = (RECONCILE_EVERY.as_millis() / SYNC_EVERY.as_millis()) as u32;
    let mut n = 0u32;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = enforcer.woken() => {}
        }
        let pass = Pass::take(&state);
        if write(&state, &pass.want) > 0 {
            state.backstop().limits_changed();
        }
        n = n.wrapping_add(1);
        if n.is_multiple_of(per_reconcile) {
            reconcile(&state, &mut enforcer, &pass);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::gpus::Gpu;

    const GIB: u64 = 1 << 30;

    #[test]
    fn the_kernel_threshold_is_the_sum_over_the_nodes_gpus() {
        let gpus: Vec<Gpu> = (0..2)
            .map(|i| Gpu {
                index: i,
                uuid: format!("GPU-{i}"),
                name: "Sim".into(),
                memory_total_bytes: 16 * GIB,
            })
            .collect();
        let plain = Limit {
            memory_bytes: Some(2 * GIB),
            ..Limit::default()
        };
        assert_eq!(threshold(&gpus, &plain), Some(4 * GIB));
        assert_eq!(threshold(&[], &plain), Some(2 * GIB));
        let mut both = Limit {
            memory_gpus: [("GPU-1".to_string(), GIB)].into(),
            ..Limit::default()
        };
        assert_eq!(
            threshold(&gpus, &both),
            Some(u64::MAX),
            "GPU 0 is unlimited"
        );
        both.memory_gpus.insert("GPU-0".into(), 3 * GIB);
        assert_eq!(threshold(&gpus, &both), Some(4 * GIB));
        // A per-GPU value replaces the plain one on its GPU: 3 GiB on GPU 0 + 1 GiB on GPU 1.
        both.memory_gpus.remove("GPU-1");
        both.memory_bytes = Some(GIB);
        assert_eq!(threshold(&gpus, &both), Some(4 * GIB));
        assert_eq!(threshold(&gpus, &Limit::default()), None);
    }
}
