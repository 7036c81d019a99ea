//! Finding a pod's cgroup from its UID: the first of the names the kubelet may have given it
//! ([`naming::pod_cgroups`]: either cgroup driver, every QoS class, below the kubelet's
//! cgroupRoot) that exists on this node.

use std::path::Path;

use fgpu_common::cgroup::naming;

/// The pod's cgroup (relative to the v2 root, with a leading '/'), if it exists now.
pub fn find(mount: &Path, parent: &str, uid: &str) -> Option<String> {
    if !naming::pod_uid_fits(uid) {
        return None;
    }
    naming::pod_cgroups(parent, uid).into_iter().find(|rel| {
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
        for rel in naming::pod_cgroups("/", uid) {
            let dir = mount.join(rel.trim_start_matches('/'));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cgroup.procs"), b"").unwrap();
            assert_eq!(find(&mount, "/", uid).as_deref(), Some(rel.as_str()));
            let pod = naming::identity(&rel).pod.unwrap();
            assert_eq!(
                pod.uid, uid,
                "the status side reads back the same pod: {rel}"
            );
            std::fs::remove_dir_all(
                mount.join(rel.trim_start_matches('/').split('/').next().unwrap()),
            )
            .unwrap();
        }
        assert_eq!(find(&mount, "/", uid), None);
        // kind: the systemd driver with cgroupRoot /kubelet.
        let kind = format!(
            "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/\
             kubelet-kubepods-besteffort-pod{}.slice",
            uid.replace('-', "_")
        );
        assert!(
            naming::pod_cgroups("/kubelet", uid).contains(&kind),
            "{:?}",
            naming::pod_cgroups("/kubelet", uid)
        );
        let dir = mount.join(kind.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup.procs"), b"").unwrap();
        assert_eq!(
            find(&mount, "/kubelet", uid).as_deref(),
            Some(kind.as_str())
        );
        assert_eq!(
            naming::identity(&kind).pod.unwrap().uid,
            uid,
            "the status side reads back the same pod"
        );
        assert_eq!(find(&mount, "/", "../../etc"), None);
        assert!(!naming::pod_uid_fits("a/b"));
        let _ = std::fs::remove_dir_all(&mount);
    }
}
