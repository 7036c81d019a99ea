//! `container:ID` targets: the cgroup of a docker, podman, containerd (CRI) or CRI-O
//! container, by full id or unique prefix, under the systemd or the cgroupfs driver
//! (naming in [`fgpu_common::cgroup::naming`]: a name counts only where its runtime or the
//! kubelet puts it, so a look-alike a tenant made inside its own cgroup is not a container).

use std::path::Path;

use anyhow::{Result, bail};
use fgpu_common::cgroup::naming::{Container, identity};

/// Shortest prefix accepted: shorter ones match too much by accident.
pub const MIN_PREFIX: usize = 4;
/// How deep below the cgroup root containers are looked for (Kubernetes pods sit at 4).
const MAX_DEPTH: usize = 8;

/// The cgroup path (relative to the v2 root at `mount`) of the container `id_or_prefix`.
pub fn resolve(target: &str, id_or_prefix: &str, mount: &Path) -> Result<String> {
    let want = id_or_prefix.trim().to_ascii_lowercase();
    if want.len() < MIN_PREFIX || want.len() > 64 || !want.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!(
            "'{target}': container:ID needs the container's id or a prefix of it of at least \
             {MIN_PREFIX} hex digits (as `docker ps`, `podman ps` or `crictl ps` show it)"
        );
    }
    let found = find(mount, &want);
    match found.as_slice() {
        [] => bail!(
            "'{target}': no container with an id starting with {want} has a cgroup under {} \
             (is it running? docker, podman, containerd and CRI-O containers are found by \
             their cgroup names)",
            mount.display()
        ),
        [(path, _)] => Ok(path.clone()),
        many => {
            let list: Vec<String> = many
                .iter()
                .map(|(path, c)| format!("{} ({}, {path})", c.short(), c.runtime))
                .collect();
            bail!(
                "'{target}': {} containers match {want}; give more digits of the id: {}",
                many.len(),
                list.join(", ")
            )
        }
    }
}

/// Every container cgroup whose id starts with `prefix`.
fn find(mount: &Path, prefix: &str) -> Vec<(String, Container)> {
    let mut out = Vec::new();
    let mut stack = vec![(mount.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue; // removed while we walked
        };
        for e in entries.filter_map(Result::ok) {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let path = e.path();
            let rel = format!(
                "/{}",
                path.strip_prefix(mount).unwrap_or(&path).to_string_lossy()
            );
            if let Some(c) = identity(&rel).container {
                if c.cgroup == rel && c.id.starts_with(prefix) {
                    out.push((rel, c));
                }
                continue; // a container's own sub-cgroups are not other containers
            }
            if depth + 1 < MAX_DEPTH {
                stack.push((path, depth + 1));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaa0a11e0451e16a18e6e26d2388dd84e39396d1c0f1352aca61c7177c1ed2b";
    const B: &str = "aaaab000e0451e16a18e6e26d2388dd84e39396d1c0f1352aca61c7177c1ed2b";
    const C: &str = "cccc0a11e0451e16a18e6e26d2388dd84e39396d1c0f1352aca61c7177c1ed2b";

    fn tree() -> std::path::PathBuf {
        let m = std::env::temp_dir().join(format!("fgpu-containers-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&m);
        for d in [
            format!("libpod_parent/libpod-{A}"),
            format!("libpod_parent/libpod-conmon-{B}"),
            format!("system.slice/docker-{B}.scope"),
            format!("docker/{C}"),
            format!(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{}.scope",
                "0".repeat(32),
                C.replace('c', "d")
            ),
        ] {
            std::fs::create_dir_all(m.join(d)).unwrap();
        }
        m
    }

    #[test]
    fn full_ids_prefixes_and_ambiguity() {
        let m = tree();
        assert_eq!(
            resolve("container:x", A, &m).unwrap(),
            format!("/libpod_parent/libpod-{A}")
        );
        assert_eq!(
            resolve("container:x", "aaaa0", &m).unwrap(),
            format!("/libpod_parent/libpod-{A}")
        );
        assert_eq!(
            resolve("container:x", "AAAAB", &m).unwrap(),
            format!("/system.slice/docker-{B}.scope"),
            "the conmon scope is not a container"
        );
        assert_eq!(resolve("c", "cccc", &m).unwrap(), format!("/docker/{C}"));
        assert!(resolve("c", "dddd", &m).unwrap().ends_with(".scope"));
        let err = resolve("container:aaaa", "aaaa", &m)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("2 containers match")
                && err.contains(&A[..12])
                && err.contains(&B[..12])
                && err.contains("podman")
                && err.contains("docker"),
            "{err}"
        );
        let err = resolve("container:ee", "ee", &m).unwrap_err().to_string();
        assert!(err.contains("at least 4 hex digits"), "{err}");
        let err = resolve("c", "../etc", &m).unwrap_err().to_string();
        assert!(err.contains("hex digits"), "{err}");
        let err = resolve("c", "eeee", &m).unwrap_err().to_string();
        assert!(err.contains("no container"), "{err}");
        std::fs::remove_dir_all(&m).unwrap();
    }

    #[test]
    fn a_look_alike_inside_another_container_is_not_the_container() {
        let m = std::env::temp_dir().join(format!("fgpu-containers-fake-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&m);
        let victim_pod = "0d4f6a3c-1b2e-4c5d-8e9f-a0b1c2d3e4f5";
        let victim = format!("kubepods/besteffort/pod{victim_pod}/{C}");
        let tenant = format!("kubepods/besteffort/pod{}/{A}", "1".repeat(32));
        let pod_slice = format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
            "2".repeat(32)
        );
        for d in [
            victim.clone(),
            format!("{tenant}/{victim}"),
            format!("{tenant}/docker/{C}"),
            format!("{tenant}/system.slice/docker-{C}.scope"),
            format!("{pod_slice}/cri-containerd-{B}.scope/kubepods/pod{victim_pod}/{C}"),
            format!("system.slice/foo.service/docker/{C}"),
            format!("elsewhere/{C}"),
        ] {
            std::fs::create_dir_all(m.join(d)).unwrap();
        }
        assert_eq!(
            resolve("container:cccc", "cccc", &m).unwrap(),
            format!("/{victim}")
        );
        assert_eq!(
            resolve("container:aaaa0", "aaaa0", &m).unwrap(),
            format!("/{tenant}")
        );
        std::fs::remove_dir_all(&m).unwrap();
    }
}
