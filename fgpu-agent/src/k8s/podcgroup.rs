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
/// pod with `uid`, most common first. `parent` is the kubelet's `cgroupRoot`: under the
/// cgroupfs driver the pod is `parent/kubepods/[QOS/]pod<uid>`; under the systemd driver
/// the kubelet turns the whole name — cgroupRoot's parts, then `kubepods`, QOS, `pod<uid>` —
/// into nested slices, each named by the parts so far joined with '-'
/// (pkg/kubelet/cm/cgroup_manager_linux.go, `ToSystemd`): with cgroupRoot `/kubelet` (kind)
/// `kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/
/// kubelet-kubepods-burstable-pod<uid>.slice`, and with `/` the slices are at the root.
pub fn candidates(parent: &str, uid: &str) -> Vec<String> {
    let base = parent.trim_end_matches('/');
    let u = uid.replace('-', "_");
    let root: Vec<&str> = base.split('/').filter(|p| !p.is_empty()).collect();
    let systemd = |qos: Option<&str>| {
        let pod = format!("pod{u}");
        let mut parts: Vec<&str> = root.clone();
        parts.push("kubepods");
        parts.extend(qos);
        parts.push(&pod);
        let mut path = String::new();
        for i in 1..=parts.len() {
            path.push('/');
            path.push_str(&parts[..i].join("-"));
            path.push_str(".slice");
        }
        path
    };
    let mut v = vec![
        systemd(Some("burstable")),
        systemd(Some("besteffort")),
        systemd(None),
        format!("{base}/kubepods/burstable/pod{uid}"),
        format!("{base}/kubepods/besteffort/pod{uid}"),
        format!("{base}/kubepods/pod{uid}"),
    ];
    if !root.is_empty() {
        // A cgroupfs-style parent given to the systemd driver's slices (as before).
        v.extend([
            format!(
                "{base}/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice"
            ),
            format!(
                "{base}/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice"
            ),
            format!("{base}/kubepods.slice/kubepods-pod{u}.slice"),
        ]);
    }
    v
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
        // kind: the systemd driver with cgroupRoot /kubelet.
        let kind = format!(
            "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/\
             kubelet-kubepods-besteffort-pod{}.slice",
            uid.replace('-', "_")
        );
        assert!(
            candidates("/kubelet", uid).contains(&kind),
            "{:?}",
            candidates("/kubelet", uid)
        );
        let dir = mount.join(kind.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup.procs"), b"").unwrap();
        assert_eq!(
            find(&mount, "/kubelet", uid).as_deref(),
            Some(kind.as_str())
        );
        assert_eq!(
            fgpu_common::cgroup::kube_identity(&kind).unwrap().pod_uid,
            uid,
            "the status side reads back the same pod"
        );
        assert_eq!(find(&mount, "/", "../../etc"), None);
        assert!(!valid_uid("a/b"));
        let _ = std::fs::remove_dir_all(&mount);
    }
}
