//! Hierarchical budgets for the shims: a memory limit on a cgroup covers every process of
//! all its descendants together.
//!
//! Which ledger a process gets ([`ledger_for`]):
//! - no memory limit on its cgroup or above: its cgroup's own ledger (no memory limit);
//! - otherwise the ledger of the *nearest* cgroup with a memory limit of its own, so that a
//!   pod's containers, and any sub-cgroup created later, reserve from one budget with the
//!   shim's lock-free reservation (exact, no refresh needed);
//! - except where a cgroup on the way there has compute settings of its own: then its own
//!   ledger (compute settings are per ledger, and keep inheriting as before), whose memory
//!   limit is derived as below.
//!
//! Derived limits ([`plan`], refreshed by the publisher every 50 ms and on every limit
//! change): where several ledgers sit under one limited cgroup P (a child with a lower limit
//! of its own, or a compute override), each ledger L gets, per device,
//! `min over limited P above or at L of  limit(P) − max(others, kernel_rest)`, where
//! `others` is what the other ledgers under P use (their shims' figure or the kernel's,
//! whichever is larger) and `kernel_rest` is the kernel's total for P's subtree minus L's
//! share (so processes that bypass the shim count too). What processes of L's own domain
//! that never said Hello hold is taken off L's budget as well, and out of the kernel figure
//! its shims compare with. Between two refreshes siblings can
//! race past P's limit through their shims; the kernel backstop checks P exactly, on every
//! allocation, and acts on the one that crosses.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;

use anyhow::Result;
use fgpu_common::ledger::{MAX_DEVICES, NO_LIMIT, uuid_key};

use super::gpus::uuid_bytes;
use super::ledgers::CgroupLedger;
use super::pathindex::PathIndex;

use super::limits::{LimitView, ancestors};
use super::state::State;

/// The cgroup whose ledger a process in `cgroup` shares (see the module documentation).
pub fn ledger_for(store: &LimitView, cgroup: &str) -> String {
    let mut compute_override = false;
    for path in ancestors(cgroup) {
        let Some(own) = store.own(path) else {
            continue;
        };
        if own.has_memory() {
            return if compute_override {
                cgroup.to_string()
            } else {
                path.to_string()
            };
        }
        compute_override |= own.has_compute();
    }
    cgroup.to_string()
}

/// The ledger a process of `cgroup` gets ([`ledger_for`]), created on first use (around
/// `usage`, a reconnecting shim's usage memfd) with its budget planned at once.
/// `shim` (the host PID from SO_PEERCRED and the pidfd taken at accept, which the PID is
/// only ever trusted through) is remembered as a shim: what the other processes of a
/// ledger's domain hold bypasses the shim.
pub fn ledger_of(
    state: &State,
    shim: (u32, Arc<OwnedFd>),
    cgroup: &str,
    usage: Option<OwnedFd>,
) -> Result<Arc<CgroupLedger>> {
    let (chosen, limit, team, tenant, widest) = {
        let store = state.limits();
        let chosen = ledger_for(&store, cgroup);
        let limit = store.effective(&chosen).0;
        let team = super::compute::team::TeamSpec::of(&store, &chosen);
        let tenant = super::tenant::tenant_of(&store, &chosen);
        // The topmost memory limit over it: every ledger below shares that budget.
        let widest = ancestors(&chosen)
            .filter(|p| store.own(p).is_some_and(|l| l.has_memory()))
            .last()
            .map(str::to_string);
        (chosen, limit, team, tenant, widest)
    };
    let dir = state.cgroup_dir(&chosen);
    let known = state.ledgers().get(&chosen).is_some();
    let ledger = state
        .ledgers()
        .get_or_create(&chosen, &tenant, &dir, usage, &limit)?;
    if !known {
        ledger.set_team(team);
    }
    state.shims().register(shim.0, shim.1, &chosen);
    if !known {
        if chosen != cgroup {
            tracing::info!(
                cgroup,
                ledger = chosen,
                "sharing the budget of a limited ancestor"
            );
        }
        // A budget derived from a limited ancestor's is planned at once; a ledger under no
        // memory limit has none to plan, and gets its kernel figure at the next pass.
        if limit.has_memory() {
            // Those sharing its budget first give back what processes that just exited
            // held (bounded: at most a reclaim pass's worth of slots), as a pass would.
            if let Some(widest) = &widest {
                let sharing =
                    state.ledgers().all().into_iter().filter(|l| {
                        l.cgroup != chosen && super::cgroups::is_under(&l.cgroup, widest)
                    });
                state.reclaim().now(sharing);
            }
            let tree = state.tree_by_gpu();
            refresh(state, &tree_by_key(&tree));
        }
    }
    Ok(ledger)
}

