//! Draining the kernel's event ring buffer.
//!
//! Totals and the kernel backstop's decisions never depend on these events (they live in
//! maps and in the probe); the events feed the log and the counters.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;

use anyhow::{Context, Result};
use aya::Ebpf;
use aya::maps::{MapData, RingBuf};
use fgpu_common::event::{ApiId, Event, EventKind};
use tokio::io::unix::AsyncFd;

use super::enforcer::Notices;
use super::state::State;

pub fn ring(ebpf: &mut Ebpf) -> Result<RingBuf<MapData>> {
    let map = ebpf
        .take_map(fgpu_ebpf::maps::EVENTS)
        .context("eBPF object lacks the events ring buffer")?;
    Ok(RingBuf::try_from(map)?)
}

/// Where the event thread sends what it learns besides the state: new processes to the
/// library watcher, execs and removed cgroups to the enforce loop.
pub struct Outlets {
    pub watcher: Sender<u32>,
    pub enforcer: Notices,
}

/// Drains the ring buffer until the agent stops.
pub async fn drain(ring: RingBuf<MapData>, state: Arc<State>, out: Outlets) -> Result<()> {
    // SAFETY: the ring buffer owns its map fd, which stays open and unchanged for as long
    // as the RingBuf lives, and the AsyncFd owns the RingBuf.
    let mut fd = unsafe { AsyncFd::register(ring) }
        .map_err(|e| anyhow::anyhow!("polling the events ring buffer: {e}"))?;
    loop {
        let mut guard = fd.readable_mut().await?;
        let ring = guard.get_inner_mut();
        while let Some(item) = ring.next() {
            if let Some(event) = Event::from_bytes(&item) {
                record(&state, &out, &event);
            }
        }
        guard.clear_ready();
    }
}

fn record(state: &State, out: &Outlets, e: &Event) {
    let api = ApiId::from_raw(e.api).map_or("-", ApiId::name);
    let counter = match EventKind::from_raw(e.kind) {
        Some(EventKind::Alloc) => &state.events().allocs,
        Some(EventKind::Free) => &state.events().frees,
        Some(EventKind::OverLimit | EventKind::OverBound) => {
            state.backstop_record(e);
            return;
        }
        Some(EventKind::Exec) => {
            // The watcher may be gone only while the agent shuts down.
            let _ = out.watcher.send(e.tgid);
            out.enforcer.exec_in(e.cgroup_id);
            return;
        }
        Some(EventKind::CgroupNew) => {
            // Named by its handle (a cost that does not grow with the cgroups on the node).
            let path = state.names().path_of(e.cgroup_id);
            if let Some(path) = path {
                let mount = state.cgroup2_mount();
                super::shared::cgroup_new(&mut state.kernel(), mount, e.cgroup_id, &path);
            }
            return;
        }
        Some(EventKind::CgroupGone) => {
            out.enforcer.cgroup_gone(e.cgroup_id);
            state.forget_cgroup(e.cgroup_id);
            if e.size > 0 {
                tracing::debug!(
                    cgroup_id = e.cgroup_id,
                    held = e.size,
                    "a cgroup was removed while processes that left it held GPU memory; its \
                     records go when that memory is freed"
                );
            }
            return;
        }
        Some(EventKind::Exit) => {
            // Its slot in a ledger is taken back at the next budget pass.
            state.reclaim().exited_in(e.cgroup_id);
            if e.size > 0 {
                tracing::info!(
                    pid = e.tgid,
                    cgroup_id = e.cgroup_id,
                    released = e.size,
                    "process exited holding GPU memory; released"
                );
            }
            &state.events().exits
        }
        None => return,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    tracing::trace!(
        kind = e.kind,
        api,
        pid = e.tgid,
        cgroup_id = e.cgroup_id,
        device = e.device,
        addr = format_args!("{:#x}", e.addr),
        size = e.size,
        "gpu memory event"
    );
}
