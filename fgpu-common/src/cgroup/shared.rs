//! The node's shared parents: cgroups that hold many tenants' cgroups and that no tenant can
//! create, so that a tenant is a cgroup below them (the agent's connection quota and the
//! kernel's tracking bounds count per tenant).
//!
//! A shared parent is a systemd slice (`*.slice`) or one of the cgroupfs parents `kubepods`,
//! `burstable`, `besteffort`, `docker`, `libpod_parent`, `machine`, and `fgpu` (under which
//! `fgpu run` makes its jobs), but never a Kubernetes pod (either driver) or a container
//! cgroup named by its runtime. systemd delegates services and scopes, never slices;
//! runtimes and the kubelet make the container and pod cgroups.

use super::naming::{container_segment, identity};

/// Cgroup names the node shares between tenants, besides every `*.slice`.
pub const SHARED_NAMES: [&str; 7] = [
    "kubepods",
    "burstable",
    "besteffort",
    "docker",
    "libpod_parent",
    "machine",
    "fgpu",
];

/// Whether cgroup `path` (relative to the v2 root, `/a/b`) is one of the node's shared
/// parents, judged by its own name (its parent's when that makes it a container). Only
/// meaningful for a cgroup whose ancestors are all shared: below a tenant, names mean
/// nothing.
pub fn is_shared_parent(path: &str) -> bool {
    let mut parts = path.rsplit('/').filter(|p| !p.is_empty());
    let Some(name) = parts.next() else {
        return false; // the root
    };
    let parent = parts.next();
    let shared = name.ends_with(".slice") || SHARED_NAMES.contains(&name);
    let named = identity(path).pod.is_some() || container_segment(name, parent).is_some();
    shared && !named
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_and_runtime_parents_are_shared_pods_and_containers_are_not() {
        let uid = "0f0e0d0c_0b0a_0908_0706_050403020100";
        let c = "ab".repeat(32);
        for path in [
            "/system.slice",
            "/kubepods.slice",
            "/kubepods.slice/kubepods-burstable.slice",
            "/kubepods",
            "/kubepods/besteffort",
            "/docker",
            "/machine.slice",
            "/fgpu",
            "/user.slice/user-0.slice",
        ] {
            assert!(is_shared_parent(path), "{path}");
        }
        for path in [
            "/",
            "",
            "/tenant-a",
            "/system.slice/sshd.service",
            &format!("/system.slice/docker-{c}.scope"),
            &format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice"),
            "/kubepods/besteffort/pod0f0e0d0c-0b0a-0908-0706-050403020100",
            "/user.slice/user-0.slice/session-3.scope",
        ] {
            assert!(!is_shared_parent(path), "{path}");
        }
    }
}
