//! Resolving a TARGET as users write it to a cgroup v2 path (relative to the v2 root).
//!
//! Forms: a path under the cgroup mount (`/sys/fs/cgroup/kubepods.slice/...`), a path in
//! the form of `/proc/PID/cgroup` (`/kubepods.slice/...`), a relative path
//! (`kubepods.slice/...`), `pid:PID` (that process's cgroup, as the host sees it), or
//! `container:ID` (a container's cgroup, see [`super::containers`]).

use std::path::{Component, Path};

use anyhow::{Context, Result, bail};
use fgpu_common::cgroup::unified_path;

pub fn resolve(target: &str, mount: &Path) -> Result<String> {
    let target = target.trim();
    if target.is_empty() {
        bail!("empty TARGET: give a cgroup path (e.g. /kubepods.slice/...) or pid:PID");
    }
    if let Some(pid) = target.strip_prefix("pid:") {
        let pid: u32 = pid
            .parse()
            .with_context(|| format!("'{target}': pid:PID needs a numeric PID"))?;
        let content = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .with_context(|| format!("'{target}': no such process"))?;
        let path = unified_path(&content)
            .with_context(|| format!("'{target}': the process is in no cgroup v2"))?;
        return Ok(path.to_string());
    }
    if let Some(id) = target.strip_prefix("container:") {
        return super::containers::resolve(target, id, mount);
    }
    if let Some((kind, _)) = target.split_once(':')
        && kind == "pod"
    {
        bail!(
            "'{target}': {kind}: targets are resolved by the CLI (`fgpu limit ... pod:NAMESPACE/NAME`); give the agent the cgroup path"
        );
    }
    let as_path = Path::new(target);
    let rel = as_path.strip_prefix(mount).unwrap_or(as_path);
    let mut clean = String::new();
    for c in rel.components() {
        match c {
            Component::Normal(part) => {
                clean.push('/');
                clean.push_str(&part.to_string_lossy());
            }
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                bail!("'{target}': '..' is not allowed in a cgroup path")
            }
        }
    }
    if clean.is_empty() {
        clean.push('/');
    }
    let dir = mount.join(clean.trim_start_matches('/'));
    if !dir.join("cgroup.procs").is_file() {
        bail!(
            "'{target}': no such cgroup ({} does not exist under the cgroup v2 mount {})",
            clean,
            mount.display()
        );
    }
    Ok(clean)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_mount() -> std::path::PathBuf {
        let m = std::env::temp_dir().join(format!("fgpu-targets-{}", std::process::id()));
        std::fs::create_dir_all(m.join("team/job")).unwrap();
        std::fs::write(m.join("cgroup.procs"), b"").unwrap();
        std::fs::write(m.join("team/job/cgroup.procs"), b"").unwrap();
        m
    }

    #[test]
    fn path_forms() {
        let m = fake_mount();
        let abs = m.join("team/job");
        assert_eq!(resolve(abs.to_str().unwrap(), &m).unwrap(), "/team/job");
        assert_eq!(resolve("/team/job", &m).unwrap(), "/team/job");
        assert_eq!(resolve("team/job/", &m).unwrap(), "/team/job");
        assert_eq!(resolve("/", &m).unwrap(), "/");
        let err = resolve("/team/nope", &m).unwrap_err().to_string();
        assert!(err.contains("no such cgroup"), "{err}");
        assert!(resolve("/team/../etc", &m).is_err());
        assert!(resolve("", &m).is_err());
        assert!(
            resolve("pod:ns/name", &m)
                .unwrap_err()
                .to_string()
                .contains("resolved by the CLI")
        );
    }

    #[test]
    fn pid_form() {
        let err = resolve("pid:abc", Path::new("/")).unwrap_err().to_string();
        assert!(err.contains("numeric"), "{err}");
        let err = resolve("pid:4000000000", Path::new("/"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("no such process"), "{err}");
    }
}