/// The kernel's subtree totals by (cgroup id, device).
pub fn tree_by_key(tree: &[(fgpu_common::event::CgroupKey, u64)]) -> HashMap<(u64, u32), u64> {
    tree.iter()
        .map(|(k, b)| ((k.cgroup_id, k.device), *b))
        .collect()
}

/// One ledger as the planner sees it.
#[derive(Debug, Clone)]
pub struct LedgerView {
    pub cgroup: String,
    pub cgroup_id: u64,
    /// What its shims have reserved, by GPU index.
    pub used: HashMap<u32, u64>,
    /// What processes of its domain that never said Hello hold (kernel-observed, all
    /// devices): they bypass the shim, so their bytes come off the shims' budget.
    pub bypass: u64,
    /// The same, by GPU index, for processes whose GPU is known ([`super::devmap`]); those
    /// are left out of `bypass`.
    pub bypass_on: HashMap<u32, u64>,
}

impl LedgerView {
    /// What bypassing processes hold that may be on GPU `d`.
    fn bypass_at(&self, d: u32) -> u64 {
        self.bypass + self.bypass_on.get(&d).copied().unwrap_or(0)
    }
}

/// A cgroup with a memory limit of its own.
#[derive(Debug, Clone)]
pub struct Limited {
    pub cgroup: String,
    pub cgroup_id: u64,
    /// Its plain limit, on every GPU.
    pub bytes: Option<u64>,
    /// Its per-GPU limits, by GPU index: on those GPUs instead of `bytes`.
    pub gpus: HashMap<u32, u64>,
}

impl Limited {
    /// The cgroup's own limit on GPU `d`, if it has one there.
    fn on(&self, d: u32) -> Option<u64> {
        self.gpus.get(&d).copied().or(self.bytes)
    }
}

/// What to write into one ledger, by GPU index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LedgerPlan {
    /// The kernel's figure for the ledger's shims: its cgroup's subtree total minus the
    /// subtrees of ledgers nested below it and minus what bypassing processes hold.
    pub kernel_share: HashMap<u32, u64>,
    /// The memory limit; absent: no limit applies.
    pub limit: HashMap<u32, u64>,
}

