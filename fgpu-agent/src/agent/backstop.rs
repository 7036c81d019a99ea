//! The kernel backstop's reports: a process whose allocation takes a limited cgroup past its
//! limit is dealt with in the kernel, synchronously, even if it bypassed the shim
//! (LD_PRELOAD unset, a static binary); the agent logs and counts what the kernel did.
//!
//! The return probe charges every ancestor of the allocating cgroup and compares each
//! limited one's subtree total with its threshold (`limits` map, see [`super::enforce`]).
//! Processes that use the shim never get there: the shim refuses first. Policies:
//! - `kill` (default): the probe SIGKILLs the process before the crossing call returns to
//!   it (so the allocation is never used), like the memory cgroup's OOM killer; the exit
//!   tracepoint releases its memory.
//! - `deny`: the kernel only reports; the shims of that cgroup see the kernel figure and
//!   refuse further allocations (a process without the shim is not stopped).
//!
//! Either way the kernel sends an `OverLimit` record (or `OverBound`, for an allocation its
//! tenant had no tracking room left for); this module turns them into log lines and per-
//! cgroup counts. Totals and decisions never depend on these records: a lost record loses
//! a log line, which [`super::enforce::reconcile`] makes up for.

use std::collections::HashMap;
use std::sync::Mutex;

use fgpu_common::event::{Event, EventKind, action};
use fgpu_common::quantity::Size;

use super::cgroups::CgroupNames;
use super::gpus::Gpu;
use super::limits::{LimitStore, threshold};

/// What the kernel did, per cgroup.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    /// Over-limit records (each an allocation that took the cgroup past its limit).
    pub over_limit: u64,
    /// Processes the kernel killed (over limit or over bound).
    pub kills: u64,
    /// Allocations not tracked because the tenant reached its bound.
    pub over_bound: u64,
    /// Overruns found by the agent's reconcile pass that no kernel record explained.
    pub reconciled: u64,
    /// When the last over-limit record came.
    pub last_record: Option<std::time::Instant>,
    /// When the reconcile pass last counted an overrun no record had explained yet.
    last_reconciled: Option<std::time::Instant>,
}

impl Tally {
    /// How many times the policy acted (kernel records and reconcile passes).
    pub fn actions(&self) -> u64 {
        self.over_limit + self.over_bound + self.reconciled
    }
}

/// How recent a reconcile pass's finding is for an over-limit record to explain it: three
/// reconcile passes ([`super::enforce::RECONCILE_EVERY`] checks that it is).
pub const RECONCILED_RECENTLY: std::time::Duration = std::time::Duration::from_secs(3);

#[derive(Debug, Default)]
pub struct Backstop {
    tallies: Mutex<HashMap<u64, Tally>>,
}

impl Backstop {
    /// Called when the kernel limits were rewritten (kept for the control path).
    pub fn limits_changed(&self) {}

    pub fn tally(&self, cgroup_id: u64) -> Tally {
        self.tallies
            .lock()
            .expect("backstop lock")
            .get(&cgroup_id)
            .copied()
            .unwrap_or_default()
    }

    /// Every cgroup's tally, copied under one lock (for a pass over many cgroups).
    pub fn tallies(&self) -> HashMap<u64, Tally> {
        self.tallies.lock().expect("backstop lock").clone()
    }

    /// The reconcile pass found the cgroup over its limit.
    pub fn reconciled(&self, cgroup_id: u64) {
        let mut tallies = self.tallies.lock().expect("backstop lock");
        let t = tallies.entry(cgroup_id).or_default();
        t.reconciled += 1;
        t.last_reconciled = Some(std::time::Instant::now());
    }

    /// Records one `OverLimit` or `OverBound` record from the kernel.
    pub fn record(
        &self,
        names: &Mutex<CgroupNames>,
        limits: &Mutex<LimitStore>,
        gpus: &[Gpu],
        e: &Event,
    ) {
        let kind = EventKind::from_raw(e.kind);
        {
            let mut tallies = self.tallies.lock().expect("backstop lock");
            let t = tallies.entry(e.cgroup_id).or_default();
            match kind {
                Some(EventKind::OverLimit) => {
                    t.over_limit += 1;
                    t.last_record = Some(std::time::Instant::now());
                    // The reconcile pass may have seen this crossing a moment before its
                    // record was read: the record explains it, counted once.
                    if t.last_reconciled
                        .take()
                        .is_some_and(|at| at.elapsed() < RECONCILED_RECENTLY)
                    {
                        t.reconciled = t.reconciled.saturating_sub(1);
                    }
                }
                Some(EventKind::OverBound) => t.over_bound += 1,
                _ => return,
            }
            if e.result == action::KILLED {
                t.kills += 1;
            }
        }
        let cgroup = names
            .lock()
            .expect("cgroup names lock")
            .path_of(e.cgroup_id)
            .unwrap_or_else(|| format!("cgroup {}", e.cgroup_id));
        // A plain limit as it was set; with per-GPU values, the kernel's threshold (their
        // sum over the node's GPUs, see super::enforce).
        let limit = limits
            .lock()
            .expect("limits lock")
            .own(&cgroup)
            .and_then(|l| {
                l.memory_bytes
                    .filter(|_| l.memory_gpus.is_empty())
                    .or_else(|| threshold(gpus, l))
            });
        let what = match e.result {
            action::KILLED => "killed by the kernel".to_string(),
            action::REPORTED => "reported (--on-exceed deny)".to_string(),
            rc => format!("the kernel could not kill it (bpf_send_signal {rc})"),
        };
        if kind == Some(EventKind::OverBound) {
            tracing::warn!(
                event = "over_bound",
                pid = e.tgid,
                tenant = cgroup,
                "over bound: an allocation of {} was not tracked, the tenant has no tracking \
                 room left; {what}",
                Size(e.size),
            );
            return;
        }
        tracing::warn!(
            event = "over_limit",
            pid = e.tgid,
            cgroup,
            bytes = e.cgroup_bytes,
            device = e.device,
            limit_bytes = limit,
            action = match e.result {
                action::KILLED => "kill",
                action::REPORTED => "report",
                _ => "kill_failed",
            },
            "over limit: its allocation of {} took the cgroup's subtree to {} ({} bytes) on \
             device {}, over the {} limit; {what}",
            Size(e.size),
            Size(e.cgroup_bytes),
            e.cgroup_bytes,
            e.device,
            limit.map_or_else(|| "-".to_string(), |l| Size(l).to_string()),
        );
    }
}
