//! Marking the node's shared parents in the kernel ([`KernelMaps::mark_shared`]), so that
//! the probes count every cgroup against its tenant: walking down from the root, the first
//! cgroup not marked ([`fgpu_common::cgroup::shared`] says which names are shared).
//!
//! At start the agent walks the hierarchy from the root, going down into shared parents
//! only: a bounded walk, its cost set by the node's layout (its slices, runtimes and their
//! containers), not by what tenants make below their own cgroups. From then on the kernel
//! reports every cgroup made directly under the root or under a marked parent
//! (`cgroup_mkdir`, `FGPU_EV_CGROUP_NEW`), where tenants cannot make any, and the agent
//! marks it if it is shared, with any shared parents made in it meanwhile. The kernel
//! forgets a removed one itself (`cgroup_rmdir`).

use std::collections::VecDeque;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use fgpu_common::cgroup::shared::is_shared_parent;
use fgpu_common::event::MAX_SHARED;

use super::kernel::KernelMaps;

/// Marks every shared parent at or below `from` (a path from the v2 root: `/` for the
/// whole node, else a cgroup already judged) whose ancestors up to `from` are shared too.
/// Returns how many it marked.
pub fn mark_below(kernel: &mut KernelMaps, mount: &Path, from: &str) -> usize {
    let mut marked = 0;
    let mut queue = VecDeque::from([from.trim_end_matches('/').to_string()]);
    while let Some(dir) = queue.pop_front() {
        let Ok(entries) = std::fs::read_dir(mount.join(dir.trim_start_matches('/'))) else {
            continue; // removed meanwhile
        };
        for entry in entries.flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            let path = format!("{dir}/{name}");
            if !is_shared_parent(&path) {
                continue;
            }
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            if marked >= MAX_SHARED {
                tracing::warn!(
                    path,
                    "more shared parent cgroups than the kernel keeps ({MAX_SHARED}): the \
                     processes below this one count under it as one tenant"
                );
                return marked;
            }
            match kernel.mark_shared(meta.ino(), &path) {
                Ok(true) => {
                    marked += 1;
                    queue.push_back(path);
                }
                Ok(false) => tracing::warn!(
                    path,
                    "a shared parent cgroup whose path is too long for the kernel's key: the \
                     processes below it count under it as one tenant"
                ),
                Err(err) => tracing::warn!("{err:#}"),
            }
        }
    }
    marked
}

/// The kernel reported cgroup `path` (made directly under the root or under a marked
/// parent): marks it if it is shared, and the shared parents made in it meanwhile.
pub fn cgroup_new(kernel: &mut KernelMaps, mount: &Path, id: u64, path: &str) {
    if !is_shared_parent(path) || kernel.is_shared(id) {
        return;
    }
    match kernel.mark_shared(id, path) {
        Ok(true) => {
            let below = mark_below(kernel, mount, path);
            tracing::debug!(path, below, "a new shared parent cgroup");
        }
        Ok(false) => tracing::warn!(
            path,
            "a shared parent cgroup whose path is too long for the kernel's key: the \
             processes below it count under it as one tenant"
        ),
        Err(err) => tracing::warn!("{err:#}"),
    }
}
