//! Every layout the agent's former parsers (`fgpu_common::container`,
//! `fgpu_common::cgroup::kube_identity`, the metrics labels, `k8s::identity`,
//! `k8s::podcgroup`) were tested on, and the ones only one of them knew.

use super::*;

const ID: &str = "1680a0a11e0451e16a18e6e26d2388dd84e39396d1c0f1352aca61c7177c1ed2";
const UID: &str = "0d4f6a3c-1b2e-4c5d-8e9f-a0b1c2d3e4f5";

fn container(path: &str) -> Option<(Runtime, String)> {
    identity(path).container.map(|c| (c.runtime, c.id))
}

fn pod_uid(path: &str) -> Option<String> {
    identity(path).pod.map(|p| p.uid)
}

#[test]
fn every_runtime_and_driver() {
    let cases = [
        (format!("/system.slice/docker-{ID}.scope"), Runtime::Docker),
        (format!("/docker/{ID}"), Runtime::Docker),
        (format!("/machine.slice/libpod-{ID}.scope"), Runtime::Podman),
        (
            format!("/machine.slice/libpod-{ID}.scope/container"),
            Runtime::Podman,
        ),
        (format!("/libpod_parent/libpod-{ID}"), Runtime::Podman),
        (
            format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{ID}.scope",
                UID.replace('-', "_")
            ),
            Runtime::Containerd,
        ),
        (
            format!(
                "/kubepods.slice/kubepods-pod{}.slice/crio-{ID}.scope",
                UID.replace('-', "_")
            ),
            Runtime::CriO,
        ),
        (
            format!("/kubepods/burstable/pod{UID}/crio-{ID}"),
            Runtime::CriO,
        ),
        (
            format!("/kubepods/burstable/pod{UID}/{ID}/worker"),
            Runtime::Unknown,
        ),
        (
            format!("/kubepods/besteffort/pod{UID}/{ID}"),
            Runtime::Unknown,
        ),
    ];
    for (path, runtime) in cases {
        let c = identity(&path)
            .container
            .unwrap_or_else(|| panic!("{path}"));
        assert_eq!((c.runtime, c.id.as_str()), (runtime, ID), "{path}");
        assert_eq!(c.short(), &ID[..12]);
    }
    let names: Vec<&str> = [
        Runtime::Docker,
        Runtime::Podman,
        Runtime::Containerd,
        Runtime::CriO,
        Runtime::Unknown,
    ]
    .map(Runtime::as_str)
    .to_vec();
    assert_eq!(
        names,
        ["docker", "podman", "containerd", "cri-o", "cgroupfs"]
    );
}

#[test]
fn monitors_and_lookalikes_are_not_containers() {
    for path in [
        format!("/machine.slice/libpod-conmon-{ID}.scope"),
        format!("/system.slice/crio-conmon-{ID}.scope"),
        "/libpod_parent/conmon".to_string(),
        format!("/docker/{}", &ID[..63]),
        format!("/docker/{}", ID.to_uppercase()),
        format!("/docker-{ID}x.scope"),
        "/system.slice/docker-short.scope".to_string(),
        "/".to_string(),
        String::new(),
    ] {
        assert_eq!(identity(&path).container, None, "{path}");
    }
}

#[test]
fn a_cgroup_inside_a_container_belongs_to_it() {
    let c = container(&format!("/libpod_parent/libpod-{ID}/worker")).unwrap();
    assert_eq!(c.1, ID);
    let inner = ID.replace('1', "2");
    let c = container(&format!("/docker/{ID}/docker/{inner}")).unwrap();
    assert_eq!(
        c.1, ID,
        "the outermost container: the inner one is its own making"
    );
    let c = identity(&format!("/machine.slice/libpod-{ID}.scope/container/x")).container;
    assert_eq!(
        c.unwrap().cgroup,
        format!("/machine.slice/libpod-{ID}.scope")
    );
}

#[test]
fn docker_and_podman_are_not_pods() {
    for path in [
        format!("/system.slice/docker-{ID}.scope"),
        format!("/docker/{ID}"),
        format!("/machine.slice/libpod-{ID}.scope"),
        format!("/libpod_parent/libpod-{ID}"),
    ] {
        assert_eq!(identity(&path).pod, None, "{path}");
    }
}

