//! cgroup v2 paths as the kernel reports them, and the Kubernetes identity they carry.
//!
//! Paths here are relative to the cgroup v2 root and start with `/` (the form of
//! `/proc/PID/cgroup`): `/kubepods.slice/.../cri-containerd-<id>.scope`.

use std::path::PathBuf;
/// The mount point of the first cgroup2 file system in a mountinfo table.
pub fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // "<id> <parent> <maj:min> <root> <mount point> <opts> [optional...] - <fstype> ..."
        let (left, right) = line.split_once(" - ")?;
        let fstype = right.split_whitespace().next()?;
        let mount_point = left.split_whitespace().nth(4)?;
        (fstype == "cgroup2").then(|| PathBuf::from(unescape(mount_point)))
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup v2 path in the contents of a `/proc/PID/cgroup` file (the `0::` line).
///
/// On a hybrid host the file also lists v1 hierarchies; only the unified one is returned.
pub fn unified_path(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(|p| p.trim_end_matches(" (deleted)"))
        .filter(|p| p.starts_with('/'))
}

/// Kubernetes identity found in a cgroup path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeIdentity {
    /// The pod UID with dashes (`0d4f...-...`), as in the API server.
    pub pod_uid: String,
    /// The container runtime's container ID (64 hex digits), when the path goes that deep.
    pub container_id: Option<String>,
}

/// Reads the pod UID and container ID from a kubelet-made cgroup path, for both the
/// systemd driver (`kubepods-burstable-pod<uid_with_underscores>.slice`,
/// `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`) and the cgroupfs
/// driver (`/kubepods/burstable/pod<uid>/<id>`).
pub fn kube_identity(path: &str) -> Option<KubeIdentity> {
    let mut pod_uid = None;
    let mut container_id = None;
    for part in path.split('/') {
        if pod_uid.is_none() {
            if let Some(uid) = pod_segment(part) {
                pod_uid = Some(uid);
            }
            continue;
        }
        if let Some(id) = container_segment(part) {
            container_id = Some(id);
        }
    }
    pod_uid.map(|pod_uid| KubeIdentity {
        pod_uid,
        container_id,
    })
}

fn pod_segment(part: &str) -> Option<String> {
    let tail = match part.strip_suffix(".slice") {
        // systemd driver: kubepods-besteffort-pod<uid>.slice, kubepods-pod<uid>.slice
        Some(slice) => slice.rsplit_once("-pod")?.1.replace('_', "-"),
        // cgroupfs driver: pod<uid>
        None => part.strip_prefix("pod")?.to_string(),
    };
    is_uid(&tail).then_some(tail)
}

fn container_segment(part: &str) -> Option<String> {
    let id = match part.strip_suffix(".scope") {
        Some(scope) => scope.rsplit_once('-')?.1,
        None => part,
    };
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_string())
}

fn is_uid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| {
            matches!(i, 8 | 13 | 18 | 23) == (b == b'-') && (b == b'-' || b.is_ascii_hexdigit())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_unified_mount_on_hybrid_host() {
        let info = "25 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
                    26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid shared:5 - cgroup2 cgroup2 rw\n\
                    27 25 0:24 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
        assert_eq!(
            cgroup2_mount(info),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            cgroup2_mount("27 25 0:24 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw\n"),
            None
        );
        let spaced = "26 25 0:23 / /mnt/my\\040cg rw - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount(spaced), Some(PathBuf::from("/mnt/my cg")));
    }

    const UID: &str = "0d4f6a3c-1b2e-4c5d-8e9f-a0b1c2d3e4f5";
    const CID: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904aaaabbbbccccddddeeeeffff";

    #[test]
    fn unified_line_on_hybrid_host() {
        let content = "12:pids:/user.slice\n1:name=systemd:/user.slice\n0::/fgpu/job-1\n";
        assert_eq!(unified_path(content), Some("/fgpu/job-1"));
        assert_eq!(unified_path("0::/\n"), Some("/"));
        assert_eq!(unified_path("3:cpu:/x\n"), None);
        assert_eq!(unified_path("0::/gone (deleted)\n"), Some("/gone"));
    }

    #[test]
    fn kubelet_systemd_driver() {
        let path = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CID}.scope",
            UID.replace('-', "_")
        );
        let id = kube_identity(&path).unwrap();
        assert_eq!(id.pod_uid, UID);
        assert_eq!(id.container_id.as_deref(), Some(CID));
    }

    #[test]
    fn kubelet_cgroupfs_driver() {
        let path = format!("/kubepods/besteffort/pod{UID}/{CID}");
        let id = kube_identity(&path).unwrap();
        assert_eq!(id.pod_uid, UID);
        assert_eq!(id.container_id.as_deref(), Some(CID));
        let pod_only = kube_identity(&format!("/kubepods/pod{UID}")).unwrap();
        assert_eq!(pod_only.container_id, None);
    }

    #[test]
    fn not_kubernetes() {
        assert_eq!(kube_identity("/system.slice/docker-abc.scope"), None);
        assert_eq!(kube_identity("/fgpu/podcast"), None);
    }
}
