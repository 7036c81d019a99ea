//! Which Kubernetes pod a cgroup belongs to, for `fgpu status`: the pod UID from the
//! kubelet's cgroup naming (systemd and cgroupfs drivers, every QoS class), and its namespace
//! and name from the claims the DRA plugin prepared (its checkpoints in the agent's state
//! directory: the claim's namespace, the pod's name from `status.reservedFor`). Pods without
//! an fgpu claim (the device-plugin path, or none at all) show their UID.

use std::collections::HashMap;
use std::path::Path;

use super::checkpoint::Checkpoint;
use super::podcgroup::valid_uid;

/// The pod UID in a cgroup path (relative to the v2 root), if it is in a pod's cgroup:
/// `…/kubepods-burstable-pod<uid with _>.slice/…` (systemd) or `…/kubepods/…/pod<uid>/…`
/// (cgroupfs).
pub fn pod_uid(cgroup: &str) -> Option<String> {
    let mut in_kubepods = false;
    for part in cgroup.split('/') {
        if part == "kubepods" || part.starts_with("kubepods.slice") {
            in_kubepods = true;
            continue;
        }
        if !in_kubepods {
            continue;
        }
        let uid = if let Some(rest) = part.strip_suffix(".slice") {
            // kubepods-pod<u>.slice, kubepods-burstable-pod<u>.slice, …
            rest.rsplit_once("-pod").map(|(_, u)| u.replace('_', "-"))
        } else {
            part.strip_prefix("pod").map(str::to_string)
        };
        if let Some(u) = uid.filter(|u| valid_uid(u) && u.len() >= 32) {
            return Some(u);
        }
    }
    None
}

/// `namespace/name` of every pod an fgpu claim was prepared for, by pod UID, from the
/// plugin checkpoints (`kubelet-plugin-*.json`) in `state_dir`. Unreadable files are skipped
/// (status never fails for them).
pub fn pod_names(state_dir: &Path) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir(state_dir) else {
        return out;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with("kubelet-plugin-") && name.ends_with(".json")) {
            continue;
        }
        let Ok(ckpt) = Checkpoint::load(&e.path()) else {
            continue;
        };
        for p in ckpt.claims.values() {
            for uid in &p.plan.pods {
                if let Some(pod) = p.plan.pod_names.get(uid) {
                    out.insert(uid.clone(), format!("{}/{pod}", p.plan.namespace));
                }
            }
        }
    }
    out
}

/// What `fgpu status` shows for a cgroup's pod: `namespace/name`, or `pod <uid>` when no
/// claim names it; `None` outside pods.
pub fn describe(cgroup: &str, names: &HashMap<String, String>) -> Option<String> {
    let uid = pod_uid(cgroup)?;
    Some(names.get(&uid).cloned().unwrap_or(format!("pod {uid}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::checkpoint::Prepared;
    use crate::k8s::claim::tests::claim_json;

    const UID: &str = "0c3d6f1e-2b4a-4c8e-9f00-00000000000a";

    #[test]
    fn pod_uids_come_from_both_cgroup_drivers_and_every_qos_class() {
        let u = UID.replace('-', "_");
        for path in [
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice"),
            format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/cri-containerd-abc.scope"
            ),
            format!("/kubepods.slice/kubepods-pod{u}.slice/crio-abc.scope"),
            format!("/kubepods/burstable/pod{UID}/0123abcd"),
            format!("/kubepods/pod{UID}"),
            format!("/fgpu-k8s-1/kubepods/besteffort/pod{UID}/ctr"),
        ] {
            assert_eq!(pod_uid(&path).as_deref(), Some(UID), "{path}");
        }
        for path in [
            "/system.slice/docker-abc.scope".to_string(),
            format!("/pod{UID}"),                    // not under kubepods
            "/kubepods/burstable/podnotauid".into(), // not a UID
            "/kubepods.slice/kubepods-burstable.slice".into(),
        ] {
            assert_eq!(pod_uid(&path), None, "{path}");
        }
    }

    #[test]
    fn names_come_from_the_plugins_checkpoints_and_bad_files_are_skipped() {
        let dir = std::env::temp_dir().join(format!("fgpu-identity-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut ckpt = Checkpoint::load(&dir.join("kubelet-plugin-fgpu.io.json")).unwrap();
        let json = claim_json("c1", "claim-1", "8Gi", "30", &[UID]);
        let claim = serde_json::from_str(&json).unwrap();
        let plan = crate::k8s::claim::plan(&claim, "fgpu.io", "c1")
            .unwrap()
            .unwrap();
        let prepared = Prepared {
            plan,
            cdi_ids: vec![],
            spec_file: dir.join("spec.json"),
        };
        ckpt.claims.insert("c1".into(), prepared);
        ckpt.save().unwrap();
        std::fs::write(dir.join("kubelet-plugin-broken.json"), b"{not json").unwrap();
        let names = pod_names(&dir);
        let want = format!("team-a/pod-{UID}");
        assert_eq!(names.get(UID), Some(&want));
        let path = format!("/kubepods/besteffort/pod{UID}/ctr");
        assert_eq!(describe(&path, &names), Some(want));
        let other = "/kubepods/besteffort/pod11111111-2222-3333-4444-555555555555";
        assert_eq!(
            describe(other, &names).as_deref(),
            Some("pod 11111111-2222-3333-4444-555555555555")
        );
        assert_eq!(describe("/system.slice/x", &names), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