#[test]
fn kubelet_pods_with_either_driver() {
    let under = UID.replace('-', "_");
    let pod =
        format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{under}.slice");
    let id = identity(&format!("{pod}/cri-containerd-{ID}.scope"));
    let p = id.pod.unwrap();
    assert_eq!((p.uid.as_str(), p.qos), (UID, Qos::Burstable));
    assert_eq!(p.cgroup, pod, "the pod's own cgroup");
    assert_eq!(
        id.container,
        Some(Container {
            runtime: Runtime::Containerd,
            id: ID.into(),
            cgroup: format!("{pod}/cri-containerd-{ID}.scope"),
        })
    );
    let crio = identity(&format!(
        "/kubepods.slice/kubepods-pod{under}.slice/crio-{ID}.scope"
    ));
    assert_eq!(crio.container.unwrap().runtime, Runtime::CriO);
    assert_eq!(crio.pod.unwrap().qos, Qos::Guaranteed);
    let cgroupfs = identity(&format!("/kubepods/besteffort/pod{UID}/{ID}"));
    let p = cgroupfs.pod.unwrap();
    assert_eq!((p.uid.as_str(), p.qos), (UID, Qos::BestEffort));
    assert_eq!(p.cgroup, format!("/kubepods/besteffort/pod{UID}"));
    assert_eq!(cgroupfs.container.unwrap().id, ID);
    // The pod cgroup itself: a pod, no container.
    let pod = identity(&format!("/kubepods/pod{UID}"));
    assert_eq!(pod.container, None);
    let p = pod.pod.unwrap();
    assert_eq!((p.uid.as_str(), p.qos), (UID, Qos::Guaranteed));
}

#[test]
fn pod_uids_come_from_both_cgroup_drivers_and_every_qos_class() {
    let u = UID.replace('-', "_");
    for (path, qos) in [
        (
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice"),
            Qos::Burstable,
        ),
        (
            format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/cri-containerd-abc.scope"
            ),
            Qos::BestEffort,
        ),
        (
            format!("/kubepods.slice/kubepods-pod{u}.slice/crio-abc.scope"),
            Qos::Guaranteed,
        ),
        (
            format!("/kubepods/burstable/pod{UID}/0123abcd"),
            Qos::Burstable,
        ),
        (format!("/kubepods/pod{UID}"), Qos::Guaranteed),
        // kubepods below the root: a kubelet cgroupRoot, a test's base cgroup.
        (
            format!("/fgpu-k8s-1/kubepods/besteffort/pod{UID}/ctr"),
            Qos::BestEffort,
        ),
        (
            format!("/kubelet/kubepods.slice/kubepods-pod{u}.slice"),
            Qos::Guaranteed,
        ),
        // kind: the systemd driver with cgroupRoot /kubelet.
        (
            format!(
                "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{u}.slice/cri-containerd-{ID}.scope"
            ),
            Qos::BestEffort,
        ),
        (
            format!("/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{u}.slice"),
            Qos::Guaranteed,
        ),
    ] {
        let p = identity(&path).pod.unwrap_or_else(|| panic!("{path}"));
        assert_eq!((p.uid.as_str(), p.qos), (UID, qos), "{path}");
    }
    for path in [
        "/system.slice/docker-abc.scope".to_string(),
        format!("/pod{UID}"),                    // not under kubepods
        format!("/elsewhere/pod{UID}"),          // nor this
        format!("/a.slice/a-pod{u}.slice"),      // nor this
        "/kubepods/burstable/podnotauid".into(), // not a UID
        "/kubepods/burstable/pod0123".into(),    // too short for one
        "/kubepods.slice/kubepods-burstable.slice".into(),
        "/kubepods".into(),
        format!("/kubepods/other/pod{UID}"), // not at a level the kubelet makes
        format!("/kubepods/burstable/x/pod{UID}"), // nor this
        format!("/kubepods.slice/kubepods-burstable.slice/kubepods-besteffort-pod{u}.slice"),
        format!("/kubepods.slice/other-pod{u}.slice"),
        format!("/system.slice/x.service/kubepods/pod{UID}"), // a unit's own subtree
        "/fgpu/podcast".into(),
        "/fgpu/job-1".into(),
        "/user.slice/user-0.slice/session-3.scope".into(),
    ] {
        assert_eq!(identity(&path).pod, None, "{path}");
    }
}

#[test]
fn static_pods_have_hash_uids() {
    // The kubelet names static pods by an md5 hash: 32 hex digits, no dashes.
    let hash = "5e2d3b3a1c0f4e6d8a9b7c6d5e4f3a2b";
    let path =
        format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{hash}.slice");
    assert_eq!(pod_uid(&path).as_deref(), Some(hash));
    assert_eq!(
        pod_uid(&format!("/kubepods/pod{hash}/x")).as_deref(),
        Some(hash)
    );
}

#[test]
fn anything_else_says_nothing() {
    for path in [
        "/",
        "/fgpu/job-1",
        "/user.slice/user-0.slice/session-3.scope",
        "/system.slice/docker-short.scope",
        &format!("/elsewhere/pod{UID}"),
    ] {
        assert_eq!(identity(path), Identity::default(), "{path}");
    }
    // A bare id, or a runtime's name, only where its runtime puts it.
    for path in [
        format!("/elsewhere/{ID}"),
        format!("/fgpu/job-1/{ID}"),
        format!("/docker-{ID}.scope"),
        format!("/fgpu/job-1/docker-{ID}.scope"),
        format!("/system.slice/x.service/docker/{ID}"),
        format!("/system.slice/x.service/a.slice/docker-{ID}.scope"),
        format!("/kubepods/besteffort/{ID}"),
    ] {
        assert_eq!(identity(&path), Identity::default(), "{path}");
    }
}

