//! Finding a pod's cgroup from its UID, as the kubelet names it: for the systemd driver
//! `kubepods.slice/[kubepods-QOS.slice/]kubepods-[QOS-]pod<uid with '_'>.slice`, for the
//! cgroupfs driver `kubepods/[QOS/]pod<uid>`, QOS being burstable or besteffort (guaranteed
//! pods sit directly under kubepods). All six forms are tried.

use std::path::Path;

/// Whether `uid` is a Kubernetes UID (what the API server gives: hex digits and dashes).
pub fn valid_uid(uid: &str) -> bool {
    !uid.is_empty() && uid.len() <= 64 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// The candidate cgroup paths (relative to `parent`, itself relative to the v2 root) of the
/// pod with `uid`, most common first.
pub fn candidates(parent: &str, uid: &str) -> Vec<String> {
    let base = parent.trim_end_matches('/');
    let u = uid.replace('-', "_");
    vec![
        format!("{base}/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice"),
        format!("{base}/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice"),
        format!("{base}/kubepods.slice/kubepods-pod{u}.slice"),
        format!("{base}/kubepods/burstable/pod{uid}"),
        format!("{base}/kubepods/besteffort/pod{uid}"),
        format!("{base}/kubepods/pod{uid}"),
    ]
}

/// The pod's cgroup (relative to the v2 root, with a leading '/'), if it exists now.
pub fn find(mount: &Path, parent: &str, uid: &str) -> Option<String> {
    if !valid_uid(uid) {
        return None;
    }
    candidates(parent, uid).into_iter().find(|rel| {
        mount
            .join(rel.trim_start_matches('/'))
            .join("cgroup.procs")
            .is_file()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_drivers_and_qos_classes() {
        let uid = "0c3d6f1e-2b4a-4c8e-9f00-123456789abc";
        let mount = std::env::temp_dir().join(format!("fgpu-podcg-{}", std::process::id()));
        for rel in candidates("/", uid) {
            let dir = mount.join(rel.trim_start_matches('/'));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cgroup.procs"), b"").unwrap();
            assert_eq!(find(&mount, "/", uid).as_deref(), Some(rel.as_str()));
            let id = fgpu_common::cgroup::kube_identity(&rel).unwrap();
            assert_eq!(
                id.pod_uid, uid,
                "the status side reads back the same pod: {rel}"
            );
            std::fs::remove_dir_all(
                mount.join(rel.trim_start_matches('/').split('/').next().unwrap()),
            )
            .unwrap();
        }
        assert_eq!(find(&mount, "/", uid), None);
        assert_eq!(find(&mount, "/", "../../etc"), None);
        assert!(!valid_uid("a/b"));
        let _ = std::fs::remove_dir_all(&mount);
    }
}
