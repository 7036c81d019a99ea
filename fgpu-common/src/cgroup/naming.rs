//! What a cgroup v2 path says about who is in it: the container, the Kubernetes pod and its
//! QoS class, as container runtimes and the kubelet name their cgroups under either cgroup
//! driver; and the names the kubelet gives a pod's cgroup, to find it by the pod's UID. The
//! one rule set for the agent's status, its metrics, `fgpu top`, `container:ID` targets,
//! connection tenants and the kubelet plugin. Pure functions of the path.
//!
//! Containers (`<id>`: the runtime's container id, 64 lowercase hex digits):
//!
//! | runtime | systemd driver | cgroupfs driver |
//! |---|---|---|
//! | docker | `docker-<id>.scope` | `/docker/<id>` |
//! | podman | `libpod-<id>.scope` | `/libpod_parent/libpod-<id>` |
//! | containerd (CRI) | `cri-containerd-<id>.scope` | `…/pod<uid>/<id>` |
//! | CRI-O | `crio-<id>.scope` | `…/pod<uid>/crio-<id>` |
//!
//! A bare `<id>` directory is a container wherever it is (docker's under `/docker`, else of
//! a runtime the name does not tell: containerd in a pod under the cgroupfs driver, docker
//! with `--cgroup-parent`). The runtimes' monitor processes (`libpod-conmon-<id>`,
//! `crio-conmon-<id>`) are not containers. A cgroup below a container's belongs to it; the
//! innermost container counts.
//!
//! Pods: the kubelet makes a `kubepods` cgroup, below it one per QoS class (burstable,
//! besteffort; guaranteed pods sit directly under kubepods), below that `pod<uid>`:
//!
//! | QoS | systemd driver | cgroupfs driver |
//! |---|---|---|
//! | guaranteed | `kubepods.slice/kubepods-pod<u>.slice` | `kubepods/pod<uid>` |
//! | burstable | `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<u>.slice` | `kubepods/burstable/pod<uid>` |
//! | besteffort | `kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<u>.slice` | `kubepods/besteffort/pod<uid>` |
//!
//! `<u>` is the UID with `_` for `-` (systemd nests slices by `-`). Under a kubelet
//! `cgroupRoot` the cgroupfs names sit below it (`/kubelet/kubepods/…`), and the systemd
//! driver prefixes every slice with its parts (kind, cgroupRoot `/kubelet`:
//! `kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/
//! kubelet-kubepods-burstable-pod<u>.slice`; pkg/kubelet/cm/cgroup_manager_linux.go,
//! `ToSystemd`). A pod is recognised only below a kubepods cgroup (`kubepods`,
//! `kubepods.slice`, `<prefix>-kubepods.slice`), wherever that is in the path; a pod UID is
//! hex digits and dashes, 32 to 64 of them (a UUID, or a static pod's 32-digit hash). The
//! innermost pod counts.
//!
//! The path does not say a pod's namespace or name, nor a container's name: those are not
//! guessed here.

use std::fmt;

/// The container runtime whose naming a container cgroup follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Runtime {
    Docker,
    Podman,
    /// containerd's CRI plugin (Kubernetes).
    Containerd,
    CriO,
    /// A bare id directory whose runtime the name does not tell.
    Unknown,
}

impl Runtime {
    /// `docker`, `podman`, `containerd`, `cri-o`, or `cgroupfs` (unknown: a bare id).
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Docker => "docker",
            Runtime::Podman => "podman",
            Runtime::Containerd => "containerd",
            Runtime::CriO => "cri-o",
            Runtime::Unknown => "cgroupfs",
        }
    }
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A container found in a cgroup path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    pub runtime: Runtime,
    /// The full container id (64 hex digits).
    pub id: String,
}

impl Container {
    /// The first 12 digits, as `docker ps` and `podman ps` show ids.
    pub fn short(&self) -> &str {
        &self.id[..12]
    }
}

/// A pod's Kubernetes QoS class, from the level of the kubelet's cgroup tree it is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl Qos {
    /// `guaranteed`, `burstable`, `besteffort` (as the kubelet names the levels).
    pub fn as_str(self) -> &'static str {
        match self {
            Qos::Guaranteed => "guaranteed",
            Qos::Burstable => "burstable",
            Qos::BestEffort => "besteffort",
        }
    }
}

/// A Kubernetes pod found in a cgroup path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    /// The pod UID with dashes, as the API server has it.
    pub uid: String,
    /// `None` where the pod's cgroup is not at a QoS level the kubelet makes.
    pub qos: Option<Qos>,
    /// The pod's own cgroup: the path up to the pod's name (`/a/b`, no trailing `/`).
    pub cgroup: String,
}

/// Who a cgroup belongs to, by its path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    pub container: Option<Container>,
    pub pod: Option<Pod>,
}

