//! How much more memory a process's memory cgroup lets it have, from the files the kernel
//! keeps: what a park checks before it makes the host copy, which the kernel charges to the
//! parked process's own memory cgroup (docs/parking.md, "Host memory").
//!
//! - cgroup v2: the `0::PATH` line of `/proc/PID/cgroup`, under the cgroup2 mount:
//!   `memory.max` ("max": no limit), `memory.current`, and `inactive_file` of `memory.stat`;
//! - cgroup v1 (the memory controller of a hybrid host): the `N:...memory...:PATH` line,
//!   under the `cgroup` mount whose options name `memory`: `memory.limit_in_bytes` (a
//!   page-rounded `LONG_MAX` when unlimited), `memory.usage_in_bytes`, and
//!   `total_inactive_file` of `memory.stat`.
//!
//! The room of one cgroup is its limit less its usage, plus its inactive file pages (the
//! kernel reclaims those before it fails a charge). The limits of ancestors apply too, so the
//! room is the smallest over the cgroup and each ancestor visible under the mount (inside a
//! container's cgroup namespace, the container's own cgroup is the root of what it sees).
//! A mount of a subtree (mountinfo's root field other than `/`) is allowed for.

use std::path::{Path, PathBuf};

/// Which memory controller a directory belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Version::V1 => "cgroup v1",
            Version::V2 => "cgroup v2",
        })
    }
}

/// The memory cgroup directories of a process, its own first, then each ancestor up to the
/// mount point (whose own limit is not set: the root of a hierarchy has none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dirs {
    pub version: Version,
    pub chain: Vec<PathBuf>,
}

/// Limits at or above this are "no limit" (v1 writes `LONG_MAX` rounded down to a page).
const UNLIMITED: u64 = 1 << 62;

/// Locates the memory cgroup of a process from its `/proc/PID/cgroup` and
/// `/proc/PID/mountinfo` (v1's memory controller where it is mounted: on a hybrid host that
/// is where memory is charged; else v2).
pub fn dirs(proc_cgroup: &str, mountinfo: &str) -> Option<Dirs> {
    let mut v1 = None;
    let mut v2 = None;
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mut r = right.split_whitespace();
        let (fstype, opts) = (r.next(), r.nth(1).unwrap_or(""));
        let mut l = left.split_whitespace();
        let (root, point) = (l.nth(3), l.next());
        let (Some(root), Some(point)) = (root, point) else {
            continue;
        };
        let mount = (super::unescape(root), PathBuf::from(super::unescape(point)));
        match fstype {
            Some("cgroup") if opts.split(',').any(|o| o == "memory") => v1 = v1.or(Some(mount)),
            Some("cgroup2") => v2 = v2.or(Some(mount)),
            _ => {}
        }
    }
    let v1_path = proc_cgroup.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctrl, path) = (f.next()?, f.next()?, f.next()?);
        ctrl.split(',').any(|c| c == "memory").then_some(path)
    });
    let (version, (root, point), path) = match (v1, v1_path) {
        (Some(m), Some(p)) => (Version::V1, m, p),
        _ => (Version::V2, v2?, super::unified_path(proc_cgroup)?),
    };
    let path = path.trim_end_matches(" (deleted)");
    // The part of the path below the mount's root.
    let rel = if root == "/" {
        path
    } else {
        path.strip_prefix(root.as_str())
            .filter(|r| r.is_empty() || r.starts_with('/'))?
    };
    let mut chain = Vec::new();
    let mut dir = point.join(rel.trim_start_matches('/'));
    loop {
        chain.push(dir.clone());
        if dir == point || !dir.pop() || !dir.starts_with(&point) {
            break;
        }
    }
    Some(Dirs { version, chain })
}

