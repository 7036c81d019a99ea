//! Labels of a cgroup's series: what its path says about the container in it, and label
//! values made safe for the exposition.
//!
//! Container runtimes name their cgroups after the container id, and the kubelet names pod
//! cgroups after the pod's UID, with either cgroup driver:
//!
//! | runtime | systemd driver | cgroupfs driver |
//! |---|---|---|
//! | docker | `/system.slice/docker-<id>.scope` | `/docker/<id>` |
//! | podman | `/machine.slice/libpod-<id>.scope` (also `libpod-conmon-<id>`) | `/libpod_parent/libpod-<id>` |
//! | containerd (CRI) | `.../cri-containerd-<id>.scope` | `.../<id>` under a pod |
//! | CRI-O | `.../crio-<id>.scope` | `.../crio-<id>` |
//! | kubelet pods | `/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_with_underscores>.slice` | `/kubepods/<qos>/pod<uid>` |
//!
//! The path does not say a pod's name or namespace, nor a container's name: those come from
//! the kubelet, not the cgroup tree, and are left out rather than guessed.

/// What a cgroup path says about the container in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerLabels {
    /// The runtime's container id (64 hex digits for docker, podman, containerd and CRI-O).
    pub container_id: Option<String>,
    /// The Kubernetes pod UID (with dashes), when the cgroup is under a kubelet pod cgroup.
    pub pod_uid: Option<String>,
    /// The runtime that named the container cgroup: docker, libpod, cri-containerd, crio.
    pub runtime: Option<&'static str>,
}

/// Prefixes of container cgroups, per runtime (systemd driver: `<prefix>-<id>.scope`).
const RUNTIMES: [(&str, &str); 5] = [
    ("docker-", "docker"),
    ("libpod-conmon-", "libpod"),
    ("libpod-", "libpod"),
    ("cri-containerd-", "cri-containerd"),
    ("crio-", "crio"),
];

/// Parses the container labels out of a cgroup v2 path (relative to the cgroup root).
pub fn parse(path: &str) -> ContainerLabels {
    let mut out = ContainerLabels::default();
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let kube = parts
        .first()
        .is_some_and(|p| *p == "kubepods" || *p == "kubepods.slice");
    for (i, part) in parts.iter().enumerate() {
        if kube && let Some(uid) = pod_uid(part) {
            out.pod_uid = Some(uid);
            continue;
        }
        let name = part.strip_suffix(".scope").unwrap_or(part);
        if let Some((id, runtime)) = RUNTIMES
            .iter()
            .find_map(|(prefix, rt)| name.strip_prefix(prefix).map(|id| (id, *rt)))
            && is_container_id(id)
        {
            out.container_id = Some(id.to_string());
            out.runtime = Some(runtime);
            continue;
        }
        // cgroupfs driver: `/docker/<id>`, `/libpod_parent/libpod-<id>` (above), and a bare
        // id right under a kubelet pod cgroup (containerd).
        let parent = i.checked_sub(1).map(|j| parts[j]);
        if is_container_id(name) {
            if parent == Some("docker") {
                out.container_id = Some(name.to_string());
                out.runtime = Some("docker");
            } else if kube && out.pod_uid.is_some() {
                out.container_id = Some(name.to_string());
            }
        }
    }
    out
}

/// `pod<uid>` (cgroupfs) or `kubepods-<qos>-pod<uid_with_underscores>.slice` (systemd).
fn pod_uid(part: &str) -> Option<String> {
    let name = part.strip_suffix(".slice").unwrap_or(part);
    let (_, uid) = name.rsplit_once("pod")?;
    let uid = uid.replace('_', "-");
    let shape = uid.len() == 36
        && uid.chars().enumerate().all(|(i, c)| {
            if matches!(i, 8 | 13 | 18 | 23) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        });
    shape.then_some(uid)
}

fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Longest label value exported; longer ones are cut (on a character boundary).
const MAX_VALUE: usize = 512;

/// A label value as exported: the exposition does not escape, so `\`, `"` and control
/// characters (a cgroup's name may hold a newline) become `_`, and long values are cut.
pub fn value(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(MAX_VALUE));
    for c in s.chars() {
        if out.len() + c.len_utf8() > MAX_VALUE {
            break;
        }
        out.push(if c == '\\' || c == '"' || c.is_control() {
            '_'
        } else {
            c
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const UID: &str = "3f1c2a4b-5d6e-4f70-8a9b-0c1d2e3f4a5b";

    #[test]
    fn docker_and_podman_with_either_driver() {
        for (path, rt) in [
            (format!("/system.slice/docker-{ID}.scope"), "docker"),
            (format!("/docker/{ID}"), "docker"),
            (format!("/machine.slice/libpod-{ID}.scope"), "libpod"),
            (
                format!("/machine.slice/libpod-{ID}.scope/container"),
                "libpod",
            ),
            (format!("/libpod_parent/libpod-{ID}"), "libpod"),
        ] {
            let l = parse(&path);
            assert_eq!(l.container_id.as_deref(), Some(ID), "{path}");
            assert_eq!(l.runtime, Some(rt), "{path}");
            assert_eq!(l.pod_uid, None, "{path}");
        }
    }

    #[test]
    fn kubelet_pods_with_either_driver() {
        let under = UID.replace('-', "_");
        let systemd = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{under}.slice/cri-containerd-{ID}.scope"
        );
        let l = parse(&systemd);
        assert_eq!(l.pod_uid.as_deref(), Some(UID));
        assert_eq!(l.container_id.as_deref(), Some(ID));
        assert_eq!(l.runtime, Some("cri-containerd"));
        let crio = format!("/kubepods.slice/kubepods-pod{under}.slice/crio-{ID}.scope");
        assert_eq!(parse(&crio).runtime, Some("crio"));
        let cgroupfs = format!("/kubepods/besteffort/pod{UID}/{ID}");
        let l = parse(&cgroupfs);
        assert_eq!(l.pod_uid.as_deref(), Some(UID));
        assert_eq!(l.container_id.as_deref(), Some(ID));
        assert_eq!(l.runtime, None);
        // The pod cgroup itself: a pod, no container.
        let pod = parse(&format!("/kubepods/pod{UID}"));
        assert_eq!(pod.pod_uid.as_deref(), Some(UID));
        assert_eq!(pod.container_id, None);
    }

    #[test]
    fn anything_else_says_nothing() {
        for path in [
            "/",
            "/fgpu/job-1",
            "/user.slice/user-0.slice/session-3.scope",
            "/system.slice/docker-short.scope",
            &format!("/elsewhere/{ID}"),
            &format!("/elsewhere/pod{UID}"),
        ] {
            assert_eq!(parse(path), ContainerLabels::default(), "{path}");
        }
    }

    #[test]
    fn label_values_cannot_break_the_exposition() {
        assert_eq!(value("/a\"b\\c\nd}"), "/a_b_c_d}");
        assert_eq!(value("/ok-é"), "/ok-é");
        let long = "é".repeat(1000);
        let v = value(&long);
        assert!(v.len() <= MAX_VALUE && v.chars().all(|c| c == 'é'));
    }
}
