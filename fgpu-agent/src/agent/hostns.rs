//! The agent in a container (`fgpu agent --host-process PID`): which namespaces are the
//! host's, and whether the agent's container gives it what it needs.
//!
//! On the host, the admin socket serves callers in the agent's own PID, mount and user
//! namespaces. In a container (privileged, `--pid=host`, `--cgroupns=host`), the agent's
//! mount namespace is the container's: the host's `fgpu` and the CDI hook would be refused.
//! With `--host-process PID` (a process on the host, e.g. 1) the admin socket serves callers
//! in that process's namespaces instead, after checking that the agent does share the host's
//! PID, cgroup and user namespaces — without them it would see container-relative PIDs and
//! cgroup paths — and saying which container option is missing if it does not.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};

/// A namespace's identity: the (device, inode) of its nsfs file.
pub type NsId = (u64, u64);

/// Inode numbers of the initial namespaces (include/linux/proc_ns.h): a process in the
/// host's PID or cgroup namespace sees these.
const PROC_PID_INIT_INO: u64 = 0xEFFF_FFFC;
const PROC_CGROUP_INIT_INO: u64 = 0xEFFF_FFFB;

static HOST: OnceLock<[Option<NsId>; 3]> = OnceLock::new();

/// The host's PID, mount and user namespaces, when `--host-process` gave them.
pub fn host() -> Option<&'static [Option<NsId>; 3]> {
    HOST.get()
}

fn ns(pid: &str, name: &str) -> std::io::Result<NsId> {
    let m = std::fs::metadata(format!("/proc/{pid}/ns/{name}"))?;
    Ok((m.dev(), m.ino()))
}

/// Takes process `pid`'s namespaces as the host's, after the checks in the module's note.
pub fn adopt(pid: u32) -> Result<()> {
    let p = pid.to_string();
    let theirs = |name: &str| {
        ns(&p, name).with_context(|| {
            format!("--host-process {pid}: cannot read that process's {name} namespace")
        })
    };
    let mine =
        |name: &str| ns("self", name).with_context(|| format!("reading our {name} namespace"));
    if mine("pid")?.1 != PROC_PID_INIT_INO {
        bail!(
            "the agent is not in the host's PID namespace: it must see host PIDs (containers' \
             processes and the callers of its sockets). Run its container with --pid=host \
             (Kubernetes: hostPID: true)"
        );
    }
    if mine("cgroup")?.1 != PROC_CGROUP_INIT_INO {
        bail!(
            "the agent is not in the host's cgroup namespace: it would see cgroup paths \
             relative to its own container and could not name or limit other containers. Run \
             its container with --cgroupns=host (docker/podman; Kubernetes pods are in the \
             host's cgroup namespace unless the runtime makes one per pod)"
        );
    }
    for name in ["pid", "cgroup"] {
        if mine(name)? != theirs(name)? {
            bail!(
                "--host-process {pid} is not in the host's {name} namespace: give a host process, e.g. 1"
            );
        }
    }
    if mine("user")? != theirs("user")? {
        bail!(
            "the agent is in a user namespace of its own: it needs the host's root (a rootful, \
             privileged container; not rootless podman or --userns)"
        );
    }
    check_cgroup2_mount(
        &std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?,
    )?;
    let host = [
        Some(theirs("pid")?),
        Some(theirs("mnt")?),
        Some(theirs("user")?),
    ];
    if HOST.set(host).is_err() {
        bail!("the host's namespaces were already set");
    }
    tracing::info!(
        host_process = pid,
        "in a container: the admin socket serves callers in the namespaces of host process {pid}"
    );
    Ok(())
}

/// The container must show the host's whole cgroup v2 hierarchy: runtimes mount none on a
/// hybrid host, or only the container's own subtree.
fn check_cgroup2_mount(mountinfo: &str) -> Result<()> {
    const HOW: &str = "mount the host's hierarchy into the agent's container at the same \
                       path: -v /sys/fs/cgroup:/sys/fs/cgroup (on a hybrid host \
                       -v /sys/fs/cgroup/unified:/sys/fs/cgroup/unified)";
    let root = mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2").then(|| left.split_whitespace().nth(3))?
    });
    match root {
        None => bail!("no cgroup v2 hierarchy is mounted in the agent's container: {HOW}"),
        Some("/") => Ok(()),
        Some(sub) => bail!(
            "the cgroup v2 mount in the agent's container shows the subtree {sub}, not the \
             host's whole hierarchy: {HOW}"
        ),
    }
}

/// Warns when the agent looks containerised but was not told about the host.
pub fn warn_if_in_container() {
    for marker in ["/run/.containerenv", "/.dockerenv"] {
        if Path::new(marker).exists() {
            tracing::warn!(
                "the agent seems to run in a container ({marker} exists) but --host-process \
                 was not given: callers on the host (fgpu limit, the CDI hook) will be refused \
                 by the admin socket, as they are not in the agent's mount namespace. Give \
                 --host-process 1 (with --pid=host, --cgroupns=host)"
            );
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_host_is_in_the_initial_namespaces_or_says_so() {
        // On the CI machines the tests run in the initial PID and cgroup namespaces; adopting
        // our own process then succeeds. Elsewhere it fails, naming the missing option.
        match adopt(std::process::id()) {
            Ok(()) => assert!(host().unwrap().iter().all(Option::is_some)),
            Err(e) => {
                let e = e.to_string();
                assert!(
                    e.contains("--pid=host") || e.contains("--cgroupns=host"),
                    "{e}"
                );
            }
        }
        let err = ns("4000000000", "pid");
        assert!(err.is_err());
    }

    #[test]
    fn the_cgroup2_mount_must_be_the_whole_hierarchy() {
        let line = |root: &str| {
            format!("30 24 0:26 {root} /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n")
        };
        assert!(check_cgroup2_mount(&line("/")).is_ok());
        let err = check_cgroup2_mount(&line("/libpod_parent/libpod-1"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("subtree /libpod_parent/libpod-1") && err.contains("-v /sys/fs/cgroup"),
            "{err}"
        );
        let v1 = "87 80 0:46 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
        let err = check_cgroup2_mount(v1).unwrap_err().to_string();
        assert!(err.contains("no cgroup v2 hierarchy"), "{err}");
    }
}
