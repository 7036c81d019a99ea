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
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0d4f.slice/cri-containerd-{ID}.scope"
            ),
            Runtime::Containerd,
        ),
        (
            format!("/kubepods.slice/kubepods-pod1.slice/crio-{ID}.scope"),
            Runtime::CriO,
        ),
        (
            format!("/kubepods/burstable/pod{UID}/crio-{ID}"),
            Runtime::CriO,
        ),
        (
            format!("/kubepods/burstable/pod0d4f/{ID}"),
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
    assert_eq!(c.1, inner, "the innermost container");
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
    assert_eq!((p.uid.as_str(), p.qos), (UID, Some(Qos::Burstable)));
    assert_eq!(p.cgroup, pod, "the pod's own cgroup");
    assert_eq!(
        id.container,
        Some(Container {
            runtime: Runtime::Containerd,
            id: ID.into()
        })
    );
    let crio = identity(&format!(
        "/kubepods.slice/kubepods-pod{under}.slice/crio-{ID}.scope"
    ));
    assert_eq!(crio.container.unwrap().runtime, Runtime::CriO);
    assert_eq!(crio.pod.unwrap().qos, Some(Qos::Guaranteed));
    let cgroupfs = identity(&format!("/kubepods/besteffort/pod{UID}/{ID}"));
    let p = cgroupfs.pod.unwrap();
    assert_eq!((p.uid.as_str(), p.qos), (UID, Some(Qos::BestEffort)));
    assert_eq!(p.cgroup, format!("/kubepods/besteffort/pod{UID}"));
    assert_eq!(cgroupfs.container.unwrap().id, ID);
    // The pod cgroup itself: a pod, no container.
    let pod = identity(&format!("/kubepods/pod{UID}"));
    assert_eq!(pod.container, None);
    let p = pod.pod.unwrap();
    assert_eq!((p.uid.as_str(), p.qos), (UID, Some(Qos::Guaranteed)));
}

#[test]
fn pod_uids_come_from_both_cgroup_drivers_and_every_qos_class() {
    let u = UID.replace('-', "_");
    for (path, qos) in [
        (
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice"),
            Some(Qos::Burstable),
        ),
        (
            format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/cri-containerd-abc.scope"
            ),
            Some(Qos::BestEffort),
        ),
        (
            format!("/kubepods.slice/kubepods-pod{u}.slice/crio-abc.scope"),
            Some(Qos::Guaranteed),
        ),
        (
            format!("/kubepods/burstable/pod{UID}/0123abcd"),
            Some(Qos::Burstable),
        ),
        (format!("/kubepods/pod{UID}"), Some(Qos::Guaranteed)),
        // kubepods below the root: a kubelet cgroupRoot, a test's base cgroup.
        (
            format!("/fgpu-k8s-1/kubepods/besteffort/pod{UID}/ctr"),
            Some(Qos::BestEffort),
        ),
        (
            format!("/kubelet/kubepods.slice/kubepods-pod{u}.slice"),
            Some(Qos::Guaranteed),
        ),
        // kind: the systemd driver with cgroupRoot /kubelet.
        (
            format!(
                "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{u}.slice/cri-containerd-{ID}.scope"
            ),
            Some(Qos::BestEffort),
        ),
        (
            format!("/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{u}.slice"),
            Some(Qos::Guaranteed),
        ),
        // Not at a level the kubelet makes: a pod, of no known class.
        (format!("/kubepods/other/pod{UID}"), None),
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
    // A bare id is a container wherever it is (the metrics' own parser said nothing here;
    // status and `container:ID` targets always took it).
    assert_eq!(
        container(&format!("/elsewhere/{ID}")),
        Some((Runtime::Unknown, ID.to_string()))
    );
}

#[test]
fn containers_and_pods_each_innermost() {
    let u = UID.replace('-', "_");
    let node = ID.replace('1', "3");
    // kind's node is a docker container; its pods' containers are inside it.
    let path = format!(
        "/system.slice/docker-{node}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{u}.slice/cri-containerd-{ID}.scope"
    );
    let id = identity(&path);
    assert_eq!(id.container.unwrap().id, ID);
    let p = id.pod.unwrap();
    assert_eq!(p.uid, UID);
    assert_eq!(
        p.cgroup,
        format!(
            "/system.slice/docker-{node}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{u}.slice"
        )
    );
    // The node's pod cgroup: in the node's container.
    let id = identity(&p.cgroup);
    assert_eq!(id.container.unwrap().id, node);
    assert_eq!(id.pod.unwrap().uid, UID);
    // A pod of a kubelet inside a pod: the inner one.
    let inner = "11111111-2222-3333-4444-555555555555";
    let nested = format!("/kubepods/pod{UID}/{ID}/kubepods/besteffort/pod{inner}");
    assert_eq!(pod_uid(&nested).as_deref(), Some(inner));
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
            assert!(p.qos.is_some(), "{name}");
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
    assert_eq!(identity(&kind).pod.unwrap().qos, Some(Qos::BestEffort));
    assert!(pod_cgroups("/kubelet", uid).contains(&format!("/kubelet/kubepods/pod{uid}")));
}
