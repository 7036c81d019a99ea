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
//! Identity comes from where a name is, not from the name alone: a container may create any
//! cgroup name in its own subtree, `…/kubepods/besteffort/pod<uid>/<id>` of another pod
//! included. So a name counts only at the place the runtime or the kubelet puts it, and
//! nothing below a container, a pod's container or a systemd unit (`*.service`, `*.scope`:
//! what systemd delegates) names anyone else. Walking down from the root:
//!
//! - a container of docker, podman or the like is `docker-<id>.scope`, `libpod-<id>.scope`,
//!   `cri-containerd-<id>.scope` or `crio-<id>.scope` directly below a systemd slice,
//!   `<id>` directly below `docker`, or `libpod-<id>` directly below `libpod_parent`; the
//!   runtimes' monitor processes (`libpod-conmon-<id>`, `crio-conmon-<id>`) are not
//!   containers. Every cgroup below a container is the container's (podman and CRI-O put its
//!   processes in a `container` sub-cgroup of the scope; a container's own sub-cgroups):
//!   the outermost container counts;
//! - the kubelet's `kubepods` cgroup (`kubepods`, `kubepods.slice`, `<prefix>-kubepods.slice`)
//!   is recognised where no container, pod or unit is above it; the outermost counts;
//! - a pod is `pod<uid>` at the level of its QoS class right below that kubepods cgroup (see
//!   below); a pod's container is the container cgroup directly below the pod (any of the
//!   runtime names above, `crio-<id>` without `.scope`, or a bare `<id>`: containerd under
//!   the cgroupfs driver); any other cgroup directly below a pod names no container, and
//!   nothing further down names a pod or a container;
//! - a bare `<id>` anywhere else, a runtime name below a cgroup that is not a slice, a
//!   kubepods cgroup inside a container or a unit, and a pod at another level name nobody.
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
//! `ToSystemd`). A pod UID is hex digits and dashes, 32 to 64 of them (a UUID, or a static
//! pod's 32-digit hash).
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
    /// The container's own cgroup: the path up to the container's name (`/a/b`).
    pub cgroup: String,
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
    /// The QoS level of the kubelet's tree the pod's cgroup is at.
    pub qos: Qos,
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
/// pod, by where its names are (see the module documentation).
pub fn identity(path: &str) -> Identity {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let upto = |i: usize| format!("/{}", parts[..=i].join("/"));
    let mut out = Identity::default();
    // The kubepods cgroup's index, then the QoS level below it once seen.
    let mut kubepods: Option<usize> = None;
    let mut qos: Option<Qos> = None;
    for (i, part) in parts.iter().enumerate() {
        let parent = i.checked_sub(1).map(|p| parts[p]);
        if out.pod.is_some() {
            // Only the cgroup directly below the pod may be its container.
            out.container = container_segment(part, None).map(|(runtime, id)| Container {
                runtime,
                id,
                cgroup: upto(i),
            });
            break;
        }
        if let Some(k) = kubepods {
            let root = parts[k];
            if qos.is_none()
                && i == k + 1
                && let Some(level) = qos_level(root, part)
            {
                qos = Some(level);
                continue;
            }
            let at = qos.unwrap_or(Qos::Guaranteed);
            let level_ok = i == k + 1 + usize::from(qos.is_some());
            match pod_segment(root, at, part) {
                Some(uid) if level_ok => {
                    out.pod = Some(Pod {
                        uid,
                        qos: at,
                        cgroup: upto(i),
                    });
                    continue;
                }
                _ => break, // nothing else below kubepods names anyone
            }
        }
        if let Some((runtime, id)) = container_segment(part, parent)
            && placed(part, runtime, parent)
        {
            out.container = Some(Container {
                runtime,
                id,
                cgroup: upto(i),
            });
            break; // everything below is the container's
        }
        if is_kubepods(part) {
            kubepods = Some(i);
            continue;
        }
        if is_unit(part) {
            break; // a systemd unit: whoever it was delegated to names what is below
        }
    }
    out
}

/// The runtime and id of the container `segment` (one path component, below `parent`) is
/// named as, by the name alone: `<runtime>-<id>[.scope]` or a bare `<id>` (docker's where
/// `parent` is `docker`). Where a name counts is [`identity`]'s rule.
pub fn container_segment(segment: &str, parent: Option<&str>) -> Option<(Runtime, String)> {
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
            return Some((runtime, id.to_string()));
        }
    }
    if is_container_id(segment) {
        let runtime = match parent {
            Some("docker") => Runtime::Docker,
            _ => Runtime::Unknown,
        };
        return Some((runtime, segment.to_string()));
    }
    None
}

/// Whether a container name outside Kubernetes is where its runtime puts it: a runtime's
/// scope directly below a systemd slice, `<id>` directly below `docker`, `libpod-<id>`
/// directly below `libpod_parent`.
fn placed(segment: &str, runtime: Runtime, parent: Option<&str>) -> bool {
    let parent = parent.unwrap_or("");
    if segment.ends_with(".scope") {
        return parent.ends_with(".slice");
    }
    match runtime {
        Runtime::Docker => parent == "docker",
        Runtime::Podman => parent == "libpod_parent",
        _ => false,
    }
}

/// A systemd unit that may be delegated (`*.service`, `*.scope`): its own processes create
/// what is below it.
fn is_unit(segment: &str) -> bool {
    segment.ends_with(".service") || segment.ends_with(".scope")
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

/// The QoS level `segment` is directly below kubepods cgroup `root`: `burstable`,
/// `besteffort` (cgroupfs), `<root stem>-burstable.slice`, `<root stem>-besteffort.slice`
/// (systemd).
fn qos_level(root: &str, segment: &str) -> Option<Qos> {
    let name = match root.strip_suffix(".slice") {
        Some(stem) => segment
            .strip_suffix(".slice")?
            .strip_prefix(stem)?
            .strip_prefix('-')?,
        None => segment,
    };
    match name {
        "burstable" => Some(Qos::Burstable),
        "besteffort" => Some(Qos::BestEffort),
        _ => None,
    }
}

/// The UID of pod cgroup `segment` at QoS level `qos` below kubepods cgroup `root`:
/// `pod<uid>` (cgroupfs), `<root stem>[-<qos>]-pod<u>.slice` (systemd).
fn pod_segment(root: &str, qos: Qos, segment: &str) -> Option<String> {
    let uid = match root.strip_suffix(".slice") {
        Some(stem) => {
            let mut rest = segment.strip_suffix(".slice")?.strip_prefix(stem)?;
            if qos != Qos::Guaranteed {
                rest = rest.strip_prefix('-')?.strip_prefix(qos.as_str())?;
            }
            rest.strip_prefix("-pod")?.replace('_', "-")
        }
        None => segment.strip_prefix("pod")?.to_string(),
    };
    is_pod_uid(&uid).then_some(uid)
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