#[test]
fn containers_and_pods_each_outermost() {
    let u = UID.replace('-', "_");
    let node = ID.replace('1', "3");
    // A kubelet inside a docker container (kind's node, seen from the host): its pods are
    // the container's own making.
    let path = format!(
        "/system.slice/docker-{node}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{u}.slice/cri-containerd-{ID}.scope"
    );
    let id = identity(&path);
    assert_eq!(id.container.unwrap().id, node);
    assert_eq!(id.pod, None);
    // A kubelet inside a pod: the outer pod and its container.
    let inner = "11111111-2222-3333-4444-555555555555";
    let nested = format!("/kubepods/pod{UID}/{ID}/kubepods/besteffort/pod{inner}");
    assert_eq!(pod_uid(&nested).as_deref(), Some(UID));
}

/// A tenant may name cgroups in its own subtree as it likes; none of them is another pod or
/// container.
#[test]
fn a_tenants_look_alikes_name_the_tenant() {
    let victim_uid = "0c3d6f1e-2b4a-4c8e-9f00-123456789abc";
    let victim_id = ID.replace('1', "9");
    let v = victim_uid.replace('-', "_");
    let u = UID.replace('-', "_");
    let fakes = [
        format!("kubepods/besteffort/pod{victim_uid}/{victim_id}"),
        format!("kubepods/pod{victim_uid}/crio-{victim_id}/container"),
        format!(
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{v}.slice/cri-containerd-{victim_id}.scope"
        ),
        format!("docker/{victim_id}"),
        format!("system.slice/docker-{victim_id}.scope"),
        format!("libpod_parent/libpod-{victim_id}"),
        victim_id.clone(),
    ];
    let tenants = [
        (
            format!("/kubepods/besteffort/pod{UID}/{ID}"),
            Some(UID),
            Some(ID),
        ),
        (
            format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/crio-{ID}.scope/container"
            ),
            Some(UID),
            Some(ID),
        ),
        (
            format!("/kubelet/kubepods/pod{UID}/not-a-container"),
            Some(UID),
            None,
        ),
        (format!("/system.slice/docker-{ID}.scope"), None, Some(ID)),
        (format!("/docker/{ID}"), None, Some(ID)),
        ("/system.slice/job.service".to_string(), None, None),
        (
            "/user.slice/user-0.slice/user@0.service/app.slice".into(),
            None,
            None,
        ),
    ];
    for (tenant, pod, container) in &tenants {
        for fake in &fakes {
            let path = format!("{tenant}/{fake}");
            let id = identity(&path);
            assert_eq!(id.pod.map(|p| p.uid).as_deref(), *pod, "{path}");
            assert_eq!(id.container.map(|c| c.id).as_deref(), *container, "{path}");
        }
    }
}

#[test]
fn uids_that_fit_a_name() {
    assert!(pod_uid_fits("aa"));
    assert!(pod_uid_fits(UID));
    assert!(!pod_uid_fits("a/b"));
    assert!(!pod_uid_fits("../x"));
    assert!(!pod_uid_fits(""));
    assert!(!pod_uid_fits(&"a".repeat(65)));
    assert!(is_pod_uid(UID) && is_pod_uid(&UID.replace('-', "")));
    assert!(!is_pod_uid("0c3d6f1e-2b4a"));
}

#[test]
fn every_name_the_kubelet_may_give_a_pod_reads_back_as_that_pod() {
    let uid = "0c3d6f1e-2b4a-4c8e-9f00-123456789abc";
    for root in ["/", "", "/kubelet", "/kubelet/", "/a/b"] {
        let names = pod_cgroups(root, uid);
        assert_eq!(
            names.len(),
            if root.trim_matches('/').is_empty() {
                6
            } else {
                9
            },
            "{root}: {names:?}"
        );
        for name in &names {
            let p = identity(name).pod.unwrap_or_else(|| panic!("{name}"));
            assert_eq!(p.uid, uid, "{name}");
            assert_eq!(&p.cgroup, name, "{name}");
            assert_eq!(identity(name).container, None, "{name}");
        }
    }
    let u = uid.replace('-', "_");
    // The root's systemd forms are at the root; kind's carry its prefix.
    assert_eq!(
        pod_cgroups("/", uid)[0],
        format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice")
    );
    assert_eq!(pod_cgroups("/", uid)[5], format!("/kubepods/pod{uid}"));
    let kind = format!(
        "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/\
         kubelet-kubepods-besteffort-pod{u}.slice"
    );
    assert!(pod_cgroups("/kubelet", uid).contains(&kind));
    assert_eq!(identity(&kind).pod.unwrap().qos, Qos::BestEffort);
    assert!(pod_cgroups("/kubelet", uid).contains(&format!("/kubelet/kubepods/pod{uid}")));
}
