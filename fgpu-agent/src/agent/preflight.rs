//! Checks that the agent can work on this host, each failing with a message that says what
//! is missing and what to do about it.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// What the host provides, found by [`check`].
#[derive(Debug, Clone)]
pub struct Host {
    /// Where the cgroup v2 (unified) hierarchy is mounted: `/sys/fs/cgroup` on a pure v2
    /// host, `/sys/fs/cgroup/unified` on a hybrid one.
    pub cgroup2_mount: PathBuf,
}

pub fn check() -> Result<Host> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "the agent must run as root: it loads eBPF programs and reads every process's \
             cgroup (try `sudo fgpu agent`)"
        );
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        bail!(
            "this kernel has no BTF (/sys/kernel/btf/vmlinux is missing): fgpu needs a kernel \
             built with CONFIG_DEBUG_INFO_BTF=y (every mainstream distribution kernel since 2021)"
        );
    }
    if !Path::new("/sys/bus/event_source/devices/uprobe/type").exists() {
        bail!(
            "this kernel has no uprobe support (/sys/bus/event_source/devices/uprobe is \
             missing): fgpu needs CONFIG_UPROBE_EVENTS=y"
        );
    }
    let mountinfo =
        std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    let Some(cgroup2_mount) = cgroup2_mount(&mountinfo) else {
        bail!(
            "no cgroup v2 hierarchy is mounted: fgpu attributes GPU memory to cgroup v2 \
             cgroups (mount one with `mount -t cgroup2 none /sys/fs/cgroup/unified`, or boot \
             with systemd.unified_cgroup_hierarchy=1)"
        );
    };
    raise_memlock();
    Ok(Host { cgroup2_mount })
}

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

/// Older kernels charge eBPF maps to RLIMIT_MEMLOCK; lift it so map creation cannot fail there.
fn raise_memlock() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: `unlimited` is a valid rlimit that outlives the call.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) } != 0 {
        tracing::debug!("could not raise RLIMIT_MEMLOCK (fine on kernels ≥ 5.11)");
    }
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
}
