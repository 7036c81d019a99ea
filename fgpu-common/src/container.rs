//! Container identity in cgroup v2 paths, as container runtimes name their cgroups.
//!
//! | runtime | systemd driver | cgroupfs driver |
//! |---|---|---|
//! | docker | `docker-<id>.scope` | `/docker/<id>` |
//! | podman | `libpod-<id>.scope` | `/libpod_parent/libpod-<id>` |
//! | containerd (CRI) | `cri-containerd-<id>.scope` | `/kubepods/.../pod<uid>/<id>` |
//! | CRI-O | `crio-<id>.scope` | `/kubepods/.../pod<uid>/<id>` |
//!
//! `<id>` is the runtime's container id, 64 lowercase hex digits. The runtimes' monitor
//! processes (`libpod-conmon-<id>.scope`, `crio-conmon-<id>.scope`) are not containers and
//! are not recognised.

/// A container found in a cgroup path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerId {
    /// Which runtime's naming the cgroup follows: `docker`, `podman`, `containerd`, `cri-o`,
    /// or `cgroupfs` (a bare id directory whose runtime the name does not tell).
    pub runtime: &'static str,
    /// The full container id (64 hex digits).
    pub id: String,
}

impl ContainerId {
    /// The first 12 digits, as `docker ps` and `podman ps` show ids.
    pub fn short(&self) -> &str {
        &self.id[..12]
    }
}

/// The container whose cgroup `segment` (one path component) is, if it is one.
pub fn container_segment(segment: &str, parent: Option<&str>) -> Option<ContainerId> {
    const SCOPES: [(&str, &str); 4] = [
        ("docker-", "docker"),
        ("libpod-", "podman"),
        ("cri-containerd-", "containerd"),
        ("crio-", "cri-o"),
    ];
    let stem = segment.strip_suffix(".scope").unwrap_or(segment);
    for (prefix, runtime) in SCOPES {
        if let Some(id) = stem.strip_prefix(prefix)
            && is_id(id)
        {
            return Some(ContainerId {
                runtime,
                id: id.to_string(),
            });
        }
    }
    if is_id(segment) {
        let runtime = match parent {
            Some("docker") => "docker",
            _ => "cgroupfs",
        };
        return Some(ContainerId {
            runtime,
            id: segment.to_string(),
        });
    }
    None
}

/// The innermost container in cgroup path `path` (relative to the v2 root, `/a/b/...`): a
/// cgroup inside a container's cgroup belongs to that container.
pub fn container_of(path: &str) -> Option<ContainerId> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    (0..parts.len()).rev().find_map(|i| {
        let parent = i.checked_sub(1).map(|p| parts[p]);
        container_segment(parts[i], parent)
    })
}

/// 64 lowercase hex digits.
pub fn is_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "1680a0a11e0451e16a18e6e26d2388dd84e39396d1c0f1352aca61c7177c1ed2";

    #[test]
    fn every_runtime_and_driver() {
        let cases = [
            (format!("/system.slice/docker-{ID}.scope"), "docker"),
            (format!("/docker/{ID}"), "docker"),
            (format!("/machine.slice/libpod-{ID}.scope"), "podman"),
            (format!("/libpod_parent/libpod-{ID}"), "podman"),
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0d4f.slice/cri-containerd-{ID}.scope"
                ),
                "containerd",
            ),
            (
                format!("/kubepods.slice/kubepods-pod1.slice/crio-{ID}.scope"),
                "cri-o",
            ),
            (format!("/kubepods/burstable/pod0d4f/{ID}"), "cgroupfs"),
        ];
        for (path, runtime) in cases {
            let c = container_of(&path).unwrap_or_else(|| panic!("{path}"));
            assert_eq!((c.runtime, c.id.as_str()), (runtime, ID), "{path}");
            assert_eq!(c.short(), &ID[..12]);
        }
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
            "/".to_string(),
            String::new(),
        ] {
            assert_eq!(container_of(&path), None, "{path}");
        }
    }

    #[test]
    fn a_cgroup_inside_a_container_belongs_to_it() {
        let c = container_of(&format!("/libpod_parent/libpod-{ID}/worker")).unwrap();
        assert_eq!(c.id, ID);
        let inner = ID.replace('1', "2");
        let c = container_of(&format!("/docker/{ID}/docker/{inner}")).unwrap();
        assert_eq!(c.id, inner, "the innermost container");
    }
}
