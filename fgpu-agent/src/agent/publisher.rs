//! Keeping the ledgers current: the kernel's view of each cgroup's usage is published into
//! its ledger every [`KERNEL_EVERY`] (the shims refuse on the larger of their own figure and
//! the kernel's), dead processes' slots are reclaimed and ledgers of removed cgroups are
//! dropped every [`RECLAIM_EVERY`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::ledgers::uuid_bytes;
use super::report::State;

pub const KERNEL_EVERY: Duration = Duration::from_millis(50);
pub const RECLAIM_EVERY: Duration = Duration::from_secs(1);

pub async fn run(state: Arc<State>) {
    let uuids: HashMap<u32, [u8; 16]> = state
        .gpus
        .devices
        .iter()
        .filter_map(|g| Some((g.index, uuid_bytes(&g.uuid)?)))
        .collect();
    let mut tick = tokio::time::interval(KERNEL_EVERY);
    let per_reclaim = (RECLAIM_EVERY.as_millis() / KERNEL_EVERY.as_millis()) as u32;
    let mut n = 0u32;
    loop {
        tick.tick().await;
        let ledgers = state.ledgers.all();
        if ledgers.is_empty() {
            continue;
        }
        let bytes: HashMap<(u64, u32), u64> = state
            .kernel
            .lock()
            .expect("kernel maps lock")
            .usage()
            .into_iter()
            .map(|(k, u)| ((k.cgroup_id, k.device), u.bytes))
            .collect();
        for ledger in &ledgers {
            // Every device the ledger knows gets a figure, 0 when the kernel saw nothing, so
            // a stale figure can never keep refusing allocations.
            for (index, uuid) in &uuids {
                let b = bytes.get(&(ledger.cgroup_id, *index)).copied().unwrap_or(0);
                ledger.set_kernel_used(uuid, b);
            }
        }
        n = n.wrapping_add(1);
        if n.is_multiple_of(per_reclaim) {
            for ledger in &ledgers {
                let back = ledger.reclaim_dead();
                if back > 0 {
                    tracing::info!(cgroup = %ledger.cgroup, bytes = back, "reclaimed the share of processes that died");
                }
            }
            let mount = state.cgroup2_mount.clone();
            state
                .ledgers
                .retain(|l| mount.join(l.cgroup.trim_start_matches('/')).is_dir());
        }
    }
}