/// The room left under the limits of `dirs`, reading each file with `read(dir, name)`;
/// None when no directory has a limit (or none could be read).
pub fn room(dirs: &Dirs, read: impl Fn(&Path, &str) -> Option<String>) -> Option<u64> {
    let (limit, usage, inactive) = match dirs.version {
        Version::V1 => (
            "memory.limit_in_bytes",
            "memory.usage_in_bytes",
            "total_inactive_file",
        ),
        Version::V2 => ("memory.max", "memory.current", "inactive_file"),
    };
    let num = |s: &str| s.trim().parse::<u64>().ok();
    dirs.chain
        .iter()
        .filter_map(|d| {
            let max = num(&read(d, limit)?).filter(|&m| m < UNLIMITED)?;
            let used = num(&read(d, usage)?)?;
            let cold = read(d, "memory.stat")
                .and_then(|s| {
                    s.lines().find_map(|l| {
                        let (k, v) = l.split_once(' ')?;
                        (k == inactive).then(|| num(v)).flatten()
                    })
                })
                .unwrap_or(0);
            Some(max.saturating_sub(used.saturating_sub(cold)))
        })
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const HYBRID: &str = "25 30 0:22 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755\n\
        26 25 0:23 / /sys/fs/cgroup/unified rw shared:5 - cgroup2 cgroup2 rw\n\
        27 25 0:24 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n\
        28 25 0:25 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";

    #[test]
    fn a_hybrid_host_charges_memory_in_the_v1_hierarchy() {
        let pc = "5:memory:/fgpu/a\n3:cpu:/\n0::/fgpu/a\n";
        let d = dirs(pc, HYBRID).unwrap();
        assert_eq!(d.version, Version::V1);
        assert_eq!(
            d.chain,
            [
                "/sys/fs/cgroup/memory/fgpu/a",
                "/sys/fs/cgroup/memory/fgpu",
                "/sys/fs/cgroup/memory"
            ]
            .map(PathBuf::from)
        );
    }

    #[test]
    fn a_v2_host_and_a_container_namespace() {
        let info = "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let d = dirs("0::/kubepods/pod1/c1\n", info).unwrap();
        assert_eq!(d.version, Version::V2);
        assert_eq!(d.chain.len(), 4);
        assert_eq!(d.chain[0], PathBuf::from("/sys/fs/cgroup/kubepods/pod1/c1"));
        // Inside a cgroup namespace the container's cgroup is the root it sees.
        let d = dirs("0::/\n", info).unwrap();
        assert_eq!(d.chain, vec![PathBuf::from("/sys/fs/cgroup")]);
        // A subtree mounted at /sys/fs/cgroup (mountinfo root /kubepods/pod1).
        let sub = "30 1 0:26 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let d = dirs("0::/kubepods/pod1/c1\n", sub).unwrap();
        assert_eq!(
            d.chain,
            ["/sys/fs/cgroup/c1", "/sys/fs/cgroup"].map(PathBuf::from)
        );
        // A path outside the mounted subtree is not guessed at.
        assert_eq!(dirs("0::/other\n", sub), None);
        assert_eq!(
            dirs("0::/x\n", "27 25 0:24 / /c rw - cgroup cgroup rw,cpu\n"),
            None
        );
    }

    fn files(entries: &[(&str, &str, &str)]) -> impl Fn(&Path, &str) -> Option<String> {
        let m: HashMap<(PathBuf, String), String> = entries
            .iter()
            .map(|(d, f, v)| ((PathBuf::from(d), f.to_string()), v.to_string()))
            .collect();
        move |d: &Path, f: &str| m.get(&(d.to_path_buf(), f.to_string())).cloned()
    }

    #[test]
    fn the_room_is_the_smallest_over_the_cgroup_and_its_ancestors() {
        let d = Dirs {
            version: Version::V2,
            chain: ["/cg/a/b", "/cg/a", "/cg"].map(PathBuf::from).to_vec(),
        };
        let read = files(&[
            ("/cg/a/b", "memory.max", "1000\n"),
            ("/cg/a/b", "memory.current", "600\n"),
            (
                "/cg/a/b",
                "memory.stat",
                "anon 500\ninactive_file 100\nactive_file 0\n",
            ),
            ("/cg/a", "memory.max", "max\n"),
            ("/cg/a", "memory.current", "900\n"),
        ]);
        // b: 1000 - (600 - 100) = 500; a: no limit; the root: no files.
        assert_eq!(room(&d, &read), Some(500));
        let read = files(&[
            ("/cg/a/b", "memory.max", "1000\n"),
            ("/cg/a/b", "memory.current", "600\n"),
            ("/cg/a", "memory.max", "800\n"),
            ("/cg/a", "memory.current", "700\n"),
        ]);
        assert_eq!(room(&d, &read), Some(100), "the parent's limit is tighter");
        // Usage over the limit (it happens for a moment): no room, not an underflow.
        let read = files(&[
            ("/cg/a", "memory.max", "800\n"),
            ("/cg/a", "memory.current", "900\n"),
        ]);
        assert_eq!(room(&d, &read), Some(0));
        assert_eq!(room(&d, files(&[])), None, "no limit anywhere");
    }

    #[test]
    fn v1_unlimited_is_long_max_rounded_to_a_page() {
        let d = Dirs {
            version: Version::V1,
            chain: vec![PathBuf::from("/m/a")],
        };
        let read = files(&[
            ("/m/a", "memory.limit_in_bytes", "9223372036854771712\n"),
            ("/m/a", "memory.usage_in_bytes", "4096\n"),
        ]);
        assert_eq!(room(&d, &read), None);
        let read = files(&[
            ("/m/a", "memory.limit_in_bytes", "1073741824\n"),
            ("/m/a", "memory.usage_in_bytes", "73741824\n"),
            ("/m/a", "memory.stat", "cache 0\ntotal_inactive_file 1000\n"),
        ]);
        assert_eq!(room(&d, &read), Some(1_000_001_000));
    }
}
