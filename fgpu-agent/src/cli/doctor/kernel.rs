//! The kernel and the host's mounts: what the agent's start-up (`agent::preflight`, the
//! probes' `ensure_tracefs`, the pins' `ensure_bpffs`) needs, checked by the same files.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{Check, Paths};

/// The oldest kernel fgpu runs on: pinned uprobe links and attach cookies (5.15).
const MIN_KERNEL: (u32, u32) = (5, 15);
/// The agent's preflight test for uprobe support (CONFIG_UPROBE_EVENTS).
const UPROBE_PMU: &str = "/sys/bus/event_source/devices/uprobe/type";
const BTF: &str = "/sys/kernel/btf/vmlinux";
/// Where the agent mounts bpffs if nothing is mounted there.
const BPFFS: &str = "/sys/fs/bpf";
/// Where tracefs is looked for (and mounted, at the first) by the agent.
const TRACEFS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

pub fn checks(p: &Paths) -> Vec<Check> {
    let release =
        std::fs::read_to_string(p.host("/proc/sys/kernel/osrelease")).map(|s| s.trim().to_string());
    let mountinfo = std::fs::read_to_string(p.host("/proc/self/mountinfo")).unwrap_or_default();
    vec![
        version(release.as_deref().map_err(|e| e.to_string())),
        btf(p),
        uprobes(p, release.as_deref().ok()),
        cgroup(&mountinfo),
        bpffs(p, &mountinfo),
        tracefs(p, &mountinfo),
        privileges(p),
    ]
}

fn version(release: Result<&str, String>) -> Check {
    let release = match release {
        Ok(r) => r,
        Err(err) => {
            return Check::warn(
                "kernel",
                format!("cannot read /proc/sys/kernel/osrelease ({err})"),
                "mount procfs on /proc (`mount -t proc proc /proc`)",
            );
        }
    };
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|s| s.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) if (major, minor) >= MIN_KERNEL => {
            Check::ok("kernel", format!("Linux {release} (5.15 or newer needed)"))
        }
        (Some(_), Some(_)) => Check::fail(
            "kernel",
            format!(
                "Linux {release} is older than 5.15, which fgpu needs (pinned uprobe links, \
                 attach cookies)"
            ),
            "boot a 5.15 or newer kernel (the distribution's current or HWE kernel)",
        ),
        _ => Check::warn(
            "kernel",
            format!("cannot tell the version of kernel release {release:?}"),
            "check with `uname -r` that the kernel is 5.15 or newer",
        ),
    }
}

fn btf(p: &Paths) -> Check {
    match std::fs::metadata(p.host(BTF)) {
        Ok(m) => Check::ok("btf", format!("{BTF} ({} KiB)", m.len() / 1024)),
        Err(_) => Check::fail(
            "btf",
            format!("{BTF} is missing: the kernel has no BTF"),
            "boot a kernel built with CONFIG_DEBUG_INFO_BTF=y (every mainstream distribution \
             kernel since 2021 is)",
        ),
    }
}

fn uprobes(p: &Paths, release: Option<&str>) -> Check {
    let config = release.and_then(|r| kernel_config(p, r, "CONFIG_UPROBE_EVENTS"));
    let said = |c: &(String, Option<String>)| match &c.1 {
        Some(v) => format!("{}: CONFIG_UPROBE_EVENTS={v}", c.0),
        None => format!("{}: CONFIG_UPROBE_EVENTS is not set", c.0),
    };
    if p.host(UPROBE_PMU).exists() {
        let mut detail = "uprobe PMU present (/sys/bus/event_source/devices/uprobe)".to_string();
        if let Some(t) = TRACEFS
            .iter()
            .find(|t| p.host(Path::new(t).join("uprobe_events")).exists())
        {
            detail += &format!(", {t}/uprobe_events");
        }
        if let Some(c) = &config {
            detail += &format!("; {}", said(c));
        }
        return Check::ok("uprobes", detail);
    }
    let mut detail =
        "no uprobe support: /sys/bus/event_source/devices/uprobe is missing".to_string();
    if let Some(c) = &config {
        detail += &format!(" ({})", said(c));
    }
    Check::fail(
        "uprobes",
        detail,
        "boot a kernel built with CONFIG_UPROBE_EVENTS=y",
    )
}

