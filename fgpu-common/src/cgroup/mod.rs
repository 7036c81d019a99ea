//! cgroup v2 paths as the kernel reports them, who they belong to ([`naming`]), which of them
//! the node shares between tenants ([`shared`]), and the room a process's memory cgroup leaves
//! it ([`memory`]).
//!
//! Paths here are relative to the cgroup v2 root and start with `/` (the form of
//! `/proc/PID/cgroup`): `/kubepods.slice/.../cri-containerd-<id>.scope`.

pub mod memory;
pub mod naming;
pub mod shared;

use std::path::PathBuf;

/// The mount point of the first cgroup2 file system in a mountinfo table.
pub fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // "<id> <parent> <maj:min> <root> <mount point> <opts> [optional...] - <fstype> ..."
        let (left, right) = line.split_once(" - ")?;
        let fstype = right.split_whitespace().next()?;
        let mount_point = left.split_whitespace().nth(4)?;
        (fstype == "cgroup2").then(|| PathBuf::from(unescape(mount_point)))
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup v2 path in the contents of a `/proc/PID/cgroup` file (the `0::` line).
///
/// On a hybrid host the file also lists v1 hierarchies; only the unified one is returned.
pub fn unified_path(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(|p| p.trim_end_matches(" (deleted)"))
        .filter(|p| p.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_unified_mount_on_hybrid_host() {
        let info = "25 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
                    26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid shared:5 - cgroup2 cgroup2 rw\n\
                    27 25 0:24 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
        assert_eq!(
            cgroup2_mount(info),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            cgroup2_mount("27 25 0:24 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw\n"),
            None
        );
        let spaced = "26 25 0:23 / /mnt/my\\040cg rw - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount(spaced), Some(PathBuf::from("/mnt/my cg")));
    }

    #[test]
    fn unified_line_on_hybrid_host() {
        let content = "12:pids:/user.slice\n1:name=systemd:/user.slice\n0::/fgpu/job-1\n";
        assert_eq!(unified_path(content), Some("/fgpu/job-1"));
        assert_eq!(unified_path("0::/\n"), Some("/"));
        assert_eq!(unified_path("3:cpu:/x\n"), None);
        assert_eq!(unified_path("0::/gone (deleted)\n"), Some("/gone"));
    }
}