/// Plans every ledger's kernel share and memory limit (see the module documentation).
/// `tree`: the kernel's subtree totals by (cgroup id, GPU index).
pub fn plan(
    ledgers: &[LedgerView],
    limited: &[Limited],
    tree: &HashMap<(u64, u32), u64>,
    devices: &[u32],
) -> Vec<LedgerPlan> {
    let kernel = |id: u64, d: u32| tree.get(&(id, d)).copied().unwrap_or(0);
    let mut by_path = PathIndex::default();
    for (i, l) in ledgers.iter().enumerate() {
        by_path.insert(&l.cgroup, i);
    }
    // Ledgers nested directly below each ledger (no other ledger in between): each ledger
    // is nested below the deepest other ledger above it.
    let mut nested: Vec<Vec<usize>> = vec![Vec::new(); ledgers.len()];
    for (m, l) in ledgers.iter().enumerate() {
        if let Some(&above) = by_path.along(&l.cgroup).into_iter().rfind(|&&i| i != m) {
            nested[above].push(m);
        }
    }
    let share: Vec<HashMap<u32, u64>> = ledgers
        .iter()
        .zip(&nested)
        .map(|(l, below)| {
            devices
                .iter()
                .map(|&d| {
                    let inner: u64 = below.iter().map(|&m| kernel(ledgers[m].cgroup_id, d)).sum();
                    (d, kernel(l.cgroup_id, d).saturating_sub(inner))
                })
                .collect()
        })
        .collect();
    let of = |m: &[HashMap<u32, u64>], i: usize, d: u32| m[i].get(&d).copied().unwrap_or(0);
    // The shims' part of each share, and each ledger's whole usage: the shims' (their own
    // figure or the kernel's, the larger) plus what bypasses them.
    let shims: Vec<HashMap<u32, u64>> = share
        .iter()
        .zip(ledgers)
        .map(|(s, l)| {
            s.iter()
                .map(|(d, b)| (*d, b.saturating_sub(l.bypass_at(*d))))
                .collect()
        })
        .collect();
    let used = |i: usize, d: u32| {
        let own = ledgers[i].used.get(&d).copied().unwrap_or(0);
        own.max(of(&shims, i, d))
            .saturating_add(ledgers[i].bypass_at(d).min(of(&share, i, d)))
    };
    // The limited cgroups at or above each ledger, and what all the ledgers under each
    // limited cgroup use (exact: a tenant's figures are its own to write, up to u64::MAX).
    let mut limited_paths = PathIndex::default();
    for (p, l) in limited.iter().enumerate() {
        limited_paths.insert(&l.cgroup, p);
    }
    let above: Vec<Vec<usize>> = ledgers
        .iter()
        .map(|l| {
            limited_paths
                .along(&l.cgroup)
                .into_iter()
                .copied()
                .collect()
        })
        .collect();
    let mut under: HashMap<(usize, u32), u128> = HashMap::new();
    for (x, ps) in above.iter().enumerate() {
        for &p in ps {
            for &d in devices {
                *under.entry((p, d)).or_default() += u128::from(used(x, d));
            }
        }
    }
    ledgers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let mut limit = HashMap::new();
            for &pi in &above[i] {
                let p = &limited[pi];
                for &d in devices {
                    let Some(bytes) = p.on(d) else {
                        continue;
                    };
                    let all = under.get(&(pi, d)).copied().unwrap_or(0);
                    let others = u64::try_from(all - u128::from(used(i, d))).unwrap_or(u64::MAX);
                    let kernel_rest = kernel(p.cgroup_id, d).saturating_sub(of(&share, i, d));
                    let bypass = l.bypass_at(d).min(of(&share, i, d));
                    let budget =
                        bytes.saturating_sub(others.max(kernel_rest).saturating_add(bypass));
                    let e = limit.entry(d).or_insert(budget);
                    *e = (*e).min(budget);
                }
            }
            LedgerPlan {
                kernel_share: shims[i].clone(),
                limit,
            }
        })
        .collect()
}

/// What processes that do not use the shim hold, per ledger: each process (host PID,
/// cgroup, bytes, from the kernel's `procs`) belongs to the ledger of the deepest ledger
/// cgroup above or at its cgroup.
/// Processes whose GPUs are known count on those GPUs only ([`super::devmap`]).
fn bypass_bytes(state: &State, ledgers: &[Arc<CgroupLedger>]) -> Vec<(u64, HashMap<u32, u64>)> {
    let mut out = vec![(0, HashMap::new()); ledgers.len()];
    let placed = state.process_gpus();
    let procs = state.kernel().procs();
    let mut by_path = PathIndex::default();
    for (i, l) in ledgers.iter().enumerate() {
        by_path.insert(&l.cgroup, i);
    }
    let mut names = state.names();
    for (pid, p) in procs.iter().filter(|(_, p)| p.bytes > 0) {
        let Some(path) = names.path_of(p.cgroup_id) else {
            continue;
        };
        let owner = by_path.deepest(&path).copied();
        if let Some(i) = owner
            && !state.shims().uses_shim(*pid)
        {
            match placed.get(pid) {
                Some(on) => {
                    for (g, b) in on {
                        *out[i].1.entry(*g).or_default() += b;
                    }
                }
                None => out[i].0 += p.bytes,
            }
        }
    }
    out
}

