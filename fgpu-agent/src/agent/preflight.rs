//! Checks that the agent can work on this host, each failing with a message that says what
//! is missing and what to do about it.

use std::path::{Path, PathBuf};

use fgpu_common::cgroup::cgroup2_mount;

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
