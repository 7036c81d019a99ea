//! Denials as structured log lines: once a second, every ledger whose shims refused
//! allocations since the last look gets one `event="alloc_denied"` line (how many, the total,
//! the limit), so that a log pipeline sees denials without reading the workloads' stderr.
//! (Limit changes and the kernel backstop's actions are logged where they happen, with
//! `event` fields of their own: docs/observability.md.) At most one line per ledger per
//! second, whatever a container does.
//!
//! The counts are the tenant's own: its shims write them in its usage page, which its
//! processes share read-write, so a tenant can write any number there. The line says so
//! (`reported_by="tenant"`, "as reported by the tenant" in the message).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fgpu_common::quantity::Size;

use crate::agent::state::State;

const EVERY: Duration = Duration::from_secs(1);

pub async fn run(state: Arc<State>) {
    let mut seen: HashMap<String, u64> = HashMap::new();
    let mut tick = tokio::time::interval(EVERY);
    loop {
        tick.tick().await;
        let ledgers = state.ledgers().all();
        // One copy of the limits for the pass, taken when a ledger first needs it.
        let mut limits = None;
        seen.retain(|cgroup, _| ledgers.iter().any(|l| &l.cgroup == cgroup));
        for l in &ledgers {
            let total = l.denied();
            let before = seen.insert(l.cgroup.clone(), total).unwrap_or(0);
            if total <= before {
                continue;
            }
            let effective = limits
                .get_or_insert_with(|| state.limits_view())
                .effective(&l.cgroup)
                .0;
            let limit = effective.memory_bytes;
            // Per-GPU limits are named with their GPUs (the denial's GPU is not recorded).
            let per_gpu = (!effective.memory_gpus.is_empty()).then(|| {
                effective
                    .memory_gpus
                    .iter()
                    .map(|(u, b)| format!("{} on {u}", Size(*b)))
                    .collect::<Vec<_>>()
                    .join(", ")
            });
            let mut shown = limit.map_or_else(|| "-".to_string(), |b| Size(b).to_string());
            if let Some(per) = &per_gpu {
                shown = format!("{shown} ({per})");
            }
            tracing::warn!(
                event = "alloc_denied",
                cgroup = %l.cgroup,
                denied = total - before,
                denied_total = total,
                reported_by = "tenant",
                limit_bytes = limit,
                limit_gpus = per_gpu.as_deref(),
                "{} allocation(s) refused at the {shown} limit, as reported by the tenant",
                total - before,
            );
        }
    }
}