/// An option of the running kernel's configuration: (where it was read, its value or None
/// when not set), from /boot/config-RELEASE or /proc/config.gz; None if neither is readable.
fn kernel_config(p: &Paths, release: &str, option: &str) -> Option<(String, Option<String>)> {
    let boot = format!("/boot/config-{release}");
    let (source, text) = match std::fs::read_to_string(p.host(&boot)) {
        Ok(text) => (boot, text),
        Err(_) => {
            let gz = p.host("/proc/config.gz");
            let out = Command::new("gzip").arg("-dc").arg(&gz).output().ok()?;
            if !out.status.success() {
                return None;
            }
            (
                "/proc/config.gz".to_string(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            )
        }
    };
    let set = format!("{option}=");
    let value = text
        .lines()
        .find_map(|l| l.strip_prefix(&set))
        .map(str::to_string);
    Some((source, value))
}

fn cgroup(mountinfo: &str) -> Check {
    // The agent's own reading of the mount table (agent::preflight).
    let Some(mount) = fgpu_common::cgroup::cgroup2_mount(mountinfo) else {
        return Check::fail(
            "cgroup",
            "no cgroup v2 hierarchy is mounted: fgpu attributes GPU memory to cgroup v2 cgroups",
            "mount one (`mount -t cgroup2 none /sys/fs/cgroup/unified`) or boot with \
             systemd.unified_cgroup_hierarchy=1",
        );
    };
    let detail = if mount == Path::new("/sys/fs/cgroup") {
        "pure cgroup v2 at /sys/fs/cgroup".to_string()
    } else if mount == Path::new("/sys/fs/cgroup/unified") {
        let v1 = mountinfo
            .lines()
            .filter(|l| {
                l.split_once(" - ")
                    .is_some_and(|(_, r)| r.starts_with("cgroup "))
            })
            .count();
        format!(
            "hybrid: cgroup v2 at /sys/fs/cgroup/unified beside {v1} cgroup v1 hierarchies \
             (the agent attributes by the v2 one)"
        )
    } else {
        format!("cgroup v2 at {} (the agent uses it)", mount.display())
    };
    Check::ok("cgroup", detail)
}

/// The file system type and mount point of the mount holding `path` (the longest mount
/// point that is a prefix of it).
fn mount_of(mountinfo: &str, path: &Path) -> Option<(String, PathBuf)> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let point = PathBuf::from(left.split_whitespace().nth(4)?);
            let fstype = right.split_whitespace().next()?.to_string();
            path.starts_with(&point).then_some((fstype, point))
        })
        // The last of equally long mount points is the one on top.
        .max_by_key(|(_, point)| point.as_os_str().len())
}

fn bpffs(p: &Paths, mountinfo: &str) -> Check {
    let dir = &p.bpf_dir;
    if dir
        .components()
        .any(|c| c.as_os_str().to_string_lossy().contains('.'))
    {
        return Check::fail(
            "bpffs",
            format!(
                "--bpf-dir {}: bpffs does not allow '.' in names",
                dir.display()
            ),
            "give the agent a --bpf-dir without '.', e.g. /sys/fs/bpf/fgpu",
        );
    }
    match mount_of(mountinfo, dir) {
        Some((fstype, point)) if fstype == "bpf" => {
            let mut detail = format!("bpffs at {}", point.display());
            if p.host(dir).is_dir() {
                detail += &format!(
                    "; {} holds the pinned kernel state (kept across agent restarts)",
                    dir.display()
                );
            }
            Check::ok("bpffs", detail)
        }
        _ if dir.starts_with(BPFFS) => Check::warn(
            "bpffs",
            format!(
                "bpffs is not mounted at {BPFFS}: the agent mounts it when it starts, in its \
                 own mount namespace (where the probes' pinned state does not outlive it if \
                 that is a container's)"
            ),
            "mount it on the host: `mount -t bpf bpf /sys/fs/bpf` (in /etc/fstab: \
             `bpffs /sys/fs/bpf bpf defaults 0 0`)",
        ),
        _ => Check::fail(
            "bpffs",
            format!(
                "--bpf-dir {} is not on a bpf file system: the agent cannot pin its kernel state \
                 there",
                dir.display()
            ),
            "give the agent a --bpf-dir under /sys/fs/bpf (the default is /sys/fs/bpf/fgpu)",
        ),
    }
}

fn tracefs(p: &Paths, mountinfo: &str) -> Check {
    // The agent's test is its events directory (probes::ensure_tracefs); the mount table
    // also tells where a user who may not look into it runs this.
    let mounted = |t: &&&str| {
        p.host(Path::new(t).join("events")).exists()
            || mount_of(mountinfo, Path::new(t))
                .is_some_and(|(fs, point)| fs == "tracefs" && point == Path::new(t))
    };
    match TRACEFS.iter().find(mounted) {
        Some(t) => Check::ok("tracefs", format!("tracefs at {t}")),
        None => Check::warn(
            "tracefs",
            "tracefs is not mounted (no /sys/kernel/tracing/events): the agent mounts it on \
             /sys/kernel/tracing when it starts, which needs CAP_SYS_ADMIN",
            "mount it: `mount -t tracefs tracefs /sys/kernel/tracing`",
        ),
    }
}

