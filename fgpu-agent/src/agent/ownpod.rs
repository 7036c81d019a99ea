//! The agent's own Kubernetes pod (`fgpu agent --admin-own-pod`): the other containers of
//! the pod the agent runs in may use the admin socket from their own mount namespaces.
//!
//! In the Helm chart's DaemonSet the kubelet plugin (`fgpu kubelet-plugin`) is a second
//! container of the agent's pod: `hostPID` is a pod setting, so it shares the host's PID
//! namespace, but every container has a mount namespace of its own, and the admin door
//! (which serves callers in the host's PID, mount and user namespaces, `super::peer`) refused
//! every claim it prepared. So did `kubectl exec -c agent -- fgpu limit ls`.
//!
//! Three ways were weighed (issue 26): the claim logic inside the agent process (one process
//! that is both a node daemon and a gRPC server for the kubelet; a hung agent then also
//! stalls the kubelet's calls, and the plugin could no longer be restarted on its own); a
//! helper forked into the host's mount namespace for each call (`setns` needs a
//! single-threaded caller, so a child process, and the binary it runs must exist on the
//! host's filesystem); or a door for the pod's own containers, told apart by the kernel.
//! This is the third: a caller is of the agent's pod when the cgroup the kernel reports for
//! its process (read through its pidfd, `super::peer`) is a container directly under the
//! pod cgroup the agent's own container is in. Cgroup membership is set by the kubelet and
//! the container runtime; a tenant cannot move a process of its own into another pod's
//! cgroup (its cgroupfs is read-only, and writing `cgroup.procs` needs write access to the
//! common ancestor). The caller must still share the host's PID and user namespaces (the
//! pod is `hostPID`; a user namespace would make its root somebody else) and still pass
//! the door's uid/group check.

use std::sync::OnceLock;

use anyhow::{Result, bail};

/// The pod cgroup the agent's container is in (a path as the host names it).
static POD: OnceLock<String> = OnceLock::new();

/// Takes the pod of the agent's own cgroup `own` as the one whose containers the admin door
/// serves. Refuses a cgroup that is not a container of a kubelet-made pod.
pub fn adopt(own: &str) -> Result<()> {
    let pod = pod_of(own)?;
    tracing::info!(
        pod_cgroup = %pod,
        "the admin socket also serves the other containers of the agent's own pod"
    );
    if POD.set(pod).is_err() {
        bail!("the agent's pod was already set");
    }
    Ok(())
}

/// The pod cgroup of container cgroup `own`, or why it is not one.
fn pod_of(own: &str) -> Result<String> {
    let (parent, leaf) = own.rsplit_once('/').unwrap_or(("", own));
    // The parent must be the pod's own cgroup (`…/kubepods…/pod<uid>`,
    // `kubepods-…-pod<uid>.slice`): a cgroup further below a container is not one.
    let parent_is_pod = fgpu_common::cgroup::naming::identity(parent)
        .pod
        .is_some_and(|pod| pod.cgroup == parent);
    if !parent_is_pod || leaf.is_empty() {
        bail!(
            "--admin-own-pod: the agent's cgroup {own} is not a container of a Kubernetes pod \
             (kubepods…/pod<uid>/<container>, or the systemd driver's \
             kubepods-…-pod<uid>.slice/<runtime>-<id>.scope); give it only in the DaemonSet"
        );
    }
    Ok(parent.to_string())
}

/// Whether `cgroup` is a container of the agent's own pod (never when `--admin-own-pod` was
/// not given).
pub fn contains(cgroup: &str) -> bool {
    POD.get().is_some_and(|pod| in_pod(pod, cgroup))
}

fn in_pod(pod: &str, cgroup: &str) -> bool {
    cgroup
        .strip_prefix(pod)
        .and_then(|rest| rest.strip_prefix('/'))
        .is_some_and(|leaf| !leaf.is_empty() && !leaf.contains('/') && leaf != ".." && leaf != ".")
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0c3d6f1e-2b4a-4c8e-9f00-123456789abc";
    const CID: &str = "4f1c0b9e8d7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c";

    #[test]
    fn the_pod_of_a_container_under_either_driver() {
        let cgroupfs = format!("/kubepods/burstable/pod{UID}/{CID}");
        assert_eq!(
            pod_of(&cgroupfs).unwrap(),
            format!("/kubepods/burstable/pod{UID}")
        );
        let u = UID.replace('-', "_");
        let pod =
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice");
        let systemd = format!("{pod}/cri-containerd-{CID}.scope");
        assert_eq!(pod_of(&systemd).unwrap(), pod);
        // A host service, a pod cgroup itself, a cgroup below a container: refused.
        for bad in [
            "/system.slice/fgpu.service".to_string(),
            format!("/kubepods/burstable/pod{UID}"),
            format!("/kubepods/burstable/pod{UID}/{CID}/sub"),
            "/".to_string(),
        ] {
            let err = pod_of(&bad).unwrap_err().to_string();
            assert!(
                err.contains("not a container of a Kubernetes pod"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn only_containers_directly_in_the_pod_belong_to_it() {
        let pod = format!("/kubepods/burstable/pod{UID}");
        assert!(in_pod(&pod, &format!("{pod}/{CID}")));
        assert!(in_pod(&pod, &format!("{pod}/other")));
        // The pod itself, deeper cgroups, a sibling pod whose name starts the same, another
        // pod: not members.
        assert!(!in_pod(&pod, &pod));
        assert!(!in_pod(&pod, &format!("{pod}/{CID}/nested")));
        assert!(!in_pod(&pod, &format!("{pod}0/{CID}")));
        assert!(!in_pod(&pod, &format!("{pod}/")));
        assert!(!in_pod(
            &pod,
            "/kubepods/burstable/pod11111111-2222-3333-4444-555555555555/x"
        ));
        assert!(!in_pod(&pod, "/"));
    }
}
