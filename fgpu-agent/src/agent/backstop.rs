//! The kernel backstop: a process whose allocation takes its cgroup past the memory limit
//! is dealt with even if it bypassed the shim (LD_PRELOAD unset, a static binary).
//!
//! Checked on every allocation event: the kernel reports the (cgroup, device) total right
//! after that allocation, so the allocation that crossed the limit (and any made while over
//! it) is the one acted on, however late the event is read.
//! Processes that use the shim never get there: the shim refuses first. Policies:
//! - `kill` (default): SIGKILL the process whose allocation crossed the limit, like the
//!   memory cgroup's OOM killer, with a log line and a counter.
//! - `deny`: log and count; the shim's of that cgroup see the kernel figure and refuse
//!   further allocations (a process without the shim is not stopped).

use std::collections::HashMap;
use std::sync::Mutex;

use clap::ValueEnum;
use fgpu_common::event::Event;
use fgpu_common::quantity::Size;

use super::report::State;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnExceed {
    /// Kill the process whose allocation crossed the limit.
    Kill,
    /// Only report it; the shims in the cgroup refuse further allocations.
    Deny,
}

/// What the backstop remembers: limits by cgroup id (cleared when limits change) and what
/// it did per cgroup.
#[derive(Debug, Default)]
pub struct Backstop {
    limits: Mutex<HashMap<u64, Option<u64>>>,
    actions: Mutex<HashMap<u64, u64>>,
}

impl Backstop {
    /// Forgets cached limits; called whenever a limit is set or removed.
    pub fn limits_changed(&self) {
        self.limits.lock().expect("backstop lock").clear();
    }

    /// How many times the policy acted on a cgroup.
    pub fn actions(&self, cgroup_id: u64) -> u64 {
        self.actions
            .lock()
            .expect("backstop lock")
            .get(&cgroup_id)
            .copied()
            .unwrap_or(0)
    }

    /// Checks one allocation event.
    pub fn check(&self, state: &State, e: &Event) {
        let Some(limit) = self.limit_of(state, e.cgroup_id) else {
            return;
        };
        let used = e.cgroup_bytes;
        // The kernel side cannot see which device a cuMemAlloc-family call used (the calling
        // thread's current context): on a node with N GPUs it charges them all to one key,
        // so the backstop compares with N × the per-device limit there, never killing a
        // process that is within its limits on every device (the shim still enforces each
        // device exactly).
        let devices = state.gpus.devices.len().max(1) as u64;
        let limit = limit.saturating_mul(devices);
        if used <= limit {
            return;
        }
        *self
            .actions
            .lock()
            .expect("backstop lock")
            .entry(e.cgroup_id)
            .or_default() += 1;
        let cgroup = state
            .names
            .lock()
            .expect("cgroup names lock")
            .path_of(e.cgroup_id)
            .unwrap_or_else(|| format!("cgroup {}", e.cgroup_id));
        match state.on_exceed {
            OnExceed::Kill => {
                // SAFETY: kill(2) with a host PID from the kernel and a constant signal.
                let rc = unsafe { libc::kill(e.tgid as i32, libc::SIGKILL) };
                tracing::warn!(
                    pid = e.tgid,
                    cgroup,
                    "killed: its allocation of {} took the cgroup to {} on device {}, over the \
                     {} limit (kernel-observed; the process bypassed the shim){}",
                    Size(e.size),
                    Size(used),
                    e.device,
                    Size(limit),
                    if rc == 0 {
                        ""
                    } else {
                        " — kill failed, process already gone?"
                    }
                );
            }
            OnExceed::Deny => {
                tracing::warn!(
                    pid = e.tgid,
                    cgroup,
                    "over limit: an allocation of {} took the cgroup to {} on device {}, over \
                     the {} limit; further allocations through the shim are refused",
                    Size(e.size),
                    Size(used),
                    e.device,
                    Size(limit)
                );
            }
        }
    }

    fn limit_of(&self, state: &State, cgroup_id: u64) -> Option<u64> {
        if let Some(cached) = self.limits.lock().expect("backstop lock").get(&cgroup_id) {
            return *cached;
        }
        let path = state
            .names
            .lock()
            .expect("cgroup names lock")
            .path_of(cgroup_id);
        let limit = path.and_then(|p| {
            state
                .limits
                .lock()
                .expect("limits lock")
                .effective(&p)
                .0
                .memory_bytes
        });
        self.limits
            .lock()
            .expect("backstop lock")
            .insert(cgroup_id, limit);
        limit
    }
}