/// What cgroup path `path` (relative to the v2 root, `/a/b/...`) says of its container and
/// pod (see the module documentation).
pub fn identity(path: &str) -> Identity {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let mut out = Identity::default();
    let mut in_kubepods = false;
    for (i, part) in parts.iter().enumerate() {
        let parent = i.checked_sub(1).map(|p| parts[p]);
        if let Some(c) = container_segment(part, parent) {
            out.container = Some(c);
        } else if is_kubepods(part) {
            in_kubepods = true;
        } else if in_kubepods && let Some((uid, qos)) = pod_segment(part, parent) {
            let cgroup = format!("/{}", parts[..=i].join("/"));
            out.pod = Some(Pod { uid, qos, cgroup });
        }
    }
    out
}

/// The container whose cgroup `segment` (one path component, below `parent`) is, if it is
/// one.
pub fn container_segment(segment: &str, parent: Option<&str>) -> Option<Container> {
    const SCOPES: [(&str, Runtime); 4] = [
        ("docker-", Runtime::Docker),
        ("libpod-", Runtime::Podman),
        ("cri-containerd-", Runtime::Containerd),
        ("crio-", Runtime::CriO),
    ];
    let stem = segment.strip_suffix(".scope").unwrap_or(segment);
    for (prefix, runtime) in SCOPES {
        if let Some(id) = stem.strip_prefix(prefix)
            && is_container_id(id)
        {
            return Some(Container {
                runtime,
                id: id.to_string(),
            });
        }
    }
    if is_container_id(segment) {
        let runtime = match parent {
            Some("docker") => Runtime::Docker,
            _ => Runtime::Unknown,
        };
        return Some(Container {
            runtime,
            id: segment.to_string(),
        });
    }
    None
}

/// 64 lowercase hex digits.
pub fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether `uid` may be put in a pod cgroup's name: hex digits and dashes, at most 64 (no
/// `/`, no `..`). What the kubelet plugin accepts from the API server.
pub fn pod_uid_fits(uid: &str) -> bool {
    !uid.is_empty() && uid.len() <= 64 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// Whether `s` is a pod UID as the kubelet names pods by: [`pod_uid_fits`], and at least 32
/// characters (a UUID; a static pod's md5 hash).
pub fn is_pod_uid(s: &str) -> bool {
    pod_uid_fits(s) && s.len() >= 32
}

/// `kubepods` (cgroupfs), `kubepods.slice` or `<cgroupRoot parts>-kubepods.slice` (systemd).
fn is_kubepods(segment: &str) -> bool {
    segment == "kubepods"
        || segment
            .strip_suffix(".slice")
            .is_some_and(|s| s == "kubepods" || s.ends_with("-kubepods"))
}

/// The UID and QoS class of pod cgroup `segment`: `…-pod<u>.slice` (systemd) or `pod<uid>`
/// (cgroupfs, its QoS class from `parent`).
fn pod_segment(segment: &str, parent: Option<&str>) -> Option<(String, Option<Qos>)> {
    let (uid, qos) = match segment.strip_suffix(".slice") {
        Some(stem) => {
            let (head, u) = stem.rsplit_once("-pod")?;
            let qos = if head.ends_with("kubepods") {
                Some(Qos::Guaranteed)
            } else if head.ends_with("-burstable") {
                Some(Qos::Burstable)
            } else if head.ends_with("-besteffort") {
                Some(Qos::BestEffort)
            } else {
                None
            };
            (u.replace('_', "-"), qos)
        }
        None => {
            let qos = match parent {
                Some("burstable") => Some(Qos::Burstable),
                Some("besteffort") => Some(Qos::BestEffort),
                Some(p) if is_kubepods(p) => Some(Qos::Guaranteed),
                _ => None,
            };
            (segment.strip_prefix("pod")?.to_string(), qos)
        }
    };
    is_pod_uid(&uid).then_some((uid, qos))
}

/// The cgroups (relative to the v2 root) the kubelet may have given the pod with `uid`,
/// most common first: every QoS class under either driver, below the kubelet's
/// `cgroupRoot` `root` (`/`, or kind's `/kubelet`). Under the cgroupfs driver the pod is
/// `root/kubepods/[QOS/]pod<uid>`; under the systemd driver the kubelet turns the whole name
/// (`root`'s parts, `kubepods`, QOS, `pod<uid>`) into nested slices, each named by the parts
/// so far joined with `-`, so with `/` the slices are at the root. A `root` given to the
/// systemd driver as a plain parent (`root/kubepods.slice/…`) is tried last.
pub fn pod_cgroups(root: &str, uid: &str) -> Vec<String> {
    let base = root.trim_end_matches('/');
    let u = uid.replace('-', "_");
    let root_parts: Vec<&str> = base.split('/').filter(|p| !p.is_empty()).collect();
    let systemd = |qos: Option<&str>| {
        let pod = format!("pod{u}");
        let mut parts: Vec<&str> = root_parts.clone();
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
    if !root_parts.is_empty() {
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

#[cfg(test)]
mod tests;