fn privileges(p: &Paths) -> Check {
    let status = std::fs::read_to_string(p.host("/proc/self/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    // "Uid:	real	effective	saved	fs"
    let euid = field("Uid:")
        .and_then(|v| v.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u32>().ok());
    let caps = field("CapEff:").and_then(|v| u64::from_str_radix(v, 16).ok());
    let (Some(euid), Some(caps)) = (euid, caps) else {
        return Check::warn(
            "privileges",
            "cannot read this process's user and capabilities from /proc/self/status",
            "mount procfs on /proc (`mount -t proc proc /proc`)",
        );
    };
    let has = |bit: u32| caps & (1u64 << bit) != 0;
    let named: Vec<&str> = [
        (CAP_BPF, "CAP_BPF"),
        (CAP_PERFMON, "CAP_PERFMON"),
        (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
    ]
    .into_iter()
    .filter(|(bit, _)| has(*bit))
    .map(|(_, name)| name)
    .collect();
    let held = if named.is_empty() {
        "none of CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN".to_string()
    } else {
        named.join(", ")
    };
    let can_bpf = has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON));
    match (euid, can_bpf) {
        (0, true) => Check::ok("privileges", format!("root, with {held}")),
        (0, false) => Check::fail(
            "privileges",
            format!("root but with {held}: eBPF programs and uprobes cannot be loaded"),
            "give the agent CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN (a container: --privileged)",
        ),
        (uid, _) => Check::warn(
            "privileges",
            format!(
                "running as uid {uid} ({held}): `fgpu agent` must run as root, and some checks \
                 see only what this user may"
            ),
            "run `sudo fgpu doctor` to check the node as the agent sees it",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::super::Status;
    use super::super::tests::Tree;
    use super::*;

    const PURE: &str = "25 1 0:23 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n\
                        30 20 0:40 / /sys/fs/bpf rw,relatime - bpf bpf rw\n";
    const HYBRID: &str = "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n\
                          32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n\
                          33 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
                          41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
                          23 1 0:20 / /sys rw - sysfs sysfs rw\n";

    #[test]
    fn kernel_versions() {
        let c = version(Ok("6.18.44-fc-v1147"));
        assert_eq!(c.status, Status::Ok);
        assert_eq!(c.detail, "Linux 6.18.44-fc-v1147 (5.15 or newer needed)");
        assert_eq!(version(Ok("5.15.0-91-generic")).status, Status::Ok);
        let old = version(Ok("5.10.0-21-amd64"));
        assert_eq!(old.status, Status::Fail);
        assert_eq!(
            old.fix.as_deref(),
            Some("boot a 5.15 or newer kernel (the distribution's current or HWE kernel)")
        );
        assert_eq!(version(Ok("garbage")).status, Status::Warn);
        assert_eq!(version(Err("No such file".into())).status, Status::Warn);
    }

    #[test]
    fn btf_and_uprobes_from_sysfs_and_the_kernel_config() {
        let t = Tree::new("kernel");
        let p = t.paths();
        let none = btf(&p);
        assert_eq!(none.status, Status::Fail);
        assert_eq!(
            none.fix.as_deref(),
            Some(
                "boot a kernel built with CONFIG_DEBUG_INFO_BTF=y (every mainstream \
                 distribution kernel since 2021 is)"
            )
        );
        t.write(BTF, vec![0u8; 4096]);
        assert_eq!(btf(&p).detail, "/sys/kernel/btf/vmlinux (4 KiB)");

        t.write(
            "/boot/config-6.1.0-x",
            "CONFIG_BPF=y\n# CONFIG_UPROBE_EVENTS is not set\n",
        );
        let no = uprobes(&p, Some("6.1.0-x"));
        assert_eq!(no.status, Status::Fail);
        assert_eq!(
            no.detail,
            "no uprobe support: /sys/bus/event_source/devices/uprobe is missing \
             (/boot/config-6.1.0-x: CONFIG_UPROBE_EVENTS is not set)"
        );
        assert_eq!(
            no.fix.as_deref(),
            Some("boot a kernel built with CONFIG_UPROBE_EVENTS=y")
        );

        t.write("/boot/config-6.1.0-x", "CONFIG_UPROBE_EVENTS=y\n");
        t.write(UPROBE_PMU, "7\n");
        t.write("/sys/kernel/tracing/uprobe_events", "");
        let yes = uprobes(&p, Some("6.1.0-x"));
        assert_eq!(yes.status, Status::Ok);
        assert_eq!(
            yes.detail,
            "uprobe PMU present (/sys/bus/event_source/devices/uprobe), \
             /sys/kernel/tracing/uprobe_events; /boot/config-6.1.0-x: CONFIG_UPROBE_EVENTS=y"
        );
    }

    #[test]
    fn cgroup_layouts() {
        let pure = cgroup(PURE);
        assert_eq!(pure.status, Status::Ok);
        assert_eq!(pure.detail, "pure cgroup v2 at /sys/fs/cgroup");
        let hybrid = cgroup(HYBRID);
        assert_eq!(hybrid.status, Status::Ok);
        assert_eq!(
            hybrid.detail,
            "hybrid: cgroup v2 at /sys/fs/cgroup/unified beside 2 cgroup v1 hierarchies (the \
             agent attributes by the v2 one)"
        );
        let v1 = cgroup("32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n");
        assert_eq!(v1.status, Status::Fail);
        assert_eq!(
            v1.fix.as_deref(),
            Some(
                "mount one (`mount -t cgroup2 none /sys/fs/cgroup/unified`) or boot with \
                 systemd.unified_cgroup_hierarchy=1"
            )
        );
    }

    #[test]
    fn bpffs_mounted_missing_and_a_bpf_dir_elsewhere() {
        let t = Tree::new("bpffs");
        let mut p = t.paths();
        assert_eq!(bpffs(&p, PURE).detail, "bpffs at /sys/fs/bpf");
        t.mkdir("/sys/fs/bpf/fgpu");
        assert_eq!(
            bpffs(&p, PURE).detail,
            "bpffs at /sys/fs/bpf; /sys/fs/bpf/fgpu holds the pinned kernel state (kept across \
             agent restarts)"
        );
        let missing = bpffs(&p, HYBRID);
        assert_eq!(missing.status, Status::Warn);
        assert_eq!(
            missing.fix.as_deref(),
            Some(
                "mount it on the host: `mount -t bpf bpf /sys/fs/bpf` (in /etc/fstab: \
                 `bpffs /sys/fs/bpf bpf defaults 0 0`)"
            )
        );
        p.bpf_dir = PathBuf::from("/var/lib/fgpu/bpf");
        let elsewhere = bpffs(&p, PURE);
        assert_eq!(elsewhere.status, Status::Fail);
        assert_eq!(
            elsewhere.fix.as_deref(),
            Some("give the agent a --bpf-dir under /sys/fs/bpf (the default is /sys/fs/bpf/fgpu)")
        );
        p.bpf_dir = PathBuf::from("/sys/fs/bpf/fgpu.v2");
        let dotted = bpffs(&p, PURE);
        assert_eq!(dotted.status, Status::Fail);
        assert_eq!(
            dotted.detail,
            "--bpf-dir /sys/fs/bpf/fgpu.v2: bpffs does not allow '.' in names"
        );
    }

    #[test]
    fn tracefs_at_either_place() {
        let t = Tree::new("tracefs");
        let p = t.paths();
        let none = tracefs(&p, PURE);
        assert_eq!(none.status, Status::Warn);
        assert_eq!(
            none.fix.as_deref(),
            Some("mount it: `mount -t tracefs tracefs /sys/kernel/tracing`")
        );
        let mounted = "46 23 0:13 / /sys/kernel/tracing rw,relatime - tracefs tracefs rw\n";
        assert_eq!(
            tracefs(&p, mounted).detail,
            "tracefs at /sys/kernel/tracing"
        );
        t.mkdir("/sys/kernel/debug/tracing/events");
        assert_eq!(
            tracefs(&p, PURE).detail,
            "tracefs at /sys/kernel/debug/tracing"
        );
    }

    #[test]
    fn privileges_from_proc_status() {
        let t = Tree::new("privileges");
        let p = t.paths();
        let status = |uid: u32, caps: u64| {
            t.write(
                "/proc/self/status",
                format!("Name:\tfgpu\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nCapEff:\t{caps:016x}\n"),
            );
            privileges(&p)
        };
        let full = status(0, 0x0000_01ff_ffff_ffff);
        assert_eq!(full.status, Status::Ok);
        assert_eq!(
            full.detail,
            "root, with CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN"
        );
        let bpf_only = status(0, (1 << CAP_BPF) | (1 << CAP_PERFMON));
        assert_eq!(bpf_only.status, Status::Ok);
        let dropped = status(0, 1 << 0);
        assert_eq!(dropped.status, Status::Fail);
        assert_eq!(
            dropped.detail,
            "root but with none of CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN: eBPF programs and \
             uprobes cannot be loaded"
        );
        assert_eq!(
            dropped.fix.as_deref(),
            Some(
                "give the agent CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN (a container: \
                 --privileged)"
            )
        );
        let user = status(1000, 0);
        assert_eq!(user.status, Status::Warn);
        assert_eq!(
            user.fix.as_deref(),
            Some("run `sudo fgpu doctor` to check the node as the agent sees it")
        );
    }
}
