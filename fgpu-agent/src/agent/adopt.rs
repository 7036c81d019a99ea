//! Which usage memfd a new ledger adopts (after an agent restart the running shims of a
//! cgroup still share their old usage page; adopting it keeps their charges).
//!
//! Every usage memfd is named for the cgroup whose ledger it is (`fgpu-usage:<cgroup id>`,
//! [`fgpu_ledger::usage_name`]), and a page is adopted only by the ledger of that cgroup:
//! - a page offered in a Hello ([`offered`]) must pass the seal checks (a forged one refuses
//!   the Hello) and carry the ledger's tag (else a fresh page is made, with a warning);
//! - a page found in `/proc/PID/fd` ([`usage_memfd_in`]) must carry the tag too, and is never
//!   taken from the agent's own process (which holds every tenant's page): a process that
//!   was handed another cgroup's page, and the agent itself, cannot make a new ledger share
//!   someone else's usage. The process is pinned by a pidfd, its cgroup confirmed and the
//!   pidfd checked alive after the descriptor was opened, so that a PID reused meanwhile is
//!   never mistaken for a process of the cgroup.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use anyhow::{Context, Result};

use super::pidfd::{alive, cgroup_of, pidfd_open};

/// A reconnecting shim's usage memfd: `Err` if its seals or size are wrong (the Hello is
/// refused), `Ok(None)` if it is not tagged for `cgroup_id` (not adopted: a warning, and the
/// ledger gets a fresh page), else the descriptor.
pub fn offered(fd: OwnedFd, cgroup: &str, cgroup_id: u64) -> Result<Option<OwnedFd>> {
    fgpu_ledger::check_usage(fd.as_raw_fd()).context("refusing the usage memfd handed over")?;
    match fgpu_ledger::usage_tag_of(fd.as_raw_fd()).flatten() {
        Some(tag) if tag == cgroup_id => Ok(Some(fd)),
        tag => {
            tracing::warn!(
                cgroup,
                cgroup_id,
                tag = ?tag,
                "not adopting the usage memfd a shim offered: it is not this cgroup's ledger \
                 page (untagged or another cgroup's); the ledger gets a fresh page"
            );
            Ok(None)
        }
    }
}

/// At most this many cgroups (the cgroup and those below it) are searched for a page.
const MAX_CGROUPS_SEARCHED: usize = 4096;

/// A usage memfd of cgroup `cgroup_id` held by one of the cgroup's processes, or of a cgroup
/// below it (never the agent's own), opened as a new description of the same memory. Below
/// matters: a pod's or a team's processes all live in cgroups under the one with the limit
/// (cgroup v2 keeps processes out of inner cgroups that have controllers enabled), so its own
/// `cgroup.procs` is empty; after an agent restart (a DaemonSet upgrade) a new container of
/// such a pod started with a fresh page, the shim refused nothing it should and the kernel
/// killed the container at the pod's limit (tests/e2e_kubernetes_daemonset.rs).
pub fn usage_memfd_in(cgroup: &str, cgroup_dir: &Path, cgroup_id: u64) -> Option<OwnedFd> {
    let me = std::process::id();
    let mut skipped = 0usize;
    let mut dirs = vec![cgroup_dir.to_path_buf()];
    let mut seen = 0usize;
    let mut found = None;
    while let Some(dir) = dirs.pop() {
        seen += 1;
        if seen > MAX_CGROUPS_SEARCHED {
            tracing::warn!(
                cgroup,
                "not searching past {MAX_CGROUPS_SEARCHED} cgroups for a usage memfd to adopt"
            );
            break;
        }
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            found = procs
                .lines()
                .filter_map(|l| l.trim().parse::<u32>().ok())
                .filter(|&pid| pid != me)
                .find_map(|pid| in_process(pid, cgroup, cgroup_id, &mut skipped));
            if found.is_some() {
                break;
            }
        }
        if let Ok(entries) = std::fs::read_dir(&dir) {
            dirs.extend(
                entries
                    .filter_map(Result::ok)
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    if skipped > 0 {
        tracing::warn!(
            cgroup,
            cgroup_id,
            skipped,
            "not adopting usage memfds held by processes of the cgroup that are not this \
             cgroup's ledger page (untagged or another cgroup's)"
        );
    }
    found
}

/// The first usage memfd tagged `cgroup_id` that process `pid` holds, if it is (still) a
/// process of `cgroup` (or below); counts the usage memfds it holds with another tag.
fn in_process(pid: u32, cgroup: &str, cgroup_id: u64, skipped: &mut usize) -> Option<OwnedFd> {
    let pidfd = pidfd_open(pid).ok()?;
    let now = cgroup_of(&pidfd, pid)?;
    if !super::cgroups::is_under(&now, cgroup) {
        return None; // its PID names a process elsewhere by now
    }
    let fd_dir = Path::new("/proc").join(pid.to_string()).join("fd");
    std::fs::read_dir(&fd_dir)
        .ok()?
        .filter_map(Result::ok)
        .find_map(|e| {
            let target = std::fs::read_link(e.path()).ok()?;
            match fgpu_ledger::usage_tag(&target.to_string_lossy())? {
                Some(tag) if tag == cgroup_id => {}
                _ => {
                    *skipped += 1;
                    return None;
                }
            }
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(e.path())
                .ok()?;
            if !alive(&pidfd) {
                return None; // the descriptor may have been a later owner's of the PID
            }
            let fd = OwnedFd::from(file);
            match fgpu_ledger::check_usage(fd.as_raw_fd()) {
                Ok(()) => Some(fd),
                Err(e) => {
                    tracing::warn!(path = %fd_dir.display(), "not adopting a usage memfd: {e}");
                    None
                }
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_own_pages_and_other_cgroups_pages_are_not_adopted() {
        let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let cgroup = fgpu_common::cgroup::unified_path(&text)
            .unwrap()
            .to_string();
        let mount = fgpu_testkit::cgroup2_mount();
        let dir = mount.join(cgroup.trim_start_matches('/'));
        // This process holds a page tagged for its own cgroup: still not adopted (it is the
        // "agent" here).
        let id = std::fs::metadata(&dir).map(|m| {
            use std::os::unix::fs::MetadataExt;
            m.ino()
        });
        let Ok(id) = id else { return };
        let _mine = fgpu_ledger::create_usage(id).unwrap();
        assert!(usage_memfd_in(&cgroup, &dir, id).is_none());
        // Offered: another cgroup's page is not adopted; its own is; a forged one refused.
        let other = fgpu_ledger::create_usage(id + 1).unwrap();
        assert!(offered(other, &cgroup, id).unwrap().is_none());
        let own = fgpu_ledger::create_usage(id).unwrap();
        assert!(offered(own, &cgroup, id).unwrap().is_some());
        let zero = OwnedFd::from(std::fs::File::open("/dev/zero").unwrap());
        let err = offered(zero, &cgroup, id).unwrap_err();
        assert!(
            format!("{err:#}").starts_with("refusing the usage memfd handed over"),
            "{err:#}"
        );
    }
}