/// Computes and writes every ledger's kernel figure and memory limit; `tree`: the kernel's
/// subtree totals by (cgroup id, GPU index).
///
/// Its cost grows with the ledgers, the limited cgroups and the processes holding memory,
/// never with their square: every "which lies under which" is a [`PathIndex`] lookup, each
/// ledger's effective limit is the one last applied to it, and dead processes' slots are
/// taken back by [`super::reclaim`], a bounded stretch per pass. Passes run one at a time.
pub fn refresh(state: &State, tree: &HashMap<(u64, u32), u64>) {
    let _one_at_a_time = state.budget_pass();
    // Shims that exited: their slots are taken back at the next reclaim pass.
    for ledger in state.shims().prune() {
        state.reclaim().shim_died_in(ledger);
    }
    let mut ledgers = state.ledgers().all();
    // Per-GPU compute settings follow the device records shims bound since the last change.
    for l in &ledgers {
        l.refresh_compute_per_gpu();
    }
    // A ledger with nothing to plan (no memory limit at or above it, nothing the kernel
    // sees in its subtree, nothing its shims reserved) has figures of 0 and no limit, and
    // counts for no other ledger: they are written once, when it becomes so, and the passes
    // after that leave it out, so that ledgers nobody uses cost next to nothing.
    let held: std::collections::HashSet<u64> = tree
        .iter()
        .filter(|(_, b)| **b > 0)
        .map(|((id, _), _)| *id)
        .collect();
    ledgers.retain(|l| {
        let idle = !held.contains(&l.cgroup_id) && l.nothing_to_plan();
        let was_idle = l.set_quiet(idle);
        !(idle && was_idle)
    });
    if ledgers.is_empty() {
        return;
    }
    let uuids: HashMap<u32, [u8; 16]> = state
        .devices()
        .iter()
        .filter_map(|g| Some((g.index, uuid_bytes(&g.uuid)?)))
        .collect();
    let uuids = &uuids;
    // On a node of several GPUs every GPU gets its record at once (bound here if no shim
    // has yet), so that each has its own budget before the first allocation on it.
    let several = uuids.len() > 1;
    let record = |l: &CgroupLedger, uuid: &[u8; 16]| {
        let key = uuid_key(uuid);
        let found = l
            .ledger()
            .usage
            .devices
            .iter()
            .position(|r| r.key.load(SeqCst) == key);
        found.or_else(|| several.then(|| l.ledger().device_index(uuid)).flatten())
    };
    let bypass = bypass_bytes(state, &ledgers);
    let views: Vec<LedgerView> = ledgers
        .iter()
        .zip(bypass)
        .map(|(l, (bypass, bypass_on))| LedgerView {
            bypass,
            bypass_on,
            cgroup: l.cgroup.clone(),
            cgroup_id: l.cgroup_id,
            used: uuids
                .iter()
                .filter_map(|(d, u)| Some((*d, l.ledger().used(record(l, u)?))))
                .collect(),
        })
        .collect();
    let (limited, effective): (Vec<Limited>, Vec<crate::api::Limit>) = {
        let store = state.limits();
        let limited = store
            .all()
            .filter(|(_, l)| l.has_memory())
            .filter_map(|(path, l)| {
                let id = state.cgroup_id(path)?;
                Some(Limited {
                    cgroup: path.clone(),
                    cgroup_id: id,
                    bytes: l.memory_bytes,
                    gpus: state
                        .devices()
                        .iter()
                        .filter_map(|g| Some((g.index, *l.memory_gpus.get(&g.uuid)?)))
                        .collect(),
                })
            })
            .collect();
        (limited, ledgers.iter().map(|l| l.effective()).collect())
    };
    let devices: Vec<u32> = uuids.keys().copied().collect();
    let plans = plan(&views, &limited, tree, &devices);
    let fallbacks = effective.iter().map(|e| e.memory_bytes);
    for ((ledger, plan), fallback) in ledgers.iter().zip(&plans).zip(fallbacks) {
        // Records no shim has bound to a device yet get the lowest of the devices' budgets
        // (exact on one GPU), so that the first allocations after binding are covered too.
        let unbound = plan.limit.values().min().copied().or(fallback);
        let mut limits = [unbound.unwrap_or(NO_LIMIT); MAX_DEVICES];
        for (d, uuid) in uuids {
            ledger.set_kernel_used(uuid, plan.kernel_share.get(d).copied().unwrap_or(0));
            if let Some(i) = record(ledger, uuid) {
                limits[i] = plan.limit.get(d).copied().unwrap_or(NO_LIMIT);
            }
        }
        ledger.set_memory_limits(&limits);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::cgroups::is_under;
    use crate::agent::limits::LimitStore;
    use crate::api::Limit;

    const GIB: u64 = 1 << 30;

    fn store(entries: &[(&str, Limit)]) -> LimitStore {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, SeqCst);
        let d = std::env::temp_dir().join(format!("fgpu-budget-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let mut s = LimitStore::open(&d).unwrap();
        for (p, l) in entries {
            s.set(p, l).unwrap();
        }
        s
    }

    fn mem(b: u64) -> Limit {
        Limit {
            memory_bytes: Some(b),
            ..Limit::default()
        }
    }

    #[test]
    fn paths_under_paths() {
        assert!(is_under("/pod/a", "/pod"));
        assert!(is_under("/pod", "/pod"));
        assert!(!is_under("/pod2", "/pod"));
        assert!(is_under("/x", "/"));
    }

    #[test]
    fn processes_under_a_limited_cgroup_share_its_ledger_unless_they_have_their_own() {
        let s = store(&[
            ("/pod", mem(8 * GIB)),
            ("/pod/small", mem(2 * GIB)),
            (
                "/pod/timed",
                Limit {
                    compute_pct: Some(30),
                    ..Limit::default()
                },
            ),
        ]);
        assert_eq!(ledger_for(&s, "/pod/a"), "/pod");
        assert_eq!(ledger_for(&s, "/pod/a/b/c"), "/pod");
        assert_eq!(ledger_for(&s, "/pod"), "/pod");
        assert_eq!(ledger_for(&s, "/pod/small/x"), "/pod/small");
        assert_eq!(ledger_for(&s, "/pod/timed/x"), "/pod/timed/x");
        assert_eq!(ledger_for(&s, "/free/x"), "/free/x");
    }

    fn view(cgroup: &str, id: u64, used: u64) -> LedgerView {
        LedgerView {
            bypass: 0,
            bypass_on: HashMap::new(),
            cgroup: cgroup.into(),
            cgroup_id: id,
            used: HashMap::from([(0, used)]),
        }
    }

    #[test]
    fn a_lower_child_limit_and_the_parents_budget_are_derived_from_each_other() {
        // /pod (id 1, 8 GiB, shared ledger used 3 GiB by shims), /pod/small (id 2, 2 GiB,
        // own ledger, 1 GiB), and a bypassing process in /pod/raw (id 3) holding 1 GiB that
        // only the kernel sees.
        let ledgers = [view("/pod", 1, 3 * GIB), view("/pod/small", 2, GIB)];
        let limited = [
            Limited {
                cgroup: "/pod".into(),
                cgroup_id: 1,
                bytes: Some(8 * GIB),
                gpus: HashMap::new(),
            },
            Limited {
                cgroup: "/pod/small".into(),
                cgroup_id: 2,
                bytes: Some(2 * GIB),
                gpus: HashMap::new(),
            },
        ];
        let tree = HashMap::from([((1, 0), 5 * GIB), ((2, 0), GIB), ((3, 0), GIB)]);
        let plans = plan(&ledgers, &limited, &tree, &[0]);
        // The pod's ledger stands for everything in the pod but /pod/small: the kernel sees
        // 4 GiB there (its shims' 3 GiB and the bypassing 1 GiB).
        assert_eq!(plans[0].kernel_share[&0], 4 * GIB);
        assert_eq!(
            plans[0].limit[&0],
            7 * GIB,
            "8 GiB minus /pod/small's 1 GiB"
        );
        assert_eq!(plans[1].kernel_share[&0], GIB);
        // /pod/small: min(2 GiB, 8 GiB - 4 GiB used by the rest of the pod).
        assert_eq!(plans[1].limit[&0], 2 * GIB);
        // The rest of the pod grows to 7 GiB: /pod/small may only grow to 8 - 7 = 1 GiB.
        let busy = HashMap::from([((1, 0), 8 * GIB), ((2, 0), GIB)]);
        let plans = plan(&ledgers, &limited, &busy, &[0]);
        assert_eq!(plans[1].limit[&0], GIB, "{plans:?}");
    }

    #[test]
    fn one_shared_ledger_gets_the_whole_limit() {
        let ledgers = [view("/pod", 1, 2 * GIB)];
        let limited = [Limited {
            cgroup: "/pod".into(),
            cgroup_id: 1,
            bytes: Some(8 * GIB),
            gpus: HashMap::new(),
        }];
        let tree = HashMap::from([((1, 0), 5 * GIB)]);
        let plans = plan(&ledgers, &limited, &tree, &[0]);
        assert_eq!(plans[0].limit[&0], 8 * GIB);
        assert_eq!(
            plans[0].kernel_share[&0],
            5 * GIB,
            "bypassing processes count"
        );
        let free = plan(&[view("/free", 9, 0)], &limited, &tree, &[0]);
        assert!(free[0].limit.is_empty());
        // 3 of the 5 GiB are a process that bypasses the shim: the shims' figure leaves it
        // out, and their limit does not cover it.
        let mixed = [LedgerView {
            bypass: 3 * GIB,
            bypass_on: HashMap::new(),
            ..view("/pod", 1, 2 * GIB)
        }];
        let plans = plan(&mixed, &limited, &tree, &[0]);
        assert_eq!(plans[0].kernel_share[&0], 2 * GIB);
        assert_eq!(plans[0].limit[&0], 5 * GIB);
    }

    #[test]
    fn per_gpu_limits_budget_each_gpu_and_leave_the_others_alone() {
        // /pod: 1 GiB on GPU 1 only; its shims use 256 MiB on GPU 0 and 512 MiB on GPU 1.
        let ledgers = [LedgerView {
            used: HashMap::from([(0, GIB / 4), (1, GIB / 2)]),
            ..view("/pod", 1, 0)
        }];
        let limited = [Limited {
            cgroup: "/pod".into(),
            cgroup_id: 1,
            bytes: None,
            gpus: HashMap::from([(1, GIB)]),
        }];
        let tree = HashMap::from([((1, 0), GIB / 4), ((1, 1), GIB / 2)]);
        let plans = plan(&ledgers, &limited, &tree, &[0, 1]);
        assert_eq!(
            plans[0].limit,
            HashMap::from([(1, GIB)]),
            "no limit on GPU 0"
        );
        // A parent's plain 2 GiB and a child's 4 GiB on GPU 0: the child gets 2 GiB there.
        let nested = [view("/p", 1, 0), view("/p/c", 2, 0)];
        let limited = [
            Limited {
                cgroup: "/p".into(),
                cgroup_id: 1,
                bytes: Some(2 * GIB),
                gpus: HashMap::new(),
            },
            Limited {
                cgroup: "/p/c".into(),
                cgroup_id: 2,
                bytes: None,
                gpus: HashMap::from([(0, 4 * GIB), (1, GIB)]),
            },
        ];
        let plans = plan(&nested, &limited, &HashMap::new(), &[0, 1]);
        assert_eq!(plans[1].limit, HashMap::from([(0, 2 * GIB), (1, GIB)]));
        assert_eq!(plans[0].limit, HashMap::from([(0, 2 * GIB), (1, 2 * GIB)]));
    }

    #[test]
    fn many_ledgers_and_a_deep_chain_are_planned_in_time_linear_in_what_was_made() {
        // 300 sibling ledgers under a limited /pod and a chain of 300 nested ledgers.
        let mut ledgers: Vec<LedgerView> = (0..300)
            .map(|i| view(&format!("/pod/s{i}"), 10 + i, GIB / 1024))
            .collect();
        let mut path = String::from("/pod/chain");
        for i in 0..300 {
            ledgers.push(view(&path, 5000 + i, 0));
            path.push_str("/n");
        }
        let limited = [Limited {
            cgroup: "/pod".into(),
            cgroup_id: 1,
            bytes: Some(8 * GIB),
            gpus: HashMap::new(),
        }];
        let start = std::time::Instant::now();
        let plans = plan(&ledgers, &limited, &HashMap::new(), &[0]);
        let took = start.elapsed();
        // Each sibling may have 8 GiB less what the 299 others use.
        assert_eq!(plans[0].limit[&0], 8 * GIB - 299 * (GIB / 1024));
        assert_eq!(plans[450].limit[&0], 8 * GIB - 300 * (GIB / 1024));
        // Comparing every pair of paths, as planning once did, took 1.1-1.9 s here.
        assert!(
            took < std::time::Duration::from_millis(250),
            "planning took {took:?}"
        );
    }

    #[test]
    fn a_usage_figure_a_tenant_wrote_at_its_largest_does_not_overflow_the_plan() {
        let ledgers = [view("/pod/a", 2, u64::MAX), view("/pod/b", 3, u64::MAX)];
        let limited = [Limited {
            cgroup: "/pod".into(),
            cgroup_id: 1,
            bytes: Some(8 * GIB),
            gpus: HashMap::new(),
        }];
        let plans = plan(&ledgers, &limited, &HashMap::new(), &[0]);
        assert_eq!(plans[0].limit[&0], 0);
    }
}
